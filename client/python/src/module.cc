// _collectived: the Python SDK's extension module, a thin layer over the C++
// SDK (client/include/collectived/client.h). The Pythonic API (numpy arrays,
// dtypes, staging, exceptions, futures) is collectived/__init__.py; this file
// only moves calls across and keeps three promises the C++ SDK cannot keep
// for Python by itself:
//  - no wait holds the GIL, and every wait is interruptible (Ctrl-C raises
//    KeyboardInterrupt within about 50 ms);
//  - destroying a Python object never blocks on the daemon with the GIL held
//    (Mesh and Client release it while they leave and close), and a Buffer
//    dropped by Python is freed in the daemon later, by the client, without
//    an RPC in the destructor (see Reclaim);
//  - memory a numpy array views stays mapped as long as the array lives: the
//    array's base is the Buffer object, and nothing else unmaps it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#ifdef COLLECTIVED_PYTHON_HAS_CUDA
#include <cuda_runtime_api.h>
#endif
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge.h"
#include "collectived/client.h"

namespace nb = nanobind;

namespace collectived::python {
namespace {

// Python's exception for a status: collectived/__init__.py registers a
// factory (code, message) -> exception instance at import. Held forever:
// the module outlives every call that raises.
nb::object* error_factory = nullptr;

[[noreturn]] void Raise(const absl::Status& status) {
  if (error_factory == nullptr) {
    throw std::runtime_error(std::string(status.ToString()));
  }
  nb::object exc = (*error_factory)(static_cast<int>(status.code()), std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

absl::Duration Seconds(double s) { return absl::Seconds(s); }

class PyBuffer;

// Every live PyBuffer by address range, to find the buffer (and offset) an
// array lies in. Process-wide: arrays do not say which client they came from.
class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never destroyed
    return *registry;
  }
  void Add(uintptr_t start, size_t size, PyBuffer* buffer) {
    absl::MutexLock lock(&mu_);
    by_start_[start] = {start + size, buffer};
  }
  void Remove(uintptr_t start) {
    absl::MutexLock lock(&mu_);
    by_start_.erase(start);
  }
  // The buffer of the client owning `reclaim` that holds [address, address
  // + bytes), and its start; null if none (a buffer of another client is
  // none: its session's ops cannot name it).
  std::pair<PyBuffer*, uintptr_t> Find(uintptr_t address, size_t bytes, const Reclaim* reclaim);

 private:
  absl::Mutex mu_;
  std::map<uintptr_t, std::pair<uintptr_t, PyBuffer*>> by_start_ ABSL_GUARDED_BY(mu_);
};

class PyBuffer {
 public:
  const Reclaim* owner() const { return reclaim_.get(); }
  PyBuffer(Buffer buffer, std::shared_ptr<Reclaim> reclaim)
      : buffer_(std::move(buffer)), reclaim_(std::move(reclaim)) {
    Registry::Get().Add(address(), buffer_.size(), this);
  }
  ~PyBuffer() {
    Registry::Get().Remove(address());
    reclaim_->Add(std::move(buffer_));
  }
  PyBuffer(const PyBuffer&) = delete;
  PyBuffer& operator=(const PyBuffer&) = delete;

  const Buffer& buffer() const { return buffer_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(buffer_.data()); }

