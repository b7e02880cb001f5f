// The XLA FFI handlers behind collectived.jax: one custom call target,
// "collectived_collective", runs any collective of a registered mesh on a
// CPU operand inside a jitted JAX function; "collectived_collective_cuda"
// (a module built with CUDA) on a CUDA operand, ordered on XLA's stream (see
// RunOnStream). XLA calls them on its threads, without the GIL: they only
// touch C++ objects.
//
// Per call: copy the operand into the mesh's staging buffer (shared memory,
// grown on demand), run the op through the C++ SDK (in place when the
// result has the operand's bytes and dtype, else into a second staging
// buffer), wait for it (the mesh's op timeout plus grace at most), copy the
// result into XLA's output. Errors return to JAX as XlaRuntimeError with the
// status code's name and the daemon's message.
#include "bridge.h"

#ifdef COLLECTIVED_HAVE_JAX_FFI

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "xla/ffi/api/ffi.h"

#ifdef COLLECTIVED_PYTHON_HAS_CUDA
#include <cuda_runtime_api.h>

#include "absl/strings/match.h"
#endif

namespace collectived::python {
namespace {

namespace ffi = xla::ffi;

// The op kind of jax.py's axis_index: answered here, the daemon is not asked.
constexpr int32_t kAxisIndexKind = 100;

ffi::Error FromStatus(const absl::Status& status) {
  // XLA puts the code's name in front of the message.
  return ffi::Error(static_cast<ffi::ErrorCode>(status.code()), std::string(status.message()));
}

// collectived's DType of an XLA element type; kInvalid for the others.
DType DTypeOf(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::F64: return DType::kF64;
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::S8: return DType::kI8;
    case ffi::DataType::U8: return DType::kU8;
    case ffi::DataType::S32: return DType::kI32;
    case ffi::DataType::U32: return DType::kU32;
    case ffi::DataType::S64: return DType::kI64;
    case ffi::DataType::U64: return DType::kU64;
    case ffi::DataType::PRED: return DType::kBool;
    case ffi::DataType::F8E4M3FN: return DType::kF8E4M3FN;
    case ffi::DataType::F8E5M2: return DType::kF8E5M2;
    default: return DType::kInvalid;
  }
}

// Ctrl-C inside a jitted call. The call waits on one of XLA's threads while
// Python's main thread waits for XLA with the GIL released: Python's own
// handler would only run once XLA returns, and then amid the error XLA
// raises (a KeyboardInterrupt thrown while the error propagates, or while
// Python prints it at exit). So a SIGINT handler of ours sits in front of
// Python's: while a call waits here (g_waiting), it only counts the signal
// (g_sigints); the call sees the count change, gives its op up (breaking
// the mesh unless the op completed, as Python's own calls do) and fails
// with CANCELLED, which XLA raises as JaxRuntimeError (collectived.jax's
// interruptible() turns it into KeyboardInterrupt). With no call waiting,
// the signal goes to Python's handler as if we were not there; a signal
// taken by a call whose op completed anyway is passed on the same way.
// Python replaces the handler on signal.signal(SIGINT, ...):
// WatchInterrupts() puts this one back in front (every trace, and every
// call that has to wait).
std::atomic<uint64_t> g_sigints{0};
std::atomic<int> g_waiting{0};
struct sigaction g_chained;  // written only before this handler is installed
absl::Mutex g_watch_mu;

void OnSigint(int sig, siginfo_t* info, void* context) {
  if (g_waiting.load(std::memory_order_seq_cst) > 0) {
    g_sigints.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  if ((g_chained.sa_flags & SA_SIGINFO) != 0) {
    if (g_chained.sa_sigaction != nullptr) g_chained.sa_sigaction(sig, info, context);
  } else if (g_chained.sa_handler != SIG_IGN && g_chained.sa_handler != SIG_DFL &&
             g_chained.sa_handler != nullptr) {
    g_chained.sa_handler(sig);
  }
}

}  // namespace

uint64_t InterruptsSeen() { return g_sigints.load(std::memory_order_relaxed); }

void WatchInterrupts() {
  absl::MutexLock lock(&g_watch_mu);
  struct sigaction current {};
  if (sigaction(SIGINT, nullptr, &current) != 0) return;
  const bool has_info = (current.sa_flags & SA_SIGINFO) != 0;
  if (has_info && current.sa_sigaction == &OnSigint) return;  // in place
  // Ignored: nothing to interrupt. Default: the process ends anyway.
  if (!has_info && (current.sa_handler == SIG_IGN || current.sa_handler == SIG_DFL)) return;
  g_chained = current;
  struct sigaction ours = current;
  ours.sa_flags = (current.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
  ours.sa_sigaction = &OnSigint;
  sigaction(SIGINT, &ours, nullptr);
}

namespace {

// XLA's CPU client allocates every output anew, and one of 32 MiB or more
// (glibc's largest mmap threshold) is a fresh mapping whose 4 KiB pages fault
// one by one as the copy into it writes them: a third of a 64 MiB psum here.
// Asked for transparent huge pages (NumPy does so for its own large arrays),
// the kernel faults in 2 MiB at a time. Only for a region not yet in memory
// (a reused heap block keeps its pages), and only its whole 2 MiB pages; the
// hint's failure changes nothing but the speed.
void AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end <= begin) return;
  unsigned char resident = 0;
  if (mincore(reinterpret_cast<void*>(begin), 1, &resident) != 0 || (resident & 1) != 0) return;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// Runs `op` as Mesh::run does (a small op among the members, else through
// the daemon) and waits for it within its bound (the mesh's op timeout plus
// grace); a SIGINT meanwhile gives the op up (see g_sigints).
absl::Status RunInterruptibly(Mesh& mesh, const Collective& op) {
  g_waiting.fetch_add(1, std::memory_order_seq_cst);
  const uint64_t seen = g_sigints.load(std::memory_order_seq_cst);
  bool gave_up = false;
  absl::Cleanup done = [&] {
    g_waiting.fetch_sub(1, std::memory_order_seq_cst);
    // A signal taken while the op completed anyway: Python's, after all.
    if (!gave_up && g_sigints.load(std::memory_order_seq_cst) != seen) raise(SIGINT);
  };
  bool watching = false;
  auto interrupted = [&] {
    if (!watching) {  // only calls that wait pay for the check
      WatchInterrupts();
      watching = true;
    }
    return g_sigints.load(std::memory_order_seq_cst) != seen;
  };
  constexpr absl::string_view kInterrupted =
      "interrupted by SIGINT (Ctrl-C) while it waited inside a jitted JAX call";
  OpFuture future = mesh.start(op, interrupted);
  if (future.Ready()) {
    absl::Status st = future.Wait(absl::ZeroDuration());
    // Mesh::start gave a member-side op up.
    if (absl::IsCancelled(st) && interrupted()) {
      gave_up = true;
      return absl::CancelledError(absl::StrCat(kInterrupted, ": ", st.message()));
    }
    return st;
  }
  const absl::Time deadline = absl::Now() + future.default_timeout();
  while (!future.Ready()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the op did not complete within ", absl::FormatDuration(future.default_timeout()),
          " (its op timeout plus grace: the daemon did not answer)"));
    }
    future.Wait(std::min(left, absl::Milliseconds(10))).IgnoreError();
    if (!future.Ready() && interrupted()) {
      gave_up = mesh.give_up(future, kInterrupted);
      if (gave_up) {
        return absl::CancelledError(absl::StrCat(
            kInterrupted, ": this member gave its op up, and the mesh breaks for every member"));
      }
    }
  }
  return future.Wait(absl::ZeroDuration());
}

