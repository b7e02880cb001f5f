// cuda_copy_perf's copy kernel (copy_kernel.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

// Copies `bytes` from src to dst (device memory of the current device) on
// `stream` with a grid-stride kernel of at most 8 blocks per SM (`sms`, the
// device's multiprocessor count). Returns the launch's error.
cudaError_t LaunchCopyKernel(void* dst, const void* src, size_t bytes, int sms,
                             cudaStream_t stream);
