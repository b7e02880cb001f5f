"""The Python SDK against a real daemon, with members in separate processes.

Each test starts the daemon (COLLECTIVED_BIN, default build/daemon/collectived)
on a private socket and runs member processes (`python -c MEMBER ...`) that
import the collectived package from PYTHONPATH (the build tree's
<build>/python, or an installed package) and print one JSON line of results.

  PYTHONPATH=build/python COLLECTIVED_BIN=build/daemon/collectived \
    python3 -m pytest -q client/python/tests
"""

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from members import PRELUDE, finish, run_members, start

EVERY_OP = """
    # A 2x2 mesh; member (d, m) holds x = base + 10*d + m (values exact in
    # every dtype, sums included), and checks each op against numpy.
    dt = np.dtype(getattr(ml_dtypes, sys.argv[4], None) or sys.argv[4])
    with collectived.connect(name=f"m{RANK}", socket=SOCK) as c:
        mesh = c.join_mesh("every-op", {"data": 2, "model": 2},
                           coordinate=[RANK // 2, RANK % 2], timeout=30, op_timeout=20)
        d, m = mesh.axis_index("data"), mesh.axis_index("model")
        assert (d, m) == (RANK // 2, RANK % 2) and mesh.axis_size(("data", "model")) == 4
        boolean = dt == np.bool_
        def value(dd, mm):
            if boolean:
                return np.array([dd == 1, mm == 1, dd == mm, True, False, dd == 0])
            return (np.arange(6) % 3 + 10 * dd + mm).astype(dt)
        def group(axis):  # the values of my group along `axis`, in group order
            return [value(i, m) for i in range(2)] if axis == "data" else \\
                   [value(d, i) for i in range(2)]
        def same(a, b):
            assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
            assert a.tobytes() == b.tobytes(), (a, b)
        wide = np.float64 if dt.kind == "f" or dt.name.startswith(("bfloat", "float8")) else None
        def reduce(fn, vals):
            if boolean:  # psum counts (int32, as JAX); pmax/pmin are or/and
                if fn == "sum":
                    return np.sum(np.stack(vals).astype(np.int32), axis=0).astype(np.int32)
                return {"max": np.logical_or, "min": np.logical_and}[fn].reduce(vals)
            acc = np.stack([v.astype(wide or v.dtype) for v in vals])
            return getattr(acc, fn)(axis=0).astype(dt)

        x = mesh.zeros((6,), dt); x[:] = value(d, m)
        s = mesh.psum(x, "data")
        assert (s is x) != boolean   # in place unless the dtype changes
        same(s, reduce("sum", group("data")))
        for fn, op in (("max", mesh.pmax), ("min", mesh.pmin)):
            x[:] = value(d, m)
            same(op(x, "model", inplace=False), reduce(fn, group("model")))
            same(x, value(d, m))  # inplace=False leaves x alone
        # Both axes: every member's value.
        every = [value(i, j) for i in range(2) for j in range(2)]
        x[:] = value(d, m)
        same(mesh.psum(x, ("data", "model")), reduce("sum", every))
        # pmean: floats keep their dtype; integers and bool give floats.
        x[:] = value(d, m)
        mean_dt = dt if dt.kind == "f" or wide else \
            np.dtype(np.float64 if dt.itemsize == 8 else np.float32)
        mean = np.stack([v.astype(np.float64) for v in group("data")]).mean(0)
        same(mesh.pmean(x, "data"), mean.astype(mean_dt))
        # all_gather, stacked and tiled, into new arrays.
        x[:] = value(d, m)
        same(mesh.all_gather(x, "data"), np.stack(group("data")))
        same(mesh.all_gather(x, "model", tiled=True), np.concatenate(group("model")))
        # ppermute: a shift along data; broadcast from model index 1.
        same(mesh.ppermute(value(d, m), "data", [(0, 1), (1, 0)]), value(1 - d, m))
        same(mesh.broadcast(value(d, m), "model", 1), value(d, 1))
        # psum_scatter (tiled over the 6 elements, 3 each) and all_to_all.
        if boolean:  # as in JAX
            try:
                mesh.psum_scatter(value(d, m), "data", tiled=True)
                raise AssertionError("psum_scatter of bool did not fail")
            except collectived.InvalidArgument:
                pass
        else:
            same(mesh.psum_scatter(value(d, m), "data", tiled=True),
                 reduce("sum", group("data"))[3 * d:3 * d + 3])
            same(mesh.psum_scatter(value(d, m).reshape(2, 3), "data"),
                 reduce("sum", group("data")).reshape(2, 3)[d])
        y = value(d, m).reshape(2, 3)
        got = mesh.all_to_all(y, "model", 0, 0, tiled=True)
        same(got, np.concatenate([group("model")[i].reshape(2, 3)[m:m + 1] for i in range(2)]))
        mesh.barrier()
    emit(ok=True)
"""


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "uint8",
                                   "int32", "uint32", "int64", "uint64", "bool",
                                   "float8_e4m3fn", "float8_e5m2"])
