// Mutex, MutexLock, CondVar and Notification on top of the C++ standard library.
//
// Same shape as absl::Mutex (Lock/Unlock, Await on a condition re-checked on
// every unlock, thread-safety annotations), but built on std::mutex so that
// ThreadSanitizer sees every synchronization: the distribution's Abseil is not
// instrumented, so TSan cannot see absl::Mutex and would report false races.
//
// Thread-safety: these are the synchronization primitives themselves.
#ifndef COLLECTIVED_COMMON_SYNC_H_
#define COLLECTIVED_COMMON_SYNC_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    const bool wake = waiters_ > 0;
    mu_.unlock();
    if (wake) cv_.notify_all();
  }

  // Blocks until cond() is true. cond is evaluated with the lock held, now
  // and after every Unlock by any thread.
  template <typename Cond>
  void Await(Cond cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++waiters_;
    while (!cond()) cv_.wait(mu_);
    --waiters_;
  }

  // Like Await, but gives up at `deadline`; returns cond().
  template <typename Cond>
  bool AwaitWithDeadline(Cond cond, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++waiters_;
    bool ok;
    while (!(ok = cond())) {
      if (absl::Now() >= deadline) break;
      cv_.wait_until(mu_, absl::ToChronoTime(deadline));
    }
    --waiters_;
    return ok;
  }
  template <typename Cond>
  bool AwaitWithTimeout(Cond cond, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return AwaitWithDeadline(cond, timeout == absl::InfiniteDuration()
                                       ? absl::InfiniteFuture()
                                       : absl::Now() + timeout);
  }

 private:
  friend class CondVar;
  std::mutex mu_;
  std::condition_variable_any cv_;
  int waiters_ = 0;  // guarded by mu_
};

// A condition variable for Mutex, for waits that only a specific event should
// end: unlike Await, waiting here does not make every Unlock wake the waiter;
// only Signal/SignalAll do.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { cv_.wait(mu->mu_); }
  // Returns false if `deadline` passed (spurious returns are possible).
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline == absl::InfiniteFuture()) {
      cv_.wait(mu->mu_);
      return true;
    }
    return cv_.wait_until(mu->mu_, absl::ToChronoTime(deadline)) == std::cv_status::no_timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A one-shot event.
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
  }
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  // True if notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return notified_; },
                                timeout);
  }

 private:
  Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_SYNC_H_
