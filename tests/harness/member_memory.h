// How a test's member process reaches the memory of its buffers: host memory
// ("cpu", the daemon's mmap) with memcpy, GPU memory ("cuda:N", a device
// address) with cudaMemcpy through a host copy. The test workers keep their
// inputs and expected outputs in host vectors and move them through Write and
// Read only, so one sweep serves every backend.
#ifndef COLLECTIVED_TESTS_HARNESS_MEMBER_MEMORY_H_
#define COLLECTIVED_TESTS_HARNESS_MEMBER_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectived/client.h"

namespace collectived::testing {

class MemberMemory {
 public:
  // "cpu" or "cuda:N". INVALID_ARGUMENT for another name; FAILED_PRECONDITION
  // for "cuda:N" in a build without CUDA.
  static absl::StatusOr<std::unique_ptr<MemberMemory>> ForDevice(const std::string& device);
  // Whether this build can reach GPU memory (COLLECTIVED_HAVE_CUDA).
  static bool CudaBuilt();

  virtual ~MemberMemory() = default;

  // The device as given ("cpu", "cuda:0").
  const std::string& device() const { return device_; }
  bool is_cpu() const { return device_ == "cpu"; }

  // A buffer of `bytes` on this device.
  absl::StatusOr<Buffer> Allocate(Client& client, size_t bytes) const;

  // Copies `bytes` bytes between the host and `buffer` at `offset`. For GPU
  // memory Write returns once the bytes are on the device (visible to the
  // daemon), Read once they are on the host.
  absl::Status Write(const Buffer& buffer, size_t offset, const void* src, size_t bytes) const;
  absl::Status Read(const Buffer& buffer, size_t offset, void* dst, size_t bytes) const;
  absl::StatusOr<std::vector<uint8_t>> Read(const Buffer& buffer, size_t offset,
                                            size_t bytes) const;

 protected:
  explicit MemberMemory(std::string device) : device_(std::move(device)) {}
  virtual absl::Status CopyIn(const Buffer& buffer, size_t offset, const void* src,
                              size_t bytes) const = 0;
  virtual absl::Status CopyOut(const Buffer& buffer, size_t offset, void* dst,
                               size_t bytes) const = 0;

 private:
  std::string device_;
};

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_MEMBER_MEMORY_H_
