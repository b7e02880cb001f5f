// The connection an EtcdClient and its watches share (etcd_client.h): the
// endpoints and their stubs, the endpoint in use, the auth token, the retry
// loop and the poller that keeps channels connecting; and the helpers the
// client's and the watch's files both use. Internal to daemon/cluster.

#ifndef COLLECTIVED_DAEMON_CLUSTER_ETCD_CONNECTION_H_
#define COLLECTIVED_DAEMON_CLUSTER_ETCD_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/cluster/etcd_client.h"
#include "etcd/api/etcdserverpb/rpc.grpc.pb.h"

namespace collectived {
namespace etcd_internal {

// A key for messages: quoted, escaped, cut to 80 bytes.
std::string Quote(absl::string_view key);
// "get of key \"a\"", "watch of prefix \"p/\"", "get of every key".
std::string KeyWhat(absl::string_view op, const std::string& key, bool prefix);
// The range_end that makes [key, range_end) every key starting with `key`.
std::string PrefixEnd(const std::string& key);
EtcdKeyValue FromProto(const mvccpb::KeyValue& kv);

// Pause between the attempts of a call: first, growth factor, cap.
inline constexpr absl::Duration kFirstBackoff = absl::Milliseconds(10);
inline constexpr absl::Duration kMaxBackoff = absl::Milliseconds(250);

// Pauses of 10 ms, doubling up to 250 ms, each with up to 25% jitter so
// that clients that failed together do not retry together.
class Backoff {
 public:
  absl::Duration Next() {
    const absl::Duration d = next_;
    next_ = std::min(next_ * 2, kMaxBackoff);
    thread_local std::minstd_rand rng(std::random_device{}());
    return d - d * (std::uniform_real_distribution<double>(0, 0.25)(rng));
  }
  void Reset() { next_ = kFirstBackoff; }

 private:
  absl::Duration next_ = kFirstBackoff;
};

enum class Verdict { kFail, kRetry, kReauthenticate };

// What to do after an attempt failed with `st` (as Connection::Translate
// made it).
Verdict Classify(const absl::Status& st);

// One endpoint: its channel's stubs.
struct Endpoint {
  std::string address;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
};

// What the client and its watches share: the endpoints, the one in use, the
// auth token and the retry loop. Thread-safe.
class Connection {
 public:
  explicit Connection(EtcdOptions options);
  // Stops the poller (waiting at most kPollSlice).
  ~Connection();

  const EtcdOptions& options() const { return options_; }
  size_t size() const { return endpoints_.size(); }
  Endpoint& endpoint(size_t index) { return *endpoints_[index]; }
  // Index of the endpoint in use.
  size_t current() {
    MutexLock lock(&mu_);
    return current_;
  }
  // Moves on to the next endpoint after `from` failed with `why` (nothing
  // if another thread moved on already).
  void MoveOn(size_t from, const absl::Status& why);
  bool authenticates() const { return !options_.username.empty(); }
  // The token to send; authenticates on endpoint `index` within ctx's
  // deadline when none is held. "" without a username.
  absl::StatusOr<std::string> Token(size_t index, grpc::ClientContext* ctx);
  // Forgets `token` (etcd refused it) unless another thread already has.
  void DropToken(const std::string& token);
  // Sets the metadata of a request to etcd: the token, if any, and
  // hasleader.
  static void Prepare(grpc::ClientContext* ctx, const std::string& token);

  // Runs `attempt` on the endpoint in use, failing over and retrying as the
  // header says, until it succeeds, fails for good or `deadline` passes.
  // `what` names the operation in errors ("get of key \"a\"").
  absl::Status Call(const std::string& what, absl::Time deadline,
                    absl::FunctionRef<grpc::Status(Endpoint&, grpc::ClientContext*)> attempt);

  // `s` of an attempt on `address` as a status a user can act on.
  absl::Status Translate(const grpc::Status& s, const std::string& address,
                         const std::string& what) const;

 private:
  // The poller thread: keeps a connectivity watch on every channel.
  void Poll();
  // Watches channel `index` for a change of state, for kPollSlice.
  void Arm(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu_);

  const EtcdOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
  // gRPC moves a connection attempt on (its connect, its HTTP/2 handshake)
  // only while some thread polls, and a call on a channel in
  // TRANSIENT_FAILURE fails at once without polling. Without a thread that
  // always polls, a channel whose endpoint went down and came back stays
  // failed (its attempts time out unpolled) until gRPC's backup poller, every
  // 5 s, happens to run during one. The poller waits on connectivity watches
  // of every channel (which makes it poll their connections).
  grpc::CompletionQueue poll_cq_;
  Mutex poll_mu_;
  bool poll_stopping_ ABSL_GUARDED_BY(poll_mu_) = false;
  std::thread poller_;
};

}  // namespace etcd_internal
}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_ETCD_CONNECTION_H_
