// FastPath: serves the shared-memory op queues of sessions (common/fast_queue.h).
//
// Each open queue has one thread that takes the session's SQ entries in
// order and submits them to the engine, exactly as the gRPC Execute stream
// does (same validation, same matching, same failures); completions are
// written into the CQ by whichever engine thread finishes the op. The thread
// spins for `spin` after its last entry, then sleeps on the queue's futex: an
// idle session costs no CPU. It spins only while a CPU is free for it (see
// SpinBudget): a member that runs its ops member-side polls for the other
// members on a CPU of its own, and a queue thread polling beside it would
// halve it (on 2 CPUs, a 2-member psum of 16 B took 0.7 us for the 200 us
// the queue threads polled after a daemon-path op, instead of 0.3).
//
// Thread model: Open/Close/Stop may be called from any thread (the side
// channel's loop in practice). A queue's thread never blocks on the client.
#ifndef COLLECTIVED_DAEMON_SERVER_FAST_PATH_H_
#define COLLECTIVED_DAEMON_SERVER_FAST_PATH_H_

#include <atomic>
#include <functional>
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

// How many threads may poll at once without taking a CPU that a polling
// member needs: the daemon's usable CPUs, less the members that poll for
// each other (Engine::member_side_sessions: the sessions that took a mesh's
// member-side segment; their members poll when their process has a CPU per
// member), less the threads polling now. Thread-safe.
class SpinBudget {
 public:
  // `polling_members` is asked at every TryStartSpin.
  SpinBudget(int cpus, std::function<int()> polling_members)
      : cpus_(cpus), polling_members_(std::move(polling_members)) {}
  // Whether the caller may poll now; if so it must call EndSpin once done.
  bool TryStartSpin();
  void EndSpin() { spinning_.fetch_sub(1); }
  int cpus() const { return cpus_; }

 private:
  const int cpus_;
  const std::function<int()> polling_members_;
  std::atomic<int> spinning_{0};
};

class FastPath {
 public:
  // `cpus`: the CPUs the daemon may use (0: its affinity mask's count).
  FastPath(Engine* engine, FastPathOptions options, int cpus = 0);
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
  // What the queue threads' polling is bounded by.
  SpinBudget& spin_budget() { return budget_; }

  class Queue;

 private:
  Engine* const engine_;
  const FastPathOptions options_;
  SpinBudget budget_;
  Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_FAST_PATH_H_
