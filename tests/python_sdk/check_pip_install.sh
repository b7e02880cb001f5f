#!/usr/bin/env bash
# `pip install ./client/python` as a user runs it, into a fresh virtual
# environment, then part of the SDK's test suite against the installed
# package (not the build tree's).
#   check_pip_install.sh PYTHON REPO WORKDIR
set -euo pipefail
python="$1" repo="$2" work="$3"
rm -rf "$work/venv"
mkdir -p "$work"
# The base interpreter's numpy, ml_dtypes, pytest and build backends
# (scripts/install-deps.sh) serve the environment: nothing is downloaded.
"$python" -m venv --system-site-packages "$work/venv"
venv_python="$work/venv/bin/python"
echo "=== pip install $repo/client/python"
"$venv_python" -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$work/build" "$repo/client/python"
cd "$work"
"$venv_python" - <<'PY'
import collectived, os, sys
where = os.path.dirname(collectived.__file__)
assert where.startswith(sys.prefix), f"collectived imported from {where}, not the venv"
print("installed at", where)
PY
echo "=== the SDK's tests against the installed package"
env -u PYTHONPATH "$venv_python" -m pytest -q -p no:cacheprovider \
  "$repo/client/python/tests" -k "shared_buffer or staged or futures or errors or same_order"
