#include "daemon/core/join_request.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace collectived {
namespace {

absl::Status Invalid(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// The axes: names, sizes, and the member count within the limit.
absl::Status CheckAxes(const JoinRequest& req, const JoinLimits& limits,
                       JoinSpec& spec) {
  if (req.axes.empty() || req.axes.size() > kMaxAxes) {
    return Invalid("a mesh needs 1 to ", kMaxAxes, " axes; got ", req.axes.size());
  }
  spec.members = 1;
  for (const AxisRequest& axis : req.axes) {
    if (!ValidName(axis.name, kMaxAxisName, ".-")) {
      return Invalid("axis name '", axis.name, "' must be 1 to ", kMaxAxisName,
                     " characters of [A-Za-z0-9_.-]");
    }
    const std::vector<std::string>& names = spec.shape.names;
    if (std::find(names.begin(), names.end(), axis.name) != names.end()) {
      return Invalid("axis name '", axis.name, "' repeats");
    }
    if (axis.size < 1) {
      return Invalid("axis '", axis.name, "' has size ", axis.size, "; must be >= 1");
    }
    spec.members *= axis.size;
    if (spec.members > limits.max_mesh_members) {
      return Invalid("mesh has more than ", limits.max_mesh_members, " members");
    }
    spec.shape.names.push_back(axis.name);
    spec.shape.sizes.push_back(axis.size);
  }
  return absl::OkStatus();
}

// The coordinate: none (the daemon assigns; not in a cluster) or one in
// range on every axis.
absl::Status CheckCoordinate(const JoinRequest& req, const JoinLimits& limits,
                             JoinSpec& spec) {
  spec.assign = req.coordinate.empty();
  if (spec.assign) {
    if (limits.in_cluster) {
      return Invalid(
          "this daemon is part of a cluster, where a mesh's members may join on any host: "
          "give each member its coordinate (the daemons cannot assign them)");
    }
    return absl::OkStatus();
  }
  if (req.coordinate.size() != req.axes.size()) {
    return Invalid("coordinate has ", req.coordinate.size(), " entries for ", req.axes.size(),
                   " axes");
  }
  for (size_t i = 0; i < req.coordinate.size(); ++i) {
    if (req.coordinate[i] < 0 || req.coordinate[i] >= spec.shape.sizes[i]) {
      return Invalid("coordinate ", req.coordinate[i], " out of range for axis '",
                     spec.shape.names[i], "' of size ", spec.shape.sizes[i]);
    }
  }
  spec.index = spec.shape.Index(req.coordinate);
  return absl::OkStatus();
}

}  // namespace

bool ValidName(const std::string& s, size_t max_len, absl::string_view extra) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || extra.find(c) != absl::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

std::string MeshKey(const std::string& scope, const std::string& name) {
  return absl::StrCat(scope, "/", name);
}

absl::StatusOr<JoinSpec> ValidateJoin(const JoinRequest& req, const JoinLimits& limits) {
  if (!ValidName(req.mesh_name, kMaxMeshName, ".:/-")) {
    return Invalid("mesh_name '", req.mesh_name, "' must be 1 to ", kMaxMeshName,
                   " characters of [A-Za-z0-9_.:/-]");
  }
  JoinSpec spec;
  if (absl::Status st = CheckAxes(req, limits, spec); !st.ok()) return st;
  if (absl::Status st = CheckCoordinate(req, limits, spec); !st.ok()) return st;
  if (req.timeout_ms < 0 || req.op_timeout_ms < 0) return Invalid("timeouts must be >= 0");
  if (!req.scope.empty() && !ValidName(req.scope, kMaxMeshName, ".:-")) {
    return Invalid("scope '", req.scope, "' must be up to ", kMaxMeshName,
                   " characters of [A-Za-z0-9_.:-]");
  }
  if (req.join_token.size() > 256) return Invalid("join_token is longer than 256 bytes");
  spec.key = MeshKey(req.scope, req.mesh_name);
  if (limits.in_cluster && spec.key.size() > kMaxClusterMeshKey) {
    return Invalid("in a cluster, a mesh's scope and name together must be at most ",
                   kMaxClusterMeshKey - 1, " characters; got ", spec.key.size() - 1);
  }
  return spec;
}

}  // namespace collectived
