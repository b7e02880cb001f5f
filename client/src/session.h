// ClientImpl: the session with the daemon (connect, attach, buffers,
// meshes, submission over the fast path or the gRPC stream, close).
#ifndef COLLECTIVED_CLIENT_SRC_SESSION_H_
#define COLLECTIVED_CLIENT_SRC_SESSION_H_

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
#include "client/src/fast_queue.h"
#include "client/src/grpc_stream.h"
#include "client/src/member_side.h"
#include "client/src/op_state.h"
#include "client/src/rpc_util.h"

namespace collectived {

class ClientImpl : public std::enable_shared_from_this<ClientImpl> {
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

    if (absl::Status st = Attach(resp.attach_token()); !st.ok()) return st;
    // Refused at once rather than read as the default at the first op.
    if (auto reads = internal::member_reads::AllowedByEnvironment(); !reads.ok()) {
      return reads.status();
    }
    const char* env = getenv("COLLECTIVED_FAST_PATH");
    if (env != nullptr && std::string(env) == "0") options_.fast_path = false;
    if (options_.fast_path) return OpenQueue();
    return absl::OkStatus();
  }

  // Opens the side socket and attaches the session. The daemon refuses
  // connections past its per-uid cap of connections waiting to attach
  // (RESOURCE_EXHAUSTED, or a reset when it closes before reading): a burst
  // of clients starting at once retries until rpc_timeout.
  absl::Status Attach(const std::string& token) {
    const absl::Time deadline = absl::Now() + options_.rpc_timeout;
    absl::Duration backoff = absl::Milliseconds(1);
    for (;;) {
      auto side = ConnectSeqPacket(SideSocketPath(options_.socket_path));
      if (!side.ok()) return side.status();
      {
        MutexLock lock(&side_mu_);
        side_fd_ = *side;
      }
      auto reply = SideRequest(absl::StrCat(side::kAttach, " ", session_id_, " ", token));
      if (reply.ok()) return absl::OkStatus();
      const bool refused =
          absl::IsResourceExhausted(reply.status()) || absl::IsUnavailable(reply.status());
      {
        MutexLock lock(&side_mu_);
        if (side_fd_ >= 0) {
      // shutdown: the daemon sees the hang-up although duplicates of the
      // socket (the fast path's and member-side ops' watchers) stay open.
      shutdown(side_fd_, SHUT_RDWR);
      close(side_fd_);
    }
        side_fd_ = -1;
      }
      if (!refused || absl::Now() + backoff > deadline) return reply.status();
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(50));
    }
  }

  // Maps the session's fast-path queue. A daemon without one (or with
  // another queue version) leaves the client on the gRPC path.
  absl::Status OpenQueue() {
    auto reply = SideRequest(std::string(side::kQueue));
    if (!reply.ok()) return absl::IsUnimplemented(reply.status()) ? absl::OkStatus() : reply.status();
    if (!reply->fd.valid()) return absl::InternalError("daemon sent no descriptor for the queue");
    std::vector<std::string> words = absl::StrSplit(reply->data, ' ');
    if (words.size() != 3 || words[1] != absl::StrCat(fastq::kQueueBytes) ||
        words[2] != absl::StrCat(fastq::kVersion)) {
      return absl::OkStatus();
    }
    void* base = mmap(nullptr, fastq::kQueueBytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
    const int err = errno;
    if (base == MAP_FAILED) return ErrnoStatus(err, "mapping the fast-path queue");
    if (!fastq::HeaderValid(static_cast<fastq::Header*>(base))) {
      munmap(base, fastq::kQueueBytes);
      return absl::OkStatus();
    }
    int live_fd;
    {
      MutexLock lock(&side_mu_);
      live_fd = side_fd_ >= 0 ? fcntl(side_fd_, F_DUPFD_CLOEXEC, 0) : -1;
    }
    if (live_fd < 0) {
      munmap(base, fastq::kQueueBytes);
      return ErrnoStatus(errno, "duplicating the side socket");
    }
    auto fast = FastQueue::Create(base, live_fd, options_.fast_path_spin);
    if (!fast.ok()) return fast.status();
    fast_ = *std::move(fast);
    return absl::OkStatus();
  }

  bool fast_path() const { return fast_ != nullptr; }

  // Ends the session. Waits for the daemon at most options_.close_timeout,
  // and not at all after a teardown call went unanswered (TeardownContext).
  // Giving up is safe: the daemon closes the session, breaking its meshes
  // and freeing its buffers, when the side socket closes below. Everything
  // else returns promptly: the Execute stream is cancelled locally (its
  // operations come back whatever the daemon does; GrpcStream::Close waits
  // for them at most kCloseDrain), the fast-path monitor stops when told;
  // no lock taken here is held across a wait for the daemon. Callers must
  // not use the client concurrently (see ~Client).
  void Close() {
    if (closed_.exchange(true)) return;
    if (stub_ && !session_id_.empty()) {
      v1::CloseSessionRequest req;
      req.set_session_id(session_id_);
      v1::CloseSessionResponse resp;
      if (auto ctx = TeardownContext()) {
        // Best effort: the side socket closes below anyway.
        NoteTeardownAnswer(stub_->CloseSession(ctx.get(), req, &resp)).IgnoreError();
      }
    }
    if (std::shared_ptr<GrpcStream> stream = Stream(/*open=*/false)) stream->Close();
    if (fast_) fast_->Shutdown(absl::CancelledError("client closed"));
    MutexLock lock(&side_mu_);
    if (side_fd_ >= 0) {
      // shutdown: the daemon sees the hang-up although duplicates of the
      // socket (the fast path's and member-side ops' watchers) stay open.
      shutdown(side_fd_, SHUT_RDWR);
      close(side_fd_);
    }
    side_fd_ = -1;
  }

  // The context of a teardown RPC (LeaveMesh, CloseSession): its deadline is
  // options_.close_timeout. Null when an earlier teardown RPC went
  // unanswered and the daemon has answered nothing since: then the RPC is
  // not sent, so that tearing down a client and all its meshes waits for a
  // hung daemon once, not once per step.
  std::unique_ptr<grpc::ClientContext> TeardownContext() {
    if (teardown_unanswered_.load()) return nullptr;
    auto ctx = std::make_unique<grpc::ClientContext>();
    SetDeadline(*ctx, options_.close_timeout);
    return ctx;
  }
  // Records the outcome of a teardown RPC; returns it as a Status.
  absl::Status NoteTeardownAnswer(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) teardown_unanswered_.store(true);
    return FromGrpc(s);
  }
  // The status of an RPC that is not part of teardown: an answer shows the
  // daemon responsive again, so teardown RPCs are sent again.
  absl::Status Answered(const grpc::Status& s) {
    if (s.ok()) teardown_unanswered_.store(false);
    return FromGrpc(s);
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
      shutdown(side_fd_, SHUT_RDWR);  // see Close
      close(side_fd_);
      side_fd_ = -1;
      return reply.status();
    }
    if (absl::Status st = side::ReplyStatus(reply->data); !st.ok()) return st;
    return reply;
  }

  // `mesh_id` set: the mesh's shared buffer (Mesh::AllocateShared).
  absl::StatusOr<Buffer> Allocate(size_t bytes, std::string_view device,
                                  const std::string& mesh_id = "") {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::AllocateBufferRequest req;
    req.set_session_id(session_id_);
    req.set_size_bytes(static_cast<int64_t>(bytes));
    req.set_device(std::string(device));
    req.set_mesh_id(mesh_id);
    v1::AllocateBufferResponse resp;
    if (auto st = Answered(stub_->AllocateBuffer(&ctx, req, &resp)); !st.ok()) return st;
    const v1::BufferInfo& info = resp.buffer();
    const std::string& id = info.buffer_id();
    // Daemons from before devices send no device: their buffers are host memory.
    const std::string placed = info.device().empty() ? "cpu" : info.device();
#ifdef COLLECTIVED_HAVE_CUDA
    if (info.kind() == "cuda") return ImportGpuBuffer(info, placed);
#endif
    if (!info.kind().empty() && info.kind() != "memfd") {
      // Only host memory maps with mmap; importing GPU memory needs CUDA.
      // Free it in the daemon now rather than hold it unused until the
      // session ends; no descriptor was fetched, so nothing is open here.
      absl::Status freed = FreeUnmapped(id, placed);
      std::string message =
          info.kind() == "cuda"
              ? absl::StrCat("mapping CUDA buffers needs the SDK built with CUDA (device ", placed,
                             ")")
              : absl::StrCat("this SDK cannot map buffers of kind '", info.kind(), "' (device ",
                             placed, ")");
      if (!freed.ok()) {
        absl::StrAppend(&message, "; freeing the buffer in the daemon failed (", freed.ToString(),
                        "): the daemon frees it when this session closes");
      }
      return absl::UnimplementedError(message);
    }
    auto mapped = MapBuffer(id, static_cast<size_t>(info.size_bytes()));
    if (!mapped.ok()) {
      // Not usable here: release it in the daemon too (best effort).
      FreeUnmapped(id, placed).IgnoreError();
      return mapped.status();
    }
    Buffer buffer(id, *mapped, static_cast<size_t>(info.size_bytes()), placed);
    buffer.owner_ = this;
    return buffer;
  }

