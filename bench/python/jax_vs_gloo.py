#!/usr/bin/env python3
"""collectived.jax against jax.distributed + Gloo: the same jitted psum and
all_gather (float32) in N independent processes, run both ways in one
invocation, one table.

  PYTHONPATH=build/python python3 bench/python/jax_vs_gloo.py
  PYTHONPATH=build/python python3 bench/python/jax_vs_gloo.py --members 2 \\
      --sizes 8,64K,1M --ops psum --iters 100 --json

For each member count N (one after another, never two systems at once):

1. collectived.jax: a private daemon (``collectived --socket=PATH`` in a
   fresh temporary directory, unless --socket names a running one) and N
   processes that each connect, join a mesh with one axis "i" of N members and
   run ``jax.jit(lambda x: cjax.psum(x, "i", mesh=mesh))`` (and
   ``cjax.all_gather(x, "i", mesh=mesh, tiled=True)``) on a CPU array. The same
   processes also time the Python SDK on the same sizes: ``mesh.psum(x, "i")``
   in place on an array in a shared buffer (``mesh.zeros``), and
   ``mesh.all_gather(x, "i", tiled=True, out=...)`` into a shared buffer: the
   collective without jit, without the FFI handler's two copies.
2. jax + Gloo: N processes that each call ``jax.distributed.initialize``
   (coordinator on 127.0.0.1, a free port) with
   ``jax_cpu_collectives_implementation = "gloo"`` and one CPU device each,
   build a global ``jax.sharding.Mesh`` over the N devices (axis "i", in
   process order) and run ``jax.jit(shard_map(lambda b: jax.lax.psum(b, "i"),
   in_specs=P("i"), out_specs=P("i")))`` (and ``all_gather(..., tiled=True)``)
   on a global array made by ``jax.make_array_from_process_local_data``.

Every member times ``f(x).block_until_ready()`` (SDK: the call, which returns
with the result) for each iteration, after one checked call and some warmup
calls, and reports its median; a row's time is the slowest member's median.
Sizes follow collectived_perf: ``bytes`` is the per-member input of psum and
the per-member output of all_gather (its input is bytes/N), rounded down to
whole float32 elements, and for all_gather to a multiple of N elements (at
least N). Large sizes get fewer iterations (--iter-bytes) so a run stays short.

Checks (on the first call of every size, in every member): psum of rank+1
everywhere is N(N+1)/2 everywhere; all_gather of member r's block
``r*count/N + arange(count/N)`` is ``arange(count)`` (every member's block, in
rank order). A wrong result marks the row FAIL, prints the first wrong
element on stderr, and makes the exit status 1.

All waits have deadlines: the daemon's socket (10 s), every phase (--timeout
seconds for all of its members); a member that fails or a phase that runs out
of time kills that phase's processes and is reported below the table with the
members' stderr; the other system's numbers still print (exit status 1).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Shared by both kinds of member: argv = config JSON, rank. Prints one JSON
# line per (system, op, size).
COMMON = r"""
import json, os, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
RANK, N = int(sys.argv[2]), cfg["n"]

def emit(**kw):
    print(json.dumps(kw), flush=True)

def inputs(op, count):
    # psum: rank+1 everywhere; all_gather: this member's block of arange(count).
    if op == "psum":
        return np.full((count,), RANK + 1, np.float32)
    per = count // N
    return (RANK * per + np.arange(per)).astype(np.float32)

