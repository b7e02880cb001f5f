"""GPU arrays in the Python SDK (collectived.DeviceArray).

What a machine without a GPU checks: the arrays' DLPack and CUDA Array
Interface metadata (over a stand-in for GPU memory, which cannot exist
here: nothing dereferences it), the refusals that name why there is no GPU
memory, and the argument checks of ops that mix host and GPU arrays.

What needs a GPU (the rest): zero-copy views in torch, cupy and JAX, and
ops between processes on GPU arrays. Without a usable GPU these skip and
say why; with COLLECTIVED_REQUIRE_GPU=1 (scripts/gpu-check.sh) they fail.
"""

import ctypes
import os

import ml_dtypes
import numpy as np
import pytest

import collectived
from members import run_members, run_training_example


# ---------------------------------------------------------------------------
# DLPack's structures (dlpack.h, version 1.1), to read what a capsule holds.

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _read_capsule(capsule, versioned):
    """(data, device_type, device_id, shape, (code, bits, lanes), strides) of
    an unconsumed DLPack capsule."""
    if versioned:
        t = _DLManagedTensorVersioned.from_address(
            _get_pointer(capsule, b"dltensor_versioned")).dl_tensor
    else:
        t = _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))  # DLManagedTensor's first
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] for i in range(t.ndim))
    return (t.data + t.byte_offset, t.device.device_type, t.device.device_id, shape,
            (t.dtype.code, t.dtype.bits, t.dtype.lanes), strides)


class _GpuMemory:
    """Stands in for the extension's Buffer of GPU memory (what DeviceArray
    reads of it): an address that is never dereferenced."""
    id = "stand-in"
    device = "cuda:GPU-00000000-0000-0000-0000-000000000000"
    device_ordinal = 3
    address = 0x7F0000200000
    size = 1 << 20


def _device_array(shape, dtype, offset=256):
    return collectived.DeviceArray(_GpuMemory(), offset, shape, dtype)


# DLPack's (type code, bits) of every dtype the SDK takes.
DLPACK_TYPES = {
    np.bool_: (6, 8), np.int8: (0, 8), np.uint8: (1, 8), np.int32: (0, 32), np.uint32: (1, 32),
    np.int64: (0, 64), np.uint64: (1, 64), np.float16: (2, 16), np.float32: (2, 32),
    np.float64: (2, 64), ml_dtypes.bfloat16: (4, 16), ml_dtypes.float8_e4m3fn: (10, 8),
    ml_dtypes.float8_e5m2: (12, 8),
}


@pytest.mark.parametrize("versioned", [False, True], ids=["dltensor", "dltensor_versioned"])
def test_dlpack_exports_the_device_address_shape_and_type_of_every_dtype(versioned):
    for dtype, (code, bits) in DLPACK_TYPES.items():
        a = _device_array((3, 4), dtype)
        assert a.__dlpack_device__() == (2, 3)  # kDLCUDA, the ordinal in this process
        capsule = a.__dlpack__(max_version=(1, 1)) if versioned else a.__dlpack__()
        data, dev_type, dev_id, shape, dl_type, strides = _read_capsule(capsule, versioned)
        assert data == _GpuMemory.address + 256, dtype
        assert (dev_type, dev_id) == (2, 3)
        assert shape == (3, 4)
        assert dl_type == (code, bits, 1), dtype
        assert strides in (None, (4, 1))  # C-contiguous
    # A consumer stream needs nothing (no pending work); copies and other
    # devices are refused, as the protocol says a producer may.
    a = _device_array((8,), np.float32)
    assert _read_capsule(a.__dlpack__(stream=7), False)[0] == a.ptr
    with pytest.raises(BufferError, match="without a copy"):
        a.__dlpack__(copy=True)
    with pytest.raises(BufferError, match=r"dl_device \(1, 0\)"):
        a.__dlpack__(dl_device=(1, 0))
    assert _read_capsule(a.__dlpack__(dl_device=(2, 3)), False)[0] == a.ptr


