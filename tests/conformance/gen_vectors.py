#!/usr/bin/env python3
"""Generate JAX conformance vectors for collectived's named-axis collectives.

This script is NOT run in CI; it is run by hand when the vectors need to be
regenerated, and its output (tests/conformance/data/vectors.json) is checked in
and parsed by the C++ conformance test.

How to run (from the repository root):

    pip install jax==0.10.2 jaxlib==0.10.2 ml_dtypes numpy   # CPU jax from PyPI
    python3 tests/conformance/gen_vectors.py [--out PATH]

The script sets XLA_FLAGS=--xla_force_host_platform_device_count=8 itself
(before importing jax) and enables jax_enable_x64, so 8 CPU "devices" are
available and int64/uint64/float64 are real 64-bit types.

What it produces: a JSON file

    {"generator": "jax <version>",
     "cases": [{"name", "op", "mesh", "axes", "dtype", "shape", "params",
                "out_dtype", "out_shape", "inputs", "outputs"}, ...]}

where every case is one jax.lax collective (psum, pmean, pmax, pmin,
all_gather, ppermute, psum_scatter, all_to_all) executed inside shard_map over
a jax.sharding.Mesh of CPU devices.  "inputs"/"outputs" hold one lowercase hex
string per mesh member (members in row-major order of the mesh coordinates),
each the raw little-endian bytes of that member's C-contiguous array.

Every generated case is also checked bit-exactly against a small numpy
reference model of the collectives (model_* below, which documents the exact
semantics JAX/XLA-CPU exhibit); the script exits 1 if any case disagrees.
It also prints a report of JAX's numerical behaviour (bool/integer handling of
the reductions, NaN and signed-zero handling of pmax/pmin, and whether psum
matches a sequential sum in member order bit-exactly).  Inputs come from
np.random.default_rng(0), so the output is deterministic for a given jax
version.
"""

import argparse
import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

try:
    _shard_map = jax.shard_map
except AttributeError:  # older jax
    from jax.experimental.shard_map import shard_map as _shard_map

lax = jax.lax

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": BF16,
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
# The dtypes of the cases before gen_float8 (which appends the float8 cases
# last, so that the earlier cases, and their random data, stay the same).
ALL_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32",
              "uint32", "int64", "uint64", "bool"]
F8E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
F8E5M2 = np.dtype(ml_dtypes.float8_e5m2)
F8_DTYPES = ["float8_e4m3fn", "float8_e5m2"]
FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
FEW_DTYPES = ["float32", "bfloat16", "int8", "uint64", "bool"]
MOVE_DTYPES_SMALL = ["float32", "int8", "bool"]

MESHES = {
    "x2": [("x", 2)],
    "x3": [("x", 3)],
    "x4": [("x", 4)],
    "x8": [("x", 8)],
    "x2y2": [("x", 2), ("y", 2)],
    "x2y4": [("x", 2), ("y", 4)],
    # Edge cases only (gen_edges): a mesh of one member, and a size-1 axis.
    "x1": [("x", 1)],
    "x2y1": [("x", 2), ("y", 1)],
}
ONE_AXIS = ["x2", "x3", "x4", "x8"]

rng = np.random.default_rng(0)


# --------------------------------------------------------------------------
# helpers


def to_hex(a):
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.tobytes().hex()


def dtype_name(dt):
    return np.dtype(dt).name


def group_size(mesh_spec, axes):
    sizes = dict(mesh_spec)
    n = 1
    for a in axes:
        n *= sizes[a]
    return n


_MESH_CACHE = {}


def make_mesh(mesh_spec):
    key = tuple(mesh_spec)
    if key not in _MESH_CACHE:
        names = tuple(n for n, _ in mesh_spec)
        sizes = tuple(s for _, s in mesh_spec)
        ndev = int(np.prod(sizes))
        devs = np.array(jax.devices()[:ndev]).reshape(sizes)
        _MESH_CACHE[key] = Mesh(devs, names)
    return _MESH_CACHE[key]


def run_collective(mesh_spec, fn, per_member):
    """Run fn (a per-member function using collectives) under shard_map.

    per_member: array of shape (N, *shape), member m = row-major mesh coords.
    Returns an array of shape (N, *out_shape) (per-member outputs).
    """
    mesh = make_mesh(mesh_spec)
    names = tuple(n for n, _ in mesh_spec)
    sizes = tuple(s for _, s in mesh_spec)
    nd = len(sizes)
    n_members = int(np.prod(sizes))
    assert per_member.shape[0] == n_members
    shape = per_member.shape[1:]
    glob = per_member.reshape(sizes + shape)
    spec = P(*names)

    def body(a):
        x = a.reshape(a.shape[nd:])          # squeeze leading singleton dims
        y = fn(x)
        idx = jnp.stack([lax.axis_index(n) for n in names]).astype(jnp.int32)
        lead = (1,) * nd
        return (y.reshape(lead + y.shape), idx.reshape(lead + (nd,)),
                x.reshape(lead + x.shape))

    f = jax.jit(_shard_map(body, mesh=mesh, in_specs=spec,
                           out_specs=(spec, spec, spec)))
    garr = jax.device_put(glob, NamedSharding(mesh, spec))
    y, idx, xin = f(garr)
    y = np.asarray(y)
    idx = np.asarray(idx).reshape(n_members, nd)
    xin = np.asarray(xin).reshape(per_member.shape)
    # The decomposition must be right: member m has coordinates
    # np.unravel_index(m, sizes), and saw exactly per_member[m] as input.
    for m in range(n_members):
        coords = np.unravel_index(m, sizes)
        assert tuple(int(c) for c in idx[m]) == tuple(int(c) for c in coords), (m, idx[m], coords)
    assert xin.tobytes() == np.ascontiguousarray(per_member).tobytes()
    out_shape = y.shape[nd:]
    return y.reshape((n_members,) + out_shape)


def rand_array(dtype_name_, shape, kind="normal"):
    dt = DTYPES[dtype_name_]
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if kind == "small":
            lo, hi = (0, 100) if dt.kind == "u" else (-100, 100)
        else:  # full range: sums over 8 members overflow
            lo, hi = int(info.min), int(info.max)
        return rng.integers(lo, hi, size=shape, dtype=dt, endpoint=True)
    # floats: ordinary values with a spread of magnitudes
    v = rng.standard_normal(size=shape) * np.exp2(rng.integers(-3, 4, size=shape))
    return v.astype(dt)


CASES = []
NAMES = set()
FAILURES = []


def add_case(name, op, mesh_key, axes, dtype_name_, per_member, params, fn):
    mesh_spec = MESHES[mesh_key]
    try:
        out = run_collective(mesh_spec, fn, per_member)
    except Exception as e:  # record what JAX refuses
        FAILURES.append((name, type(e).__name__, str(e).splitlines()[0][:200]))
        return None
    assert name not in NAMES, name
    NAMES.add(name)
    CASES.append({
        "name": name,
        "op": op,
        "mesh": [[n, s] for n, s in mesh_spec],
        "axes": list(axes),
        "dtype": dtype_name_,
        "shape": list(per_member.shape[1:]),
        "params": params,
        "out_dtype": dtype_name(out.dtype),
        "out_shape": list(out.shape[1:]),
        "inputs": [to_hex(per_member[m]) for m in range(per_member.shape[0])],
        "outputs": [to_hex(out[m]) for m in range(out.shape[0])],
    })
    return out


def axis_arg(axes):
    return axes[0] if len(axes) == 1 else tuple(axes)


def axes_tag(axes):
    return "".join(axes)


def axes_configs(two_axis_orders=True):
    cfgs = [(k, ("x",)) for k in ONE_AXIS]
    for k in ["x2y2", "x2y4"]:
        cfgs += [(k, ("x",)), (k, ("y",)), (k, ("x", "y"))]
        if two_axis_orders:
            cfgs.append((k, ("y", "x")))
    return cfgs


