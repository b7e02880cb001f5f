// The allocator suite (allocator_suite.h) on GPU memory: the CUDA VMM
// allocator (daemon/memory/cuda_vmm_buffer.h). Every case is skipped, with
// the reason, where the allocator is not viable (no GPU or no driver).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "daemon/memory/cuda_vmm_buffer.h"
#include "tests/memory/allocator_suite.h"

namespace collectived::testing {
namespace {

absl::Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

struct CudaVmm {
  static constexpr const char* kName = "CUDA VMM";
  static std::unique_ptr<BufferAllocator> Make() { return MakeCudaVmmAllocator(); }
  static constexpr const char* kDevice = "cuda:0";
  // No machine this runs on has 4096 GPUs.
  static constexpr const char* kMissingDevice = "cuda:4095";
  static constexpr bool kHostMapped = false;
  static absl::Status Read(const SharedBuffer& b, size_t offset, void* out, size_t n) {
    if (absl::Status st = Check(cudaSetDevice(b.device_ordinal()), "cudaSetDevice"); !st.ok()) {
      return st;
    }
    return Check(cudaMemcpy(out, static_cast<const uint8_t*>(b.data()) + offset, n,
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy to the host");
  }
  static absl::Status Write(SharedBuffer& b, size_t offset, const void* in, size_t n) {
    if (absl::Status st = Check(cudaSetDevice(b.device_ordinal()), "cudaSetDevice"); !st.ok()) {
      return st;
    }
    return Check(cudaMemcpy(static_cast<uint8_t*>(b.data()) + offset, in, n,
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy to the device");
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(CudaVmm, AllocatorSuite, CudaVmm);

}  // namespace
}  // namespace collectived::testing