def test_cuda_array_interface_is_version_3_for_numpy_dtypes_only():
    a = _device_array((2, 5), np.int32, offset=64)
    cai = a.__cuda_array_interface__
    assert cai == {"shape": (2, 5), "typestr": "<i4", "data": (_GpuMemory.address + 64, False),
                   "version": 3, "strides": None, "stream": None}
    assert _device_array((0,), np.float32).__cuda_array_interface__["data"] == (0, False)
    for dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        b = _device_array((4,), dtype)
        assert not hasattr(b, "__cuda_array_interface__")  # consumers then use DLPack
        with pytest.raises(AttributeError, match="use DLPack"):
            b.__cuda_array_interface__


def test_device_arrays_reshape_in_place_and_refuse_numpy():
    a = _device_array((4, 6), np.float32)
    assert (a.shape, a.ndim, a.size, a.nbytes, len(a)) == ((4, 6), 2, 24, 96, 4)
    for shape, want in (((24,), (24,)), ((2, -1), (2, 12)), (((3, 8),), (3, 8))):
        b = a.reshape(*shape)
        assert b.shape == want and b.ptr == a.ptr and b.dtype == a.dtype
    for bad in ((5, 5), (-1, -1), (7, -1), (-2, -12)):
        with pytest.raises(collectived.InvalidArgument, match="cannot reshape"):
            a.reshape(*bad)
    with pytest.raises(TypeError, match="GPU memory .*numpy cannot read it"):
        np.asarray(a)
    assert "cuda:GPU-0000" in repr(a) and hex(a.ptr) in repr(a)


def _gpu_refusal(client):
    """None when client's daemon gives this process GPU memory on cuda:0,
    else why not."""
    try:
        client.buffer(64, device="cuda:0")
        return None
    except (collectived.FailedPrecondition, collectived.NotFound,
            collectived.Unimplemented) as e:
        return str(e)


def test_gpu_buffers_without_a_gpu_are_refused_naming_why(daemon):
    with collectived.connect(socket=daemon) as c:
        why = _gpu_refusal(c)
        if why is None:
            pytest.skip("a GPU is usable here: the GPU tests cover it")
        # The daemon (or this SDK) names what is missing: the driver, the
        # GPU, or CUDA in the build.
        assert "cuda" in why.lower() or "gpu" in why.lower(), why
        for make in (lambda: c.empty((2, 2), np.float32, device="cuda:0"),
                     lambda: c.buffer(16, device="cuda:0")):
            with pytest.raises(collectived.Error) as e:
                make()
            assert str(e.value) == why
        # A device that is no device name is refused as such.
        for bad in ("gpu", "cuda:x"):
            with pytest.raises(collectived.InvalidArgument, match="not a device name|no valid GPU"):
                c.buffer(16, device=bad)


def test_ops_mixing_host_and_gpu_arrays_are_refused_before_submitting(daemon):
    with collectived.connect(socket=daemon) as c:
        mesh = c.join_mesh("mixed", {"i": 1}, timeout=10)
        host = mesh.empty((4,), np.float32)
        gpu = _device_array((4,), np.float32)
        with pytest.raises(collectived.InvalidArgument, match="out is a DeviceArray"):
            mesh.psum(host, "i", out=gpu)
        with pytest.raises(collectived.InvalidArgument, match="out must be a DeviceArray"):
            mesh.psum(gpu, "i", out=np.zeros(4, np.float32))
        with pytest.raises(collectived.InvalidArgument, match="out must be a DeviceArray"):
            mesh.all_gather(gpu, "i", out=_device_array((1, 4), np.int32))
        # Nothing was submitted: the mesh still runs ops.
        host[:] = 2
        assert mesh.psum(host, "i").tolist() == [2, 2, 2, 2]