def check(op, y, count):
    y = np.asarray(y).reshape(-1)
    want = (np.full((count,), N * (N + 1) // 2, np.float32) if op == "psum"
            else np.arange(count, dtype=np.float32))
    if y.shape != want.shape:
        return f"shape {y.shape}, expected {want.shape}"
    bad = np.flatnonzero(y != want)
    if bad.size:
        i = int(bad[0])
        return f"element {i} is {y[i]!r}, expected {want[i]!r} ({bad.size} wrong)"
    return ""

def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    times.sort()
    return times[len(times) // 2], times[0]

def report(system, op, nbytes, count, err, med, mn, iters):
    if err:
        print(f"member {RANK}: {system} {op} {nbytes} B: wrong result: {err}",
              file=sys.stderr, flush=True)
    emit(system=system, op=op, bytes=nbytes, count=count, ok=not err, error=err, median_ns=med,
         min_ns=mn, iters=iters, rank=RANK)
"""

MEMBER_CD = COMMON + r"""
import jax
import collectived, collectived.jax as cjax

c = collectived.connect(socket=cfg["socket"], name=f"jaxbench-{RANK}")
mesh = c.join_mesh(cfg["mesh"], {"i": N}, coordinate=[RANK], timeout=60)
for op in cfg["ops"]:
    if op == "psum":
        f = jax.jit(lambda x: cjax.psum(x, "i", mesh=mesh))
    else:
        f = jax.jit(lambda x: cjax.all_gather(x, "i", mesh=mesh, tiled=True))
    for nbytes, count, iters, warmup in cfg["plan"][op]:
        local = inputs(op, count)
        x = jax.device_put(local)
        err = check(op, f(x), count)
        med, mn = timed(lambda: f(x).block_until_ready(), iters, warmup)
        report("cd", op, nbytes, count, err, med, mn, iters)
        del x
        if not cfg["sdk"]:
            continue
        s = mesh.zeros(local.shape, np.float32)
        s[:] = local
        if op == "psum":
            err = check(op, mesh.psum(s, "i"), count)   # in place: the result is s
            med, mn = timed(lambda: mesh.psum(s, "i"), iters, warmup)
        else:
            out = mesh.zeros((count,), np.float32)
            err = check(op, mesh.all_gather(s, "i", tiled=True, out=out), count)
            med, mn = timed(lambda: mesh.all_gather(s, "i", tiled=True, out=out), iters, warmup)
            del out
        report("sdk", op, nbytes, count, err, med, mn, iters)
        del s
        c.collect()
mesh.leave()
c.close()
"""

MEMBER_GLOO = COMMON + r"""
import inspect
import jax
jax.config.update("jax_platforms", "cpu")
if "jax_cpu_collectives_implementation" not in jax.config.values:
    sys.exit(f"jax {jax.__version__} has no jax_cpu_collectives_implementation option")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if "jax_num_cpu_devices" in jax.config.values:
    jax.config.update("jax_num_cpu_devices", 1)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
try:
    shard_map = jax.shard_map                        # jax >= 0.6 (check_vma)
except AttributeError:
    from jax.experimental.shard_map import shard_map  # older jax (check_rep)

kw = {}
params = inspect.signature(jax.distributed.initialize).parameters
if "initialization_timeout" in params:
    kw["initialization_timeout"] = int(cfg["init_timeout"])
if "shutdown_timeout_seconds" in params:
    kw["shutdown_timeout_seconds"] = 30
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{cfg['port']}", num_processes=N,
                           process_id=RANK, **kw)
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
if len(devices) != N or jax.local_device_count() != 1:
    sys.exit(f"expected {N} devices, one per process; got {devices}, "
             f"{jax.local_device_count()} local")
mesh = Mesh(np.array(devices), ("i",))
sharding = NamedSharding(mesh, P("i"))
for op in cfg["ops"]:
    if op == "psum":
        body = lambda b: jax.lax.psum(b, "i")
    else:
        body = lambda b: jax.lax.all_gather(b, "i", tiled=True)
    f = jax.jit(shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    for nbytes, count, iters, warmup in cfg["plan"][op]:
        local = inputs(op, count)
        g = jax.make_array_from_process_local_data(sharding, local, (N * local.size,))
        y = f(g)
        err = check(op, y.addressable_shards[0].data, count)
        del y
        med, mn = timed(lambda: f(g).block_until_ready(), iters, warmup)
        report("gloo", op, nbytes, count, err, med, mn, iters)
        del g
jax.distributed.shutdown()
"""

SYSTEMS = [("cd", "collectived.jax"), ("gloo", "jax+gloo"), ("sdk", "python SDK")]


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def fmt_size(b):
    for unit, m in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m}{unit}"
    return str(b)


def plan(args, op, n):
    """[(bytes, count, iters, warmup)] for op with n members, as collectived_perf
    rounds sizes (all_gather: a multiple of n elements, at least n)."""
    rows, seen = [], set()
    for size in args.size_list:
        count = max(1, size // 4)
        if op == "all_gather":
            count = max(n, count - count % n)
        if count in seen:
            continue
        seen.add(count)
        nbytes = count * 4
        iters = max(args.min_iters, min(args.iters, args.iter_bytes // nbytes))
        warmup = max(2, min(args.warmup, args.iter_bytes // (4 * nbytes)))
        rows.append((nbytes, count, iters, warmup))
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_groups(procs):
    """SIGKILL to each still running process's group (each member and the
    daemon is its own), all of them first, then reaps them."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def tail(path, lines=25):
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def run_phase(label, code, cfg, n, tmp, timeout, env):
    """Runs n members of `code`; returns (their JSON rows, error text or None).
    Every member must finish within `timeout` seconds; the first that fails
    or the deadline kills all of them (each member is its own process group)."""
    procs, outs, errs = [], [], []
    for r in range(n):
        out = os.path.join(tmp, f"{label}-n{n}-{r}.out")
        err = os.path.join(tmp, f"{label}-n{n}-{r}.err")
        with open(out, "w") as fo, open(err, "w") as fe:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(cfg), str(r)], stdout=fo, stderr=fe,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        outs.append(out)
        errs.append(err)
    deadline = time.monotonic() + timeout
    why = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                why = f"member {failed[0]} exited with status {codes[failed[0]]}"
                break
            if time.monotonic() > deadline:
                why = f"timed out after {timeout:.0f} s (killed)"
                break
            time.sleep(0.05)
    finally:
        kill_groups(procs)
    if why is None and any(p.returncode for p in procs):
        r = next(r for r, p in enumerate(procs) if p.returncode)
        why = f"member {r} exited with status {procs[r].returncode}"
    # The SDK's own warnings (e.g. a daemon of another build, which sends every
    # op through the daemon and changes the timings) are shown even on success.
    notes = []
    for err in errs:
        for line in Path(err).read_text(errors="replace").splitlines():
            if line.startswith("collectived:") and line not in notes:
                notes.append(line)
    for line in notes:
        print(f"# member warning: {line}", file=sys.stderr, flush=True)
    rows = []
    for out in outs:
        for line in Path(out).read_text().splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
    if why:
        detail = "\n".join(f"--- member {r} (status {p.returncode}) stderr, last lines:\n"
                           f"{tail(errs[r])}" for r, p in enumerate(procs))
        return rows, f"{why}\n{detail}"
    return rows, None


