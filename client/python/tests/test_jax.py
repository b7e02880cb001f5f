"""collectived.jax against jax.lax: four member processes run each collective
inside jax.jit through collectived; each also computes jax.lax's result for
the same data with shard_map over four CPU devices of its own, and compares
its part bit for bit.

Skipped when jax is not installed or the module was built without jaxlib's
FFI headers (collectived.jax then raises Unimplemented).
"""

import pytest

from members import run_members

jax = pytest.importorskip("jax")

# Shared by the members and the reference process: the cases (jax.lax's
# function, collectived.jax's) and every member's input for a dtype.
CASES = """
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
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
        mine = jnp.asarray(inputs(name)[RANK])
        everything[name] = {case: run(lambda: jax.jit(ours)(mine))
                            for case, (_, ours) in cases.items()}
    emit(**everything)
"""

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32",
          "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2"]


def test_results_are_jax_laxs_bits(daemon):
    # One run for every dtype: starting jax and compiling every case is the
    # cost, and four members plus the reference share the machine's cores, so
    # the processes get far more than the usual member timeout.
    dtypes = ",".join(DTYPES)
    results = run_members(CONFORMANCE, daemon, 4, dtypes, extra_procs=[(REFERENCE, dtypes)],
                          timeout=300)
    want_all = results.pop()
    assert sorted(want_all) == sorted(DTYPES)
    for rank, got_all in enumerate(results):
        assert sorted(got_all) == sorted(DTYPES)
        for dtype in DTYPES:
            got, want = got_all[dtype], want_all[dtype]
            assert sorted(got) == sorted(want)
            for case in want:
                g, w = got[case], want[case][rank]
                where = f"member {rank}, {dtype}, {case}"
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
    import re
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples/python/train_data_parallel.py"
    out = subprocess.run([sys.executable, str(example), f"--socket={daemon}", "--processes=3",
                          "--steps=31"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    losses = {}
    for proc, step, loss in re.findall(r"\[process (\d+)\] step +(\d+) loss ([0-9.]+)",
                                       out.stdout):
        losses.setdefault(int(step), {})[int(proc)] = loss
    assert sorted(losses) == [0, 10, 20, 30], out.stdout
    for step, by_process in losses.items():
        assert sorted(by_process) == [0, 1, 2], out.stdout
        assert len(set(by_process.values())) == 1, f"step {step}: {by_process}"
    assert float(losses[30][0]) < float(losses[0][0]) / 2, losses
