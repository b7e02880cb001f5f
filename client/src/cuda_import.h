// SDK side of GPU buffers: maps a buffer the daemon allocated on a GPU
// (daemon/memory/cuda_vmm_buffer.h) into this process.
//
// The daemon sends, for a buffer of kind "cuda": the exported descriptor
// (SCM_RIGHTS, like a memfd buffer's), the size (SharedBuffer::size(), a
// multiple of the VMM granularity) and the device as SharedBuffer::device()
// names it, "cuda:GPU-<uuid>". The UUID, not the daemon's ordinal, is what
// identifies the GPU: a client in another container (or with another
// CUDA_VISIBLE_DEVICES) numbers the same GPU differently.
//
// Wiring, for the client: on an "cuda" buffer, call
//   absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> b =
//       ImportCudaBuffer(fd, size, device);
// keep the object for as long as the buffer is used, and use
// (*b)->device_ptr() on (*b)->device_ordinal() (CUDA runtime: cudaSetDevice of
// that ordinal; the mapping lives in its primary context). Destroying it
// unmaps; the driver frees the memory when the daemon has released it too.
//
// Built into the SDK only when COLLECTIVED_HAVE_CUDA.
#ifndef COLLECTIVED_CLIENT_SRC_CUDA_IMPORT_H_
#define COLLECTIVED_CLIENT_SRC_CUDA_IMPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace collectived {

// A GPU buffer mapped read-write in this process. Not copyable; thread-safe
// to read.
class ImportedCudaBuffer {
 public:
  ~ImportedCudaBuffer();  // unmaps, frees the address range, drops the handle
  ImportedCudaBuffer(const ImportedCudaBuffer&) = delete;
  ImportedCudaBuffer& operator=(const ImportedCudaBuffer&) = delete;

  // Device address (a CUdeviceptr) of the buffer, valid on device_ordinal().
  void* device_ptr() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }
  size_t size() const { return size_; }
  // The GPU's ordinal in this process, and its UUID ("GPU-...").
  int device_ordinal() const { return ordinal_; }
  const std::string& uuid() const { return uuid_; }

 private:
  friend absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> ImportCudaBuffer(
      int fd, size_t size, absl::string_view device);
  ImportedCudaBuffer() = default;

  unsigned long long handle_ = 0;  // CUmemGenericAllocationHandle
  bool imported_ = false;
  unsigned long long ptr_ = 0;     // CUdeviceptr, 0 when none reserved
  bool mapped_ = false;
  size_t size_ = 0;
  int ordinal_ = -1;
  std::string uuid_;
};

// Imports the GPU buffer of descriptor `fd` (an exported CUDA VMM allocation)
// of `size` bytes on `device` ("cuda:GPU-<uuid>" or "GPU-<uuid>"): finds the
// local ordinal of that UUID, cuMemImportFromShareableHandle, reserves an
// address range, maps it and grants read-write access on that device.
// Takes ownership of `fd` and closes it before returning, whether the import
// succeeded or not (the imported handle keeps the memory alive).
// Errors: FAILED_PRECONDITION when this process has no usable CUDA driver or
// GPU (the reason says which); NOT_FOUND, listing the local GPUs, when none
// has that UUID (the daemon's GPU is not visible here); INVALID_ARGUMENT for
// a negative fd, a size that is 0 or not a multiple of the device's granularity,
// or a malformed device; RESOURCE_EXHAUSTED when the driver runs out of
// memory; INTERNAL for other driver failures (the call is named).
absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> ImportCudaBuffer(int fd, size_t size,
                                                                     absl::string_view device);

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_CUDA_IMPORT_H_
