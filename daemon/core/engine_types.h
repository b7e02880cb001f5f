// What the engine takes and gives: requests, results and diagnostics in the
// project's own types. The wire format (collectived.v1) is converted to and
// from these at the server's edge (daemon/server/wire.h); the engine never
// sees protobuf. Plain data.
#ifndef COLLECTIVED_DAEMON_CORE_ENGINE_TYPES_H_
#define COLLECTIVED_DAEMON_CORE_ENGINE_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collectived/dtype.h"
#include "plan/op_plan.h"

namespace collectived {

// A new session (CreateSession).
struct NewSession {
  // Unguessable; names the session in every later request.
  std::string session_id;
  // Presented on the side socket to attach to the session.
  std::string attach_token;
  std::string side_socket_path;
  int64_t attach_timeout_ms = 0;
  // Host name and pid of the daemon.
  std::string daemon_id;
};

// One axis as a join names it (not yet validated).
struct AxisRequest {
  std::string name;
  int size = 0;
};

// A request to join a mesh, as the client sent it: ValidateJoin checks it.
struct JoinRequest {
  std::string session_id;
  std::string mesh_name;
  // Major to minor.
  std::vector<AxisRequest> axes;
  // One entry per axis, or empty: the daemon assigns the lowest free one.
  std::vector<int> coordinate;
  // 0: the daemon's defaults.
  int64_t timeout_ms = 0;
  int64_t op_timeout_ms = 0;
  std::string scope;
  std::string join_token;
};

// One member of a mesh, as diagnostics and joins show it.
struct MemberView {
  int index = 0;
  std::vector<int> coordinate;
  // DisplayId of the member's session: never the id itself.
  std::string session_id;
  std::string client_name;
  int pid = 0;
  std::string host;
  // Member-side ops the member reports (0 without a segment).
  int64_t member_side_ops = 0;
};

struct MeshView {
  std::string mesh_id;
  std::string name;
  std::string scope;
  MeshShape shape;
  int64_t generation = 0;
  // "FORMING", "READY" or "BROKEN".
  std::string state;
  // The members known so far (joined here, or on another host).
  std::vector<MemberView> members;
  int64_t op_timeout_ms = 0;
  int64_t completed_ops = 0;
  // 0: the mesh has no segment (every op goes through the daemon).
  int64_t member_op_bytes = 0;
  int64_t member_side_ops = 0;
};

// A join that completed: the mesh and the caller's place in it.
struct Joined {
  MeshView mesh;
  MemberView self;
};

struct BufferView {
  std::string buffer_id;
  int64_t size_bytes = 0;
  // "memfd" (host memory) or the GPU allocator's kind ("cuda").
  std::string kind;
  // Canonical: "cpu" or "cuda:GPU-<uuid>".
  std::string device;
};

// An op Submit took: its id for Wait (unique within the session), its
// sequence number on its mesh (0-based) and its result's type.
struct Accepted {
  int64_t op_id = 0;
  int64_t sequence = 0;
  std::vector<int64_t> out_shape;
  DType out_dtype = DType::kInvalid;
};

// A retained op that Wait saw complete.
struct Waited {
  int64_t op_id = 0;
  int64_t sequence = 0;
};

// Buffers on one device (a session's, or every session's).
struct DeviceBuffers {
  std::string device;
  std::string kind;
  int32_t buffers = 0;
  int64_t buffer_bytes = 0;
};

struct SessionView {
  // DisplayId of the session.
  std::string session_id;
  std::string client_name;
  int pid = 0;   // 0 until attached
  int uid = -1;  // -1 until attached
  bool attached = false;
  int32_t buffers = 0;
  int64_t buffer_bytes = 0;
  // By device name.
  std::vector<DeviceBuffers> buffers_by_device;
  std::vector<std::string> mesh_ids;
  int64_t ops_submitted = 0;
};

// An op not yet done: a daemon-path op (submitted, waiting or running) or a
// member-side op some members wait in.
struct PendingOpView {
  std::string mesh_id;
  std::string mesh_name;
  // -1 for a member-side op.
  int64_t sequence = -1;
  std::string description;
  std::vector<int32_t> submitted;
  std::vector<int32_t> missing;
  // Members on other hosts that this daemon does not wait for.
  std::vector<int32_t> elsewhere;
  // "waiting", "queued" or "running".
  std::string state;
  int64_t age_ms = 0;
  int64_t deadline_ms = 0;
  bool member_side = false;
  int64_t member_op = 0;
};

// Ops of one kind since the daemon started.
struct KindStats {
  OpKind kind = OpKind::kUnspecified;
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t bytes = 0;
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t bytes_required = 0;
};

// The daemon's place in a cluster (only with a rendezvous).
struct ClusterView {
  std::string host_id;
  std::string state;
  std::string coordinator;
  bool serves_coordinator = false;
  std::string last_error;
  int32_t meshes_across_hosts = 0;
  int64_t ops_across_hosts = 0;
  int64_t ops_across_hosts_failed = 0;
};

struct EngineStats {
  std::string daemon_id;
  int64_t uptime_ms = 0;
  int32_t sessions = 0;
  int32_t meshes = 0;
  int32_t buffers = 0;
  int64_t buffer_bytes = 0;
  int64_t ops_completed = 0;
  int64_t ops_failed = 0;
  // By kind, in OpKind order; kinds that never ran left out.
  std::vector<KindStats> by_kind;
  int32_t executor_threads = 0;
  // By device name.
  std::vector<DeviceBuffers> buffers_by_device;
  // Only in a cluster (with a rendezvous).
  std::optional<ClusterView> cluster;
  int64_t submitted_fast_path = 0;
  int64_t submitted_execute = 0;
  int64_t submitted_unary = 0;
  int64_t member_side_ops = 0;
  int64_t member_segment_bytes = 0;
  int32_t member_side_sessions = 0;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_ENGINE_TYPES_H_
