#!/usr/bin/env bash
# The GPU check's offline path, as a GPU machine without the development
# packages runs it: scripts/gpu-bundle.sh packs this build, and
# scripts/gpu-check.sh runs the bundle from a copy of the checkout at another
# path, with the build's own source directory hidden (a private mount
# namespace, where a tmpfs covers the source directory's parent and all but
# the source comes back), so the bundle must be unpacked, linked and loaded
# the way it is there.
#
#   check_bundle.sh BUILD_DIR SOURCE_DIR
#
# Checks that
#   - the bundle links the source path to the copy and says "build: ok";
#   - every library its binaries load comes from the bundle, or is one the
#     GPU machine brings itself (the C library, the C++ runtime, the CUDA
#     driver, NCCL): a library found only because this machine has the
#     development packages fails the check;
#   - without a GPU, every GPU test that fails says that no GPU is usable,
#     and every one that does not run skipped itself (none failed or was
#     left out for a missing library, a missing binary, or anything else), and
#     the Python SDK imports with this machine's python3 and runs its part of
#     the suite (failures: only for the missing GPU);
#   - with a GPU, the check passes.
# Exit 77 (skipped) without root or mounts in a mount namespace, for a build
# without CUDA, a build outside its source, a source that is not a git
# checkout, or one at the top of the file system. A test killed by its
# timeout leaves its temporary directory (cdtest-bundle.*) behind.
set -euo pipefail
build="$(cd "$1" && pwd -P)" src="$(cd "$2" && pwd -P)"
skip() { echo "SKIPPED: $*"; exit 77; }
[[ "$(id -u)" == 0 ]] || skip "needs root for a private mount namespace"
command -v unshare >/dev/null 2>&1 || skip "needs unshare (util-linux)"
probe="$(mktemp -d "${TMPDIR:-/tmp}/cdtest-bundle-probe.XXXXXX")"
why="$(unshare -m --propagation private mount -t tmpfs tmpfs "$probe" 2>&1)" ||
  { rmdir "$probe"; skip "cannot mount in a private mount namespace here: $why"; }
rmdir "$probe"
git -c safe.directory="$2" -C "$2" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  skip "$2 is not a git checkout (the copy takes its files from git)"
[[ -x "$build/tests/collectived_cuda_exec_tests" ]] || skip "$build is not a CUDA build"
case "$build/" in "$src/"*) ;; *) skip "the build $build is outside the source $src (the bundle would unpack over it)" ;; esac
parent="$(dirname "$src")"
[[ "$parent" != / ]] || skip "the source directory $src is at the top of the file system"

work="$(mktemp -d "${TMPDIR:-/tmp}/cdtest-bundle.XXXXXX")"
trap 'rm -rf "$work"' EXIT
case "$work/" in "$src/"*) skip "the temporary directory $work is inside the source, which is hidden" ;; esac

echo "=== bundle $build"
GPU_BUNDLE_NO_BUILD=1 XZ_OPT=-0 "$src/scripts/gpu-bundle.sh" "$build" "$work/bundle.tar.xz"

# The checkout as the GPU machine gets it: the files, no build, no .git.
mkdir "$work/checkout"
(cd "$src" && git -c safe.directory="$src" ls-files -z --cached --others --exclude-standard |
   tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$work/checkout" -xf -

echo "=== gpu-check from the bundle, $src hidden"
# In the namespace a tmpfs over the source's parent hides the source (and
# its build), and everything else that was in the parent comes back, bound
# (recursively) from a descriptor of the parent opened before: only the
# source is gone.
# The benchmarks are left out (GPU_CHECK_BENCH=0). Then every library of
# every unpacked binary, as the check's LD_LIBRARY_PATH resolves it: those
# from outside the bundle go to libs.txt.
ns=0
unshare -m --propagation private bash -s "$work" "$parent" "$(basename "$src")" <<'NS' ||
set -euo pipefail
work="$1" parent="$2" hidden="$3"
exec 7<"$parent"
mount -t tmpfs -o "mode=$(stat -c %a "$parent")" tmpfs "$parent"
shopt -s dotglob nullglob
for e in /proc/self/fd/7/*; do
  name="${e##*/}"
  [[ "$name" != "$hidden" ]] || continue
  if [[ -L "$e" ]]; then
    ln -s "$(readlink "$e")" "$parent/$name"
    continue
  elif [[ -d "$e" ]]; then
    mkdir "$parent/$name"
  else
    : >"$parent/$name"  # a file, a socket, a device: bound onto a file
  fi
  mount --no-canonicalize --rbind "$e" "$parent/$name"
done
exec 7<&-
dev="$work"
cd "$dev/checkout"
export GIT_CEILING_DIRECTORIES="$dev"
status=0
GPU_CHECK_BUNDLE="$dev/bundle.tar.xz" GPU_CHECK_BENCH=0 GPU_CHECK_TOTAL_S=300 \
  bash scripts/gpu-check.sh "$dev/out" >"$dev/check.log" 2>&1 || status=$?
