// Stream-ordered submission, the daemon's side (StreamOrder, the wire's
// StreamSync): an op waits until each member's `ready` word reaches the op's
// value, and the daemon raises each member's `done` word to it once the op
// is over.
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
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plan/op_request.h"
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
      const StreamOrder& sync,
      const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
          const std::string& id, const char* what)>& find);

  // For a `sync` that Resolve refused: raises its done word to its value if
  // that word alone is valid (so that the client's stream is released even
  // when only the ready word was wrong).
  static void ReleaseDoneIfValid(
      const StreamOrder& sync,
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

// Watches the ready words of ops that wait for their members' streams, all
// on one thread of its own, so that a waiting op holds no runner thread (an
// op may wait for a stream that first needs another op to run).
//
// Thread-safety: Add may be called from any thread; callbacks run on the
// waiter's thread, one at a time, with no lock of the waiter held.
class StreamWaiter {
 public:
  StreamWaiter();
  // Stops the thread, then fails the ops still waiting (their cancel
  // status, else UNAVAILABLE), on the calling thread.
  ~StreamWaiter();
  StreamWaiter(const StreamWaiter&) = delete;
  StreamWaiter& operator=(const StreamWaiter&) = delete;

  // Calls `done` once: OK when every member's ready word is there; the
  // cancel status once `cancel` (may be null) is cancelled; or, at
  // `deadline`, DEADLINE_EXCEEDED naming each member whose stream did not
  // reach the op, with its ready word and the value awaited (`what`
  // prefixes the message, e.g. "mesh 'm': op 3 (psum f32[4] over (i))").
  // Looks at the words continuously for 200 µs after an op arrives, then at
  // most 1 ms apart.
  void Add(std::vector<MemberSync> members, absl::Time deadline,
           std::shared_ptr<const OpCancel> cancel, std::string what,
           std::function<void(absl::Status)> done);

 private:
  struct Entry {
    std::vector<MemberSync> members;
    absl::Time deadline;
    std::shared_ptr<const OpCancel> cancel;
    std::string what;
    std::function<void(absl::Status)> done;
  };
  void Loop();

  Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::Time last_add_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Whether every member's ready word is there now.
bool StreamsReady(const std::vector<MemberSync>& members);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_STREAM_SYNC_H_
