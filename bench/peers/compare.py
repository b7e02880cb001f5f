#!/usr/bin/env python3
"""compare.py: collectived against Open MPI and Gloo, in one table.

Runs, for every member count N, the three benchmarks that measure psum and
all_gather the same way (same sizes, same timing, same busbw factors; see
bench/README.md):

  collectived  collectived_perf --json ...                  (a private daemon)
  openmpi      mpirun -np N --oversubscribe --bind-to none [--allow-run-as-root]
               --mca btl self,vader mpi_perf --json ...
  gloo         gloo_perf --members N --json ...             (TCP on 127.0.0.1)

With --hosts H (H > 1) the comparison is across "hosts" on loopback:
collectived_perf --hosts=H (H daemons forming a cluster, the members spread
round robin over them, Gloo between the daemons), Open MPI with its TCP
transport (--mca btl self,tcp instead of self,vader: what it uses between
machines), and gloo_perf as always (TCP between the processes: Gloo's ring
allreduce between the same number of processes).

then merges their JSON rows by (op, members, bytes) and prints ONE table:
op, N, bytes, each system's median time (us) and bus bandwidth (GB/s), and for
each peer two ratios against collectived:

  <peer>/cd time    peer time_us / collectived time_us   (>1: collectived faster)
  cd/<peer> busbw   collectived busbw / peer busbw      (>1: collectived faster)

A peer that is not built is skipped with a note; a system that fails (nonzero
exit, a timeout, no rows) is reported and the others still print. Every
subprocess runs in its own process group with a timeout, and the whole group
is killed when it expires. Exit status: 0, or 1 when some system failed or a
check failed (the table is printed all the same), 2 for bad arguments.

GPU rows (--gpu-rows FILE...): no benchmark is run; the JSON rows that
bench/gpu_bench.sh writes (collectived_perf --device cuda, nccl_perf,
cuda_copy_perf) are read back and printed as one table, psum and all_gather
of K members on one GPU next to bare NCCL and the device's copy bandwidth,
with the efficiency against that copy bandwidth:

  moved GB/s   the least memory traffic of the op over its time: psum 2*K*S
               (K inputs of S bytes read, K outputs written), all_gather
               S + K*S (every tile read once, every output written)
  copy GB/s    cuda_copy_perf's best (memcpy or kernel) copy_gbps at S (2S per
               copy: S read + S written), else at the nearest measured size
  eff          moved GB/s / copy GB/s: 1.0 is the memory's copy ceiling

Only the Python 3 standard library is used.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SYSTEMS = ("collectived", "openmpi", "gloo")
PEERS = ("openmpi", "gloo")
SHORT = {"collectived": "cd", "openmpi": "mpi", "gloo": "gloo"}


# Options whose value is a command line of its own: `--collectived-args "--x=1"`
# is taken as `--collectived-args=--x=1` (argparse would read the value as an
# option).
PASSTHROUGH = ("--collectived-args", "--mpirun-args", "--gloo-args")


def join_passthrough(argv):
    out, i = [], 0
    while i < len(argv):
        if argv[i] in PASSTHROUGH and i + 1 < len(argv):
            out.append(argv[i] + "=" + argv[i + 1])
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def parse_args(argv):
    argv = join_passthrough(argv)
    p = argparse.ArgumentParser(
        description="Run collectived_perf, mpi_perf and gloo_perf and print one comparison table.")
    p.add_argument("--op", default="psum,all_gather", help="comma list of psum, all_gather")
    p.add_argument("--members", default="2,4", help="comma list of member counts (each >= 2)")
    p.add_argument("--min-bytes", default="8", help="smallest size (K, M, G suffixes)")
    p.add_argument("--max-bytes", default="64M", help="largest size (K, M, G suffixes)")
    p.add_argument("--step-factor", default="2", help="size multiplier between rows")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size")
    p.add_argument("--dtype", default="float32",
                   help="float32, float64, int32, uint32, int64 or uint64")
    p.add_argument("--no-check", action="store_true", help="pass --check=false to every benchmark")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma list of the systems to run (default: all three)")
    p.add_argument("--collectived-perf", default=os.path.join(REPO, "build", "bench", "collectived_perf"),
                   help="collectived_perf binary (default: build/bench/collectived_perf)")
    p.add_argument("--collectived-args", default="",
                   help="extra arguments for collectived_perf (one shell-quoted string)")
    p.add_argument("--mpi-perf", default=None,
                   help="mpi_perf binary (default: peers/mpi_perf next to collectived_perf)")
    p.add_argument("--gloo-perf", default=None,
                   help="gloo_perf binary (default: peers/gloo_perf next to collectived_perf)")
    p.add_argument("--mpirun", default="mpirun", help="mpirun command (default: mpirun)")
    p.add_argument("--mpirun-args", default="",
                   help="extra arguments for mpirun, before the program (one shell-quoted string)")
    p.add_argument("--gloo-args", default="", help="extra arguments for gloo_perf")
    p.add_argument("--timeout", type=float, default=1200,
                   help="seconds each benchmark run may take (default 1200)")
    p.add_argument("--hosts", type=int, default=1,
                   help="spread collectived's members over this many daemons of a loopback "
                        "cluster, and run Open MPI over TCP (default 1: one daemon, shared memory)")
    p.add_argument("--placement", choices=("round_robin", "runs"), default="round_robin",
                   help="with --hosts: collectived's member m on host m mod H (round_robin) or "
                        "m*H/N (runs: each host a contiguous run of members)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run every system this many rounds, the systems' order rotating "
                        "each round (within a round, each member count by every system in "
                        "turn); times are the median over rounds, ratios the median "
                        "of the rounds' ratios, each beside its worst round (this machine is "
                        "noisy: one round's ratio can be off by 40%%)")
    p.add_argument("--json-out", metavar="FILE", help="also write the merged rows to FILE as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as a Markdown table")
    p.add_argument("--gpu-rows", nargs="+", metavar="FILE",
                   help="run nothing: read the JSON rows of collectived_perf --device cuda, "
                        "nccl_perf and cuda_copy_perf from FILEs and print the GPU table with "
                        "the efficiency against the copy bandwidth")
    args = p.parse_args(argv)
    if args.gpu_rows:
        return args

    args.ops = [o.strip() for o in args.op.split(",") if o.strip()]
    for op in args.ops:
        if op not in ("psum", "all_gather"):
            p.error("--op: unknown op %r (psum, all_gather)" % op)
    try:
        args.member_counts = [int(m) for m in args.members.split(",") if m.strip()]
    except ValueError:
        p.error("--members: expected a comma list of integers")
    if not args.ops or not args.member_counts or min(args.member_counts) < 2:
        p.error("--op and --members must be non-empty; member counts must be at least 2")
    args.system_list = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in args.system_list:
        if s not in SYSTEMS:
            p.error("--systems: unknown system %r (%s)" % (s, ", ".join(SYSTEMS)))
    if args.hosts < 1:
        p.error("--hosts must be >= 1")
    if args.iters < 1 or args.warmup < 0 or args.timeout <= 0 or args.repeat < 1:
        p.error("--iters and --repeat must be >= 1, --warmup >= 0, --timeout > 0")
    peers_dir = os.path.join(os.path.dirname(os.path.abspath(args.collectived_perf)), "peers")
    if args.mpi_perf is None:
        args.mpi_perf = os.path.join(peers_dir, "mpi_perf")
    if args.gloo_perf is None:
        args.gloo_perf = os.path.join(peers_dir, "gloo_perf")
    return args


def common_flags(args):
    """The flags every benchmark takes, identically."""
    flags = ["--json", "--op=" + ",".join(args.ops), "--dtype=" + args.dtype,
             "--min-bytes=" + args.min_bytes, "--max-bytes=" + args.max_bytes,
             "--step-factor=" + args.step_factor, "--iters=%d" % args.iters,
             "--warmup=%d" % args.warmup]
    if args.no_check:
        flags.append("--check=false")
    return flags


def executable(path):
    return path is not None and os.path.isfile(path) and os.access(path, os.X_OK)


def stop_group(proc):
    """Stops proc's whole process group (mpirun and its ranks, a daemon, members):
    SIGTERM, then SIGKILL after 5 s. Returns what proc wrote until then."""
    out, err = "", ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    return out or "", err or ""


def run(cmd, timeout):
    """Runs cmd in its own process group; returns (rc or None on timeout, stdout, stderr, secs)."""
    print("compare.py: running: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    except OSError as e:
        return 127, "", "cannot start %s: %s" % (cmd[0], e), 0.0
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - start
    except subprocess.TimeoutExpired:
        out, err = stop_group(proc)
        return None, out, err, time.monotonic() - start
    except KeyboardInterrupt:
        stop_group(proc)  # its own session does not get the terminal's ^C
        raise


def json_rows(lines):
    """The JSON objects among `lines` (one per line; other lines skipped)."""
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def parse_rows(stdout, system):
    rows = []
    for row in json_rows(stdout.splitlines()):
        row["system"] = system
        rows.append(row)
    return rows


def tail(text, lines=6):
    """The benchmark's own messages ("gloo_perf: ...") if any, else the last lines."""
    all_lines = [l.strip() for l in text.splitlines() if l.strip()]
    own = [l for l in all_lines if l.split(":", 1)[0] in
           ("collectived_perf", "mpi_perf", "gloo_perf", "nccl_perf", "cuda_copy_perf")]
    return " | ".join((own or all_lines)[-lines:])


