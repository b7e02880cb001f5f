// Shared buffers: memory the daemon and one client process both map.
//
// SharedBuffer is the seam between the core and the memory backend: the host
// backend is memfd pages (MemfdBuffer); a CUDA VMM backend exports a POSIX file
// descriptor in the same way. The core only needs an address it can read and
// write, a size, and a descriptor to hand to the client.
#ifndef COLLECTIVED_DAEMON_MEMORY_SHARED_BUFFER_H_
#define COLLECTIVED_DAEMON_MEMORY_SHARED_BUFFER_H_

#include <cstddef>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace collectived {

// A mapped shared region. Immutable after creation; safe to use from any
// thread. The mapping and descriptor live until the last reference is gone, so
// an op that is running keeps its buffers valid even if the owner frees them.
class SharedBuffer {
 public:
  virtual ~SharedBuffer() = default;
  // Address of the region in this process.
  virtual void* data() const = 0;
  // Size in bytes (a multiple of the page size).
  virtual size_t size() const = 0;
  // Descriptor that maps the same memory in another process; owned by the
  // buffer (callers dup it before passing it on).
  virtual int fd() const = 0;
  // "memfd" for host memory, "cuda" for a CUDA VMM allocation.
  virtual absl::string_view kind() const = 0;
  // The device holding the memory, canonical as DeviceSpec::ToString():
  // "cpu", or "cuda:GPU-<uuid>".
  virtual std::string device() const { return "cpu"; }
  // CUDA buffers: the device ordinal in this process (the one data() is
  // mapped on); -1 for host memory.
  virtual int device_ordinal() const { return -1; }
  // The id of the mesh whose members share this buffer (Engine's mesh-shared
  // buffers), "" for a buffer of one session.
  virtual absl::string_view shared_mesh() const { return ""; }
};

// Creates a host buffer of at least `size` bytes (rounded up to the page
// size) backed by memfd_create, mapped read-write and zero-filled. The file
// is sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): whoever holds the
// descriptor may write the bytes and punch holes (which read back as zeros)
// but never change the size, so the daemon's mapping cannot fault.
// Errors: INVALID_ARGUMENT for size 0, RESOURCE_EXHAUSTED when the kernel is
// out of memory or the process is at its descriptor budget (FdAdmitted).
absl::StatusOr<std::shared_ptr<SharedBuffer>> CreateMemfdBuffer(size_t size);

// Page size of this host.
size_t PageSize();

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_MEMORY_SHARED_BUFFER_H_
