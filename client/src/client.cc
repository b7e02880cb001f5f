#include "collectived/client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sync.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "common/socket_path.h"
#include "common/status_util.h"
#include "common/unix_socket.h"

namespace collectived {

namespace {

constexpr char kSessionMetadataKey[] = "collectived-session";
// Added to every deadline the daemon enforces, so that the daemon's precise
// error arrives before the SDK's own fallback deadline.
constexpr absl::Duration kGrace = absl::Seconds(10);

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

v1::BufferRef ToRef(const Array& a) {
  v1::BufferRef ref;
  ref.set_buffer_id(a.buffer != nullptr ? a.buffer->id() : "");
  ref.set_offset(static_cast<int64_t>(a.offset));
  return ref;
}

}  // namespace

// Shared state of one op: written once by the stream reader, read by futures.
class OpState {
 public:
  explicit OpState(absl::Duration default_wait) : default_wait_(default_wait) {}
  void Complete(absl::Status status, int64_t sequence, std::vector<int64_t> out_shape,
                DType out_dtype) {
    MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
    sequence_ = sequence;
    out_shape_ = std::move(out_shape);
    out_dtype_ = out_dtype;
  }
  absl::Status Wait(std::optional<absl::Duration> timeout) {
    MutexLock lock(&mu_);
    absl::Duration t = timeout.value_or(default_wait_);
    if (!mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; }, t)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer from the daemon for this op within ", absl::FormatDuration(t)));
    }
    return status_;
  }
  bool Ready() {
    MutexLock lock(&mu_);
    return done_;
  }
  int64_t sequence() {
    MutexLock lock(&mu_);
    return sequence_;
  }
  std::vector<int64_t> out_shape() {
    MutexLock lock(&mu_);
    return out_shape_;
  }
  DType out_dtype() {
    MutexLock lock(&mu_);
    return out_dtype_;
  }

 private:
  const absl::Duration default_wait_;
  Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> out_shape_ ABSL_GUARDED_BY(mu_);
  DType out_dtype_ ABSL_GUARDED_BY(mu_) = DType::kInvalid;
};

absl::Status OpFuture::Wait(std::optional<absl::Duration> timeout) const {
  if (!state_) return absl::FailedPreconditionError("empty OpFuture");
  return state_->Wait(timeout);
}
bool OpFuture::Ready() const { return state_ && state_->Ready(); }
int64_t OpFuture::sequence() const { return state_ ? state_->sequence() : -1; }
std::vector<int64_t> OpFuture::out_shape() const {
  return state_ ? state_->out_shape() : std::vector<int64_t>{};
}
DType OpFuture::out_dtype() const { return state_ ? state_->out_dtype() : DType::kInvalid; }

// ---------------------------------------------------------------------------
// ClientImpl
// ---------------------------------------------------------------------------

class ClientImpl {
 public:
  explicit ClientImpl(ClientOptions options) : options_(std::move(options)) {}
  ~ClientImpl() { Close(); }

