// Mesh: the collectives of one mesh, member-side when they can be, else
// through the session.
#include "collectived/client.h"

#include <poll.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <deque>
#include <cstdlib>
#include <limits>
#include <map>
#include <thread>

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fast_queue.h"
#include "common/sync.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "common/raise_word.h"
#include "common/side_protocol.h"
#include "common/socket_path.h"
#include "common/status_util.h"
#include "common/unix_socket.h"
#include "client/src/member_ops.h"
#ifdef COLLECTIVED_HAVE_CUDA
#include <cuda.h>

#include "client/src/cuda_import.h"
#include "client/src/cuda_stream_sync.h"
#include "common/cuda/driver.h"
#endif
#include "client/src/member_side.h"
#include "client/src/op_spec.h"
#include "client/src/session.h"

namespace collectived {

struct Mesh::OpRequest {
  v1::OpSpec spec;
  // Not OK: the SDK refuses the op without sending it.
  absl::Status error;
};


OpFuture Mesh::submit(const Collective& op) { return Submit(internal::ArgsOf(op)); }

absl::StatusOr<Buffer> Mesh::AllocateShared(size_t bytes) {
  if (left_.load()) return absl::FailedPreconditionError("left the mesh");
  absl::StatusOr<Buffer> b = client_->Allocate(bytes, "", id_);
  if (b.ok()) b->shared_mesh_ = id_;
  return b;
}

absl::Status Mesh::Leave() {
  if (left_.exchange(true)) return absl::OkStatus();
  return client_->LeaveMesh(id_);
}

int Mesh::axis_index(const AxisNames& axes) const {
  if (axes.unset()) return -1;
  if (axes.all()) return index_;  // row-major over every axis in mesh order
  int index = 0;
  for (const std::string& name : axes.names()) {
    size_t i = 0;
    while (i < axes_.size() && axes_[i].first != name) ++i;
    if (i == axes_.size()) return -1;
    index = index * axes_[i].second + coordinate_[i];
  }
  return index;
}

int Mesh::axis_size(const AxisNames& axes) const {
  if (axes.unset()) return -1;
  if (axes.all()) return size();
  int size = 1;
  for (const std::string& name : axes.names()) {
    size_t i = 0;
    while (i < axes_.size() && axes_[i].first != name) ++i;
    if (i == axes_.size()) return -1;
    size *= axes_[i].second;
  }
  return size;
}

// The words of stream-ordered submission: a host buffer of kSlots ready
// words then kSlots done words; op v (1, 2, ...) uses slot v % kSlots. Kept
// (mapped and registered) while the Mesh or a failure hook of one of its ops
// holds it; the daemon frees the buffer itself when the session ends.
struct Mesh::StreamOrder {
  static constexpr uint64_t kSlots = 256;
  static constexpr size_t kBytes = 2 * kSlots * sizeof(uint64_t);  // 4 KiB
  Buffer words;
#ifdef COLLECTIVED_HAVE_CUDA
  std::unique_ptr<RegisteredHostWords> registered;  // destroyed before `words`
#endif
  // Serializes stream-ordered submissions (values must reach the daemon in
  // the order they are written on the streams).
  Mutex mu;
  void* stream ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t next ABSL_GUARDED_BY(mu) = 0;  // the last value used
  // Every stream that may wait on the words (~Mesh synchronizes them).
  std::vector<void*> used_streams ABSL_GUARDED_BY(mu);