def test_every_op_and_dtype_matches_numpy(daemon, dtype):
    assert run_members(EVERY_OP, daemon, 4, dtype) == [{"ok": True}] * 4


def test_arrays_are_the_shared_buffer(daemon):
    code = """
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("zero-copy", {"i": 2}, coordinate=[RANK], timeout=30)
            raw = c.buffer(4096)
            x = raw[1024:1024 + 64].view(np.float32)  # part of a buffer
            x[:] = RANK + 1
            y = mesh.psum(x, "i")
            found = collectived._locate(x, c)   # the registry knows where x lies
            emit(same=y is x, shares=bool(np.shares_memory(y, raw)), value=float(x[0]),
                 base_is_buffer=found is not None and found[1] == 1024,
                 fresh_shares=bool(np.shares_memory(mesh.psum(x, "i", inplace=False), x)))
    """
    for r in run_members(code, daemon, 2):
        assert r == {"same": True, "shares": True, "value": 3.0, "base_is_buffer": True,
                     "fresh_shares": False}


def test_a_shared_output_is_written_once_for_the_mesh(daemon):
    code = """
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("shared-out", {"i": 4}, coordinate=[RANK], timeout=30)
            x = c.empty(256, np.float32)
            x[:] = np.arange(256, dtype=np.float32) * (RANK + 1)
            total = mesh.shared_zeros(256, np.float32)
            gathered = mesh.shared_zeros((4, 256), np.float32)
            y = mesh.psum(x, None, out=total)
            g = mesh.all_gather(x, None, out=gathered)
            mesh.barrier()
            try:
                mesh.ppermute(x, None, [(0, 1), (1, 0)], out=total)
                refused = ""
            except collectived.FailedPrecondition as e:
                refused = str(e)
            emit(same=y is total, psum=total[:4].tolist(), g=bool(g is gathered),
                 rows=[float(r[1]) for r in gathered], refused="different results" in refused,
                 member_side=mesh.member_side_status)
    """
    for r in run_members(code, daemon, 4):
        assert r == {"same": True, "psum": [0.0, 10.0, 20.0, 30.0], "g": True,
                     "rows": [1.0, 2.0, 3.0, 4.0], "refused": True, "member_side": None}


def test_arrays_from_elsewhere_are_staged(daemon):
    code = """
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("staged", {"i": 2}, coordinate=[RANK], timeout=30)
            plain = np.full((3, 4), RANK + 1, np.int32)
            out = mesh.psum(plain, "i")                       # written back in place
            strided = np.arange(20, dtype=np.float64)[::2]      # not contiguous
            s = mesh.psum(strided, "i")
            ro = np.arange(5, dtype=np.float32); ro.flags.writeable = False
            r = mesh.psum(ro, "i")                              # a new array
            lst = mesh.pmax([RANK, 10 - RANK], "i")             # a list
            emit(inplace=out is plain, plain=plain.tolist(), strided=s.tolist(),
                 ro_new=r is not ro, ro=r.tolist(), ro_unchanged=ro.tolist(), lst=lst.tolist())
    """
    for r in run_members(code, daemon, 2):
        assert r["inplace"] and r["plain"] == [[3] * 4] * 3
        assert r["strided"] == [2.0 * v for v in range(0, 20, 2)]
        assert r["ro_new"] and r["ro"] == [0.0, 2.0, 4.0, 6.0, 8.0]
        assert r["ro_unchanged"] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert r["lst"] == [1, 10]


