// A result an asynchronous API delivers through a callback, awaited by the
// test with a deadline (a callback that never runs fails the test instead
// of hanging it).
#ifndef COLLECTIVED_TESTS_HARNESS_CALLBACK_RESULT_H_
#define COLLECTIVED_TESTS_HARNESS_CALLBACK_RESULT_H_

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <utility>

#include "absl/time/time.h"
#include "common/sync.h"

namespace collectived {

template <typename T>
class CallbackResult {
 public:
  // The callback to hand the API; it must outlive every call of it.
  std::function<void(T)> Callback() {
    return [this](T v) {
      value_.emplace(std::move(v));
      done_.Notify();
    };
  }
  // The value, once the callback ran (within `timeout`).
  const T& Get(absl::Duration timeout = absl::Seconds(20)) {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(timeout)) << "callback never ran";
    return *value_;
  }
  bool Done() { return done_.HasBeenNotified(); }

 private:
  Notification done_;
  std::optional<T> value_;  // written before done_ is notified
};

}  // namespace collectived

#endif  // COLLECTIVED_TESTS_HARNESS_CALLBACK_RESULT_H_
