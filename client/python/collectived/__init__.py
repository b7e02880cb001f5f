"""collectived: JAX's named-axis collectives across processes.

A process connects to its host's collectived daemon, joins a mesh of named
axes with the other processes of its job, and runs psum, pmean, pmax, pmin,
all_gather, ppermute, psum_scatter, all_to_all, broadcast and barrier over
the mesh's axes, as ``jax.lax`` does over the devices of one program::

    import numpy as np
    import collectived

    with collectived.connect(name="worker") as c:
        mesh = c.join_mesh("train", {"data": 4}, timeout=60)
        x = mesh.zeros((1024,), np.float32)      # lives in shared memory
        x[:] = mesh.axis_index("data")
        mesh.psum(x, "data")                     # in place: x is now 0+1+2+3
        m = mesh.pmean(x, "data", inplace=False)  # a new array, x unchanged

Arrays allocated by ``Client.empty``/``zeros``/``buffer`` (and the ``Mesh``
forms) are numpy arrays over memory the daemon shares with this process: ops
on them copy nothing in this process, and they export DLPack
(``torch.from_dlpack(x)``, ``jax.dlpack.from_dlpack(x)`` view the shared
memory). Any other array works too — numpy, anything with ``__dlpack__``
(viewed without a copy), anything ``np.asarray`` accepts — staged through a
pooled shared buffer: one copy in and one copy out per op (the cost of a
``memcpy`` of the array each way).

Every member must run the same collectives in the same order. Errors are
exceptions carrying the daemon's status code and message (``Aborted`` naming
the member that died, ``DeadlineExceeded`` naming those that never
submitted, ...), all subclasses of ``collectived.Error``. Waits release the
GIL and return on Ctrl-C (``KeyboardInterrupt``). Ctrl-C during a
synchronous call (``mesh.psum(x, ...)``) gives its op up: unless the op had
completed, the mesh breaks (every member's ops then fail with ``Aborted``,
saying this member gave its op up), because nobody can wait for that op
again and this member's next op would otherwise be paired with the others'
next ones, one result behind. An op given up on the daemon path still runs
to its end there (it writes its result into the buffers when it completes);
the mesh breaks at the next op of any member. A small psum, pmean, pmax or
pmin in place on an array in a shared buffer runs among the members
themselves, and is given up at once, unless the others arrived at that very
moment (the op then completes). Ctrl-C while waiting on a ``Future``
(``result()``) leaves its op in flight: wait for it again. Signal handlers run
during that wait must not start a collective on the same mesh (it fails
with ``FailedPrecondition``: it would wait for the op it interrupted).

``*_async`` forms return a ``Future`` (``result(timeout)``, ``done()``, and
``await fut`` in asyncio).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _collectived as _ext

__version__: str = _ext.__version__

__all__ = [
    "connect", "Client", "Mesh", "Future", "DeviceArray", "Error", "Cancelled", "Unknown",
    "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists", "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable",
    "DataLoss", "Unauthenticated", "DTYPES",
]

# ---------------------------------------------------------------------------
# Errors: one class per gRPC status code, all subclasses of Error.
# ---------------------------------------------------------------------------


class Error(Exception):
    """A collectived call failed. ``code`` is the gRPC status code (an int,
    as ``grpc.StatusCode``'s value) and ``message`` the daemon's message."""

    code = 2

    def __init__(self, message: str = "", code: Optional[int] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{type(self).__name__}: {self.message}"


class Cancelled(Error): code = 1
class Unknown(Error): code = 2
class InvalidArgument(Error, ValueError): code = 3
class DeadlineExceeded(Error, TimeoutError): code = 4
class NotFound(Error): code = 5
class AlreadyExists(Error): code = 6
class PermissionDenied(Error): code = 7
class ResourceExhausted(Error): code = 8
class FailedPrecondition(Error): code = 9
class Aborted(Error): code = 10
class OutOfRange(Error): code = 11
class Unimplemented(Error, NotImplementedError): code = 12
class Internal(Error): code = 13
class Unavailable(Error, ConnectionError): code = 14
class DataLoss(Error): code = 15
class Unauthenticated(Error): code = 16


_ERRORS = {cls.code: cls for cls in Error.__subclasses__()}


def _error(code: int, message: str) -> Error:
    return _ERRORS.get(code, Unknown)(message, code)


_ext._set_error_factory(_error)

# ---------------------------------------------------------------------------
# Element types: numpy's names (ml_dtypes' for bfloat16 and the float8s).
# ---------------------------------------------------------------------------

#: numpy dtype name -> collectived.v1.DType value.
DTYPES: Dict[str, int] = {
    "float32": 1, "float64": 2, "float16": 3, "bfloat16": 4, "int8": 5, "uint8": 6,
    "int32": 7, "uint32": 8, "int64": 9, "uint64": 10, "bool": 11,
    "float8_e4m3fn": 12, "float8_e5m2": 13,
}


def _dtype(dtype: Any) -> np.dtype:
    """np.dtype of a dtype-like, with ml_dtypes' names understood."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


_CODES: Dict[np.dtype, int] = {}


def _code(dtype: np.dtype) -> int:
    code = _CODES.get(dtype)
    if code is None:
        if not dtype.isnative:
            raise InvalidArgument(
                f"dtype {dtype.str} is not in this machine's byte order: convert it first "
                f"(x.astype(x.dtype.newbyteorder('=')))")
        code = DTYPES.get(dtype.name)
        if code is not None:
            _CODES[dtype] = code
    if code is None:
        raise InvalidArgument(
            f"dtype {dtype.name} is not supported; supported: {', '.join(DTYPES)}")
    return code


# psum, pmean, ... as _collectived numbers them.
_PSUM, _PMEAN, _PMAX, _PMIN, _ALL_GATHER, _PPERMUTE, _PSUM_SCATTER, _ALL_TO_ALL, \
    _BROADCAST, _BARRIER = range(10)

Axes = Union[str, Sequence[str]]


def _result_dtype(kind: int, dtype: np.dtype) -> np.dtype:
    """The dtype of an op's result, as in JAX: psum of bool counts (int32);
    pmean of integers and bool is a float (float64 for 64-bit integers)."""
    if kind == _PSUM and dtype == np.bool_:
        return np.dtype(np.int32)
    if kind == _PMEAN and dtype.kind in "biu":
        return np.dtype(np.float64 if dtype.itemsize == 8 else np.float32)
    return dtype


def _axes(axes: Optional[Axes]) -> Optional[List[str]]:
    """JAX's axis_name: a name, or a tuple of names (None: every axis)."""
    if axes is None:
        return None
    if isinstance(axes, str):
        return [axes]
    names = list(axes)
    if not all(isinstance(a, str) for a in names):
        raise InvalidArgument(f"axis names must be strings, got {axes!r}")
    return names


def _as_array(x: Any) -> np.ndarray:
    """x as a numpy array: itself, a zero-copy view through DLPack (torch,
    jax and cupy-on-host arrays, anything with ``__dlpack__``), or
    ``np.asarray(x)``. A DeviceArray stays itself (GPU memory)."""
    if isinstance(x, (np.ndarray, DeviceArray)) or _on_gpu(x):
        return x
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError, ValueError):
            pass  # e.g. a device numpy cannot read: np.asarray says why
    return np.asarray(x)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _locate(a: np.ndarray, client: "Client") -> Optional[Tuple["_ext.Buffer", int]]:
    """(buffer, byte offset) of a C-contiguous array lying in a shared buffer
    of ``client``, else None (an array in another client's buffer is staged:
    this session cannot name that buffer)."""
    if not a.flags.c_contiguous:
        return None
    return _ext.locate(_address(a), a.nbytes, client._ext)