def n_members(mesh_key):
    return int(np.prod([s for _, s in MESHES[mesh_key]]))


# --------------------------------------------------------------------------
# reductions: psum pmean pmax pmin

RED_OPS = {"psum": lax.psum, "pmean": lax.pmean, "pmax": lax.pmax,
           "pmin": lax.pmin}


def gen_reductions():
    for op, f in RED_OPS.items():
        for mesh_key, axes in axes_configs():
            N = n_members(mesh_key)
            shape = (3,) if len(MESHES[mesh_key]) == 1 else (2, 3)
            for dt in ALL_DTYPES:
                data = rand_array(dt, (N,) + shape)
                name = f"{op}_{dt}_{mesh_key}_over_{axes_tag(axes)}_shape{'x'.join(map(str, shape))}"
                ax = axis_arg(axes)
                add_case(name, op, mesh_key, axes, dt, data, {},
                         lambda x, f=f, ax=ax: f(x, ax))
        # small-valued integers (no wrapping) on a 4-member axis
        for dt in ["int8", "uint8", "int32", "uint32", "int64", "uint64"]:
            data = rand_array(dt, (4, 5), kind="small")
            add_case(f"{op}_{dt}_x4_over_x_shape5_small", op, "x4", ("x",), dt,
                     data, {}, lambda x, f=f: f(x, "x"))