def test_futures_and_asyncio(daemon):
    code = """
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("async", {"i": 2}, coordinate=[RANK], timeout=30)
            xs = [mesh.zeros((4,), np.int64) for _ in range(8)]
            for k, x in enumerate(xs):
                x[:] = k + RANK
            futs = [mesh.psum_async(x, "i") for x in xs]
            sums = [int(f.result(timeout=20)[0]) for f in futs]
            async def main():
                a = mesh.zeros((2,), np.float32); a[:] = RANK
                fut = mesh.pmax_async(a, "i")
                got = await fut
                return fut.done(), float(got[0])
            done, top = asyncio.run(main())
            seqs = [f.sequence for f in futs]
            # Where the time went (the fast path): every stage a CPU op
            # reaches, in order; no launch and no device time.
            t = futs[-1].timing
            stages = [t[k] for k in ("submitted_ns", "taken_ns", "matched_ns", "ready_ns",
                                     "started_ns", "executed_ns", "completed_ns", "reaped_ns")]
            emit(sums=sums, done=done, top=top, ordered=seqs == sorted(seqs),
                 stages_in_order=stages == sorted(stages) and stages[0] > 0,
                 gpu_stages=(t["launched_ns"], t["device_ns"]))
    """
    for r in run_members(code, daemon, 2):
        assert r == {"sums": [2 * k + 1 for k in range(8)], "done": True, "top": 1.0,
                     "ordered": True, "stages_in_order": True, "gpu_stages": [0, 0]}


def test_errors_are_typed_exceptions(daemon):
    code = """
        errors = {}
        def expect(name, fn):
            try:
                fn()
                errors[name] = "no error"
            except collectived.Error as e:
                errors[name] = [type(e).__name__, e.code, isinstance(e, collectived.Error)]
        expect("connect", lambda: collectived.connect(socket=SOCK + ".none", connect_timeout=0.2))
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("errors", {"i": 2}, coordinate=[RANK], timeout=30, op_timeout=1)
            x = mesh.zeros((4,), np.float32)
            expect("axis", lambda: mesh.psum(x, "nope"))
            expect("axis_index", lambda: mesh.axis_index("nope"))
            expect("dtype", lambda: mesh.psum(np.zeros(2, np.int16), "i"))
            expect("join_shape", lambda: c.join_mesh("errors", {"i": 3}, timeout=1))
            if RANK == 0:
                t = time.monotonic()
                expect("deadline", lambda: mesh.psum(x, "i"))   # member 1 never submits
                errors["deadline_s"] = time.monotonic() - t
            else:
                time.sleep(3)   # past member 0's op timeout, then leave
        # Ops on a closed client fail, they do not crash.
        expect("closed", lambda: mesh.psum(x, "i"))
        emit(**errors)
    """
    r0, r1 = run_members(code, daemon, 2)
    assert r0["connect"] == ["Unavailable", 14, True]
    assert r0["axis"][0] == "InvalidArgument" and r0["axis_index"][0] == "InvalidArgument"
    assert r0["dtype"][0] == "InvalidArgument"
    assert r0["join_shape"] != "no error"
    assert r0["deadline"] == ["DeadlineExceeded", 4, True] and r0["deadline_s"] < 10
    assert r0["closed"][0] == "FailedPrecondition"
    assert r1["closed"][0] == "FailedPrecondition"


def test_a_member_that_dies_aborts_the_others(daemon):
    code = """
        c = collectived.connect(socket=SOCK)
        mesh = c.join_mesh("dies", {"i": 2}, coordinate=[RANK], timeout=30, op_timeout=30)
        if RANK == 1:
            os._exit(0)   # no leave, no close: the daemon sees the process go
        t = time.monotonic()
        try:
            mesh.psum(mesh.zeros((4,), np.float32), "i")
            emit(error=None)
        except collectived.Error as e:
            emit(error=type(e).__name__, message=e.message, s=time.monotonic() - t)
    """
    r0, _ = run_members(code, daemon, 2)
    assert r0["error"] == "Aborted", r0
    assert r0["s"] < 10