# ---------------------------------------------------------------------------
# GPU arrays
# ---------------------------------------------------------------------------

# DLPack's type codes (dlpack.h, DLDataTypeCode) by numpy kind, and for the
# dtypes ml_dtypes adds.
_DLPACK_KIND = {"b": 6, "i": 0, "u": 1, "f": 2}
_DLPACK_NAMED = {"bfloat16": 4, "float8_e4m3fn": 10, "float8_e5m2": 12}
_KDLCUDA = 2


def _dlpack_type_of(dt: np.dtype) -> Optional[Tuple[int, int]]:
    """DLPack's (type code, bits) of a numpy dtype; None when it has none."""
    code = _DLPACK_NAMED.get(dt.name, _DLPACK_KIND.get(dt.kind))
    return None if code is None else (code, dt.itemsize * 8)


# The other way, for every collectived dtype.
_FROM_DLPACK = {_dlpack_type_of(_dtype(name)): _dtype(name) for name in DTYPES}


def _writable_gpu(a: Any) -> bool:
    """Whether an op may write its result into a staged GPU array: not into
    JAX's (immutable) arrays."""
    return not type(a).__module__.startswith(("jax", "jaxlib"))


def _gpu_info(a: Any) -> tuple:
    """_ext.dlpack_info of a CUDA array of another library, exported so that
    its producer's pending work comes before the legacy default stream
    (DLPack's stream=1), where the staging copies run."""
    try:
        capsule = a.__dlpack__(stream=1)
    except TypeError:  # a producer without the stream argument
        capsule = a.__dlpack__()
    return _ext.dlpack_info(capsule)


def _on_gpu(a: Any) -> bool:
    """Whether a is a CUDA array of another library (torch, cupy, JAX on a
    GPU: DLPack's kDLCUDA), which ops stage through a GPU buffer."""
    if isinstance(a, (np.ndarray, DeviceArray)) or not hasattr(a, "__dlpack_device__"):
        return False
    try:
        return int(a.__dlpack_device__()[0]) == _KDLCUDA
    except Exception:  # not a device we know
        return False


def _dlpack_dtype(code: int, bits: int) -> np.dtype:
    if (code, bits) in _FROM_DLPACK:
        return _FROM_DLPACK[(code, bits)]
    raise InvalidArgument(f"DLPack type (code {code}, {bits} bits) is not a collectived dtype")


