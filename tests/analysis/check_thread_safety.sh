#!/bin/bash
# Clang's thread-safety analysis (-Wthread-safety) over the product sources,
# whose locks are Mutexes (common/sync.h) with ABSL_GUARDED_BY /
# ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations (they mean something only to
# clang; the build uses g++). Any warning fails the test.
#
#   check_thread_safety.sh REPO BUILD_DIR [CUDA_INCLUDE_DIR]
# Exit 77 (skipped) without clang++.
set -u
repo=$1
build=$2
cuda_include=${3:-}
clang=$(command -v clang++ || true)
[ -n "$clang" ] || { echo "SKIPPED: no clang++ (apt-get install clang)"; exit 77; }
flags=(-std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety
       -DCOLLECTIVED_VERSION='"analysis"'
       -I "$build/generated" -I "$repo" -I "$repo/client/include" -I "$build/proto")
if [ -n "$cuda_include" ]; then
  flags+=(-DCOLLECTIVED_HAVE_CUDA=1 -isystem "$cuda_include")
fi
cd "$repo" || exit 2
# The CUDA code too where the CUDA headers are given (the CUDA variant).
cuda_files=""
[ -n "$cuda_include" ] && cuda_files="common/cuda/*.cc exec/cuda/*.cc"
# shellcheck disable=SC2086
files=$(ls daemon/core/*.cc daemon/memory/*.cc daemon/util/*.cc daemon/cluster/*.cc \
           daemon/server/*.cc client/src/*.cc exec/*.cc plan/*.cc common/*.cc $cuda_files |
        grep -v '_test\.cc$')
count=$(echo "$files" | wc -l)
# Two at a time; each prints its file's diagnostics.
out=$(echo "$files" | xargs -P 2 -I{} sh -c '"$0" "$@" {} 2>&1' "$clang" "${flags[@]}")
if echo "$out" | grep -qE "(warning|error):"; then
  echo "$out" | grep -E "(warning|error):"
  echo "check_thread_safety: thread-safety findings in the $count files checked"
  exit 1
fi
echo "check_thread_safety: $count files clean"
