#include "daemon/core/timer.h"

namespace collectived {

DeadlineTimer::DeadlineTimer() : thread_([this] { Loop(); }) {}

DeadlineTimer::~DeadlineTimer() { Stop(); }

void DeadlineTimer::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

DeadlineTimer::TimerId DeadlineTimer::Schedule(absl::Time deadline,
                                               std::function<void()> fn) {
  MutexLock lock(&mu_);
  TimerId id = next_id_++;
  queue_.emplace(deadline, std::make_pair(id, std::move(fn)));
  deadline_of_[id] = deadline;
  // Most deadlines are later than the one the thread sleeps for (ops are
  // scheduled in order with equal timeouts): no wake-up then.
  if (deadline < wake_at_) cv_.Signal();
  return id;
}

void DeadlineTimer::Cancel(TimerId id) {
  MutexLock lock(&mu_);
  auto it = deadline_of_.find(id);
  if (it == deadline_of_.end()) return;
  auto [begin, end] = queue_.equal_range(it->second);
  for (auto q = begin; q != end; ++q) {
    if (q->second.first == id) {
      queue_.erase(q);
      break;
    }
  }
  deadline_of_.erase(it);
}

size_t DeadlineTimer::pending() {
  MutexLock lock(&mu_);
  return queue_.size();
}

void DeadlineTimer::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    if (stopping_) return;
    const absl::Time next = queue_.empty() ? absl::InfiniteFuture() : queue_.begin()->first;
    if (absl::Now() < next) {
      // Cancelled timers stay the wake-up time: waking once for nothing is
      // cheaper than waking on every Cancel.
      wake_at_ = next;
      cv_.WaitWithDeadline(&mu_, next);
      wake_at_ = absl::InfinitePast();
      continue;
    }
    auto it = queue_.begin();
    std::function<void()> fn = std::move(it->second.second);
    deadline_of_.erase(it->second.first);
    queue_.erase(it);
    mu_.Unlock();
    fn();
    mu_.Lock();
  }
}

}  // namespace collectived
