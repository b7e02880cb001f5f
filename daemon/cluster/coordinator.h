// Coordinator: cluster membership (leases renewed by heartbeats) and a
// key-value store with blocking waits, the rendezvous of the daemons of a
// cluster. CoordinatorService (coordinator_service.h) serves it over gRPC;
// InMemoryCoordinator is the implementation a daemon runs with --coordinator.
// An external store (etcd) could implement the same interface later.
//
// Validation (ValidateHostId, ValidateKey, ...) is part of the contract: every
// implementation refuses bad input with INVALID_ARGUMENT before anything
// changes.
#ifndef COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_H_
#define COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace collectived {

// Limits of the cluster API (cluster.proto states them too).
inline constexpr size_t kMaxHostIdLength = 64;
inline constexpr size_t kMaxAddressLength = 256;
inline constexpr size_t kMaxKeyLength = 256;
// Below the daemon's 1 MiB request limit, with room for the rest of a KeySet.
inline constexpr size_t kMaxValueBytes = 512 * 1024;
inline constexpr size_t kMaxKeysPerRequest = 128;
// Most value bytes one Get answers (RESOURCE_EXHAUSTED beyond): a host's
// rendezvous reads one key at a time, of at most kMaxValueBytes; the cap
// keeps a small request from asking for a huge answer, copied per waiter.
inline constexpr size_t kMaxAnswerBytes = 1024 * 1024;
// The longest a KeyGet waits; longer timeouts are capped to it.
inline constexpr absl::Duration kMaxKeyWait = absl::Minutes(5);

// One host of the cluster, as ListHosts reports it.
struct HostRecord {
  std::string host_id;
  std::string address;
  absl::Time joined_at;
  absl::Time last_heartbeat;
};

// What Join returns: the new lease and every host that holds one (this host
// included), ordered by host id.
struct LeaseGrant {
  std::string lease_id;
  absl::Duration ttl;
  std::vector<HostRecord> hosts;
};

struct KeyValue {
  std::string key;
  std::string value;
};

// The cross-host mesh registry (MeshRegister / MeshWait / MeshLeave).
//
// Per mesh key (scope and name) the registry holds at most one live
// generation: forming (hosts register their members' indices until every
// index of the mesh is taken) or ready (full). A generation that breaks (a
// host reports it, or a host of it loses its lease) ends; the next
// registration of the key starts generation + 1. Generation numbers of a key
// never repeat while the coordinator runs.
struct MeshRegistration {
  std::string key;      // ValidateKey
  std::string host_id;  // the registering host (must hold `lease_id`)
  std::string lease_id;
  std::string axes;     // canonical axes ("data=2,model=4"); must match
  int64_t members = 0;  // 1..kMaxMeshMembers
  std::string token;    // join token; must match the generation's
  int64_t op_timeout_ms = 0;  // 0: none asked; else must match one asked before
  std::vector<int32_t> indices;  // member indices this host adds, 1..kMaxKeysPerRequest
};

struct MeshMembership {
  int64_t generation = 0;
  // By member index: the host id that registered it.
  std::vector<std::string> member_host;
  // The generation's hosts, ascending host id, with their addresses.
  std::vector<HostRecord> hosts;
  int64_t op_timeout_ms = 0;
  // Random bytes drawn for this generation (kMeshSecretBytes), handed only
  // to the registry's callers: what the hosts key their connections with.
  std::string secret;
};
inline constexpr size_t kMeshSecretBytes = 32;

inline constexpr int64_t kMaxMeshMembers = 65536;

// Where the hosts of generation `generation` of mesh `key` keep the store
// keys they connect through (Gloo's rendezvous: "<prefix>/<its key>"). The
// registry deletes every key under "<prefix>/" when the generation ends. The
// key's length comes first: mesh keys may hold '/', and no mesh's
// "<prefix>/" may be a prefix of another mesh's keys ("s/x" generation 1
// against "s/x/g1/y").
inline std::string MeshStorePrefix(absl::string_view key, int64_t generation) {
  return absl::StrCat("gloo/", key.size(), ":", key, "/g", generation);
}
inline constexpr size_t kMaxMeshAxesLength = 1024;
inline constexpr size_t kMaxMeshTokenBytes = 256;
// MeshLeave's reason.
inline constexpr size_t kMaxMeshReasonBytes = 1024;

struct SetOptions {
  // Replace an existing key (otherwise ALREADY_EXISTS).
  bool overwrite = false;
  // When not empty, the key belongs to this lease and is deleted when the
  // lease ends (NOT_FOUND if there is no such lease).
  std::string lease_id;
};

// The first character of `text` for which `ok` is false, quoted for an
// error message, or "" if all are fine.
template <typename Ok>
inline std::string FirstBadChar(absl::string_view text, Ok ok) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!ok(text[i])) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      return c >= 0x21 && c < 0x7f ? absl::StrCat("'", std::string(1, text[i]), "' at ", i)
                                   : absl::StrCat("byte 0x", absl::Hex(c), " at ", i);
    }
  }
  return "";
}

// Whether a certificate's name (a DNS subject alternative name or the
// common name) names host `host_id`: equal ignoring case, or a wildcard
// "*.rest" covering one leftmost label ("a.rest", not "a.b.rest"), as TLS
// host names are checked.
inline bool NameCoversHost(absl::string_view name, absl::string_view host_id) {
  auto lower = [](absl::string_view s) {
    std::string out(s);
    for (char& c : out) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    return out;
  };
  const std::string n = lower(name), h = lower(host_id);
  if (n == h) return true;
  if (n.size() < 3 || n[0] != '*' || n[1] != '.') return false;
  const size_t dot = h.find('.');
  return dot != std::string::npos && dot > 0 && h.substr(dot) == n.substr(1);
}