def special_float_data(dt, N):
    """Columns exercising NaN / inf / signed zero for N members."""
    dt_ = DTYPES[dt]
    nan, inf = np.nan, np.inf
    cols = []
    base = lambda: (rng.standard_normal(N) * 4).astype(np.float64)  # noqa: E731
    c = base(); c[0] = nan; cols.append(c)                 # NaN at member 0
    c = base(); c[N - 1] = nan; cols.append(c)             # NaN at last member
    c = base(); c[N // 2] = inf; cols.append(c)            # +inf
    c = base(); c[N - 1] = -inf; cols.append(c)            # -inf
    c = base(); c[0] = inf; c[N - 1] = -inf; cols.append(c)  # +inf and -inf
    cols.append(np.full(N, -0.0))                          # all -0.0
    c = np.full(N, 0.0); c[0] = -0.0; cols.append(c)       # -0 first, then +0
    c = np.full(N, -0.0); c[0] = 0.0; cols.append(c)       # +0 first, then -0
    c = np.full(N, -0.0); c[N - 1] = 0.0; cols.append(c)   # +0 last
    c = np.full(N, 0.0); c[N - 1] = -0.0; cols.append(c)   # -0 last
    c = base(); c[1 % N] = -nan; cols.append(c)            # NaN with sign bit set
    c = base(); c[0] = inf; c[N - 1] = nan; cols.append(c)  # +inf and NaN
    c = np.full(N, inf); cols.append(c)                    # all +inf
    c = base(); c[0] = -inf; c[N - 1] = nan; cols.append(c)  # -inf then NaN
    cols.append(np.full(N, nan))                           # all NaN
    c = np.full(N, nan); c[N - 1] = -inf; cols.append(c)   # NaNs and -inf last
    c = np.full(N, nan); c[0] = inf; cols.append(c)        # +inf first, then NaNs
    arr = np.stack(cols, axis=1)
    out = arr.astype(dt_)
    # np.float64(-nan) -> keep sign bit explicitly in the target dtype
    col = 10
    out[1 % N, col] = -np.abs(out[1 % N, col].astype(np.float64)).astype(dt_)
    return out


def gen_special():
    for op in ["psum", "pmax", "pmin", "pmean"]:
        f = RED_OPS[op]
        for mesh_key in ONE_AXIS:
            N = n_members(mesh_key)
            for dt in FLOAT_DTYPES:
                data = special_float_data(dt, N)
                add_case(f"{op}_{dt}_{mesh_key}_over_x_specials",
                         op, mesh_key, ("x",), dt, data, {},
                         lambda x, f=f: f(x, "x"))


# --------------------------------------------------------------------------
# all_gather


def gen_all_gather():
    variants = [((3,), 0, False), ((3,), 0, True), ((3,), 1, False),
                ((2, 3), 0, False), ((2, 3), 0, True),
                ((2, 3), 1, False), ((2, 3), 1, True), ((2, 3), 2, False)]
    for mesh_key, axes in axes_configs():
        N = n_members(mesh_key)
        ax = axis_arg(axes)
        for shape, axis, tiled in variants:
            dts = FEW_DTYPES if shape == (2, 3) and axis <= 1 else MOVE_DTYPES_SMALL
            if mesh_key == "x4" and shape == (2, 3) and axis == 1 and tiled:
                dts = ALL_DTYPES
            for dt in dts:
                data = rand_array(dt, (N,) + shape)
                name = (f"all_gather_{dt}_{mesh_key}_over_{axes_tag(axes)}_shape"
                        f"{'x'.join(map(str, shape))}_axis{axis}_{'tiled' if tiled else 'untiled'}")
                add_case(name, "all_gather", mesh_key, axes, dt, data,
                         {"axis": axis, "tiled": tiled},
                         lambda x, ax=ax, axis=axis, tiled=tiled:
                         lax.all_gather(x, ax, axis=axis, tiled=tiled))


# --------------------------------------------------------------------------
# ppermute


def perms_for(n):
    out = [("shift1", [[i, (i + 1) % n] for i in range(n)])]
    if n > 2:
        out.append(("shiftm1", [[i, (i - 1) % n] for i in range(n)]))
    # partial: some members receive nothing (they get zeros)
    if n == 2:
        out.append(("partial", [[0, 1]]))
    elif n == 3:
        out.append(("partial", [[2, 0]]))
    else:
        out.append(("partial", [[0, n - 1], [n - 1, 1], [2, 2]]))
        out.append(("reverse", [[i, n - 1 - i] for i in range(n)]))
    return out


def gen_ppermute():
    for mesh_key, axes in axes_configs():
        N = n_members(mesh_key)
        G = group_size(MESHES[mesh_key], axes)
        ax = axis_arg(axes)
        shape = (3,) if len(MESHES[mesh_key]) == 1 else (2, 3)
        for pname, perm in perms_for(G):
            dts = FEW_DTYPES if pname in ("shift1", "partial") else ["float32"]
            if mesh_key == "x4" and pname == "partial":
                dts = ALL_DTYPES
            for dt in dts:
                data = rand_array(dt, (N,) + shape)
                name = f"ppermute_{dt}_{mesh_key}_over_{axes_tag(axes)}_{pname}"
                add_case(name, "ppermute", mesh_key, axes, dt, data,
                         {"perm": perm},
                         lambda x, ax=ax, perm=perm:
                         lax.ppermute(x, ax, [tuple(p) for p in perm]))


# --------------------------------------------------------------------------
# psum_scatter


def gen_psum_scatter():
    for mesh_key, axes in axes_configs():
        N = n_members(mesh_key)
        G = group_size(MESHES[mesh_key], axes)
        ax = axis_arg(axes)
        variants = [((G, 3), 0, False), ((3, G), 1, False),
                    ((2 * G, 3), 0, True), ((3, 2 * G), 1, True), ((G,), 0, True)]
        for shape, sd, tiled in variants:
            if (mesh_key == "x4" and sd == 0) or mesh_key == "x8":
                dts = ALL_DTYPES
            else:
                dts = ["float32", "int8", "bfloat16", "uint64"]
            for dt in dts:
                data = rand_array(dt, (N,) + shape)
                name = (f"psum_scatter_{dt}_{mesh_key}_over_{axes_tag(axes)}_shape"
                        f"{'x'.join(map(str, shape))}_dim{sd}_{'tiled' if tiled else 'untiled'}")
                add_case(name, "psum_scatter", mesh_key, axes, dt, data,
                         {"scatter_dimension": sd, "tiled": tiled},
                         lambda x, ax=ax, sd=sd, tiled=tiled:
                         lax.psum_scatter(x, ax, scatter_dimension=sd, tiled=tiled))


# --------------------------------------------------------------------------
# all_to_all


def gen_all_to_all():
    for mesh_key, axes in axes_configs():
        N = n_members(mesh_key)
        G = group_size(MESHES[mesh_key], axes)
        ax = axis_arg(axes)
        variants = [
            # (shape, split, concat, tiled)
            ((G, 3), 0, 0, False), ((G, 3), 0, 1, False), ((3, G), 1, 0, False),
            ((3, G), 1, 1, False),
            ((2 * G, 3), 0, 0, True), ((2 * G, 3), 0, 1, True),
            ((3, 2 * G), 1, 0, True), ((3, 2 * G), 1, 1, True), ((G,), 0, 0, True),
            ((G, 2, 3), 0, 2, False), ((2, 3, G), 2, 0, False),
            ((2, G, 3), 1, 2, True), ((2, 3, G), 2, 1, True),
        ]
        for shape, sa, ca, tiled in variants:
            if mesh_key in ("x4", "x2y4") and shape == (2 * G, 3) and ca == 1:
                dts = ALL_DTYPES
            elif len(shape) == 2:
                dts = ["float32", "int8", "bfloat16", "bool"]
            else:
                dts = ["float32", "int64"]
            for dt in dts:
                data = rand_array(dt, (N,) + shape)
                name = (f"all_to_all_{dt}_{mesh_key}_over_{axes_tag(axes)}_shape"
                        f"{'x'.join(map(str, shape))}_split{sa}_concat{ca}_"
                        f"{'tiled' if tiled else 'untiled'}")
                add_case(name, "all_to_all", mesh_key, axes, dt, data,
                         {"split_axis": sa, "concat_axis": ca, "tiled": tiled},
                         lambda x, ax=ax, sa=sa, ca=ca, tiled=tiled:
                         lax.all_to_all(x, ax, sa, ca, tiled=tiled))


# --------------------------------------------------------------------------
# Edge cases: subnormals, NaN payloads, meshes and groups of one member,
# negative axes.  Inputs are given as bit patterns (no rng), so the cases
# above keep their data whatever is added here.

# Per float dtype: (smallest subnormal, smallest normal, 1.0, +inf, quiet NaN
# with payload 1, signaling NaN with payload 1, sign bit).
FLOAT_BITS = {
    "float32": (0x1, 0x00800000, 0x3f800000, 0x7f800000, 0x7fc00001, 0x7f800001, 0x80000000),
    "float64": (0x1, 0x0010000000000000, 0x3ff0000000000000, 0x7ff0000000000000,
                0x7ff8000000000001, 0x7ff0000000000001, 0x8000000000000000),
    "float16": (0x1, 0x0400, 0x3c00, 0x7c00, 0x7e01, 0x7c01, 0x8000),
    "bfloat16": (0x1, 0x0080, 0x3f80, 0x7f80, 0x7fc1, 0x7f81, 0x8000),
}


def from_bits(dt, cols):
    """Per-member arrays from columns of bit patterns: cols[e][m] is member
    m's element e.  Returns shape (N, len(cols))."""
    d = DTYPES[dt]
    a = np.array(cols, dtype=object).T
    return np.array(a.tolist(), dtype=UINT[d.itemsize]).view(d)


def subnormal_cols(dt, N):
    sub, mn, one, inf, qnan, snan, sign = FLOAT_BITS[dt]
    mant = mn - 1  # largest subnormal
    cols = [
        [sub] * N,                                          # all the smallest subnormal
        [sign | (3 * sub)] * N,                             # all -3 units
        [sign] + [sub] * (N - 1),                           # -0 first, then +sub
        [sub] + [sign] * (N - 1),                           # +sub first, then -0
        [sub if m % 2 else sign | sub for m in range(N)],   # -sub, +sub, ...
        [sign | sub if m % 2 else sub for m in range(N)],   # +sub, -sub, ...
        [mant] + [sub] * (N - 1),                           # largest subnormal, ...
        [mn, sign | (mn + (mn >> 1))] + [0] * (N - 2),      # mn - 1.5 mn -> -0 (flushed)
        [mn, sign | (mn + (mn >> 1)), mn] + [0] * (N - 3) if N >= 3 else [mn, sign | mn],
        [2 * mn, sign | mn] + [0] * (N - 2),                # 2 mn - mn = mn; its mean flushes
        [sub, sign | mn] + [0] * (N - 2),                   # +sub, -mn
        [sub, qnan] + [0] * (N - 2),                        # +sub, NaN
        [sign | sub, one] + [sign | sub] * (N - 2),         # -sub, 1, -sub...
        [mn | 1, sign | mn] + [0] * (N - 2),                # difference: one subnormal unit
    ]
    if dt == "float32":
        # pmean's product just below the smallest normal: 0x013fffff * f32(1/3)
        # rounds (24 bits) to 2^-126 - 2^-150, tiny: flushed.
        cols.append([0x013fffff] + [0] * (N - 1))
        cols.append([0x813fffff] + [0] * (N - 1))
    return cols


def nan_cols(dt, N):
    sub, mn, one, inf, qnan, snan, sign = FLOAT_BITS[dt]
    # A second quiet NaN with another payload, negative.
    qnan2 = sign | (qnan + 1)
    cols = [
        [snan] + [one] * (N - 1),                           # signaling NaN first
        [one] * (N - 1) + [snan],                           # signaling NaN last
        [sign | snan] + [one] * (N - 1),                    # negative signaling NaN
        [qnan, qnan2] + [one] * (N - 2),                    # two NaNs: signs differ
        [qnan2, qnan] + [one] * (N - 2),
        [qnan] + [one] * (N - 2) + [qnan2],                 # first and last
        [one] * (N - 2) + [qnan2, qnan],
        [inf, sign | inf] + [one] * (N - 2),                # inf - inf: default NaN
        [inf, sign | inf] + [qnan] * (N - 2) if N >= 3 else [inf, sign | inf],
        [qnan] + [inf, sign | inf][:N - 1] + [one] * (N - 3) if N >= 3 else [qnan, inf],
        [snan] * N,                                         # all signaling
        [qnan + m for m in range(N)],                       # all NaN, payloads 1..N
        [(sign if m % 2 else 0) | (qnan + m) for m in range(N)],
    ]
    return cols


EDGE_FLOAT = {  # one member's data: -0, NaNs, subnormals, normals, inf
    "float32": [0x80000000, 0x7f800001, 0xffc00002, 0x00000001, 0x80000003, 0x3f800000,
                0xff800000, 0x00800000],
    "float64": [0x8000000000000000, 0x7ff0000000000001, 0x8000000000000001, 0x3ff0000000000000,
                0xfff8000000000005, 0x0000000000000003, 0x7ff0000000000000, 0x0010000000000000],
    "float16": [0x8000, 0x7c01, 0xfe03, 0x0001, 0x8003, 0x3c00, 0xfc00, 0x0400],
    "bfloat16": [0x8000, 0x7f81, 0xffc3, 0x0001, 0x8003, 0x3f80, 0xff80, 0x0080],
}
# The same without NaNs: XLA on CPU runs bfloat16 collectives in float32, so
# JAX's data movement of bfloat16 makes NaNs canonical; collectived moves the
# bits unchanged (see README), so its data-movement cases hold no bfloat16 NaN.
EDGE_BF16_NO_NAN = [0x8000, 0x3f81, 0xbfc3, 0x0001, 0x8003, 0x3f80, 0xff80, 0x0080]


def edge_data(dt, N, movement=False, rotate=True):
    """(N, 8) arrays of edge values for every dtype (member m: the pattern
    rotated by m, so members differ)."""
    if dt in FLOAT_BITS:
        row = EDGE_BF16_NO_NAN if (movement and dt == "bfloat16") else EDGE_FLOAT[dt]
        rows = [row[m % 8:] + row[:m % 8] if rotate else row for m in range(N)]
        return from_bits(dt, [list(c) for c in zip(*rows)])
    d = DTYPES[dt]
    if dt == "bool":
        row = [1, 0, 1, 1, 0, 0, 1, 0]
        return np.array([row[m:] + row[:m] for m in range(N)], dtype=np.bool_)
    info = np.iinfo(d)
    row = [int(info.min), int(info.max), 0, 1, int(info.max) - 1, 3, int(info.min) + 1, 7]
    return np.array([row[m:] + row[:m] for m in range(N)], dtype=object).astype(d)


def gen_edges():
    # Subnormals and NaN payloads in every reducing op and float dtype.
    for mesh_key in ["x2", "x3", "x8"]:
        N = n_members(mesh_key)
        for dt in FLOAT_DTYPES:
            for kind, cols in [("subnormals", subnormal_cols(dt, N)), ("nans", nan_cols(dt, N))]:
                data = from_bits(dt, cols)
                for op, f in RED_OPS.items():
                    add_case(f"{op}_{dt}_{mesh_key}_over_x_{kind}", op, mesh_key, ("x",), dt,
                             data, {}, lambda x, f=f: f(x, "x"))
                # psum_scatter: N blocks of the columns, tiled along dim 0.
                reps = -(-len(cols) // N) * N
                sc = from_bits(dt, (cols * N)[:reps])
                add_case(f"psum_scatter_{dt}_{mesh_key}_over_x_{kind}", "psum_scatter",
                         mesh_key, ("x",), dt, sc, {"scatter_dimension": 0, "tiled": True},
                         lambda x: lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True))
    # NaN payloads (signaling included) through data movement: bits kept.
    for dt in ["float32", "float64", "float16"]:
        N = 3
        data = from_bits(dt, nan_cols(dt, N)[:12])           # 12 elements per member
        add_case(f"all_gather_{dt}_x3_over_x_nans_untiled", "all_gather", "x3", ("x",), dt, data,
                 {"axis": 0, "tiled": False}, lambda x: lax.all_gather(x, "x", axis=0))
        add_case(f"all_gather_{dt}_x3_over_x_nans_tiled", "all_gather", "x3", ("x",), dt, data,
                 {"axis": 0, "tiled": True}, lambda x: lax.all_gather(x, "x", axis=0, tiled=True))
        perm = [[0, 1], [1, 2], [2, 0]]
        add_case(f"ppermute_{dt}_x3_over_x_nans", "ppermute", "x3", ("x",), dt, data,
                 {"perm": perm}, lambda x, perm=perm: lax.ppermute(x, "x", [tuple(q) for q in perm]))
        add_case(f"all_to_all_{dt}_x3_over_x_nans", "all_to_all", "x3", ("x",), dt, data,
                 {"split_axis": 0, "concat_axis": 0, "tiled": True},
                 lambda x: lax.all_to_all(x, "x", 0, 0, tiled=True))

    # A mesh of one member: every op, every dtype.
    for dt in ALL_DTYPES:
        red = edge_data(dt, 1)
        for op, f in RED_OPS.items():
            add_case(f"{op}_{dt}_x1_over_x_edges", op, "x1", ("x",), dt, red, {},
                     lambda x, f=f: f(x, "x"))
        mv = edge_data(dt, 1, movement=True)
        if dt != "bool":
            add_case(f"psum_scatter_{dt}_x1_over_x_edges_tiled", "psum_scatter", "x1", ("x",), dt,
                     red, {"scatter_dimension": 0, "tiled": True},
                     lambda x: lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True))
            add_case(f"psum_scatter_{dt}_x1_over_x_edges_untiled", "psum_scatter", "x1", ("x",),
                     dt, red.reshape(1, 1, 8), {"scatter_dimension": 0, "tiled": False},
                     lambda x: lax.psum_scatter(x, "x", scatter_dimension=0, tiled=False))
        for axis, tiled in [(0, False), (0, True), (1, False)]:
            add_case(f"all_gather_{dt}_x1_over_x_edges_axis{axis}_{'tiled' if tiled else 'untiled'}",
                     "all_gather", "x1", ("x",), dt, mv, {"axis": axis, "tiled": tiled},
                     lambda x, axis=axis, tiled=tiled: lax.all_gather(x, "x", axis=axis, tiled=tiled))
        for pname, perm in [("identity", [[0, 0]]), ("empty", [])]:
            add_case(f"ppermute_{dt}_x1_over_x_edges_{pname}", "ppermute", "x1", ("x",), dt, mv,
                     {"perm": perm},
                     lambda x, perm=perm: lax.ppermute(x, "x", [tuple(q) for q in perm]))
        add_case(f"all_to_all_{dt}_x1_over_x_edges_tiled", "all_to_all", "x1", ("x",), dt, mv,
                 {"split_axis": 0, "concat_axis": 0, "tiled": True},
                 lambda x: lax.all_to_all(x, "x", 0, 0, tiled=True))
        add_case(f"all_to_all_{dt}_x1_over_x_edges_untiled", "all_to_all", "x1", ("x",), dt,
                 mv.reshape(1, 1, 8), {"split_axis": 0, "concat_axis": 1, "tiled": False},
                 lambda x: lax.all_to_all(x, "x", 0, 1, tiled=False))

    # Groups of one inside a bigger mesh: reduced (not dropped).
    for axes in [("y",), ("x", "y"), ("y", "x"), ("x",)]:
        ax = axis_arg(axes)
        tag = axes_tag(axes)
        G = group_size(MESHES["x2y1"], axes)
        for dt in ["float32", "float64", "float16", "bfloat16", "int32", "uint8", "bool"]:
            red = edge_data(dt, 2)
            for op, f in RED_OPS.items():
                add_case(f"{op}_{dt}_x2y1_over_{tag}_edges", op, "x2y1", axes, dt, red, {},
                         lambda x, f=f, ax=ax: f(x, ax))
            if dt != "bool":
                add_case(f"psum_scatter_{dt}_x2y1_over_{tag}_edges", "psum_scatter", "x2y1", axes,
                         dt, red, {"scatter_dimension": 0, "tiled": True},
                         lambda x, ax=ax: lax.psum_scatter(x, ax, scatter_dimension=0, tiled=True))
        for dt in ["float32", "int8"]:
            mv = edge_data(dt, 2, movement=True)
            add_case(f"all_gather_{dt}_x2y1_over_{tag}_edges", "all_gather", "x2y1", axes, dt, mv,
                     {"axis": 0, "tiled": False}, lambda x, ax=ax: lax.all_gather(x, ax, axis=0))
            perm = [[i, (i + 1) % G] for i in range(G)]
            add_case(f"ppermute_{dt}_x2y1_over_{tag}_edges", "ppermute", "x2y1", axes, dt, mv,
                     {"perm": perm},
                     lambda x, ax=ax, perm=perm: lax.ppermute(x, ax, [tuple(q) for q in perm]))
            add_case(f"all_to_all_{dt}_x2y1_over_{tag}_edges", "all_to_all", "x2y1", axes, dt, mv,
                     {"split_axis": 0, "concat_axis": 0, "tiled": True},
                     lambda x, ax=ax: lax.all_to_all(x, ax, 0, 0, tiled=True))

    # Negative axes.  JAX 0.10.2 accepts them for all_gather only: a negative
    # psum_scatter scatter_dimension or all_to_all split/concat axis reaches
    # XLA as is and fails its verifier (or crashes the process), so there is
    # nothing to compare those with.
    for mesh_key, axes in [("x3", ("x",)), ("x2y2", ("x", "y")), ("x2y2", ("y",))]:
        N = n_members(mesh_key)
        ax = axis_arg(axes)
        for shape, axis, tiled in [((2, 3), -1, False), ((2, 3), -1, True), ((2, 3), -2, False),
                                   ((2, 3), -2, True), ((2, 3), -3, False), ((3,), -1, True)]:
            for dt in ["float32", "int8"]:
                data = edge_data(dt, N, movement=True)[:, :int(np.prod(shape))].reshape((N,) + shape)
                name = (f"all_gather_{dt}_{mesh_key}_over_{axes_tag(axes)}_shape"
                        f"{'x'.join(map(str, shape))}_axisneg{-axis}_"
                        f"{'tiled' if tiled else 'untiled'}")
                add_case(name, "all_gather", mesh_key, axes, dt, data,
                         {"axis": axis, "tiled": tiled},
                         lambda x, ax=ax, axis=axis, tiled=tiled:
                         lax.all_gather(x, ax, axis=axis, tiled=tiled))