 private:
  Buffer buffer_;
  std::shared_ptr<Reclaim> reclaim_;
};

std::pair<PyBuffer*, uintptr_t> Registry::Find(uintptr_t address, size_t bytes,
                                               const Reclaim* reclaim) {
  absl::MutexLock lock(&mu_);
  auto it = by_start_.upper_bound(address);
  if (it == by_start_.begin()) return {nullptr, 0};
  --it;
  if (address + bytes > it->second.first || it->second.second->owner() != reclaim) {
    return {nullptr, 0};
  }
  return {it->second.second, it->first};
}

// Waits for `future` with the GIL released, in slices, so that signals
// (Ctrl-C) are seen. `timeout` >= 0: at most that many seconds, then
// TimeoutError (the op is still in flight); < 0: the future's own bound (the
// mesh's op timeout plus grace), then DeadlineExceeded (the daemon did not
// answer). Raises the op's error, or whatever a signal handler raised.
void WaitFor(const OpFuture& future, double timeout,
             const std::function<void()>& on_interrupt = nullptr) {
  const absl::Duration bound = timeout < 0 ? future.default_timeout() : Seconds(timeout);
  const absl::Time deadline = absl::Now() + bound;
  const absl::Duration slice = absl::Milliseconds(50);
  while (!future.Ready()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      if (timeout >= 0) {  // the caller's wait ran out, not the op
        PyErr_SetString(PyExc_TimeoutError,
                        absl::StrCat("the op did not complete within ",
                                     absl::FormatDuration(bound), " (it is still in flight)")
                            .c_str());
        throw nb::python_error();
      }
      Raise(absl::DeadlineExceededError(
          absl::StrCat("the op did not complete within ", absl::FormatDuration(bound),
                       " (its op timeout plus grace: the daemon did not answer)")));
    }
    {
      nb::gil_scoped_release unlocked;
      future.Wait(std::min(left, slice)).IgnoreError();
    }
    if (PyErr_CheckSignals() != 0) {
      nb::python_error raised;  // takes the handler's exception
      if (on_interrupt) on_interrupt();
      throw raised;
    }
  }
  Check(future.Wait(absl::ZeroDuration()));
}

// A synchronous call's op given up on a signal (Ctrl-C) while it waited on
// the daemon path (Mesh::give_up: the mesh breaks unless it completed).
void GiveUpOnSignal(Mesh& mesh, const OpFuture& op) {
  nb::gil_scoped_release unlocked;
  mesh.give_up(op, "interrupted (a signal: KeyboardInterrupt?) while it waited for a "
                   "synchronous call's op on the daemon path");
}

// An op in flight. Holds the buffers it reads and writes so that they stay
// mapped until it completed even when Python dropped every array.
class PyFuture {
 public:
  PyFuture(OpFuture future, std::vector<nb::object> keep, std::weak_ptr<Mesh> mesh = {})
      : future_(std::move(future)), keep_(std::move(keep)), mesh_(std::move(mesh)) {}

  bool done() const { return future_.Ready(); }
  // `give_up`: a synchronous call's wait. A signal (Ctrl-C) during it gives
  // the op up (Mesh::give_up: the mesh breaks unless it completed), since
  // nobody can wait for it again and this member's next op would pair with
  // the others' next ones.
  void wait(double timeout, bool give_up) {
    std::function<void()> on_interrupt;
    if (give_up) {
      on_interrupt = [this] {
        if (std::shared_ptr<Mesh> mesh = mesh_.lock()) GiveUpOnSignal(*mesh, future_);
      };
    }
    WaitFor(future_, timeout, on_interrupt);
    keep_.clear();
  }
  // The error of a completed op (None when it succeeded or is not done).
  std::optional<std::pair<int, std::string>> error() const {
    if (!future_.Ready()) return std::nullopt;
    absl::Status st = future_.Wait(absl::ZeroDuration());
    if (st.ok()) return std::nullopt;
    return std::make_pair(static_cast<int>(st.code()), std::string(st.message()));
  }
  std::vector<int64_t> out_shape() const { return future_.out_shape(); }
  int64_t sequence() const { return future_.sequence(); }
  nb::dict timing() const {
    OpTiming t = future_.timing();
    nb::dict d;
    d["submitted_ns"] = t.submitted_ns;
    d["taken_ns"] = t.taken_ns;
    d["matched_ns"] = t.matched_ns;
    d["ready_ns"] = t.ready_ns;
    d["started_ns"] = t.started_ns;
    d["launched_ns"] = t.launched_ns;
    d["executed_ns"] = t.executed_ns;
    d["device_ns"] = t.device_ns;
    d["completed_ns"] = t.completed_ns;
    d["reaped_ns"] = t.reaped_ns;
    return d;
  }