def run_system(system, args, notes, member_counts):
    """Runs one system for each of member_counts; returns its rows and whether all went well."""
    flags = common_flags(args)
    if system == "collectived":
        binary = args.collectived_perf
    elif system == "openmpi":
        binary = args.mpi_perf
    else:
        binary = args.gloo_perf
    if not executable(binary):
        notes.append("%s skipped: %s is not built" % (system, binary))
        return [], system != "collectived"  # a missing peer is a note, a missing collectived a failure
    if system == "openmpi" and shutil.which(args.mpirun) is None:
        notes.append("openmpi skipped: %s not found" % args.mpirun)
        return [], True
    rows, ok = [], True
    for n in member_counts:
        if system == "collectived":
            cmd = [binary, "--members=%d" % n] + flags + shlex.split(args.collectived_args)
            if args.hosts > 1:
                cmd += ["--hosts=%d" % args.hosts, "--placement=" + args.placement]
        elif system == "openmpi":
            cmd = [args.mpirun, "-np", str(n), "--oversubscribe", "--bind-to", "none"]
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
            btl = "self,tcp" if args.hosts > 1 else "self,vader"
            cmd += ["--mca", "btl", btl] + shlex.split(args.mpirun_args) + [binary] + flags
        else:
            cmd = [binary, "--members=%d" % n] + flags + shlex.split(args.gloo_args)
        rc, out, err, secs = run(cmd, args.timeout)
        got = parse_rows(out, system)
        rows += got
        if rc is None:
            ok = False
            notes.append("%s N=%d: timed out after %g s (%d rows kept): %s"
                         % (system, n, args.timeout, len(got), tail(err) or "no output"))
        elif rc != 0:
            ok = False
            notes.append("%s N=%d: exit status %d (%d rows kept): %s"
                         % (system, n, rc, len(got), tail(err) or "no output"))
        elif not got:
            ok = False
            notes.append("%s N=%d: no rows: %s" % (system, n, tail(err) or "no output"))
        else:
            print("compare.py: %s N=%d: %d rows in %.1f s" % (system, n, len(got), secs),
                  file=sys.stderr, flush=True)
    return rows, ok


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def busbw(row):
    """Bus bandwidth in GB/s recomputed from bytes and time_us, unrounded (the JSON
    rows round to 1e-6 GB/s, which is 0 for the smallest sizes)."""
    if row is None or not row.get("time_us"):
        return None
    n = int(row["members"])
    factor = 2.0 * (n - 1) / n if row["op"] == "psum" else (n - 1) / n
    return row["bytes"] / (row["time_us"] * 1e3) * factor


