// One op's shared state (OpState, behind OpFuture) and what its waiters
// drive (OpWaiter: the fast-path queue or the gRPC stream).
#ifndef COLLECTIVED_CLIENT_SRC_OP_STATE_H_
#define COLLECTIVED_CLIENT_SRC_OP_STATE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collectived/client.h"
#include "common/sync.h"

namespace collectived {

class OpState;

// What an op's waiter drives: the fast-path queue or the gRPC stream the op
// went out on. Wait returns true once `state` completed, false at
// `deadline` (InfinitePast: only what is there now, without blocking).
class OpWaiter {
 public:
  virtual ~OpWaiter() = default;
  virtual bool Wait(OpState* state, absl::Time deadline) = 0;
};

// Shared state of one op: written once (by the stream reader or the thread
// reaping the fast-path queue), read by futures.
class OpState {
 public:
  // `queue`: the fast-path queue or the gRPC stream the op was submitted
  // on (null: completed before it was sent). A waiter on it drives it.
  // `small`: a waiter may poll for it (fastq::kSpinOpBytes).
  OpState(absl::Duration default_wait, std::shared_ptr<OpWaiter> queue = nullptr,
          bool small = true)
      : default_wait_(default_wait), queue_(std::move(queue)), small_(small) {}
  bool small() const { return small_; }
  void Complete(absl::Status status, int64_t sequence, std::vector<int64_t> out_shape,
                DType out_dtype) {
    std::function<void()> on_failure;
    {
      MutexLock lock(&mu_);
      if (done_) return;
      done_ = true;
      on_failure = std::move(on_failure_);  // dropped, not run, on success
      if (status.ok()) on_failure = nullptr;
      status_ = std::move(status);
      sequence_ = sequence;
      out_shape_ = std::move(out_shape);
      out_dtype_ = out_dtype;
      done_flag_.store(true, std::memory_order_release);
    }
    if (on_failure) on_failure();
  }
  // Runs `f` once if the op fails (at once if it already has); never after
  // a success. `f` must not block.
  void OnFailure(std::function<void()> f) {
    {
      MutexLock lock(&mu_);
      if (!done_) {
        on_failure_ = std::move(f);
        return;
      }
      if (status_.ok()) return;
    }
    f();
  }
  absl::Status Wait(std::optional<absl::Duration> timeout);
  bool Ready() const { return done_flag_.load(std::memory_order_acquire); }
  // Ready(), after reaping the fast path's completions that arrived (nobody
  // reaps them unless a thread waits).
  bool Poll();
  absl::Duration default_wait() const { return default_wait_; }
  absl::Status status() {
    MutexLock lock(&mu_);
    return status_;
  }
  // Set by the fast path: before publishing (submitted_ns), and before
  // Complete (the rest).
  void SetTiming(const OpTiming& t) {
    MutexLock lock(&mu_);
    timing_ = t;
  }
  OpTiming timing() {
    MutexLock lock(&mu_);
    return timing_;
  }
  void SetTraffic(const OpTraffic& t) {
    MutexLock lock(&mu_);
    traffic_ = t;
  }
  OpTraffic traffic() {
    MutexLock lock(&mu_);
    return traffic_;
  }
  int64_t sequence() {
    MutexLock lock(&mu_);
    return sequence_;
  }
  std::vector<int64_t> out_shape() {
    MutexLock lock(&mu_);
    return out_shape_;
  }
  DType out_dtype() {
    MutexLock lock(&mu_);
    return out_dtype_;
  }

 private:
  const absl::Duration default_wait_;
  const std::shared_ptr<OpWaiter> queue_;
  const bool small_;
  std::atomic<bool> done_flag_{false};
  Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> out_shape_ ABSL_GUARDED_BY(mu_);
  DType out_dtype_ ABSL_GUARDED_BY(mu_) = DType::kInvalid;
  OpTiming timing_ ABSL_GUARDED_BY(mu_);
  OpTraffic traffic_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_OP_STATE_H_
