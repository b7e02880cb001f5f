#!/usr/bin/env bash
# Installs a built tree into a temporary prefix, builds examples/consumer
# against it with find_package(collectived), and runs it against a daemon.
#   check_package.sh <build dir> <source dir>
set -euo pipefail
build="$1"
src="$2"
work="$(mktemp -d)"
trap 'kill -TERM "${daemon:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/consumer" -j2 >/dev/null
socket="$work/collectived.sock"
"$work/prefix/bin/collectived" --socket="$socket" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 200); do [ -S "$socket" ] && break; sleep 0.05; done
export COLLECTIVED_SOCKET="$socket"
"$work/consumer/psum_example" 2 0 >"$work/out0" &
member=$!
timeout 60 "$work/consumer/psum_example" 2 1 >"$work/out1"
wait "$member"
grep -qx "member 0: psum = 1" "$work/out0"
grep -qx "member 1: psum = 1" "$work/out1"
echo "package OK: find_package(collectived) builds and runs a client"
