// The executor suite (executor_suite.h) on the CUDA executor: every member's
// memory is device memory on GPU 0 (the executor runs members of one GPU;
// members on several GPUs need NCCL), copied in and out with cudaMemcpy. On a
// host without a usable GPU every case is skipped with the executor's reason
// (fails, with COLLECTIVED_REQUIRE_GPU=1).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "daemon/exec/cuda/cuda_executor.h"
#include "tests/exec/executor_suite.h"

namespace collectived::executor_suite {
namespace {

absl::Status CudaOk(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

struct CudaSameGpuBackend {
  static constexpr const char* kName = "cuda";
  static constexpr bool kNeedsGpu = true;
  static std::unique_ptr<Executor> MakeExecutor() { return MakeCudaExecutor(); }
  static absl::StatusOr<void*> Allocate(size_t bytes, int member) {
    if (auto st = CudaOk(cudaSetDevice(Device(member)), "cudaSetDevice"); !st.ok()) return st;
    void* p = nullptr;
    // Never 0 bytes: the suite writes a guard after every region.
    if (auto st = CudaOk(cudaMalloc(&p, bytes + 64), "cudaMalloc"); !st.ok()) return st;
    return p;
  }
  static void Free(void* p) { cudaFree(p); }
  static absl::Status CopyIn(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaOk(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  static absl::Status CopyOut(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaOk(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  static int Device(int) { return 0; }
};

INSTANTIATE_TYPED_TEST_SUITE_P(CudaSameGpu, ExecutorSuite, CudaSameGpuBackend);

}  // namespace
}  // namespace collectived::executor_suite
