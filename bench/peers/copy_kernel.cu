// The copy kernel of cuda_copy_perf: a grid-stride copy in 16-byte words
// (the bytes past the last whole word one at a time), the simplest kernel that
// runs at the memory's bandwidth. Its launcher is plain C++ for the host code.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "copy_kernel.h"

namespace {

__global__ void CopyWords(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t words) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four independent loads in flight per thread.
  for (; i + 3 * stride < words; i += 4 * stride) {
    const uint4 a = src[i];
    const uint4 b = src[i + stride];
    const uint4 c = src[i + 2 * stride];
    const uint4 d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < words; i += stride) dst[i] = src[i];
}

__global__ void CopyBytes(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src,
                          size_t bytes) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    dst[i] = src[i];
  }
}

}  // namespace

cudaError_t LaunchCopyKernel(void* dst, const void* src, size_t bytes, int sms,
                             cudaStream_t stream) {
  constexpr int kThreads = 256;
  const bool aligned = reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const size_t words = aligned ? bytes / 16 : 0;
  const size_t tail = bytes - words * 16;
  const size_t max_blocks = static_cast<size_t>(sms > 0 ? sms : 1) * 8;
  if (words > 0) {
    const size_t want = (words + kThreads - 1) / kThreads;
    const unsigned blocks = static_cast<unsigned>(want < max_blocks ? want : max_blocks);
    CopyWords<<<blocks, kThreads, 0, stream>>>(static_cast<uint4*>(dst),
                                               static_cast<const uint4*>(src), words);
  }
  if (tail > 0) {
    const size_t want = (tail + kThreads - 1) / kThreads;
    const unsigned blocks = static_cast<unsigned>(want < max_blocks ? want : max_blocks);
    CopyBytes<<<blocks, kThreads, 0, stream>>>(static_cast<unsigned char*>(dst) + words * 16,
                                               static_cast<const unsigned char*>(src) + words * 16,
                                               tail);
  }
  return cudaGetLastError();
}
