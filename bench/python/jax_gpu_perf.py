#!/usr/bin/env python3
"""What a jitted collectived.jax psum adds to a step on a GPU: K processes
sharing one GPU, float32, one table.

  PYTHONPATH=build/python python3 bench/python/jax_gpu_perf.py
  PYTHONPATH=build/python python3 bench/python/jax_gpu_perf.py --members 2 \\
      --sizes 8,1M,256M --iters 50 --json

For each member count K (one after another): a private daemon (unless
--socket names a running one) and K processes that each connect, join a mesh
with one axis "i" of K members, and on an array of the size on JAX's GPU
time, as the median of ``f(x).block_until_ready()`` after a checked call and
warmup calls (a row's figure is the slowest member's median):

- step: ``jax.jit(lambda x: x * 2)``, the step without a collective;
- step+psum: ``jax.jit(lambda x: cjax.psum(x * 2, "i", mesh=mesh))``;
- step+no-op: ``jax.jit(lambda x: x * 2 + cjax.axis_index("i", mesh=mesh))``:
  the same step with a custom call that the FFI handler answers without the
  daemon (the cost of an FFI call, and of leaving XLA's schedule for it);
- copy: ``jax.jit(lambda x: x[::-1])``: one read and one write of the array,
  the device's copy rate for the bytes (GB/s = 2 x bytes / time).

"added" is step+psum minus step. The psum's own traffic through the staging
buffer is two device copies of the array (in and out: 4 x bytes read or
written) besides the op; "vs copy" is the rate the added time gives those
bytes as a fraction of the copy rate (1.0: the call costs no more than its
two staging copies at the device's copy rate).

Checks (first call of every size, every member): psum of 2 * (rank + 1)
everywhere is K(K+1) everywhere; a wrong result marks the row FAIL and makes
the exit status 1. --platform cpu runs the same on JAX's CPU (to try the
script without a GPU; the figures are then CPU figures). Every wait has a
deadline (--timeout seconds per member count).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_vs_gloo import (daemon_binary, fmt_size, parse_size, run_phase,  # noqa: E402
                         start_daemon, stop_daemon)

MEMBER = r"""
import json, os, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
RANK, N = int(sys.argv[2]), cfg["n"]
if cfg["platform"] == "cuda":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
jax.config.update("jax_platforms", cfg["platform"])
import collectived, collectived.jax as cjax

c = collectived.connect(socket=cfg["socket"], name=f"jaxgpu-{RANK}")
mesh = c.join_mesh(cfg["mesh"], {"i": N}, coordinate=[RANK], timeout=60)
fns = {"step": jax.jit(lambda x: x * 2),
       "psum": jax.jit(lambda x: cjax.psum(x * 2, "i", mesh=mesh)),
       "noop": jax.jit(lambda x: x * 2 + cjax.axis_index("i", mesh=mesh).astype(x.dtype)),
       "copy": jax.jit(lambda x: x[::-1])}

def timed(f, x, iters, warmup):
    for _ in range(warmup):
        f(x).block_until_ready()
    times = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        f(x).block_until_ready()
        times.append(time.perf_counter_ns() - t)
    times.sort()
    return times[len(times) // 2]

for nbytes, count, iters, warmup in cfg["plan"]:
    x = jnp.full((count,), RANK + 1, jnp.float32)
    y = np.asarray(fns["psum"](x))
    want = N * (N + 1)
    bad = np.flatnonzero(y != want)
    err = f"element {int(bad[0])} is {y[bad[0]]!r}, expected {want}" if bad.size else ""
    row = {"bytes": nbytes, "count": count, "iters": iters, "rank": RANK, "ok": not err,
           "error": err, "device": str(x.devices().pop())}
    for name, f in fns.items():
        mesh.barrier()  # every member times the same thing at once
        row[name + "_ns"] = timed(f, x, iters, warmup)
    print(json.dumps(row), flush=True)
    del x, y
mesh.leave()
c.close()
"""


def plan(args):
    rows = []
    for size in args.size_list:
        count = max(1, size // 4)
        nbytes = count * 4
        iters = max(args.min_iters, min(args.iters, args.iter_bytes // nbytes))
        rows.append((nbytes, count, iters, max(2, min(args.warmup, iters))))
    return rows


def table(rows_by_n):
    head = (f"{'K':>3} {'size':>6} {'step us':>9} {'+psum us':>10} {'added us':>10} "
            f"{'+no-op us':>10} {'copy GB/s':>10} {'vs copy':>8}  check")
    lines = [head]
    for n, rows in rows_by_n:
        by_size = {}
        for r in rows:
            by_size.setdefault(r["bytes"], []).append(r)
        for nbytes in sorted(by_size):
            members = by_size[nbytes]
            worst = {k: max(m[k + "_ns"] for m in members) for k in ("step", "psum", "noop",
                                                                       "copy")}
            added = worst["psum"] - worst["step"]
            copy_rate = 2 * nbytes / worst["copy"]  # bytes per ns = GB/s
            vs = (4 * nbytes / max(added, 1)) / copy_rate if copy_rate > 0 else 0.0
            ok = all(m["ok"] for m in members) and len(members) == n
            lines.append(f"{n:>3} {fmt_size(nbytes):>6} {worst['step'] / 1e3:>9.1f} "
                         f"{worst['psum'] / 1e3:>10.1f} {added / 1e3:>10.1f} "
                         f"{worst['noop'] / 1e3:>10.1f} {copy_rate:>10.1f} {vs:>8.2f}  "
                         f"{'ok' if ok else 'FAIL'}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", default="2,4,8", help="member counts K, a comma list")
    ap.add_argument("--sizes", default="8,4K,64K,1M,16M,256M",
                    help="bytes per member (suffixes K, M, G), a comma list")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iter-bytes", type=parse_size, default=parse_size("4G"),
                    help="fewer iterations for large sizes: about this many bytes a size")
    ap.add_argument("--platform", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--socket", default="", help="a running daemon (default: a private one)")
    ap.add_argument("--daemon", default=os.environ.get("COLLECTIVED_BIN",
                                                       "build/daemon/collectived"))
    ap.add_argument("--timeout", type=float, default=240, help="seconds per member count")
    ap.add_argument("--json", action="store_true", help="the members' rows as JSON lines")
    args = ap.parse_args()
    args.size_list = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="jax-gpu-perf-") as tmp:
        daemon, sock = (None, args.socket)
        if not sock:
            daemon, sock = start_daemon(daemon_binary(args.daemon), tmp)
        try:
            for n in [int(k) for k in args.members.split(",")]:
                cfg = {"n": n, "socket": sock, "mesh": f"jax-gpu-perf-{n}",
                       "platform": args.platform, "plan": plan(args)}
                rows, why = run_phase("cd", MEMBER, cfg, n, tmp, args.timeout, dict(os.environ))
                if why:
                    failed = True
                    print(f"# K={n}: {why}", file=sys.stderr)
                if args.json:
                    for r in rows:
                        print(json.dumps(dict(r, members=n)))
                results.append((n, rows))
        finally:
            if daemon is not None:
                stop_daemon(daemon)
    if not args.json:
        print(f"# collectived.jax psum on {args.platform}, float32; us: the slowest member's "
              "median of f(x).block_until_ready()")
        print(table(results))
    bad = any(not r["ok"] for _, rows in results for r in rows)
    sys.exit(1 if failed or bad else 0)


if __name__ == "__main__":
    main()
