"""collectived inside ``jax.jit``: JAX's collectives across processes.

Each function takes what its ``jax.lax`` namesake takes (an array, a Python
scalar or a pytree of them; an axis name or a tuple of names), plus
``mesh=``: a ``collectived.Mesh`` joined by this process. Inside
``jax.jit`` or outside it, under ``jax.grad`` and ``jax.vmap``, it runs the
collective over that mesh's members, which are independent processes (no
``jax.distributed``)::

    import jax, jax.numpy as jnp
    import collectived, collectived.jax as cjax

    mesh = collectived.connect().join_mesh("train", {"data": 4})

    @jax.jit
    def step(grads):
        return cjax.pmean(grads, "data", mesh=mesh)

Operands are taken as JAX takes them: numpy arrays and Python scalars get
JAX's dtype (float64 becomes float32 unless ``jax_enable_x64`` is on) and
Python scalars stay weakly typed. Result dtypes are ``jax.lax``'s.

It is an XLA FFI custom call on CPU arrays: the handler copies the operand
into the mesh's staging buffer (shared memory), runs the op through the C++
SDK (small reductions among the members themselves, without the daemon),
and copies the result into XLA's output. On CUDA arrays (a module built with
CUDA) a second handler does the same on XLA's stream, never waiting for the
GPU: device-to-device copies through the mesh's GPU staging buffer, the op
submitted stream-ordered; an op's failure then fails the mesh's next call.
Calls are side-effecting, so XLA neither drops nor merges them. They run in the order of XLA's schedule,
which is the same in every process when every process runs the same
program: pass per-process values (the process index, its data) as
arguments, not as constants baked into the trace; two programs that differ
in constants may schedule independent calls in different orders. The
daemon fails swapped calls that differ in kind, shape, dtype or axes
(FAILED_PRECONDITION, "does not match across members"), but two swapped
calls alike in all of those would combine the wrong operands.
``axis_index`` is read at run time for that reason. A pytree is one call per
leaf, in the order of ``jax.tree_util.tree_leaves``.

Bit-identity with ``jax.lax`` is per op: each call gives exactly the bits
``jax.lax``'s collective gives for the same operands. A whole program may
still differ in its last bits from the same program written with
``jax.lax`` in ``shard_map``, because XLA can fuse or reorder arithmetic
around ``jax.lax.pmean`` (it knows what it computes) but not around an
opaque call.

One process should run one jitted call on a mesh at a time (calls from
several threads at once are serialized per mesh in no fixed order). Errors
are the exceptions jaxlib raises for a failed custom call
(``jax.errors.JaxRuntimeError``, or ``ValueError`` in some jaxlib versions)
whose message starts with the status code (``ABORTED``,
``DEADLINE_EXCEEDED``, ...) and carries the daemon's message.

Ctrl-C (SIGINT) while a call waits for the other members gives the op up
within about 10 ms: unless the op had completed, the mesh breaks for every
member (their ops fail with ``ABORTED``, saying this member gave its op up),
as for Python's own synchronous calls, so no member is left one result
behind. The call fails with ``CANCELLED: interrupted by SIGINT (Ctrl-C)
...``, not ``KeyboardInterrupt``: Python runs its signal handler only on the
main thread between bytecodes, and that thread is inside XLA until the call
fails; a KeyboardInterrupt raised then would land in the middle of XLA's
error. Wrap the step in ``with collectived.jax.interruptible():`` to get
``KeyboardInterrupt`` instead. A Ctrl-C while no call waits is Python's, as
usual.

A compiled function refers to its mesh by a handle: once the mesh is left or
garbage-collected, calling it fails with FAILED_PRECONDITION.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

import jax
import jax.extend
import jax.interpreters.batching
import jax.interpreters.mlir
import jax.numpy as jnp

from . import (_ALL_GATHER, _ALL_TO_ALL, _BROADCAST, _PMAX, _PMEAN, _PMIN, _PPERMUTE, _PSUM,
               _PSUM_SCATTER, InvalidArgument, Mesh, Unimplemented, _axes, _code, _result_dtype)
from . import _collectived as _ext

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "ppermute", "psum_scatter",
           "all_to_all", "broadcast", "axis_index", "axis_size", "interruptible"]

_TARGET = "collectived_collective"
_TARGET_CUDA = "collectived_collective_cuda"
_registered = False
_register_lock = threading.Lock()

AxisName = Union[str, Sequence[str]]
PyTree = Any


def _register() -> None:
    global _registered
    with _register_lock:
        if not _registered:
            handler = _ext.jax_ffi_handler()
            if handler is None:
                raise Unimplemented(
                    "collectived was built without jaxlib's FFI headers: install jax, then "
                    "reinstall collectived (pip install ./client/python) to use collectived.jax")
            jax.ffi.register_ffi_target(_TARGET, handler, platform="cpu")
            # On CUDA too, where this module was built with CUDA: operands in
            # device memory, the op ordered on XLA's stream. Without it, a
            # call on a GPU fails at compile time naming the missing target.
            cuda_handler = _ext.jax_ffi_cuda_handler()
            if cuda_handler is not None:
                jax.ffi.register_ffi_target(_TARGET_CUDA, cuda_handler, platform="CUDA")
            _registered = True
    # Ctrl-C reaches calls waiting on XLA's threads (jax_ffi.cc); again on
    # every trace, in case a signal.signal() since replaced the watch.
    _ext.jax_watch_interrupts()


# Weak types (Python scalars) kept as jax.lax keeps them. JAX has no public
# spelling for it; without these internals results are strongly typed.
try:
    from jax._src import dtypes as _jdtypes
    from jax._src.lax import lax as _jlax

    def _weaken(y, weak: bool):
        if not weak:
            return y
        return _jlax._convert_element_type(y, y.dtype, weak_type=True)

    def _is_weak(x) -> bool:
        return bool(_jdtypes.is_weakly_typed(x))
except (ImportError, AttributeError):  # pragma: no cover - other JAX versions
    def _weaken(y, weak: bool):
        return y

    def _is_weak(x) -> bool:
        return False


def _check_mesh(mesh) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise InvalidArgument(f"mesh= must be a collectived.Mesh, got {type(mesh).__name__}")
    return mesh


def _names(axis_name: AxisName) -> Tuple[str, ...]:
    names = _axes(axis_name)
    if names is None:
        raise InvalidArgument("axis_name must be a name or a tuple of names, as in jax.lax")
    if any("," in n for n in names):
        raise InvalidArgument(f"axis names cannot contain ',': {names}")
    return tuple(names)


def _no_groups(fn: str, axis_index_groups) -> None:
    if axis_index_groups is not None:
        raise NotImplementedError(
            f"collectived.jax.{fn}: axis_index_groups is not supported (jax.lax's shard_map "
            "does not support it either); join a mesh with an axis for the groups instead")


# The custom call as a JAX primitive of its own rather than jax.ffi.ffi_call
# with has_side_effect=True: that makes the call a JAX effect, and a jitted
# function with effects leaves jit's C++ fast path (about 40 us a call
# here). The primitive has no JAX effect; its lowering marks the custom call
# side-effecting for XLA (never dropped, merged or reordered with the other
# side-effecting calls), as ffi_call's did. JAX itself drops a call whose
# result is unused, as it drops an unused jax.lax.psum.
_prim = jax.extend.core.Primitive("collectived_collective")


def _abstract(x, *, out_shape, out_dtype, **attrs):
    return jax.core.ShapedArray(out_shape, out_dtype)


def _lowering(target: str):
    lower_ffi = jax.ffi.ffi_lowering(target, has_side_effect=True)

    def lower(ctx, x, *, out_shape, out_dtype, mesh, kind, axes, a, b, tiled, perm):
        return lower_ffi(ctx, x, mesh=np.int64(mesh), kind=np.int32(kind), axes=axes,
                         a=np.int64(a), b=np.int64(b), tiled=np.bool_(tiled),
                         perm=np.asarray(perm, dtype=np.int64))

    return lower


@functools.lru_cache(maxsize=256)
def _eager(**params):
    return jax.jit(functools.partial(_prim.bind, **params))


def _batch(args, dims, *, out_shape, **params):
    # Batch dimensions go in front; axis attributes count from the end.
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    return _prim.bind(x, out_shape=(x.shape[0],) + tuple(out_shape), **params), 0


_prim.def_impl(lambda x, **params: _eager(**params)(x))
_prim.def_abstract_eval(_abstract)
jax.interpreters.mlir.register_lowering(_prim, _lowering(_TARGET), platform="cpu")
jax.interpreters.mlir.register_lowering(_prim, _lowering(_TARGET_CUDA), platform="cuda")
jax.interpreters.batching.primitive_batchers[_prim] = _batch


def _ffi(mesh: Mesh, kind: int, x, names: Tuple[str, ...], out_shape, *, a: int = 0, b: int = 0,
         tiled: bool = False, perm: Sequence[Tuple[int, int]] = (), out_dtype=None):
    """The custom call on one array. Axis attributes are negative (counted
    from the end) so that batch dimensions jax.vmap adds in front leave them
    right; the SDK counts negative axes from the end."""
    if out_dtype is None:
        dtype = np.dtype(x.dtype)
        _code(dtype)
        out_dtype = jax.dtypes.canonicalize_dtype(_result_dtype(kind, dtype))
    return _prim.bind(x, out_shape=tuple(int(d) for d in out_shape), out_dtype=np.dtype(out_dtype),
                      mesh=int(mesh._ext.handle), kind=int(kind), axes=",".join(names), a=int(a),
                      b=int(b), tiled=bool(tiled),
                      perm=tuple(int(v) for pair in perm for v in pair))


def _differentiable(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _with_vjp(forward: Callable, backward: Callable) -> Callable:
    """forward(x) with backward(ct) as its transpose (jax.grad): the
    collectives are linear, so the residuals are nothing."""
    f = jax.custom_vjp(forward)
    f.defvjp(lambda x: (forward(x), None), lambda _, ct: (backward(ct),))
    return f


def _no_derivative(name: str) -> Callable:
    """The backward of a collective jax.lax does not differentiate either."""
    def backward(_):
        raise NotImplementedError(
            f"Differentiation rule for '{name}' not implemented (jax.lax.{name} has none either)")
    return backward


def _leafwise(x: PyTree, fn: Callable) -> PyTree:
    """fn on every leaf of x as JAX takes it (canonical dtype), weak types
    kept."""
    def one(leaf):
        arr = jnp.asarray(leaf)
        return _weaken(fn(arr), _is_weak(arr))
    return jax.tree_util.tree_map(one, x)


def _reduce(kind: int, name: str, x: PyTree, axis_name: AxisName, mesh: Mesh,
            backward: Optional[Callable]) -> PyTree:
    """psum, pmean, pmax or pmin on every leaf; `backward(ct, names)` is its
    transpose (None: not differentiable)."""
    names = _names(axis_name)
    return _collective(mesh, x, lambda v: _ffi(mesh, kind, v, names, v.shape),
                       (lambda ct: backward(ct, names)) if backward else _no_derivative(name))


def psum(x: PyTree, axis_name: AxisName, *, mesh: Mesh, axis_index_groups=None) -> PyTree:
    """jax.lax.psum across the mesh's processes: the sum over the members of
    the axes (bool counts, as int32). Its transpose is the identity on each
    member (JAX's pbroadcast), as shard_map differentiates psum."""
    _no_groups("psum", axis_index_groups)
    return _reduce(_PSUM, "psum", x, axis_name, mesh, lambda ct, names: ct)


def pmean(x: PyTree, axis_name: AxisName, *, mesh: Mesh, axis_index_groups=None) -> PyTree:
    """jax.lax.pmean: the mean over the members of the axes (integers and
    bool give floats). Its transpose divides by the group size."""
    _no_groups("pmean", axis_index_groups)
    return _reduce(_PMEAN, "pmean", x, axis_name, mesh,
                   lambda ct, names: ct / mesh.axis_size(names))


def pmax(x: PyTree, axis_name: AxisName, *, mesh: Mesh, axis_index_groups=None) -> PyTree:
    """jax.lax.pmax: the element-wise maximum over the members (not
    differentiable, as in jax.lax)."""
    _no_groups("pmax", axis_index_groups)
    return _reduce(_PMAX, "pmax", x, axis_name, mesh, None)


def pmin(x: PyTree, axis_name: AxisName, *, mesh: Mesh, axis_index_groups=None) -> PyTree:
    """jax.lax.pmin: the element-wise minimum over the members (not
    differentiable, as in jax.lax)."""
    _no_groups("pmin", axis_index_groups)
    return _reduce(_PMIN, "pmin", x, axis_name, mesh, None)


def _position(axis: int, rank: int, what: str) -> int:
    pos = axis + rank if axis < 0 else axis
    if not 0 <= pos < rank:
        raise InvalidArgument(f"{what} {axis} is out of range for rank {rank}")
    return pos


def _gather(mesh: Mesh, arr, names, axis: int, tiled: bool):
    shape = mesh._gather_shape(arr, names, axis, tiled)
    neg = _position(axis, len(shape), "axis") - len(shape)
    return _ffi(mesh, _ALL_GATHER, arr, names, shape, a=neg, tiled=tiled)


def _scatter(mesh: Mesh, arr, names, dim: int, tiled: bool):
    shape = mesh._scatter_shape(arr, names, dim, tiled)
    neg = _position(dim, arr.ndim, "scatter_dimension") - arr.ndim
    return _ffi(mesh, _PSUM_SCATTER, arr, names, shape, a=neg, tiled=tiled)


def _collective(mesh: Mesh, x: PyTree, forward: Callable, backward: Callable) -> PyTree:
    """forward on every leaf of x; under jax.grad, backward(ct) is its
    transpose (the collectives are linear, or not differentiable)."""
    _check_mesh(mesh)
    _register()

    def one(arr):
        return _with_vjp(forward, backward)(arr) if _differentiable(arr) else forward(arr)
    return _leafwise(x, one)


def all_gather(x: PyTree, axis_name: AxisName, *, mesh: Mesh, axis_index_groups=None,
               axis: int = 0, tiled: bool = False) -> PyTree:
    """jax.lax.all_gather: every member's x, stacked at ``axis`` (concatenated
    when ``tiled``). Its transpose is psum_scatter."""
    _no_groups("all_gather", axis_index_groups)
    names = _names(axis_name)
    return _collective(mesh, x, lambda v: _gather(mesh, v, names, axis, tiled),
                   lambda ct: _scatter(mesh, ct, names, axis, tiled))


def psum_scatter(x: PyTree, axis_name: AxisName, *, mesh: Mesh, scatter_dimension: int = 0,
                 axis_index_groups=None, tiled: bool = False) -> PyTree:
    """jax.lax.psum_scatter: this member's block of the sum. Its transpose is
    all_gather."""
    _no_groups("psum_scatter", axis_index_groups)
    names = _names(axis_name)
    return _collective(mesh, x, lambda v: _scatter(mesh, v, names, scatter_dimension, tiled),
                   lambda ct: _gather(mesh, ct, names, scatter_dimension, tiled))


def _permute(mesh: Mesh, arr, names, perm):
    return _ffi(mesh, _PPERMUTE, arr, names, arr.shape, perm=perm)


def ppermute(x: PyTree, axis_name: AxisName, perm: Iterable[Tuple[int, int]], *,
             mesh: Mesh) -> PyTree:
    """jax.lax.ppermute: (source, dest) pairs of indices along the axes;
    members no pair sends to get zeros. Its transpose is the inverse
    permutation."""
    names = _names(axis_name)
    pairs = [(int(s), int(d)) for s, d in perm]
    inverse = [(d, s) for s, d in pairs]
    return _collective(mesh, x, lambda v: _permute(mesh, v, names, pairs),
                   lambda ct: _permute(mesh, ct, names, inverse))


def _exchange(mesh: Mesh, arr, names, split_axis: int, concat_axis: int, tiled: bool):
    n = mesh.axis_size(names)
    shape = list(arr.shape)
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
    return _ffi(mesh, _ALL_TO_ALL, arr, names, shape, a=split - arr.ndim,
                b=concat - len(shape), tiled=tiled)


def all_to_all(x: PyTree, axis_name: AxisName, split_axis: int, concat_axis: int, *,
               mesh: Mesh, axis_index_groups=None, tiled: bool = False) -> PyTree:
    """jax.lax.all_to_all. Its transpose is the all_to_all with the two axes
    swapped."""
    _no_groups("all_to_all", axis_index_groups)
    names = _names(axis_name)
    return _collective(mesh, x, lambda v: _exchange(mesh, v, names, split_axis, concat_axis, tiled),
                   lambda ct: _exchange(mesh, ct, names, concat_axis, split_axis, tiled))


def broadcast(x: PyTree, axis_name: AxisName, root: int = 0, *, mesh: Mesh) -> PyTree:
    """Every member gets the x of group index ``root`` (no jax.lax
    namesake). Its transpose sums the members' cotangents into root's."""
    names = _names(axis_name)

    def backward(ct):
        total = _ffi(mesh, _PSUM, ct, names, ct.shape)
        return jnp.where(axis_index(names, mesh=mesh) == root, total, jnp.zeros_like(total))
    return _collective(mesh, x, lambda v: _ffi(mesh, _BROADCAST, v, names, v.shape, a=root),
                   backward)


_AXIS_INDEX = 100  # answered by the handler itself (jax_ffi.cc)


def axis_index(axis_name: AxisName, *, mesh: Mesh) -> jax.Array:
    """jax.lax.axis_index: this process's index along the axes, an int32 read
    when the function runs (not a trace-time constant: every process traces the
    same program)."""
    mesh = _check_mesh(mesh)
    _register()
    names = _names(axis_name)
    mesh.axis_index(names)  # an unknown axis fails here, at trace time
    return _ffi(mesh, _AXIS_INDEX, jnp.zeros((), np.int32), names, (), out_dtype=np.int32)


def axis_size(axis_name: AxisName, *, mesh: Mesh) -> int:
    """The number of members along the axes (a Python int, as
    jax.lax.axis_size)."""
    return _check_mesh(mesh).axis_size(axis_name)


_INTERRUPTED = "CANCELLED: interrupted by SIGINT"


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within it, a jitted collectived call given up on Ctrl-C raises
    ``KeyboardInterrupt`` (from the CANCELLED error XLA raised) rather than
    that error::

        with cjax.interruptible():
            loss = step(batch).block_until_ready()

    Everything else passes through unchanged."""
    try:
        yield
    except Exception as e:  # the class jaxlib raises differs by version
        if str(e).startswith(_INTERRUPTED):
            raise KeyboardInterrupt(str(e)) from e
        raise
