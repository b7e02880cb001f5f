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

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.lock();
    Own();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    const bool wake = waiters_ > 0;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
    if (wake) cv_.notify_all();
  }

  // Aborts the process unless the calling thread holds this mutex; to the
  // analysis, it holds it from here on. For a function that runs under a
  // lock its declaration cannot name (the lock of an object of a type that
  // is incomplete there).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
      std::fputs("collectived: a function that needs a lock held was called without it\n",
                 stderr);
      std::abort();
    }
  }

  // Blocks until cond() is true. cond is evaluated with the lock held, now
  // and after every Unlock by any thread.
  template <typename Cond>
  void Await(Cond cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++waiters_;
    for (bool first = true; !cond(); first = false) {
      if (first) WakeOtherWaiters();  // not again: a woken waiter changed nothing
      cv_.wait(mu_);
      Own();
    }
    --waiters_;
  }

  // Like Await, but gives up at `deadline`; returns cond().
  template <typename Cond>
  bool AwaitWithDeadline(Cond cond, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++waiters_;
    bool ok;
    for (bool first = true; !(ok = cond()); first = false) {
      if (absl::Now() >= deadline) break;
      if (first) WakeOtherWaiters();
      cv_.wait_until(mu_, absl::ToChronoTime(deadline));
      Own();
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
  // After taking mu_ (also when a wait took it back: the waits release and
  // take std::mutex itself).
  void Own() { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  // Before a wait first releases mu_ (as Unlock does, but without calling
  // it): the state the other Await-ers wait on may have changed while this
  // thread held the lock, so they look again (without this, two threads
  // that each change the state and then Await would both sleep until their
  // deadlines). `self`: 1 when the caller counts itself in waiters_.
  void WakeOtherWaiters(int self = 1) {
    if (waiters_ > self) cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable_any cv_;
  int waiters_ = 0;  // guarded by mu_
  // The thread holding mu_ (for AssertHeld), written by the holder only.
  std::atomic<std::thread::id> owner_{};
};

// A condition variable for Mutex, for waits that only a specific event should
// end: unlike Await, waiting here does not make every Unlock wake the waiter;
// only Signal/SignalAll do.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    mu->WakeOtherWaiters(0);
    cv_.wait(mu->mu_);
    mu->Own();
  }
  // Returns false if `deadline` passed (spurious returns are possible).
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    mu->WakeOtherWaiters(0);
    if (deadline == absl::InfiniteFuture()) {
      cv_.wait(mu->mu_);
      mu->Own();
      return true;
    }
    const bool signalled =
        cv_.wait_until(mu->mu_, absl::ToChronoTime(deadline)) == std::cv_status::no_timeout;
    mu->Own();
    return signalled;
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
