"""collectived inside ``jax.jit``: JAX's collectives across processes.

Each function takes the operand and the axis name(s) as its ``jax.lax``
namesake does, plus ``mesh=``: a ``collectived.Mesh`` joined by this process.
Inside ``jax.jit`` (or outside it) it runs the collective over that mesh's
members, which are independent processes (no ``jax.distributed``)::

    import jax, jax.numpy as jnp
    import collectived, collectived.jax as cjax

    mesh = collectived.connect().join_mesh("train", {"data": 4})

    @jax.jit
    def step(grads):
        return cjax.pmean(grads, "data", mesh=mesh)

It is an XLA FFI custom call on CPU arrays: the handler copies the operand
into the mesh's staging buffer (shared memory), runs the op through the C++
SDK, and copies the result into XLA's output (two copies of the array per
call). Calls are side-effecting, so XLA neither drops nor merges them. They
run in the order of XLA's schedule, which is the same in every process when
every process runs the same program: pass per-process values (the process
index, its data) as arguments, not as constants baked into the trace; two
programs that differ in constants may schedule independent calls in
different orders. The daemon fails swapped calls that differ in kind, shape,
dtype or axes (FAILED_PRECONDITION, "does not match across members"), but
two swapped calls alike in all of those would combine the wrong operands.
``axis_index`` is read at run time for that reason. One process should run
one jitted call on a mesh at a time (calls from several threads at once are
serialized per mesh in no fixed order). Errors raise ``jax.errors.JaxRuntimeError``
(XlaRuntimeError) whose message starts with the status code (``ABORTED``,
``DEADLINE_EXCEEDED``, ...) and carries the daemon's message.

A compiled function refers to its mesh by a handle: once the mesh is left or
garbage-collected, calling it fails with FAILED_PRECONDITION.

The per-call cost is two copies of the operand plus the op; the handler's
staging buffers grow to the largest operand and stay until the mesh goes.
"""

from __future__ import annotations

import threading
from typing import Iterable, Sequence, Tuple, Union

import numpy as np

import jax

from . import (_ALL_GATHER, _ALL_TO_ALL, _BROADCAST, _PMAX, _PMEAN, _PMIN, _PPERMUTE, _PSUM,
               _PSUM_SCATTER, InvalidArgument, Mesh, Unimplemented, _axes, _code, _result_dtype)
from . import _collectived as _ext

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "ppermute", "psum_scatter",
           "all_to_all", "broadcast", "axis_index", "axis_size"]

_TARGET = "collectived_collective"
_registered = False
_register_lock = threading.Lock()


def _register() -> None:
    global _registered
    with _register_lock:
        if _registered:
            return
        handler = _ext.jax_ffi_handler()
        if handler is None:
            raise Unimplemented(
                "collectived was built without jaxlib's FFI headers: install jax, then "
                "reinstall collectived (pip install ./client/python) to use collectived.jax")
        jax.ffi.register_ffi_target(_TARGET, handler, platform="cpu")
        _registered = True


AxisName = Union[str, Sequence[str]]


def _call(mesh: Mesh, kind: int, x, axis_name: AxisName, out_shape, *, a: int = 0, b: int = 0,
          tiled: bool = False, perm: Iterable[Tuple[int, int]] = ()):
    if not isinstance(mesh, Mesh):
        raise InvalidArgument(f"mesh= must be a collectived.Mesh, got {type(mesh).__name__}")
    _register()
    names = _axes(axis_name)
    if names is None:
        raise InvalidArgument("axis_name must be a name or a tuple of names, as in jax.lax")
    if any("," in n for n in names):
        raise InvalidArgument(f"axis names cannot contain ',': {names}")
    dtype = np.dtype(x.dtype)
    _code(dtype)
    out_dtype = np.int32 if kind == _AXIS_INDEX else _result_dtype(kind, dtype)
    out = jax.ShapeDtypeStruct(tuple(out_shape), out_dtype)
    flat = np.asarray([v for pair in perm for v in pair], dtype=np.int64)
    return jax.ffi.ffi_call(_TARGET, out, has_side_effect=kind != _AXIS_INDEX)(
        x, mesh=np.int64(mesh._ext.handle), kind=np.int32(kind), axes=",".join(names),
        a=np.int64(a), b=np.int64(b), tiled=np.bool_(tiled), perm=flat)


