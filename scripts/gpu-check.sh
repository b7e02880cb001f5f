#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds the CUDA variant's GPU tests, the
# daemon and the SDK, runs every test labelled gpu with
# COLLECTIVED_REQUIRE_GPU=1 (so a GPU the tests cannot use fails them instead
# of skipping them), and summarizes.
#
#   scripts/gpu-check.sh [OUTDIR]        (default gpu-check-out)
#
# OUTDIR gets ctest's JUnit XML (junit.xml), the build and test logs,
# summary.json (passed / failed / skipped per test binary) and bench/ (the GPU
# benchmark rows of bench/gpu_bench.sh, run after the tests in the time left)
# and grpc_ratio.txt (bench/grpc_ratio.sh, if time is left after them), and
# python.log (part of the Python SDK's suite, where the build or the bundle
# has the SDK for this machine's python3) and jax_gpu_perf.txt (what a jitted
# psum adds to a step on the GPU, before the other benchmarks). Exit status: 0
# when the build succeeded and no test failed; 1 when a test failed; 2 when
# the build (or its prerequisites) failed.
#
# Needs no network: it installs nothing (scripts/install-deps.sh is for
# machines that have one); it says what is missing instead.
#
# Environment:
#   GPU_CHECK_BUILD_DIR   build directory (default build-gpu)
#   GPU_CHECK_CUDA_ARCHS  CMAKE_CUDA_ARCHITECTURES (default: native when
#                         CMake and a GPU allow it, else 90)
#   GPU_CHECK_JOBS        build and test parallelism (default: nproc)
#   GPU_CHECK_CMAKE_ARGS  more configure arguments (split on spaces)
#   GPU_CHECK_BUNDLE      run the binaries of this bundle (scripts/gpu-bundle.sh)
#                         instead of building: for a GPU machine without the
#                         development packages (it still needs ctest and xz).
#                         It must be of this checkout's commit (with --dirty)
#                         unless GPU_CHECK_ALLOW_OTHER_COMMIT=1
#   GPU_CHECK_DEADLINE_S  seconds from the start by which every test must
#                         have ended (default 380: the benchmarks get what
#                         is left of 470 s, so the whole check stays under 8
#                         minutes; tests still running then fail as timed out)
#   GPU_CHECK_TOTAL_S     seconds from the start by which the benchmarks must
#                         have ended too (default 470)
#   GPU_CHECK_BENCH       0: no benchmarks, the tests only (default 1)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here" || exit 2

out="${1:-gpu-check-out}"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
build="${GPU_CHECK_BUILD_DIR:-build-gpu}"
jobs="${GPU_CHECK_JOBS:-$(nproc)}"
start=$SECONDS
rm -f "$out/junit.xml" "$out/summary.json" "$out/tests.json"

# What the GPU tests need built: the test binaries and their helpers, plus
# the daemon and the SDK.
# shellcheck source=scripts/gpu-targets.sh
. "$here/scripts/gpu-targets.sh"
targets=("${gpu_targets[@]}")
# Checks that cannot run here: what they need is missing on this machine.
not_run=(
  "members on different GPUs (NCCL): needs two GPUs; the cases skip on one"
)

gpus=""
build_state="not started"
missing=()