class DeviceArray:
    """An array in a GPU shared buffer (``Client.empty(..., device="cuda:0")``
    and the like): GPU memory the daemon reduces, gathers and permutes in
    place, as it does a host buffer. It is not a numpy array: view it without
    a copy through DLPack (``torch.from_dlpack(a)``, ``cupy.from_dlpack(a)``,
    ``jax.dlpack.from_dlpack(a)``) or the CUDA Array Interface
    (``cupy.asarray(a)``, Numba), and give it (or such a view's owner, this
    object) to the collectives. ``ptr`` is its device address in this
    process; ``device`` the daemon's name of the GPU, ``device_ordinal``
    its CUDA ordinal here. The memory stays mapped while this object or an
    export of it lives."""

    __slots__ = ("_buf", "_offset", "_shape", "_dtype", "__weakref__")

    def __init__(self, buf: "_ext.Buffer", offset: int, shape: Tuple[int, ...], dtype: Any):
        self._buf = buf
        self._offset = int(offset)
        self._shape = tuple(int(d) for d in shape)
        self._dtype = np.dtype(dtype)

    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: int(np.prod(self._shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self._dtype.itemsize)
    device = property(lambda self: self._buf.device, doc="The GPU, as the daemon names it.")
    device_ordinal = property(lambda self: self._buf.device_ordinal,
                              doc="The GPU's CUDA device ordinal in this process.")
    ptr = property(lambda self: self._buf.address + self._offset,
                   doc="The device address of the first element.")

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self._shape}, dtype={self._dtype}, device={self.device!r}, "
                f"ptr={self.ptr:#x})")

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self._shape[0]

    def reshape(self, *shape) -> "DeviceArray":
        """The same memory with another shape of as many elements (one -1
        is inferred)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        new = [int(d) for d in shape]
        known = int(np.prod([d for d in new if d != -1], dtype=np.int64))
        if new.count(-1) == 1 and known > 0 and self.size % known == 0:
            new[new.index(-1)] = self.size // known
        if any(d < 0 for d in new) or int(np.prod(new, dtype=np.int64)) != self.size:
            raise InvalidArgument(f"cannot reshape an array of shape {self._shape} "
                                  f"({self.size} elements) to {tuple(shape)}")
        return DeviceArray(self._buf, self._offset, tuple(new), self._dtype)

    def __array__(self, *args, **kwargs):
        raise TypeError(
            f"a DeviceArray is GPU memory ({self.device}): numpy cannot read it; copy it to "
            "the host through a GPU library, e.g. torch.from_dlpack(a).cpu().numpy() or "
            "cupy.asnumpy(cupy.from_dlpack(a))")

    def _dlpack_type(self) -> Tuple[int, int]:
        dl_type = _dlpack_type_of(self._dtype)
        if dl_type is None:
            raise BufferError(f"dtype {self._dtype} has no DLPack type")
        return dl_type

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_KDLCUDA, self.device_ordinal)

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None):
        """The DLPack capsule of this array (no copy). ``stream`` needs no
        synchronization: an op's result is complete on the GPU when the op
        returns (or its Future's result() does), so any consumer stream may
        read it; the stream-ordered form leaves ordering to the caller."""
        if copy:
            raise BufferError("copy=True: a DeviceArray is exported without a copy only")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"dl_device {tuple(dl_device)}: this array is on "
                              f"{self.__dlpack_device__()} (kDLCUDA, ordinal)")
        code, bits = self._dlpack_type()
        view = _ext.device_ndarray(self.ptr, list(self._shape), code, bits,
                                   self.device_ordinal, self)
        return view.__dlpack__() if max_version is None else view.__dlpack__(
            max_version=tuple(max_version))

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The CUDA Array Interface, version 3 (no synchronization needed: see
        __dlpack__). bfloat16 and float8 have no type string there: use
        DLPack for them."""
        if self._dtype.kind == "V" or self._dtype.name in _DLPACK_NAMED:
            raise AttributeError(
                f"dtype {self._dtype} has no CUDA Array Interface type string: use DLPack "
                "(torch.from_dlpack, cupy.from_dlpack, jax.dlpack.from_dlpack)")
        return {"shape": self._shape, "typestr": self._dtype.str,
                "data": (self.ptr if self.size else 0, False), "version": 3,
                "strides": None, "stream": None}


def _stream_handle(stream: Any) -> int:
    """A CUDA stream's handle from what ``stream=`` takes: an int (a
    cudaStream_t; 0, the legacy default stream, is cudaStreamLegacy), an
    object with ``__cuda_stream__()`` (the CUDA stream protocol: (version,
    handle)), ``cuda_stream`` (torch.cuda.Stream) or ``ptr``
    (cupy.cuda.Stream)."""
    if isinstance(stream, (bool, np.bool_)):
        raise InvalidArgument(f"stream must be a CUDA stream, got {stream!r}")
    if isinstance(stream, (int, np.integer)):
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):
        handle = int(stream.__cuda_stream__()[1])
    elif hasattr(stream, "cuda_stream"):
        handle = int(stream.cuda_stream)
    elif hasattr(stream, "ptr"):
        handle = int(stream.ptr)
    else:
        raise InvalidArgument(
            f"stream must be a CUDA stream (an int handle, or an object with __cuda_stream__, "
            f"cuda_stream or ptr), got {type(stream).__name__}")
    if handle < 0:
        raise InvalidArgument(f"stream handle {handle} is negative")
    return handle or 1  # 0 names the legacy default stream, which is cudaStreamLegacy (1)


# ---------------------------------------------------------------------------
# Futures
# ---------------------------------------------------------------------------


class Future:
    """An op in flight. ``result()`` waits for it and returns its output
    array (or raises its error); ``done()`` tells whether it completed;
    ``await future`` waits in asyncio (in the loop's default executor)."""

    def __init__(self, ext: "_ext.Future", finish):
        self._ext = ext
        self._finish = finish
        self._result = None
        self._error: Optional[BaseException] = None
        self._finished = False
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self._ext.done()

    def result(self, timeout: Optional[float] = None) -> Optional[np.ndarray]:
        """The op's output, once it completed; raises its error (a
        collectived.Error). ``timeout``: seconds to wait, then TimeoutError
        with the op still in flight (default: the mesh's op timeout plus a
        grace period, after which the daemon has failed the op anyway)."""
        return self._result_after(timeout, give_up=False)

    def _sync_result(self) -> Optional[np.ndarray]:
        # A synchronous call's wait: Ctrl-C during it gives the op up (the
        # mesh breaks unless the op completed; see the module's docstring).
        return self._result_after(None, give_up=True)

    def _result_after(self, timeout: Optional[float], give_up: bool) -> Optional[np.ndarray]:
        self._ext.wait(-1.0 if timeout is None else float(timeout), give_up)
        with self._lock:
            if not self._finished:
                # Once only, even when it fails (it hands staging blocks back).
                self._finished = True
                try:
                    self._result = self._finish(self._ext) if self._finish else None
                except BaseException as e:
                    self._error = e
            if self._error is not None:
                raise self._error
        return self._result

    def exception(self, timeout: Optional[float] = None) -> Optional[Error]:
        """The op's error (None if it succeeded); waits like result()."""
        try:
            self.result(timeout)
        except Error as e:
            return e
        return None

    @property
    def sequence(self) -> int:
        """The op's sequence number on its mesh, once completed (-1 before)."""
        return self._ext.sequence

    @property
    def timing(self) -> Dict[str, int]:
        """Fast-path ops: where the time went, CLOCK_MONOTONIC ns per stage
        (``submitted_ns``, ``taken_ns``, ``matched_ns``, ``ready_ns``,
        ``started_ns``, ``launched_ns``, ``executed_ns``, ``completed_ns``,
        ``reaped_ns``; 0 where the op did not reach a stage, or over gRPC)
        and ``device_ns``, a duration: a GPU op's span on the daemon's
        stream from its first enqueue (about ``started_ns``) to the end of
        its GPU work. See ``OpTiming`` in the C++ SDK."""
        return self._ext.timing

    def __await__(self):
        return asyncio.get_running_loop().run_in_executor(None, self.result).__await__()


