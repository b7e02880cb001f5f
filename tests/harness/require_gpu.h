// GPU tests without a usable GPU: skip saying why, or fail where a GPU is
// required. The GPU machine's check (scripts/gpu-check.sh) sets
// COLLECTIVED_REQUIRE_GPU=1 so that a GPU the tests cannot use fails them
// instead of skipping them silently.
//
//   if (!status.ok()) COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU(status.message());
//
// Like GTEST_SKIP and FAIL, the macro returns from the enclosing void
// function (a test body, SetUp, or a helper called through ASSERT_NO_FATAL_FAILURE).
// Header-only: it needs nothing but gtest.
#ifndef COLLECTIVED_TESTS_HARNESS_REQUIRE_GPU_H_
#define COLLECTIVED_TESTS_HARNESS_REQUIRE_GPU_H_

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace collectived::testing {

// Whether COLLECTIVED_REQUIRE_GPU=1 is set: GPU tests must then run.
inline bool GpuRequired() {
  const char* require = std::getenv("COLLECTIVED_REQUIRE_GPU");
  return require != nullptr && std::strcmp(require, "1") == 0;
}

}  // namespace collectived::testing

// Skips the test with "no GPU: <why>", or fails it with the same reason when
// COLLECTIVED_REQUIRE_GPU=1. `why` is anything a gtest message takes.
#define COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU(why)                                     \
  do {                                                                                \
    if (::collectived::testing::GpuRequired()) {                                      \
      FAIL() << "COLLECTIVED_REQUIRE_GPU=1 but no GPU is usable: " << why;            \
    }                                                                                 \
    GTEST_SKIP() << "no GPU: " << why;                                                \
  } while (0)

#endif  // COLLECTIVED_TESTS_HARNESS_REQUIRE_GPU_H_
