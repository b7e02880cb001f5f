#include "client/src/cuda_stream_sync.h"

#include <cuda.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda/driver.h"

namespace collectived {

absl::StatusOr<std::unique_ptr<RegisteredHostWords>> RegisteredHostWords::Register(void* host,
                                                                                   size_t bytes) {
  if (host == nullptr || bytes == 0 || bytes % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream words: bad region of ", bytes, " bytes"));
  }
  auto api = cuda::RequireDevices();
  if (!api.ok()) return api.status();
  // Any context will do: the registration is portable (every context sees
  // it). The caller's current context, if it has one; else device 0's
  // primary context, made current only for this call.
  CUcontext current = nullptr;
  COLLECTIVED_CU_RETURN_IF_ERROR((*api)->cuCtxGetCurrent(&current));
  if (current == nullptr) {
    if (auto st = cuda::SetCurrentDevice(0); !st.ok()) return st;
  }
  const CUresult registered = (*api)->cuMemHostRegister(
      host, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (current == nullptr) (*api)->cuCtxSetCurrent(nullptr);
  if (registered != CUDA_SUCCESS) return cuda::CuStatus(registered, "cuMemHostRegister");
  std::unique_ptr<RegisteredHostWords> w(new RegisteredHostWords);
  w->host_ = host;
  w->bytes_ = bytes;
  return w;
}

RegisteredHostWords::~RegisteredHostWords() {
  auto api = cuda::Driver();
  if (api.ok() && host_ != nullptr) (*api)->cuMemHostUnregister(host_);
}

absl::StatusOr<unsigned long long> RegisteredHostWords::Address(size_t offset) const {
  if (offset % 8 != 0 || offset > bytes_ || bytes_ - offset < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream words: offset ", offset, " is not a word of the ", bytes_, " bytes"));
  }
  return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(host_) + offset);
}

absl::Status RegisteredHostWords::WriteOnStream(void* stream, size_t offset,
                                                uint64_t value) const {
  auto addr = Address(offset);
  if (!addr.ok()) return addr.status();
  auto api = cuda::Driver();
  if (!api.ok()) return api.status();
  COLLECTIVED_CU_RETURN_IF_ERROR((*api)->cuStreamWriteValue64(
      static_cast<CUstream>(stream), *addr, value, CU_STREAM_WRITE_VALUE_DEFAULT));
  return absl::OkStatus();
}

absl::Status RegisteredHostWords::WaitOnStream(void* stream, size_t offset,
                                               uint64_t value) const {
  auto addr = Address(offset);
  if (!addr.ok()) return addr.status();
  auto api = cuda::Driver();
  if (!api.ok()) return api.status();
  COLLECTIVED_CU_RETURN_IF_ERROR((*api)->cuStreamWaitValue64(
      static_cast<CUstream>(stream), *addr, value, CU_STREAM_WAIT_VALUE_GEQ));
  return absl::OkStatus();
}

}  // namespace collectived