 private:
  OpFuture future_;
  std::vector<nb::object> keep_;
  std::weak_ptr<Mesh> mesh_;  // to give the op up (none: a client-level op)
};

// JAX's axis_name as Python spells it: a str, a tuple or list of str, or
// None (every axis).
AxisNames AxesOf(nb::handle axes) {
  if (axes.is_none()) return AxisNames::All();
  if (nb::isinstance<nb::str>(axes)) return AxisNames(nb::cast<std::string>(axes));
  return AxisNames(nb::cast<std::vector<std::string>>(axes));
}

// The DType of a buffer-protocol format of `itemsize`-byte elements (numpy's
// own dtypes; ml_dtypes' have no buffer format); kInvalid if none.
DType DTypeOfFormat(const char* format, Py_ssize_t itemsize) {
  if (format == nullptr) return DType::kU8;
  if (*format == '<' || *format == '=' || *format == '@') ++format;
  if (format[0] == 0 || format[1] != 0) return DType::kInvalid;
  switch (format[0]) {
    case 'f': return DType::kF32;
    case 'd': return DType::kF64;
    case 'e': return DType::kF16;
    case 'b': return DType::kI8;
    case 'B': return DType::kU8;
    case '?': return DType::kBool;
    case 'i': case 'l': case 'q':
      return itemsize == 4 ? DType::kI32 : itemsize == 8 ? DType::kI64 : DType::kInvalid;
    case 'I': case 'L': case 'Q':
      return itemsize == 4 ? DType::kU32 : itemsize == 8 ? DType::kU64 : DType::kInvalid;
    default: return DType::kInvalid;
  }
}

class PyMesh {
 public:
  PyMesh(std::unique_ptr<Mesh> mesh, std::weak_ptr<Client> client, std::shared_ptr<Reclaim> reclaim)
      : mesh_(std::move(mesh)), reclaim_(reclaim.get()), reclaim_owner_(reclaim) {
    entry_ = std::make_shared<MeshEntry>();
    entry_->mesh = mesh_;
    entry_->client = std::move(client);
    entry_->reclaim = std::move(reclaim);
    handle_ = RegisterMesh(entry_);
  }
  ~PyMesh() {
    // The last owner of the Mesh leaves it: an RPC bounded by the client's
    // close timeout (a JAX call in flight may hold it a little longer).
    // Everything that may own the Mesh goes without the GIL: the entry too
    // (it holds the Mesh and the staging buffers), or the member released
    // last would leave with the GIL held (Python stalled for the RPC).
    nb::gil_scoped_release unlocked;
    UnregisterMesh(handle_);
    entry_.reset();
    mesh_.reset();
  }
  PyMesh(const PyMesh&) = delete;
  PyMesh& operator=(const PyMesh&) = delete;

  Mesh& mesh() { return *mesh_; }
  // The mesh's handle for the JAX FFI handler (bridge.h).
  int64_t handle() const { return handle_; }

  // One entry point for every collective: x and out are (buffer, byte offset,
  // shape, dtype) of arrays already in shared buffers; dtypes are
  // collectived's DType values.
  PyFuture Submit(int kind, nb::handle x_buffer, size_t x_offset, std::vector<int64_t> x_shape,
                  int dtype, nb::handle axes, nb::handle out_buffer,
                  size_t out_offset, std::vector<int64_t> out_shape, int out_dtype,
                  std::vector<std::pair<int, int>> perm, int a, int b, bool tiled,
                  uintptr_t stream) {
    std::vector<nb::object> keep;
    Collective args{.kind = static_cast<CollectiveKind>(kind),
                    .axes = AxesOf(axes),
                    .perm = std::move(perm),
                    .axis = a,
                    .concat_axis = b,
                    .tiled = tiled};
    if (!x_buffer.is_none()) {
      args.x = Array{&nb::cast<PyBuffer&>(x_buffer).buffer(), x_offset, static_cast<DType>(dtype),
                     std::move(x_shape)};
      keep.push_back(nb::borrow(x_buffer));
    }
    if (!out_buffer.is_none()) {
      args.out = Array{&nb::cast<PyBuffer&>(out_buffer).buffer(), out_offset,
                       static_cast<DType>(out_dtype), std::move(out_shape)};
      keep.push_back(nb::borrow(out_buffer));
    }
    OpFuture f;
    {
      // Submitting may block briefly (a full fast-path queue, a gRPC write).
      nb::gil_scoped_release unlocked;
      // Stream-ordered for this op only when `stream` is set (other threads'
      // ops on the mesh are not ordered with it).
      f = mesh_->submit(args, reinterpret_cast<void*>(stream));
    }
    return PyFuture(std::move(f), std::move(keep), mesh_);
  }

