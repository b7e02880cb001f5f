// CollectiveService: the gRPC face of the engine.
//
// A thin callback service: each method translates its request, calls the
// engine, and finishes the RPC when the engine answers. No method blocks a
// gRPC thread: joins, waits and ops finish from engine callbacks.
#ifndef COLLECTIVED_DAEMON_SERVER_SERVICE_H_
#define COLLECTIVED_DAEMON_SERVER_SERVICE_H_

#include "collectived/v1/collective.grpc.pb.h"
#include "common/side_protocol.h"
#include "daemon/core/engine.h"

namespace collectived {

// Metadata key carrying the session id on the Execute stream.

class CollectiveService final : public v1::Collective::CallbackService {
 public:
  explicit CollectiveService(Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* ctx,
                                          const v1::CreateSessionRequest* req,
                                          v1::CreateSessionResponse* resp) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* ctx,
                                         const v1::CloseSessionRequest* req,
                                         v1::CloseSessionResponse* resp) override;
  grpc::ServerUnaryReactor* JoinMesh(grpc::CallbackServerContext* ctx,
                                     const v1::JoinMeshRequest* req,
                                     v1::JoinMeshResponse* resp) override;
  grpc::ServerUnaryReactor* LeaveMesh(grpc::CallbackServerContext* ctx,
                                      const v1::LeaveMeshRequest* req,
                                      v1::LeaveMeshResponse* resp) override;
  grpc::ServerUnaryReactor* DescribeMesh(grpc::CallbackServerContext* ctx,
                                         const v1::DescribeMeshRequest* req,
                                         v1::MeshInfo* resp) override;
  grpc::ServerUnaryReactor* AllocateBuffer(grpc::CallbackServerContext* ctx,
                                           const v1::AllocateBufferRequest* req,
                                           v1::AllocateBufferResponse* resp) override;
  grpc::ServerUnaryReactor* FreeBuffer(grpc::CallbackServerContext* ctx,
                                       const v1::FreeBufferRequest* req,
                                       v1::FreeBufferResponse* resp) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx,
                                   const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::WaitRequest* req,
                                 v1::WaitResponse* resp) override;
  grpc::ServerBidiReactor<v1::OpRequest, v1::OpResult>* Execute(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx,
                                         const v1::ListSessionsRequest* req,
                                         v1::ListSessionsResponse* resp) override;
  grpc::ServerUnaryReactor* ListMeshes(grpc::CallbackServerContext* ctx,
                                       const v1::ListMeshesRequest* req,
                                       v1::ListMeshesResponse* resp) override;
  grpc::ServerUnaryReactor* ListPendingOps(grpc::CallbackServerContext* ctx,
                                           const v1::ListPendingOpsRequest* req,
                                           v1::ListPendingOpsResponse* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest* req,
                                     v1::GetStatsResponse* resp) override;

 private:
  Engine* const engine_;
};

// absl::Status -> grpc::Status (the codes share their numbering).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_SERVICE_H_