// 1-64 characters of [A-Za-z0-9._-].
absl::Status ValidateHostId(absl::string_view host_id);
// 1-256 printable ASCII characters without spaces.
absl::Status ValidateAddress(absl::string_view address);
// 1-256 characters of [A-Za-z0-9._/:-]; `what` names the field in the error.
absl::Status ValidateKey(absl::string_view key, absl::string_view what = "key");
// At most kMaxValueBytes.
absl::Status ValidateValue(absl::string_view value);

// A blocking Get's or MeshWait's handle (0: none).
using WaitId = uint64_t;

// The coordinator's operations. Thread-safe: every method may be called from
// any thread at the same time. No method blocks on another host: a Get that
// must wait returns at once and answers through its callback.
class Coordinator {
 public:
  using GetCallback = absl::AnyInvocable<void(absl::StatusOr<std::vector<KeyValue>>)>;

  virtual ~Coordinator() = default;

  // Grants `host_id` (advertising `address`) a new lease. A host id whose
  // lease is live is refused with ALREADY_EXISTS naming the live daemon's
  // address, unless `previous_lease_id` is that lease: a daemon that
  // restarted (or lost touch) replaces its former self at once, and the old
  // lease ends (its owned keys go too). Two daemons claiming one host id
  // never replace each other. RESOURCE_EXHAUSTED past the host cap.
  virtual absl::StatusOr<LeaseGrant> Join(absl::string_view host_id, absl::string_view address,
                                          absl::string_view previous_lease_id = {}) = 0;
  // Renews `lease_id` for a full ttl; NOT_FOUND if it has ended.
  virtual absl::Status Heartbeat(absl::string_view lease_id) = 0;
  // Ends `lease_id` at once; NOT_FOUND if it has ended already.
  virtual absl::Status Leave(absl::string_view lease_id) = 0;
  // Every host that holds a lease, ordered by host id.
  virtual std::vector<HostRecord> ListHosts() = 0;

  // Sets `key` to `value` and completes the Gets waiting for it.
  // ALREADY_EXISTS if the key exists and !options.overwrite.
  virtual absl::Status Set(absl::string_view key, absl::string_view value,
                           const SetOptions& options) = 0;
  // Calls `done` with the values of `keys` (in their order) once all exist,
  // or with DEADLINE_EXCEEDED naming the missing keys when `timeout` (capped
  // at kMaxKeyWait; zero: no wait) passes, or UNAVAILABLE at Shutdown. `done`
  // runs exactly once, on the calling thread (when the answer is known at
  // once) or on a coordinator thread, never under a coordinator lock.
  // Returns the wait's id for CancelWait, or 0 when `done` ran already.
  virtual WaitId Get(std::vector<std::string> keys, absl::Duration timeout,
                     GetCallback done) = 0;
  // Deletes `keys` and every key starting with `prefix` ("" deletes no
  // prefix); returns how many keys were deleted. Missing keys are not an
  // error.
  virtual absl::StatusOr<int64_t> Delete(const std::vector<std::string>& keys,
                                         absl::string_view prefix) = 0;

  // Adds registration.indices to the live generation of registration.key
  // (starting a new one if there is none) and returns its number. Refused,
  // changing nothing: NOT_FOUND (no such lease, or it is not host_id's),
  // FAILED_PRECONDITION (the live generation is full, or has other axes,
  // member count or op timeout), PERMISSION_DENIED (another token),
  // ALREADY_EXISTS (an index is taken; the error names the host holding it),
  // INVALID_ARGUMENT (an index out of range, repeated, or a bad field).
  virtual absl::StatusOr<int64_t> MeshRegister(const MeshRegistration& registration) = 0;
  using MeshWaitCallback = absl::AnyInvocable<void(absl::StatusOr<MeshMembership>)>;
  // Calls `done` once generation `generation` of `key` is full (its
  // membership), or ABORTED with the reason when it broke or lost members'
  // hosts before filling, DEADLINE_EXCEEDED naming the missing indices after
  // `timeout` (capped at kMaxKeyWait), NOT_FOUND for a generation the
  // registry never had, UNAVAILABLE at Shutdown. Runs like Get's callback.
  // Returns the wait's id for CancelWait, or 0 when `done` ran already.
  virtual WaitId MeshWait(std::string key, int64_t generation, absl::Duration timeout,
                          MeshWaitCallback done) = 0;
  // The waiting Get or MeshWait `id` is no longer wanted (its caller went
  // away): its `done` runs now, on this thread, with CANCELLED, and its slot
  // among the waiters is free. Nothing happens when it was answered already
  // (or `id` is 0).
  virtual void CancelWait(WaitId id) = 0;
  // Host `host_id`'s members `indices` left generation `generation` of
  // `key` while it formed (their indices are free again; a generation left
  // by every member ends), or, with `broken`, the generation broke on that
  // host for `reason`: it ends, and its MeshWait callers get ABORTED naming
  // the host and the reason. `lease_id` must be the host's live lease
  // (NOT_FOUND otherwise: nobody speaks for another host), and a host with
  // no member in the generation changes nothing. A generation that already
  // ended: OK, nothing changes. NOT_FOUND for a generation the registry
  // never had.
  virtual absl::Status MeshLeave(absl::string_view key, int64_t generation,
                                 absl::string_view host_id, absl::string_view lease_id,
                                 const std::vector<int32_t>& indices, bool broken,
                                 absl::string_view reason) = 0;

  // Completes every waiting Get with UNAVAILABLE and refuses later calls
  // (UNAVAILABLE). Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_COORDINATOR_H_