# ---------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------


def connect(name: str = "", socket: Optional[str] = None, *, connect_timeout: float = 10.0,
            rpc_timeout: float = 30.0, close_timeout: float = 1.0,
            fast_path: bool = True) -> "Client":
    """Opens a session on the host's daemon.

    socket: its control socket (default: $COLLECTIVED_SOCKET, else
    $XDG_RUNTIME_DIR/collectived/collectived.sock, else
    /tmp/collectived-<uid>/collectived.sock). name: shown in the daemon's
    diagnostics. fast_path: submit ops through the session's shared-memory
    queue (False: over gRPC; results are the same). Raises Unavailable when
    no daemon answers within connect_timeout seconds.
    """
    return Client(_ext.Client.connect(socket or "", name, connect_timeout, rpc_timeout,
                                      close_timeout, fast_path))


class Client:
    """A session with the daemon (from ``connect``). Closing it (``close()``,
    ``with``, or garbage collection) breaks the meshes it is in for their
    other members and frees its buffers in the daemon."""

    def __init__(self, ext: "_ext.Client"):
        self._ext = ext
        self._pool_lock = threading.Lock()
        self._pool: Dict[int, List[np.ndarray]] = {}
        self._gpu_pool: Dict[Tuple[str, int], List["DeviceArray"]] = {}

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the session (waits for the daemon at most close_timeout)."""
        with self._pool_lock:
            self._pool.clear()
        self._ext.close()

    @property
    def closed(self) -> bool:
        return self._ext.closed

    @property
    def session_id(self) -> str:
        return self._ext.session_id

    @property
    def socket_path(self) -> str:
        return self._ext.socket_path

    @property
    def fast_path(self) -> bool:
        return self._ext.fast_path

    def buffer(self, nbytes: int, device: str = "cpu") -> Union[np.ndarray, "DeviceArray"]:
        """A new zeroed shared buffer of at least ``nbytes`` bytes, as a 1-D
        uint8 array of ``nbytes`` elements: a numpy array of host memory, or
        a DeviceArray of GPU memory for ``device="cuda:N"`` (or
        ``"cuda:GPU-<uuid>"``; the daemon must have the GPU and this SDK be
        built with CUDA, or FailedPrecondition says which is missing). Freed
        in the daemon after the last array viewing it is gone (at this
        client's next allocation or ``collect()``), or when the client
        closes."""
        if nbytes < 0:
            raise InvalidArgument(f"nbytes must be >= 0, got {nbytes}")
        buf = self._ext.allocate(max(int(nbytes), 1), device)
        if buf.device_ordinal >= 0:
            return DeviceArray(buf, 0, (max(int(nbytes), 0),), np.uint8)
        return buf.view()[:max(int(nbytes), 0)]

    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32,
              device: str = "cpu") -> Union[np.ndarray, "DeviceArray"]:
        """A new array of ``shape`` and ``dtype`` in its own shared buffer
        (zeroed: the daemon hands out zeroed memory) on ``device`` (see
        buffer(): a DeviceArray on a GPU)."""
        dt = _dtype(dtype)
        _code(dt)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        block = self.buffer(n, device)
        if isinstance(block, DeviceArray):
            return DeviceArray(block._buf, 0, shape, dt)
        return block[:n].view(dt).reshape(shape)

    zeros = empty

    def collect(self) -> int:
        """Frees in the daemon the buffers no array uses any more; returns
        how many (allocations do this too)."""
        return self._ext.collect()

    def join_mesh(self, name: str, axes: Union[Dict[str, int], Sequence[Tuple[str, int]]], *,
                  coordinate: Optional[Sequence[int]] = None, scope: str = "",
                  timeout: float = 60.0, op_timeout: Optional[float] = None,
                  join_token: str = "") -> "Mesh":
        """Joins (or creates) mesh ``name`` with ``axes`` (major to minor,
        e.g. ``{"data": 2, "model": 4}``); returns when every member joined.

        coordinate: this member's place on each axis (default: the daemon
        assigns the next free one; every member must choose the same way).
        scope: the job the mesh belongs to. timeout: seconds to wait for the
        others (DeadlineExceeded names the missing coordinates). op_timeout:
        seconds each op waits for every member (default: the daemon's).
        join_token: a secret the first member sets and the others must match.
        """
        pairs = list(axes.items()) if isinstance(axes, dict) else [tuple(p) for p in axes]
        ext = self._ext.join_mesh(name, [(str(a), int(n)) for a, n in pairs],
                                  [int(c) for c in (coordinate or ())], scope, float(timeout),
                                  float(op_timeout or 0.0), join_token)
        return Mesh(self, ext)

    # Staging buffers for arrays that are not in shared memory, by size class
    # (powers of two from 4 KiB), reused across ops.
    def _stage(self, nbytes: int) -> np.ndarray:
        cls = max(4096, 1 << max(0, int(nbytes) - 1).bit_length())
        with self._pool_lock:
            free = self._pool.get(cls)
            if free:
                return free.pop()
        return self.buffer(cls)

    def _stage_gpu(self, a: Any) -> Tuple["DeviceArray", "DeviceArray"]:
        """A CUDA array of another library copied into a pooled GPU buffer
        on its GPU: (a DeviceArray of a's shape and dtype there, the block
        to give back with _unstage_gpu once the op completed)."""
        ptr, shape, code, bits, lanes, _, ordinal, contiguous = _gpu_info(a)
        if lanes != 1 or not contiguous:
            raise InvalidArgument(f"the GPU array ({type(a).__name__}) must be C-contiguous "
                                  "with one value per element to be staged")
        dtype = _dlpack_dtype(code, bits)
        _code(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        device = _ext.gpu_name(ordinal)
        cls = max(4096, 1 << max(0, nbytes - 1).bit_length())
        with self._pool_lock:
            free = self._gpu_pool.get((device, cls))
            block = free.pop() if free else None
        if block is None:
            block = self.buffer(cls, device=device)
        try:
            if nbytes:
                _ext.device_copy(block.ptr, ptr, nbytes, block.device_ordinal)
        except BaseException:
            self._unstage_gpu(block)
            raise
        return DeviceArray(block._buf, 0, tuple(shape), dtype), block

    def _unstage_gpu(self, block: "DeviceArray") -> None:
        # As _unstage: a few blocks per size class and GPU, none above 64 MiB.
        if block.nbytes > (64 << 20):
            return
        with self._pool_lock:
            free = self._gpu_pool.setdefault((block.device, block.nbytes), [])
            if len(free) < 4:
                free.append(block)

    def _unstage(self, block: np.ndarray) -> None:
        # Up to 4 blocks per size class, none above 64 MiB: a one-off large
        # staged op does not keep its memory.
        if block.size > (64 << 20):
            return
        with self._pool_lock:
            free = self._pool.setdefault(block.size, [])
            if len(free) < 4:
                free.append(block)


# ---------------------------------------------------------------------------
# Mesh
# ---------------------------------------------------------------------------


class _Operand:
    """An op's argument as the extension wants it: (buffer, offset), staged
    through a pooled buffer when the array is not in shared memory."""

    __slots__ = ("array", "buf", "offset", "block")

    def __init__(self, client: Client, array: np.ndarray, copy_in: bool):
        self.array = array
        self.block = None
        found = _locate(array, client)
        if found is None:
            self.block = client._stage(array.nbytes)
            if copy_in:
                self.block[:array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            found = _locate(self.block, client)
        self.buf, self.offset = found


class Mesh:
    """One member's place in a joined mesh (from ``Client.join_mesh``), and
    the collectives over its axes. Leaving it (``leave()``, ``with``, or
    garbage collection) breaks it for the other members."""

    def __init__(self, client: Client, ext: "_ext.Mesh"):
        self._client = client
        self._ext = ext
        self._sizes = dict(ext.axes)
        self._streams: Dict[int, Any] = {}  # stream objects given to stream=, by handle

    def __enter__(self) -> "Mesh":
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    def __repr__(self) -> str:
        return (f"Mesh({self.name!r}, axes={self.axes}, coordinate={self.coordinate}, "
                f"index={self.index}, generation={self.generation})")

    id = property(lambda self: self._ext.id, doc="The daemon's id of the mesh.")
    name = property(lambda self: self._ext.name)
    generation = property(lambda self: self._ext.generation)
    index = property(lambda self: self._ext.index, doc="Row-major index of this member.")
    size = property(lambda self: self._ext.size, doc="The number of members.")
    coordinate = property(lambda self: tuple(self._ext.coordinate))
    member_side_status = property(
        lambda self: self._ext.member_side_status,
        doc="None when small synchronous ops of this member can run among the members "
            "(member-side small ops: in-place psum, pmean, pmax and pmin on arrays in "
            "shared buffers, the JAX FFI handler's, and the C++ SDK's); otherwise why "
            "every op goes through the daemon.")
    member_reads = property(
        lambda self: self._ext.member_reads,
        doc="Whether this mesh's members read each other's buffers for their member-side "
            "all_gathers and reductions (the sizes README 'All_gathers and reductions that "
            "read the members' buffers' gives; the JAX FFI handler's and the C++ SDK's): "
            "'yes', 'not decided yet' (before the first such op), or 'no: ' and why.")

    @property
    def axes(self) -> Dict[str, int]:
        """Axis name -> size, major to minor."""
        return dict(self._ext.axes)

    def leave(self) -> None:
        """Leaves the mesh (it breaks for the other members)."""
        self._ext.leave()

    def axis_index(self, axes: Axes) -> int:
        """jax.lax.axis_index: this member's coordinate on ``axes`` (row-major
        over several)."""
        i = self._ext.axis_index(_axes(axes))
        if i < 0:
            raise InvalidArgument(f"mesh {self.name!r} has no axis {axes!r} (axes: {self.axes})")
        return i

    def axis_size(self, axes: Axes) -> int:
        """The number of members along ``axes`` (product over several)."""
        n = self._ext.axis_size(_axes(axes))
        if n < 0:
            raise InvalidArgument(f"mesh {self.name!r} has no axis {axes!r} (axes: {self.axes})")
        return n

    def empty(self, shape, dtype: Any = np.float32,
              device: str = "cpu") -> Union[np.ndarray, "DeviceArray"]:
        """Client.empty: an array in its own shared buffer (on a GPU: a
        DeviceArray)."""
        return self._client.empty(shape, dtype, device)

    zeros = empty

    def shared_empty(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """A zeroed array in a buffer every member of this mesh maps: give it
        as ``out=`` of psum, pmean, pmax, pmin, all_gather or broadcast over
        every axis (``axes=None``), the same array on every member, and the
        daemon writes the result once for the whole mesh. Every member calls
        this the same number of times with the same shape and dtype (it does
        not wait for the others); each member's k-th call gives the same
        memory. Read it once your op's result is ready; the next op writing
        into it overwrites it for everyone. Any other op with it as output
        fails with FailedPrecondition."""
        dt = _dtype(dtype)
        _code(dt)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = self._ext.allocate_shared(max(n, 1))
        return buf.view()[:n].view(dt).reshape(shape)

    shared_zeros = shared_empty

    # -- the collectives ---------------------------------------------------

    def _submit(self, kind: int, x: Optional[np.ndarray], axes: Optional[Axes], *,
                out: Optional[np.ndarray] = None, out_shape: Optional[Tuple[int, ...]] = None,
                inplace: bool = True, perm=(), a: int = 0, b: int = 0,
                tiled: bool = False, stream: Any = None) -> Future:
        names = _axes(axes)
        if stream is not None and not isinstance(x, DeviceArray) and not _on_gpu(x):
            raise InvalidArgument(
                "stream= orders ops on GPU arrays (collectived.DeviceArray) with a CUDA stream; "
                f"x is {'no array (a barrier)' if x is None else type(x).__name__}")
        if x is None:  # barrier
            return Future(self._ext.submit(kind, None, 0, [], 0, names, None, 0, [], 0, [], 0, 0,
                                           False), None)
        x = _as_array(x)
        if isinstance(x, DeviceArray) or isinstance(out, DeviceArray) or _on_gpu(x):
            return self._submit_device(kind, x, names, out=out, out_shape=out_shape,
                                       inplace=inplace, perm=perm, a=a, b=b, tiled=tiled,
                                       stream=stream)
        code = _code(x.dtype)
        rdt = _result_dtype(kind, x.dtype)
        client = self._client
        src = _Operand(client, x, copy_in=True)
        dst = None
        # A result array of its own unless the result replaces x: in place,
        # same dtype, and x writable or staged (a staged read-only x gets a
        # copy of the staging block's result). A new numpy array, which the
        # op writes through a pooled staging block: allocating a shared
        # buffer per call would cost a round trip to the daemon and a mapping.
        if out is None and (out_shape is not None or not inplace or rdt != x.dtype
                            or (src.block is None and not x.flags.writeable)):
            out = np.empty(out_shape if out_shape is not None else x.shape, rdt)
        if out is not None:
            if not isinstance(out, np.ndarray) or out.dtype != rdt:
                raise InvalidArgument(f"out must be a numpy array of the result's dtype ({rdt})")
            if not out.flags.writeable:
                raise InvalidArgument("out is read-only")
            dst = _Operand(client, out, copy_in=False)
        fut = self._ext.submit(kind, src.buf, src.offset, list(x.shape), code, names,
                               dst.buf if dst else None, dst.offset if dst else 0,
                               list(out.shape) if dst else [], _code(rdt) if dst else 0,
                               [tuple(p) for p in perm],
                               int(a), int(b), bool(tiled))
        target = dst if dst is not None else src

        def finish(ext: "_ext.Future") -> np.ndarray:
            try:
                shape = tuple(ext.out_shape)
                if target.block is None:
                    result = target.array
                    return result if result.shape == shape else result.reshape(shape)
                # Staged: the result sits in the pooled block.
                n = int(np.prod(shape, dtype=np.int64)) * rdt.itemsize
                staged = target.block[:n].view(rdt).reshape(shape)
                dest = target.array
                if dest.size == staged.size and dest.flags.writeable:
                    np.copyto(dest, staged.reshape(dest.shape))
                    return dest if dest.shape == shape else dest.reshape(shape)
                return staged.copy()
            finally:
                for op in (src, dst):
                    if op is not None and op.block is not None:
                        client._unstage(op.block)
                        op.block = None

        return Future(fut, finish)

    def _submit_device(self, kind: int, x, names: Optional[List[str]], *, out, out_shape,
                       inplace: bool, perm, a: int, b: int, tiled: bool,
                       stream: Any) -> Future:
        """An op on DeviceArrays: x and the result in GPU shared buffers,
        nothing staged. Without ``out``, the result is x itself (in place)
        or a new DeviceArray on x's GPU. With ``stream``, stream-ordered."""
        handle = 0 if stream is None else _stream_handle(stream)
        if stream is not None and not isinstance(stream, (int, np.integer)):
            # The C++ SDK synchronizes every stream it ordered ops with when
            # the mesh goes: a stream object must live until then.
            self._streams[handle] = stream
        foreign, block = None, None
        if _on_gpu(x):
            if stream is not None:
                raise InvalidArgument(
                    f"stream= takes DeviceArrays: x is a {type(x).__name__} on a GPU; copy it "
                    "into mesh.empty(..., device=...) on your stream first")
            foreign = x
            x, block = self._client._stage_gpu(x)
        elif not isinstance(x, DeviceArray):
            raise InvalidArgument(
                "out is a DeviceArray (GPU memory) and x is not: give both in GPU buffers "
                "(Client.empty(..., device=...)), or both on the host")
        try:
            code = _code(x.dtype)
            rdt = _result_dtype(kind, x.dtype)
            if out is None and (out_shape is not None or not inplace or rdt != x.dtype):
                out = self._client.empty(out_shape if out_shape is not None else x.shape, rdt,
                                         x.device)
            if out is not None and (not isinstance(out, DeviceArray) or out.dtype != rdt):
                raise InvalidArgument(
                    f"x is a DeviceArray (GPU memory): out must be a DeviceArray of the result's "
                    f"dtype ({rdt}), got {type(out).__name__}"
                    f"{'' if not hasattr(out, 'dtype') else ' of ' + str(out.dtype)}")
            fut = self._ext.submit(kind, x._buf, x._offset, list(x.shape), code, names,
                                   out._buf if out is not None else None,
                                   out._offset if out is not None else 0,
                                   list(out.shape) if out is not None else [],
                                   _code(rdt) if out is not None else 0,
                                   [tuple(p) for p in perm], int(a), int(b), bool(tiled),
                                   handle)
        except BaseException:
            if block is not None:
                self._client._unstage_gpu(block)
            raise
        target = out if out is not None else x
        client = self._client

        def finish(ext: "_ext.Future") -> Any:
            try:
                shape = tuple(ext.out_shape)
                result = target if target.shape == shape else target.reshape(shape)
                if foreign is None or target is not x:
                    return result
                # In place on a staged array: back into it where it is
                # writable (torch, cupy), else into a new DeviceArray (JAX's
                # arrays are immutable).
                dest = (foreign if _writable_gpu(foreign) else
                        client.empty(shape, result.dtype, device=result.device))
                ptr = _gpu_info(foreign)[0] if dest is foreign else dest.ptr
                _ext.device_copy(ptr, result.ptr, result.nbytes, result.device_ordinal)
                return dest if tuple(dest.shape) == shape else dest.reshape(shape)
            finally:
                if block is not None:
                    client._unstage_gpu(block)

        return Future(fut, finish)

    def _reduce(self, kind: int, x, axes: Axes, out, inplace: bool) -> np.ndarray:
        """A synchronous psum, pmean, pmax or pmin. Without ``out``, and with
        a result of x's dtype, it runs as the in-place op of an array in a
        shared buffer (small ones among the members, without the daemon):
        on x itself when x is one and in place, else on a copy of x in the
        mesh's staging buffer, whose result is copied into x (in place) or
        a new array (no shared buffer is allocated per call)."""
        if out is None and not isinstance(x, DeviceArray) and not _on_gpu(x):
            if inplace and self._ext.run_in_place(kind, x, axes):
                return x  # in place in a shared buffer, without the general path
            arr = _as_array(x)
            if inplace and arr.flags.writeable:
                if self._ext.run_staged(kind, arr, arr, axes):
                    return arr
            else:
                dest = np.empty(arr.shape, arr.dtype)
                if self._ext.run_staged(kind, arr, dest, axes):
                    return dest
        return self._submit(kind, x, axes, out=out, inplace=inplace)._sync_result()

    def psum_async(self, x, axes: Axes, *, out=None, inplace: bool = True,
                   stream: Any = None) -> Future:
        """psum, started: a Future whose result() is what psum returns (the
        result lands when the op completes; keep x and out alive until then).
        Ctrl-C while waiting on result() leaves the op in flight. On GPU
        arrays, ``stream`` (a CUDA stream: an int handle, or an object with
        ``__cuda_stream__``, ``cuda_stream`` or ``ptr``, as torch's and
        cupy's streams have) orders the op with that stream: the daemon
        reads x once the stream got here, and work enqueued on the stream
        afterwards sees the result; the call returns at once, and result()
        gives the outcome (waiting on the host)."""
        return self._submit(_PSUM, x, axes, out=out, inplace=inplace, stream=stream)

    def pmean_async(self, x, axes: Axes, *, out=None, inplace: bool = True,
                    stream: Any = None) -> Future:
        """pmean, started: a Future of what pmean returns (as psum_async)."""
        return self._submit(_PMEAN, x, axes, out=out, inplace=inplace, stream=stream)

    def pmax_async(self, x, axes: Axes, *, out=None, inplace: bool = True,
                   stream: Any = None) -> Future:
        """pmax, started: a Future of what pmax returns (as psum_async)."""
        return self._submit(_PMAX, x, axes, out=out, inplace=inplace, stream=stream)

    def pmin_async(self, x, axes: Axes, *, out=None, inplace: bool = True,
                   stream: Any = None) -> Future:
        """pmin, started: a Future of what pmin returns (as psum_async)."""
        return self._submit(_PMIN, x, axes, out=out, inplace=inplace, stream=stream)

    def psum(self, x, axes: Axes, *, out=None, inplace: bool = True) -> np.ndarray:
        """jax.lax.psum over ``axes`` (a name or a tuple of names). The
        result replaces ``x`` (returned), or goes to ``out``, or with
        ``inplace=False`` to a new numpy array. bool counts: the result is a
        new int32 array, as in JAX."""
        return self._reduce(_PSUM, x, axes, out, inplace)

    def pmean(self, x, axes: Axes, *, out=None, inplace: bool = True) -> np.ndarray:
        """jax.lax.pmean. Integers and bool give floats (float32; float64 for
        64-bit integers), in a new array; results otherwise as psum."""
        return self._reduce(_PMEAN, x, axes, out, inplace)

    def pmax(self, x, axes: Axes, *, out=None, inplace: bool = True) -> np.ndarray:
        """jax.lax.pmax; results as psum."""
        return self._reduce(_PMAX, x, axes, out, inplace)

    def pmin(self, x, axes: Axes, *, out=None, inplace: bool = True) -> np.ndarray:
        """jax.lax.pmin; results as psum."""
        return self._reduce(_PMIN, x, axes, out, inplace)

    def _gather_shape(self, x: np.ndarray, axes: Axes, axis: int, tiled: bool):
        n = self.axis_size(axes)
        shape = list(x.shape)
        rank = len(shape) + (0 if tiled else 1)
        pos = axis + rank if axis < 0 else axis
        if not 0 <= pos < rank:
            raise InvalidArgument(f"axis {axis} is out of range for a result of rank {rank}")
        if tiled:
            shape[pos] *= n
        else:
            shape.insert(pos, n)
        return tuple(shape)

    def all_gather_async(self, x, axes: Axes, *, axis: int = 0, tiled: bool = False,
                         out=None, stream: Any = None) -> Future:
        """all_gather, started: a Future of what all_gather returns (as
        psum_async)."""
        x = _as_array(x)
        shape = self._gather_shape(x, axes, axis, tiled) if out is None else None
        return self._submit(_ALL_GATHER, x, axes, out=out, out_shape=shape, a=axis, tiled=tiled,
                            stream=stream)

    def all_gather(self, x, axes: Axes, *, axis: int = 0, tiled: bool = False,
                   out=None) -> np.ndarray:
        """jax.lax.all_gather: a new array (or ``out``) holding every group
        member's x, stacked at ``axis`` (concatenated when ``tiled``)."""
        return self.all_gather_async(x, axes, axis=axis, tiled=tiled, out=out)._sync_result()

    def _scatter_shape(self, x: np.ndarray, axes: Axes, dim: int, tiled: bool):
        n = self.axis_size(axes)
        shape = list(x.shape)
        pos = dim + len(shape) if dim < 0 else dim
        if not 0 <= pos < len(shape):
            raise InvalidArgument(f"scatter_dimension {dim} is out of range for rank {len(shape)}")
        if tiled:
            if shape[pos] % n:
                raise InvalidArgument(
                    f"dimension {pos} of size {shape[pos]} does not split over {n} members")
            shape[pos] //= n
        else:
            if shape[pos] != n:
                raise InvalidArgument(
                    f"untiled psum_scatter needs dimension {pos} of size {n} (the group size), "
                    f"got {shape[pos]}")
            del shape[pos]
        return tuple(shape)

    def psum_scatter_async(self, x, axes: Axes, *, scatter_dimension: int = 0,
                           tiled: bool = False, out=None, stream: Any = None) -> Future:
        """psum_scatter, started: a Future of what psum_scatter returns (as
        psum_async)."""
        x = _as_array(x)
        shape = self._scatter_shape(x, axes, scatter_dimension, tiled) if out is None else None
        return self._submit(_PSUM_SCATTER, x, axes, out=out, out_shape=shape,
                            a=scatter_dimension, tiled=tiled, stream=stream)

    def psum_scatter(self, x, axes: Axes, *, scatter_dimension: int = 0, tiled: bool = False,
                     out=None) -> np.ndarray:
        """jax.lax.psum_scatter: this member's block of the sum, a new array
        (or ``out``)."""
        return self.psum_scatter_async(x, axes, scatter_dimension=scatter_dimension,
                                       tiled=tiled, out=out)._sync_result()

    def ppermute_async(self, x, axes: Axes, perm: Iterable[Tuple[int, int]], *, out=None,
                       inplace: bool = True, stream: Any = None) -> Future:
        """ppermute, started: a Future of what ppermute returns (as
        psum_async)."""
        return self._submit(_PPERMUTE, x, axes, out=out, inplace=inplace, perm=list(perm),
                            stream=stream)

    def ppermute(self, x, axes: Axes, perm: Iterable[Tuple[int, int]], *, out=None,
                 inplace: bool = True) -> np.ndarray:
        """jax.lax.ppermute: (source, dest) index pairs along ``axes``; a
        member that is no dest receives zeros."""
        return self.ppermute_async(x, axes, perm, out=out, inplace=inplace)._sync_result()

    def all_to_all_async(self, x, axes: Axes, split_axis: int, concat_axis: int, *,
                         tiled: bool = False, out=None, inplace: bool = True,
                         stream: Any = None) -> Future:
        """all_to_all, started: a Future of what all_to_all returns (as
        psum_async)."""
        return self._submit(_ALL_TO_ALL, x, axes, out=out, inplace=inplace, a=split_axis,
                            b=concat_axis, tiled=tiled, stream=stream)

    def all_to_all(self, x, axes: Axes, split_axis: int, concat_axis: int, *,
                   tiled: bool = False, out=None, inplace: bool = True) -> np.ndarray:
        """jax.lax.all_to_all. In place (the result has x's byte size; its
        shape is the returned array's)."""
        return self.all_to_all_async(x, axes, split_axis, concat_axis, tiled=tiled, out=out,
                                     inplace=inplace)._sync_result()

    def broadcast_async(self, x, axes: Axes, root: int = 0, *, out=None,
                        inplace: bool = True, stream: Any = None) -> Future:
        """broadcast, started: a Future of what broadcast returns (as
        psum_async)."""
        return self._submit(_BROADCAST, x, axes, out=out, inplace=inplace, a=root,
                            stream=stream)

    def broadcast(self, x, axes: Axes, root: int = 0, *, out=None,
                  inplace: bool = True) -> np.ndarray:
        """Every member of the group receives the x of group index ``root``."""
        return self.broadcast_async(x, axes, root, out=out, inplace=inplace)._sync_result()

    def barrier_async(self, axes: Optional[Axes] = None) -> Future:
        """barrier, started: a Future whose result() (None) returns once every
        member of the group got here."""
        return self._submit(_BARRIER, None, axes)

    def barrier(self, axes: Optional[Axes] = None) -> None:
        """Returns when every member of the group (default: the mesh) got here."""
        self._submit(_BARRIER, None, axes)._sync_result()
