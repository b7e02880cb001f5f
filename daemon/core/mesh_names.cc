#include "daemon/core/mesh_names.h"

#include "absl/strings/str_cat.h"

namespace collectived {

const std::string* MeshNames::Holder(const std::string& key) const {
  auto it = holder_.find(key);
  return it == holder_.end() ? nullptr : &it->second;
}

absl::Status MeshNames::CheckToken(const std::string& key, const std::string& mesh_name,
                                   const std::string& token, absl::Time now) const {
  auto it = records_.find(key);
  if (it == records_.end()) return absl::OkStatus();
  const Record& r = it->second;
  const bool held = r.meshes > 0 || now - r.idle_since < token_hold_;
  if (!held || r.token == token) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "mesh '", mesh_name, "' needs the join token of its generation ", r.last_generation,
      " (a mesh's token carries over to its next generations)"));
}

int64_t MeshNames::Begin(const std::string& key, const std::string& mesh_id,
                         const std::string& token) {
  Record& r = records_[key];
  r.token = token;
  ++r.meshes;
  holder_[key] = mesh_id;
  return ++r.last_generation;
}

void MeshNames::Release(const std::string& key, const std::string& mesh_id) {
  auto it = holder_.find(key);
  if (it != holder_.end() && it->second == mesh_id) holder_.erase(it);
}

void MeshNames::MeshGone(const std::string& key, absl::Time now) {
  Record& r = records_[key];
  if (--r.meshes == 0) r.idle_since = now;
}

}  // namespace collectived
