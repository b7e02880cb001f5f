#!/usr/bin/env bash
# Builds collectived, starts the daemon on defaults (a private socket), runs
# the multi-process demo of every collective (C++), then the same from Python
# (examples/python/quickstart.py, four processes) and a data-parallel JAX
# training run over four processes (examples/python/train_data_parallel.py),
# and stops the daemon.
#   scripts/demo.sh [--members=N]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
scripts/install-deps.sh
build="${BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target collectived collectived_demo
# The Python SDK, where this machine's python3 can build it (see README).
python_sdk=0
if grep -q "^COLLECTIVED_HAVE_PYTHON:INTERNAL=ON" "$build/CMakeCache.txt" 2>/dev/null; then
  cmake --build "$build" -j"$(nproc)" --target collectived_python
  python_sdk=1
fi

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
if [ "$python_sdk" -eq 1 ]; then
  echo "--- the same from Python: four processes (examples/python/quickstart.py)"
  PYTHONPATH="$build/python" python3 examples/python/quickstart.py --socket="$socket" | sort
  echo
  if python3 -c "import jax" 2>/dev/null; then
    echo "--- JAX: data-parallel training over four processes, gradients averaged with"
    echo "    collectived.jax.pmean inside jax.jit (examples/python/train_data_parallel.py)"
    PYTHONPATH="$build/python" python3 examples/python/train_data_parallel.py \
      --socket="$socket" --processes=4 --steps=31 | sort -t']' -k2,2 -s
    echo
  fi
fi
echo "daemon log:"
sed 's/^/  /' "$dir/daemon.log"
