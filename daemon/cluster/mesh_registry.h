// The mesh registry's rules, shared by its two implementations: the
// in-memory coordinator (in_memory_coordinator.h) and the registry kept in
// etcd (etcd_cluster.h). A generation of a mesh key is a RegistryGeneration;
// these functions decide whether a registration is let in, add and remove
// members, and word the answers, so both registries answer alike, word for
// word.
//
// Pure functions over values: no locks, no I/O. Thread-compatible.
#ifndef COLLECTIVED_DAEMON_CLUSTER_MESH_REGISTRY_H_
#define COLLECTIVED_DAEMON_CLUSTER_MESH_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/cluster/coordinator.h"

namespace collectived {

// One generation of a mesh key: who registered which member, and what every
// registration must agree on.
struct RegistryGeneration {
  int64_t number = 0;
  std::string axes;  // canonical
  int64_t members = 0;
  std::string token_digest;  // TokenDigest of the first registration's token
  std::string first_host;    // the host of the first registration
  int64_t op_timeout_ms = 0;
  std::string op_timeout_host;  // the host that set op_timeout_ms
  std::string secret;           // MeshMembership::secret
  std::map<int32_t, std::string> member_host;   // index -> host id
  std::map<std::string, int64_t> host_members;  // host id -> indices held

  bool full() const { return static_cast<int64_t>(member_host.size()) == members; }
};

// Most items an error text names.
inline constexpr size_t kRegistryNamed = 16;

// "mesh 'key' generation N".
std::string MeshName(absl::string_view key, int64_t generation);
// A list of `total` items for an error text (`items`: at least the first
// kRegistryNamed of them, or all): at most that many named, then how many
// more.
std::string BoundedList(const std::vector<std::string>& items, size_t total);
std::string BoundedList(const std::vector<std::string>& items);

// A one-way digest of a join token ("" for none): what a registry keeps,
// so that a store others can read (etcd) never holds the token.
std::string TokenDigest(absl::string_view token);

// Every field of `r` (INVALID_ARGUMENT naming the field), before anything
// changes.
absl::Status ValidateMeshRegistration(const MeshRegistration& r);
// Generations start at 1.
absl::Status ValidateMeshGeneration(int64_t generation);
// A MeshLeave's fields: key, generation, at most kMaxKeysPerRequest indices
// and kMaxMeshReasonBytes of reason.
absl::Status ValidateMeshLeave(absl::string_view key, int64_t generation,
                               const std::vector<int32_t>& indices, absl::string_view reason);

// Whether `r` may join live generation `gen` of `key`: PERMISSION_DENIED
// (another token), FAILED_PRECONDITION (other axes, member count or op
// timeout; full), ALREADY_EXISTS (an index is taken, naming its host).
absl::Status CheckRegistration(absl::string_view key, const RegistryGeneration& gen,
                               const MeshRegistration& r);
// A new generation `number` started by `r` (its secret drawn now).
RegistryGeneration StartGeneration(int64_t number, const MeshRegistration& r);
// Adds `r`'s members (after CheckRegistration), and its op timeout if the
// generation had none.
void AddRegistration(RegistryGeneration& gen, const MeshRegistration& r);
// Frees the indices of `indices` that `host` holds; true when the
// generation has no member left.
bool RemoveRegistrations(RegistryGeneration& gen, absl::string_view host,
                         const std::vector<int32_t>& indices);

// DEADLINE_EXCEEDED: the generation did not fill, naming the missing
// indices and who registered (bounded).
absl::Status NotFullError(absl::string_view key, const RegistryGeneration& gen);
// The membership of full generation `gen`; `host` gives each host's record
// (its address) by id.
MeshMembership MembershipOf(const RegistryGeneration& gen,
                            const std::function<HostRecord(const std::string&)>& host);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_MESH_REGISTRY_H_
