"""collectived.jax against jax.lax: four member processes run each collective
inside jax.jit through collectived; each also computes jax.lax's result for
the same data with shard_map over four CPU devices of its own, and compares
its part bit for bit.

Skipped when jax is not installed or the module was built without jaxlib's
FFI headers (collectived.jax then raises Unimplemented).
"""

import time

import pytest

from members import run_members, run_training_example

jax = pytest.importorskip("jax")

# Shared by the members and the reference process: the cases (jax.lax's
# function, collectived.jax's) and every member's input for a dtype.
CASES = """
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp
    X64 = sys.argv[5] == "x64"
    jax.config.update("jax_enable_x64", X64)
    import collectived.jax as cjax
    AX = ("data", "model")
    mesh = None   # the members' collectived mesh; set before `ours` runs

    cases = {
        "psum_data": (lambda x: jax.lax.psum(x, "data"),
                      lambda x: cjax.psum(x, "data", mesh=mesh)),
        "psum_both": (lambda x: jax.lax.psum(x, AX), lambda x: cjax.psum(x, AX, mesh=mesh)),
        "pmax": (lambda x: jax.lax.pmax(x, "model"), lambda x: cjax.pmax(x, "model", mesh=mesh)),
        "pmin": (lambda x: jax.lax.pmin(x, AX), lambda x: cjax.pmin(x, AX, mesh=mesh)),
        "pmean": (lambda x: jax.lax.pmean(x, "data"),
                  lambda x: cjax.pmean(x, "data", mesh=mesh)),
        "all_gather": (lambda x: jax.lax.all_gather(x, "model"),
                       lambda x: cjax.all_gather(x, "model", mesh=mesh)),
        "all_gather_tiled": (lambda x: jax.lax.all_gather(x, AX, axis=1, tiled=True),
                             lambda x: cjax.all_gather(x, AX, axis=1, tiled=True, mesh=mesh)),
        "ppermute": (lambda x: jax.lax.ppermute(x, "data", [(0, 1), (1, 0)]),
                     lambda x: cjax.ppermute(x, "data", [(0, 1), (1, 0)], mesh=mesh)),
        "ppermute_partial": (lambda x: jax.lax.ppermute(x, AX, [(0, 3), (3, 1)]),
                             lambda x: cjax.ppermute(x, AX, [(0, 3), (3, 1)], mesh=mesh)),
        "psum_scatter": (lambda x: jax.lax.psum_scatter(x, "model", scatter_dimension=1,
                                                        tiled=True),
                         lambda x: cjax.psum_scatter(x, "model", scatter_dimension=1,
                                                     tiled=True, mesh=mesh)),
        "all_to_all": (lambda x: jax.lax.all_to_all(x, AX, 0, 1, tiled=True),
                       lambda x: cjax.all_to_all(x, AX, 0, 1, tiled=True, mesh=mesh)),
        "all_to_all_untiled": (lambda x: jax.lax.all_to_all(x[:2], "data", 0, 1),
                               lambda x: cjax.all_to_all(x[:2], "data", 0, 1, mesh=mesh)),
    }

    def inputs(name):
        # Every member's input: [4 members, 4, 6], random in the dtype's range.
        dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
        rng = np.random.default_rng(7)
        if dtype == np.bool_:
            return rng.integers(0, 2, (4, 4, 6)).astype(bool)
        if dtype.kind in "iu":
            return rng.integers(0, 50, (4, 4, 6)).astype(dtype)
        return rng.standard_normal((4, 4, 6)).astype(np.float32).astype(dtype)

    def run(fn):
        # [dtype, shape, hex of the bytes] of fn's result, or ["rejects", why].
        try:
            got = np.asarray(fn())
        except Exception as e:
            return ["rejects", f"{type(e).__name__}: {str(e)[:300]}"]
        return [str(got.dtype), list(got.shape), got.tobytes().hex()]
"""

