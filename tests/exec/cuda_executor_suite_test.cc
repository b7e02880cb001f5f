// The executor suite (executor_suite.h) on the CUDA executor, twice: every
// member's memory on GPU 0 (the same-GPU kernels), and members spread over
// every GPU of the host, member m on GPU m % count (NCCL between the GPUs,
// spanning.h). Memory is device memory copied in and out with cudaMemcpy. On
// a host without a usable GPU every case is skipped with the executor's
// reason (fails, with COLLECTIVED_REQUIRE_GPU=1); the cases across GPUs skip
// on a host with one GPU, saying so, whatever COLLECTIVED_REQUIRE_GPU says.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "exec/cuda/cuda_executor.h"
#include "tests/exec/executor_suite.h"

namespace collectived::executor_suite {
namespace {

absl::Status CudaOk(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

int GpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// The CUDA executor, viable only where there are two GPUs or more.
class AcrossGpusExecutor final : public Executor {
 public:
  AcrossGpusExecutor() : cuda_(MakeCudaExecutor()) {}
  absl::string_view name() const override { return "cuda across GPUs"; }
  absl::string_view buffer_kind() const override { return "cuda"; }
  bool IsViable() const override { return cuda_->IsViable() && GpuCount() >= 2; }
  std::string WhyNotViable() const override {
    if (!cuda_->IsViable()) return cuda_->WhyNotViable();
    return absl::StrCat("members across GPUs need two GPUs; this host has ", GpuCount());
  }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic) override {
    return cuda_->Run(plan, io, traffic);
  }
  int threads() const override { return 1; }

 private:
  std::unique_ptr<Executor> cuda_;
};

template <bool kAcross>
struct CudaBackend {
  static constexpr const char* kName = kAcross ? "cuda across GPUs" : "cuda";
  // Across GPUs: a plain skip below two GPUs (the GPU check runs on a
  // one-GPU machine and reports these as not run).
  static constexpr bool kNeedsGpu = !kAcross;
  static std::unique_ptr<Executor> MakeExecutor() {
    if constexpr (kAcross) {
      return std::make_unique<AcrossGpusExecutor>();
    } else {
      return MakeCudaExecutor();
    }
  }
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
    if (auto st = CudaOk(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                         "cudaMemcpy to device");
        !st.ok()) {
      return st;
    }
    // A copy from pageable memory may return before its bytes land, and the
    // executor's stream does not wait for the legacy default stream.
    return CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  static absl::Status CopyOut(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaOk(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  static int Device(int member) {
    if constexpr (kAcross) {
      return member % std::max(1, GpuCount());
    } else {
      return 0;
    }
  }
};

using CudaSameGpuBackend = CudaBackend<false>;
using CudaAcrossGpusBackend = CudaBackend<true>;

INSTANTIATE_TYPED_TEST_SUITE_P(CudaSameGpu, ExecutorSuite, CudaSameGpuBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(CudaAcrossGpus, ExecutorSuite, CudaAcrossGpusBackend);

}  // namespace
}  // namespace collectived::executor_suite
