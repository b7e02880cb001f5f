// Waiting in tests for something that happens asynchronously, with a
// deadline (never a fixed sleep).
#ifndef COLLECTIVED_TESTS_HARNESS_EVENTUALLY_H_
#define COLLECTIVED_TESTS_HARNESS_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived::testing {

// Polls `cond` every `period` until it holds (true) or `patience` passes
// (false).
template <typename Cond>
bool Eventually(Cond cond, absl::Duration patience = absl::Seconds(10),
                absl::Duration period = absl::Milliseconds(5)) {
  const absl::Time deadline = absl::Now() + patience;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(period);
  }
  return true;
}

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_EVENTUALLY_H_