def test_ctrl_c_interrupts_a_wait(daemon):
    # A small psum in place runs among the members: Ctrl-C while member 0
    # waits there gives the op up, and the mesh breaks for member 1 too.
    code = """
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("sigint", {"i": 2}, coordinate=[RANK], timeout=30, op_timeout=60)
            x = mesh.zeros((4,), np.float32)
            if RANK == 1:
                sys.stdin.readline()   # until member 0 was interrupted
                try:
                    mesh.psum(x, "i")
                    emit(error=None)
                except collectived.Error as e:
                    emit(error=type(e).__name__, message=e.message)
                sys.exit(0)
            print("waiting", flush=True)
            t = time.monotonic()
            try:
                mesh.psum(x, "i")
                emit(interrupted=False)
            except KeyboardInterrupt:
                s = time.monotonic() - t
                try:
                    mesh.psum(x, "i")
                    after = None
                except collectived.Error as e:
                    after = type(e).__name__
                emit(interrupted=True, s=s, after=after)
    """
    waiter = start(code, daemon, 2, 0)
    other = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), daemon, "1", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        sent = time.monotonic()
        waiter.send_signal(signal.SIGINT)
        r = finish(waiter)
        assert time.monotonic() - sent < 5
        assert r["interrupted"] is True, r
        assert r["after"] == "Aborted", r
        other.stdin.write("go\n")
        other.stdin.flush()
        r1 = finish(other)
        assert r1["error"] == "Aborted", r1
        assert "member 0 was interrupted" in r1["message"], r1
    finally:
        other.kill()
        other.communicate()


def test_objects_may_die_in_any_order_and_dropped_buffers_are_freed(daemon):
    code = """
        c = collectived.connect(socket=SOCK)
        mesh = c.join_mesh("gc", {"i": 1}, timeout=30)
        for _ in range(3):
            c.buffer(1 << 20)                # dropped at once
        # Each allocation frees what was dropped before it: one is left.
        freed = [c.collect(), c.collect()]
        x = mesh.zeros((8,), np.float32)
        x[:] = 2
        keep = x[2:4]
        del x
        # The client goes first, then the mesh; the view stays readable.
        c.close()
        del c
        import gc; gc.collect()
        value = float(keep[0])
        try:
            mesh.psum(keep, "i")
            after = "no error"
        except collectived.Error as e:
            after = type(e).__name__
        del mesh
        emit(freed=freed, value=value, after=after)
    """
    (r,) = run_members(code, daemon, 1)
    assert r == {"freed": [1, 0], "value": 2.0, "after": "FailedPrecondition"}


def test_help_reads_well():
    import importlib
    collectived = importlib.import_module("collectived")
    for name in ("psum", "pmean", "all_gather", "ppermute", "psum_scatter", "all_to_all",
                 "broadcast", "barrier", "axis_index", "axis_size"):
        assert getattr(collectived.Mesh, name).__doc__, name
    assert "psum" in collectived.__doc__
    assert issubclass(collectived.DeadlineExceeded, collectived.Error)
    assert issubclass(collectived.DeadlineExceeded, TimeoutError)


def test_dlpack_in_and_out(daemon):
    code = """
        class Foreign:   # a tensor type numpy knows only through DLPack
            def __init__(self, a):
                self.a = a
            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)
            def __dlpack_device__(self):
                return self.a.__dlpack_device__()
        with collectived.connect(socket=SOCK) as c:
            mesh = c.join_mesh("dlpack", {"i": 2}, coordinate=[RANK], timeout=30)
            backing = np.full(4, RANK + 1, np.float32)
            got = mesh.psum(Foreign(backing), "i")     # in: viewed, staged, written back
            x = mesh.zeros((4,), np.float32)
            x[:] = 5
            view = np.from_dlpack(x)                   # out: the shared memory itself
            mesh.psum(x, "i")
            emit(got=got.tolist(), backing=backing.tolist(), view=view.tolist(),
                 shares=bool(np.shares_memory(view, x)))
    """
    for r in run_members(code, daemon, 2):
        assert r == {"got": [3.0] * 4, "backing": [3.0] * 4, "view": [10.0] * 4, "shares": True}