  // The common case without Python in the way: an in-place psum, pmean,
  // pmax or pmin of a writable C-contiguous array that lies in a shared
  // buffer, whose result keeps its dtype. Runs it to completion and returns
  // true; false (nothing done) when `x` is not such an array: the caller
  // takes the general path.
  bool RunInPlace(int kind, nb::handle x, nb::handle axes) {
    Py_buffer view;
    if (PyObject_GetBuffer(x.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) !=
        0) {
      PyErr_Clear();
      return false;
    }
    const DType dt = DTypeOfFormat(view.format, view.itemsize);
    const uintptr_t address = reinterpret_cast<uintptr_t>(view.buf);
    const size_t bytes = static_cast<size_t>(view.len);
    std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
    PyBuffer_Release(&view);  // x (held by the caller) keeps the memory
    if (!KeepsDType(kind, dt)) return false;
    auto [buffer, start] = Registry::Get().Find(address, bytes, reclaim_);
    if (buffer == nullptr) return false;
    // Held until the op ended: x may be a view that does not own the buffer.
    nb::object keep = nb::find(buffer);
    RunAndWait(Collective{.kind = static_cast<CollectiveKind>(kind),
                          .x = Array{&buffer->buffer(), address - start, dt, std::move(shape)},
                          .axes = AxesOf(axes)});
    return true;
  }