echo "$status" >"$dev/check.status"
libs="$(sed -n 's/^LD_LIBRARY_PATH=//p' "$dev/check.log")"
. "$dev/checkout/scripts/gpu-targets.sh"  # gpu_machine_lib
built="$(sed -n 's/^build_dir=//p' "$dev/check.log")"
: >"$dev/libs.txt"
[[ -n "$built" && -d "$built/.bundle" ]] || exit 0
n=0
while IFS= read -r -d '' f; do
  [[ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" == '177ELF' ]] || continue
  n=$((n + 1))
  # "\tNAME => PATH (0xADDRESS)", PATH as it is (spaces too), or "not found".
  { LD_LIBRARY_PATH="$libs" ldd "$f" || true; } |
    sed -n 's/^[[:space:]]*\([^ ]*\) => \(.*\) (0x[0-9a-f]*)$/\1\t\2/p; s/^[[:space:]]*\([^ ]*\) => not found$/\1\tnot found/p' |
    while IFS=$'\t' read -r name path; do
      case "$path" in "$built/.bundle/"*) continue ;; esac
      gpu_machine_lib "$name" && continue
      # The C++ runtime: the machine's own, the bundle's only where older.
      case "$name" in libstdc++.so.*|libgcc_s.so.*) continue ;; esac
      echo "$(basename "$f") loads $name from $path"
    done >>"$dev/libs.txt"
done < <(find "$built" -path "$built/.bundle" -prune -o -type f \( -perm -u+x -o -name '*.so' \) -print0)
echo "$n" >"$dev/binaries.count"
NS
  ns=$?
fail() { echo "FAILED: $*"; exit 1; }
[[ -f "$work/check.log" ]] && cat "$work/check.log"
((ns == 0)) || fail "the steps in the mount namespace stopped with status $ns"
grep -qxF -- "linked $src -> $work/checkout" "$work/check.log" ||
  fail "gpu-check did not link $src to the copy"
grep -q "^build: ok$" "$work/check.log" || fail "the bundle did not unpack and load (no 'build: ok')"
scanned="$(cat "$work/binaries.count" 2>/dev/null || echo 0)"
((scanned > 0)) || fail "no binary of the bundle was found to scan"
if [[ -s "$work/libs.txt" ]]; then
  cat "$work/libs.txt"
  fail "libraries above come from this machine, not the bundle"
fi
echo "the $scanned binaries load their libraries from the bundle or the GPU machine's own"
status="$(cat "$work/check.status")"
if [[ "$status" == 0 ]]; then
  echo "gpu-check passed: a GPU machine"
  exit 0
fi
[[ "$status" == 1 ]] || fail "gpu-check exited $status (1 is failed tests)"
grep -q "^GPUs: none" "$work/check.log" || fail "gpu-check failed with a GPU here"
# No GPU: every failure must be for the missing GPU.
if grep "^not run: python3" "$work/check.log"; then
  fail "the bundle's Python SDK does not import with this machine's python3"
fi
bundle_python="$(sed -n 's/^python=//p' "$work/check.log")"
python3 - "$work/out" "$bundle_python" <<'PY'
import re, sys, xml.etree.ElementTree as ET
out, bundle_python = sys.argv[1], sys.argv[2]
no_gpu = "no GPU is usable"
cases = list(ET.parse(f"{out}/junit.xml").getroot().iter("testcase"))
# A test ctest could not run (its binary missing from the bundle, say) is
# "notrun" like a skip: only the skips the tests asked for pass.
failed = [c for c in cases if c.get("status") == "fail" or
          (c.get("status") == "notrun" and
           all(e.get("message") != "SKIP_REGULAR_EXPRESSION_MATCHED" for e in c.iter("skipped")))]
other = [c.get("name") for c in failed
         if no_gpu not in "".join(e.text or "" for e in c.iter("system-out"))]
assert cases, "junit.xml lists no GPU test"
assert not other, f"GPU tests failed for another reason than the missing GPU: {other}"
if not bundle_python:
    print(f"{len(cases)} GPU tests, {len(failed)} failed, each for the missing GPU; no Python SDK")
    sys.exit(0)
log = open(f"{out}/python.log").read()
m = re.search(r"(\d+) passed", log)
assert m and int(m.group(1)) > 0, "the Python SDK's tests did not run:\n" + log[-2000:]
assert not re.search(r"\d+ failed", log), "Python tests failed:\n" + log[-4000:]
errors = len(re.findall(r"^ERROR ", log, re.M))
reasons = len(re.findall(r"^E +Failed: COLLECTIVED_REQUIRE_GPU=1 but " + no_gpu, log, re.M))
assert errors == reasons, f"{errors} Python errors, {reasons} of them for the missing GPU:\n" + log[-4000:]
print(f"{len(cases)} GPU tests, {len(failed)} failed, each for the missing GPU; "
      f"Python: {m.group(1)} passed, {errors} errors, each for the missing GPU")
PY