# summary.json from what is known so far ($1: the exit status).
write_summary() {
  local status="$1"
  if ! command -v python3 >/dev/null 2>&1; then
    # No python3: the essentials, without per-binary counts.
    echo "python3 not found: no per-binary summary; see $out/ctest.log"
    printf '{"build": "%s", "exit_code": %s, "binaries": {}, "not_run": [%s]}\n' \
      "$build_state" "$status" \
      '"members on different GPUs (NCCL): needs two GPUs"' \
      >"$out/summary.json"
    return
  fi
  python3 - "$out" "$status" "$build_state" "$gpus" "${missing[@]+"${missing[@]}"}" <<'EOF'
import json, os, sys
import xml.etree.ElementTree as ET

out, status, build_state, gpus = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
missing = sys.argv[5:]
not_run = [
    "members on different GPUs (NCCL): needs two GPUs",
]

# Test name -> binary, from `ctest --show-only=json-v1`.
binary_of = {}
try:
    with open(os.path.join(out, "tests.json")) as f:
        for t in json.load(f).get("tests", []):
            cmd = t.get("command") or []
            binary_of[t["name"]] = os.path.basename(cmd[0]) if cmd else "?"
except (OSError, ValueError):
    pass

binaries, failed_tests = {}, []
junit = os.path.join(out, "junit.xml")
if os.path.exists(junit):
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "?")
        status_attr = case.get("status")
        skipped = case.find("skipped")
        if status_attr == "disabled" or (
                skipped is not None and
                skipped.get("message") == "SKIP_REGULAR_EXPRESSION_MATCHED"):
            result = "skipped"  # the test skipped itself (GTEST_SKIP)
        elif status_attr == "run" and case.find("failure") is None and \
                case.find("error") is None:
            result = "passed"
        else:
            result = "failed"  # failed, or could not run (ctest counts it failed)
            failed_tests.append(name)
        counts = binaries.setdefault(binary_of.get(name, "?"),
                                     {"passed": 0, "failed": 0, "skipped": 0})
        counts[result] += 1

totals = {k: sum(c[k] for c in binaries.values()) for k in ("passed", "failed", "skipped")}
summary = {
    "gpus": [l for l in gpus.splitlines() if l.strip()],
    "build": build_state,
    "missing": missing,
    "binaries": binaries,
    "totals": totals,
    "failed_tests": failed_tests,
    "not_run": not_run,
    "exit_code": status,
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")

print()
print("== summary ==")
print("GPUs:", ", ".join(summary["gpus"]) or "none")
print("build:", build_state)
for m in missing:
    print("missing:", m)
if binaries:
    width = max(len(b) for b in binaries)
    print(f"{'test binary':<{width}}  passed  failed  skipped")
    for b in sorted(binaries):
        c = binaries[b]
        print(f"{b:<{width}}  {c['passed']:>6}  {c['failed']:>6}  {c['skipped']:>7}")
    print(f"{'total':<{width}}  {totals['passed']:>6}  {totals['failed']:>6}  {totals['skipped']:>7}")
elif build_state == "ok":
    print("no test results (see ctest.log)")
for t in failed_tests:
    print("FAILED:", t)
print("summary:", os.path.join(out, "summary.json"))
EOF
}

finish() {
  local status="$1"
  write_summary "$status"
  echo "not run (what they need is not here):"
  printf '  %s\n' "${not_run[@]}"
  echo "gpu-check: exit $status after $((SECONDS - start)) s"
  exit "$status"
}

echo "== GPUs =="
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "none: nvidia-smi not found (no NVIDIA driver here?)"
elif listed="$(nvidia-smi -L 2>&1)" && [ -n "$listed" ]; then
  gpus="$listed"
  echo "$gpus"
else
  echo "none: nvidia-smi -L failed: ${listed:-(no output)}"
fi