def psum(x, axis_name: AxisName, *, mesh: Mesh):
    """jax.lax.psum across the mesh's processes (bool counts, as int32)."""
    return _call(mesh, _PSUM, x, axis_name, x.shape)


def pmean(x, axis_name: AxisName, *, mesh: Mesh):
    """jax.lax.pmean (integers and bool give floats)."""
    return _call(mesh, _PMEAN, x, axis_name, x.shape)


def pmax(x, axis_name: AxisName, *, mesh: Mesh):
    """jax.lax.pmax."""
    return _call(mesh, _PMAX, x, axis_name, x.shape)


def pmin(x, axis_name: AxisName, *, mesh: Mesh):
    """jax.lax.pmin."""
    return _call(mesh, _PMIN, x, axis_name, x.shape)


def _position(axis: int, rank: int, what: str) -> int:
    pos = axis + rank if axis < 0 else axis
    if not 0 <= pos < rank:
        raise InvalidArgument(f"{what} {axis} is out of range for rank {rank}")
    return pos


def all_gather(x, axis_name: AxisName, *, mesh: Mesh, axis: int = 0, tiled: bool = False):
    """jax.lax.all_gather: every member's x, stacked at ``axis`` (concatenated
    when ``tiled``)."""
    shape = mesh._gather_shape(x, axis_name, axis, tiled)
    return _call(mesh, _ALL_GATHER, x, axis_name, shape, a=axis, tiled=tiled)


def psum_scatter(x, axis_name: AxisName, *, mesh: Mesh, scatter_dimension: int = 0,
                 tiled: bool = False):
    """jax.lax.psum_scatter: this member's block of the sum."""
    shape = mesh._scatter_shape(x, axis_name, scatter_dimension, tiled)
    return _call(mesh, _PSUM_SCATTER, x, axis_name, shape, a=scatter_dimension, tiled=tiled)


def ppermute(x, axis_name: AxisName, perm: Iterable[Tuple[int, int]], *, mesh: Mesh):
    """jax.lax.ppermute: (source, dest) pairs; members no pair sends to get
    zeros."""
    return _call(mesh, _PPERMUTE, x, axis_name, x.shape, perm=list(perm))


def all_to_all(x, axis_name: AxisName, split_axis: int, concat_axis: int, *, mesh: Mesh,
               tiled: bool = False):
    """jax.lax.all_to_all."""
    n = mesh.axis_size(axis_name)
    shape = list(x.shape)
    split = _position(split_axis, len(shape), "split_axis")
    concat = _position(concat_axis, len(shape), "concat_axis")
    if tiled:
        if shape[split] % n:
            raise InvalidArgument(f"split_axis {split} ({shape[split]}) does not split over {n}")
        shape[split] //= n
        shape[concat] *= n
    else:
        if shape[split] != n:
            raise InvalidArgument(f"untiled all_to_all needs split_axis of size {n}")
        del shape[split]
        shape.insert(concat, n)
    return _call(mesh, _ALL_TO_ALL, x, axis_name, shape, a=split_axis, b=concat_axis,
                 tiled=tiled)


def broadcast(x, axis_name: AxisName, root: int = 0, *, mesh: Mesh):
    """Every member gets the x of group index ``root``."""
    return _call(mesh, _BROADCAST, x, axis_name, x.shape, a=root)


_AXIS_INDEX = 100  # answered by the handler itself (jax_ffi.cc)


def axis_index(axis_name: AxisName, *, mesh: Mesh):
    """jax.lax.axis_index: this process's index along the axes, an int32 read
    when the function runs (not a trace-time constant: every process traces the
    same program)."""
    mesh.axis_index(axis_name)  # an unknown axis fails here, at trace time
    return _call(mesh, _AXIS_INDEX, np.zeros((), np.int32), axis_name, ())


def axis_size(axis_name: AxisName, *, mesh: Mesh) -> int:
    """The number of members along the axes."""
    return mesh.axis_size(axis_name)
