#!/usr/bin/env bash
# Builds collectived and runs every test: the normal build (unit,
# integration, conformance, Python gRPC and deployment checks), then the
# ASan/UBSan build, then the TSan build on the concurrency-sensitive tests.
#   scripts/test.sh            everything
#   scripts/test.sh --quick    the normal build only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
scripts/install-deps.sh
jobs="$(nproc)"
quick=0
[ "${1:-}" = "--quick" ] && quick=1

run_suite() {  # name build-dir ctest-args build-targets cmake-args...
  local name="$1" dir="$2" ctest_args="$3" targets="$4"
  shift 4
  echo "=== $name: configure and build ($dir)"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLLECTIVED_WERROR=ON "$@" >/dev/null
  # shellcheck disable=SC2086
  cmake --build "$dir" -j"$jobs" ${targets:+--target $targets}
  echo "=== $name: test"
  # shellcheck disable=SC2086
  (cd "$dir" && ctest --output-on-failure --no-tests=error -j"$jobs" $ctest_args)
}

run_suite "release" build "" ""
if [ "$quick" -eq 0 ]; then
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_suite "asan+ubsan" build-asan "-LE nosan" "" -DCOLLECTIVED_SANITIZE=address
  # TSan runs the in-process concurrency tests (engine, executor, thread pool,
  # timer): gRPC from Debian is not TSan-instrumented, so processes that use
  # it would report races TSan cannot see the synchronization of; for the
  # same reason tests/tsan.supp names absl::Status's uninstrumented refcount.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$here/tests/tsan.supp" \
    run_suite "tsan" build-tsan "-L unit" collectived_unit_tests -DCOLLECTIVED_SANITIZE=thread
  echo "=== libFuzzer: requests, side-socket packets, fast-path queues (${FUZZ_SECONDS:-20} s each)"
  scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
echo "=== all test suites passed"
