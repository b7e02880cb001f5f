#include "client/src/cuda_import.h"

#include <unistd.h>

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda/driver.h"

namespace collectived {

// The header keeps cuda.h out of the SDK's other sources.
static_assert(std::is_same_v<CUmemGenericAllocationHandle, unsigned long long>);
static_assert(std::is_same_v<CUdeviceptr, unsigned long long>);

ImportedCudaBuffer::~ImportedCudaBuffer() {
  absl::StatusOr<const cuda::DriverApi*> api = cuda::Driver();
  if (!api.ok()) return;  // nothing can have been imported
  (void)cuda::SetCurrentDevice(ordinal_);
  if (mapped_) (*api)->cuMemUnmap(ptr_, size_);
  if (ptr_ != 0) (*api)->cuMemAddressFree(ptr_, size_);
  if (imported_) (*api)->cuMemRelease(handle_);
}

absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> ImportCudaBuffer(int fd, size_t size,
                                                                     absl::string_view device) {
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd >= 0) close(fd);
    }
  } close_fd{fd};
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("bad descriptor ", fd));
  if (size == 0) return absl::InvalidArgumentError("GPU buffer size must be > 0");

  absl::StatusOr<int> ordinal = cuda::ResolveUuid(device);
  if (!ordinal.ok()) return ordinal.status();
  absl::StatusOr<cuda::VmmDevice> vmm = cuda::OpenVmmDevice(*ordinal);
  if (!vmm.ok()) return vmm.status();
  const cuda::DriverApi& api = *vmm->api;
  const CUdevice dev = vmm->dev;
  const CUmemAllocationProp prop = vmm->prop;
  size_t granularity = 0;
  COLLECTIVED_CU_RETURN_IF_ERROR(
      api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (granularity != 0 && size % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPU buffer size ", size,
                                                   " is not a multiple of the granularity ",
                                                   granularity, " of cuda:", *ordinal));
  }

  std::unique_ptr<ImportedCudaBuffer> b(new ImportedCudaBuffer);
  b->size_ = size;
  b->ordinal_ = *ordinal;
  b->uuid_ = vmm->uuid;
  CUmemGenericAllocationHandle handle = 0;
  COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  b->handle_ = handle;
  b->imported_ = true;
  close(close_fd.fd);  // the handle holds the memory now
  close_fd.fd = -1;

  CUdeviceptr ptr = 0;
  COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemAddressReserve(&ptr, size, granularity, 0, 0));
  b->ptr_ = ptr;
  COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemMap(ptr, size, 0, handle, 0));
  b->mapped_ = true;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  COLLECTIVED_CU_RETURN_IF_ERROR(api.cuMemSetAccess(ptr, size, &access, 1));
  return b;
}

}  // namespace collectived
