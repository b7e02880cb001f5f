#!/usr/bin/env bash
# Builds collectived and runs every test: the normal build (unit,
# integration, conformance, Python gRPC and deployment checks), then the
# ASan/UBSan build, then the TSan build on the concurrency-sensitive tests.
# Both variants are built without a build of their own: the normal build is
# COLLECTIVED_WITH_CUDA=AUTO (the CUDA variant where the CUDA toolkit and NCCL
# are installed; its GPU tests skip themselves without a GPU), the sanitizer
# builds are the non-CUDA variant (-DCOLLECTIVED_WITH_CUDA=OFF).
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
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLLECTIVED_WERROR=ON "$@" >"$dir/configure.log" \
    || { cat "$dir/configure.log"; return 1; }
  # Which variant this is, as the configure step decided it: "CUDA variant"
  # or "non-CUDA variant", and why.
  local decision
  decision="$(grep -o 'GPU buffers .*' "$dir/configure.log" || true)"
  case "$decision" in
    "GPU buffers ON"*) echo "=== $name: CUDA variant; $decision" ;;
    *) echo "=== $name: non-CUDA variant; $decision" ;;
  esac
  # shellcheck disable=SC2086
  cmake --build "$dir" -j"$jobs" ${targets:+--target $targets}
  echo "=== $name: test"
  # shellcheck disable=SC2086
  (cd "$dir" && ctest --output-on-failure --no-tests=error -j"$jobs" $ctest_args)
}

run_suite "release" build "" "" -DCOLLECTIVED_WITH_CUDA=AUTO
# The sanitizer builds compile at -O1 with line tables only (-g1), as the
# sanitizers' own docs advise: their reports keep file:line stacks, and the
# build takes half the time of -O2 -g (host_mesh_test.cc: 99 s -> 44 s).
sanitizer_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
                 -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
if [ "$quick" -eq 0 ]; then
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_suite "asan+ubsan" build-asan "-LE nosan" "" -DCOLLECTIVED_SANITIZE=address -DCOLLECTIVED_WITH_CUDA=OFF \
      -DCOLLECTIVED_BUILD_BENCH=OFF "${sanitizer_flags[@]}"
  # TSan runs the in-process concurrency tests (engine, executor, thread pool,
  # timer, the host mesh and its transport with hosts as threads): gRPC from Debian is not
  # TSan-instrumented, so processes that use it would report races TSan
  # cannot see the synchronization of; for the same reason tests/tsan.supp
  # names absl::Status's uninstrumented refcount.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$here/tests/tsan.supp" \
    run_suite "tsan" build-tsan "-L unit" collectived_in_process_tests -DCOLLECTIVED_SANITIZE=thread \
      -DCOLLECTIVED_WITH_CUDA=OFF -DCOLLECTIVED_BUILD_BENCH=OFF "${sanitizer_flags[@]}"
  echo "=== libFuzzer: requests, side-socket packets, fast-path queues (${FUZZ_SECONDS:-20} s each)"
  scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
echo "=== all test suites passed"