def merge(all_rows, systems):
    """Rows by (op, members, bytes), with each system's row and the ratios."""
    merged = {}
    op_order = {}
    for r in all_rows:
        key = (r["op"], int(r["members"]), int(r["bytes"]))
        op_order.setdefault(r["op"], len(op_order))
        m = merged.setdefault(key, {"op": r["op"], "members": key[1], "bytes": key[2],
                                    "count": r.get("count"), "dtype": r.get("dtype"),
                                    "systems": {}})
        m["systems"][r["system"]] = {k: v for k, v in r.items() if k != "system"}
    for m in merged.values():
        cd = m["systems"].get("collectived")
        m["ratios"] = {}
        for peer in PEERS:
            p = m["systems"].get(peer)
            if peer not in systems:
                continue
            m["ratios"][peer] = {
                "time_peer_over_collectived": ratio(p and p["time_us"], cd and cd["time_us"]),
                "busbw_collectived_over_peer": ratio(busbw(cd), busbw(p)),
            }
    keys = sorted(merged, key=lambda k: (op_order[k[0]], k[1], k[2]))
    return [merged[k] for k in keys]


def median(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def combine_rounds(rounds, systems):
    """One merged list from the merged lists of several rounds: each system's row
    with the median time over rounds (busbw from it), each ratio the median of the
    rounds' ratios, with the rounds' values in "rounds"."""
    if len(rounds) == 1:
        return rounds[0]
    by_key = {}
    order = []
    for merged in rounds:
        for m in merged:
            key = (m["op"], m["members"], m["bytes"])
            if key not in by_key:
                order.append(key)
            by_key.setdefault(key, []).append(m)
    out = []
    for key in order:
        ms = by_key[key]
        c = {k: v for k, v in ms[0].items() if k not in ("systems", "ratios")}
        c["systems"] = {}
        for s in systems:
            rows = [m["systems"][s] for m in ms if s in m["systems"]]
            if not rows:
                continue
            row = dict(rows[0])
            row["time_us"] = median(r["time_us"] for r in rows)
            row["busbw_gbps"] = busbw(row)
            if any(r.get("check") == "fail" for r in rows):
                row["check"] = "fail"
            row["rounds_time_us"] = [r["time_us"] for r in rows]
            c["systems"][s] = row
        c["ratios"] = {}
        for peer in ms[0]["ratios"]:
            c["ratios"][peer] = {}
            for name in ("time_peer_over_collectived", "busbw_collectived_over_peer"):
                values = [m["ratios"][peer][name] for m in ms if peer in m["ratios"]]
                c["ratios"][peer][name] = median(values)
                c["ratios"][peer][name + "_rounds"] = values
        out.append(c)
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def fmt_ratio(v):
    """Three significant digits for small ratios (0.00456), two decimals above 1."""
    if v is None:
        return "-"
    if v >= 100:
        return "%.0f" % v
    if v >= 1:
        return "%.2f" % v
    return "%.3g" % v


def worst_round(rr, name):
    """The ratio of the round that went worst for collectived (the smallest), or
    None with fewer than two rounds."""
    values = [v for v in rr.get(name + "_rounds", []) if v is not None]
    return min(values) if len(values) > 1 else None


def slowest_round(r):
    """A system's slowest round's time in a merged row, or None."""
    times = [t for t in (r or {}).get("rounds_time_us", []) if t is not None]
    return max(times) if times else None


def slow_to_slow(m, peer):
    """The peer's slowest round's time over collectived's (> 1: collectived's
    worst round is faster than the peer's), or None with fewer than two
    rounds of either."""
    cd, pr = m["systems"].get("collectived"), m["systems"].get(peer)
    if any(len((r or {}).get("rounds_time_us", [])) < 2 for r in (cd, pr)):
        return None
    a, b = slowest_round(cd), slowest_round(pr)
    return b / a if a and b else None


def build_table(merged, systems, rounds=1):
    """The table's header and lines. With several rounds each ratio has two
    columns, the median of the rounds' ratios and the worst round's (the
    smallest), each system's time a second, its slowest round, and each peer
    a `slow:slow` column, its slowest round's time over collectived's: a run
    that lands in a slow mode in some rounds shows there, not hidden by the
    median. A round's ratio pairs two runs made one after the other, each of
    which may land in a slow mode of the machine on its own (bench/README,
    "Caveats"); slow:slow compares each system's worst with the other's."""
    header = ["op", "N", "bytes"]
    several = rounds > 1
    for s in systems:
        header += ["%s us" % SHORT[s]]
        if several:
            header += ["%s us worst" % SHORT[s]]
        header += ["%s busbw" % SHORT[s]]
    ratio_peers = [p for p in PEERS if p in systems] if "collectived" in systems else []
    names = (("time_peer_over_collectived", "%s/cd time"),
             ("busbw_collectived_over_peer", "cd/%s busbw"))
    for p in ratio_peers:
        for _, label in names:
            header += [label % SHORT[p]]
            if several:
                header += ["worst"]
        if several:
            header += ["%s slow:slow" % SHORT[p]]
    body = []
    failed_checks = False
    for m in merged:
        line = [m["op"], str(m["members"]), str(m["bytes"])]
        for s in systems:
            r = m["systems"].get(s)
            mark = ""
            if r is not None and r.get("check") == "fail":
                mark = "!"
                failed_checks = True
            line += [fmt(r and r["time_us"], ".2f") + mark]
            if several:
                line += [fmt(slowest_round(r), ".2f")]
            line += [fmt(r and r["busbw_gbps"], ".3f")]
        for p in ratio_peers:
            rr = m["ratios"][p]
            for name, _ in names:
                line += [fmt_ratio(rr[name])]
                if several:
                    line += [fmt_ratio(worst_round(rr, name))]
            if several:
                line += [fmt_ratio(slow_to_slow(m, p))]
        body.append(line)
    return header, body, failed_checks


def print_table(header, body, markdown):
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
        for line in body:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(header[i]), *(len(l[i]) for l in body)) if body else len(header[i])
              for i in range(len(header))]
    def row(cells):
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                         for i, c in enumerate(cells))
    print(row(header))
    print(row(["-" * w for w in widths]))
    prev_group = None
    for line in body:
        group = (line[0], line[1])
        if prev_group is not None and group != prev_group:
            print()
        prev_group = group
        print(row(line))