// One call's op, as both handlers run it. A call is answered in Prepare when
// `answered` is set (axis_index, or an error).
struct Call {
  std::shared_ptr<MeshEntry> entry;
  std::shared_ptr<Client> client;
  Collective args;
  DType in_dt = DType::kInvalid, out_dt = DType::kInvalid;
  size_t in_bytes = 0, out_bytes = 0;
  bool in_place = false;
  int axis_index = -1;  // kAxisIndexKind: the answer
};

absl::StatusOr<Call> Prepare(ffi::AnyBuffer x, ffi::AnyBuffer::Dimensions out_dims,
                             ffi::DataType out_type, size_t out_bytes, int64_t mesh_handle,
                             int32_t kind, std::string_view axes, int64_t a, int64_t b,
                             bool tiled, ffi::Span<const int64_t> perm) {
  Call call;
  call.entry = FindMesh(mesh_handle);
  if (call.entry == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the collectived mesh this function was traced with (handle ", mesh_handle,
        ") has been left or garbage-collected"));
  }
  std::vector<std::string> names;
  if (!axes.empty()) names = absl::StrSplit(absl::string_view(axes.data(), axes.size()), ',');
  if (kind == kAxisIndexKind) {
    // jax.lax.axis_index, read at run time: the traced program stays the same
    // in every process (an index baked in as a constant would not).
    call.axis_index = call.entry->mesh->axis_index(AxisNames(names));
    if (call.axis_index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh '", call.entry->mesh->name(), "' has no axis '",
                       absl::string_view(axes.data(), axes.size()), "'"));
    }
    if (out_type != ffi::DataType::S32 || out_bytes != sizeof(int32_t)) {
      return absl::InvalidArgumentError("axis_index returns one int32");
    }
    return call;
  }
  call.client = call.entry->client.lock();
  if (call.client == nullptr) return absl::FailedPreconditionError("the client is closed");
  call.in_dt = DTypeOf(x.element_type());
  call.out_dt = DTypeOf(out_type);
  if (call.in_dt == DType::kInvalid || call.out_dt == DType::kInvalid) {
    return absl::InvalidArgumentError("collectived does not support this dtype");
  }
  if (perm.size() % 2 != 0) {
    return absl::InvalidArgumentError("perm must hold (source, dest) pairs");
  }
  Collective& args = call.args;
  args.kind = static_cast<CollectiveKind>(kind);
  // jax.py counts axes from the end (batch dimensions jax.vmap adds go in
  // front); made positive here, as the member-side path keys its plans on
  // them and other members (the SDK's) may count from the front.
  const int64_t in_rank = static_cast<int64_t>(x.dimensions().size());
  const int64_t out_rank = static_cast<int64_t>(out_dims.size());
  switch (static_cast<CollectiveKind>(kind)) {
    case CollectiveKind::kAllGather:
      if (a < 0) a += out_rank;
      break;
    case CollectiveKind::kPsumScatter:
      if (a < 0) a += in_rank;
      break;
    case CollectiveKind::kAllToAll:
      if (a < 0) a += in_rank;
      if (b < 0) b += out_rank;
      break;
    default:
      break;
  }
  args.axis = static_cast<int>(a);
  args.concat_axis = static_cast<int>(b);
  args.tiled = tiled;
  args.axes = AxisNames(std::move(names));
  for (size_t i = 0; i < perm.size(); i += 2) {
    args.perm.emplace_back(static_cast<int>(perm[i]), static_cast<int>(perm[i + 1]));
  }
  call.in_bytes = x.size_bytes();
  call.out_bytes = out_bytes;
  call.in_place = args.kind != CollectiveKind::kAllGather &&
                  args.kind != CollectiveKind::kPsumScatter && call.in_dt == call.out_dt &&
                  call.in_bytes == call.out_bytes;
  return call;
}