# --------------------------------------------------------------------------
# float8 (float8_e4m3fn, float8_e5m2): appended after every other case, with
# their own random generator, so the earlier cases stay byte for byte the
# same.

f8_rng = np.random.default_rng(8)


def f8_rand(dt, shape):
    """Ordinary values: mostly small, some near the top of the range (sums
    that overflow), some subnormal."""
    big = 448.0 if dt == "float8_e4m3fn" else 57344.0
    v = f8_rng.standard_normal(size=shape) * np.exp2(f8_rng.integers(-4, 5, size=shape))
    pick = f8_rng.integers(0, 16, size=shape)
    v = np.where(pick == 0, np.sign(v) * big * f8_rng.uniform(0.5, 1.0, size=shape), v)
    tiny = 2.0 ** -9 if dt == "float8_e4m3fn" else 2.0 ** -16
    v = np.where(pick == 1, f8_rng.integers(-7, 8, size=shape) * tiny, v)
    return v.astype(DTYPES[dt])


def f8_codes(dt, N, no_nan=False):
    """(N, 256): member m holds every code, rotated by 37 * m, so each column
    meets different partners. no_nan: NaN codes replaced by 1.0."""
    d = DTYPES[dt]
    row = np.arange(256, dtype=np.uint8)
    out = np.stack([np.roll(row, 37 * m) for m in range(N)])
    if no_nan:
        one = np.array(1.0, np.float32).astype(d).view(np.uint8)
        out = np.where(np.isnan(out.view(d).astype(np.float32)), one, out).astype(np.uint8)
    return out.view(d)