  absl::Status Connect() {
    options_.socket_path = ResolveSocketPath(options_.socket_path);
    channel_ = grpc::CreateChannel("unix:" + options_.socket_path,
                                   grpc::InsecureChannelCredentials());
    if (!channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + options_.connect_timeout))) {
      return absl::UnavailableError(absl::StrCat(
          "no collectived daemon answers on ", options_.socket_path, " within ",
          absl::FormatDuration(options_.connect_timeout),
          " (start one with `collectived --socket=", options_.socket_path, "`)"));
    }
    stub_ = v1::Collective::NewStub(channel_);
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::CreateSessionRequest req;
    req.set_client_name(options_.client_name);
    v1::CreateSessionResponse resp;
    if (auto st = FromGrpc(stub_->CreateSession(&ctx, req, &resp)); !st.ok()) return st;
    session_id_ = resp.session_id();

    auto side = ConnectSeqPacket(SideSocketPath(options_.socket_path));
    if (!side.ok()) return side.status();
    side_fd_ = *side;
    auto reply = SideRequest(absl::StrCat("ATTACH ", session_id_, " ", resp.attach_token()));
    if (!reply.ok()) return reply.status();
    if (reply->fd >= 0) close(reply->fd);
    return absl::OkStatus();
  }

  void Close() {
    if (closed_.exchange(true)) return;
    if (stub_ && !session_id_.empty()) {
      grpc::ClientContext ctx;
      SetDeadline(ctx, absl::Seconds(5));
      v1::CloseSessionRequest req;
      req.set_session_id(session_id_);
      v1::CloseSessionResponse resp;
      stub_->CloseSession(&ctx, req, &resp);  // best effort: the side socket closes anyway
    }
    {
      MutexLock lock(&stream_mu_);
      if (stream_) stream_ctx_->TryCancel();
    }
    if (reader_.joinable()) reader_.join();
    if (side_fd_ >= 0) close(side_fd_);
    side_fd_ = -1;
  }

  // One request/reply on the side socket. After a failed exchange the socket
  // is closed: a late reply must never be taken for the next request's.
  absl::StatusOr<Packet> SideRequest(const std::string& request) {
    MutexLock lock(&side_mu_);
    if (side_fd_ < 0) return absl::UnavailableError("the side socket to the daemon is closed");
    absl::Status sent = SendPacket(side_fd_, request);
    absl::StatusOr<Packet> reply =
        sent.ok() ? ReceivePacket(side_fd_, options_.rpc_timeout) : absl::StatusOr<Packet>(sent);
    if (!reply.ok()) {
      close(side_fd_);
      side_fd_ = -1;
      return reply.status();
    }
    if (reply->data.rfind("OK", 0) == 0) return reply;
    if (reply->fd >= 0) close(reply->fd);
    // "ERR <code> <message>"
    std::vector<std::string> parts = absl::StrSplit(reply->data, absl::MaxSplits(' ', 2));
    int code = 13;
    if (parts.size() == 3 && parts[0] == "ERR" && absl::SimpleAtoi(parts[1], &code)) {
      return absl::Status(static_cast<absl::StatusCode>(code), parts[2]);
    }
    return absl::InternalError(absl::StrCat("unexpected side-socket reply: ", reply->data));
  }

  absl::StatusOr<Buffer> Allocate(size_t bytes) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::AllocateBufferRequest req;
    req.set_session_id(session_id_);
    req.set_size_bytes(static_cast<int64_t>(bytes));
    v1::AllocateBufferResponse resp;
    if (auto st = FromGrpc(stub_->AllocateBuffer(&ctx, req, &resp)); !st.ok()) return st;
    const std::string& id = resp.buffer().buffer_id();
    auto mapped = MapBuffer(id, static_cast<size_t>(resp.buffer().size_bytes()));
    if (!mapped.ok()) {
      // Not usable here: release it in the daemon too (best effort).
      Buffer unmapped(id, nullptr, 0);
      Free(unmapped).IgnoreError();
      return mapped.status();
    }
    return Buffer(id, *mapped, static_cast<size_t>(resp.buffer().size_bytes()));
  }

  // Fetches buffer `id`'s descriptor on the side socket and maps it.
  absl::StatusOr<void*> MapBuffer(const std::string& id, size_t size) {
    auto reply = SideRequest(absl::StrCat("FD ", id));
    if (!reply.ok()) return reply.status();
    if (reply->fd < 0) return absl::InternalError("daemon sent no descriptor for the buffer");
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd, 0);
    int err = errno;
    close(reply->fd);
    if (data == MAP_FAILED) return ErrnoStatus(err, "mapping the shared buffer");
    return data;
  }

  absl::Status Free(Buffer& buffer) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::FreeBufferRequest req;
    req.set_session_id(session_id_);
    req.set_buffer_id(buffer.id());
    v1::FreeBufferResponse resp;
    absl::Status st = FromGrpc(stub_->FreeBuffer(&ctx, req, &resp));
    if (st.ok()) buffer.Reset();
    return st;
  }

  absl::StatusOr<std::unique_ptr<Mesh>> JoinMesh(const MeshOptions& options) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options.join_timeout + kGrace);
    v1::JoinMeshRequest req;
    req.set_session_id(session_id_);
    req.set_mesh_name(options.name);
    for (const auto& [name, size] : options.axes) {
      auto* a = req.add_axes();
      a->set_name(name);
      a->set_size(size);
    }
    for (int c : options.coordinate) req.add_coordinate(c);
    req.set_timeout_ms(absl::ToInt64Milliseconds(options.join_timeout));
    req.set_op_timeout_ms(absl::ToInt64Milliseconds(options.op_timeout));
    req.set_scope(options.scope);
    req.set_join_token(options.join_token);
    v1::JoinMeshResponse resp;
    if (auto st = FromGrpc(stub_->JoinMesh(&ctx, req, &resp)); !st.ok()) return st;
    std::unique_ptr<Mesh> mesh(new Mesh());
    mesh->client_ = this;
    mesh->id_ = resp.mesh().mesh_id();
    mesh->name_ = resp.mesh().name();
    mesh->generation_ = resp.mesh().generation();
    mesh->index_ = resp.self().index();
    mesh->members_ = 1;
    for (const auto& a : resp.mesh().axes()) {
      mesh->axes_.emplace_back(a.name(), a.size());
      mesh->members_ *= a.size();
    }
    mesh->coordinate_.assign(resp.self().coordinate().begin(), resp.self().coordinate().end());
    mesh->op_deadline_ = absl::Milliseconds(resp.mesh().op_timeout_ms()) + kGrace;
    return mesh;
  }

  absl::Status LeaveMesh(const std::string& mesh_id) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::LeaveMeshRequest req;
    req.set_session_id(session_id_);
    req.set_mesh_id(mesh_id);
    v1::LeaveMeshResponse resp;
    return FromGrpc(stub_->LeaveMesh(&ctx, req, &resp));
  }

  // Sends `op` on the Execute stream (opened on first use).
  OpFuture Submit(const v1::OpSpec& op, absl::Duration wait) {
    auto state = std::make_shared<OpState>(wait);
    // write_mu_ keeps writes in submission order; stream_mu_ is not held
    // while writing, so Close can always cancel a write that blocks.
    MutexLock write_lock(&write_mu_);
    v1::OpRequest req;
    {
      MutexLock lock(&stream_mu_);
      if (closed_.load()) {
        state->Complete(absl::FailedPreconditionError("client is closed"), -1, {}, DType::kInvalid);
        return OpFuture(state);
      }
      if (!stream_failure_.ok()) {
        state->Complete(stream_failure_, -1, {}, DType::kInvalid);
        return OpFuture(state);
      }
      if (!stream_) {
        stream_ctx_ = std::make_unique<grpc::ClientContext>();
        stream_ctx_->AddMetadata(kSessionMetadataKey, session_id_);
        stream_ = stub_->Execute(stream_ctx_.get());
        reader_ = std::thread([this] { ReadLoop(); });
      }
      const int64_t tag = next_tag_++;
      pending_[tag] = state;
      req.set_tag(tag);
    }
    *req.mutable_op() = op;
    if (!stream_->Write(req)) {
      {
        MutexLock lock(&stream_mu_);
        pending_.erase(req.tag());
      }
      state->Complete(absl::UnavailableError("connection to the daemon lost while submitting"),
                      -1, {}, DType::kInvalid);
    }
    return OpFuture(state);
  }

  const std::string& session_id() const { return session_id_; }
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  void ReadLoop() {
    v1::OpResult result;
    while (stream_->Read(&result)) {
      std::shared_ptr<OpState> state;
      {
        MutexLock lock(&stream_mu_);
        auto it = pending_.find(result.tag());
        if (it == pending_.end()) continue;
        state = std::move(it->second);
        pending_.erase(it);
      }
      state->Complete(absl::Status(static_cast<absl::StatusCode>(result.code()), result.message()),
                      result.sequence(),
                      std::vector<int64_t>(result.out_shape().begin(), result.out_shape().end()),
                      static_cast<DType>(result.out_dtype()));
    }
    grpc::Status st = stream_->Finish();
    absl::Status failure = closed_.load()
        ? absl::CancelledError("client closed")
        : absl::UnavailableError(absl::StrCat("connection to the daemon lost: ",
                                              st.ok() ? "stream ended" : st.error_message()));
    std::map<int64_t, std::shared_ptr<OpState>> orphans;
    {
      MutexLock lock(&stream_mu_);
      stream_failure_ = failure;
      orphans.swap(pending_);
    }
    for (auto& [tag, state] : orphans) state->Complete(failure, -1, {}, DType::kInvalid);
  }

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Collective::Stub> stub_;
  std::string session_id_;
  std::atomic<bool> closed_{false};

  Mutex side_mu_;
  int side_fd_ = -1;

  Mutex write_mu_;  // serializes stream writes (taken before stream_mu_)
  Mutex stream_mu_;
  std::unique_ptr<grpc::ClientContext> stream_ctx_ ABSL_GUARDED_BY(stream_mu_);
  std::unique_ptr<grpc::ClientReaderWriter<v1::OpRequest, v1::OpResult>> stream_;
  std::thread reader_;
  int64_t next_tag_ ABSL_GUARDED_BY(stream_mu_) = 1;
  std::map<int64_t, std::shared_ptr<OpState>> pending_ ABSL_GUARDED_BY(stream_mu_);
  absl::Status stream_failure_ ABSL_GUARDED_BY(stream_mu_);
};

