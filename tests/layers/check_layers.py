#!/usr/bin/env python3
"""Fails when a product source file includes across the layer order that
DESIGN.md ("Layers") states: each folder may include only the folders below
it. Test files (*_test.cc, *_test.h, *_suite*.h) are not product code and may
include anything; includes of third-party headers (absl/, grpcpp/, ...) are
not checked. A relative include ("../x.h") is refused everywhere: it hides
the layer it reaches.

    python3 tests/layers/check_layers.py [REPO]   # exit 1 with one line per violation
"""

import re
import sys
from pathlib import Path

# The project's own include roots; anything else is third-party.
OWN = ("common/", "plan/", "exec/", "client/", "daemon/", "tests/", "bench/", "examples/",
       "collectived/")

# Folder of the including file -> what it may include (prefixes of the
# include path). The first matching folder (longest first) applies.
# "collectived/" is the SDK's public headers and the generated ones (the
# protos' collectived/v1/, the member-side code identity).
# The wire format reaches the engine only through the server's edge
# (daemon/server/wire.h): the core, the plan library's neutral part and the
# executors include neither the protos nor the conversions (plan/wire_plan.h).
PUBLIC_DTYPE = "collectived/dtype.h"
PROTO = "collectived/v1/"
MEMBER_OPS_CODE = "collectived/member_ops_code.h"
RULES = {
    "common/": ["common/", PROTO, PUBLIC_DTYPE],
    "plan/wire_plan.": ["plan/", "common/", PROTO, PUBLIC_DTYPE],
    "plan/": ["plan/op_", "plan/plan_op.h", "common/", PUBLIC_DTYPE],
    "exec/": ["exec/", "plan/op_", "plan/plan_op.h", "common/", PUBLIC_DTYPE],
    "client/include/": ["collectived/"],
    "client/": ["client/src/", "collectived/", "plan/", "exec/", "common/"],
    "daemon/util/": ["daemon/util/", "common/"],
    "daemon/memory/": ["daemon/memory/", "daemon/util/", "common/", PUBLIC_DTYPE],
    "daemon/core/": ["daemon/core/", "daemon/memory/", "daemon/util/", "plan/op_",
                     "plan/plan_op.h", "exec/", "common/", PUBLIC_DTYPE, MEMBER_OPS_CODE],
    "daemon/cluster/": ["daemon/cluster/", "daemon/core/rendezvous.h", "daemon/core/timer.h",
                        "daemon/util/", "plan/", "exec/", "common/", "collectived/"],
    "daemon/server/": ["daemon/", "plan/", "exec/", "common/", "collectived/"],
    "daemon/ctl/": ["common/", "collectived/"],
}
SOURCES = (".h", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def is_test(path: Path) -> bool:
    name = path.name
    return "_test." in name or "_suite" in name or name.endswith("_fuzzer.cc")


def violations(repo: Path):
    out = []
    folders = sorted(RULES, key=len, reverse=True)
    paths = [p for top in ("common", "plan", "exec", "client", "daemon")
             for p in sorted((repo / top).rglob("*"))]
    for path in paths:
        rel = path.relative_to(repo).as_posix()
        if path.suffix not in SOURCES or not path.is_file() or is_test(path):
            continue
        folder = next((f for f in folders if rel.startswith(f)), None)
        if folder is None:
            continue  # tests/, bench/, examples/: above every layer
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if inc.startswith("../") or "/../" in inc:
                out.append(f"{rel}:{n}: relative include \"{inc}\" (name it from the root)")
                continue
            if "/" not in inc:
                continue  # a file beside it
            if not inc.startswith(OWN):
                continue  # third-party
            if not any(inc.startswith(p) for p in RULES[folder]):
                out.append(f"{rel}:{n}: {folder} may not include \"{inc}\" "
                           f"(allowed: {', '.join(RULES[folder])}; DESIGN.md, Layers)")
    return out


def main():
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    found = violations(repo.resolve())
    for v in found:
        print(v)
    print(f"check_layers: {len(found)} violation(s) in {repo}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
