// The XLA FFI handler behind collectived.jax: one custom call target,
// "collectived_collective", runs any collective of a registered mesh on a
// CPU operand inside a jitted JAX function. XLA calls it on one of its
// threads, without the GIL: it only touches C++ objects.
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
#include <string>
#include <string_view>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "xla/ffi/api/ffi.h"

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

ffi::Error RunCollective(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out, int64_t mesh_handle,
                         int32_t kind, std::string_view axes, int64_t a, int64_t b, bool tiled,
                         ffi::Span<const int64_t> perm) {
  std::shared_ptr<MeshEntry> entry = FindMesh(mesh_handle);
  if (entry == nullptr) {
    return FromStatus(absl::FailedPreconditionError(absl::StrCat(
        "the collectived mesh this function was traced with (handle ", mesh_handle,
        ") has been left or garbage-collected")));
  }
  std::vector<std::string> names;
  if (!axes.empty()) names = absl::StrSplit(absl::string_view(axes.data(), axes.size()), ',');
  if (kind == kAxisIndexKind) {
    // jax.lax.axis_index, read at run time: the traced program stays the same
    // in every process (an index baked in as a constant would not).
    const int index = entry->mesh->axis_index(AxisNames(names));
    if (index < 0) {
      return FromStatus(absl::InvalidArgumentError(
          absl::StrCat("mesh '", entry->mesh->name(), "' has no axis '",
                       absl::string_view(axes.data(), axes.size()), "'")));
    }
    if (out->element_type() != ffi::DataType::S32 || out->element_count() != 1) {
      return FromStatus(absl::InvalidArgumentError("axis_index returns one int32"));
    }
    *static_cast<int32_t*>(out->untyped_data()) = index;
    return ffi::Error::Success();
  }
  std::shared_ptr<Client> client = entry->client.lock();
  if (client == nullptr) return FromStatus(absl::FailedPreconditionError("the client is closed"));
  const DType in_dt = DTypeOf(x.element_type());
  const DType out_dt = DTypeOf(out->element_type());
  if (in_dt == DType::kInvalid || out_dt == DType::kInvalid) {
    return FromStatus(absl::InvalidArgumentError("collectived does not support this dtype"));
  }
  if (perm.size() % 2 != 0) {
    return FromStatus(absl::InvalidArgumentError("perm must hold (source, dest) pairs"));
  }
  Collective args;
  args.kind = static_cast<CollectiveKind>(kind);
  // jax.py counts axes from the end (batch dimensions jax.vmap adds go in
  // front); made positive here, as the member-side path keys its plans on
  // them and other members (the SDK's) may count from the front.
  const int64_t in_rank = static_cast<int64_t>(x.dimensions().size());
  const int64_t out_rank = static_cast<int64_t>(out->dimensions().size());
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
  const size_t in_bytes = x.size_bytes();
  const size_t out_bytes = out->size_bytes();
  const bool in_place = args.kind != CollectiveKind::kAllGather &&
                        args.kind != CollectiveKind::kPsumScatter && in_dt == out_dt &&
                        in_bytes == out_bytes;

  absl::MutexLock lock(&entry->mu);
  if (absl::Status st = GrowStaging(*client, entry->in, in_bytes); !st.ok()) return FromStatus(st);
  if (!in_place) {
    if (absl::Status st = GrowStaging(*client, entry->out, out_bytes); !st.ok()) return FromStatus(st);
  }
  if (in_bytes > 0) std::memcpy(entry->in.data(), x.untyped_data(), in_bytes);
  auto dims = [](ffi::AnyBuffer::Dimensions d) { return std::vector<int64_t>(d.begin(), d.end()); };
  args.x = Array{&entry->in, 0, in_dt, dims(x.dimensions())};
  if (!in_place) args.out = Array{&entry->out, 0, out_dt, dims(out->dimensions())};
  if (absl::Status st = RunInterruptibly(*entry->mesh, args); !st.ok()) return FromStatus(st);
  const Buffer& result = in_place ? entry->in : entry->out;
  AdviseHugePages(out->untyped_data(), out_bytes);
  if (out_bytes > 0) std::memcpy(out->untyped_data(), result.data(), out_bytes);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivedCollective, RunCollective,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("mesh")
                                  .Attr<int32_t>("kind")
                                  .Attr<std::string_view>("axes")
                                  .Attr<int64_t>("a")
                                  .Attr<int64_t>("b")
                                  .Attr<bool>("tiled")
                                  .Attr<ffi::Span<const int64_t>>("perm"));

void* JaxFfiHandler() { return reinterpret_cast<void*>(&CollectivedCollective); }

}  // namespace collectived::python

#else  // !COLLECTIVED_HAVE_JAX_FFI

namespace collectived::python {
void* JaxFfiHandler() { return nullptr; }
void WatchInterrupts() {}
uint64_t InterruptsSeen() { return 0; }
}  // namespace collectived::python

#endif
