#include "exec/thread_pool.h"

#include <atomic>
#include <memory>

namespace collectived {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
  work_cv_.Signal();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> fn;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || workers_.empty()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Shared loop state: helpers claim indices from `next`; whoever finishes the
  // last index wakes the caller. Helpers that start after the loop is done see
  // next >= n and return at once, so the state must outlive the call.
  struct Loop {
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    Mutex mu;
    bool finished = false;
  };
  auto loop = std::make_shared<Loop>();
  auto run = [loop, n, &fn] {
    for (;;) {
      size_t i = loop->next.fetch_add(1);
      if (i >= n) return;
      fn(i);
      if (loop->done.fetch_add(1) + 1 == n) {
        MutexLock lock(&loop->mu);
        loop->finished = true;
      }
    }
  };
  size_t helpers = std::min(n - 1, workers_.size());
  {
    MutexLock lock(&mu_);
    for (size_t h = 0; h < helpers; ++h) {
      queue_.push_back(run);
      work_cv_.Signal();
    }
  }
  run();
  MutexLock lock(&loop->mu);
  loop->mu.Await([&loop]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return loop->finished; });
}

}  // namespace collectived