def test_stream_arguments_name_a_cuda_stream():
    from collectived import _stream_handle

    class Protocol:  # the CUDA stream protocol
        def __cuda_stream__(self):
            return (0, 0x5000)

    class Torchish:
        cuda_stream = 0x6000

    class Cupyish:
        ptr = 0x7000

    assert _stream_handle(0x4000) == 0x4000
    assert _stream_handle(np.uint64(0x4100)) == 0x4100
    assert _stream_handle(Protocol()) == 0x5000
    assert _stream_handle(Torchish()) == 0x6000
    assert _stream_handle(Cupyish()) == 0x7000
    assert _stream_handle(0) == 1  # the legacy default stream: cudaStreamLegacy
    for bad, why in ((True, "must be a CUDA stream"), ("s", "must be a CUDA stream"),
                     (-3, "negative")):
        with pytest.raises(collectived.InvalidArgument, match=why):
            _stream_handle(bad)


def test_stream_ordered_ops_take_gpu_arrays_only(daemon):
    with collectived.connect(socket=daemon) as c:
        mesh = c.join_mesh("streams", {"i": 1}, timeout=10)
        host = mesh.empty((4,), np.float32)
        for submit in (lambda: mesh.psum_async(host, "i", stream=0x4000),
                       lambda: mesh.all_gather_async(np.ones(3), "i", stream=0x4000),
                       lambda: mesh.ppermute_async(host, "i", [(0, 0)], stream=0x4000)):
            with pytest.raises(collectived.InvalidArgument, match="stream= orders ops on GPU"):
                submit()
        host[:] = 1
        assert mesh.psum(host, "i").tolist() == [1, 1, 1, 1]


def test_gpu_arrays_of_other_libraries_are_recognized_and_described():
    from collectived import _dlpack_dtype, _on_gpu
    from collectived import _collectived as ext

    class CudaArray:  # what torch and cupy arrays on a GPU say of themselves
        def __dlpack_device__(self):
            return (2, 0)

    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("no")

    assert _on_gpu(CudaArray())
    assert not _on_gpu(np.zeros(3)) and not _on_gpu(Broken()) and not _on_gpu([1, 2])
    assert not _on_gpu(_device_array((2,), np.float32))  # ours: not staged
    for dtype, (code, bits) in DLPACK_TYPES.items():
        assert _dlpack_dtype(code, bits) == np.dtype(dtype)
    with pytest.raises(collectived.InvalidArgument, match="not a collectived dtype"):
        _dlpack_dtype(5, 64)  # complex
    # What the staging reads of a DLPack array: address, shape, type, device,
    # contiguity (here of host arrays; nothing is dereferenced).
    a = np.zeros((3, 4), np.int32)
    assert ext.dlpack_info(a) == (a.ctypes.data, [3, 4], 0, 32, 1, 1, 0, True)
    assert ext.dlpack_info(a.T)[-1] is False


def test_gpu_arrays_of_other_libraries_take_no_stream(daemon):
    class CudaArray:
        def __dlpack_device__(self):
            return (2, 0)

    with collectived.connect(socket=daemon) as c:
        mesh = c.join_mesh("foreign", {"i": 1}, timeout=10)
        with pytest.raises(collectived.InvalidArgument, match="stream= takes DeviceArrays"):
            mesh.psum_async(CudaArray(), "i", stream=0x4000)


# ---------------------------------------------------------------------------
# With a GPU.

@pytest.fixture
def gpu_client(daemon):
    with collectived.connect(socket=daemon) as c:
        why = _gpu_refusal(c)
        if why is not None:
            if os.environ.get("COLLECTIVED_REQUIRE_GPU") == "1":
                pytest.fail(f"COLLECTIVED_REQUIRE_GPU=1 but no GPU is usable: {why}")
            pytest.skip(f"no GPU memory on cuda:0: {why}")
        yield c


