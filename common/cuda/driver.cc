#include "common/cuda/driver.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cctype>
#include <cstdio>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/sync.h"

namespace collectived::cuda {
namespace {

std::string VersionString(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

struct Loaded {
  absl::Status status;
  DriverApi api;
};

// One driver function at ABI `version`, into `fn`. `fn` stays null, with an
// OK status, when the runtime finds no device before resolving anything.
absl::Status ResolveOne(const char* name, int version, int driver_version, void** fn) {
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &query);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorCallRequiresNewerDriver) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver too old: the driver supports CUDA ", VersionString(driver_version),
        ", this build's CUDA runtime needs ", VersionString(CUDART_VERSION),
        " or newer (update the NVIDIA driver)"));
  }
  if (err == cudaErrorNoDevice) {
    *fn = nullptr;
    return absl::OkStatus();
  }
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver unusable: cudaGetDriverEntryPointByVersion(", name, "): ",
        cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
  if (query != cudaDriverEntryPointSuccess || *fn == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver too old: driver ", VersionString(driver_version), " has no ", name,
        " of CUDA ", VersionString(version), " or newer (update the NVIDIA driver)"));
  }
  return absl::OkStatus();
}

// Resolves every function of COLLECTIVED_CUDA_DRIVER_FUNCTIONS into `api`;
// leaves them null when the runtime sees no device.
absl::Status ResolveFunctions(DriverApi& api) {
  int driver_version = 0;
  // cudart's own query: needs no driver entry point.
  if (cudaDriverGetVersion(&driver_version) != cudaSuccess) driver_version = 0;
#define COLLECTIVED_CUDA_RESOLVE(name, version)                                         \
  {                                                                                     \
    void* fn = nullptr;                                                                 \
    if (absl::Status s = ResolveOne(#name, version, driver_version, &fn); !s.ok()) {    \
      return s;                                                                         \
    }                                                                                   \
    if (fn == nullptr) {                                                                \
      api = DriverApi{};                                                                \
      return absl::OkStatus();                                                          \
    }                                                                                   \
    api.name = reinterpret_cast<PFN_##name##_v##version>(fn);                           \
  }
  COLLECTIVED_CUDA_DRIVER_FUNCTIONS(COLLECTIVED_CUDA_RESOLVE)
#undef COLLECTIVED_CUDA_RESOLVE
  return absl::OkStatus();
}

Loaded Load() {
  Loaded out;
  // cudart loads libcuda.so.1 itself, but only says "insufficient driver"
  // when it is missing; looking first tells "no driver" from "old driver".
  // The handle is kept: cudart's own dlopen then finds it loaded.
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* why = dlerror();
    out.status = absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver not found: libcuda.so.1 could not be loaded (no NVIDIA driver on this host)",
        why != nullptr ? absl::StrCat(": ", why) : std::string()));
    return out;
  }
  if (absl::Status s = ResolveFunctions(out.api); !s.ok()) {
    out.status = std::move(s);
    return out;
  }
  if (out.api.cuInit == nullptr) {
    // The runtime answered cudaErrorNoDevice: nothing is resolved.
    out.status = absl::FailedPreconditionError(
        "no CUDA devices: the NVIDIA driver is loaded but reports no GPU");
    return out;
  }
  DriverApi& api = out.api;
  api.cuDriverGetVersion(&api.driver_version);
  const CUresult init = api.cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE) {
    api.device_count = 0;
    return out;
  }
  if (init != CUDA_SUCCESS) {
    out.status = absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver failed to initialize: ", CuStatus(init, "cuInit").message()));
    return out;
  }
  if (const CUresult r = api.cuDeviceGetCount(&api.device_count); r != CUDA_SUCCESS) {
    out.status = CuStatus(r, "cuDeviceGetCount");
  }
  return out;
}

const Loaded& TheDriver() {
  static const Loaded* const loaded = new Loaded(Load());  // thread-safe, never freed
  return *loaded;
}

// Primary contexts retained by SetCurrentDevice, by ordinal.
struct Contexts {
  Mutex mu;
  std::vector<CUcontext> by_ordinal ABSL_GUARDED_BY(mu);
};

Contexts& TheContexts() {
  static Contexts* const contexts = new Contexts;
  return *contexts;
}

std::string NormalizeUuid(absl::string_view uuid) {
  absl::ConsumePrefix(&uuid, "cuda:");
  return absl::AsciiStrToLower(uuid);
}

}  // namespace

absl::StatusOr<const DriverApi*> Driver() {
  const Loaded& loaded = TheDriver();
  if (!loaded.status.ok()) return loaded.status;
  return &loaded.api;
}

absl::StatusOr<const DriverApi*> RequireDevices() {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  if ((*api)->device_count <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA devices: the NVIDIA driver (CUDA ", VersionString((*api)->driver_version),
        ") is loaded but sees no GPU (check CUDA_VISIBLE_DEVICES and the container's device "
        "access)"));
  }
  return api;
}

