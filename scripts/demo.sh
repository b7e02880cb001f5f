#!/usr/bin/env bash
# Builds collectived, starts the daemon on defaults (a private socket), runs
# the multi-process demo of every collective, and stops the daemon.
#   scripts/demo.sh [--members=N]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
scripts/install-deps.sh
build="${BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target collectived collectived_demo

dir="$(mktemp -d)"
socket="$dir/collectived.sock"
"$build/daemon/collectived" --socket="$socket" 2>"$dir/daemon.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [ -S "$socket" ] && break; sleep 0.05; done
[ -S "$socket" ] || { cat "$dir/daemon.log"; echo "daemon did not start" >&2; exit 1; }
echo "collectived running (pid $daemon) on $socket"
echo
"$build/examples/collectived_demo" --socket="$socket" "$@"
echo
echo "daemon log:"
sed 's/^/  /' "$dir/daemon.log"
