#include "daemon/core/timer.h"

namespace collectived {

DeadlineTimer::DeadlineTimer() : thread_([this] { Loop(); }) {}

DeadlineTimer::~DeadlineTimer() { Stop(); }

void DeadlineTimer::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

DeadlineTimer::TimerId DeadlineTimer::Schedule(absl::Time deadline,
                                               std::function<void()> fn) {
  MutexLock lock(&mu_);
  TimerId id = next_id_++;
  queue_.emplace(deadline, std::make_pair(id, std::move(fn)));
  deadline_of_[id] = deadline;
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

void DeadlineTimer::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    if (stopping_) return;
    if (queue_.empty()) {
      mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !queue_.empty();
      });
      continue;
    }
    absl::Time next = queue_.begin()->first;
    if (absl::Now() < next) {
      // Wake at the deadline, or earlier when an earlier timer or stop arrives.
      mu_.AwaitWithDeadline(
          [this, next]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return stopping_ || (!queue_.empty() && queue_.begin()->first < next);
          },
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