# jax.lax's results: every case over four CPU devices of one process, in
# shard_map; the row of device r is what member r must get. Computed once,
# beside the members, not in each of them.
REFERENCE = CASES + """
    from jax.sharding import Mesh as JaxMesh, PartitionSpec as P
    jmesh = JaxMesh(np.array(jax.devices()[:4]).reshape(2, 2), AX)

    def reference(fn, data):
        sm = jax.shard_map(lambda b: fn(b[0])[None], mesh=jmesh, in_specs=P(AX),
                           out_specs=P(AX), check_vma=False)
        return [np.asarray(row) for row in np.asarray(jax.jit(sm)(jnp.asarray(data)))]

    everything = {}
    for name in sys.argv[4].split(","):
        data = inputs(name)
        everything[name] = {}
        for case, (lax_fn, _) in cases.items():
            try:
                rows = reference(lax_fn, data)
            except Exception as e:   # jax.lax rejects it (e.g. psum_scatter of bool)
                everything[name][case] = [["rejects", type(e).__name__]] * 4
                continue
            everything[name][case] = [run(lambda: row) for row in rows]
    emit(**everything)
"""

# Each member runs every case in jax.jit through collectived on its row.
CONFORMANCE = CASES + """
    c = collectived.connect(socket=SOCK, name=f"jax{RANK}")
    mesh = c.join_mesh("jax-conf", {"data": 2, "model": 2}, coordinate=[RANK // 2, RANK % 2],
                       timeout=60, op_timeout=30)
    everything = {}
    for name in sys.argv[4].split(","):
        mine = inputs(name)[RANK]   # a numpy array, as users pass them
        everything[name] = {case: {"jit": run(lambda: jax.jit(ours)(mine)),
                                   "eager": run(lambda: ours(mine))}
                            for case, (_, ours) in cases.items()}
    emit(**everything)
"""

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32",
          "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("x64", ["x64", "no_x64"])
def test_results_are_jax_laxs_bits(daemon, x64):
    # Every dtype, inside jax.jit and outside it, with JAX's 64-bit types on
    # and off (off: float64 and int64 operands become float32 and int32, as
    # JAX takes them). One run for every dtype: starting jax and compiling
    # every case is the cost, and four members plus the reference share the
    # machine's cores, so the processes get far more than the usual member
    # timeout.
    dtypes = ",".join(DTYPES)
    results = run_members(CONFORMANCE, daemon, 4, dtypes, x64,
                          extra_procs=[(REFERENCE, dtypes, x64)], timeout=400)
    want_all = results.pop()
    assert sorted(want_all) == sorted(DTYPES)
    for rank, got_all in enumerate(results):
        assert sorted(got_all) == sorted(DTYPES)
        for dtype in DTYPES:
            got, want = got_all[dtype], want_all[dtype]
            assert sorted(got) == sorted(want)
            for case, mode in ((c, m) for c in want for m in ("jit", "eager")):
                g, w = got[case][mode], want[case][rank]
                where = f"member {rank}, {x64}, {dtype}, {case}, {mode}"
                # jax.lax rejects exactly psum_scatter of bool among these;
                # so must we, and every other case must give jax.lax's bits.
                rejected = (dtype, case) == ("bool", "psum_scatter")
                assert (w[0] == "rejects") == rejected, f"{where}: jax.lax gave {w}"
                if rejected:
                    assert g[0] == "rejects", f"{where}: jax.lax rejects ({w[1]}), we give {g}"
                else:
                    assert g[0] != "rejects", f"{where}: we reject: {g[1]}"
                    assert g[:2] == w[:2], f"{where}: {g[0]}{g[1]} != jax's {w[0]}{w[1]}"
                    assert g[2] == w[2], f"{where}: values differ: {g[2][:48]} vs {w[2][:48]}"


ORDER = """
    import jax, jax.numpy as jnp
    import collectived.jax as cjax
    c = collectived.connect(socket=SOCK)
    mesh = c.join_mesh("jax-order", {"i": 2}, coordinate=[RANK], timeout=60)

    @jax.jit
    def many(x, r):   # twelve independent calls: XLA may schedule them as it likes
        outs = [cjax.psum(x * k, "i", mesh=mesh) for k in range(6)]
        return outs + [cjax.pmax(jnp.arange(k + 1) + r, "i", mesh=mesh) for k in range(6)]

    for _ in range(10):
        outs = many(jnp.full((3,), RANK + 1.0), RANK)
    ok = all(float(outs[k][0]) == 3.0 * k for k in range(6)) and \\
        all(outs[6 + k].tolist() == list(range(1, k + 2)) for k in range(6))
    # axis_index is read when the function runs: one program, each process's index.
    idx = jax.jit(lambda: cjax.axis_index("i", mesh=mesh))
    got_index = int(idx())
    try:
        cjax.psum(jnp.ones(2), None, mesh=mesh)
        none_axis = "no error"
    except collectived.InvalidArgument:
        none_axis = "InvalidArgument"
    # A mesh that is gone: the compiled function fails, it does not crash.
    f = jax.jit(lambda x: cjax.psum(x, "i", mesh=mesh))
    f(jnp.ones(2)).block_until_ready()
    mesh.leave()
    try:
        f(jnp.ones(2)).block_until_ready()
        after = "no error"
    except Exception as e:
        after = str(e).split(":")[0]
        print(str(e)[:400], file=sys.stderr)
    emit(ok=ok, after=after, index=got_index, none_axis=none_axis)
"""