absl::Status CuStatus(CUresult result, absl::string_view call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const char* text = nullptr;
  const Loaded& loaded = TheDriver();
  if (loaded.api.cuGetErrorName != nullptr) loaded.api.cuGetErrorName(result, &name);
  if (loaded.api.cuGetErrorString != nullptr) loaded.api.cuGetErrorString(result, &text);
  std::string message = absl::StrCat(
      call, " failed: ", name != nullptr ? name : absl::StrCat("CUresult ", static_cast<int>(result)));
  if (text != nullptr) absl::StrAppend(&message, " (", text, ")");
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(message);
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return absl::FailedPreconditionError(message);
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::NotFoundError(message);
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string FormatUuid(const CUuuid& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  absl::StatusOr<const DriverApi*> api = RequireDevices();
  if (!api.ok()) return api.status();
  const DriverApi& d = **api;
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < d.device_count; ++i) {
    CUdevice dev;
    COLLECTIVED_CU_RETURN_IF_ERROR(d.cuDeviceGet(&dev, i));
    CUuuid uuid;
    COLLECTIVED_CU_RETURN_IF_ERROR(d.cuDeviceGetUuid(&uuid, dev));
    char name[256] = {};
    COLLECTIVED_CU_RETURN_IF_ERROR(d.cuDeviceGetName(name, sizeof(name) - 1, dev));
    devices.push_back(DeviceInfo{.ordinal = i, .uuid = FormatUuid(uuid), .name = name});
  }
  return devices;
}

std::string DescribeDevices(const std::vector<DeviceInfo>& devices) {
  return absl::StrJoin(devices, ", ", [](std::string* out, const DeviceInfo& d) {
    absl::StrAppend(out, d.ordinal, ": ", d.uuid, " (", d.name, ")");
  });
}

absl::StatusOr<int> ResolveDevice(const DeviceSpec& spec) {
  if (spec.kind != DeviceSpec::Kind::kCuda) {
    return absl::InvalidArgumentError("not a CUDA device (expected cuda:N or cuda:GPU-<uuid>)");
  }
  absl::StatusOr<std::vector<DeviceInfo>> devices = ListDevices();
  if (!devices.ok()) return devices.status();
  const std::string want = NormalizeUuid(spec.uuid);
  for (const DeviceInfo& d : *devices) {
    if (spec.uuid.empty() ? d.ordinal == spec.ordinal : absl::AsciiStrToLower(d.uuid) == want) {
      return d.ordinal;
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no CUDA device ",
      spec.uuid.empty() ? absl::StrCat("cuda:", spec.ordinal) : absl::StrCat("cuda:", spec.uuid),
      " on this host; there are ", DescribeDevices(*devices)));
}

absl::StatusOr<int> ResolveUuid(absl::string_view uuid) {
  DeviceSpec spec;
  spec.kind = DeviceSpec::Kind::kCuda;
  absl::ConsumePrefix(&uuid, "cuda:");
  if (!absl::StartsWithIgnoreCase(uuid, "GPU-")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", uuid, "' is not a GPU UUID (expected GPU-xxxxxxxx-...)"));
  }
  spec.uuid = std::string(uuid);
  return ResolveDevice(spec);
}

absl::Status SetCurrentDevice(int ordinal) {
  absl::StatusOr<const DriverApi*> api = RequireDevices();
  if (!api.ok()) return api.status();
  const DriverApi& d = **api;
  if (ordinal < 0 || ordinal >= d.device_count) {
    return absl::NotFoundError(absl::StrCat("no CUDA device with ordinal ", ordinal, " (there are ",
                                            d.device_count, ")"));
  }
  CUcontext ctx = nullptr;
  {
    Contexts& contexts = TheContexts();
    MutexLock lock(&contexts.mu);
    if (contexts.by_ordinal.size() < static_cast<size_t>(d.device_count)) {
      contexts.by_ordinal.resize(d.device_count, nullptr);
    }
    ctx = contexts.by_ordinal[ordinal];
    if (ctx == nullptr) {
      CUdevice dev;
      COLLECTIVED_CU_RETURN_IF_ERROR(d.cuDeviceGet(&dev, ordinal));
      COLLECTIVED_CU_RETURN_IF_ERROR(d.cuDevicePrimaryCtxRetain(&ctx, dev));
      contexts.by_ordinal[ordinal] = ctx;
    }
  }
  COLLECTIVED_CU_RETURN_IF_ERROR(d.cuCtxSetCurrent(ctx));
  return absl::OkStatus();
}

absl::StatusOr<VmmDevice> OpenVmmDevice(int ordinal) {
  absl::StatusOr<const DriverApi*> api = RequireDevices();
  if (!api.ok()) return api.status();
  if (absl::Status s = SetCurrentDevice(ordinal); !s.ok()) return s;
  VmmDevice d;
  d.api = *api;
  d.ordinal = ordinal;
  COLLECTIVED_CU_RETURN_IF_ERROR(d.api->cuDeviceGet(&d.dev, ordinal));
  CUuuid uuid;
  COLLECTIVED_CU_RETURN_IF_ERROR(d.api->cuDeviceGetUuid(&uuid, d.dev));
  d.uuid = FormatUuid(uuid);
  d.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  d.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.prop.location.id = d.dev;
  d.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return d;
}

}  // namespace collectived::cuda