# A bundle from scripts/gpu-bundle.sh: binaries built elsewhere, put back
# at the paths they were built at, with the shared libraries they bring.
use_bundle() {
  local bundle="$GPU_CHECK_BUNDLE" manifest source_dir build_dir libs nccl_dir f
  echo "== bundle ($bundle) =="
  [[ "$bundle" = /* ]] || bundle="$here/$bundle"
  if [ ! -f "$bundle" ]; then
    missing+=("the bundle $bundle (GPU_CHECK_BUNDLE; made by scripts/gpu-bundle.sh)")
  fi
  command -v ctest >/dev/null 2>&1 || missing+=("ctest (CMake)")
  command -v xz >/dev/null 2>&1 || missing+=("xz")
  if ((${#missing[@]})); then
    for m in "${missing[@]}"; do echo "missing: $m"; done
    build_state="missing prerequisites"
    finish 2
  fi
  manifest="$(tar -xJOf "$bundle" MANIFEST)" || { build_state="unreadable bundle"; finish 2; }
  echo "$manifest"
  source_dir="$(sed -n 's/^source_dir=//p' <<<"$manifest")"
  build_dir="$(sed -n 's/^build_dir=//p' <<<"$manifest")"
  # The tests read their data from this checkout: it must be what the
  # binaries were built from.
  local built here_rev
  built="$(sed -n 's/^commit=//p' <<<"$manifest")"
  here_rev="$(git -C "$here" describe --always --dirty --abbrev=40 2>/dev/null || true)"
  if [ -z "$here_rev" ]; then
    echo "note: cannot tell this checkout's commit (no git); the bundle is of $built"
  elif [ "$built" != "$here_rev" ]; then
    echo "the bundle was built from $built, this checkout is $here_rev"
    if [ "${GPU_CHECK_ALLOW_OTHER_COMMIT:-0}" != 1 ]; then
      echo "(GPU_CHECK_ALLOW_OTHER_COMMIT=1 runs it anyway)"
      build_state="bundle of another commit"
      finish 2
    fi
  fi
  # The binaries name their helpers and the test data by the paths they
  # were built at: make the source directory's path lead here.
  if [ "$source_dir" != "$here" ] && ! [ "$source_dir" -ef "$here" ]; then
    if [ -e "$source_dir" ] || [ -L "$source_dir" ]; then
      echo "the bundle was built in $source_dir, which exists here and is not this checkout"
      build_state="bundle path taken"
      finish 2
    fi
    mkdir -p "$(dirname "$source_dir")" && ln -s "$here" "$source_dir" ||
      { build_state="cannot link $source_dir"; finish 2; }
    echo "linked $source_dir -> $here"
  fi
  build="$build_dir"
  bundle_python="$(sed -n 's/^python=//p' <<<"$manifest")"
  mkdir -p "$build/.bundle" &&
    tar -xJf "$bundle" -C "$build" --strip-components=1 build &&
    tar -xJf "$bundle" -C "$build/.bundle" lib fallback ||
    { build_state="bundle unpack failed"; finish 2; }
  libs="$build/.bundle/lib"
  # The C++ runtime built against, where the machine's is older.
  f="$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/{print $NF; exit}')"
  if [ -z "$f" ] || ! grep -q GLIBCXX_3.4.30 "$f" 2>/dev/null; then
    libs="$libs:$build/.bundle/fallback"
    echo "using the bundle's C++ runtime (the machine's: ${f:-none})"
  fi
  # NCCL: the machine's own (a system package, CUDA's folder, or the Python
  # wheel next to PyTorch or JAX).
  nccl_dir=""
  for f in $(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF}') \
           /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/targets/*/lib/libnccl.so.2; do
    [ -e "$f" ] && { nccl_dir="$(dirname "$f")"; break; }
  done
  if [ -z "$nccl_dir" ] && command -v python3 >/dev/null 2>&1; then
    nccl_dir="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
  fi
  if [ -z "$nccl_dir" ]; then
    f="$(find /usr /opt -name 'libnccl.so.2*' -type f 2>/dev/null | head -n 1)"
    [ -n "$f" ] && nccl_dir="$(dirname "$f")"
  fi
  [ -n "$nccl_dir" ] && libs="$libs:$nccl_dir"
  [ -d /usr/local/nvidia/lib64 ] && libs="$libs:/usr/local/nvidia/lib64"
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "NCCL from: ${nccl_dir:-not found}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local deps
  while IFS= read -r -d '' f; do
    deps="$(ldd "$f" 2>&1 || true)"
    if grep -q 'not found' <<<"$deps"; then
      missing+=("libraries of $(basename "$f"): $(awk '/not found/{print $1}' <<<"$deps" | tr '\n' ' ')")
    fi
  done < <(find "$build" -path "$build/.bundle" -prune -o -type f -perm -u+x -print0)
  if ((${#missing[@]})); then
    for m in "${missing[@]}"; do echo "missing: $m"; done
    build_state="missing libraries"
    finish 2
  fi
  build_state="ok"
  export GPU_BENCH_PREBUILT=1
}

if [ -n "${GPU_CHECK_BUNDLE:-}" ]; then
  use_bundle
else
  echo "== prerequisites =="
  have() { command -v "$1" >/dev/null 2>&1; }
  # A file matching one of the globs exists.
  exists() {
    local g f
    for g in "$@"; do
      for f in $g; do [ -e "$f" ] && return 0; done
    done
    return 1
  }
  have cmake || missing+=("cmake (Debian: cmake)")
  have g++ || have c++ || missing+=("a C++ compiler (Debian: g++)")
  if ! have grpc_cpp_plugin ||
     ! exists /usr/lib/*/cmake/grpc/gRPCConfig.cmake /usr/lib/cmake/grpc/gRPCConfig.cmake \
              /usr/local/lib*/cmake/grpc/gRPCConfig.cmake /opt/*/lib*/cmake/grpc/gRPCConfig.cmake; then
    missing+=("gRPC C++ (grpc_cpp_plugin and gRPCConfig.cmake; Debian: libgrpc++-dev protobuf-compiler-grpc)")
  fi
  have protoc || missing+=("protoc (Debian: protobuf-compiler, libprotobuf-dev)")
  exists /usr/lib/*/cmake/absl/abslConfig.cmake /usr/local/lib*/cmake/absl/abslConfig.cmake ||
    missing+=("Abseil (abslConfig.cmake; Debian: libabsl-dev)")
  exists /usr/include/gtest/gtest.h /usr/local/include/gtest/gtest.h ||
    missing+=("GoogleTest (Debian: libgtest-dev libgmock-dev)")
  nvcc="$(command -v nvcc || true)"
  [ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; }
  [ -n "$nvcc" ] || missing+=("the CUDA toolkit (nvcc not on PATH nor in /usr/local/cuda/bin)")
  exists "${NCCL_ROOT:-/nonexistent}/include/nccl.h" /usr/include/nccl.h /usr/local/cuda/include/nccl.h \
         /usr/local/cuda/targets/*/include/nccl.h /usr/local/include/nccl.h ||
    missing+=("NCCL (nccl.h; set NCCL_ROOT, or Debian/NVIDIA: libnccl-dev)")
  if ((${#missing[@]})); then
    for m in "${missing[@]}"; do echo "missing: $m"; done
    echo "cannot build the CUDA variant here; nothing was installed (this script needs no network:"
    echo "install those, e.g. with scripts/install-deps.sh where there is a network)"
    build_state="missing prerequisites"
    finish 2
  fi
  echo "cmake, C++ compiler, gRPC, protoc, Abseil, GoogleTest, nvcc ($nvcc), NCCL: found"

  echo "== build ($build) =="
  archs="${GPU_CHECK_CUDA_ARCHS:-}"
  if [ -z "$archs" ]; then
    # "native" (CMake 3.24+) asks the GPU; without one it cannot work.
    cmake_version="$(cmake --version | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')"
    if [ -n "$gpus" ] && printf '%s\n3.24\n' "$cmake_version" | sort -V -C -r 2>/dev/null; then
      archs=native
    else
      archs=90
    fi
  fi
  [ -n "$nvcc" ] && export CUDACXX="${CUDACXX:-$nvcc}"
  launcher=()
  if have ccache; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # shellcheck disable=SC2206
  extra=(${GPU_CHECK_CMAKE_ARGS:-})
  configure() {
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLLECTIVED_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$1" "${launcher[@]+"${launcher[@]}"}" \
      "${extra[@]+"${extra[@]}"}" >"$out/configure.log" 2>&1
  }
  echo "CUDA architectures: $archs"
  if ! configure "$archs"; then
    if [ "$archs" = native ]; then
      echo "configuring with native failed (see below); again with 90"
      tail -n 5 "$out/configure.log"
      rm -f "$build/CMakeCache.txt"
      rm -rf "$build/CMakeFiles"
      archs=90
      configure "$archs" || { tail -n 30 "$out/configure.log"; build_state="configure failed"; finish 2; }
    else
      tail -n 30 "$out/configure.log"
      build_state="configure failed"
      finish 2
    fi
  fi
  grep -E 'GPU buffers|CUDA' "$out/configure.log" | head -n 5
  # The Python SDK too, where the build has it (its checks run after the tests).
  grep -q '^COLLECTIVED_HAVE_PYTHON:INTERNAL=ON' "$build/CMakeCache.txt" && targets+=(collectived_python)
  if ! cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1; then
    grep -E 'error|Error' "$out/build.log" | head -n 30
    tail -n 10 "$out/build.log"
    build_state="build failed"
    finish 2
  fi
  build_state="ok"
  echo "built ${targets[*]} in $((SECONDS - start)) s"
fi

echo "== ctest -L gpu (COLLECTIVED_REQUIRE_GPU=1) =="
(cd "$build" && ctest -L gpu --show-only=json-v1 >"$out/tests.json" 2>/dev/null)
# Tests that read the device's free memory are RUN_SERIAL: the others may
# run side by side. Whatever the build left, at least a minute for them.
left=$(( ${GPU_CHECK_DEADLINE_S:-380} - (SECONDS - start) ))
((left >= 60)) || left=60
stop_at="$(date -d "+$left seconds" +%H:%M:%S)"
echo "tests must end by $stop_at ($left s from now)"
(cd "$build" && COLLECTIVED_REQUIRE_GPU=1 ctest -L gpu --no-tests=error -j"$jobs" \
   --stop-time "$stop_at" --output-on-failure --output-junit "$out/junit.xml" \
   >"$out/ctest.log" 2>&1)
ctest_status=$?
grep -E '^[0-9]+% tests passed|tests failed out of|^Total Test time' "$out/ctest.log"

# The Python SDK of this build or bundle (scripts/gpu-bundle.sh packs it,
# built for the GPU machine's Python version), with this machine's python3,
# numpy and JAX: its GPU tests (client/python/tests/test_gpu.py: GPU arrays
# viewed by torch, cupy and JAX without a copy, ops on them between processes;
# with COLLECTIVED_REQUIRE_GPU=1, so they fail rather than skip) and part of
# the rest of its suite (the SDK's ops against this build's daemon,
# collectived.jax inside jit). A failure counts as a failed test.
python_status=0
bundle_python="${bundle_python:-}"
if [ -f "$build/python/collectived/__init__.py" ]; then
  # What is left of the whole check's time, at most 240 s, at least 60.
  py_left=$(( ${GPU_CHECK_TOTAL_S:-470} - (SECONDS - start) ))
  ((py_left <= 240)) || py_left=240
  ((py_left >= 60)) || py_left=60
  echo "== Python SDK ($build/python, at most $py_left s) =="
  if ! why="$(PYTHONPATH="$build/python" python3 -c 'import collectived, collectived.jax' 2>&1)"; then
    echo "not run: python3 ($(python3 -V 2>&1)) cannot import it${bundle_python:+ (the bundle holds it for Python $bundle_python)}: $(tail -n 1 <<<"$why")"
  else
    # Processes share the GPU: JAX in none of them takes most of its memory.
    XLA_PYTHON_CLIENT_PREALLOCATE=false COLLECTIVED_BIN="$build/daemon/collectived" \
      PYTHONPATH="$build/python" COLLECTIVED_REQUIRE_GPU=1 \
      timeout "$py_left" python3 -m pytest -q -rfEs -p no:cacheprovider "$here/client/python/tests" \
      -k "gpu or every_op_and_dtype_matches_numpy or typed_exceptions or training_example" \
      >"$out/python.log" 2>&1
    python_status=$?
    grep -E "^(SKIPPED|FAILED|ERROR)|passed|failed" "$out/python.log" | tail -n 15
    ((python_status == 0)) || echo "Python SDK: failed (exit $python_status; $out/python.log)"
  fi
fi

# The GPU benchmark rows (bench/gpu_bench.sh): collectived_perf --device cuda
# for K = 2, 4, 8 members, bare NCCL and the device copy ceiling, side by side
# (bench/README.md, "GPU rows"). Run whatever the tests said, within what is
# left of the 8 minutes.
bench_left=$(( ${GPU_CHECK_TOTAL_S:-470} - (SECONDS - start) ))
if [ "${GPU_CHECK_BENCH:-1}" = 0 ]; then
  echo "benchmarks: not run (GPU_CHECK_BENCH=0)"
  bench_left=0
fi
# First what a jitted collectived.jax psum adds to a step on this GPU
# (bench/python/jax_gpu_perf.py, K = 2, 4, 8), in at most half of what is left.
if [ -f "$build/python/collectived/__init__.py" ] && ((python_status == 0)) && ((bench_left >= 60)); then
  jax_left=$(( bench_left / 2 < 150 ? bench_left / 2 : 150 ))
  echo "== collectived.jax on the GPU (bench/python/jax_gpu_perf.py, at most $jax_left s) =="
  COLLECTIVED_BIN="$build/daemon/collectived" PYTHONPATH="$build/python" \
    timeout "$((jax_left + 15))" python3 "$here/bench/python/jax_gpu_perf.py" --members 2,4,8 \
    --sizes 8,64K,1M,16M,256M --iters 30 --timeout "$((jax_left / 3))" \
    >"$out/jax_gpu_perf.txt" 2>&1 ||
    echo "jax_gpu_perf: failed or cut off (in full: $out/jax_gpu_perf.txt)"
  grep -v '^#' "$out/jax_gpu_perf.txt" | head -n 20
  bench_left=$(( ${GPU_CHECK_TOTAL_S:-470} - (SECONDS - start) ))
fi
if ((bench_left >= 30)); then
  echo "== GPU benchmarks (bench/gpu_bench.sh, at most $bench_left s) =="
  if ! timeout "$bench_left" "$here/bench/gpu_bench.sh" "$out/bench" "$build"; then
    echo "gpu_bench: failed or cut off at $bench_left s (logs in $out/bench)"
  fi
  [ -s "$out/bench/summary.txt" ] && cat "$out/bench/summary.txt"
elif [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
  echo "GPU benchmarks: not run, only $bench_left s left of GPU_CHECK_TOTAL_S"
fi

# Not a GPU check: small psum over gRPC against a bare gRPC round trip
# (bench/grpc_ratio.sh), which a 2-core machine cannot separate from its own
# scheduling; this machine has the cores to. In what is left, if anything.
ratio_left=$(( ${GPU_CHECK_TOTAL_S:-470} - (SECONDS - start) ))
[ "${GPU_CHECK_BENCH:-1}" != 0 ] || ratio_left=0
if ((ratio_left >= 30)) && [ -x "$build/bench/collectived_perf" ]; then
  echo "== gRPC path against a bare round trip (bench/grpc_ratio.sh, at most $ratio_left s) =="
  if ! timeout "$ratio_left" "$here/bench/grpc_ratio.sh" --runs 9 --members 2,4 --iters 1000 \
      --perf "$build/bench/collectived_perf" >"$out/grpc_ratio.txt" 2>&1; then
    echo "grpc_ratio: failed or cut off at $ratio_left s; its last lines:"
    tail -n 8 "$out/grpc_ratio.txt"
  fi
  sed -n '/^# members  ratio/,$p' "$out/grpc_ratio.txt"
fi

((python_status == 0)) || [ $ctest_status -ne 0 ] || finish 1
if [ $ctest_status -ne 0 ]; then
  echo "ctest exited $ctest_status; what the failures said, most frequent first (in full: $out/ctest.log):"
  grep -E -A2 ': Failure$' "$out/ctest.log" | grep -v -E ': Failure$|^Failed$|^--$' |
    sort | uniq -c | sort -rn | head -n 15
  [ -s "$out/junit.xml" ] || echo "no JUnit XML written"
  finish 1
fi
finish 0