std::vector<int64_t> Dims(ffi::AnyBuffer::Dimensions d) { return {d.begin(), d.end()}; }

ffi::Error RunCollective(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out, int64_t mesh_handle,
                         int32_t kind, std::string_view axes, int64_t a, int64_t b, bool tiled,
                         ffi::Span<const int64_t> perm) {
  absl::StatusOr<Call> prepared = Prepare(x, out->dimensions(), out->element_type(),
                                          out->size_bytes(), mesh_handle, kind, axes, a, b, tiled,
                                          perm);
  if (!prepared.ok()) return FromStatus(prepared.status());
  Call& call = *prepared;
  if (kind == kAxisIndexKind) {
    *static_cast<int32_t*>(out->untyped_data()) = call.axis_index;
    return ffi::Error::Success();
  }
  MeshEntry& entry = *call.entry;
  absl::MutexLock lock(&entry.mu);
  if (absl::Status st = GrowStaging(*call.client, entry.in, call.in_bytes); !st.ok()) {
    return FromStatus(st);
  }
  if (!call.in_place) {
    if (absl::Status st = GrowStaging(*call.client, entry.out, call.out_bytes); !st.ok()) {
      return FromStatus(st);
    }
  }
  if (call.in_bytes > 0) std::memcpy(entry.in.data(), x.untyped_data(), call.in_bytes);
  call.args.x = Array{&entry.in, 0, call.in_dt, Dims(x.dimensions())};
  if (!call.in_place) call.args.out = Array{&entry.out, 0, call.out_dt, Dims(out->dimensions())};
  if (absl::Status st = RunInterruptibly(*entry.mesh, call.args); !st.ok()) return FromStatus(st);
  const Buffer& result = call.in_place ? entry.in : entry.out;
  AdviseHugePages(out->untyped_data(), call.out_bytes);
  if (call.out_bytes > 0) std::memcpy(out->untyped_data(), result.data(), call.out_bytes);
  return ffi::Error::Success();
}

