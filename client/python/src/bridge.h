// What the Python extension's parts share: the queue of buffers to free
// later, and the table of meshes that the JAX FFI handler (jax_ffi.cc) runs
// ops on. Ops reach the C++ SDK through Mesh::submit(Collective), whose
// CollectiveKind values collectived/__init__.py uses as they are.
#ifndef COLLECTIVED_CLIENT_PYTHON_BRIDGE_H_
#define COLLECTIVED_CLIENT_PYTHON_BRIDGE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectived/client.h"

#ifdef COLLECTIVED_PYTHON_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace collectived::python {

// Buffers whose last user went away, waiting to be freed in the daemon. A
// destructor must not make an RPC (it may run anywhere, with the GIL held):
// the client frees them on its next allocation and when it closes. Unused
// until then, they cost daemon memory only; the daemon frees whatever is
// left when the session ends.
//
// A GPU buffer may still be used by work queued on a CUDA stream (the JAX
// CUDA handler's staging buffers): it comes with `unused`, which says
// whether that work is done (a CUDA event's query), and is freed or
// unmapped only once it says so (Settle bounds the wait at Close).
struct Reclaim {
  struct Dropped {
    Buffer buffer;
    std::function<bool()> unused;  // null: nothing queued uses it
    bool Unused() const { return !unused || unused(); }
  };
  absl::Mutex mu;
  std::vector<Dropped> pending ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;

  void Add(Buffer buffer, std::function<bool()> unused = nullptr) {
    if (!buffer.valid()) return;
    Dropped dropped{std::move(buffer), std::move(unused)};
    {
      absl::MutexLock lock(&mu);
      if (!closed) {
        pending.push_back(std::move(dropped));
        return;
      }
    }
    // After the client closed, the daemon has freed it already: unmap
    // only, once nothing queued uses it.
    Settle(dropped);
  }

  // Waits (a bounded while) until nothing queued uses `dropped`'s buffer.
  // Past the bound the buffer is left mapped (its work is stuck; unmapping
  // it under a running copy would fault the stream): the process's exit
  // unmaps it. Only after the client closed, on the thread that drops the
  // buffer's last user (which may be XLA's, when a jitted call still held
  // the mesh): never with the GIL held by this code.
  static void Settle(Dropped& dropped) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!dropped.Unused()) {
      if (absl::Now() > give_up) {
        new Buffer(std::move(dropped.buffer));  // deliberately kept mapped
        return;
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  }
};

// A mesh as the JAX FFI handler reaches it: by a handle (an attribute of the
// compiled call), with the client to allocate staging buffers from.
struct MeshEntry {
  std::shared_ptr<Mesh> mesh;
  std::weak_ptr<Client> client;
  std::shared_ptr<Reclaim> reclaim;
  // Staging buffers of the handler, grown on demand; one op at a time.
  absl::Mutex mu;
  Buffer in ABSL_GUARDED_BY(mu);
  Buffer out ABSL_GUARDED_BY(mu);
  // The CUDA handler's: GPU buffers on the GPU of XLA's operands, and its
  // stream-ordered ops not yet seen complete (oldest first).
  Buffer gpu_in ABSL_GUARDED_BY(mu);
  Buffer gpu_out ABSL_GUARDED_BY(mu);
  std::deque<OpFuture> gpu_pending ABSL_GUARDED_BY(mu);
  void* gpu_stream ABSL_GUARDED_BY(mu) = nullptr;  // the last call's (a cudaStream_t)
  // Whether the work the last call queued on its stream (which reads and
  // writes gpu_in and gpu_out) is done; null before any.
  std::function<bool()> gpu_idle ABSL_GUARDED_BY(mu);
  // The CUDA event gpu_idle queries (a cudaEvent_t), made on the GPU
  // gpu_event_device once, recorded by every call.
  std::shared_ptr<void> gpu_event ABSL_GUARDED_BY(mu);
  int gpu_event_device ABSL_GUARDED_BY(mu) = -1;

  ~MeshEntry() {
    absl::MutexLock lock(&mu);
    for (Buffer* b : {&in, &out}) reclaim->Add(std::move(*b));
    for (Buffer* b : {&gpu_in, &gpu_out}) reclaim->Add(std::move(*b), gpu_idle);
  }
};

// Makes `buffer` (a staging buffer of `client`'s session) at least `bytes`
// long: a new buffer, of the next power of two from 4 KiB, on `device` (as
// Client::Allocate names devices; empty: host memory), when it is not (the
// old one is freed).
absl::Status GrowStaging(Client& client, Buffer& buffer, size_t bytes,
                         std::string_view device = "");

// The daemon's name ("cuda:GPU-<uuid>") of the CUDA device `ordinal` of this
// process; UNIMPLEMENTED in a module built without CUDA.
absl::StatusOr<std::string> GpuName(int ordinal);

#ifdef COLLECTIVED_PYTHON_HAS_CUDA
// Runs `fn` (which returns a cudaError_t) with GPU `ordinal` current on the
// calling thread, then gives the thread its current device back; the first
// error.
template <typename Fn>
cudaError_t OnGpu(int ordinal, Fn fn) {
  int previous = -1;
  cudaError_t e = cudaGetDevice(&previous);
  if (e == cudaSuccess && previous != ordinal) e = cudaSetDevice(ordinal);
  if (e == cudaSuccess) e = fn();
  if (previous >= 0 && previous != ordinal) cudaSetDevice(previous);
  return e;
}
#endif

// Registers a mesh; returns its handle (> 0, never reused in the process).
int64_t RegisterMesh(std::shared_ptr<MeshEntry> entry);
void UnregisterMesh(int64_t handle);
// Null once unregistered.
std::shared_ptr<MeshEntry> FindMesh(int64_t handle);

// The XLA FFI handler (a PyCapsule for jax.ffi.register_ffi_target), or
// null when this module was built without jaxlib's FFI headers.
void* JaxFfiHandler();
// The same for XLA's CUDA platform (operands in device memory, ordered on
// XLA's stream); null as above, or when this module was built without CUDA.
void* JaxFfiCudaHandler();
// Puts collectived.jax's SIGINT watch in front of Python's handler (no-op
// without the FFI handler, or when SIGINT is ignored or default).
void WatchInterrupts();
// SIGINTs the watch has seen (tests).
uint64_t InterruptsSeen();

}  // namespace collectived::python

#endif  // COLLECTIVED_CLIENT_PYTHON_BRIDGE_H_
