#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs from a CUDA build into one file, for a
# GPU machine that has the driver, CUDA and NCCL but not the development
# packages this project builds against (gRPC, protobuf, Abseil, GoogleTest):
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [BUNDLE]
#       BUILD_DIR  a CUDA build (default build-gpu); its GPU test binaries,
#                  helpers and benchmarks are built first (incrementally)
#       BUNDLE     the file written (default BUILD_DIR/gpu-bundle.tar.xz)
#
# On the GPU machine, from a checkout of the same commit:
#
#   GPU_CHECK_BUNDLE=BUNDLE scripts/gpu-check.sh [OUTDIR]
#
# The bundle holds:
#   MANIFEST   the source and build directories the binaries were built in
#              (they name their helpers and the test data by absolute path),
#              the commit and the NCCL version they were compiled against
#   build/     the binaries (debug info stripped) and CTest's files, at their
#              paths under BUILD_DIR
#   lib/       every shared library they load except the C library, the
#              C++ runtime, the CUDA driver and NCCL (the GPU machine's own)
#   fallback/  the C++ runtime, used only where the machine's is older
#   build/python/collectived
#              the Python SDK (its package and extension module), where the
#              build has it: built for the Python the build was configured
#              with, which must be the GPU machine's minor version
#              (-DPython_EXECUTABLE=python3.12; MANIFEST's python=), with
#              that Python's jaxlib headers for collectived.jax
#
# Environment: GPU_BUNDLE_NO_BUILD=1 packs the build as it is, without
# building the targets first; XZ_OPT sets xz's level (xz's own variable).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build-gpu}"
[[ "$build" = /* ]] || build="$here/$build"
bundle="${2:-$build/gpu-bundle.tar.xz}"
[[ "$bundle" = /* ]] || bundle="$PWD/$bundle"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  echo "gpu-bundle: $build has no CMakeCache.txt; configure it first, e.g." >&2
  echo "  cmake -S . -B $build -DCOLLECTIVED_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" >&2
  exit 2
fi
if [[ ! -f "$build/tests/collectived_cuda_exec_tests" ]] &&
   ! grep -q '^COLLECTIVED_WITH_CUDA:.*=\(ON\|AUTO\)' "$build/CMakeCache.txt"; then
  echo "gpu-bundle: $build is not a CUDA build (COLLECTIVED_WITH_CUDA is OFF)" >&2
  exit 2
fi

# What scripts/gpu-check.sh builds (the SDK library is linked in, not
# packed), and collectivectl for looking at the daemons by hand.
# shellcheck source=scripts/gpu-targets.sh
. "$here/scripts/gpu-targets.sh"
targets=(collectivectl)
for t in "${gpu_targets[@]}"; do [[ "$t" == collectived_client ]] || targets+=("$t"); done
python_version=""
if grep -q '^COLLECTIVED_HAVE_PYTHON:INTERNAL=ON' "$build/CMakeCache.txt"; then
  # As configured (-DPython_EXECUTABLE), else as FindPython found it.
  python_exe="$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")"
  [[ -n "$python_exe" ]] ||
    python_exe="$(sed -n 's/^_Python_EXECUTABLE:INTERNAL=//p' "$build/CMakeCache.txt")"
  if [[ -z "$python_exe" ]]; then
    echo "gpu-bundle: $build has the Python SDK but its cache names no Python" >&2
    exit 1
  fi
  python_version="$("$python_exe" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
fi
# GPU_BUNDLE_NO_BUILD=1 packs what is built as it is (the bundle test does,
# while other tests use the build); a target that is not built still fails.
if [[ "${GPU_BUNDLE_NO_BUILD:-0}" != 1 ]]; then
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" \
    ${python_version:+collectived_python}
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib" "$stage/fallback"

# The binaries, by the paths CTest and the tests' compiled-in names use.
binaries=()
for t in "${targets[@]}"; do
  f="$(cd "$build" && find . -path ./CMakeFiles -prune -o -type f -name "$t" -perm -u+x -print -quit)"
  if [[ -z "$f" ]]; then
    echo "gpu-bundle: $t was not built in $build" >&2
    exit 1
  fi
  mkdir -p "$stage/build/$(dirname "$f")"
  objcopy --strip-debug "$build/$f" "$stage/build/$f"
  binaries+=("$build/$f")
done
# The Python package as the build assembled it (PYTHONPATH=BUILD_DIR/python).
if [[ -n "$python_version" ]]; then
  mkdir -p "$stage/build/python"
  cp -r "$build/python/collectived" "$stage/build/python/"
  find "$stage/build/python" -name __pycache__ -prune -exec rm -rf {} +
  for so in "$stage"/build/python/collectived/_collectived*.so; do
    objcopy --strip-debug "$so"
    binaries+=("$build/python/collectived/$(basename "$so")")
  done
fi
# CTest's test lists, including gtest_discover_tests' generated ones.
(cd "$build" && find . -path '*/CMakeFiles' -prune -o -type f \
   \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' \) -print) |
  while read -r f; do
    mkdir -p "$stage/build/$(dirname "$f")"
    cp -p "$build/$f" "$stage/build/$f"
  done

# The libraries: everything ldd resolves except what the GPU machine must
# bring itself (glibc, the CUDA driver, NCCL) or may have newer (the C++
# runtime, kept aside as a fallback): gpu_machine_lib, scripts/gpu-targets.sh.
missing=0
for b in "${binaries[@]}"; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    gpu_machine_lib "$name" && continue
    if [[ "$path" == "not" ]]; then
      echo "gpu-bundle: $(basename "$b") needs $name, which is not found here" >&2
      missing=1
      continue
    fi
    case "$name" in
      libstdc++.so.*|libgcc_s.so.*) dest="$stage/fallback" ;;
      *) dest="$stage/lib" ;;
    esac
    [[ -e "$dest/$name" ]] || cp -L "$path" "$dest/$name"
  done < <(ldd "$b")
done
((missing == 0)) || exit 1

nccl_h=""
for h in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do [[ -f "$h" ]] && { nccl_h="$h"; break; }; done
nccl_version="unknown"
if [[ -n "$nccl_h" ]]; then
  nccl_version="$(awk '/define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$nccl_h")"
fi
{
  echo "source_dir=$here"
  echo "build_dir=$build"
  echo "commit=$(git -C "$here" describe --always --dirty --abbrev=40 2>/dev/null || echo unknown)"
  echo "nccl_compiled=$nccl_version"
  echo "cuda_architectures=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "python=$python_version"
} > "$stage/MANIFEST"

mkdir -p "$(dirname "$bundle")"
tar -C "$stage" -cJf "$bundle" MANIFEST build lib fallback
python_note="no Python SDK"
[[ -z "$python_version" ]] || python_note="the Python SDK for Python $python_version"
echo "gpu-bundle: $bundle ($(du -h "$bundle" | cut -f1)): ${#binaries[@]} binaries," \
  "$(ls "$stage/lib" | wc -l) libraries, $python_note"