#ifdef COLLECTIVED_PYTHON_HAS_CUDA
// The CUDA handler: XLA's operand and result are device memory, and XLA's
// stream orders the call. Per call, all enqueued on that stream, the host
// never waiting for the GPU: a device-to-device copy of the operand into
// the mesh's GPU staging buffer, the op submitted ordered with the stream
// (Mesh::submit(op, stream): the daemon reads the input once the stream got
// there, the stream waits for the result), and a copy of the result into XLA's
// output. An op's failure is reported by the next call on the mesh (the
// call that submitted it has returned by then): that call fails with it.

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

// The daemon's name ("cuda:GPU-<uuid>") of the GPU of XLA's stream (where its
// operands and results are, zero-sized ones included).
absl::StatusOr<std::string> GpuOf(cudaStream_t stream) {
  int device = -1;
  if (absl::Status st = CudaStatus(cudaStreamGetDevice(stream, &device), "cudaStreamGetDevice");
      !st.ok()) {
    return st;
  }
  return GpuName(device);
}

// The first failure among the mesh's completed stream-ordered ops, which
// are dropped; with `all`, waits for every one (the staging buffers are
// about to be replaced).
absl::Status ReapGpuOps(MeshEntry& entry, bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(entry.mu) {
  absl::Status first;
  while (!entry.gpu_pending.empty() && (all || entry.gpu_pending.front().Ready())) {
    absl::Status st = entry.gpu_pending.front().Wait();
    entry.gpu_pending.pop_front();
    if (!st.ok() && first.ok()) {
      first = absl::Status(st.code(), absl::StrCat("an earlier collectived op of this jitted "
                                                   "function's mesh failed: ", st.message()));
    }
  }
  return first;
}

// Records on `stream`, behind what this call queued there (copies and the
// op, which read and write the staging buffers), the event that
// entry.gpu_idle asks: once it completed, nothing queued uses the staging
// buffers any more (~MeshEntry hands them to Reclaim with it).
absl::Status MarkQueued(MeshEntry& entry, cudaStream_t stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(entry.mu) {
  int device = -1;
  if (absl::Status st = CudaStatus(cudaStreamGetDevice(stream, &device), "cudaStreamGetDevice");
      !st.ok()) {
    return st;
  }
  if (entry.gpu_event == nullptr || entry.gpu_event_device != device) {
    cudaEvent_t event = nullptr;
    const cudaError_t err =
        OnGpu(device, [&] { return cudaEventCreateWithFlags(&event, cudaEventDisableTiming); });
    if (absl::Status st = CudaStatus(err, "making the staging buffers' event"); !st.ok()) {
      return st;
    }
    entry.gpu_event = std::shared_ptr<void>(
        event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
    entry.gpu_event_device = device;
  }
  if (absl::Status st = CudaStatus(
          cudaEventRecord(static_cast<cudaEvent_t>(entry.gpu_event.get()), stream),
          "recording the staging buffers' event");
      !st.ok()) {
    return st;
  }
  entry.gpu_idle = [event = entry.gpu_event] {
    return cudaEventQuery(static_cast<cudaEvent_t>(event.get())) != cudaErrorNotReady;
  };
  return absl::OkStatus();
}

absl::Status EnqueueStaged(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer out,
                           Call& call, const std::string& gpu)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(call.entry->mu);

absl::Status RunOnStream(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer out, Call& call) {
  MeshEntry& entry = *call.entry;
  absl::MutexLock lock(&entry.mu);
  if (absl::Status st = ReapGpuOps(entry, /*all=*/false); !st.ok()) return st;
  absl::StatusOr<std::string> gpu = GpuOf(stream);
  if (!gpu.ok()) return gpu.status();
  const bool other_gpu =
      entry.gpu_in.valid() && !absl::EqualsIgnoreCase(entry.gpu_in.device(), *gpu);
  const bool grow = (call.in_bytes > 0 && entry.gpu_in.size() < call.in_bytes) ||
                    (!call.in_place && entry.gpu_out.size() < call.out_bytes) || other_gpu;
  if (grow) {
    // Ops in flight still use the old buffers, and so do the copies of their
    // results queued after them on the stream of the last call.
    if (absl::Status st = ReapGpuOps(entry, /*all=*/true); !st.ok()) return st;
    if (entry.gpu_stream != nullptr) {
      if (absl::Status st = CudaStatus(
              cudaStreamSynchronize(static_cast<cudaStream_t>(entry.gpu_stream)),
              "waiting for the last call's copies before replacing the staging buffers");
          !st.ok()) {
        return st;
      }
    }
    if (other_gpu) {  // staging follows XLA's operands to their GPU
      for (Buffer* b : {&entry.gpu_in, &entry.gpu_out}) {
        if (b->valid()) call.client->Free(*b).IgnoreError();  // else freed at the session's end
        *b = Buffer();
      }
    }
  }
  // Whatever it queued (the operand's copy, before a refusal), the staging
  // buffers are in use until the stream is past it.
  absl::Status st = EnqueueStaged(stream, x, out, call, *gpu);
  absl::Status marked = MarkQueued(entry, stream);
  if (!marked.ok()) {
    // Without this call's event the last one's would say "unused" too
    // early: wait for the stream here instead (an error path).
    cudaStreamSynchronize(stream);
    entry.gpu_idle = nullptr;
  }
  return st.ok() ? marked : st;
}

// RunOnStream's work once the staging buffers are on XLA's GPU: grown as
// needed, the operand copied in, the op submitted in stream order, the
// result copied out, all queued on `stream`.
absl::Status EnqueueStaged(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer out,
                           Call& call, const std::string& gpu) {
  MeshEntry& entry = *call.entry;
  if (absl::Status st = GrowStaging(*call.client, entry.gpu_in, call.in_bytes, gpu); !st.ok()) {
    return st;
  }
  if (!call.in_place) {
    if (absl::Status st = GrowStaging(*call.client, entry.gpu_out, call.out_bytes, gpu);
        !st.ok()) {
      return st;
    }
  }
  if (call.in_bytes > 0) {
    if (absl::Status st = CudaStatus(cudaMemcpyAsync(entry.gpu_in.data(), x.untyped_data(),
                                                     call.in_bytes, cudaMemcpyDeviceToDevice,
                                                     stream),
                                     "copying the operand to the staging buffer");
        !st.ok()) {
      return st;
    }
  }
  call.args.x = Array{&entry.gpu_in, 0, call.in_dt, Dims(x.dimensions())};
  if (!call.in_place) call.args.out = Array{&entry.gpu_out, 0, call.out_dt, Dims(out.dimensions())};
  entry.gpu_stream = stream;
  OpFuture op = entry.mesh->submit(call.args, stream);  // this op only: Python's ops unordered
  if (op.Ready()) {
    // Refused at submission (nothing was enqueued on the stream).
    if (absl::Status st = op.Wait(); !st.ok()) return st;
  } else {
    entry.gpu_pending.push_back(std::move(op));
  }
  const Buffer& result = call.in_place ? entry.gpu_in : entry.gpu_out;
  if (call.out_bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(out.untyped_data(), result.data(), call.out_bytes,
                                    cudaMemcpyDeviceToDevice, stream),
                    "copying the result to XLA's output");
}

ffi::Error RunCollectiveCuda(cudaStream_t stream, ffi::AnyBuffer x,
                             ffi::Result<ffi::AnyBuffer> out, int64_t mesh_handle, int32_t kind,
                             std::string_view axes, int64_t a, int64_t b, bool tiled,
                             ffi::Span<const int64_t> perm) {
  absl::StatusOr<Call> prepared = Prepare(x, out->dimensions(), out->element_type(),
                                          out->size_bytes(), mesh_handle, kind, axes, a, b, tiled,
                                          perm);
  if (!prepared.ok()) return FromStatus(prepared.status());
  if (kind == kAxisIndexKind) {
    // From pageable memory: the copy has read the value when this returns.
    const int32_t index = prepared->axis_index;
    return FromStatus(CudaStatus(cudaMemcpyAsync(out->untyped_data(), &index, sizeof(index),
                                                 cudaMemcpyHostToDevice, stream),
                                 "writing axis_index"));
  }
  return FromStatus(RunOnStream(stream, x, *out, *prepared));
}
#endif  // COLLECTIVED_PYTHON_HAS_CUDA

}  // namespace

// What both handlers take after their context: the operand, the result,
// and the attributes jax.py's lowering gives.
template <typename Binding>
auto BindOp(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<int64_t>("mesh")
      .template Attr<int32_t>("kind")
      .template Attr<std::string_view>("axes")
      .template Attr<int64_t>("a")
      .template Attr<int64_t>("b")
      .template Attr<bool>("tiled")
      .template Attr<ffi::Span<const int64_t>>("perm");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivedCollective, RunCollective, BindOp(ffi::Ffi::Bind()));

void* JaxFfiHandler() { return reinterpret_cast<void*>(&CollectivedCollective); }

#ifdef COLLECTIVED_PYTHON_HAS_CUDA
// Not command-buffer compatible: every call submits an op to the daemon
// from the host, which a CUDA graph replay would not do.
XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivedCollectiveCuda, RunCollectiveCuda,
                              BindOp(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()));

void* JaxFfiCudaHandler() { return reinterpret_cast<void*>(&CollectivedCollectiveCuda); }
#else
void* JaxFfiCudaHandler() { return nullptr; }
#endif

}  // namespace collectived::python

#else  // !COLLECTIVED_HAVE_JAX_FFI

namespace collectived::python {
void* JaxFfiHandler() { return nullptr; }
void* JaxFfiCudaHandler() { return nullptr; }
void WatchInterrupts() {}
uint64_t InterruptsSeen() { return 0; }
}  // namespace collectived::python

#endif
