#!/usr/bin/env bash
# The GPU rows of the benchmark, small enough to finish in well under two
# minutes on one H200 (build not counted):
#
#   bench/gpu_bench.sh OUTDIR [BUILD_DIR]        (BUILD_DIR default: build-gpu)
#
#   breakdown.txt      collectived_perf --device cuda --breakdown: where a K = 2
#                      psum's time goes, stage by stage (printed at the end)
#   copy.jsonl         cuda_copy_perf: device-to-device copy, 1 MiB .. 256 MiB
#                      (cudaMemcpyAsync and a copy kernel), the ceiling
#   nccl.jsonl         nccl_perf: psum and all_gather over bare NCCL, one rank
#                      per visible GPU (one GPU: NCCL's single-rank path)
#   collectived.jsonl  collectived_perf --device cuda: psum and all_gather of
#                      K = 2, 4, 8 members, their buffers on GPU 0, through a
#                      private daemon
#   across.jsonl       with two GPUs or more: collectived_perf --device=cuda:spread,
#                      one member per GPU, psum and all_gather (across.txt: the
#                      table beside the nccl rows)
#   hosts.jsonl        collectived_perf --device=cuda --hosts=2: members on two
#                      daemons of a loopback cluster, NCCL between them
#   gpu_rows.json      compare.py --gpu-rows over the three: the efficiency
#                      (2*K*S / time) / copy GB/s of psum at S >= 64 MiB
#   *.log, summary.txt the tools' stderr and the printed table
#
# BUILD_DIR is configured with -DCOLLECTIVED_WITH_CUDA=ON if it has no cache
# yet, and the four targets are built (incrementally) first.
#
# No usable GPU (no /dev/nvidia*, no driver, no device): prints "no GPU:
# skipped (...)" and exits 0. Otherwise exits 1 when a row failed (the other
# rows still run), 0 when all passed.
set -uo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: bench/gpu_bench.sh OUTDIR [BUILD_DIR]" >&2
  exit 2
