#!/usr/bin/env bash
# Installs what building and testing collectived needs, from Debian's packages
# and PyPI. Safe to run again: it only installs what is missing.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev
  docker-compose python3-pip openssl clang libclang-rt-14-dev etcd-server etcd-client
  libopenmpi-dev openmpi-bin libgloo-dev prometheus-cpp-dev python3-dev python3-venv
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$here/tests/python/requirements.txt"
if [ -f "$req" ] && ! python3 -c 'import grpc, grpc_health, grpc_reflection, grpc_tools, pytest, yaml, kubernetes_validate, nanobind, scikit_build_core, numpy, ml_dtypes, jax' 2>/dev/null; then
  echo "installing Python test requirements"
  python3 -m pip install -q -r "$req" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages -r "$req"
fi
