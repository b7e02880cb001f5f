// Mutex::AssertHeld: it passes for the thread holding the mutex, also after
// a wait gave the mutex to other threads and took it back, and aborts the
// process for any other thread. And a wait wakes the other Await-ers.
#include "common/sync.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"

namespace collectived {
namespace {

TEST(MutexTest, AssertHeldPassesForTheHolder) {
  Mutex mu;
  MutexLock lock(&mu);
  mu.AssertHeld();
}

TEST(MutexDeathTest, AssertHeldAbortsWhenNobodyHoldsIt) {
  Mutex mu;
  {
    MutexLock lock(&mu);
  }
  EXPECT_DEATH(mu.AssertHeld(), "needs a lock held was called without it");
}

// Another thread holds `mu` while this one asserts that it does.
void AssertWhileAnotherThreadHoldsIt() {
  Mutex mu;
  Notification held;
  Notification done;
  std::thread holder([&] {
    MutexLock lock(&mu);
    held.Notify();
    done.WaitForNotificationWithTimeout(absl::Seconds(30));
  });
  held.WaitForNotificationWithTimeout(absl::Seconds(30));
  mu.AssertHeld();  // aborts here, the holder still waiting
  done.Notify();
  holder.join();
}

TEST(MutexDeathTest, AssertHeldAbortsWhenAnotherThreadHoldsIt) {
  EXPECT_DEATH(AssertWhileAnotherThreadHoldsIt(), "needs a lock held was called without it");
}

// Two threads that hand a turn to each other by Await alone, never
// unlocking in between: each changes the state and then waits, and that
// wait must wake the other as an Unlock would (else both sleep for ever).
TEST(MutexTest, AWaitWakesTheOtherAwaitersAsAnUnlockWould) {
  struct State {
    Mutex mu;
    int turn = 0;  // under mu
    Notification done[2];
  };
  auto state = std::make_shared<State>();
  constexpr int kRounds = 1000;
  auto player = [state](int me) {
    MutexLock lock(&state->mu);
    for (int i = 0; i < kRounds; ++i) {
      state->mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state->turn == me; });
      state->turn = 1 - me;
    }
    state->done[me].Notify();
  };
  std::thread a(player, 0), b(player, 1);
  const bool finished = state->done[0].WaitForNotificationWithTimeout(absl::Seconds(60)) &&
                        state->done[1].WaitForNotificationWithTimeout(absl::Seconds(60));
  if (!finished) {
    // Deadlocked: the threads keep `state` alive; they are left behind.
    a.detach();
    b.detach();
    FAIL() << "the two Await-ers deadlocked";
  }
  a.join();
  b.join();
}

// The waits hand the std::mutex to other threads and take it back without
// Lock: the holder is recorded again when they return.
TEST(MutexTest, TheWaiterHoldsItAgainAfterEveryKindOfWait) {
  Mutex mu;
  CondVar cv;
  int step = 0;  // under mu: the main thread makes it odd, the other even
  std::thread other([&] {
    for (int want : {1, 3, 5}) {
      MutexLock lock(&mu);  // recorded as the holder in between
      EXPECT_TRUE(mu.AwaitWithTimeout(
          [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return step == want; }, absl::Seconds(10)))
          << "step " << want;
      ++step;
      cv.SignalAll();
    }
  });
  absl::Cleanup join = [&] { other.join(); };  // also when an ASSERT returns
  {
    MutexLock lock(&mu);
    step = 1;
    ASSERT_TRUE(mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return step == 2; },
                                    absl::Seconds(10)));
    mu.AssertHeld();
    step = 3;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (step != 4 && absl::Now() < deadline) cv.WaitWithDeadline(&mu, deadline);
    ASSERT_EQ(step, 4);
    mu.AssertHeld();
    step = 5;
    mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return step == 6; });
    mu.AssertHeld();
  }
}

}  // namespace
}  // namespace collectived
