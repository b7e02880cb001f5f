// The server's edge: the wire format (collectived.v1) to and from the
// engine's own types (daemon/core/engine_types.h, plan/op_request.h). The
// engine never sees protobuf; the gRPC service and the fast path convert
// here. Pure functions; thread-safe.
#ifndef COLLECTIVED_DAEMON_SERVER_WIRE_H_
#define COLLECTIVED_DAEMON_SERVER_WIRE_H_

#include <vector>

#include "collectived/v1/collective.pb.h"
#include "daemon/core/engine_types.h"
#include "plan/wire_plan.h"

namespace collectived {

// Requests. (An op: plan/wire_plan.h's FromProto.)
JoinRequest FromProto(const v1::JoinMeshRequest& req);

// Results.
v1::CreateSessionResponse ToProto(const NewSession& session);
v1::Member ToProto(const MemberView& member);
v1::MeshInfo ToProto(const MeshView& mesh);
v1::JoinMeshResponse ToProto(const Joined& joined);
v1::BufferInfo ToProto(const BufferView& buffer);
v1::SubmitResponse ToProto(const Accepted& accepted);
v1::WaitResponse ToProto(const Waited& waited);

// Diagnostics.
v1::ListSessionsResponse ToProto(const std::vector<SessionView>& sessions);
v1::ListMeshesResponse ToProto(const std::vector<MeshView>& meshes);
v1::ListPendingOpsResponse ToProto(const std::vector<PendingOpView>& ops);
// Without `version`, which the service adds.
v1::GetStatsResponse ToProto(const EngineStats& stats);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_WIRE_H_
