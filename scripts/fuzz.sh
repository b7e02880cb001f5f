#!/usr/bin/env bash
# Builds the request fuzzer with clang's libFuzzer (+ASan/UBSan) and runs it.
#   scripts/fuzz.sh [seconds]      (default 60)
# New inputs go to a scratch corpus; the checked-in seeds are in
# tests/fuzz/corpus. A crash leaves its input in build-fuzz/ and fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
seconds="${1:-60}"
command -v clang++ >/dev/null || { echo "clang++ is needed (apt-get install clang)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCOLLECTIVED_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target collectived_request_fuzzer
corpus="build-fuzz/corpus"
mkdir -p "$corpus"
cp -n tests/fuzz/corpus/* "$corpus/"
cd build-fuzz
./tests/fuzz/collectived_request_fuzzer -max_total_time="$seconds" -print_final_stats=1 \
  -timeout=60 -rss_limit_mb=4096 corpus 2>&1 | tee fuzz.log | grep -E "^#|Done|ERROR|stat::" | tail -12
grep -q "Done [0-9]* runs" fuzz.log
