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

CONFORMANCE = """
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh as JaxMesh, PartitionSpec as P
    import collectived.jax as cjax

    c = collectived.connect(socket=SOCK, name=f"jax{RANK}")
    mesh = c.join_mesh("jax-conf", {"data": 2, "model": 2}, coordinate=[RANK // 2, RANK % 2],
                       timeout=60, op_timeout=30)
    devices = np.array(jax.devices()[:4]).reshape(2, 2)
    jmesh = JaxMesh(devices, ("data", "model"))
    AX = ("data", "model")

    def reference(fn, data):
        # fn over the four devices as members; this member's output.
        sm = jax.shard_map(lambda b: fn(b[0])[None], mesh=jmesh, in_specs=P(AX),
                           out_specs=P(AX), check_vma=False)
        return np.asarray(jax.jit(sm)(jnp.asarray(data)))[RANK]

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
        "all_to_all_untiled": (lambda x: jax.lax.all_to_all(x, "data", 0, 1),
                               lambda x: cjax.all_to_all(x[:2], "data", 0, 1, mesh=mesh)),
    }
    def compare(data):
      results = {}
      for name, (lax_fn, ours) in cases.items():
        if name == "all_to_all_untiled":
            lax_fn = (lambda f: lambda x: f(x[:2]))(lax_fn)
        try:
            want = reference(lax_fn, data)
        except Exception as e:  # jax.lax rejects it (e.g. psum_scatter of bool)
            want = None
            why = type(e).__name__
        try:
            got = np.asarray(jax.jit(ours)(jnp.asarray(data[RANK])))
        except Exception as e:
            got = None
            mine = f"{type(e).__name__}: {str(e)[:300]}"
        if want is None:
            results[name] = "both reject" if got is None else f"jax rejects ({why}), we do not"
        elif got is None:
            results[name] = f"we reject: {mine}"
        elif got.dtype != want.dtype or got.shape != want.shape:
            results[name] = f"{got.dtype}{got.shape} != jax's {want.dtype}{want.shape}"
        elif got.tobytes() != want.tobytes():
            results[name] = f"values differ: {got.ravel()[:6]} vs {want.ravel()[:6]}"
        else:
            results[name] = "same bits"
      return results

    everything = {}
    for name in sys.argv[4].split(","):
        dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
        rng = np.random.default_rng(7)
        # Every member's input: [4 members, 4, 6], random in the dtype's range.
        if dtype == np.bool_:
            data = rng.integers(0, 2, (4, 4, 6)).astype(bool)
        elif dtype.kind in "iu":
            data = rng.integers(0, 50, (4, 4, 6)).astype(dtype)
        else:
            data = rng.standard_normal((4, 4, 6)).astype(np.float32).astype(dtype)
        everything[name] = compare(data)
    emit(**everything)
"""

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32",
          "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2"]


def test_results_are_jax_laxs_bits(daemon):
    # One run for every dtype (starting jax in four processes is the cost).
    results = run_members(CONFORMANCE, daemon, 4, ",".join(DTYPES))
    for rank, r in enumerate(results):
        assert sorted(r) == sorted(DTYPES)
        for dtype, cases in r.items():
            # jax.lax rejects exactly psum_scatter of bool among these; so
            # must we, and every other case must give jax.lax's bits.
            want = {k: "same bits" for k in cases}
            if dtype == "bool":
                want["psum_scatter"] = "both reject"
            assert cases == want, f"member {rank}, {dtype}"



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