#ifdef COLLECTIVED_HAVE_CUDA
  // Fetches a GPU buffer's descriptor and imports it (cuda_import.h); on any
  // failure the buffer is freed in the daemon again.
  absl::StatusOr<Buffer> ImportGpuBuffer(const v1::BufferInfo& info, const std::string& placed) {
    const std::string& id = info.buffer_id();
    absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> imported =
        absl::InternalError("daemon sent no descriptor for the buffer");
    auto reply = SideRequest(absl::StrCat(side::kFd, " ", id));
    if (!reply.ok()) {
      imported = reply.status();
    } else if (reply->fd.valid()) {
      imported = ImportCudaBuffer(reply->fd.release(), static_cast<size_t>(info.size_bytes()),
                                  placed);
    }
    if (!imported.ok()) {
      FreeUnmapped(id, placed).IgnoreError();
      return imported.status();
    }
    Buffer buffer(id, (*imported)->device_ptr(), static_cast<size_t>(info.size_bytes()), placed);
    buffer.device_ordinal_ = (*imported)->device_ordinal();
    buffer.gpu_mapping_ = std::shared_ptr<ImportedCudaBuffer>(std::move(*imported));
    return buffer;
  }
#endif

  // Frees buffer `id` in the daemon when this process did not map it.
  absl::Status FreeUnmapped(const std::string& id, const std::string& device) {
    Buffer unmapped(id, nullptr, 0, device);
    return Free(unmapped);
  }

  // Fetches buffer `id`'s descriptor on the side socket and maps it.
  absl::StatusOr<void*> MapBuffer(const std::string& id, size_t size) {
    auto reply = SideRequest(absl::StrCat(side::kFd, " ", id));
    if (!reply.ok()) return reply.status();
    if (!reply->fd.valid()) return absl::InternalError("daemon sent no descriptor for the buffer");
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
    int err = errno;
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
    absl::Status st = Answered(stub_->FreeBuffer(&ctx, req, &resp));
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
    if (auto st = Answered(stub_->JoinMesh(&ctx, req, &resp)); !st.ok()) return st;
    std::unique_ptr<Mesh> mesh(new Mesh());
    mesh->client_ = shared_from_this();
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
    if (resp.mesh().member_op_bytes() == 0) {
      mesh->member_side_status_ = absl::UnavailableError(
          "the daemon offers no member-side segment for this mesh (a mesh across hosts, a "
          "daemon run with --member_op_bytes=0, or one whose segments were at "
          "--member_segment_total_bytes): every op goes through the daemon");
    } else {
      auto member_ops = MapMemberSegment(resp.mesh(), mesh->index_);
      if (!member_ops.ok()) {
        // This member takes the daemon path for every op; the others see
        // its daemon-path ops counted in the segment and follow it there.
        mesh->member_side_status_ = member_ops.status();
        // Code that differs is a deployment to fix (an SDK and a daemon
        // of different versions): said once per process, not only here.
        static std::atomic<bool> said{false};
        if (absl::IsFailedPrecondition(member_ops.status()) && !said.exchange(true)) {
          std::fprintf(stderr, "collectived: mesh '%s': %s\n", mesh->name_.c_str(),
                       std::string(member_ops.status().message()).c_str());
        }
        return mesh;
      }
      mesh->member_side_ = std::make_unique<Mesh::MemberSide>(*std::move(member_ops));
    }
    return mesh;
  }

  // The member-side segment of `mesh` (common/member_ops.h), mapped.
  absl::StatusOr<std::unique_ptr<internal::MemberOps>> MapMemberSegment(const v1::MeshInfo& mesh,
                                                                        int index) {
    auto reply = SideRequest(absl::StrCat(side::kSegment, " ", mesh.mesh_id()));
    if (!reply.ok()) return reply.status();
    uint64_t bytes = 0;
    std::vector<std::string> words = absl::StrSplit(reply->data, ' ');
    if (!reply->fd.valid() || words.size() != 2 || !absl::SimpleAtoi(words[1], &bytes)) {
      return absl::InternalError(absl::StrCat("malformed SEGMENT reply '", reply->data, "'"));
    }
    MeshShape shape;
    for (const auto& a : mesh.axes()) {
      shape.names.push_back(a.name());
      shape.sizes.push_back(a.size());
    }
    std::weak_ptr<ClientImpl> self = weak_from_this();
    const std::string mesh_id = mesh.mesh_id();
    int live_fd = -1;  // a duplicate of the side socket, to watch the daemon
    {
      MutexLock lock(&side_mu_);
      if (side_fd_ < 0) return absl::UnavailableError("the side socket to the daemon is closed");
      live_fd = fcntl(side_fd_, F_DUPFD_CLOEXEC, 0);
      if (live_fd < 0) return ErrnoStatus(errno, "duplicating the side socket");
    }
    return internal::MemberOps::Map(
        reply->fd.release(), bytes, std::move(shape), index,
        absl::Milliseconds(mesh.op_timeout_ms()), live_fd,
        [self, mesh_id](uint32_t d, uint32_t s) -> absl::StatusOr<bool> {
          std::shared_ptr<ClientImpl> client = self.lock();
          if (client == nullptr) return absl::CancelledError("client closed");
          auto answer = client->SideRequest(absl::StrCat(side::kExpired, " ", mesh_id, " ", d, " ", s));
          if (!answer.ok()) return answer.status();
          return answer->data == absl::StrCat(side::kOk, " 1");
        },
        [self, mesh_id](uint32_t member, const std::string& buffer_id)
            -> absl::StatusOr<internal::MemberOps::PeerFd> {
          std::shared_ptr<ClientImpl> client = self.lock();
          if (client == nullptr) return absl::CancelledError("client closed");
          auto answer = client->SideRequest(
              absl::StrCat(side::kPeerFd, " ", mesh_id, " ", member, " ", buffer_id));
          if (!answer.ok()) return answer.status();
          uint64_t size = 0;
          if (!answer->fd.valid() || answer->data.size() < 3 ||
              !absl::SimpleAtoi(absl::string_view(answer->data).substr(3), &size)) {
            return absl::InternalError(absl::StrCat("unexpected PEERFD reply '", answer->data, "'"));
          }
          return internal::MemberOps::PeerFd{answer->fd.release(), size};
        });
  }

  // Waits at most options_.close_timeout (see TeardownContext). A leave
  // given up on is safe: the mesh breaks when the session ends.
  absl::Status LeaveMesh(const std::string& mesh_id) {
    // Closing the session left every mesh already.
    if (closed_.load()) return absl::OkStatus();
    v1::LeaveMeshRequest req;
    req.set_session_id(session_id_);
    req.set_mesh_id(mesh_id);
    v1::LeaveMeshResponse resp;
    auto ctx = TeardownContext();
    if (!ctx) {
      return absl::DeadlineExceededError(absl::StrCat(
          "leave of mesh '", mesh_id, "' not sent: the daemon left an earlier leave or close "
          "unanswered for ", absl::FormatDuration(options_.close_timeout),
          " (the mesh breaks for its other members when this client's session ends)"));
    }
    return NoteTeardownAnswer(stub_->LeaveMesh(ctx.get(), req, &resp));
  }

  // Submits `op` on the fast path, else on the Execute stream (opened on
  // first use). The daemon orders a session's ops by arrival, so a switch
  // between the two paths first waits until the other path's ops arrived:
  // fast-path entries taken by the daemon, stream ops completed.
  OpFuture Submit(const v1::OpSpec& op, absl::Duration wait) {
    const absl::Time deadline = absl::Now() + wait;
    if (fast_ && !closed_.load()) {
      if (FastQueue::Fits(op)) {
        auto state = std::make_shared<OpState>(
            wait, fast_, fastq::PollsFor(DTypeSize(static_cast<DType>(op.dtype())), op.shape()));
        if (!StreamIdle(op.mesh_id(), deadline)) {
          state->Complete(absl::DeadlineExceededError(
                              "earlier ops sent over gRPC did not complete in time"),
                          -1, {}, DType::kInvalid);
        } else {
          fast_->Submit(op, state, deadline);
        }
        return OpFuture(state);
      }
      if (!fast_->WaitTaken(deadline)) {
        auto state = std::make_shared<OpState>(wait);
        state->Complete(absl::UnavailableError(
                            "earlier fast-path ops were not taken by the daemon in time"),
                        -1, {}, DType::kInvalid);
        return OpFuture(state);
      }
    }
    return SubmitStream(op, wait);
  }

  // Whether every op sent on the stream for `mesh_id` has completed (waits
  // until then). Only the order within a mesh matters.
  bool StreamIdle(const std::string& mesh_id, absl::Time deadline) {
    std::shared_ptr<GrpcStream> stream = Stream(/*open=*/false);
    return stream == nullptr || stream->Idle(mesh_id, deadline);
  }

  OpFuture SubmitStream(const v1::OpSpec& op, absl::Duration wait) {
    std::shared_ptr<GrpcStream> stream = closed_.load() ? nullptr : Stream(/*open=*/true);
    auto state = std::make_shared<OpState>(
        wait, stream, fastq::PollsFor(DTypeSize(static_cast<DType>(op.dtype())), op.shape()));
    if (stream == nullptr) {
      state->Complete(absl::FailedPreconditionError("client is closed"), -1, {}, DType::kInvalid);
    } else {
      stream->Submit(op, state, absl::Now() + wait);
    }
    return OpFuture(state);
  }

  const std::string& session_id() const { return session_id_; }
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  // The Execute stream; opened on first use when `open` (null once the
  // client is closed, or not opened yet).
  std::shared_ptr<GrpcStream> Stream(bool open) {
    MutexLock lock(&stream_mu_);
    if (stream_ == nullptr && open && !closed_.load()) {
      stream_ = std::make_shared<GrpcStream>(stub_.get(), session_id_, options_.grpc_spin);
    }
    return stream_;
  }

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Collective::Stub> stub_;
  std::string session_id_;
  std::atomic<bool> closed_{false};
  // A teardown RPC went unanswered (see TeardownContext).
  std::atomic<bool> teardown_unanswered_{false};

  Mutex side_mu_;
  int side_fd_ ABSL_GUARDED_BY(side_mu_) = -1;
  std::shared_ptr<FastQueue> fast_;  // set by Connect, then constant

  Mutex stream_mu_;
  std::shared_ptr<GrpcStream> stream_ ABSL_GUARDED_BY(stream_mu_);
};

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_SESSION_H_