fi
out="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${2:-build-gpu}"
[[ "$build" = /* ]] || build="$here/$build"
mkdir -p "$out" || exit 1
out="$(cd "$out" && pwd)"

skip() {
  echo "gpu_bench: no GPU: skipped ($1)"
  echo "no GPU: skipped ($1)" > "$out/summary.txt"
  exit 0
}

# Quick look before building anything.
if ! compgen -G '/dev/nvidia[0-9]*' > /dev/null && ! command -v nvidia-smi > /dev/null; then
  skip "no /dev/nvidia* device and no nvidia-smi"
fi
command -v nvidia-smi > /dev/null && nvidia-smi -L 2>&1 | head -8

# GPU_BENCH_PREBUILT=1: BUILD_DIR holds binaries built elsewhere (a bundle
# from scripts/gpu-bundle.sh); nothing is configured or built.
if [[ "${GPU_BENCH_PREBUILT:-0}" != 1 ]]; then
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLLECTIVED_WITH_CUDA=ON \
      > "$out/configure.log" 2>&1 || { tail -20 "$out/configure.log" >&2; echo "gpu_bench: configure failed" >&2; exit 1; }
  fi
  if ! grep -q '^COLLECTIVED_WITH_CUDA:.*=\(ON\|AUTO\)' "$build/CMakeCache.txt"; then
    echo "gpu_bench: $build is not a CUDA build (COLLECTIVED_WITH_CUDA is OFF there)" >&2
    exit 1
  fi
  cmake --build "$build" -j"$(nproc)" --target collectived collectived_perf nccl_perf cuda_copy_perf \
    > "$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; echo "gpu_bench: build failed" >&2; exit 1; }
fi
bin="$build/bench"

# The runtime's own verdict: 77 means no usable GPU (e.g. a driver without a device).
"$bin/peers/cuda_copy_perf" --method=memcpy --min-bytes=1M --max-bytes=1M --iters=1 --warmup=0 \
  > /dev/null 2> "$out/probe.log"
rc=$?
if [[ $rc -eq 77 ]]; then skip "$(head -1 "$out/probe.log")"; fi

status=0
row() {  # row NAME TIMEOUT_S CMD...: JSON rows into NAME.jsonl, stderr into NAME.log
  local name="$1" limit="$2"
  shift 2
  echo "gpu_bench: $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.jsonl" 2> "$out/$name.log"
  local rc=$?
  echo "gpu_bench: $name: exit $rc, $(grep -c '^{' "$out/$name.jsonl") rows, $((SECONDS - start)) s"
  if [[ $rc -ne 0 ]]; then
    status=1
    tail -5 "$out/$name.log" | sed "s/^/gpu_bench: $name: /" >&2
  fi
}

row copy 20 "$bin/peers/cuda_copy_perf" --json --method=memcpy,kernel \
  --min-bytes=1M --max-bytes=256M --step-factor=4 --iters=20 --warmup=5
# Where a GPU op's time goes: per stage of one op (the SDK's submit, the
# daemon's queue thread, the match, the launch, the GPU, the completion seen
# by each member), medians of K = 2 psums from 1 KiB to 32 MiB (text, printed
# at the end).
echo "gpu_bench: breakdown: collectived_perf --device=cuda --breakdown"
breakdown() {  # breakdown [ARGS...]: appends to breakdown.txt
  timeout --kill-after=10 40 "$bin/collectived_perf" --device=cuda --op=psum --members=2 \
    --breakdown --step-factor=32 --iters=200 --warmup=20 "$@" \
    >> "$out/breakdown.txt" 2>> "$out/breakdown.log" || {
    status=1
    tail -5 "$out/breakdown.log" | sed "s/^/gpu_bench: breakdown: /" >&2
  }
}
: > "$out/breakdown.txt"
breakdown --min-bytes=1K --max-bytes=32M
# The same ops ordered with each member's CUDA stream (Mesh::submit(op,
# stream)): matched -> ready is the wait for the members' streams.
echo "# --stream: each member's ops ordered with its own CUDA stream" >> "$out/breakdown.txt"
breakdown --stream --min-bytes=1K --max-bytes=1M
row nccl 30 "$bin/peers/nccl_perf" --json --op=psum,all_gather \
  --min-bytes=1K --max-bytes=256M --step-factor=4 --iters=20 --warmup=5
row collectived 60 "$bin/collectived_perf" --json --device=cuda --op=psum,all_gather \
  --members=2,4,8 --min-bytes=1K --max-bytes=256M --step-factor=4 --iters=10 --warmup=3

# Across GPUs, where there are several: one member per GPU, against the nccl
# rows above (the same GPUs).
gpu_count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
if [[ "${gpu_count:-0}" -ge 2 ]]; then
  row across 60 "$bin/collectived_perf" --json --device=cuda:spread --op=psum,all_gather \
    --members="$gpu_count" --min-bytes=1K --max-bytes=256M --step-factor=4 --iters=10 --warmup=3
  python3 - "$here/bench/peers" "$out/nccl.jsonl" "$out/across.jsonl" > "$out/across.txt" 2>&1 <<'PY' || status=1
import sys
sys.path.insert(0, sys.argv[1])
from compare import json_rows
def rows(path):
    with open(path) as f:
        return {(r["op"], r["bytes"]): r for r in json_rows(f)}
nccl, ours = rows(sys.argv[2]), rows(sys.argv[3])
print(f"{'op':<11} {'bytes':>11} {'nccl busbw':>11} {'collectived':>12} {'ratio':>6}")
for key in sorted(ours):
    if key in nccl and nccl[key]["busbw_gbps"] > 0:
        n, c = nccl[key]["busbw_gbps"], ours[key]["busbw_gbps"]
        print(f"{key[0]:<11} {key[1]:>11} {n:>11.2f} {c:>12.2f} {c / n:>6.2f}")
PY
  cat "$out/across.txt"
else
  echo "gpu_bench: across GPUs: skipped (${gpu_count:-0} GPU)"
fi

# Across hosts: two daemons of a cluster on loopback as two hosts, members'
# buffers on GPU 0, NCCL between the daemons (its socket transport: on one
# machine this measures the path, not a network).
row hosts 90 "$bin/collectived_perf" --json --device=cuda --hosts=2 --placement=runs \
  --op=psum,all_gather --members=2,4 --min-bytes=1K --max-bytes=64M --step-factor=8 --iters=5 \
  --warmup=2

python3 "$here/bench/peers/compare.py" --gpu-rows "$out/copy.jsonl" "$out/nccl.jsonl" \
  "$out/collectived.jsonl" --json-out "$out/gpu_rows.json" | tee "$out/summary.txt" || status=1
echo "gpu_bench: where a K = 2 psum's time goes (breakdown.txt):"
grep -v '^# \(collectived_perf:\|iters \)' "$out/breakdown.txt" | tee -a "$out/summary.txt"
echo "gpu_bench: results in $out (exit $status)"
exit $status