# --- GPU rows ----------------------------------------------------------------

COPY_SYSTEMS = ("cuda_memcpy", "cuda_kernel")


def read_gpu_rows(paths):
    """JSON rows from files; a row without "system" is collectived_perf's."""
    rows = []
    for path in paths:
        with open(path) as f:
            for row in json_rows(f):
                row.setdefault("system", "collectived")
                rows.append(row)
    return rows


def min_traffic(op, k, size):
    """The least bytes an op of k members on one device reads plus writes."""
    if op == "psum":
        return 2 * k * size
    if op == "all_gather":
        return size + k * size
    return None


def copy_ceiling(copy_rows, size):
    """The best copy bandwidth (GB/s, read + write) at `size`, else at the nearest size."""
    if not copy_rows:
        return None, None
    sizes = sorted({int(r["bytes"]) for r in copy_rows})
    near = min(sizes, key=lambda s: abs(s - size) / max(s, size))
    best = max(float(r.get("copy_gbps") or 0) for r in copy_rows if int(r["bytes"]) == near)
    return best, near


def gpu_table(rows, target_bytes=64 << 20):
    cd = [r for r in rows if r["system"] == "collectived"]
    nccl = {(r["op"], int(r["bytes"])): r for r in rows if r["system"] == "nccl"}
    copies = [r for r in rows if r["system"] in COPY_SYSTEMS]
    header = ["op", "K", "bytes", "cd us", "cd busbw", "moved GB/s", "copy GB/s", "eff",
              "nccl n", "nccl us", "nccl busbw"]
    body, out, failed = [], [], False
    op_order = {}
    for r in cd:
        op_order.setdefault(r["op"], len(op_order))
    for r in sorted(cd, key=lambda r: (op_order[r["op"]], int(r["members"]), int(r["bytes"]))):
        k, size, us = int(r["members"]), int(r["bytes"]), float(r["time_us"])
        traffic = min_traffic(r["op"], k, size)
        moved = traffic / (us * 1e3) if traffic is not None and us > 0 else None
        ceiling, at = copy_ceiling(copies, size)
        eff = moved / ceiling if moved is not None and ceiling else None
        n = nccl.get((r["op"], size))
        mark = "!" if r.get("check") == "fail" else ""
        failed = failed or bool(mark) or (n is not None and n.get("check") == "fail")
        body.append([r["op"], str(k), str(size), fmt(us, ".2f") + mark,
                     fmt(r.get("busbw_gbps"), ".3f"), fmt(moved, ".1f"), fmt(ceiling, ".1f"),
                     fmt(eff, ".3f"), fmt(n and n["members"], "d"), fmt(n and n["time_us"], ".2f"),
                     fmt(n and n["busbw_gbps"], ".3f")])
        out.append({"op": r["op"], "members": k, "bytes": size, "device": r.get("device"),
                    "time_us": us, "moved_bytes": traffic, "moved_gbps": moved,
                    "copy_gbps": ceiling, "copy_bytes": at, "efficiency": eff,
                    "target_row": r["op"] == "psum" and size >= target_bytes,
                    "collectived": r, "nccl": n})
    return header, body, out, failed


