#include "daemon/server/service.h"

#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/sync.h"
#include "daemon/server/wire.h"

namespace collectived {
namespace {

// Finishes a unary call with `result`, its value in the wire format in
// `resp`.
template <typename T, typename Proto>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* ctx,
                                     const absl::StatusOr<T>& result, Proto* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (result.ok()) *resp = ToProto(*result);
  reactor->Finish(ToGrpc(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* ctx,
                                     const absl::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

// The Execute stream: reads ops, submits each, writes each result when its op
// completes. Finishes once the client half-closed and every op answered.
class ExecuteReactor final : public grpc::ServerBidiReactor<v1::OpRequest, v1::OpResult> {
 public:
  ExecuteReactor(Engine* engine, std::string session_id)
      : engine_(engine), session_id_(std::move(session_id)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      MutexLock lock(&mu_);
      reads_done_ = true;
      MaybeFinish();
      return;
    }
    const int64_t tag = request_.tag();
    {
      MutexLock lock(&mu_);
      ++outstanding_;
    }
    engine_->CountSubmission(Engine::SubmitPath::kExecute);
    auto accepted = engine_->Submit(session_id_, FromProto(request_.op()), /*retain=*/false,
                                    [this, tag](const OpOutcome& o) { OnOpDone(tag, o); });
    if (!accepted.ok()) OnOpDone(tag, OpOutcome(accepted.status(), -1));
    // Reads are not done, so the stream cannot have finished above.
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      write_failed_ = true;
      queue_.clear();
    }
    MaybeWrite();
    MaybeFinish();
  }

  void OnDone() override { delete this; }

 private:
  // Runs on engine threads, not as a gRPC reaction: OnDone (delete this) may
  // run on another thread as soon as Finish is called, so Finish is called
  // after unlocking and is the last use of `this`.
  void OnOpDone(int64_t tag, const OpOutcome& outcome) {
    mu_.Lock();
    --outstanding_;
    if (!write_failed_) {
      v1::OpResult& r = queue_.emplace_back();
      r.set_tag(tag);
      r.set_code(static_cast<int32_t>(outcome.status.code()));
      r.set_message(std::string(outcome.status.message()));
      r.set_sequence(outcome.sequence);
      for (int64_t d : outcome.out_shape) r.add_out_shape(d);
      r.set_out_dtype(ToProto(outcome.out_dtype));
    }
    MaybeWrite();
    const bool finish = ShouldFinish();
    mu_.Unlock();
    if (finish) Finish(grpc::Status::OK);
  }

  void MaybeWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || queue_.empty()) return;
    writing_ = true;
    StartWrite(&queue_.front());
  }