def test_independent_calls_run_in_the_same_order_everywhere(daemon):
    for rank, r in enumerate(run_members(ORDER, daemon, 2)):
        assert r["ok"], r
        assert r["after"] == "FAILED_PRECONDITION", r
        assert r["index"] == rank and r["none_axis"] == "InvalidArgument", r


def test_the_training_example_learns_identically_in_every_process(daemon):
    losses = run_training_example(daemon, 3, 31)
    assert sorted(losses) == [0, 10, 20, 30]
    for step, by_process in losses.items():
        assert len(set(by_process.values())) == 1, f"step {step}: {by_process}"
    assert float(losses[30][0]) < float(losses[0][0]) / 2, losses


# What jax.lax accepts beyond one array: pytrees, Python scalars (weakly
# typed), tuples of axis names, jax.grad (with the transposes shard_map
# applies), jax.vmap; and the refusal of axis_index_groups. Each of two
# members compares its own results with jax.lax's in shard_map over two CPU
# devices of its own (it knows both members' inputs).
PARITY = """
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh as JaxMesh, PartitionSpec as P
    from jax._src import dtypes as jdtypes
    import collectived.jax as cjax
    c = collectived.connect(socket=SOCK, name=f"parity{RANK}")
    mesh = c.join_mesh("jax-parity", {"i": 2}, coordinate=[RANK], timeout=60, op_timeout=30)
    jmesh = JaxMesh(np.array(jax.devices()[:2]), ("i",))

    def reference(fn, *per_member):
        # fn over both members' inputs in shard_map: member RANK's result.
        stacked = [jax.tree_util.tree_map(lambda *leaves: jnp.stack([jnp.asarray(v)
                                                                     for v in leaves]), *args)
                   for args in per_member]
        sm = jax.shard_map(lambda *b: jax.tree_util.tree_map(lambda y: y[None],
                                                             fn(*[jax.tree_util.tree_map(
                                                                 lambda y: y[0], v)
                                                                  for v in b])),
                           mesh=jmesh, in_specs=P("i"), out_specs=P("i"))
        return jax.tree_util.tree_map(lambda y: y[RANK], jax.jit(sm)(*stacked))

    def same(got, want):
        g, w = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
        return (jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want) and
                all(np.asarray(a).dtype == np.asarray(b).dtype and
                    np.asarray(a).shape == np.asarray(b).shape and
                    np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(g, w)))

    checks = {}
    x = [np.arange(12, dtype=np.float32).reshape(2, 6) * (r + 1) for r in range(2)]

    # Pytrees, lists and Python scalars, as jax.lax.psum takes them.
    tree = lambda r: {"a": 1.5 * (r + 1), "b": [np.full(3, r, np.int32), 2], "c": x[r]}
    got = cjax.psum(tree(RANK), "i", mesh=mesh)
    checks["pytree"] = same(got, reference(lambda t: jax.lax.psum(t, "i"),
                                           (tree(0), tree(1))))
    # A Python scalar stays weakly typed, as with jax.lax.psum.
    checks["weak"] = bool(jdtypes.is_weakly_typed(got["a"])) and \\
        (got["a"] + jnp.ones(1, jnp.bfloat16)).dtype == jnp.bfloat16
    checks["tuple_axes"] = same(jax.jit(lambda v: cjax.pmax(v, ("i",), mesh=mesh))(x[RANK]),
                                reference(lambda v: jax.lax.pmax(v, ("i",)), x))
    try:
        cjax.psum(x[RANK], "i", mesh=mesh, axis_index_groups=[[0, 1]])
        checks["groups"] = "no error"
    except NotImplementedError as e:
        checks["groups"] = "axis_index_groups" in str(e)

    # jax.grad: each op's transpose as shard_map differentiates jax.lax's.
    # psum and pmean of a value every member holds alike (weights w0): the
    # identity and 1/n (JAX's pbroadcast); the others with per-member
    # weights.
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    w = [w0 * (r + 2) for r in range(2)]
    grads = {
        "psum": (lambda f: (lambda v: (f(v) * w0).sum()),
                 lambda v: cjax.psum(v, "i", mesh=mesh), lambda v: jax.lax.psum(v, "i")),
        "pmean": (lambda f: (lambda v: (f(v) * w0).sum()),
                  lambda v: cjax.pmean(v, "i", mesh=mesh), lambda v: jax.lax.pmean(v, "i")),
        "ppermute": (None, lambda v: cjax.ppermute(v, "i", [(0, 1), (1, 0)], mesh=mesh),
                     lambda v: jax.lax.ppermute(v, "i", [(0, 1), (1, 0)])),
        "all_gather": (None, lambda v: cjax.all_gather(v, "i", axis=1, mesh=mesh),
                       lambda v: jax.lax.all_gather(v, "i", axis=1)),
        "all_gather_tiled": (None, lambda v: cjax.all_gather(v, "i", tiled=True, mesh=mesh),
                             lambda v: jax.lax.all_gather(v, "i", tiled=True)),
        "psum_scatter": (None, lambda v: cjax.psum_scatter(v, "i", scatter_dimension=1,
                                                           tiled=True, mesh=mesh),
                         lambda v: jax.lax.psum_scatter(v, "i", scatter_dimension=1,
                                                        tiled=True)),
        "all_to_all": (None, lambda v: cjax.all_to_all(v, "i", 1, 0, tiled=True, mesh=mesh),
                       lambda v: jax.lax.all_to_all(v, "i", 1, 0, tiled=True)),
    }
    for name, (loss_of, ours, lax_fn) in grads.items():
        if loss_of is None:   # per-member weights, shaped like the result
            def loss_of(f):
                def loss(v, wr):
                    y = f(v)
                    return (y * jnp.resize(wr, y.shape)).sum()
                return loss
            got = jax.jit(jax.grad(loss_of(ours)))(x[RANK], w[RANK])
            want = reference(lambda v, wr: jax.grad(loss_of(lax_fn))(v, wr), x, w)
        else:
            got = jax.jit(jax.grad(loss_of(ours)))(x[RANK])
            want = reference(lambda v: jax.grad(loss_of(lax_fn))(v), x)
        checks["grad_" + name] = same(got, want)
    try:
        jax.grad(lambda v: cjax.pmax(v, "i", mesh=mesh).sum())(x[RANK])
        checks["grad_pmax"] = "no error"
    except NotImplementedError as e:
        checks["grad_pmax"] = "pmax" in str(e)

    # jax.vmap over a batch dimension the mesh knows nothing of.
    vmaps = {
        "psum": (lambda v: cjax.psum(v, "i", mesh=mesh), lambda v: jax.lax.psum(v, "i")),
        "all_gather": (lambda v: cjax.all_gather(v, "i", axis=1, mesh=mesh),
                       lambda v: jax.lax.all_gather(v, "i", axis=1)),
        "all_to_all": (lambda v: cjax.all_to_all(v, "i", 0, 0, tiled=True, mesh=mesh),
                       lambda v: jax.lax.all_to_all(v, "i", 0, 0, tiled=True)),
        "psum_scatter": (lambda v: cjax.psum_scatter(v, "i", mesh=mesh, tiled=True),
                         lambda v: jax.lax.psum_scatter(v, "i", tiled=True)),
    }
    batch = [np.arange(4 * 2 * 6, dtype=np.float32).reshape(4, 2, 6) + 100 * r for r in range(2)]
    for name, (ours, lax_fn) in vmaps.items():
        for in_axes in (0, 2):
            got = jax.jit(jax.vmap(ours, in_axes=in_axes))(batch[RANK])
            want = reference(lambda v: jax.vmap(lax_fn, in_axes=in_axes)(v), batch)
            checks[f"vmap_{name}_{in_axes}"] = same(got, want)
    emit(**checks)
"""


