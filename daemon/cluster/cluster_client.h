// ClusterClient: a daemon's membership of a cluster and its access to the
// coordinator's key-value store.
//
// Start() runs one background thread that joins the coordinator (trying each
// address in turn), heartbeats every ttl/3, joins again when the lease is
// lost (NOT_FOUND: it expired, or the coordinator restarted) and keeps
// retrying, every retry_interval, while no coordinator answers. It never
// makes the daemon fail: state() says where it stands, and every change of
// state is logged (event=cluster_state).
//
// Every RPC has a deadline (rpc_timeout; a Get's or MeshWait's wait plus at
// most half a second).
// Thread-safety: every method may be called from any thread; Set/Get/Delete
// block the calling thread for at most their deadline (they are for
// rendezvous, not for gRPC reactions).
#ifndef COLLECTIVED_DAEMON_CLUSTER_CLUSTER_CLIENT_H_
#define COLLECTIVED_DAEMON_CLUSTER_CLUSTER_CLIENT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectived/v1/cluster.grpc.pb.h"
#include "common/sync.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/coordinator.h"

namespace collectived {

struct ClusterClientOptions {
  // Coordinator addresses (host:port), tried in order until one answers.
  std::vector<std::string> coordinators;
  // This daemon's host id and advertised address (validated by Create).
  std::string host_id;
  std::string address;
  // The cluster join token ("" sends none).
  std::string token;
  // Channel credentials; null means plaintext (main() allows that on loopback
  // or with --cluster-plaintext only).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Deadline of every RPC (a Get adds its wait).
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Pause between attempts while no coordinator answers.
  absl::Duration retry_interval = absl::Seconds(1);
  // Where this daemon keeps its lease (lease_file.h), so that it takes its
  // host id back at once when it restarts ("" keeps it in memory only).
  std::string lease_file;
};

class ClusterClient final : public Cluster {
 public:
  // Validates the options (INVALID_ARGUMENT) and builds the channels; starts
  // nothing.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Create(ClusterClientOptions options);
  // Stop(/*leave=*/false) if still running.
  ~ClusterClient() override;
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Starts the membership thread. Call once.
  void Start() override;
  // Stops the thread (waiting for an RPC in flight, at most rpc_timeout);
  // with `leave`, ends the lease (LeaveCluster, within rpc_timeout) if one is
  // held. Idempotent; not to be called from two threads at once.
  void Stop(bool leave) override;

  ClusterState state() override;
  // The held lease ("" when not joined).
  std::string lease_id() override;
  // The last error of the membership thread (OK while joined).
  absl::Status last_error() override;
  // Waits until state() == `want`; false after `timeout`.
  bool WaitForState(ClusterState want, absl::Duration timeout) override;

  // Store operations on the coordinator that answered last (see
  // Coordinator for their meaning). With `owned`, the key belongs to this
  // daemon's lease (FAILED_PRECONDITION when not joined).
  absl::Status Set(const std::string& key, const std::string& value, bool overwrite,
                   bool owned = false) override;
  // Waits at most `timeout` (capped at kMaxKeyWait) for every key; the
  // values in the order of `keys`.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout) override;
  absl::StatusOr<int64_t> Delete(const std::vector<std::string>& keys,
                                 const std::string& prefix) override;
  absl::StatusOr<std::vector<HostRecord>> ListHosts() override;

  // The mesh registry (Coordinator::MeshRegister and the rest) on the
  // coordinator in use. MeshRegister fills in this daemon's host id and
  // lease (FAILED_PRECONDITION when not joined); MeshWait blocks for at most
  // `timeout` (capped at kMaxKeyWait) plus rpc_timeout; MeshLeave speaks
  // for this daemon's host id.
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
  const std::vector<std::string>& coordinators() const { return options_.coordinators; }

 private:
  explicit ClusterClient(ClusterClientOptions options);
  void Loop();
  // One join attempt over every coordinator; sets lease_ and current_.
  absl::Status JoinOnce();
  absl::Status HeartbeatOnce();
  void SetState(ClusterState state, const absl::Status& error);
  void PrepareContext(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // `rpc` of the coordinator in use, with deadline `timeout`; the answer as
  // a status naming that coordinator.
  template <typename Request, typename Response>
  absl::Status CallCurrent(grpc::Status (v1::Cluster::Stub::*rpc)(grpc::ClientContext*,
                                                                 const Request&, Response*),
                           const Request& req, Response* resp, absl::Duration timeout);
  // How long past a waiting call's wait its answer may take: the
  // coordinator answers when the wait ends, so a call whose caller has a
  // deadline never outlasts it by more than this (a hung coordinator
  // included).
  absl::Duration AnswerMargin() const {
    return std::min(options_.rpc_timeout, absl::Milliseconds(500));
  }
  // Whether Stop has begun.
  bool StopBegan();
  // Sleeps `d` unless stopping; false when stopping.
  bool SleepUnlessStopping(absl::Duration d);
  // Makes `call`, an RPC of the membership thread on `ctx`, one that Stop
  // cancels (so that Stop does not wait up to rpc_timeout for a coordinator
  // that does not answer). CANCELLED without calling it once Stop began.
  grpc::Status CancellableByStop(grpc::ClientContext* ctx,
                                 absl::FunctionRef<grpc::Status()> call);

  const ClusterClientOptions options_;
  std::vector<std::unique_ptr<v1::Cluster::Stub>> stubs_;
  Mutex mu_;
  CondVar wake_;  // signalled by Stop
  ClusterState state_ ABSL_GUARDED_BY(mu_) = ClusterState::kStarting;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  std::string lease_ ABSL_GUARDED_BY(mu_);
  // The lease held last (shown when joining again; from lease_file at
  // start). Only the membership thread uses it.
  std::string previous_lease_;
  absl::Duration ttl_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;  // index of the coordinator in use
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The membership thread's RPC in flight (CancellableByStop), or null.
  grpc::ClientContext* loop_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_CLUSTER_CLIENT_H_
