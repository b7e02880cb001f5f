#include "tests/cuda/pattern.h"

#include <cuda_runtime.h>

namespace collectived::testing {
namespace {

__device__ uint32_t DevicePatternWord(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 29;
  return static_cast<uint32_t>(x * 0xBF58476D1CE4E5B9ull >> 32);
}

__global__ void Fill(uint32_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    p[i] = DevicePatternWord(seed, i);
  }
}

__global__ void Check(const uint32_t* p, uint64_t n, uint32_t seed, unsigned long long* bad) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    if (p[i] != DevicePatternWord(seed, i)) atomicAdd(bad, 1ull);
  }
}

std::string Error(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace

std::string FillPattern(void* ptr, size_t bytes, uint32_t seed) {
  Fill<<<256, 256>>>(static_cast<uint32_t*>(ptr), bytes / 4, seed);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return Error("Fill launch", err);
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) return Error("Fill", err);
  return "";
}

long long CountMismatches(const void* ptr, size_t bytes, uint32_t seed, std::string* error) {
  unsigned long long* bad = nullptr;
  if (cudaError_t err = cudaMalloc(&bad, sizeof(*bad)); err != cudaSuccess) {
    *error = Error("cudaMalloc", err);
    return -1;
  }
  unsigned long long host = 0;
  cudaError_t err = cudaMemset(bad, 0, sizeof(*bad));
  if (err == cudaSuccess) {
    Check<<<256, 256>>>(static_cast<const uint32_t*>(ptr), bytes / 4, seed, bad);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(&host, bad, sizeof(host), cudaMemcpyDeviceToHost);
  cudaFree(bad);
  if (err != cudaSuccess) {
    *error = Error("Check", err);
    return -1;
  }
  return static_cast<long long>(host);
}

}  // namespace collectived::testing