def test_pytrees_scalars_grad_and_vmap_are_jax_laxs(daemon):
    for rank, checks in enumerate(run_members(PARITY, daemon, 2, timeout=300)):
        bad = {k: v for k, v in checks.items() if v is not True}
        assert not bad, f"member {rank}: {bad}"
        assert len(checks) >= 20, checks


# Ctrl-C while a member waits for a peer that is late: inside a jitted call
# (collectived.jax) and in Python's own synchronous call, on the member-side
# path (8 B) and the daemon path (4 MiB). The op is given up, the mesh breaks
# for everyone, and the interrupted member's retry fails loudly instead of
# pairing with the peer's next op.
INTERRUPTED = """
    import jax, jax.numpy as jnp
    import collectived.jax as cjax
    mode, nbytes, go = sys.argv[4], int(sys.argv[5]), sys.argv[6]
    c = collectived.connect(socket=SOCK, name=f"intr{RANK}")
    mesh = c.join_mesh("jax-interrupt", {"i": 2}, coordinate=[RANK], timeout=60,
                       op_timeout=60)
    if mode == "jit":
        f = jax.jit(lambda v: cjax.psum(v, "i", mesh=mesh))
        x = jnp.ones(nbytes // 4, jnp.float32)
        op = lambda: f(x).block_until_ready()
    else:
        x = mesh.zeros((nbytes // 4,), np.float32)
        op = lambda: mesh.psum(x, "i")
    op()   # both members are here

    def outcome(fn):
        try:
            fn()
            return "completed"
        except KeyboardInterrupt:
            return "KeyboardInterrupt"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    def interrupted_op():
        with cjax.interruptible():
            op()

    if RANK == 0:
        print("waiting", flush=True)
        t = time.monotonic()
        first = outcome(interrupted_op)
        took = time.monotonic() - t
        emit(first=first, retry=outcome(op), took=took)
    else:
        deadline = time.monotonic() + 60   # the test says when: after member 0 was interrupted
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        emit(first=outcome(op))
"""


