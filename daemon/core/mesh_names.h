// The engine's table of mesh names: which mesh holds a name (scope and name,
// MeshKey) now, and what a name keeps across its generations: the last
// generation number (never repeated) and the join token, which binds every
// join of the name while a mesh of it exists and for `token_hold` after the
// last one went away (so a foreign process cannot take over a name whose job
// is re-forming after a member died; members that drop a broken mesh before
// rejoining, or a job that restarts all its processes, re-form within that
// time).
//
// Not thread-safe. REQUIRES: engine mutex held, for every method (the
// engine's mu_ guards its MeshNames).
#ifndef COLLECTIVED_DAEMON_CORE_MESH_NAMES_H_
#define COLLECTIVED_DAEMON_CORE_MESH_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace collectived {

class MeshNames {
 public:
  explicit MeshNames(absl::Duration token_hold) : token_hold_(token_hold) {}

  // The id of the mesh (forming or ready) that holds `key`; nullptr when
  // none does.
  const std::string* Holder(const std::string& key) const;

  // Whether a new mesh of `key` may form with `token` at `now`:
  // PERMISSION_DENIED naming `mesh_name` and the generation whose token
  // still binds the name when `token` is another.
  absl::Status CheckToken(const std::string& key, const std::string& mesh_name,
                          const std::string& token, absl::Time now) const;

  // A new generation of `key`, held by `mesh_id`, whose token is `token`
  // from now on: its generation number (1 for the name's first).
  int64_t Begin(const std::string& key, const std::string& mesh_id, const std::string& token);

  // `mesh_id` no longer holds `key` (it broke, or failed to form): a next
  // join of the name forms a new generation. Nothing when another mesh
  // holds the name.
  void Release(const std::string& key, const std::string& mesh_id);

  // A mesh of `key` went away (its holding must have been released): when
  // it was the name's last, the token's hold starts counting at `now`.
  void MeshGone(const std::string& key, absl::Time now);

 private:
  struct Record {
    int64_t last_generation = 0;
    std::string token;
    // Meshes of the name the engine holds, in any state. A broken mesh
    // stays until every member has left it (rejoining leaves it too).
    int meshes = 0;
    // When `meshes` last dropped to 0.
    absl::Time idle_since = absl::InfinitePast();
  };

  const absl::Duration token_hold_;
  // Key -> id of the mesh that holds the name now.
  absl::flat_hash_map<std::string, std::string> holder_;
  // Never shrinks: generation numbers of a name never repeat.
  absl::flat_hash_map<std::string, Record> records_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_MESH_NAMES_H_
