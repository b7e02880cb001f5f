// A fixed pool of worker threads for data-parallel loops.
//
// Thread-safety: every method may be called from any thread, concurrently.
// ParallelFor may be called from several threads at once; the calling thread
// takes part in its own loop, so a loop always makes progress even when every
// worker is busy with other loops.
#ifndef COLLECTIVED_EXEC_THREAD_POOL_H_
#define COLLECTIVED_EXEC_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/sync.h"

namespace collectived {

class ThreadPool {
 public:
  // Starts `threads` workers (>= 0; 0 runs every loop on the caller).
  explicit ThreadPool(int threads);
  // Joins the workers; queued work is finished first.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(i) for every i in [0, n) and returns when all have returned.
  // `fn` must not throw.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // Runs `fn` on a worker some time later (fire and forget).
  void Schedule(std::function<void()> fn);

  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();

  Mutex mu_;
  CondVar work_cv_;  // signalled once per queued item (and on stop)
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_THREAD_POOL_H_
