#include "daemon/memory/cuda_vmm_buffer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda/driver.h"
#include "common/fd_limit.h"

namespace collectived {
namespace {

using cuda::DriverApi;

// What an allocation holds; each step done is undone, in reverse, when it is
// destroyed (also after a failed Allocate).
struct VmmAllocation {
  const DriverApi* api = nullptr;
  int ordinal = -1;
  size_t size = 0;
  bool created = false;
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;  // reserved range, 0 when none
  bool mapped = false;
  int fd = -1;

  VmmAllocation() = default;
  VmmAllocation(const VmmAllocation&) = delete;
  VmmAllocation& operator=(const VmmAllocation&) = delete;
  ~VmmAllocation() {
    if (fd >= 0) close(fd);
    if (api == nullptr) return;
    // Unmapping needs no particular context, but make the device's current
    // in case this thread never had one.
    (void)cuda::SetCurrentDevice(ordinal);
    if (mapped) api->cuMemUnmap(ptr, size);
    if (ptr != 0) api->cuMemAddressFree(ptr, size);
    if (created) api->cuMemRelease(handle);
  }
};

class CudaVmmBuffer final : public SharedBuffer {
 public:
  CudaVmmBuffer(std::unique_ptr<VmmAllocation> alloc, std::string uuid)
      : alloc_(std::move(alloc)), device_(absl::StrCat("cuda:", uuid)) {}

  void* data() const override { return reinterpret_cast<void*>(alloc_->ptr); }
  size_t size() const override { return alloc_->size; }
  int fd() const override { return alloc_->fd; }
  absl::string_view kind() const override { return "cuda"; }
  std::string device() const override { return device_; }
  int device_ordinal() const override { return alloc_->ordinal; }

 private:
  const std::unique_ptr<VmmAllocation> alloc_;
  const std::string device_;
};

class CudaVmmAllocator final : public BufferAllocator {
 public:
  absl::string_view kind() const override { return "cuda"; }

  absl::Status Viable() const override { return cuda::RequireDevices().status(); }

  absl::StatusOr<std::shared_ptr<SharedBuffer>> Allocate(size_t bytes,
                                                         const DeviceSpec& device) override {
    if (bytes == 0) return absl::InvalidArgumentError("buffer size must be > 0");
    if (device.kind != DeviceSpec::Kind::kCuda) {
      return absl::InvalidArgumentError(
          "the cuda allocator serves CUDA devices only (cuda:N or cuda:GPU-<uuid>)");
    }
    absl::StatusOr<int> ordinal = cuda::ResolveDevice(device);
    if (!ordinal.ok()) return ordinal.status();
    absl::StatusOr<cuda::VmmDevice> vmm = cuda::OpenVmmDevice(*ordinal);
    if (!vmm.ok()) return vmm.status();
    const DriverApi& api = *vmm->api;
    const CUdevice dev = vmm->dev;
    CUmemAllocationProp prop = vmm->prop;
    int rdma = 0;
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuDeviceGetAttribute(
        &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev));
    if (rdma != 0) prop.allocFlags.gpuDirectRDMACapable = 1;

    size_t granularity = 0;
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemGetAllocationGranularity(
        &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (granularity == 0) granularity = 2u << 20;
    if (bytes > SIZE_MAX - (granularity - 1)) {
      return absl::InvalidArgumentError(absl::StrCat("buffer size ", bytes, " overflows"));
    }
    const size_t size = (bytes + granularity - 1) / granularity * granularity;

    auto alloc = std::make_unique<VmmAllocation>();
    alloc->api = &api;
    alloc->ordinal = *ordinal;
    alloc->size = size;
    if (const CUresult r = api.cuMemCreate(&alloc->handle, size, &prop, 0); r != CUDA_SUCCESS) {
      return cuda::CuStatus(r, absl::StrCat("cuMemCreate of ", size, " bytes on cuda:", *ordinal));
    }
    alloc->created = true;

    // Export first: running out of descriptors is the cheapest failure.
    int fd = -1;
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemExportToShareableHandle(
        &fd, alloc->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    alloc->fd = fd;
    if (!FdAdmitted(fd)) return FdExhaustedError("a GPU buffer");
    // Like a memfd buffer's: never inherited by a process the daemon starts.
    fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);

    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemAddressReserve(&alloc->ptr, size, granularity, 0, 0));
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemMap(alloc->ptr, size, 0, alloc->handle, 0));
    alloc->mapped = true;
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemSetAccess(alloc->ptr, size, &access, 1));
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemsetD8(alloc->ptr, 0, size));
    COLLECTIVED_CU_RETURN_IF_ERROR(api.cuCtxSynchronize());

    return std::shared_ptr<SharedBuffer>(new CudaVmmBuffer(std::move(alloc), vmm->uuid));
  }
};

}  // namespace

std::unique_ptr<BufferAllocator> MakeCudaVmmAllocator() {
  return std::make_unique<CudaVmmAllocator>();
}

}  // namespace collectived