def test_what_a_careful_user_tries(daemon):
    code = """
        r = {}
        with collectived.connect(socket=SOCK) as c, collectived.connect(socket=SOCK) as other:
            mesh = c.join_mesh("careful", {"i": 2}, coordinate=[RANK], timeout=30, op_timeout=20)
            # Polling done() alone sees a fast-path op complete.
            x = mesh.zeros((4,), np.float32); x[:] = 1
            f = mesh.psum_async(x, "i")
            t = time.monotonic()
            while not f.done():
                assert time.monotonic() - t < 20, "done() never became true"
            r["polled"] = f.result(timeout=0)[0].item()
            # A read-only array in a shared buffer is not written.
            y = mesh.zeros((2,), np.int32); y[:] = 3; y.flags.writeable = False
            z = mesh.psum(y, "i")
            r["readonly"] = [y.tolist(), z.tolist(), z is y]
            # Another client's shared array is staged, not named to this session.
            w = other.zeros((3,), np.float64); w[:] = RANK
            r["other_client"] = mesh.pmax(w, "i").tolist()
            # Foreign byte order is refused, not misread.
            try:
                mesh.psum(np.ones(2, ">f4"), "i")
                r["big_endian"] = "no error"
            except collectived.InvalidArgument as e:
                r["big_endian"] = "InvalidArgument"
            # A local wait that runs out is TimeoutError, not the op's error.
            # Member 1 submits its psum only once member 0's wait ran out
            # (told by a file beside the daemon's socket), however slow
            # the machine.
            go = os.path.join(os.path.dirname(SOCK), "careful-late-go")
            if RANK == 0:
                late = mesh.psum_async(mesh.zeros((1,), np.float32), "i")
                try:
                    late.result(timeout=0.05)
                    r["wait"] = "no error"
                except collectived.Error:
                    r["wait"] = "collectived.Error"
                except TimeoutError:
                    r["wait"] = "TimeoutError"
                open(go, "w").close()
                mesh.barrier()
                r["late"] = late.result(timeout=20).tolist()
            else:  # the same ops, the psum late
                t = time.monotonic()
                while not os.path.exists(go) and time.monotonic() - t < 20:
                    time.sleep(0.01)
                mesh.psum(mesh.zeros((1,), np.float32), "i")
                mesh.barrier()
        emit(**r)
    """
    r0, r1 = run_members(code, daemon, 2)
    for r in (r0, r1):
        assert r["polled"] == 2.0
        assert r["readonly"] == [[3, 3], [6, 6], False]
        assert r["other_client"] == [1.0, 1.0, 1.0]
        assert r["big_endian"] == "InvalidArgument"
    assert r0["wait"] == "TimeoutError" and r0["late"] == [0.0]


def test_version_and_docstrings():
    import inspect
    import re
    import collectived
    from pathlib import Path
    assert re.fullmatch(r"\d+\.\d+\.\d+", collectived.__version__), collectived.__version__
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'version = "{collectived.__version__}"' in pyproject
    # Every public method of a Mesh, and every function of collectived.jax,
    # says what it does and what it returns.
    functions = [(f"Mesh.{name}", fn) for name, fn in
                 inspect.getmembers(collectived.Mesh, inspect.isfunction)]
    try:
        import collectived.jax as cjax
        functions += [(f"collectived.jax.{name}", getattr(cjax, name)) for name in cjax.__all__]
    except ImportError:  # no jax here
        pass
    for name, fn in functions:
        if name.split(".")[-1].startswith("_"):
            continue
        assert fn.__doc__, f"{name} has no docstring"
        assert inspect.signature(fn).return_annotation is not inspect.Signature.empty, \
            f"{name} has no return annotation"