  uint64_t* DoneWord(uint64_t slot) const {
    return &static_cast<uint64_t*>(words.data())[kSlots + slot];
  }
  // Raises the done word of op `value` (what the daemon does; the SDK does it
  // when the daemon cannot).
  void Release(uint64_t value) const {
    RaiseWord(DoneWord(value % kSlots), value);
  }
  // Waits until the streams have passed their waits on the words.
  void SyncStreams() {
#ifdef COLLECTIVED_HAVE_CUDA
    std::vector<void*> streams;
    {
      MutexLock lock(&mu);
      streams = used_streams;
    }
    if (auto api = cuda::Driver(); api.ok()) {
      for (void* st : streams) (*api)->cuStreamSynchronize(static_cast<CUstream>(st));
    }
#endif
  }
};

Mesh::~Mesh() {
  Leave().IgnoreError();  // fails this member's pending ops: their done words rise
  if (stream_order_ != nullptr) stream_order_->SyncStreams();
}

std::string Mesh::member_reads() const {
  if (member_side_ == nullptr) return absl::StrCat("no: ", member_side_status_.ToString());
  return member_side_->ops->reads();
}

Mesh::MemberSidePaths Mesh::member_side_paths() const {
  if (member_side_ == nullptr) return {};
  using Path = internal::MemberOps::Path;
  const internal::MemberOps& ops = *member_side_->ops;
  return {ops.completed(Path::kSegment), ops.completed(Path::kReads), ops.completed(Path::kSplit),
          ops.completed(Path::kShared)};
}

absl::Status Mesh::EnsureStreamOrder() {
#ifdef COLLECTIVED_HAVE_CUDA
  if (stream_order_ready_.load(std::memory_order_acquire)) return absl::OkStatus();
  // Once per mesh at most: one lock for every mesh of the process.
  static Mutex* init_mu = new Mutex();  // never destroyed
  MutexLock init(init_mu);
  if (stream_order_ != nullptr) return absl::OkStatus();
  auto words = client_->Allocate(StreamOrder::kBytes, "");
  if (!words.ok()) return words.status();
  auto order = std::make_shared<StreamOrder>();
  order->words = *std::move(words);
  auto registered = RegisteredHostWords::Register(order->words.data(), StreamOrder::kBytes);
  if (!registered.ok()) {
    client_->Free(order->words).IgnoreError();  // best effort; the session end frees it too
    return registered.status();
  }
  order->registered = *std::move(registered);
  stream_order_ = std::move(order);
  stream_order_ready_.store(true, std::memory_order_release);
  return absl::OkStatus();
#else
  return absl::UnimplementedError("stream-ordered submission needs the SDK built with CUDA");
#endif
}

absl::Status Mesh::set_stream(void* stream) {
  if (stream == nullptr) {
    if (stream_order_ready_.load(std::memory_order_acquire)) {
      MutexLock lock(&stream_order_->mu);
      stream_order_->stream = nullptr;
    }
    return absl::OkStatus();
  }
  if (absl::Status st = EnsureStreamOrder(); !st.ok()) return st;
  MutexLock lock(&stream_order_->mu);
  stream_order_->stream = stream;
  return absl::OkStatus();
}

void* Mesh::stream() const {
  if (!stream_order_ready_.load(std::memory_order_acquire)) return nullptr;
  MutexLock lock(&stream_order_->mu);
  return stream_order_->stream;
}

OpFuture Mesh::submit(const Collective& op, void* stream) {
  if (stream == nullptr) return submit(op);
  const internal::OpArgs args = internal::ArgsOf(op);
  if (absl::Status st = internal::CheckArgs(args); !st.ok()) return FailedOp(std::move(st));
  if (absl::Status st = EnsureStreamOrder(); !st.ok()) return FailedOp(std::move(st));
  return Submit(OpRequest{internal::SpecOf(id_, args)}, stream);
}

OpFuture Mesh::FailedOp(absl::Status status) const {
  auto state = std::make_shared<OpState>(op_deadline_);
  state->Complete(std::move(status), -1, {}, DType::kInvalid);
  return OpFuture(state);
}

namespace {

// The member-side state whose op this thread waits in while the op's
// interrupted() check runs (Mesh::start): code that check runs (a signal
// handler) must not start an op of that mesh, which would wait for the lock
// this thread holds.
thread_local const void* t_waiting_in = nullptr;

absl::Status ReenteredFromInterruptCheck() {
  return absl::FailedPreconditionError(
      "an op of this mesh was started from its own interrupted() check (a signal handler?) "
      "while this thread waits in a member-side op of the mesh; it would wait for itself");
}

}  // namespace

OpFuture Mesh::Submit(const OpRequest& request, void* stream) {
  if (!request.error.ok()) return FailedOp(request.error);
  if (member_side_ == nullptr) return Dispatch(request, stream);
  if (t_waiting_in == member_side_.get()) return FailedOp(ReenteredFromInterruptCheck());
  MutexLock lock(&member_side_->mu);
  OpFuture f = Dispatch(request, stream);
  member_side_->Track(f);
  return f;
}

OpFuture Mesh::Dispatch(const OpRequest& request, void* stream) {
  if (stream == nullptr) stream = this->stream();
  if (stream != nullptr) return SubmitOnStream(request, stream);
  return client_->Submit(request.spec, op_deadline_);
}

OpFuture Mesh::SubmitOnStream(const OpRequest& request, void* stream) {
#ifdef COLLECTIVED_HAVE_CUDA
  StreamOrder& so = *stream_order_;  // EnsureStreamOrder made it (stream is not null)
  MutexLock lock(&so.mu);
  if (std::find(so.used_streams.begin(), so.used_streams.end(), stream) == so.used_streams.end()) {
    so.used_streams.push_back(stream);
  }
  const uint64_t v = ++so.next;
  const uint64_t slot = v % StreamOrder::kSlots;
  // The slot's previous op must be over (its done word raised) before the
  // slot is reused.
  if (v > StreamOrder::kSlots) {
    const uint64_t previous = v - StreamOrder::kSlots;
    const absl::Time deadline = absl::Now() + op_deadline_ + absl::Seconds(5);
    while (std::atomic_ref<uint64_t>(*so.DoneWord(slot)).load(std::memory_order_acquire) <
           previous) {
      if (absl::Now() > deadline) {
        return FailedOp(absl::DeadlineExceededError(absl::StrCat(
            "stream-ordered op ", previous, " of this mesh is still outstanding; at most ",
            StreamOrder::kSlots, " may be")));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  const size_t ready_offset = slot * sizeof(uint64_t);
  const size_t done_offset = (StreamOrder::kSlots + slot) * sizeof(uint64_t);
  if (absl::Status st = so.registered->WriteOnStream(stream, ready_offset, v); !st.ok()) {
    so.Release(v);  // nothing waits on it, but keep the slot's words in step
    return FailedOp(st);
  }
  v1::OpSpec spec = request.spec;
  v1::StreamSync* sync = spec.mutable_stream_sync();
  sync->mutable_ready()->set_buffer_id(so.words.id());
  sync->mutable_ready()->set_offset(static_cast<int64_t>(ready_offset));
  sync->mutable_ready()->set_size_bytes(8);
  sync->mutable_done()->set_buffer_id(so.words.id());
  sync->mutable_done()->set_offset(static_cast<int64_t>(done_offset));
  sync->mutable_done()->set_size_bytes(8);
  sync->set_value(v);
  OpFuture f = client_->Submit(spec, op_deadline_);
  // The daemon raises the done word whatever the outcome; when it cannot (it
  // is gone, or the SDK failed the op before the daemon saw it), this does.
  f.state_->OnFailure([order = stream_order_, v] { order->Release(v); });
  if (absl::Status st = so.registered->WaitOnStream(stream, done_offset, v); !st.ok()) {
    // The stream cannot wait: wait here, so work enqueued after the call
    // still runs after the op.
    f.Wait().IgnoreError();
  }
  return f;
#else
  (void)request;
  (void)stream;
  return FailedOp(absl::UnimplementedError("stream-ordered submission needs the SDK built with CUDA"));
#endif
}

OpFuture Mesh::Submit(const internal::OpArgs& args) {
  if (absl::Status st = internal::CheckArgs(args); !st.ok()) return FailedOp(std::move(st));
  return Submit(OpRequest{internal::SpecOf(id_, args)});
}

absl::Status Mesh::Run(const internal::OpArgs& args) {
  if (!internal::MayRunMemberSide(args)) return Submit(args).Wait();
  absl::Status status;
  OpFuture future;
  if (RunOrDispatch(args, nullptr, &status, &future)) return status;
  return future.Wait();
}

bool Mesh::RunOrDispatch(const internal::OpArgs& args, const std::function<bool()>* interrupted,
                         absl::Status* status, OpFuture* future) {
  const Array* x = args.x;
  const Array* out = args.out;
  if (absl::Status st = internal::CheckArgs(args); !st.ok()) {
    *status = std::move(st);
    return true;
  }
  if (member_side_ == nullptr) {
    *future = Dispatch(OpRequest{internal::SpecOf(id_, args)});
    return false;
  }
  if (t_waiting_in == member_side_.get()) {
    *status = ReenteredFromInterruptCheck();
    return true;
  }
  internal::MemberIoRegion io;
  // Host memory of this client's session mapped in this process.
  auto MappedHost = [this](const Buffer* b) {
    return b != nullptr && b->valid() && b->owner_ == client_.get() && b->device_ordinal() < 0;
  };
  // The input: only this member's own buffer.
  if (x != nullptr && MappedHost(x->buffer) && !x->buffer->mesh_shared() &&
      x->offset <= x->buffer->size()) {
    io.in = static_cast<const uint8_t*>(x->buffer->data()) + x->offset;
    io.in_offset = x->offset;
    io.in_id = &x->buffer->id();
    io.in_avail = x->buffer->size() - x->offset;
    io.in_place = out == nullptr;
    // The output: this member's own, or a buffer this mesh shares, which
    // the op writes once (MemberOps::RunIntoShared).
    const bool shared_out = out && MappedHost(out->buffer) && out->buffer->shared_mesh_ == id_;
    const bool own_out = out && MappedHost(out->buffer) && !out->buffer->mesh_shared();
    if ((own_out || shared_out) && out->offset <= out->buffer->size()) {
      io.out = static_cast<uint8_t*>(out->buffer->data()) + out->offset;
      io.out_offset = out->offset;
      io.out_avail = std::min(out->buffer->size() - out->offset, out->num_bytes());
      io.same_buffer = out->buffer == x->buffer;
      if (shared_out) io.shared_out = &out->buffer->id();
      if (own_out) io.out_id = &out->buffer->id();
    }
  }
  // Held until the op is member-side or submitted to the daemon: another
  // thread's op must not take this place in between.
  MemberSide& side = *member_side_;
  MutexLock lock(&side.mu);
  if (stream() == nullptr && side.Idle()) {
    const void* const outer = t_waiting_in;
    if (interrupted != nullptr) t_waiting_in = &side;
    absl::Cleanup restore = [outer] { t_waiting_in = outer; };
    std::optional<absl::Status> st =
        side.ops->TryRun(internal::KeyOf(args), [&] { return internal::SpecOf(id_, args); }, io,
                            interrupted);
    if (st) {
      *status = *std::move(st);
      return true;
    }
  }
  *future = Dispatch(OpRequest{internal::SpecOf(id_, args)});
  side.Track(*future);
  return false;
}

absl::Status Mesh::run(const Collective& op) { return Run(internal::ArgsOf(op)); }

OpFuture Mesh::start(const Collective& op, const std::function<bool()>& interrupted) {
  const internal::OpArgs args = internal::ArgsOf(op);
  if (!internal::MayRunMemberSide(args)) return Submit(args);
  absl::Status status;
  OpFuture future;
  return RunOrDispatch(args, &interrupted, &status, &future) ? FailedOp(std::move(status))
                                                             : future;
}

bool Mesh::give_up(const OpFuture& op, absl::string_view why) {
  if (op.state_ == nullptr || op.Ready()) return false;
  const std::string reason = absl::StrCat("member ", index_, " gave up an op in flight: ", why);
  if (member_side_ != nullptr) {
    member_side_->ops->MarkBroken(reason);  // atomic in the segment: no lock
    return true;
  }
  // No segment to mark: leaving breaks the mesh for the others.
  Leave().IgnoreError();
  return true;
}

// The typed methods: each describes its op (OpArgs) and submits or runs it.
#define COLLECTIVED_REDUCTION(name, KIND)                                                    \
  OpFuture Mesh::name##_async(const Array& x, const AxisNames& axes,                         \
                              std::optional<Array> out) {                                    \
    return Submit({.kind = CollectiveKind::KIND, .x = &x, .axes = axes,                      \
                   .out = out ? &*out : nullptr});                                           \
  }                                                                                          \
  absl::Status Mesh::name(const Array& x, const AxisNames& axes, std::optional<Array> out) { \
    return Run({.kind = CollectiveKind::KIND, .x = &x, .axes = axes,                         \
                .out = out ? &*out : nullptr});                                              \
  }
COLLECTIVED_REDUCTION(psum, kPsum)
COLLECTIVED_REDUCTION(pmean, kPmean)
COLLECTIVED_REDUCTION(pmax, kPmax)
COLLECTIVED_REDUCTION(pmin, kPmin)
#undef COLLECTIVED_REDUCTION

OpFuture Mesh::all_gather_async(const Array& x, const AxisNames& axes, const Array& out,
                                AllGatherOptions options) {
  return Submit({.kind = CollectiveKind::kAllGather, .x = &x, .axes = axes, .out = &out,
                 .axis = options.axis, .tiled = options.tiled});
}
absl::Status Mesh::all_gather(const Array& x, const AxisNames& axes, const Array& out,
                              AllGatherOptions options) {
  return Run({.kind = CollectiveKind::kAllGather, .x = &x, .axes = axes, .out = &out,
              .axis = options.axis, .tiled = options.tiled});
}

OpFuture Mesh::ppermute_async(const Array& x, const AxisNames& axes,
                              const std::vector<std::pair<int, int>>& perm,
                              std::optional<Array> out) {
  return Submit({.kind = CollectiveKind::kPpermute, .x = &x, .axes = axes,
                 .out = out ? &*out : nullptr, .perm = &perm});
}
absl::Status Mesh::ppermute(const Array& x, const AxisNames& axes,
                            const std::vector<std::pair<int, int>>& perm,
                            std::optional<Array> out) {
  return ppermute_async(x, axes, perm, std::move(out)).Wait();
}

OpFuture Mesh::psum_scatter_async(const Array& x, const AxisNames& axes, const Array& out,
                                  PsumScatterOptions options) {
  return Submit({.kind = CollectiveKind::kPsumScatter, .x = &x, .axes = axes, .out = &out,
                 .axis = options.scatter_dimension, .tiled = options.tiled});
}
absl::Status Mesh::psum_scatter(const Array& x, const AxisNames& axes, const Array& out,
                                PsumScatterOptions options) {
  return psum_scatter_async(x, axes, out, options).Wait();
}

OpFuture Mesh::all_to_all_async(const Array& x, const AxisNames& axes, AllToAllOptions options,
                                std::optional<Array> out) {
  return Submit({.kind = CollectiveKind::kAllToAll, .x = &x, .axes = axes,
                 .out = out ? &*out : nullptr, .axis = options.split_axis,
                 .concat_axis = options.concat_axis, .tiled = options.tiled});
}
absl::Status Mesh::all_to_all(const Array& x, const AxisNames& axes, AllToAllOptions options,
                              std::optional<Array> out) {
  return all_to_all_async(x, axes, options, std::move(out)).Wait();
}

OpFuture Mesh::broadcast_async(const Array& x, const AxisNames& axes, int root,
                               std::optional<Array> out) {
  return Submit({.kind = CollectiveKind::kBroadcast, .x = &x, .axes = axes,
                 .out = out ? &*out : nullptr, .axis = root});
}
absl::Status Mesh::broadcast(const Array& x, const AxisNames& axes, int root,
                             std::optional<Array> out) {
  return broadcast_async(x, axes, root, std::move(out)).Wait();
}

OpFuture Mesh::barrier_async(const AxisNames& axes) {
  return Submit({.kind = CollectiveKind::kBarrier, .axes = axes});
}
absl::Status Mesh::barrier(const AxisNames& axes) {
  return Run({.kind = CollectiveKind::kBarrier, .axes = axes});
}

}  // namespace collectived