@pytest.mark.parametrize("mode,nbytes", [("jit", 8), ("jit", 4 << 20), ("python", 4 << 20)])
def test_ctrl_c_gives_the_op_up_and_breaks_the_mesh(daemon, mode, nbytes, tmp_path):
    import select
    import signal
    from members import collect, result, start

    go = tmp_path / "go"
    procs = [start(INTERRUPTED, daemon, 2, r, mode, nbytes, go) for r in range(2)]
    try:
        # Member 0 says it is about to wait; a moment later, Ctrl-C.
        line, deadline = "", time.monotonic() + 120
        while "waiting" not in line and time.monotonic() < deadline:
            if select.select([procs[0].stdout], [], [], 1.0)[0]:
                line = procs[0].stdout.readline()
                if not line:
                    break
        assert "waiting" in line, collect(procs[0])
        time.sleep(0.3)
        procs[0].send_signal(signal.SIGINT)
        rc, out, err = collect(procs[0])
        assert rc == 0, out + err
        got = result(out)
        go.touch()
        rc, out, err = collect(procs[1])
        assert rc == 0, out + err
        peer = result(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print(mode, nbytes, got, peer)
    # Interrupted, not completed when the peer came (it came only after).
    assert got["first"] == "KeyboardInterrupt", got
    # The retry and the peer's op fail, naming the interruption.
    for what in (got["retry"], peer["first"]):
        assert "ABORTED" in what.upper() and "interrupted" in what, (got, peer)


# jit's asynchronous dispatch is kept: a step that does not wait for its
# result does not wait for the collective. Member 1 submits only once member
# 0's call has returned, so a call that blocked until the op completed would
# never see member 1 (and time out).
ASYNC = """
    import jax, jax.numpy as jnp
    import collectived.jax as cjax
    flag = sys.argv[4]
    c = collectived.connect(socket=SOCK, name=f"async{RANK}")
    mesh = c.join_mesh("jax-async", {"i": 2}, coordinate=[RANK], timeout=60, op_timeout=20)
    f = jax.jit(lambda v: cjax.psum(v * 2, "i", mesh=mesh) + 1)
    x = jnp.full((1 << 16,), RANK + 1.0, jnp.float32)
    f(x).block_until_ready()
    if RANK == 0:
        y = f(x)                      # dispatched, not waited for
        open(flag, "w").close()
        emit(value=float(y.block_until_ready()[0]))
    else:
        deadline = time.monotonic() + 30
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.005)
        emit(value=float(f(x).block_until_ready()[0]), saw_flag=os.path.exists(flag))
"""


def test_a_step_that_does_not_wait_does_not_wait_for_the_collective(daemon, tmp_path):
    r0, r1 = run_members(ASYNC, daemon, 2, tmp_path / "dispatched", timeout=120)
    assert r1["saw_flag"], r1
    assert r0["value"] == r1["value"] == 2 * (1 + 2) + 1, (r0, r1)


# Large jitted results: XLA's output of 32 MiB or more is a fresh mapping,
# which the handler asks for in huge pages before copying the result in. The
# sizes are not multiples of 2 MiB (a partial huge page at each end), and the
# repeated calls get new outputs each time; every element is checked.
LARGE = """
    import jax, jax.numpy as jnp
    import collectived.jax as cjax
    c = collectived.connect(socket=SOCK, name=f"large{RANK}")
    mesh = c.join_mesh("jax-large", {"i": 2}, coordinate=[RANK], timeout=60, op_timeout=60)
    n = (40 << 20) // 4 + 3                       # 40 MiB and 12 bytes of float32
    x = jnp.arange(n, dtype=jnp.float32) % 1000 + RANK
    psum = jax.jit(lambda v: cjax.psum(v, "i", mesh=mesh))
    gather = jax.jit(lambda v: cjax.all_gather(v[: n // 2], "i", mesh=mesh, tiled=True))
    want_sum = 2 * (np.arange(n, dtype=np.float32) % 1000) + 1
    half = np.arange(n // 2, dtype=np.float32) % 1000
    want_gather = np.concatenate([half, half + 1])
    ok = []
    for _ in range(3):
        ok.append(bool(np.array_equal(np.asarray(psum(x)), want_sum)))
        ok.append(bool(np.array_equal(np.asarray(gather(x)), want_gather)))
    emit(ok=ok)
"""


def test_large_results_in_fresh_mappings_are_exact(daemon, tmp_path):
    for r in run_members(LARGE, daemon, 2, timeout=120):
        assert r["ok"] == [True] * 6, r


# Jitted all_gathers of 64 KiB and 1 MiB per member: the members read each
# other's inputs from their buffers (README "All_gathers that read the
# members' buffers"); each call's inputs differ, and every element is
# checked. With OFF set, member 1 says no (COLLECTIVED_MEMBER_READS=0), and
# neither reads.
READS = """
    import os
    OFF = __OFF__
    if OFF and RANK == 1:
        os.environ["COLLECTIVED_MEMBER_READS"] = "0"
    import jax, jax.numpy as jnp
    import collectived.jax as cjax
    c = collectived.connect(socket=SOCK, name=f"reads{RANK}")
    mesh = c.join_mesh("jax-reads", {"i": 2}, coordinate=[RANK], timeout=60)
    before = mesh.member_reads
    ok = []
    for n in (16384, 262144):
        gather = jax.jit(lambda v: cjax.all_gather(v, "i", mesh=mesh, tiled=True))
        base = np.arange(n, dtype=np.float32) % 4099
        for step in range(10):
            got = np.asarray(gather(jnp.asarray(base + 10 * step + RANK)))
            want = np.concatenate([base + 10 * step, base + 10 * step + 1])
            ok.append(bool(np.array_equal(got, want)))
    emit(ok=ok, before=before, after=mesh.member_reads)
"""


@pytest.mark.parametrize("off", [False, True])
def test_jitted_all_gathers_that_read_the_members_are_exact(daemon, tmp_path, off):
    r0, r1 = run_members(READS.replace("__OFF__", str(off)), daemon, 2, timeout=120)
    for r in (r0, r1):
        assert r["ok"] == [True] * 20 and r["before"] == "not decided yet", r
    if off:
        assert r0["after"] == "no: another member said no", r0
        assert r1["after"] == "no: COLLECTIVED_MEMBER_READS=0", r1
    else:
        assert r0["after"] == r1["after"] == "yes", (r0, r1)