def test_gpu_arrays_are_zero_copy_views_in_torch_cupy_and_jax(gpu_client):
    a = gpu_client.empty((4, 8), np.float32, device="cuda:0")
    assert isinstance(a, collectived.DeviceArray) and a.device_ordinal >= 0
    seen = []
    try:
        import torch
        t = torch.from_dlpack(a)
        assert t.data_ptr() == a.ptr and t.is_cuda and tuple(t.shape) == (4, 8)
        t.fill_(3.0)
        torch.cuda.synchronize()
        seen.append("torch")
    except ImportError:
        pass
    try:
        import cupy
        for view in (cupy.from_dlpack(a), cupy.asarray(a)):  # DLPack, then the CAI
            assert view.data.ptr == a.ptr and view.shape == (4, 8)
        if "torch" in seen:
            assert float(cupy.asarray(a).sum()) == 96.0  # torch's write, seen by cupy
        seen.append("cupy")
    except ImportError:
        pass
    try:
        import jax
        if any(d.platform == "gpu" for d in jax.devices()):
            j = jax.dlpack.from_dlpack(a)
            assert j.unsafe_buffer_pointer() == a.ptr and j.shape == (4, 8)
            seen.append("jax")
    except ImportError:
        pass
    if not seen:
        pytest.skip("none of torch, cupy or JAX with a GPU is installed")


GPU_OPS = """
    import torch
    c = collectived.connect(socket=SOCK)
    mesh = c.join_mesh("gpu-ops", {"i": N}, coordinate=[RANK], timeout=30)
    x = mesh.empty((1000,), np.float32, device="cuda:0")
    torch.from_dlpack(x).copy_(torch.arange(1000, dtype=torch.float32) + RANK)
    y = mesh.psum(x, "i")
    assert y is x
    s = torch.from_dlpack(x).cpu().numpy()
    m = mesh.pmean(x, "i", inplace=False)
    g = mesh.all_gather(x.reshape(10, 100), "i")
    p = mesh.ppermute(x, "i", [(k, (k + 1) % N) for k in range(N)], inplace=False)
    emit(psum=s.tolist()[:5], psum_ok=bool((s == N * np.arange(1000) + N * (N - 1) / 2).all()),
         mean_type=type(m).__name__, mean=torch.from_dlpack(m).cpu().numpy()[:3].tolist(),
         gather=list(g.shape), gather_ok=bool((torch.from_dlpack(g).cpu().numpy()
                                               == np.stack([s.reshape(10, 100)] * N)).all()),
         permute_ok=bool((torch.from_dlpack(p).cpu().numpy() == s).all()))
"""


def test_gpu_ops_between_processes_are_exact(gpu_client, daemon):
    pytest.importorskip("torch")
    n = 2
    base = n * (n - 1) / 2
    for r in run_members(GPU_OPS, daemon, n):
        assert r["psum_ok"], r
        assert r["mean_type"] == "DeviceArray"
        # pmean of the psum's result (x holds it, in place): the same on every member.
        assert r["mean"] == [n * k + base for k in range(3)]
        assert r["gather"] == [n, 10, 100] and r["gather_ok"], r
        assert r["permute_ok"], r


# ---------------------------------------------------------------------------
# collectived.jax on CUDA.

def _export_text(mesh, platform):
    import jax
    import jax.numpy as jnp
    import collectived.jax as cjax
    f = jax.jit(lambda x: cjax.psum(x, "i", mesh=mesh))
    checks = [jax.export.DisabledSafetyCheck.custom_call(t)
              for t in ("collectived_collective", "collectived_collective_cuda")]
    exported = jax.export.export(f, platforms=[platform], disabled_checks=checks)(
        jax.ShapeDtypeStruct((4,), jnp.float32))
    return exported.mlir_module()


def test_jitted_calls_lower_to_the_cuda_handler_for_gpus(daemon):
    # Lowering for a platform needs no device of it: JAX's export lowers
    # for CUDA here, and the call must name the CUDA handler there (and the
    # CPU one on CPU).
    pytest.importorskip("jax")
    from collectived import _collectived as ext
    if ext.jax_ffi_handler() is None:
        pytest.skip("this module was built without jaxlib's FFI headers")
    if ext.jax_ffi_cuda_handler() is None:
        pytest.skip("this module was built without CUDA (pip's build is): no CUDA handler")
    with collectived.connect(socket=daemon) as c:
        mesh = c.join_mesh("lowering", {"i": 1}, timeout=10)
        cuda = _export_text(mesh, "cuda")
        cpu = _export_text(mesh, "cpu")
    assert "collectived_collective_cuda" in cuda
    assert "collectived_collective_cuda" not in cpu and "collectived_collective" in cpu


