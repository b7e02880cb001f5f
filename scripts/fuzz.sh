#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (+ASan/UBSan) and runs each:
#   request      an OpSpec off the wire (planning, engine, executor)
#   side_socket  packets with descriptors on the descriptor side socket
#   fast_queue   what a client writes into its shared-memory op queue
#   host_handshake  what a stranger or a connected host sends between daemons
#   scripts/fuzz.sh [seconds per target]      (default 60)
# New inputs go to scratch corpora; the checked-in seeds are in
# tests/fuzz/corpus/<target>. A crash leaves its input in build-fuzz/ and fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
seconds="${1:-60}"
targets=(request side_socket fast_queue host_handshake)
command -v clang++ >/dev/null || { echo "clang++ is needed (apt-get install clang)" >&2; exit 1; }
# The fuzz targets are host code: no CUDA (nvcc would get clang's fuzzer flags).
# -O1 with line tables (-g1), as libFuzzer's docs build: crash stacks keep
# file:line.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCOLLECTIVED_FUZZ=ON -DCOLLECTIVED_WITH_CUDA=OFF >/dev/null
# shellcheck disable=SC2046
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'collectived_%s_fuzzer ' "${targets[@]}")
for t in "${targets[@]}"; do
  corpus="build-fuzz/corpus/$t"
  mkdir -p "$corpus"
  cp -n "tests/fuzz/corpus/$t"/* "$corpus/"
  echo "--- $t (${seconds} s)"
  (cd build-fuzz &&
    "./tests/fuzz/collectived_${t}_fuzzer" -max_total_time="$seconds" -print_final_stats=1 \
      -timeout=60 -rss_limit_mb=4096 "corpus/$t" 2>&1 | tee "fuzz-$t.log" |
      grep -E "^#|Done|ERROR|stat::" | tail -6)
  grep -q "Done [0-9]* runs" "build-fuzz/fuzz-$t.log"
done
