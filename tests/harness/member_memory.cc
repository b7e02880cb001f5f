#include "tests/harness/member_memory.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#if COLLECTIVED_TEST_MEMORY_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace collectived::testing {
namespace {

class HostMemory : public MemberMemory {
 public:
  HostMemory() : MemberMemory("cpu") {}

 protected:
  absl::Status CopyIn(const Buffer& buffer, size_t offset, const void* src,
                      size_t bytes) const override {
    std::memcpy(static_cast<uint8_t*>(buffer.data()) + offset, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOut(const Buffer& buffer, size_t offset, void* dst,
                       size_t bytes) const override {
    std::memcpy(dst, static_cast<const uint8_t*>(buffer.data()) + offset, bytes);
    return absl::OkStatus();
  }
};

#if COLLECTIVED_TEST_MEMORY_HAS_CUDA
absl::Status CudaOk(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

class CudaMemory : public MemberMemory {
 public:
  explicit CudaMemory(std::string device) : MemberMemory(std::move(device)) {}

 protected:
  absl::Status CopyIn(const Buffer& buffer, size_t offset, const void* src,
                      size_t bytes) const override {
    if (auto st = CudaOk(cudaSetDevice(buffer.device_ordinal()), "cudaSetDevice"); !st.ok()) {
      return st;
    }
    if (auto st = CudaOk(cudaMemcpy(static_cast<uint8_t*>(buffer.data()) + offset, src, bytes,
                                    cudaMemcpyHostToDevice),
                         "cudaMemcpy to device");
        !st.ok()) {
      return st;
    }
    // A copy from pageable memory may return before the bytes landed; the
    // daemon reads them from another process.
    return CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  absl::Status CopyOut(const Buffer& buffer, size_t offset, void* dst,
                       size_t bytes) const override {
    if (auto st = CudaOk(cudaSetDevice(buffer.device_ordinal()), "cudaSetDevice"); !st.ok()) {
      return st;
    }
    return CudaOk(cudaMemcpy(dst, static_cast<const uint8_t*>(buffer.data()) + offset, bytes,
                             cudaMemcpyDeviceToHost),
                  "cudaMemcpy to host");
  }
};
#endif

}  // namespace

bool MemberMemory::CudaBuilt() { return COLLECTIVED_TEST_MEMORY_HAS_CUDA != 0; }

absl::StatusOr<std::unique_ptr<MemberMemory>> MemberMemory::ForDevice(const std::string& device) {
  if (device == "cpu") return std::make_unique<HostMemory>();
  int ordinal = -1;
  if (!absl::StartsWith(device, "cuda:") ||
      !absl::SimpleAtoi(device.substr(5), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device '", device, "' (want cpu or cuda:N)"));
  }
#if COLLECTIVED_TEST_MEMORY_HAS_CUDA
  return std::make_unique<CudaMemory>(device);
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", device, ": this test binary was built without CUDA (COLLECTIVED_WITH_CUDA)"));
#endif
}

absl::StatusOr<Buffer> MemberMemory::Allocate(Client& client, size_t bytes) const {
  absl::StatusOr<Buffer> b = client.Allocate(bytes, device_);
  if (!b.ok()) return b.status();
  if (is_cpu() != (b->device_ordinal() < 0)) {
    return absl::InternalError(absl::StrCat("asked for ", device_, ", got a buffer on ",
                                            b->device(), " (ordinal ", b->device_ordinal(), ")"));
  }
  return b;
}

absl::Status MemberMemory::Write(const Buffer& buffer, size_t offset, const void* src,
                                 size_t bytes) const {
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("write of ", bytes, " bytes at ", offset,
                                              " into a buffer of ", buffer.size()));
  }
  if (bytes == 0) return absl::OkStatus();
  return CopyIn(buffer, offset, src, bytes);
}

absl::Status MemberMemory::Read(const Buffer& buffer, size_t offset, void* dst,
                                size_t bytes) const {
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    return absl::OutOfRangeError(absl::StrCat("read of ", bytes, " bytes at ", offset,
                                              " from a buffer of ", buffer.size()));
  }
  if (bytes == 0) return absl::OkStatus();
  return CopyOut(buffer, offset, dst, bytes);
}

absl::StatusOr<std::vector<uint8_t>> MemberMemory::Read(const Buffer& buffer, size_t offset,
                                                        size_t bytes) const {
  std::vector<uint8_t> out(bytes);
  if (absl::Status st = Read(buffer, offset, out.data(), bytes); !st.ok()) return st;
  return out;
}

}  // namespace collectived::testing
