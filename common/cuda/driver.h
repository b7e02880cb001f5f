// The CUDA driver API, reached without linking libcuda.
//
// libcuda.so.1 comes with the NVIDIA driver, not with the toolkit: a binary
// linked against it does not start on a host without a GPU. collectived links
// the CUDA runtime statically (cudart_static, which loads libcuda by itself
// when first asked) and fetches each driver function it needs through
// cudaGetDriverEntryPointByVersion, at the ABI version whose signature the
// PFN_* type below spells. So the same daemon and SDK run everywhere; only GPU
// buffers need a driver.
//
// Used by the daemon (daemon/memory/cuda_vmm_buffer.h) and the SDK
// (client/src/cuda_import.h). Built only when COLLECTIVED_HAVE_CUDA.
//
// Thread-safety: everything here may be called from any thread.
#ifndef COLLECTIVED_COMMON_CUDA_DRIVER_H_
#define COLLECTIVED_COMMON_CUDA_DRIVER_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"

namespace collectived::cuda {

// The driver entry points collectived uses: X(name, ABI version). The version
// selects the function's signature (cuDeviceGetUuid at 11040 is
// cuDeviceGetUuid_v2, cuMemsetD8 at 3020 takes a 64-bit CUdeviceptr, ...).
#define COLLECTIVED_CUDA_DRIVER_FUNCTIONS(X)     \
  X(cuInit, 2000)                                \
  X(cuDriverGetVersion, 2020)                    \
  X(cuGetErrorString, 6000)                      \
  X(cuGetErrorName, 6000)                        \
  X(cuDeviceGet, 2000)                           \
  X(cuDeviceGetCount, 2000)                      \
  X(cuDeviceGetName, 2000)                       \
  X(cuDeviceGetUuid, 11040)                      \
  X(cuDeviceGetAttribute, 2000)                  \
  X(cuDevicePrimaryCtxRetain, 7000)              \
  X(cuDevicePrimaryCtxRelease, 11000)            \
  X(cuCtxSetCurrent, 4000)                       \
  X(cuCtxGetCurrent, 4000)                       \
  X(cuCtxSynchronize, 2000)                      \
  X(cuMemGetInfo, 3020)                          \
  X(cuMemGetAllocationGranularity, 10020)        \
  X(cuMemCreate, 10020)                          \
  X(cuMemRelease, 10020)                         \
  X(cuMemExportToShareableHandle, 10020)         \
  X(cuMemImportFromShareableHandle, 10020)       \
  X(cuMemAddressReserve, 10020)                  \
  X(cuMemAddressFree, 10020)                     \
  X(cuMemMap, 10020)                             \
  X(cuMemUnmap, 10020)                           \
  X(cuMemSetAccess, 10020)                       \
  X(cuMemsetD8, 3020)                            \
  X(cuMemcpyHtoD, 3020)                          \
  X(cuMemcpyDtoH, 3020)                          \
  X(cuMemHostRegister, 6050)                     \
  X(cuMemHostUnregister, 4000)                   \
  X(cuStreamWriteValue64, 11070)                 \
  X(cuStreamWaitValue64, 11070)                  \
  X(cuStreamSynchronize, 2000)

// cuda.h maps some names to their latest version (cuDeviceGetUuid is
// cuDeviceGetUuid_v2): the PFN type is pasted from the unexpanded name, the
// field takes the expanded one, as calls through it do.
struct DriverApi {
#define COLLECTIVED_CUDA_FIELD(name, version) PFN_##name##_v##version name = nullptr;
  COLLECTIVED_CUDA_DRIVER_FUNCTIONS(COLLECTIVED_CUDA_FIELD)
#undef COLLECTIVED_CUDA_FIELD
  int driver_version = 0;  // cuDriverGetVersion: 1000 * major + 10 * minor
  int device_count = 0;    // cuDeviceGetCount after cuInit (may be 0)
};

// The driver, loaded and initialized (cuInit) once per process on the first
// call; later calls return the same result. FAILED_PRECONDITION, with the
// reason, when there is none usable:
//   "CUDA driver not found: libcuda.so.1 could not be loaded (no NVIDIA driver
//    on this host): <dlerror>"
//   "CUDA driver too old: ..." (the driver predates this build's CUDA runtime,
//    or lacks one of the functions above)
//   "CUDA driver failed to initialize: cuInit: ..."
//   "no CUDA devices: ..." when the runtime already finds no GPU
// Otherwise a host with a driver and no GPU loads with device_count 0 (cuInit's
// CUDA_ERROR_NO_DEVICE is not an error here); see RequireDevices.
absl::StatusOr<const DriverApi*> Driver();

// Driver(), and at least one device: FAILED_PRECONDITION "no CUDA devices: ..."
// otherwise.
absl::StatusOr<const DriverApi*> RequireDevices();

// `result` as a status: OK for CUDA_SUCCESS, else "<call> failed:
// CUDA_ERROR_<NAME> (<description>)". Codes: RESOURCE_EXHAUSTED for out of
// memory, FAILED_PRECONDITION for no device / driver problems, NOT_FOUND for
// an invalid device, UNIMPLEMENTED for not supported, INTERNAL otherwise.
absl::Status CuStatus(CUresult result, absl::string_view call);

// CU_CHECK-style: returns from the enclosing function (returning absl::Status
// or absl::StatusOr) with CuStatus when the call fails.
//   COLLECTIVED_CU_RETURN_IF_ERROR(api->cuMemMap(ptr, size, 0, handle, 0));
#define COLLECTIVED_CU_RETURN_IF_ERROR(call)                                          \
  do {                                                                                \
    const CUresult collectived_cu_result_ = (call);                                   \
    if (collectived_cu_result_ != CUDA_SUCCESS) {                                     \
      return ::collectived::cuda::CuStatus(collectived_cu_result_, #call);            \
    }                                                                                 \
  } while (false)

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string FormatUuid(const CUuuid& uuid);

struct DeviceInfo {
  int ordinal = -1;   // in this process (CUDA_VISIBLE_DEVICES and containers renumber)
  std::string uuid;   // FormatUuid
  std::string name;   // e.g. "NVIDIA H200"
};

// The devices this process sees, by ordinal. Errors as RequireDevices.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

// "0: GPU-... (NVIDIA H200), 1: ..." for messages.
std::string DescribeDevices(const std::vector<DeviceInfo>& devices);

// The ordinal in this process of `spec` (kind kCuda; by ordinal or by UUID,
// "GPU-..." compared case-insensitively). NOT_FOUND listing the devices there
// are when it names none of them; INVALID_ARGUMENT for a non-CUDA spec.
absl::StatusOr<int> ResolveDevice(const DeviceSpec& spec);
// The same for a UUID alone ("GPU-..." or "cuda:GPU-...").
absl::StatusOr<int> ResolveUuid(absl::string_view uuid);

// Makes device `ordinal`'s primary context current on the calling thread. The
// primary context is retained on first use and kept for the life of the
// process (as the CUDA runtime does), so buffers never outlive it.
absl::Status SetCurrentDevice(int ordinal);

// GPU `ordinal` made current for VMM work (SetCurrentDevice): its CUdevice,
// its UUID ("GPU-...") and the allocation properties of the memory
// collectived shares: pinned on that device, exportable as a POSIX file
// descriptor. The exporter and the importer use the same properties.
struct VmmDevice {
  const DriverApi* api = nullptr;
  int ordinal = -1;
  CUdevice dev = 0;
  std::string uuid;
  CUmemAllocationProp prop = {};
};
absl::StatusOr<VmmDevice> OpenVmmDevice(int ordinal);

}  // namespace collectived::cuda

#endif  // COLLECTIVED_COMMON_CUDA_DRIVER_H_