def gen_float8():
    for dt in F8_DTYPES:
        movement_no_nan = dt == "float8_e5m2"
        # Random data through every reduction and layout.
        for op, f in RED_OPS.items():
            for mesh_key, axes in axes_configs():
                N = n_members(mesh_key)
                shape = (5,) if len(MESHES[mesh_key]) == 1 else (2, 5)
                data = f8_rand(dt, (N,) + shape)
                ax = axis_arg(axes)
                add_case(f"{op}_{dt}_{mesh_key}_over_{axes_tag(axes)}_random", op, mesh_key,
                         axes, dt, data, {}, lambda x, f=f, ax=ax: f(x, ax))
            # Every code against varying partners: NaNs, infinities, overflow,
            # subnormals, signed zeros.
            for mesh_key in ["x2", "x3", "x8"]:
                N = n_members(mesh_key)
                add_case(f"{op}_{dt}_{mesh_key}_over_x_codes", op, mesh_key, ("x",), dt,
                         f8_codes(dt, N), {}, lambda x, f=f: f(x, "x"))
            # A mesh of one, and groups of one in a bigger mesh.
            add_case(f"{op}_{dt}_x1_over_x_codes", op, "x1", ("x",), dt, f8_codes(dt, 1), {},
                     lambda x, f=f: f(x, "x"))
            for axes in [("y",), ("x", "y")]:
                ax = axis_arg(axes)
                add_case(f"{op}_{dt}_x2y1_over_{axes_tag(axes)}_codes", op, "x2y1", axes, dt,
                         f8_codes(dt, 2), {}, lambda x, f=f, ax=ax: f(x, ax))
        # psum_scatter.
        for mesh_key, axes in [("x4", ("x",)), ("x8", ("x",)), ("x2y2", ("y", "x")),
                               ("x1", ("x",))]:
            N = n_members(mesh_key)
            G = group_size(MESHES[mesh_key], axes)
            ax = axis_arg(axes)
            for shape, sd, tiled in [((G, 3), 0, False), ((3, 2 * G), 1, True)]:
                data = f8_rand(dt, (N,) + shape)
                add_case(f"psum_scatter_{dt}_{mesh_key}_over_{axes_tag(axes)}_shape"
                         f"{'x'.join(map(str, shape))}_dim{sd}_{'tiled' if tiled else 'untiled'}",
                         "psum_scatter", mesh_key, axes, dt, data,
                         {"scatter_dimension": sd, "tiled": tiled},
                         lambda x, ax=ax, sd=sd, tiled=tiled:
                         lax.psum_scatter(x, ax, scatter_dimension=sd, tiled=tiled))
        for mesh_key in ["x3", "x1"]:
            N = n_members(mesh_key)
            codes = f8_codes(dt, N)
            add_case(f"psum_scatter_{dt}_{mesh_key}_over_x_codes", "psum_scatter", mesh_key,
                     ("x",), dt, codes[:, :255] if N == 3 else codes,
                     {"scatter_dimension": 0, "tiled": True},
                     lambda x: lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True))
        # Data movement: every code (float8_e5m2 without NaNs, see above).
        for mesh_key, axes in [("x3", ("x",)), ("x2y2", ("y", "x")), ("x1", ("x",))]:
            N = n_members(mesh_key)
            G = group_size(MESHES[mesh_key], axes)
            ax = axis_arg(axes)
            codes = f8_codes(dt, N, no_nan=movement_no_nan)
            tag = f"{dt}_{mesh_key}_over_{axes_tag(axes)}_codes"
            add_case(f"all_gather_{tag}", "all_gather", mesh_key, axes, dt, codes,
                     {"axis": 0, "tiled": False}, lambda x, ax=ax: lax.all_gather(x, ax, axis=0))
            perm = [[i, (i + 1) % G] for i in range(G)]
            add_case(f"ppermute_{tag}", "ppermute", mesh_key, axes, dt, codes, {"perm": perm},
                     lambda x, ax=ax, perm=perm: lax.ppermute(x, ax, [tuple(q) for q in perm]))
            k = 256 // G * G
            add_case(f"all_to_all_{tag}", "all_to_all", mesh_key, axes, dt, codes[:, :k],
                     {"split_axis": 0, "concat_axis": 0, "tiled": True},
                     lambda x, ax=ax: lax.all_to_all(x, ax, 0, 0, tiled=True))
        for mesh_key, axes in [("x4", ("x",)), ("x2y4", ("x", "y"))]:
            N = n_members(mesh_key)
            G = group_size(MESHES[mesh_key], axes)
            ax = axis_arg(axes)
            data = f8_rand(dt, (N, 2 * G, 3))
            add_case(f"all_gather_{dt}_{mesh_key}_over_{axes_tag(axes)}_random_axis1_tiled",
                     "all_gather", mesh_key, axes, dt, data, {"axis": 1, "tiled": True},
                     lambda x, ax=ax: lax.all_gather(x, ax, axis=1, tiled=True))
            add_case(f"all_to_all_{dt}_{mesh_key}_over_{axes_tag(axes)}_random_split0_concat1",
                     "all_to_all", mesh_key, axes, dt, data,
                     {"split_axis": 0, "concat_axis": 1, "tiled": True},
                     lambda x, ax=ax: lax.all_to_all(x, ax, 0, 1, tiled=True))


# --------------------------------------------------------------------------
# Reference model (numpy) of what JAX returned.  Every generated case is
# checked against it bit-exactly, so the model doubles as a specification for
# the C++ implementation.


