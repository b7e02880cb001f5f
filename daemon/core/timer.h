// DeadlineTimer: runs callbacks at deadlines on one background thread.
//
// Thread-safety: Schedule and Cancel may be called from any thread, including
// from inside a callback. Callbacks run on the timer thread with no timer lock
// held; they must not block for long. A callback may still run after Cancel
// returns if it had already started, so callbacks re-check their state.
#ifndef COLLECTIVED_DAEMON_CORE_TIMER_H_
#define COLLECTIVED_DAEMON_CORE_TIMER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/sync.h"
#include "absl/time/time.h"

namespace collectived {

class DeadlineTimer {
 public:
  using TimerId = uint64_t;
  DeadlineTimer();
  // Stops the thread; callbacks not yet run are dropped.
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs `fn` once at `deadline` (at once if it has passed). Never returns 0.
  TimerId Schedule(absl::Time deadline, std::function<void()> fn);
  // Drops the callback if it has not started; no-op for unknown ids and 0.
  void Cancel(TimerId id);
  // Callbacks scheduled and not yet started (for tests and stats).
  size_t pending();
  // Stops the thread (waiting for a running callback); later callbacks are
  // dropped. Idempotent; the destructor calls it.
  void Stop();

 private:
  void Loop();

  Mutex mu_;
  // Signalled only when the thread must wake earlier than it planned: a
  // timer earlier than the one it sleeps for, or Stop.
  CondVar cv_;
  // When the sleeping thread wakes on its own; InfinitePast while it is awake
  // (it looks at the queue again before sleeping).
  absl::Time wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::multimap<absl::Time, std::pair<TimerId, std::function<void()>>> queue_
      ABSL_GUARDED_BY(mu_);
  std::map<TimerId, absl::Time> deadline_of_ ABSL_GUARDED_BY(mu_);
  TimerId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_TIMER_H_