  // RunInPlace for an array that is not in a shared buffer, or whose result
  // must not replace it: `x` (C-contiguous) is copied into this mesh's
  // staging buffer, the op runs there in place, and the result is copied
  // into `dest` (writable, C-contiguous, x's dtype and size; x itself for
  // an in-place op). No shared buffer per call, and a small op still runs
  // among the members. False (nothing done) when the arrays are not such.
  bool RunStaged(int kind, nb::handle x, nb::handle dest, nb::handle axes) {
    Py_buffer in, out;
    if (PyObject_GetBuffer(x.ptr(), &in, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return false;
    }
    if (PyObject_GetBuffer(dest.ptr(), &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                                 PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      PyBuffer_Release(&in);
      return false;
    }
    // Released at the end: the buffers stay pinned while the op reads and
    // writes them (x and dest are held by the caller).
    absl::Cleanup release = [&] {
      PyBuffer_Release(&out);
      PyBuffer_Release(&in);
    };
    const DType dt = DTypeOfFormat(in.format, in.itemsize);
    if (DTypeOfFormat(out.format, out.itemsize) != dt || out.len != in.len ||
        !KeepsDType(kind, dt)) {
      return false;
    }
    std::shared_ptr<Client> client = entry_->client.lock();
    if (client == nullptr) return false;  // the general path says why
    const size_t bytes = static_cast<size_t>(in.len);
    std::vector<int64_t> shape(in.shape, in.shape + in.ndim);
    std::optional<absl::MutexLock> lock;
    Buffer& staging = entry_->in;
    absl::Status grown;
    {
      nb::gil_scoped_release unlocked;  // a jitted call may hold the lock a while
      lock.emplace(&entry_->mu);
      grown = GrowStaging(*client, staging, bytes);
    }
    Check(grown);
    if (bytes > 0) std::memcpy(staging.data(), in.buf, bytes);
    RunAndWait(Collective{.kind = static_cast<CollectiveKind>(kind),
                          .x = Array{&staging, 0, dt, std::move(shape)},
                          .axes = AxesOf(axes)});
    if (bytes > 0) std::memcpy(out.buf, staging.data(), bytes);
    return true;
  }

  // Mesh::AllocateShared: a buffer every member of the mesh maps.
  std::unique_ptr<PyBuffer> AllocateShared(size_t bytes) {
    absl::StatusOr<Buffer> buffer;
    {
      nb::gil_scoped_release unlocked;
      buffer = mesh_->AllocateShared(bytes);
    }
    Check(buffer.status());
    return std::make_unique<PyBuffer>(std::move(*buffer), reclaim_owner_);
  }

  // Whether an in-place `kind` of dtype `dt` keeps the dtype (psum of
  // bool counts as int32, pmean of integers gives floats).
  static bool KeepsDType(int kind, DType dt) {
    using K = CollectiveKind;
    const K k = static_cast<K>(kind);
    const bool same = k == K::kPmax || k == K::kPmin || (k == K::kPsum && dt != DType::kBool) ||
                      (k == K::kPmean && IsFloat(dt));
    return dt != DType::kInvalid && same;
  }

  // Runs `op` (in place, synchronous) to completion: among the members when
  // it is small (no round trip through the daemon), else through it. A
  // signal while the members wait for each other there (Ctrl-C) gives the
  // op up (Mesh::start: the mesh breaks) and raises what the handler
  // raised; on the daemon path it gives the op up as WaitFor says.
  void RunAndWait(const Collective& op) {
    std::optional<nb::python_error> raised;
    const std::function<bool()> interrupted = [&raised] {
      nb::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return false;
      raised.emplace();  // takes the handler's exception
      return true;
    };
    OpFuture f;
    {
      nb::gil_scoped_release unlocked;
      f = mesh_->start(op, interrupted);
    }
    if (raised) throw nb::python_error(std::move(*raised));
    WaitFor(f, -1.0, [&] { GiveUpOnSignal(*mesh_, f); });
  }

  void Leave() {
    absl::Status st;
    {
      nb::gil_scoped_release unlocked;
      UnregisterMesh(handle_);  // compiled JAX functions now fail cleanly
      st = mesh_->Leave();
    }
    Check(st);
  }

 private:
  std::shared_ptr<Mesh> mesh_;  // shared with the JAX FFI handler's table
  const Reclaim* reclaim_;      // identifies the client's buffers (Registry)
  std::shared_ptr<Reclaim> reclaim_owner_;  // where its shared buffers go when dropped
  int64_t handle_ = 0;
  // Its entry in the JAX handler's table: the staging buffer RunStaged
  // shares with the handler (one op at a time under its lock).
  std::shared_ptr<MeshEntry> entry_;
};

class PyClient {
 public:
  static std::unique_ptr<PyClient> Connect(std::string socket_path, std::string name,
                                           double connect_timeout, double rpc_timeout,
                                           double close_timeout, bool fast_path) {
    ClientOptions options;
    options.socket_path = std::move(socket_path);
    options.client_name = std::move(name);
    options.connect_timeout = Seconds(connect_timeout);
    options.rpc_timeout = Seconds(rpc_timeout);
    options.close_timeout = Seconds(close_timeout);
    options.fast_path = fast_path;
    absl::StatusOr<std::unique_ptr<Client>> client;
    {
      nb::gil_scoped_release unlocked;
      client = Client::Connect(std::move(options));
    }
    Check(client.status());
    return std::make_unique<PyClient>(std::move(*client));
  }

  explicit PyClient(std::shared_ptr<Client> client)
      : client_(std::move(client)), reclaim_(std::make_shared<Reclaim>()) {}
  ~PyClient() { Close(); }
  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  Client& client() {
    if (!client_) Raise(absl::FailedPreconditionError("the client is closed"));
    return *client_;
  }

  std::unique_ptr<PyBuffer> Allocate(size_t bytes, std::string device) {
    Client& c = client();
    absl::StatusOr<Buffer> buffer;
    {
      nb::gil_scoped_release unlocked;
      FreeReclaimed(c);
      buffer = c.Allocate(bytes, device);
    }
    Check(buffer.status());
    return std::make_unique<PyBuffer>(std::move(*buffer), reclaim_);
  }

  // Frees the buffers Python dropped (see Reclaim); returns how many.
  size_t Collect() {
    Client& c = client();
    nb::gil_scoped_release unlocked;
    return FreeReclaimed(c);
  }

  std::unique_ptr<PyMesh> JoinMesh(std::string name, std::vector<std::pair<std::string, int>> axes,
                                   std::vector<int> coordinate, std::string scope,
                                   double join_timeout, double op_timeout, std::string join_token) {
    Client& c = client();
    MeshOptions options;
    options.name = std::move(name);
    options.axes = std::move(axes);
    options.coordinate = std::move(coordinate);
    options.scope = std::move(scope);
    options.join_timeout = Seconds(join_timeout);
    options.op_timeout = op_timeout > 0 ? Seconds(op_timeout) : absl::ZeroDuration();
    options.join_token = std::move(join_token);
    // A join cannot be abandoned halfway: it runs to its own timeout (or
    // every member's arrival) with the GIL released.
    absl::StatusOr<std::unique_ptr<Mesh>> mesh;
    {
      nb::gil_scoped_release unlocked;
      mesh = c.JoinMesh(options);
    }
    Check(mesh.status());
    return std::make_unique<PyMesh>(std::move(*mesh), client_, reclaim_);
  }

  void Close() {
    if (!client_) return;
    std::shared_ptr<Client> client = std::move(client_);
    nb::gil_scoped_release unlocked;
    std::vector<Reclaim::Dropped> dropped;  // unmapped here; the session's end frees them
    {
      absl::MutexLock lock(&reclaim_->mu);
      reclaim_->closed = true;
      dropped.swap(reclaim_->pending);
    }
    for (Reclaim::Dropped& d : dropped) Reclaim::Settle(d);
    dropped.clear();
    // Closes the session (the daemon frees what is left), unless a JAX call
    // in flight holds the client: then when that call returns.
    client.reset();
  }

  bool closed() const { return client_ == nullptr; }
  const Reclaim* reclaim() const { return reclaim_.get(); }

 private:
  size_t FreeReclaimed(Client& c) {
    std::vector<Reclaim::Dropped> pending;
    {
      absl::MutexLock lock(&reclaim_->mu);
      pending.swap(reclaim_->pending);
    }
    // Best effort: what fails here is freed when the session ends. A GPU
    // buffer that queued work still uses goes back for a later round (or is
    // settled, if Close() ran meanwhile: Add knows).
    size_t freed = 0;
    for (Reclaim::Dropped& d : pending) {
      if (d.Unused()) {
        c.Free(d.buffer).IgnoreError();
        ++freed;
      } else {
        reclaim_->Add(std::move(d.buffer), std::move(d.unused));
      }
    }
    return freed;
  }

  std::shared_ptr<Client> client_;  // the JAX FFI handler's table holds it weakly
  std::shared_ptr<Reclaim> reclaim_;
};

// The helpers of GPU arrays (collectived.DeviceArray and the staging of other
// libraries' GPU arrays).
void DefineGpuHelpers(nb::module_& m) {
  m.def(
      "dlpack_info",
      [](nb::ndarray<> a) {
        // Any DLPack producer or capsule, on any device (the caller asks a
        // CUDA producer for a capsule ordered before the legacy default
        // stream: __dlpack__(stream=1)). Nothing is copied or dereferenced.
        std::vector<int64_t> shape(a.ndim());
        bool contiguous = true;
        int64_t expect = 1;
        for (size_t i = a.ndim(); i-- > 0;) {
          shape[i] = static_cast<int64_t>(a.shape(i));
          if (a.shape(i) != 1 && a.stride(i) != expect) contiguous = false;
          expect *= static_cast<int64_t>(a.shape(i));
        }
        return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), shape, a.dtype().code,
                              a.dtype().bits, a.dtype().lanes, a.device_type(), a.device_id(),
                              contiguous);
      },
      nb::arg("array"),
      "(address, shape, DLPack type code, bits, lanes, device type, device id, "
      "C-contiguous) of a DLPack-exporting array.");
  m.def(
      "device_copy",
      [](uintptr_t dst, uintptr_t src, size_t bytes, int ordinal) {
#ifdef COLLECTIVED_PYTHON_HAS_CUDA
        cudaError_t e = cudaSuccess;
        {
          nb::gil_scoped_release unlocked;
          // On the device's legacy default stream (its primary context's,
          // which torch's, cupy's and JAX's runtimes share), the calling
          // thread's current device restored after.
          e = OnGpu(ordinal, [&] {
            cudaError_t err =
                cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                                bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy);
            return err == cudaSuccess ? cudaStreamSynchronize(cudaStreamLegacy) : err;
          });
        }
        if (e != cudaSuccess) {
          Raise(absl::InternalError(absl::StrCat("copying ", bytes, " B between GPU arrays: ",
                                                 cudaGetErrorName(e), ": ",
                                                 cudaGetErrorString(e))));
        }
#else
        Raise(absl::UnimplementedError(absl::StrCat(
            "copying ", bytes, " B between GPU arrays (", dst, " <- ", src, ", device ",
            ordinal, "): this Python module was built without CUDA")));
#endif
      },
      nb::arg("dst"), nb::arg("src"), nb::arg("bytes"), nb::arg("ordinal"),
      "Copies bytes from device address src to dst on CUDA device ordinal's legacy default "
      "stream and waits for it.");
  m.def(
      "gpu_name",
      [](int ordinal) {
        absl::StatusOr<std::string> name = GpuName(ordinal);
        Check(name.status());
        return *name;
      },
      nb::arg("ordinal"), "The daemon's name (cuda:GPU-<uuid>) of this process's CUDA device.");
  m.def(
      "device_ndarray",
      [](uintptr_t address, std::vector<size_t> shape, uint8_t code, uint8_t bits, int device_id,
         nb::handle owner) {
        // C-contiguous (no strides); nanobind copies the shape and holds
        // `owner` until the last export of it is released.
        return nb::ndarray<nb::array_api>(reinterpret_cast<void*>(address), shape.size(),
                                          shape.data(), owner, nullptr,
                                          nb::dlpack::dtype{code, bits, 1},
                                          nb::device::cuda::value, device_id);
      },
      nb::arg("address"), nb::arg("shape"), nb::arg("code"), nb::arg("bits"),
      nb::arg("device_id"), nb::arg("owner"),
      "A DLPack-exporting view (__dlpack__, __dlpack_device__) of CUDA memory at address on "
      "device_id, with DLPack type (code, bits); it keeps owner alive.");
}

}  // namespace
}  // namespace collectived::python

