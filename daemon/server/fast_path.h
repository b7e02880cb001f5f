// FastPath: serves the shared-memory op queues of sessions (common/fast_queue.h).
//
// Each open queue has one thread that takes the session's SQ entries in
// order and submits them to the engine, exactly as the gRPC Execute stream
// does (same validation, same matching, same failures); completions are
// written into the CQ by whichever engine thread finishes the op. The thread
// spins for `spin` after its last entry, then sleeps on the queue's futex: an
// idle session costs no CPU.
//
// Thread model: Open/Close/Stop may be called from any thread (the side
// channel's loop in practice). A queue's thread never blocks on the client.
#ifndef COLLECTIVED_DAEMON_SERVER_FAST_PATH_H_
#define COLLECTIVED_DAEMON_SERVER_FAST_PATH_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/core/engine.h"

namespace collectived {

struct FastPathOptions {
  // How long a queue's thread polls for the next entry before sleeping.
  absl::Duration spin = absl::Microseconds(200);
};

class FastPath {
 public:
  FastPath(Engine* engine, FastPathOptions options) : engine_(engine), options_(options) {}
  ~FastPath() { Stop(); }
  FastPath(const FastPath&) = delete;
  FastPath& operator=(const FastPath&) = delete;

  // Creates `session_id`'s queue and starts serving it. Returns the queue's
  // descriptor (owned by FastPath: dup or send it, do not close it).
  // FAILED_PRECONDITION if the session already has one, UNAVAILABLE after
  // Stop, RESOURCE_EXHAUSTED if the memory cannot be had.
  absl::StatusOr<int> Open(const std::string& session_id);
  // The daemon's own mapping of the session's queue, or null. For in-process
  // tests: ThreadSanitizer cannot tell that two mappings of one memfd alias,
  // so a test that mapped the descriptor itself would see false races.
  void* MappedQueue(const std::string& session_id);
  // Stops serving the session's queue (its thread is joined; entries not
  // yet taken are never submitted). Completions of ops already submitted
  // are still written. No-op for sessions without a queue.
  void Close(const std::string& session_id);
  // Closes every queue and refuses new ones. Idempotent.
  void Stop();

  class Queue;

 private:
  Engine* const engine_;
  const FastPathOptions options_;
  Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_FAST_PATH_H_