def group_members(mesh_spec, axes, m):
    """(group index of member m, members of its group ordered by group index).

    The group index of a tuple of axes is the row-major linearization of the
    member's coordinates along those axes *in the order given* (first axis
    major), which is what lax.axis_index(axes) returns."""
    names = [n for n, _ in mesh_spec]
    sizes = [s for _, s in mesh_spec]
    d = dict(mesh_spec)
    gsizes = [d[a] for a in axes]
    coords = list(np.unravel_index(m, sizes))
    gidx = int(np.ravel_multi_index([coords[names.index(a)] for a in axes], gsizes))
    members = []
    for g in range(int(np.prod(gsizes))):
        c = list(coords)
        for a, v in zip(axes, np.unravel_index(g, gsizes)):
            c[names.index(a)] = v
        members.append(int(np.ravel_multi_index(c, sizes)))
    return gidx, members


def accum_dtype(dt):
    """bfloat16 reductions are carried out in float32 (rounded once at the end);
    float16/float32/float64 and integers in their own type; bool as int32."""
    if dt == BF16:
        return np.dtype(np.float32)
    if dt == np.bool_:
        return np.dtype(np.int32)
    return dt


# Float arithmetic as XLA on x86 CPU does it, bit for bit.  numpy computes
# with gradual underflow and its own NaN choices, so the rules are explicit:
#  - flush-to-zero / denormals-are-zero: float32, float64 and bfloat16 (which
#    is computed in float32) read a subnormal input as a zero of its sign, and
#    a result below the smallest normal, after rounding to the type's
#    precision with an unbounded exponent, is a zero of its sign.  float16 is
#    computed in float32, where its subnormals are normal: never flushed;
#  - NaNs: a sum keeps the NaN of the last NaN member, quieted (float16: the
#    first NaN of the accumulator); inf + -inf gives the default NaN, sign
#    set; float16/bfloat16 NaN results are canonical (sign | quiet bit).

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
QUIET_BIT = {4: 0x00400000, 8: 0x0008000000000000}
DEFAULT_NAN = {4: 0xffc00000, 8: 0xfff8000000000000}


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(UINT[a.dtype.itemsize])


def select(c, a, b):
    """c ? a : b element-wise, on the bits (NaN payloads kept)."""
    return np.where(c, bits(a), bits(b)).view(a.dtype)


def quiet(a):
    """a with the quiet bit set on its NaNs (float32/float64)."""
    u = UINT[a.dtype.itemsize]
    return select(np.isnan(a), (bits(a) | u(QUIET_BIT[a.dtype.itemsize])).view(a.dtype), a)


def flush(a):
    """Subnormals (float32/float64) to zeros of their sign."""
    with np.errstate(all="ignore"):
        tiny = np.abs(a) < np.finfo(a.dtype).tiny
    return select(tiny, np.copysign(np.zeros_like(a), a), a)


def default_nan(dt, shape):
    return np.full(shape, DEFAULT_NAN[np.dtype(dt).itemsize], UINT[np.dtype(dt).itemsize]).view(dt)


def add_last_nan(acc, x):
    """acc + x in acc's type (float32/float64), x already flushed: flushed
    result; the NaN of x if any, else of acc, else the default NaN."""
    with np.errstate(all="ignore"):
        r = flush(acc + x)
    r = select(np.isnan(r), default_nan(acc.dtype, r.shape), r)
    r = select(np.isnan(acc), acc, r)
    return select(np.isnan(x), quiet(x), r)


def mul_flushed(s, scale):
    """s * scale (scale = 1/n > 0, normal, <= 1) in s's type (float32 or
    float64), rounded with an unbounded exponent, then flushed if tiny; a
    NaN s stays (quieted)."""
    t = s.dtype
    with np.errstate(all="ignore"):
        if t == np.float32:
            p = s.astype(np.float64) * np.float64(scale)  # exact
            q = (p * 2.0 ** 64).astype(np.float32)        # one rounding, 24 bits
            small = np.abs(q) < np.float32(2.0 ** -62)
            r = np.where(small, np.copysign(np.float32(0), q),
                         (q.astype(np.float64) * 2.0 ** -64).astype(np.float32))
            r = select(np.abs(s) < 1, r.astype(np.float32), (s * np.float32(scale)).astype(np.float32))
        else:
            q = (s * 2.0 ** 512) * np.float64(scale)
            small = np.abs(q) < 2.0 ** -510
            r = np.where(small, np.copysign(0.0, q), q * 2.0 ** -512)
            r = select(np.abs(s) < 1, r, s * np.float64(scale))
    return select(np.isnan(s), quiet(s), r)


def half_out(acc):
    """float32 values of float16 numbers (or NaN) -> float16, NaN canonical."""
    with np.errstate(all="ignore"):
        h = bits(acc.astype(np.float16))
    canon = np.where(np.signbit(acc), 0xfe00, 0x7e00).astype(np.uint16)
    return np.where(np.isnan(acc), canon, h).view(np.float16)


def bf16_out(acc):
    """float32 -> bfloat16 (nearest even), NaN canonical."""
    with np.errstate(all="ignore"):
        b = bits(acc.astype(BF16))
    canon = np.where(np.signbit(acc), 0xffc0, 0x7fc0).astype(np.uint16)
    return np.where(np.isnan(acc), canon, b).view(BF16)


# float8: XLA on CPU runs float8 collectives in float16 (its float
# normalization pass): the operands are converted to float16 (exact; a NaN
# becomes the canonical float16 NaN of its sign), the collective runs under
# the float16 rules above, and the result is converted back (nearest even).
# XLA's float16 -> float8_e4m3fn conversion is ml_dtypes' (overflow, inf and
# NaN give the NaN of their sign, 0x7f | sign); its float16 -> float8_e5m2
# conversion is ml_dtypes' except that every NaN becomes 0x7f, sign dropped.
# So a float8_e5m2 NaN comes out of any XLA collective that converts (all but
# all_to_all) as 0x7f; collectived moves data bits unchanged, so the data
# movement cases hold no float8_e5m2 NaN.


def f8_in(x):
    """float8 -> float16 (exact), NaNs canonical (sign kept)."""
    h = x.astype(np.float16)
    canon = np.where(np.signbit(h), 0xfe00, 0x7e00).astype(np.uint16)
    return np.where(np.isnan(h), canon, bits(h)).view(np.float16)


def f8_out(h, dt):
    """float16 values -> float8 dt, as XLA's convert."""
    with np.errstate(all="ignore"):
        r = bits(np.asarray(h).astype(dt))
    if dt == F8E5M2:
        r = np.where(np.isnan(h), np.uint8(0x7f), r).astype(np.uint8)
    return np.ascontiguousarray(r).view(dt)


def f8e5m2_canonical(x):
    """float8_e5m2 NaNs -> 0x7f, other bits kept."""
    b = bits(x)
    return np.where((b & 0x7f) > 0x7c, np.uint8(0x7f), b).astype(np.uint8).view(F8E5M2)


def model_psum(xs, dt):
    """acc = +0 (in the accumulation type); acc = acc + x for each member in
    group order, rounding to the accumulation type after every addition;
    integers wrap.  Floats: flush-to-zero and the NaN rules above."""
    if dt in (F8E4M3FN, F8E5M2):
        return f8_out(model_psum([f8_in(x) for x in xs], np.dtype(np.float16)), dt)
    t = accum_dtype(dt)
    if dt == np.float16:
        acc = np.zeros(xs[0].shape, np.float32)
        for x in xs:
            x32 = x.astype(np.float32)
            with np.errstate(all="ignore"):
                r = (acc + x32).astype(np.float16).astype(np.float32)
            r = select(np.isnan(r), default_nan(np.float32, r.shape), r)
            r = select(np.isnan(x32), x32, r)
            acc = select(np.isnan(acc), acc, r)            # the first NaN stays
        return half_out(acc)
    if dt.kind == "f" or dt == BF16:
        acc = np.zeros(xs[0].shape, t)
        for x in xs:
            acc = add_last_nan(acc, flush(x.astype(t)))
        return bf16_out(acc) if dt == BF16 else acc
    acc = np.zeros(xs[0].shape, t)
    with np.errstate(all="ignore"):
        for x in xs:
            acc = (acc + x.astype(t)).astype(t)
    return acc if dt == np.bool_ else acc.astype(dt)


