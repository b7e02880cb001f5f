// The buffer-allocator seam: one allocator per buffer kind, injected into the
// engine. The host allocator ("memfd") is always there; the CUDA VMM
// allocator ("cuda") is added when the daemon is built with CUDA and a GPU is
// usable.
//
// Devices are named by strings, as clients send them:
//   ""  or "cpu"                   host memory (memfd)
//   "cuda:N"                       GPU ordinal N as this daemon sees it
//   "cuda:GPU-<uuid>", "GPU-<uuid>" a GPU by UUID (as nvidia-smi -L prints
//                                  it); ordinals differ between containers,
//                                  UUIDs do not
// ParseDevice checks the syntax only; the allocator checks that the device
// exists.
//
// Thread-safety: allocators are called concurrently from RPC threads.
#ifndef COLLECTIVED_DAEMON_MEMORY_BUFFER_ALLOCATOR_H_
#define COLLECTIVED_DAEMON_MEMORY_BUFFER_ALLOCATOR_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/memory/shared_buffer.h"

namespace collectived {

struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  // kCuda: exactly one of ordinal (>= 0) and uuid ("GPU-...") is set.
  int ordinal = -1;
  std::string uuid;

  // "cpu", "cuda:0", "cuda:GPU-..." (the canonical form ParseDevice accepts).
  std::string ToString() const;
  // The buffer kind that serves this device: "memfd" or "cuda".
  absl::string_view buffer_kind() const { return kind == Kind::kCpu ? "memfd" : "cuda"; }
};

// INVALID_ARGUMENT naming the accepted forms for anything else.
absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text);

class BufferAllocator {
 public:
  virtual ~BufferAllocator() = default;
  // The kind of the buffers it makes ("memfd", "cuda"); SharedBuffer::kind().
  virtual absl::string_view kind() const = 0;
  // OK when it can allocate on this host; otherwise why not (e.g.
  // "no CUDA driver: libcuda.so.1 not found"). Logged once at start.
  virtual absl::Status Viable() const = 0;
  // A zero-filled buffer of at least `bytes` (rounded up to the allocator's
  // granularity) on `device`, which has this allocator's kind.
  // INVALID_ARGUMENT for 0 bytes, NOT_FOUND for a device that does not exist
  // (the message lists those that do), RESOURCE_EXHAUSTED when out of memory
  // or descriptors.
  virtual absl::StatusOr<std::shared_ptr<SharedBuffer>> Allocate(size_t bytes,
                                                                 const DeviceSpec& device) = 0;
};

// Host memory: CreateMemfdBuffer; only DeviceSpec::Kind::kCpu.
std::unique_ptr<BufferAllocator> MakeMemfdAllocator();

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_MEMORY_BUFFER_ALLOCATOR_H_
