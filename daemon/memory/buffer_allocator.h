// The buffer-allocator seam: one allocator per buffer kind, injected into the
// engine. The host allocator ("memfd") is always there; the CUDA VMM
// allocator ("cuda") is added when the daemon is built with CUDA and a GPU is
// usable.
//
// Devices are named as common/device.h says.
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
#include "common/device.h"
#include "daemon/memory/shared_buffer.h"

namespace collectived {

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
