#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds the CUDA variant's GPU tests and runs
# them with COLLECTIVED_REQUIRE_GPU=1, so a GPU the tests cannot use fails
# instead of skipping.
#   scripts/gpu-check.sh [build dir]        (default build-gpu)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
dir="${1:-build-gpu}"
nvidia-smi -L || echo "nvidia-smi not found; going on"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLLECTIVED_WITH_CUDA=ON \
  | grep 'GPU buffers'
cmake --build "$dir" -j"$(nproc)" --target collectived_cuda_tests collectived_cuda_import_helper
cd "$dir"
COLLECTIVED_REQUIRE_GPU=1 ctest --output-on-failure --no-tests=error -L 'gpu|unit' \
  -R 'Cuda' -j1
