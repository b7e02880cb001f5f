// SDK side of stream-ordered submission (v1::StreamSync): host words that a
// CUDA stream of this process writes and waits on.
//
// The words live in a host buffer the daemon allocated (a memfd mapped here
// and in the daemon). Register makes them usable from streams
// (cuMemHostRegister, portable and device-mapped; with unified addressing,
// which every 64-bit Linux CUDA platform has, a registered host address is
// also its device address). WriteOnStream enqueues cuStreamWriteValue64 (with
// its default memory barrier: everything the stream wrote before is visible
// first); WaitOnStream enqueues cuStreamWaitValue64 (>=).
//
// Built into the SDK only when COLLECTIVED_HAVE_CUDA. Thread-safety: the
// object is immutable after Register; the stream rules of CUDA apply to the
// calls.
#ifndef COLLECTIVED_CLIENT_SRC_CUDA_STREAM_SYNC_H_
#define COLLECTIVED_CLIENT_SRC_CUDA_STREAM_SYNC_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace collectived {

class RegisteredHostWords {
 public:
  // Registers [host, host + bytes) (page-aligned, mapped for as long as the
  // object lives). FAILED_PRECONDITION when this process has no usable CUDA
  // driver or GPU; the driver's error (naming the call) otherwise.
  static absl::StatusOr<std::unique_ptr<RegisteredHostWords>> Register(void* host, size_t bytes);
  ~RegisteredHostWords();  // unregisters
  RegisteredHostWords(const RegisteredHostWords&) = delete;
  RegisteredHostWords& operator=(const RegisteredHostWords&) = delete;

  // Enqueues on `stream` (a CUstream / cudaStream_t; null is the legacy
  // default stream) a write of `value` to the word at byte `offset`.
  absl::Status WriteOnStream(void* stream, size_t offset, uint64_t value) const;
  // Enqueues on `stream` a wait until the word at `offset` is >= `value`.
  absl::Status WaitOnStream(void* stream, size_t offset, uint64_t value) const;

 private:
  RegisteredHostWords() = default;
  // The device address (a CUdeviceptr) of the word at `offset`.
  absl::StatusOr<unsigned long long> Address(size_t offset) const;
  void* host_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_CUDA_STREAM_SYNC_H_