def start_daemon(binary, tmp):
    sock = os.path.join(tmp, "collectived.sock")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    proc = subprocess.Popen([str(binary), f"--socket={sock}"], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with status {proc.returncode}:\n"
                               f"{tail(os.path.join(tmp, 'daemon.log'))}")
        if time.monotonic() > deadline:
            kill_groups([proc])
            raise RuntimeError("the daemon did not create its socket within 10 s")
        time.sleep(0.02)
    return proc, sock


def stop_daemon(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            kill_groups([proc])


def daemon_binary(raw):
    path = Path(raw)
    if path.is_absolute() or path.exists():
        return path
    return REPO / raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", default="2,4", help="member counts, a comma list")
    ap.add_argument("--ops", default="psum,all_gather", help="psum, all_gather, or both")
    ap.add_argument("--sizes", default="8,4K,64K,1M,16M,64M",
                    help="sizes in bytes, a comma list; K, M, G are powers of 1024")
    ap.add_argument("--step-factor", type=int, default=0,
                    help="instead of --sizes: --min-bytes to --max-bytes by this factor")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--iters", type=int, default=200, help="timed iterations (small sizes)")
    ap.add_argument("--min-iters", type=int, default=20, help="timed iterations at least")
    ap.add_argument("--iter-bytes", default="256M",
                    help="a size gets min(--iters, this / bytes) iterations, at least --min-iters")
    ap.add_argument("--warmup", type=int, default=10,
                    help="untimed calls per size (fewer for large sizes, at least 2)")
    ap.add_argument("--no-sdk", dest="sdk", action="store_false",
                    help="leave out the python SDK column")
    ap.add_argument("--systems", default="cd,gloo", help="cd (collectived.jax, and the SDK), gloo")
    ap.add_argument("--socket", default="", help="a running daemon (default: start a private one)")
    ap.add_argument("--daemon", default=os.environ.get("COLLECTIVED_BIN", "build/daemon/collectived"),
                    help="daemon binary (relative: to the cwd, else the repository root)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds each phase (one system, one member count) may take")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    args = ap.parse_args()

    members = [int(m) for m in args.members.split(",") if m]
    ops = [o for o in args.ops.split(",") if o]
    systems = [s for s in args.systems.split(",") if s]
    if not members or any(m < 1 for m in members):
        ap.error("--members: positive counts")
    if any(o not in ("psum", "all_gather") for o in ops) or not ops:
        ap.error("--ops: psum, all_gather")
    if any(s not in ("cd", "gloo") for s in systems) or not systems:
        ap.error("--systems: cd, gloo")
    if args.step_factor:
        if args.step_factor < 2:
            ap.error("--step-factor: at least 2")
        args.size_list, s = [], parse_size(args.min_bytes)
        while s <= parse_size(args.max_bytes):
            args.size_list.append(s)
            s *= args.step_factor
    else:
        args.size_list = [parse_size(s) for s in args.sizes.split(",") if s]
    args.iter_bytes = parse_size(args.iter_bytes)
    binary = daemon_binary(args.daemon)
    if "cd" in systems and not args.socket and not binary.exists():
        sys.exit(f"no daemon binary at {binary} (build it, or pass --daemon / COLLECTIVED_BIN)")

    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    results = {}   # (system, op, n, bytes) -> row
    errors = []
    t_run = time.monotonic()
    for n in members:
        cfg_plan = {op: plan(args, op, n) for op in ops}
        for system in systems:
            tmp = tempfile.mkdtemp(prefix="jax_vs_gloo-")
            daemon = None
            t0 = time.monotonic()
            try:
                cfg = {"n": n, "ops": ops, "plan": cfg_plan, "sdk": args.sdk}
                if system == "cd":
                    if args.socket:
                        cfg["socket"], cfg["mesh"] = args.socket, f"jaxbench-{os.getpid()}-n{n}"
                    else:
                        daemon, cfg["socket"] = start_daemon(binary, tmp)
                        cfg["mesh"] = "jaxbench"
                    rows, err = run_phase("cd", MEMBER_CD, cfg, n, tmp, args.timeout, env)
                else:
                    cfg["port"] = free_port()
                    cfg["init_timeout"] = max(10, min(60, int(args.timeout)))
                    rows, err = run_phase("gloo", MEMBER_GLOO, cfg, n, tmp, args.timeout, env)
            except RuntimeError as e:
                rows, err = [], str(e)
            finally:
                if daemon:
                    stop_daemon(daemon)
                shutil.rmtree(tmp, ignore_errors=True)
            print(f"# {n} members, {dict(SYSTEMS)[system]}: {time.monotonic() - t0:.1f} s"
                  + (" FAILED" if err else ""), file=sys.stderr, flush=True)
            if err:
                errors.append(f"{dict(SYSTEMS)[system]}, {n} members: {err}")
            for r in rows:
                if r["error"]:
                    print(f"# WRONG RESULT: {dict(SYSTEMS)[r['system']]}, {n} members, {r['op']}, "
                          f"{r['bytes']} B, member {r['rank']}: {r['error']}",
                          file=sys.stderr, flush=True)
                key = (r["system"], r["op"], n, r["bytes"])
                prev = results.get(key)
                if prev is None:
                    results[key] = dict(r, members=[r])
                else:
                    prev["members"].append(r)

    def cell(system, op, n, nbytes):
        """(slowest member's median in us, all ok) or None when not every member reported."""
        r = results.get((system, op, n, nbytes))
        if r is None or len(r["members"]) != n:
            return None
        return (max(m["median_ns"] for m in r["members"]) / 1e3,
                all(m["ok"] for m in r["members"]),
                max(m["min_ns"] for m in r["members"]) / 1e3, r["members"][0]["iters"])

    failed_check = False
    if not args.json:
        print(f"# jax_vs_gloo: float32, jax {jax_version()}, {os.cpu_count()} cpus; "
              "median over the iterations of each member, the slowest member's; us")
        head = (f"{'op':>10} {'N':>3} {'bytes':>9} {'iters':>5} {'collectived.jax':>15} "
                f"{'jax+gloo':>10} {'gloo/cd':>8}")
        if args.sdk:
            head += f" {'SDK in place':>12} {'cd/SDK':>7}"
        print(head + f" {'check':>6}")
    for op in ops:
        for n in members:
            for nbytes, count, iters, _ in plan(args, op, n):
                cd, gl, sdk = (cell(s, op, n, nbytes) for s in ("cd", "gloo", "sdk"))
                got = [c for c in (cd, gl, sdk if args.sdk else None) if c]
                ok = all(c[1] for c in got)
                failed_check |= not ok
                check = ("ok" if ok else "FAIL") if got else "-"
                ratio = gl[0] / cd[0] if cd and gl else None
                if args.json:
                    row = {"op": op, "members": n, "bytes": nbytes, "count": count,
                           "dtype": "float32", "iters": iters, "check": check,
                           "cd_jax_us": cd and round(cd[0], 3),
                           "cd_jax_us_min": cd and round(cd[2], 3),
                           "gloo_us": gl and round(gl[0], 3),
                           "gloo_us_min": gl and round(gl[2], 3),
                           "gloo_over_cd": ratio}
                    if args.sdk:
                        row["sdk_us"] = sdk and round(sdk[0], 3)
                        row["sdk_us_min"] = sdk and round(sdk[2], 3)
                    print(json.dumps(row))
                    continue

                def us(c):
                    return f"{c[0]:.1f}" if c else "-"
                line = (f"{op:>10} {n:>3} {fmt_size(nbytes):>9} {iters:>5} {us(cd):>15} "
                        f"{us(gl):>10} {(f'{ratio:.2f}' if ratio else '-'):>8}")
                if args.sdk:
                    line += (f" {us(sdk):>12} "
                             f"{(f'{cd[0] / sdk[0]:.2f}' if cd and sdk else '-'):>7}")
                print(line + f" {check:>6}")
    sys.stdout.flush()
    print(f"# total {time.monotonic() - t_run:.0f} s", file=sys.stderr)
    for e in errors:
        print(f"\nFAILED: {e}", file=sys.stderr)
    if failed_check:
        print("\nFAILED: a result was wrong (see WRONG RESULT above)", file=sys.stderr)
    sys.exit(1 if errors or failed_check else 0)


def jax_version():
    try:
        out = subprocess.run([sys.executable, "-c", "import jax; print(jax.__version__)"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


if __name__ == "__main__":
    main()
