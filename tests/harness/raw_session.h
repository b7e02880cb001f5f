// RawSession: a client session driven by hand, for tests that must do what
// the SDK never does: gRPC stubs for the control plane, the side socket for
// ATTACH/FD/QUEUE, and the mapped fast-path queue written directly.
#ifndef COLLECTIVED_TESTS_HARNESS_RAW_SESSION_H_
#define COLLECTIVED_TESTS_HARNESS_RAW_SESSION_H_

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "common/fast_queue.h"
#include "common/socket_path.h"
#include "common/unix_socket.h"
#include "tests/harness/harness.h"

namespace collectived::testing {

// Fails the test (and returns) with the status when `expr` is not OK.
#define ASSERT_OK(expr)                                    \
  do {                                                     \
    const absl::Status status_ = (expr);                   \
    ASSERT_TRUE(status_.ok()) << #expr << ": " << status_; \
  } while (0)

inline std::unique_ptr<v1::Collective::Stub> Stub(const Daemon& d) {
  return v1::Collective::NewStub(
      grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials()));
}

inline void SetDeadline(grpc::ClientContext& ctx, absl::Duration d = absl::Seconds(10)) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + d));
}

// One unary call `method` with `req` to the daemon `d`, with SetDeadline's
// deadline: the answer (a failed call fails the test).
template <typename Req, typename Resp>
Resp Ask(const Daemon& d,
         grpc::Status (v1::Collective::Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
         const Req& req) {
  auto stub = Stub(d);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  Resp resp;
  grpc::Status st = ((*stub).*method)(&ctx, req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp;
}

// A session driven by hand: gRPC stubs for the control plane, the side socket
// for ATTACH/QUEUE, and the mapped queue written directly.
class RawSession {
 public:
  RawSession(const Daemon& d, const std::string& name)
      : socket_(d.socket()), name_(name), stub_(Stub(d)) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::CreateSessionRequest req;
    req.set_client_name(name);
    v1::CreateSessionResponse resp;
    grpc::Status st = stub_->CreateSession(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    id_ = resp.session_id();
    token_ = resp.attach_token();
    auto side = ConnectSeqPacket(SideSocketPath(socket_));
    EXPECT_TRUE(side.ok()) << side.status();
    side_ = side.ok() ? *side : -1;
  }
  ~RawSession() {
    if (base_ != nullptr) munmap(base_, fastq::kQueueBytes);
    if (side_ >= 0) close(side_);
  }

  const std::string& id() const { return id_; }
  const std::string& mesh_id() const { return mesh_id_; }
  const std::string& buffer_id() const { return buffer_id_; }
  int side() const { return side_; }
  const std::string& name() const { return name_; }
  v1::Collective::Stub& stub() { return *stub_; }
  fastq::QueueView& q() { return q_; }

  // One side-socket request; the reply (with its descriptor, if any).
  absl::StatusOr<Packet> Request(const std::string& text) {
    if (absl::Status st = SendPacket(side_, text); !st.ok()) return st;
    return ReceivePacket(side_, absl::Seconds(10));
  }
  absl::Status Attach() {
    auto reply = Request(absl::StrCat("ATTACH ", id_, " ", token_));
    if (!reply.ok()) return reply.status();
    if (reply->data != "OK") return absl::InternalError(reply->data);
    return absl::OkStatus();
  }
  // QUEUE, checks the reply, maps the queue.
  absl::Status MapQueue() {
    auto reply = Request("QUEUE");
    if (!reply.ok()) return reply.status();
    if (reply->data != absl::StrCat("OK ", fastq::kQueueBytes, " ", fastq::kVersion)) {
      return absl::InternalError(absl::StrCat("QUEUE answered '", reply->data, "'"));
    }
    if (!reply->fd.valid()) return absl::InternalError("QUEUE sent no descriptor");
    base_ = mmap(nullptr, fastq::kQueueBytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      return absl::InternalError("mmap failed");
    }
    q_ = fastq::QueueView::Of(base_);
    if (!fastq::HeaderValid(q_.header)) return absl::InternalError("invalid queue header");
    return absl::OkStatus();
  }

  // Joins a one-member mesh and allocates a buffer: what a valid op needs.
  absl::Status JoinSolo(const std::string& mesh_name) { return Join(mesh_name, 1, 0); }
  // Joins mesh `mesh_name` (one axis "i" of `members`) at `coordinate` and
  // allocates a buffer of `buffer_bytes`. Blocks until the mesh is full.
  absl::Status Join(const std::string& mesh_name, int members, int coordinate,
                    int64_t buffer_bytes = 4096) {
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::JoinMeshRequest req;
      req.set_session_id(id_);
      req.set_mesh_name(mesh_name);
      auto* axis = req.add_axes();
      axis->set_name("i");
      axis->set_size(members);
      req.add_coordinate(coordinate);
      req.set_timeout_ms(5000);
      v1::JoinMeshResponse resp;
      grpc::Status st = stub_->JoinMesh(&ctx, req, &resp);
      if (!st.ok()) return absl::InternalError(st.error_message());
      mesh_id_ = resp.mesh().mesh_id();
    }
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::AllocateBufferRequest req;
    req.set_session_id(id_);
    req.set_size_bytes(buffer_bytes);
    v1::AllocateBufferResponse resp;
    grpc::Status st = stub_->AllocateBuffer(&ctx, req, &resp);
    if (!st.ok()) return absl::InternalError(st.error_message());
    buffer_id_ = resp.buffer().buffer_id();
    return absl::OkStatus();
  }
  // A valid psum f32[4] over the solo mesh, serialized.
  std::string ValidOp() const {
    v1::OpSpec op;
    op.set_mesh_id(mesh_id_);
    op.set_kind(v1::PSUM);
    op.add_axes("i");
    op.set_dtype(v1::FLOAT32);
    op.add_shape(4);
    op.mutable_input()->set_buffer_id(buffer_id_);
    return op.SerializeAsString();
  }

  // Publishes an SQ entry holding `bytes` but claiming `len` bytes.
  void Publish(uint64_t tag, const std::string& bytes, uint32_t len) {
    fastq::SqEntry& e = q_.sq[tail_ % fastq::kSlots];
    e.tag = tag;
    e.len = len;
    e.submit_ns = fastq::MonotonicNs();
    std::memcpy(e.data, bytes.data(), std::min(bytes.size(), fastq::kMaxOpBytes));
    ++tail_;
    q_.header->sq_tail.v.store(tail_, std::memory_order_seq_cst);
    fastq::Ring(q_.header->daemon_bell, q_.header->daemon_sleeping);
  }
  void Publish(uint64_t tag, const std::string& bytes) {
    Publish(tag, bytes, static_cast<uint32_t>(bytes.size()));
  }

  // The next completion (consumed), or an error at the deadline.
  absl::StatusOr<fastq::CqEntry> NextCompletion(absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (q_.header->cq_tail.v.load(std::memory_order_seq_cst) == cq_head_) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("no completion within ", absl::FormatDuration(timeout), " (cq_tail ",
                         q_.header->cq_tail.v.load(), ", sq_head ",
                         q_.header->sq_head.v.load(), ", sq_tail ", tail_, ")"));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    fastq::CqEntry c;
    std::memcpy(&c, &q_.cq[cq_head_ % fastq::kSlots], sizeof(c));
    ++cq_head_;
    q_.header->cq_head.v.store(cq_head_, std::memory_order_seq_cst);
    fastq::Ring(q_.header->daemon_bell, q_.header->daemon_sleeping);
    return c;
  }

  uint32_t tail() const { return tail_; }

 private:
  std::string socket_, name_;
  std::unique_ptr<v1::Collective::Stub> stub_;
  std::string id_, token_, mesh_id_, buffer_id_;
  int side_ = -1;
  void* base_ = nullptr;
  fastq::QueueView q_;
  uint32_t tail_ = 0;
  uint32_t cq_head_ = 0;
};

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_RAW_SESSION_H_
