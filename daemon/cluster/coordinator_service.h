// CoordinatorService: collectived.v1.Cluster over a Coordinator.
//
// A thin callback service: each method checks the cluster token, translates
// its request, calls the coordinator and finishes. No method blocks a gRPC
// thread: KeyGet and MeshWait finish from the coordinator's callback. Their
// answers (up to 1 MiB of values, or a large mesh's membership) stay in
// memory until the client reads them, so together they are bounded:
// `answer_budget_bytes` of answers not yet sent; past it an answer is
// RESOURCE_EXHAUSTED instead (the daemon's own callers do not retry it: a
// cluster that reaches the budget is under attack, not rendezvousing).
#ifndef COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_SERVICE_H_
#define COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
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
  CoordinatorService(Coordinator* coordinator, std::string token,
                     int64_t answer_budget_bytes = int64_t{1} << 30)
      : coordinator_(coordinator), token_(std::move(token)), answer_budget_(answer_budget_bytes) {}

  // Bytes of KeyGet and MeshWait answers not sent yet.
  int64_t answer_bytes_in_flight() const { return answer_bytes_.load(); }

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
  const int64_t answer_budget_;
  std::atomic<int64_t> answer_bytes_{0};
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_SERVICE_H_
