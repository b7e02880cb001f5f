// ClusterRendezvous: the engine's MeshRendezvous (daemon/core/rendezvous.h)
// on a cluster: the cluster's mesh registry (through the Cluster: the
// in-memory coordinator's client, or etcd) decides membership and
// generations, and the daemon's own transport connects the hosts of each
// formed mesh (ConnectHostMesh, addresses published in the cluster's store
// under MeshStorePrefix(mesh key, generation)), every connection
// authenticated with the generation's key (peer_auth.h: the cluster token,
// the mesh, the generation and the registry's secret for it) and, where the
// daemon has certificates, over mutual TLS.
//
// Threads: registrations and leaves go, in call order, through one thread
// (so a member's Leave never overtakes its Register); each Form runs on a
// pool of form threads, waiting on the registry in slices of at most a
// second, and connecting the hosts cancellably (TransportOptions::cancelled:
// the engine's mesh went away, or Stop), so that Stop is never held up by a
// long join timeout or a connect to hosts that never answer.
//
// Lifetime: built before the engine (whose options point at it) and before
// the cluster client exists (the daemon learns its advertised address once
// its listener is bound): calls before Attach answer UNAVAILABLE. Stop()
// after the engine has shut down and before it is destroyed: it drains the
// threads (their callbacks reach the engine) and later calls answer
// UNAVAILABLE.
#ifndef COLLECTIVED_DAEMON_CLUSTER_CLUSTER_RENDEZVOUS_H_
#define COLLECTIVED_DAEMON_CLUSTER_CLUSTER_RENDEZVOUS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/host_mesh.h"
#include "daemon/cluster/peer_stream.h"
#include "daemon/core/rendezvous.h"
#include "exec/thread_pool.h"

namespace collectived {

struct ClusterRendezvousOptions {
  // This daemon's host id (the cluster client's).
  std::string host_id;
  // How long connecting a formed mesh's hosts may take (and at most until
  // the joiners' deadline, but at least kMinConnect).
  absl::Duration connect_timeout = absl::Seconds(30);
  // The cluster's token ("" for none): with the registry's secret, the key
  // of every mesh generation's connections.
  std::string cluster_token;
  // The daemon's certificates: the connections between hosts run over
  // mutual TLS, and each host's certificate must name its host id. Null:
  // plaintext, authenticated by the key.
  std::shared_ptr<const TlsConfig> tls;
  // Meshes forming at once beyond which Forms queue.
  int form_threads = 16;
  // Whether this daemon serves the coordinator (reported in Status).
  bool serves_coordinator = false;
  // How formed meshes run their ops across hosts.
  HostMeshOptions mesh;
};

class ClusterRendezvous final : public MeshRendezvous {
 public:
  explicit ClusterRendezvous(ClusterRendezvousOptions options);
  ~ClusterRendezvous() override;
  ClusterRendezvous(const ClusterRendezvous&) = delete;
  ClusterRendezvous& operator=(const ClusterRendezvous&) = delete;

  // The cluster (must outlive Stop) and the host or address the meshes'
  // connections listen on (this daemon's advertised host).
  void Attach(Cluster* cluster, std::string bind_host);
  // Drains and joins the threads, cancelling the connects in progress;
  // later calls answer UNAVAILABLE. Idempotent.
  void Stop();

  std::string host_id() const override { return options_.host_id; }
  RendezvousStatus Status() override;
  void Register(const MeshJoinInfo& info, int index, absl::Time deadline,
                absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) override;
  void Form(const std::string& key, int64_t generation, absl::Time deadline,
            std::shared_ptr<const std::atomic<bool>> cancel,
            absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)> done) override;
  void Leave(const std::string& key, int64_t generation, std::vector<int> indices, bool broken,
             const std::string& reason) override;

 private:
  // The cluster, or UNAVAILABLE before Attach / after Stop.
  absl::StatusOr<Cluster*> Client();
  absl::StatusOr<FormedMesh> FormNow(const std::string& key, int64_t generation,
                                     absl::Time deadline,
                                     std::shared_ptr<const std::atomic<bool>> cancel);
  // FormNow's wait for the registry's membership of generation `generation`
  // of mesh `key`: in slices, riding out an unavailable coordinator, until
  // `deadline` or `cancel`. CANCELLED with `cancelled`'s message when
  // cancelled; ABORTED when the coordinator does not know the generation.
  absl::StatusOr<MeshMembership> AwaitMembership(const std::string& key, int64_t generation,
                                                 absl::Time deadline,
                                                 const std::atomic<bool>& cancel,
                                                 const absl::Status& cancelled);
  // Schedules `fn` on `pool` unless stopped (then false, nothing runs).
  bool Schedule(std::unique_ptr<ThreadPool> ClusterRendezvous::*pool, std::function<void()> fn);

  const ClusterRendezvousOptions options_;
  Mutex mu_;
  Cluster* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string bind_host_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Set first thing by Stop: the hosts' connections being made stop
  // (TransportOptions::cancelled), so that Stop never waits out a connect.
  const std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  // Scheduled on under mu_ while not stopped; Stop takes them out and joins
  // them.
  std::unique_ptr<ThreadPool> serial_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ThreadPool> forms_ ABSL_GUARDED_BY(mu_);
};

// The host part of "host:port" or "[v6]:port" (the whole string without a
// port).
std::string AddressHost(const std::string& address);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_CLUSTER_RENDEZVOUS_H_
