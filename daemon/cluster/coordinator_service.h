// CoordinatorService: collectived.v1.Cluster over a Coordinator.
//
// A thin callback service: each method checks the cluster token, translates
// its request, calls the coordinator and finishes. No method blocks a gRPC
// thread: KeyGet and MeshWait finish from the coordinator's callback.
#ifndef COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_SERVICE_H_
#define COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_SERVICE_H_

#include <string>

#include "collectived/v1/cluster.grpc.pb.h"
#include "daemon/cluster/coordinator.h"

namespace collectived {

// Request metadata key carrying the cluster join token.
inline constexpr char kClusterTokenMetadataKey[] = "collectived-cluster-token";

// Whether `a` equals `b`, in time that depends on their lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class CoordinatorService final : public v1::Cluster::CallbackService {
 public:
  // Serves `coordinator` (which must outlive the server). When `token` is not
  // empty every call must carry it (UNAUTHENTICATED otherwise); an empty
  // token accepts every caller (main() allows that on loopback only).
  CoordinatorService(Coordinator* coordinator, std::string token)
      : coordinator_(coordinator), token_(std::move(token)) {}

  grpc::ServerUnaryReactor* JoinCluster(grpc::CallbackServerContext* ctx,
                                        const v1::JoinClusterRequest* req,
                                        v1::JoinClusterResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* LeaveCluster(grpc::CallbackServerContext* ctx,
                                         const v1::LeaveClusterRequest* req,
                                         v1::LeaveClusterResponse* resp) override;
  grpc::ServerUnaryReactor* ListHosts(grpc::CallbackServerContext* ctx,
                                      const v1::ListHostsRequest* req,
                                      v1::ListHostsResponse* resp) override;
  grpc::ServerUnaryReactor* KeySet(grpc::CallbackServerContext* ctx,
                                   const v1::KeySetRequest* req,
                                   v1::KeySetResponse* resp) override;
  grpc::ServerUnaryReactor* KeyGet(grpc::CallbackServerContext* ctx,
                                   const v1::KeyGetRequest* req,
                                   v1::KeyGetResponse* resp) override;
  grpc::ServerUnaryReactor* KeyDelete(grpc::CallbackServerContext* ctx,
                                      const v1::KeyDeleteRequest* req,
                                      v1::KeyDeleteResponse* resp) override;
  grpc::ServerUnaryReactor* MeshRegister(grpc::CallbackServerContext* ctx,
                                         const v1::MeshRegisterRequest* req,
                                         v1::MeshRegisterResponse* resp) override;
  grpc::ServerUnaryReactor* MeshWait(grpc::CallbackServerContext* ctx,
                                     const v1::MeshWaitRequest* req,
                                     v1::MeshWaitResponse* resp) override;
  grpc::ServerUnaryReactor* MeshLeave(grpc::CallbackServerContext* ctx,
                                      const v1::MeshLeaveRequest* req,
                                      v1::MeshLeaveResponse* resp) override;

 private:
  // OK when the call carries the token (or none is required).
  absl::Status CheckToken(grpc::CallbackServerContext* ctx) const;

  Coordinator* const coordinator_;
  const std::string token_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_SERVICE_H_
