// A join's request checked on its own (ValidateJoin), before the engine
// looks at any mesh: what a valid request asks for, or the first thing
// wrong with it. Also the name rules the engine applies elsewhere.
//
// Thread-safety: pure functions.
#ifndef COLLECTIVED_DAEMON_CORE_JOIN_REQUEST_H_
#define COLLECTIVED_DAEMON_CORE_JOIN_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/core/engine_types.h"
#include "plan/op_plan.h"

namespace collectived {

inline constexpr size_t kMaxMeshName = 128;
inline constexpr size_t kMaxAxisName = 64;
inline constexpr int kMaxAxes = 8;
// The longest MeshKey of a cluster mesh: the registry's keys and the host
// meshes' rendezvous keys add theirs to it.
inline constexpr size_t kMaxClusterMeshKey = 180;

// 1 to max_len characters of [A-Za-z0-9_] and `extra`.
bool ValidName(const std::string& s, size_t max_len, absl::string_view extra);

// A mesh's name within its scope: the key of the engine's name table.
std::string MeshKey(const std::string& scope, const std::string& name);

// What a join asks for (ValidateJoin's result).
struct JoinSpec {
  MeshShape shape;
  int64_t members = 0;
  bool assign = false;  // no coordinate given: the daemon assigns the index
  int index = -1;       // a coordinate given: its member index
  std::string key;      // MeshKey(scope, mesh_name)
};

// The daemon's limits a join is checked against.
struct JoinLimits {
  int64_t max_mesh_members = 0;
  bool in_cluster = false;  // the daemon is part of a cluster
};

// INVALID_ARGUMENT naming the first field of `req` that is wrong (names,
// axes, the coordinate, timeouts, scope, token, a cluster mesh's key), else
// what it asks for. Looks at nothing but its arguments.
absl::StatusOr<JoinSpec> ValidateJoin(const JoinRequest& req, const JoinLimits& limits);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_JOIN_REQUEST_H_