  // Whether the stream is done (and marks it finished): the client
  // half-closed, every op answered and every answer was written.
  bool ShouldFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || outstanding_ > 0 || writing_ || !queue_.empty()) return false;
    finished_ = true;
    return true;
  }
  // For reactions only (OnDone cannot run before a reaction returns).
  void MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ShouldFinish()) Finish(grpc::Status::OK);
  }

  Engine* const engine_;
  const std::string session_id_;
  v1::OpRequest request_;  // read target; touched by reactions only
  Mutex mu_;
  std::deque<v1::OpResult> queue_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class RejectReactor final : public grpc::ServerBidiReactor<v1::OpRequest, v1::OpResult> {
 public:
  explicit RejectReactor(grpc::Status status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::ServerUnaryReactor* CollectiveService::CreateSession(grpc::CallbackServerContext* ctx,
                                                           const v1::CreateSessionRequest* req,
                                                           v1::CreateSessionResponse* resp) {
  return FinishWith(ctx, engine_->CreateSession(req->client_name()), resp);
}

grpc::ServerUnaryReactor* CollectiveService::CloseSession(grpc::CallbackServerContext* ctx,
                                                          const v1::CloseSessionRequest* req,
                                                          v1::CloseSessionResponse*) {
  if (req->session_id().empty()) {
    return FinishWith(ctx, absl::InvalidArgumentError("session_id is empty"));
  }
  return FinishWith(ctx, engine_->CloseSession(req->session_id(), "closed by the client"));
}

grpc::ServerUnaryReactor* CollectiveService::JoinMesh(grpc::CallbackServerContext* ctx,
                                                      const v1::JoinMeshRequest* req,
                                                      v1::JoinMeshResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  engine_->JoinMesh(FromProto(*req), [reactor, resp](absl::StatusOr<Joined> r) {
    if (r.ok()) *resp = ToProto(*r);
    reactor->Finish(ToGrpc(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CollectiveService::LeaveMesh(grpc::CallbackServerContext* ctx,
                                                       const v1::LeaveMeshRequest* req,
                                                       v1::LeaveMeshResponse*) {
  return FinishWith(ctx, engine_->LeaveMesh(req->session_id(), req->mesh_id()));
}

grpc::ServerUnaryReactor* CollectiveService::DescribeMesh(grpc::CallbackServerContext* ctx,
                                                          const v1::DescribeMeshRequest* req,
                                                          v1::MeshInfo* resp) {
  return FinishWith(ctx, engine_->DescribeMesh(req->mesh_id(), req->mesh_name(), req->scope()), resp);
}

grpc::ServerUnaryReactor* CollectiveService::AllocateBuffer(
    grpc::CallbackServerContext* ctx, const v1::AllocateBufferRequest* req,
    v1::AllocateBufferResponse* resp) {
  auto info = engine_->AllocateBuffer(req->session_id(), req->size_bytes(), req->device(),
                                      req->mesh_id());
  if (info.ok()) *resp->mutable_buffer() = ToProto(*info);
  return FinishWith(ctx, info.status());
}

grpc::ServerUnaryReactor* CollectiveService::FreeBuffer(grpc::CallbackServerContext* ctx,
                                                        const v1::FreeBufferRequest* req,
                                                        v1::FreeBufferResponse*) {
  return FinishWith(ctx, engine_->FreeBuffer(req->session_id(), req->buffer_id()));
}

grpc::ServerUnaryReactor* CollectiveService::Submit(grpc::CallbackServerContext* ctx,
                                                    const v1::SubmitRequest* req,
                                                    v1::SubmitResponse* resp) {
  engine_->CountSubmission(Engine::SubmitPath::kUnary);
  return FinishWith(
      ctx, engine_->Submit(req->session_id(), FromProto(req->op()), /*retain=*/true, nullptr),
      resp);
}

grpc::ServerUnaryReactor* CollectiveService::Wait(grpc::CallbackServerContext* ctx,
                                                  const v1::WaitRequest* req,
                                                  v1::WaitResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (req->timeout_ms() < 0) {
    reactor->Finish(ToGrpc(absl::InvalidArgumentError("timeout_ms must be >= 0")));
    return reactor;
  }
  engine_->Wait(req->session_id(), req->op_id(), absl::Milliseconds(req->timeout_ms()),
                [reactor, resp](absl::StatusOr<Waited> r) {
                  if (r.ok()) *resp = ToProto(*r);
                  reactor->Finish(ToGrpc(r.status()));
                });
  return reactor;
}

grpc::ServerBidiReactor<v1::OpRequest, v1::OpResult>* CollectiveService::Execute(
    grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kSessionMetadataKey);
  if (it == md.end() || it->second.empty()) {
    return new RejectReactor(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        std::string("Execute needs the session id in the '") + kSessionMetadataKey +
            "' request metadata"));
  }
  return new ExecuteReactor(engine_, std::string(it->second.data(), it->second.size()));
}

grpc::ServerUnaryReactor* CollectiveService::ListSessions(grpc::CallbackServerContext* ctx,
                                                          const v1::ListSessionsRequest*,
                                                          v1::ListSessionsResponse* resp) {
  *resp = ToProto(engine_->ListSessions());
  return FinishWith(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CollectiveService::ListMeshes(grpc::CallbackServerContext* ctx,
                                                        const v1::ListMeshesRequest*,
                                                        v1::ListMeshesResponse* resp) {
  *resp = ToProto(engine_->ListMeshes());
  return FinishWith(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CollectiveService::ListPendingOps(
    grpc::CallbackServerContext* ctx, const v1::ListPendingOpsRequest* req,
    v1::ListPendingOpsResponse* resp) {
  return FinishWith(ctx, engine_->ListPendingOps(req->mesh_id()), resp);
}

grpc::ServerUnaryReactor* CollectiveService::GetStats(grpc::CallbackServerContext* ctx,
                                                      const v1::GetStatsRequest*,
                                                      v1::GetStatsResponse* resp) {
  *resp = ToProto(engine_->GetStats());
  resp->set_version(COLLECTIVED_VERSION);
  return FinishWith(ctx, absl::OkStatus());
}

}  // namespace collectived
