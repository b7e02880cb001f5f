// Cluster: what a daemon does with the cluster it belongs to: it holds a
// lease (host membership, kept alive in the background), uses the
// cluster's key-value store (rendezvous of the hosts of a mesh) and its mesh
// registry (which members each host holds, generation numbers).
//
// Implementations: ClusterClient (cluster_client.h: the collectived.v1.
// Cluster service of a daemon that runs the in-memory coordinator) and
// EtcdCluster (etcd_cluster.h: the same, kept in an etcd cluster).
//
// Thread-safety: every method may be called from any thread; the store and
// registry calls block the calling thread for at most their deadline (they
// are for rendezvous threads, not for gRPC reactions).
#ifndef COLLECTIVED_DAEMON_CLUSTER_CLUSTER_H_
#define COLLECTIVED_DAEMON_CLUSTER_CLUSTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/coordinator.h"

namespace collectived {

enum class ClusterState {
  kStarting,     // not joined yet, no attempt failed yet
  kJoined,       // holds a lease
  kUnavailable,  // the last attempt reached no coordinator (or was refused)
  kStopped,
};
const char* ClusterStateName(ClusterState state);
// Logs host `host_id`'s new state (event=cluster_state; a warning with the
// error unless joined).
void LogClusterState(absl::string_view host_id, ClusterState state, const absl::Status& error);

class Cluster {
 public:
  virtual ~Cluster() = default;

  // Starts the membership thread. Call once.
  virtual void Start() = 0;
  // Stops it; with `leave`, ends the lease (bounded) if one is held.
  // Idempotent; not to be called from two threads at once.
  virtual void Stop(bool leave) = 0;

  virtual ClusterState state() = 0;
  // The held lease ("" when not joined).
  virtual std::string lease_id() = 0;
  // The last error of the membership thread (OK while joined).
  virtual absl::Status last_error() = 0;
  // Waits until state() == `want`; false after `timeout`.
  virtual bool WaitForState(ClusterState want, absl::Duration timeout) = 0;

  // The store (see Coordinator for their meaning). With `owned`, the key
  // belongs to this daemon's lease (FAILED_PRECONDITION when not joined).
  virtual absl::Status Set(const std::string& key, const std::string& value, bool overwrite,
                           bool owned = false) = 0;
  // Waits at most `timeout` (capped at kMaxKeyWait) for every key; the
  // values in the order of `keys`.
  virtual absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                                       absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> Delete(const std::vector<std::string>& keys,
                                         const std::string& prefix) = 0;
  virtual absl::StatusOr<std::vector<HostRecord>> ListHosts() = 0;

  // The mesh registry (Coordinator::MeshRegister and the rest), speaking
  // for this daemon's host id and lease (FAILED_PRECONDITION when not
  // joined). MeshRegister answers by `deadline` (the joiner's), at the
  // latest; MeshWait blocks for at most `timeout` (capped at kMaxKeyWait)
  // and a bounded call.
  virtual absl::StatusOr<int64_t> MeshRegister(MeshRegistration registration,
                                               absl::Time deadline = absl::InfiniteFuture()) = 0;
  virtual absl::StatusOr<MeshMembership> MeshWait(const std::string& key, int64_t generation,
                                                  absl::Duration timeout) = 0;
  virtual absl::Status MeshLeave(const std::string& key, int64_t generation,
                                 const std::vector<int32_t>& indices, bool broken,
                                 const std::string& reason) = 0;

  virtual const std::string& host_id() const = 0;
  virtual const std::string& address() const = 0;
  // Where the cluster is kept, for diagnostics ("127.0.0.1:7070",
  // "etcd://10.0.0.1:2379,10.0.0.2:2379").
  virtual std::string description() const = 0;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_CLUSTER_H_
