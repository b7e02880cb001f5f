"""Helpers of the SDK's tests: a daemon on a private socket (the `daemon`
fixture, re-exported by conftest.py) and member processes.

COLLECTIVED_BIN: the daemon binary (default build/daemon/collectived under
the repository root). Members run `python -c PRELUDE+code SOCK RANK N ...`
and print one JSON line of results (emit(...)).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TIMEOUT = 60  # seconds any member process may take


def _daemon_binary():
    raw = os.environ.get("COLLECTIVED_BIN", "build/daemon/collectived")
    path = Path(raw)
    return path if path.is_absolute() else REPO / raw


@pytest.fixture
def daemon():
    binary = _daemon_binary()
    if not binary.exists():
        pytest.skip(f"no daemon binary at {binary} (build it, or set COLLECTIVED_BIN)")
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "collectived.sock")
        log = open(os.path.join(d, "daemon.log"), "w")
        proc = subprocess.Popen([str(binary), f"--socket={sock}"], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            assert proc.poll() is None, open(log.name).read()
            assert time.monotonic() < deadline, "the daemon did not create its socket"
            time.sleep(0.02)
        try:
            yield sock
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


PRELUDE = textwrap.dedent("""
    import json, os, sys, time, asyncio
    import numpy as np
    import ml_dtypes
    import collectived
    SOCK, RANK, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def emit(**kw):
        print(json.dumps(kw), flush=True)
""")


def start(code, sock, n, rank, *extra):
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), sock, str(rank), str(n),
         *map(str, extra)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(proc, deadline=None):
    """(returncode, stdout, stderr) of a member; one still running at the
    deadline (time.monotonic(); default TIMEOUT from now) is killed."""
    if deadline is None:
        deadline = time.monotonic() + TIMEOUT
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n(member hung: killed)"
    return proc.returncode, out, err


def result(out):
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def finish(proc):
    rc, out, err = collect(proc)
    assert rc == 0, f"rc {rc}\n{out}\n{err}"
    return result(out)


def run_members(code, sock, n, *extra, extra_procs=(), timeout=TIMEOUT):
    """Runs n members, and beside them one process per (code, *args) of
    extra_procs (its RANK is n); every one must succeed within timeout seconds
    of the start (all their outputs shown if not). Their results, the extra
    processes' last."""
    procs = [start(code, sock, n, r, *extra) for r in range(n)]
    procs += [start(c, sock, n, n, *args) for c, *args in extra_procs]
    deadline = time.monotonic() + timeout
    done = [collect(p, deadline) for p in procs]
    if any(rc != 0 for rc, _, _ in done):
        pytest.fail("\n".join(f"--- process {r}: rc {rc}\n{out}{err}"
                              for r, (rc, out, err) in enumerate(done)))
    return [result(out) for _, out, _ in done]


def run_training_example(sock, processes, steps, *extra, timeout=300):
    """Runs examples/python/train_data_parallel.py against the daemon at
    sock; its logged losses, {step: {process: loss}}, as printed."""
    import re
    example = REPO / "examples/python/train_data_parallel.py"
    out = subprocess.run([sys.executable, str(example), f"--socket={sock}",
                          f"--processes={processes}", f"--steps={steps}", *extra],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    losses = {}
    for proc, step, loss in re.findall(r"\[process (\d+)\] step +(\d+) loss ([0-9.]+)",
                                       out.stdout):
        losses.setdefault(int(step), {})[int(proc)] = loss
    assert sorted(losses) == sorted({*range(0, steps, 10), steps - 1}), out.stdout
    for step, by_process in losses.items():
        assert sorted(by_process) == list(range(processes)), out.stdout
    return losses