JAX_GPU_OPS = """
    import jax, jax.numpy as jnp
    import collectived.jax as cjax
    assert jax.devices()[0].platform == "gpu", jax.devices()
    c = collectived.connect(socket=SOCK)
    mesh = c.join_mesh("jax-gpu", {"i": N}, coordinate=[RANK], timeout=60)
    x = jnp.arange(1000, dtype=jnp.float32) + RANK
    f = jax.jit(lambda v: (cjax.psum(v, "i", mesh=mesh),
                           cjax.all_gather(v.astype(jnp.bfloat16), "i", mesh=mesh),
                           cjax.ppermute(v * 2, "i", [(k, (k + 1) % N) for k in range(N)],
                                         mesh=mesh),
                           cjax.axis_index("i", mesh=mesh)))
    for _ in range(3):  # the staging buffers are reused
        s, g, p, i = f(x)
    s, g, p = np.asarray(s), np.asarray(g.astype(jnp.float32)), np.asarray(p)
    base = np.arange(1000, dtype=np.float32)
    emit(index=int(i),
         psum_ok=bool((s == N * base + N * (N - 1) / 2).all()),
         gather_ok=bool((g == np.stack([(base + r).astype(ml_dtypes.bfloat16).astype(np.float32)
                                        for r in range(N)])).all()),
         permute_ok=bool((p == 2 * (base + (RANK - 1) % N)).all()))
"""


def _require_jax_gpu():
    jax = pytest.importorskip("jax")
    try:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        gpus = []
    if not gpus:
        if os.environ.get("COLLECTIVED_REQUIRE_GPU") == "1":
            pytest.fail("COLLECTIVED_REQUIRE_GPU=1 but JAX has no GPU (its CUDA plugin?)")
        pytest.skip("JAX has no GPU here")


def test_jitted_collectives_on_gpu_arrays_are_exact(gpu_client, daemon, monkeypatch):
    _require_jax_gpu()
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # processes share the GPU
    n = 2
    for rank, r in enumerate(run_members(JAX_GPU_OPS, daemon, n, timeout=120)):
        assert r["index"] == rank
        assert r["psum_ok"] and r["gather_ok"] and r["permute_ok"], r


STREAM_ORDERED = """
    import torch
    c = collectived.connect(socket=SOCK)
    mesh = c.join_mesh("gpu-stream", {"i": N}, coordinate=[RANK], timeout=30)
    x = mesh.empty((4096,), np.float32, device="cuda:0")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # a long kernel: the stream is busy well past the call
        torch.from_dlpack(x).fill_(RANK + 1.0)
    fut = mesh.psum_async(x, "i", stream=s)
    busy = not s.query()  # the call returned before the stream got to the op
    with torch.cuda.stream(s):
        doubled = torch.from_dlpack(x) * 2  # after the op, on the stream
    fut.result(timeout=60)
    s.synchronize()
    total = N * (N + 1) / 2
    emit(busy=busy, psum_ok=bool((torch.from_dlpack(x).cpu() == total).all()),
         after_ok=bool((doubled.cpu() == 2 * total).all()))
"""


def test_stream_ordered_ops_do_not_wait_on_the_host(gpu_client, daemon):
    pytest.importorskip("torch")
    for r in run_members(STREAM_ORDERED, daemon, 2):
        assert r["busy"], "the call waited for the stream on the host"
        assert r["psum_ok"] and r["after_ok"], r