// ---------------------------------------------------------------------------
// Buffer, Array
// ---------------------------------------------------------------------------

Buffer::~Buffer() { Reset(); }

Buffer::Buffer(Buffer&& other) noexcept
    : id_(std::move(other.id_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    id_ = std::move(other.id_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void Buffer::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

int64_t Array::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// Mesh
// ---------------------------------------------------------------------------

struct Mesh::OpRequest {
  v1::OpSpec spec;
};

Mesh::~Mesh() { Leave().IgnoreError(); }

absl::Status Mesh::Leave() {
  if (left_.exchange(true)) return absl::OkStatus();
  return client_->LeaveMesh(id_);
}

int Mesh::axis_index(const AxisNames& axes) const {
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
  int size = 1;
  for (const std::string& name : axes.names()) {
    size_t i = 0;
    while (i < axes_.size() && axes_[i].first != name) ++i;
    if (i == axes_.size()) return -1;
    size *= axes_[i].second;
  }
  return size;
}

OpFuture Mesh::Submit(const OpRequest& request) {
  return client_->Submit(request.spec, op_deadline_);
}

namespace {

v1::OpSpec MakeSpec(const std::string& mesh_id, v1::OpKind kind, const Array* x,
                    const AxisNames& axes, const std::optional<Array>& out) {
  v1::OpSpec spec;
  spec.set_mesh_id(mesh_id);
  spec.set_kind(kind);
  for (const std::string& a : axes.names()) spec.add_axes(a);
  if (x != nullptr) {
    spec.set_dtype(static_cast<v1::DType>(x->dtype));
    for (int64_t d : x->shape) spec.add_shape(d);
    *spec.mutable_input() = ToRef(*x);
  }
  if (out) *spec.mutable_output() = ToRef(*out);
  return spec;
}

}  // namespace

#define COLLECTIVED_REDUCTION(name, KIND)                                                  \
  OpFuture Mesh::name##_async(const Array& x, const AxisNames& axes,                       \
                              std::optional<Array> out) {                                  \
    return Submit(OpRequest{MakeSpec(id_, v1::KIND, &x, axes, out)});                       \
  }                                                                                        \
  absl::Status Mesh::name(const Array& x, const AxisNames& axes, std::optional<Array> out) { \
    return name##_async(x, axes, std::move(out)).Wait();                                   \
  }
COLLECTIVED_REDUCTION(psum, PSUM)
COLLECTIVED_REDUCTION(pmean, PMEAN)
COLLECTIVED_REDUCTION(pmax, PMAX)
COLLECTIVED_REDUCTION(pmin, PMIN)
#undef COLLECTIVED_REDUCTION

OpFuture Mesh::all_gather_async(const Array& x, const AxisNames& axes, const Array& out,
                                AllGatherOptions options) {
  OpRequest r{MakeSpec(id_, v1::ALL_GATHER, &x, axes, out)};
  r.spec.mutable_all_gather()->set_axis(options.axis);
  r.spec.mutable_all_gather()->set_tiled(options.tiled);
  return Submit(r);
}
absl::Status Mesh::all_gather(const Array& x, const AxisNames& axes, const Array& out,
                              AllGatherOptions options) {
  return all_gather_async(x, axes, out, options).Wait();
}

OpFuture Mesh::ppermute_async(const Array& x, const AxisNames& axes,
                              const std::vector<std::pair<int, int>>& perm,
                              std::optional<Array> out) {
  OpRequest r{MakeSpec(id_, v1::PPERMUTE, &x, axes, out)};
  for (const auto& [s, d] : perm) {
    auto* p = r.spec.mutable_ppermute()->add_perm();
    p->set_source(s);
    p->set_dest(d);
  }
  if (perm.empty()) r.spec.mutable_ppermute();
  return Submit(r);
}
absl::Status Mesh::ppermute(const Array& x, const AxisNames& axes,
                            const std::vector<std::pair<int, int>>& perm,
                            std::optional<Array> out) {
  return ppermute_async(x, axes, perm, std::move(out)).Wait();
}

OpFuture Mesh::psum_scatter_async(const Array& x, const AxisNames& axes, const Array& out,
                                  PsumScatterOptions options) {
  OpRequest r{MakeSpec(id_, v1::PSUM_SCATTER, &x, axes, out)};
  r.spec.mutable_psum_scatter()->set_scatter_dimension(options.scatter_dimension);
  r.spec.mutable_psum_scatter()->set_tiled(options.tiled);
  return Submit(r);
}
absl::Status Mesh::psum_scatter(const Array& x, const AxisNames& axes, const Array& out,
                                PsumScatterOptions options) {
  return psum_scatter_async(x, axes, out, options).Wait();
}

OpFuture Mesh::all_to_all_async(const Array& x, const AxisNames& axes, AllToAllOptions options,
                                std::optional<Array> out) {
  OpRequest r{MakeSpec(id_, v1::ALL_TO_ALL, &x, axes, out)};
  r.spec.mutable_all_to_all()->set_split_axis(options.split_axis);
  r.spec.mutable_all_to_all()->set_concat_axis(options.concat_axis);
  r.spec.mutable_all_to_all()->set_tiled(options.tiled);
  return Submit(r);
}
absl::Status Mesh::all_to_all(const Array& x, const AxisNames& axes, AllToAllOptions options,
                              std::optional<Array> out) {
  return all_to_all_async(x, axes, options, std::move(out)).Wait();
}

OpFuture Mesh::broadcast_async(const Array& x, const AxisNames& axes, int root,
                               std::optional<Array> out) {
  OpRequest r{MakeSpec(id_, v1::BROADCAST, &x, axes, out)};
  r.spec.mutable_broadcast()->set_root(root);
  return Submit(r);
}
absl::Status Mesh::broadcast(const Array& x, const AxisNames& axes, int root,
                             std::optional<Array> out) {
  return broadcast_async(x, axes, root, std::move(out)).Wait();
}

OpFuture Mesh::barrier_async(const AxisNames& axes) {
  return Submit(OpRequest{MakeSpec(id_, v1::BARRIER, nullptr, axes, std::nullopt)});
}
absl::Status Mesh::barrier(const AxisNames& axes) { return barrier_async(axes).Wait(); }

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

Client::Client(std::unique_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  auto impl = std::make_unique<ClientImpl>(std::move(options));
  if (absl::Status st = impl->Connect(); !st.ok()) return st;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Mesh>> Client::JoinMesh(const MeshOptions& options) {
  return impl_->JoinMesh(options);
}
absl::StatusOr<Buffer> Client::Allocate(size_t bytes) { return impl_->Allocate(bytes); }
absl::Status Client::Free(Buffer& buffer) { return impl_->Free(buffer); }
const std::string& Client::session_id() const { return impl_->session_id(); }
const std::string& Client::socket_path() const { return impl_->socket_path(); }

}  // namespace collectived