NB_MODULE(_collectived, m) {
  using namespace collectived;
  using namespace collectived::python;
  m.doc() = "collectived's C++ SDK, as the collectived package uses it (not a public API).";

  m.def(
      "locate",
      [](uintptr_t address, size_t bytes,
         PyClient& client) -> std::optional<std::pair<nb::object, size_t>> {
        auto [buffer, start] = Registry::Get().Find(address, bytes, client.reclaim());
        if (buffer == nullptr) return std::nullopt;
        return std::make_pair(nb::find(buffer), static_cast<size_t>(address - start));
      },
      "(Buffer, byte offset) of client's buffer holding [address, address + bytes), or None.");

  // A handler as jax.ffi.register_ffi_target takes it; None for null.
  auto capsule_or_none = [](void* handler) -> nb::object {
    if (handler == nullptr) return nb::none();
    return nb::capsule(handler);
  };
  m.def(
      "jax_ffi_handler", [=] { return capsule_or_none(JaxFfiHandler()); },
      "The XLA FFI handler of collectived.jax as a PyCapsule; None when this module was "
      "built without jaxlib's FFI headers.");
  m.def(
      "jax_ffi_cuda_handler", [=] { return capsule_or_none(JaxFfiCudaHandler()); },
      "The XLA FFI handler of collectived.jax for the CUDA platform as a PyCapsule; None when "
      "this module was built without jaxlib's FFI headers or without CUDA.");
  m.attr("__version__") = COLLECTIVED_VERSION;
  DefineGpuHelpers(m);
  m.def("jax_watch_interrupts", &WatchInterrupts,
        "Puts collectived.jax's SIGINT watch in front of Python's handler, so that Ctrl-C "
        "reaches calls waiting inside jitted functions.");
  m.def("jax_interrupts_seen", &InterruptsSeen, "SIGINTs collectived.jax's watch has counted.");

  m.def("_set_error_factory", [](nb::object factory) {
    if (error_factory == nullptr) error_factory = new nb::object();
    *error_factory = std::move(factory);
  });

  nb::class_<PyBuffer>(m, "Buffer", nb::is_weak_referenceable())
      .def_prop_ro("id", [](const PyBuffer& b) { return b.buffer().id(); })
      .def_prop_ro("size", [](const PyBuffer& b) { return b.buffer().size(); })
      .def_prop_ro("device", [](const PyBuffer& b) { return b.buffer().device(); })
      .def_prop_ro("device_ordinal", [](const PyBuffer& b) { return b.buffer().device_ordinal(); })
      .def_prop_ro("address",
                   [](const PyBuffer& b) { return reinterpret_cast<uintptr_t>(b.buffer().data()); })
      // The whole buffer as a 1-D uint8 numpy array whose base keeps this
      // Buffer (and so the mapping) alive.
      .def("view", [](nb::handle self) {
        const Buffer& b = nb::cast<const PyBuffer&>(self).buffer();
        if (b.device_ordinal() >= 0) {
          Raise(absl::UnimplementedError(absl::StrCat(
              "buffer ", b.id(), " is GPU memory (", b.device(),
              "): numpy views host memory only; it is a collectived.DeviceArray")));
        }
        return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(b.data(), {b.size()}, self);
      });

  nb::class_<PyFuture>(m, "Future")
      .def("done", &PyFuture::done)
      .def("wait", &PyFuture::wait, nb::arg("timeout") = -1.0, nb::arg("give_up") = false)
      .def("error", &PyFuture::error)
      .def_prop_ro("out_shape", &PyFuture::out_shape)
      .def_prop_ro("sequence", &PyFuture::sequence)
      .def_prop_ro("timing", &PyFuture::timing);

  nb::class_<PyMesh>(m, "Mesh")
      .def_prop_ro("id", [](PyMesh& m) { return m.mesh().id(); })
      .def_prop_ro("name", [](PyMesh& m) { return m.mesh().name(); })
      .def_prop_ro("generation", [](PyMesh& m) { return m.mesh().generation(); })
      .def_prop_ro("index", [](PyMesh& m) { return m.mesh().index(); })
      .def_prop_ro("size", [](PyMesh& m) { return m.mesh().size(); })
      .def_prop_ro("axes", [](PyMesh& m) { return m.mesh().axes(); })
      .def_prop_ro("coordinate", [](PyMesh& m) { return m.mesh().coordinate(); })
      .def_prop_ro("member_side_status",
                   [](PyMesh& m) -> std::optional<std::string> {
                     const absl::Status& st = m.mesh().member_side();
                     if (st.ok()) return std::nullopt;
                     return std::string(st.message());
                   })
      .def_prop_ro("member_reads", [](PyMesh& m) { return m.mesh().member_reads(); })
      .def(
          "axis_index",
          [](PyMesh& m, nb::handle axes) { return m.mesh().axis_index(AxesOf(axes)); },
          nb::arg("axes").none())
      .def(
          "axis_size",
          [](PyMesh& m, nb::handle axes) { return m.mesh().axis_size(AxesOf(axes)); },
          nb::arg("axes").none())
      .def("submit", &PyMesh::Submit, nb::arg("kind"), nb::arg("x_buffer").none(),
           nb::arg("x_offset"), nb::arg("x_shape"), nb::arg("dtype"), nb::arg("axes").none(),
           nb::arg("out_buffer").none(), nb::arg("out_offset"), nb::arg("out_shape"),
           nb::arg("out_dtype"), nb::arg("perm"), nb::arg("a"), nb::arg("b"), nb::arg("tiled"),
           nb::arg("stream") = 0)
      .def_prop_ro("handle", &PyMesh::handle)
      .def("run_in_place", &PyMesh::RunInPlace, nb::arg("kind"), nb::arg("x"),
           nb::arg("axes").none())
      .def("run_staged", &PyMesh::RunStaged, nb::arg("kind"), nb::arg("x"), nb::arg("dest"),
           nb::arg("axes").none())
      .def("allocate_shared", &PyMesh::AllocateShared, nb::arg("bytes"))
      .def("leave", &PyMesh::Leave);

  nb::class_<PyClient>(m, "Client")
      .def_static("connect", &PyClient::Connect, nb::arg("socket_path"), nb::arg("name"),
                  nb::arg("connect_timeout"), nb::arg("rpc_timeout"), nb::arg("close_timeout"),
                  nb::arg("fast_path"))
      .def("allocate", &PyClient::Allocate, nb::arg("bytes"), nb::arg("device"))
      .def("collect", &PyClient::Collect)
      .def("join_mesh", &PyClient::JoinMesh, nb::arg("name"), nb::arg("axes"),
           nb::arg("coordinate"), nb::arg("scope"), nb::arg("join_timeout"),
           nb::arg("op_timeout"), nb::arg("join_token"))
      .def("close", &PyClient::Close)
      .def_prop_ro("closed", &PyClient::closed)
      .def_prop_ro("session_id", [](PyClient& c) { return c.client().session_id(); })
      .def_prop_ro("socket_path", [](PyClient& c) { return c.client().socket_path(); })
      .def_prop_ro("fast_path", [](PyClient& c) { return c.client().fast_path(); });
}
