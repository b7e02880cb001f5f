#include "daemon/core/timer.h"

namespace collectived {

DeadlineTimer::DeadlineTimer() : thread_([this] { Loop(); }) {}

DeadlineTimer::~DeadlineTimer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

DeadlineTimer::TimerId DeadlineTimer::Schedule(absl::Time deadline,
                                               std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  TimerId id = next_id_++;
  queue_.emplace(deadline, std::make_pair(id, std::move(fn)));
  deadline_of_[id] = deadline;
  return id;
}

void DeadlineTimer::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
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

void DeadlineTimer::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (stopping_) return;
    if (queue_.empty()) {
      mu_.Await(absl::Condition(
          +[](DeadlineTimer* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
            return t->stopping_ || !t->queue_.empty();
          },
          this));
      continue;
    }
    absl::Time next = queue_.begin()->first;
    if (absl::Now() < next) {
      // Wake at the deadline, or earlier when an earlier timer or stop arrives.
      std::pair<DeadlineTimer*, absl::Time> arg(this, next);
      mu_.AwaitWithDeadline(
          absl::Condition(
              +[](std::pair<DeadlineTimer*, absl::Time>* arg)
                  ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    DeadlineTimer* t = arg->first;
                    return t->stopping_ ||
                           (!t->queue_.empty() && t->queue_.begin()->first < arg->second);
                  },
              &arg),
          next);
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
