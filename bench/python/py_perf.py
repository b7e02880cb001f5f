#!/usr/bin/env python3
"""Latency and bandwidth of the Python SDK, as collectived_perf measures the
C++ SDK: N member processes on one daemon run one op over one axis for each
size; one JSON object per row (the keys of `collectived_perf --json`), or a
table. With --compare, collectived_perf runs the same rows in the same
session and a ratio column shows Python's median time over C++'s.

  PYTHONPATH=build/python python3 bench/python/py_perf.py \\
      --daemon build/daemon/collectived --compare build/bench/collectived_perf

Each member times every iteration (submit to result, in place, arrays in
shared buffers unless --staged); a row's time is the slowest member's
median. busbw as nccl-tests defines it for the op (psum: 2(n-1)/n * algbw).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MEMBER = r"""
import json, sys, time
import numpy as np
import collectived
sock, rank, n, op, dtype, sizes, iters, warmup, staged = sys.argv[1:10]
rank, n, iters, warmup = int(rank), int(n), int(iters), int(warmup)
staged = staged == "1"
with collectived.connect(socket=sock, name=f"py-perf-{rank}") as c:
    mesh = c.join_mesh("py-perf", {"i": n}, coordinate=[rank], timeout=60)
    fn = getattr(mesh, op)
    for nbytes in map(int, sizes.split(",")):
        count = max(1, nbytes // np.dtype(dtype).itemsize)
        x = np.zeros(count, dtype) if staged else mesh.zeros((count,), dtype)
        x[:] = rank + 1
        fn(x, "i")
        ok = op != "psum" or bool(np.all(x == n * (n + 1) // 2))
        times = []
        for k in range(warmup + iters):
            t = time.perf_counter_ns()
            fn(x, "i")
            if k >= warmup:
                times.append(time.perf_counter_ns() - t)
        print(json.dumps({"bytes": count * x.itemsize, "count": count,
                          "median_ns": sorted(times)[len(times) // 2], "min_ns": min(times),
                          "ok": ok}), flush=True)
"""


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="psum", choices=["psum", "pmean", "pmax", "pmin"])
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--step-factor", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--staged", action="store_true",
                    help="pass plain numpy arrays (staged through a pooled buffer)")
    ap.add_argument("--socket", default="", help="a running daemon (default: start one)")
    ap.add_argument("--daemon", default="build/daemon/collectived")
    ap.add_argument("--compare", default="", help="collectived_perf binary: same rows in C++")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    sizes, s = [], parse_size(args.min_bytes)
    while s <= parse_size(args.max_bytes):
        sizes.append(s)
        s *= args.step_factor
    tmp = tempfile.mkdtemp()
    daemon = None
    sock = args.socket
    if not sock:
        sock = os.path.join(tmp, "collectived.sock")
        daemon = subprocess.Popen([args.daemon, f"--socket={sock}"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        while not os.path.exists(sock):
            time.sleep(0.02)
    try:
        procs = [subprocess.Popen(
            [sys.executable, "-c", MEMBER, sock, str(r), str(args.members), args.op, args.dtype,
             ",".join(map(str, sizes)), str(args.iters), str(args.warmup),
             "1" if args.staged else "0"], stdout=subprocess.PIPE, text=True)
            for r in range(args.members)]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit("a member failed")
        rows = [[json.loads(line) for line in out.splitlines()] for out in outs]
        cpp = {}
        if args.compare:
            out = subprocess.run(
                [args.compare, f"--op={args.op}", f"--members={args.members}",
                 f"--dtype={args.dtype}", f"--min-bytes={args.min_bytes}",
                 f"--max-bytes={args.max_bytes}", f"--step-factor={args.step_factor}",
                 f"--iters={args.iters}", f"--warmup={args.warmup}", f"--socket={sock}",
                 "--json"], check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    cpp[r["bytes"]] = r["time_us"]
    finally:
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()
    n = args.members
    factor = 2 * (n - 1) / n if args.op in ("psum", "pmean", "pmax", "pmin") else 1
    if not args.json:
        print(f"# py_perf: {args.op}, {n} members, {args.dtype}, "
              f"{'staged numpy arrays' if args.staged else 'arrays in shared buffers'}")
        print(f"#{'size(B)':>11} {'count':>12} {'time_us(med)':>13} {'time_us(min)':>13} "
              f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'check':>7}"
              + (f" {'c++_us':>9} {'py/c++':>7}" if cpp else ""))
    for per_size in zip(*rows):
        med = max(r["median_ns"] for r in per_size) / 1e3
        mn = max(r["min_ns"] for r in per_size) / 1e3
        nbytes = per_size[0]["bytes"]
        algbw = nbytes / med / 1e3
        row = {"op": args.op, "members": n, "dtype": args.dtype, "bytes": nbytes,
               "count": per_size[0]["count"], "time_us": round(med, 3),
               "time_us_min": round(mn, 3), "algbw_gbps": algbw, "busbw_gbps": algbw * factor,
               "check": "ok" if all(r["ok"] for r in per_size) else "FAIL", "client": "python"}
        if nbytes in cpp:
            row["cpp_time_us"] = cpp[nbytes]
            row["ratio_to_cpp"] = med / cpp[nbytes]
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{nbytes:12d} {row['count']:12d} {med:13.2f} {mn:13.2f} {algbw:12.3f} "
                  f"{algbw * factor:12.3f} {row['check']:>7}"
                  + (f" {cpp[nbytes]:9.2f} {med / cpp[nbytes]:7.2f}" if nbytes in cpp else ""))


if __name__ == "__main__":
    main()