def model_pmean(xs, dt):
    """psum (above), then multiply by the reciprocal 1/n (XLA rewrites x / n as
    x * (1/n)).  Integers/bool: float32 (8/16/32-bit, bool via int32) or
    float64 (64-bit) of the *wrapped* integer sum, times F(1/n).  Floats: the
    psum result in its dtype times T(1/n), T = dtype (float32 for bfloat16,
    rounded back to bfloat16; float16 computes in float32 with the float16
    reciprocal), the product flushed if tiny."""
    s = model_psum(xs, dt)
    n = len(xs)
    if dt in (F8E4M3FN, F8E5M2):
        # float16: the float8 sum back in float16, times float16(1/n) (the
        # float32 product is exact), rounded to float16, then to float8.
        s32 = f8_in(s).astype(np.float32)
        with np.errstate(all="ignore"):
            r = s32 * np.float32(np.float16(1.0 / n))
        return f8_out(half_out(select(np.isnan(s32), s32, r)), dt)
    with np.errstate(all="ignore"):
        if s.dtype.kind in "iu":
            f = np.dtype(np.float64) if s.dtype.itemsize == 8 else np.dtype(np.float32)
            return (s.astype(f) * f.type(1.0 / n)).astype(f)
    if dt == np.float16:
        scale = np.float32(np.float16(1.0 / n))
        s32 = s.astype(np.float32)
        with np.errstate(all="ignore"):
            r = s32 * scale                               # exact, never tiny in float32
        return half_out(select(np.isnan(s32), s32, r))
    if dt == BF16:
        return bf16_out(mul_flushed(s.astype(np.float32), np.float32(1.0 / n)))
    return mul_flushed(s, dt.type(1.0 / n))


def model_pmax_pmin(xs, dt, is_max):
    """acc = identity (-inf/+inf for floats, min/max for ints, False/True for
    bool); for each member in group order: if (x > acc) acc = x  (x < acc for
    pmin).  So NaN never wins (all-NaN gives -inf/+inf) and on ties between
    -0.0 and +0.0 the earlier member's zero is kept.  float32/float64/bfloat16
    subnormals compete, and win, as zeros of their sign."""
    if dt in (F8E4M3FN, F8E5M2):
        return f8_out(model_pmax_pmin([f8_in(x) for x in xs], np.dtype(np.float16), is_max), dt)
    if dt == np.bool_:
        ident = not is_max
    elif dt.kind in "iu":
        ident = np.iinfo(dt).min if is_max else np.iinfo(dt).max
    else:
        ident = -np.inf if is_max else np.inf
    acc = np.full(xs[0].shape, ident, dt)
    with np.errstate(all="ignore"):
        if dt.kind == "f" or dt == BF16:
            acc_v = acc.astype(np.float64)
            for x in xs:
                if dt == np.float16:
                    xb = x
                elif dt == BF16:
                    xb = flush(x.astype(np.float32)).astype(BF16)  # exact: a zero or x
                else:
                    xb = flush(x)
                xv = xb.astype(np.float64)
                mask = (xv > acc_v) if is_max else (xv < acc_v)
                acc_v = np.where(mask, xv, acc_v)
                acc = select(mask, xb, acc)
            return acc
        for x in xs:
            mask = (x > acc) if is_max else (x < acc)
            acc = np.where(mask, x, acc).astype(dt)
    return acc


def model_mesh_of_one(x, dt, op):
    """psum/pmean/pmax/pmin in a mesh of one member (a one-device program):
    XLA drops the all-reduce.  The input itself, converted to the result
    dtype: float bits kept, except bfloat16 NaNs, which become canonical (XLA
    converts bfloat16 to float32 and back around the collective); integers
    and bool as the one-member reduction (exact)."""
    if dt in (np.float32, np.float64, np.float16, F8E4M3FN):
        return x.copy()
    if dt == F8E5M2:
        return f8e5m2_canonical(x)
    if dt == BF16:
        canon = np.where(np.signbit(x.astype(np.float32)), 0xffc0, 0x7fc0).astype(np.uint16)
        return np.where(np.isnan(x.astype(np.float32)), canon, bits(x)).view(BF16)
    if op == "psum":
        return model_psum([x], dt)
    if op == "pmean":
        return model_pmean([x], dt)
    return model_pmax_pmin([x], dt, op == "pmax")


def model_all_to_all(xs, r, sa, ca, tiled):
    """Member r (group index) gets chunk r of every member's split_axis
    (chunk size shape[split_axis]/n), concatenated along concat_axis in group
    order.  Untiled (shape[split_axis] == n): the output shape is
    np.insert(np.delete(shape, split_axis), concat_axis, n) and
    out[..., j (at concat_axis), ...] = x_j with split_axis index r."""
    n = len(xs)
    if tiled:
        return np.concatenate([np.split(x, n, axis=sa)[r] for x in xs], axis=ca)
    return np.stack([np.take(x, r, axis=sa) for x in xs], axis=ca)


def model_case(case):
    mesh_spec = [(n, s) for n, s in case["mesh"]]
    axes = case["axes"]
    dt = DTYPES[case["dtype"]]
    shape = tuple(case["shape"])
    ins = [np.frombuffer(bytes.fromhex(h), dt).reshape(shape) for h in case["inputs"]]
    p = case["params"]
    outs = []
    for m in range(len(ins)):
        r, members = group_members(mesh_spec, axes, m)
        xs = [ins[i] for i in members]
        op = case["op"]
        if len(ins) == 1 and op in ("psum", "pmean", "pmax", "pmin"):
            o = model_mesh_of_one(xs[0], dt, op)
        elif op == "psum":
            o = model_psum(xs, dt)
        elif op == "pmean":
            o = model_pmean(xs, dt)
        elif op in ("pmax", "pmin"):
            o = model_pmax_pmin(xs, dt, op == "pmax")
        elif op == "all_gather":
            o = (np.concatenate if p["tiled"] else np.stack)(xs, axis=p["axis"])
        elif op == "ppermute":
            # NOTE: JAX numbers the members of a ppermute group by ascending
            # mesh position (row-major over the mesh axes in *mesh* order),
            # ignoring the order of a tuple axis_name; ('y','x') behaves like
            # ('x','y') here, unlike axis_index / all_gather / psum.
            srt = sorted(members)
            rr = srt.index(m)
            srcs = [s for s, d_ in p["perm"] if d_ == rr]
            o = ins[srt[srcs[0]]].copy() if srcs else np.zeros(shape, dt)
        elif op == "psum_scatter":
            s = model_psum(xs, dt)
            sd = p["scatter_dimension"]
            o = np.split(s, len(xs), axis=sd)[r] if p["tiled"] else np.take(s, r, axis=sd)
        elif op == "all_to_all":
            o = model_all_to_all(xs, r, p["split_axis"], p["concat_axis"], p["tiled"])
        else:
            raise ValueError(op)
        outs.append(np.ascontiguousarray(o))
    return outs


def verify_model(cases):
    bad = {}
    total = {}
    for c in cases:
        total[c["op"]] = total.get(c["op"], 0) + 1
        outs = model_case(c)
        ok = all(o.dtype.name == c["out_dtype"] and list(o.shape) == c["out_shape"]
                 and to_hex(o) == h for o, h in zip(outs, c["outputs"]))
        if not ok:
            bad.setdefault(c["op"], []).append(c["name"])
    print("reference model vs JAX, cases mismatching per op:",
          {op: len(bad.get(op, [])) for op in total}, "of", total)
    for op, names in bad.items():
        print(f"  {op}: e.g. {names[:5]}")
    return not bad


# --------------------------------------------------------------------------
# numerical behaviour report (printed, not stored)