def test_the_training_example_on_gpus_prints_the_cpu_runs_losses(gpu_client, daemon):
    # 4 processes on one GPU against 4 on the CPU: at every logged step each
    # run's processes agree exactly, and the runs agree to the 6 printed
    # decimals (both compute float32 products at full precision; the
    # devices' summation orders differ, so the last bits may).
    _require_jax_gpu()
    gpu = run_training_example(daemon, 4, 31, "--device=gpu")
    cpu = run_training_example(daemon, 4, 31, "--device=cpu")
    for step in sorted(cpu):
        assert len(set(gpu[step].values())) == 1, f"GPU run, step {step}: {gpu[step]}"
        assert len(set(cpu[step].values())) == 1, f"CPU run, step {step}: {cpu[step]}"
        assert abs(float(gpu[step][0]) - float(cpu[step][0])) <= 2e-6, (step, gpu, cpu)


KILLED = """
    import signal
    c = collectived.connect(socket=SOCK)
    mesh = c.join_mesh("gpu-killed", {"i": N}, coordinate=[RANK], timeout=30)
    x = mesh.empty((16 << 20,), np.float32, device="cuda:0")  # 64 MiB of GPU memory
    mesh.barrier()
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # holding its GPU buffer, before its op
    try:
        mesh.psum(x, "i")
        emit(error=None)
    except collectived.Error as e:
        emit(error=type(e).__name__, message=str(e))
"""


def test_a_member_killed_on_gpu_aborts_the_others_and_its_memory_is_freed(gpu_client, daemon):
    import time
    from members import collect, result, start
    torch = pytest.importorskip("torch")
    torch.cuda.init()
    free_before, _ = torch.cuda.mem_get_info()
    procs = [start(KILLED, daemon, 2, rank) for rank in range(2)]
    deadline = time.monotonic() + 60
    (rc0, out0, err0), (rc1, _, _) = [collect(p, deadline) for p in procs]
    assert rc1 == -9, "member 1 was to be killed"
    assert rc0 == 0, out0 + err0
    r = result(out0)
    assert r["error"] == "Aborted" and "member 1" in r["message"], r
    # Both members' buffers are freed: the killed one's by the daemon.
    deadline = time.monotonic() + 20
    while torch.cuda.mem_get_info()[0] < free_before - (16 << 20) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert torch.cuda.mem_get_info()[0] >= free_before - (16 << 20), \
        (free_before, torch.cuda.mem_get_info()[0])


FOREIGN = """
    import torch
    import jax, jax.numpy as jnp
    c = collectived.connect(socket=SOCK)
    mesh = c.join_mesh("gpu-foreign", {"i": N}, coordinate=[RANK], timeout=60)
    t = torch.arange(1000, dtype=torch.float32, device="cuda") + RANK
    y = mesh.psum(t, "i")  # staged through a GPU buffer, written back into t
    same = y is t
    g = mesh.all_gather(t[:10].clone(), "i")  # out of place: a new DeviceArray
    j = mesh.pmax(jax.device_put(jnp.full((5,), RANK, jnp.int32), jax.devices("gpu")[0]), "i")
    want = N * torch.arange(1000, dtype=torch.float32) + N * (N - 1) / 2
    emit(same=same, psum_ok=bool((t.cpu() == want).all()), gather=type(g).__name__,
         gather_ok=bool((torch.from_dlpack(g).cpu() == torch.stack([want[:10]] * N)).all()),
         jax=type(j).__name__, jax_ok=torch.from_dlpack(j).cpu().tolist() == [N - 1] * 5)
"""


def test_torch_and_jax_gpu_arrays_are_staged_through_gpu_buffers(gpu_client, daemon, monkeypatch):
    pytest.importorskip("torch")
    _require_jax_gpu()
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    for r in run_members(FOREIGN, daemon, 2, timeout=120):
        assert r["same"] and r["psum_ok"], r  # in place: the tensor itself, updated
        assert r["gather"] == "DeviceArray" and r["gather_ok"], r
        assert r["jax"] == "DeviceArray" and r["jax_ok"], r  # JAX arrays are immutable
