// EtcdCluster: the Cluster (cluster.h) kept in an etcd cluster, so that
// losing any one machine never stops new meshes from forming: no daemon is
// the coordinator; every daemon reads and writes etcd directly.
//
// Layout (under the cluster's prefix; records in
// proto/collectived/v1/etcd_records.proto):
//   - Host membership: each daemon holds an etcd lease of the cluster's
//     lease ttl, kept alive every third of it, and its host record
//     `hosts/<id>` is attached to it: a daemon gone for a ttl disappears,
//     with the store keys it owned. A host id whose record exists belongs to
//     the daemon whose lease holds it: another daemon claiming it is refused
//     (ALREADY_EXISTS naming the live daemon's address); a daemon that
//     restarted shows its previous lease (lease file) and takes the id back
//     at once (Coordinator::Join's rules).
//   - The store: `store/<key>`; a wait is a watch from the revision of the
//     read that found keys missing, so no write between them is missed.
//   - The mesh registry: one record per mesh key, `meshes/<key>`, holding
//     the live (or last) generation; every change is a transaction that
//     compares the record's mod revision with what it read (and that this
//     daemon's lease is still live), retried on a conflict, so hosts
//     registering at once never lose each other's members. The rules are
//     the in-memory registry's (mesh_registry.h), word for word. A
//     generation whose host's record is gone (its lease ended) ends, as the
//     in-memory registry ends it when a lease ends: noticed by the next
//     register, wait or leave of the key (a MeshWait watches the cluster's
//     keys, so it notices at once).
//   - Writes whose outcome is unknown (etcd applied it, then the answer was
//     lost, and the client retried) are recognized: a registration whose
//     indices this host already holds in the live generation, a store key
//     that holds what this daemon set, a host record on this daemon's own
//     lease.
//
// While etcd cannot be reached, the calls fail UNAVAILABLE naming it within
// their deadlines; running meshes never depend on etcd. etcd keeps leases
// across its own elections and restarts (it extends them), so a daemon
// keeps its host id through them.
//
// Thread model: as ClusterClient: one membership thread; every other method
// may be called from any thread and blocks for at most its deadline.
#ifndef COLLECTIVED_DAEMON_CLUSTER_ETCD_CLUSTER_H_
#define COLLECTIVED_DAEMON_CLUSTER_ETCD_CLUSTER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/etcd_client.h"

namespace collectived {

namespace v1 {
class EtcdMesh;
}  // namespace v1

struct EtcdClusterOptions {
  // etcd's endpoints, credentials and authentication (EtcdOptions).
  EtcdOptions etcd;
  // Every key of the cluster starts with this (several clusters may share
  // an etcd); must end with '/'.
  std::string prefix = "/collectived/";
  std::string host_id;
  std::string address;
  // The lease of each host (etcd rounds it up to whole seconds).
  absl::Duration lease_ttl = absl::Seconds(10);
  // Pause between attempts while etcd does not answer.
  absl::Duration retry_interval = absl::Seconds(1);
  // Where this daemon keeps its lease (lease_file.h); "": memory only.
  std::string lease_file;
};

class EtcdCluster final : public Cluster {
 public:
  // Validates the options (INVALID_ARGUMENT naming the field) and builds
  // the etcd client; connects nothing.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Create(EtcdClusterOptions options);
  ~EtcdCluster() override;
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  void Start() override;
  void Stop(bool leave) override;
  ClusterState state() override;
  std::string lease_id() override;
  absl::Status last_error() override;
  bool WaitForState(ClusterState want, absl::Duration timeout) override;

  absl::Status Set(const std::string& key, const std::string& value, bool overwrite,
                   bool owned = false) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout) override;
  absl::StatusOr<int64_t> Delete(const std::vector<std::string>& keys,
                                 const std::string& prefix) override;
  absl::StatusOr<std::vector<HostRecord>> ListHosts() override;

  absl::StatusOr<int64_t> MeshRegister(MeshRegistration registration,
                                       absl::Time deadline = absl::InfiniteFuture()) override;
  absl::StatusOr<MeshMembership> MeshWait(const std::string& key, int64_t generation,
                                          absl::Duration timeout) override;
  absl::Status MeshLeave(const std::string& key, int64_t generation,
                         const std::vector<int32_t>& indices, bool broken,
                         const std::string& reason) override;

  const std::string& host_id() const override { return options_.host_id; }
  const std::string& address() const override { return options_.address; }
  std::string description() const override;

 private:
  EtcdCluster(EtcdClusterOptions options, std::unique_ptr<EtcdClient> etcd);
  void Loop();
  absl::Status JoinOnce();
  void SetState(ClusterState state, const absl::Status& error);
  bool SleepUnlessStopping(absl::Duration d);
  int64_t lease();

  std::string HostKey(const std::string& id) const;
  std::string MeshKey(const std::string& key) const;
  std::string StoreKey(const std::string& key) const;

  // A consistent read of mesh `key`'s record and the hosts (one revision).
  struct Snapshot {
    bool exists = false;
    int64_t mod_revision = 0;
    int64_t revision = 0;
    std::unique_ptr<v1::EtcdMesh> mesh;
    std::map<std::string, HostRecord> hosts;  // by host id
    std::map<std::string, int64_t> host_lease;
  };
  absl::StatusOr<Snapshot> Read(const std::string& key, absl::Time deadline);
  // Ends the live generation of `snap` for `reason` (in the record; the
  // caller writes it), and adds the deletion of its store keys to `ops`.
  void End(const std::string& key, v1::EtcdMesh& mesh, const std::string& reason,
           std::vector<EtcdOp>* ops);
  // The hosts of the live generation whose record is gone ("" if none).
  static std::string GoneHosts(const v1::EtcdMesh& mesh, const Snapshot& snap);
  // Waits (until `deadline`) for any change under the cluster's prefix
  // after `revision`; false when none came.
  bool WaitForChange(std::unique_ptr<EtcdWatch>& watch, int64_t revision, absl::Time deadline);
  // The deadline of a call that is not a wait.
  absl::Time CallDeadline() const;

  const EtcdClusterOptions options_;
  const std::unique_ptr<EtcdClient> etcd_;
  Mutex mu_;
  CondVar wake_;
  ClusterState state_ ABSL_GUARDED_BY(mu_) = ClusterState::kStarting;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not joined
  absl::Duration ttl_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // The lease held last (only the membership thread uses it).
  int64_t previous_lease_ = 0;
  std::thread thread_;
};

// "etcd://HOST:PORT[,HOST:PORT...]" (or "etcds://" for TLS): the
// endpoints; INVALID_ARGUMENT when it is not of that shape. `tls` says
// which scheme it was.
absl::StatusOr<std::vector<std::string>> ParseEtcdAddress(const std::string& address, bool* tls);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_ETCD_CLUSTER_H_
