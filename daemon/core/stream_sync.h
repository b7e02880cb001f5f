// Stream-ordered submission, the daemon's side (v1::StreamSync): an op
// waits until each member's `ready` word reaches the op's value, and the
// daemon raises each member's `done` word to it once the op is over.
//
// The words live in a host (memfd) buffer of the member's session, mapped by
// the client too (and registered there with CUDA so its stream writes and
// waits on them). They are untrusted: the client may write anything at any
// time; the daemon only loads `ready` and raises `done` (atomic, 64-bit,
// never lowered), so a bad value can only delay or release that client's
// own stream.
//
// Thread-safety: SyncWords is immutable after Resolve and its methods are
// safe to call from any thread; OpCancel is thread-safe.
#ifndef COLLECTIVED_DAEMON_CORE_STREAM_SYNC_H_
#define COLLECTIVED_DAEMON_CORE_STREAM_SYNC_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectived/v1/collective.pb.h"
#include "common/sync.h"
#include "daemon/memory/shared_buffer.h"

namespace collectived {

class SyncWords {
 public:
  // The words of `sync`, in buffers `find` returns by id (NOT_FOUND /
  // INVALID_ARGUMENT errors of its own). Refused (INVALID_ARGUMENT /
  // OUT_OF_RANGE, naming the field): a value of 0, a buffer that is not host
  // memory, a region that is not 8 bytes at an 8-aligned offset inside the
  // buffer, `ready` and `done` the same word.
  static absl::StatusOr<SyncWords> Resolve(
      const v1::StreamSync& sync,
      const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
          const std::string& id, const char* what)>& find);

  // Whether the ready word holds a value >= value().
  bool Ready() const;
  // Raises the done word to value() (leaves a larger value alone).
  void Release() const;
  uint64_t value() const { return value_; }
  // The ready word's current value (for error messages).
  uint64_t ReadyValue() const;

 private:
  SyncWords() = default;
  std::shared_ptr<SharedBuffer> ready_buf_, done_buf_;  // keep the words mapped
  uint64_t* ready_ = nullptr;
  uint64_t* done_ = nullptr;
  uint64_t value_ = 0;
};

// Lets an op that waits for its members' streams stop early: the mesh broke
// or the daemon is shutting down.
class OpCancel {
 public:
  // The first reason wins.
  void Cancel(absl::Status why);
  // OK while not cancelled.
  absl::Status status() const;
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> cancelled_{false};
  mutable Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
};

// One member's words and how to name the member in an error.
struct MemberSync {
  SyncWords words;
  std::string label;
};

// Waits until every member's ready word is there: spins (yielding) for the
// first 200 µs, then sleeps up to 1 ms between looks. OK; the cancel status;
// or, at `deadline`, DEADLINE_EXCEEDED naming each member whose stream did
// not reach the op, with its ready word and the value awaited (`what`
// prefixes the message, e.g. "mesh 'm': op 3 (psum f32[4] over (x))").
absl::Status AwaitStreams(const std::vector<MemberSync>& members, absl::Time deadline,
                          const OpCancel* cancel, const std::string& what);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_STREAM_SYNC_H_