def gpu_main(args):
    rows = read_gpu_rows(args.gpu_rows)
    header, body, out, failed = gpu_table(rows)
    title = ("GPU rows: K members' buffers on one GPU (collectived_perf --device cuda), bare NCCL "
             "(nccl_perf, n ranks = visible GPUs) and the copy ceiling (cuda_copy_perf); "
             "us = median; GB/s = 1e9 B/s")
    print(title + "\n" if args.markdown else "# " + title)
    if body:
        print_table(header, body, args.markdown)
    else:
        print("(no collectived rows in %s)" % " ".join(args.gpu_rows))
    notes = ["moved GB/s = least traffic / time: psum 2*K*S, all_gather S + K*S; copy GB/s = "
             "best device copy at S counting read + write (2S); eff = moved / copy",
             "the target rows are psum with S >= 64 MiB"]
    if any(r["system"] == "nccl" and int(r["members"]) == 1 for r in rows):
        notes.append("nccl n = 1: one GPU, so NCCL runs its single-rank path (a local copy of "
                     "the input); busbw is 0 by definition, compare its time")
    target = [o for o in out if o["target_row"] and o["efficiency"] is not None]
    if target:
        notes.append("psum >= 64 MiB: efficiency min %.3f, max %.3f over %d rows"
                     % (min(o["efficiency"] for o in target), max(o["efficiency"] for o in target),
                        len(target)))
    if failed:
        notes.append("! marks a row whose result check failed")
    print()
    for n in notes:
        print(("- " if args.markdown else "note: ") + n)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"notes": notes, "rows": out,
                       "copy": [r for r in rows if r["system"] in COPY_SYSTEMS]}, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