def mismatches(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    w = a.dtype.itemsize
    return int((a.view(f"u{w}") != b.view(f"u{w}")).sum())


def seq_sum(xs, t, dt):
    """x0 + x1 + ... left to right in type t, then rounded once to dt."""
    acc = xs[0].astype(t)
    with np.errstate(all="ignore"):
        for x in xs[1:]:
            acc = (acc + x.astype(t)).astype(t)
    return acc.astype(dt)


def numerics_report():
    r = np.random.default_rng(12345)
    L = 4096
    print("\n=== numerics report ===")
    configs = [("x2", ("x",)), ("x3", ("x",)), ("x4", ("x",)), ("x8", ("x",)),
               ("x2y4", ("x",)), ("x2y4", ("y",)), ("x2y4", ("x", "y")),
               ("x2y4", ("y", "x"))]
    for dtn in FLOAT_DTYPES:
        dt = DTYPES[dtn]
        for mesh_key, axes in configs:
            mesh_spec = MESHES[mesh_key]
            N = n_members(mesh_key)
            if dt in (np.float16, BF16):
                v = r.standard_normal((N, L)) * np.exp2(r.integers(-6, 6, size=(N, L)))
            else:
                v = r.standard_normal((N, L)) * np.exp2(r.integers(-20, 20, size=(N, L)))
            data = v.astype(dt)
            ax = axis_arg(axes)
            ps = run_collective(mesh_spec, lambda x: lax.psum(x, ax), data)
            pm = run_collective(mesh_spec, lambda x: lax.pmean(x, ax), data)
            st = {"seq_in_own_dtype": 0, "f32_acc_round_once": 0, "f64_acc_round_once": 0,
                  "seq_device_order": 0, "seq_reversed": 0, "pmean_model": 0,
                  "pmean_true_division": 0}
            for m in range(N):
                _, members = group_members(mesh_spec, axes, m)
                xs = [data[i] for i in members]
                st["seq_in_own_dtype"] += mismatches(ps[m], seq_sum(xs, dt, dt))
                st["f32_acc_round_once"] += mismatches(ps[m], seq_sum(xs, np.float32, dt))
                st["f64_acc_round_once"] += mismatches(ps[m], seq_sum(xs, np.float64, dt))
                st["seq_device_order"] += mismatches(
                    ps[m], seq_sum([data[i] for i in sorted(members)], accum_dtype(dt), dt))
                st["seq_reversed"] += mismatches(ps[m], seq_sum(xs[::-1], accum_dtype(dt), dt))
                st["pmean_model"] += mismatches(pm[m], model_pmean(xs, dt))
                st["pmean_true_division"] += mismatches(
                    pm[m], (ps[m].astype(np.float64) / len(xs)).astype(dt))
            print(f"psum {dtn:8s} {mesh_key:4s} over {str(axes):10s} mismatching elements "
                  f"(of {N * L}): {st}")

    for dtn in ["int8", "uint8", "int32", "uint32", "int64", "uint64"]:
        dt = DTYPES[dtn]
        for mesh_key in ["x3", "x8"]:
            N = n_members(mesh_key)
            data = np.stack([rand_array(dtn, (L,)) for _ in range(N)])
            pm = run_collective(MESHES[mesh_key], lambda x: lax.pmean(x, "x"), data)
            xs = list(data)
            w = model_psum(xs, dt)
            f = pm.dtype
            exact = data.astype(object).sum(axis=0)
            print(f"pmean {dtn:6s} {mesh_key}: out dtype {f.name}; mismatches vs "
                  f"F(wrapped sum)*F(1/n): {mismatches(pm[0], model_pmean(xs, dt))}, "
                  f"vs F(wrapped sum)/n: {mismatches(pm[0], (w.astype(f) / f.type(N)).astype(f))}, "
                  f"vs exact mean: {mismatches(pm[0], np.array([float(e) / N for e in exact]).astype(f))} (of {L})")

    b = r.integers(0, 2, size=(4, 8)).astype(np.bool_)
    for op, f in RED_OPS.items():
        try:
            o = run_collective(MESHES["x4"], lambda x, f=f: f(x, "x"), b)
            print(f"{op} bool -> dtype {o.dtype}, member0 {o[0].tolist()} (column sums {b.sum(0).tolist()})")
        except Exception as e:
            print(f"{op} bool -> ERROR {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    # NaN / signed zero, 2 members: columns (m0, m1)
    for dtn in FLOAT_DTYPES:
        dt = DTYPES[dtn]
        d = np.array([[np.nan, 1.0, -0.0, 0.0, np.nan, np.nan, np.inf],
                      [1.0, np.nan, 0.0, -0.0, 2.0, np.nan, -np.inf]]).astype(dt)
        d[0, 4] = -np.abs(d[0, 4])  # NaN with the sign bit set
        w = dt.itemsize
        print(f"{dtn}: m0={[hex(v) for v in d[0].view(f'u{w}').tolist()]}")
        print(f"{' ' * len(dtn)}  m1={[hex(v) for v in d[1].view(f'u{w}').tolist()]}")
        for op in ["pmax", "pmin", "psum"]:
            o = run_collective(MESHES["x2"], lambda x, f=RED_OPS[op]: f(x, "x"), d)
            print(f"{' ' * len(dtn)}  {op}={[hex(v) for v in o[0].view(f'u{w}').tolist()]}")

    # pmax/pmin NaN handling on larger data vs NaN-propagating semantics
    vals = np.array([np.nan, -np.nan, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.0])
    for dtn in FLOAT_DTYPES:
        dt = DTYPES[dtn]
        for mesh_key in ["x3", "x8"]:
            N = n_members(mesh_key)
            data = r.choice(vals, size=(N, L)).astype(dt)
            data[:, :16] = np.array(np.nan).astype(dt)
            for op in ["pmax", "pmin"]:
                o = run_collective(MESHES[mesh_key], lambda x, f=RED_OPS[op]: f(x, "x"), data)
                prop = (np.max if op == "pmax" else np.min)(data.astype(np.float64), axis=0).astype(dt)
                model = model_pmax_pmin(list(data), dt, op == "pmax")
                print(f"{op} {dtn:8s} {mesh_key}: mismatching elements vs model (identity, "
                      f"'if x>acc'): {mismatches(o[0], model)}, vs NaN-propagating max/min: "
                      f"{mismatches(o[0], prop)} (of {L}); all-NaN column -> "
                      f"{o[0, 0].astype(np.float64)}")

    print("\noutput shapes (op, params, shape -> out_shape), from the generated cases:")
    seen = set()
    for c in CASES:
        if c["op"] in ("psum", "pmean", "pmax", "pmin", "ppermute"):
            continue
        key = (c["op"], json.dumps(c["params"], sort_keys=True), "G=%d" % group_size(
            [(n, s) for n, s in c["mesh"]], c["axes"]), tuple(c["shape"]), tuple(c["out_shape"]))
        if key not in seen:
            seen.add(key)
    for k in sorted(seen):
        print("  ", *k)

    if FAILURES:
        print("\ncases JAX refused (not written):")
        for nm, et, msg in FAILURES:
            print(f"  {nm}: {et}: {msg}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "data", "vectors.json"))
    ap.add_argument("--no-report", action="store_true",
                    help="skip the printed numerics report")
    args = ap.parse_args()

    assert len(jax.devices()) >= 8, jax.devices()
    gen_reductions()
    gen_special()
    gen_all_gather()
    gen_ppermute()
    gen_psum_scatter()
    gen_all_to_all()
    gen_edges()
    gen_float8()

    doc = {"generator": f"jax {jax.__version__}", "cases": CASES}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.write("\n")
    size = os.path.getsize(args.out)
    per_op = {}
    for c in CASES:
        per_op[c["op"]] = per_op.get(c["op"], 0) + 1
    print(f"wrote {args.out}: {len(CASES)} cases, {size} bytes; per op {per_op}")
    ok = verify_model(CASES)
    if not args.no_report:
        numerics_report()
    elif FAILURES:
        print(f"{len(FAILURES)} cases refused by JAX")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