def main(argv):
    args = parse_args(argv)
    if args.gpu_rows:
        return gpu_main(args)
    notes = []
    round_rows = []
    ran = []
    all_ok = True
    for r in range(args.repeat):
        rows_now = []
        # Each round starts with the next system, so none always runs first,
        # and the systems run one member count after the other: the runs a
        # ratio compares are next to each other in time (this machine's
        # speed drifts over seconds).
        k = r % len(args.system_list)
        for n in args.member_counts:
            for system in args.system_list[k:] + args.system_list[:k]:
                rows, ok = run_system(system, args, notes, [n])
                all_ok = all_ok and ok
                if rows:
                    rows_now += rows
                    if system not in ran:
                        ran.append(system)
        round_rows.append(rows_now)
    systems = [s for s in SYSTEMS if s in ran]
    merged = combine_rounds([merge(rows, systems) for rows in round_rows], systems)
    header, body, failed_checks = build_table(merged, systems, args.repeat)

    title = ("%s, dtype %s, members %s, %s..%s B, iters %d, warmup %d; us = median over "
             "iterations of the slowest member's time; busbw in GB/s"
             % (",".join(args.ops), args.dtype, ",".join(map(str, args.member_counts)),
                args.min_bytes, args.max_bytes, args.iters, args.warmup))
    if args.repeat > 1:
        title += ("; %d rounds: us = median over rounds, ratios = median of the rounds' "
                  "ratios; worst = the round slowest for collectived (the smallest "
                  "ratio); us worst = a system's slowest round; slow:slow = the peer's "
                  "slowest round's time over collectived's" % args.repeat)
    if args.markdown:
        print(title + "\n")
    else:
        print("# " + title)
    if body:
        print_table(header, body, args.markdown)
    else:
        print("(no rows: no system produced results)")
    if "collectived" in systems and len(systems) > 1:
        notes.insert(0, "ratios: <peer>/cd time = peer time / collectived time and cd/<peer> busbw "
                        "= collectived busbw / peer busbw; > 1 means collectived is faster")
    if failed_checks:
        notes.append("! marks a row whose result check failed")
    notes = list(dict.fromkeys(notes))  # a system skipped says so once, not per member count
    if notes:
        print()
        for n in notes:
            print(("- " if args.markdown else "note: ") + n)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"config": {"ops": args.ops, "members": args.member_counts,
                                  "dtype": args.dtype, "min_bytes": args.min_bytes,
                                  "max_bytes": args.max_bytes, "step_factor": args.step_factor,
                                  "iters": args.iters, "warmup": args.warmup,
                                  "repeat": args.repeat,
                                  "systems": systems},
                       "notes": notes, "rows": merged}, f, indent=1)
            f.write("\n")
    return 0 if all_ok and not failed_checks else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
