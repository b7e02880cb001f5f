// EtcdClient: a blocking client of etcd's v3 gRPC API (the subset in
// proto/etcd/api/etcdserverpb/rpc.proto): keys, transactions, leases and
// watches, for the cluster registry that keeps host membership, rendezvous
// keys and meshes in etcd.
//
// Endpoints and failover: the client talks to one endpoint at a time (the
// first at the start). A call whose attempt fails for a reason that another
// endpoint or a moment later may not share (UNAVAILABLE: the endpoint is down
// or unreachable, "etcdserver: no leader", "leader changed", "request timed
// out"; an attempt that ran out of rpc_timeout; "too many requests") moves to
// the next endpoint and tries again after a short pause (10 ms, doubling, at
// most 250 ms) until the call's deadline. Every request carries etcd's
// "hasleader" metadata, so a member cut off from its leader answers "no
// leader" at once instead of waiting. Other errors (the key or lease does not
// exist, permission denied, a bad request) are returned at once.
//
// Writes retried after an unknown outcome: when an attempt of Put, Delete,
// Txn or GrantLease broke after the request was sent (the connection dropped,
// the attempt timed out, etcd said "request timed out"), etcd may have
// applied it, and the retry applies it again: a Put then writes the value
// twice (two revisions), a Delete counts 0 keys, a GrantLease leaves a lease
// that expires unused, and a Txn may see its own earlier write and take its
// failure branch. Make transactions recognizable: write a value that only
// this writer writes, and read the key in the failure branch (EtcdTxnResult
// has what the branch read), so that "failed, but the key holds my value"
// means it succeeded.
//
// Authentication: with a username, the client authenticates (Auth.
// Authenticate) on first use and sends the token as the gRPC metadata
// "token"; when etcd rejects the token (expired, or the auth store changed)
// it authenticates again once per call and retries.
//
// Errors: every status starts with "etcd <endpoint>: ", says which operation
// failed (and on which key), and never has an empty message. A call that ran
// out of time while failing over ends with its last attempt's error, listing
// the endpoints tried, as UNAVAILABLE if any attempt found an endpoint
// unavailable (DEADLINE_EXCEEDED if every attempt only timed out).
//
// Time: every call returns by its deadline (plus a few ms); an infinite
// deadline retries until the call succeeds or fails for good. An attempt
// lasts at most rpc_timeout, which is also how long a write can take to fail
// over when a leader dies under it (the member it went to forwarded it to
// the dead leader, and etcd answers only at its own request timeout): with
// etcd's default election timeout (1 s), 1-2 s is a good rpc_timeout.
//
// Thread model: every method of EtcdClient may be called from any thread at
// once; each blocks its caller (for the registry's own threads, not for gRPC
// reactions). A client runs one thread of its own, the poller: gRPC moves a
// connection attempt on only while some thread polls, and a call on a
// failed channel fails at once without polling, so without it a restarted
// endpoint would not be reconnected to. A watch runs one more thread (see
// EtcdWatch). The client's threads stop when the client and its watches are
// all gone; the last of them to go waits up to 100 ms for the poller.
#ifndef COLLECTIVED_DAEMON_CLUSTER_ETCD_CLIENT_H_
#define COLLECTIVED_DAEMON_CLUSTER_ETCD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace etcdserverpb {
class WatchResponse;
}  // namespace etcdserverpb

namespace collectived {

namespace etcd_internal {
class Connection;
}  // namespace etcd_internal

struct EtcdOptions {
  // Client endpoints as "host:port" ("[::1]:2379" for IPv6), at least one,
  // without a scheme: TLS is chosen by `credentials`. Validated by Create.
  std::vector<std::string> endpoints;
  // Channel credentials (e.g. grpc::SslCredentials with a client
  // certificate); null means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // etcd user and password; an empty username means no authentication.
  std::string username;
  std::string password;
  // Longest time of one attempt of a call (a call makes several when it
  // fails over); must be positive.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // How long a watch whose stream broke keeps trying to resume on the
  // endpoints before it ends with UNAVAILABLE; must be positive.
  absl::Duration watch_resume_timeout = absl::Seconds(10);
};

// A key as etcd stores it. Revisions are the store's (cluster-wide, growing
// with every change); version counts the changes since the key was created.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: none
};

// What a get read: the keys in key order, the store's revision when it was
// read, how many keys are in the range (more than kvs.size() when a limit
// cut it: then `more` is true).
struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  int64_t revision = 0;
  int64_t count = 0;
  bool more = false;
};

// One comparison of a transaction: `key`'s target compared with `number`
// (version, create or mod revision, lease id; a missing key has 0 for each)
// or with `value` (a missing key fails every value comparison).
struct EtcdCompare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kNotEqual, kLess, kGreater };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t number = 0;  // every target but kValue
  std::string value;   // kValue

  static EtcdCompare Version(std::string key, Result result, int64_t version);
  static EtcdCompare CreateRevision(std::string key, Result result, int64_t revision);
  static EtcdCompare ModRevision(std::string key, Result result, int64_t revision);
  static EtcdCompare Value(std::string key, Result result, std::string value);
  static EtcdCompare Lease(std::string key, Result result, int64_t lease);
  // "The key does not exist": CreateRevision(key, kEqual, 0).
  static EtcdCompare Absent(std::string key);
};

// One operation of a transaction's branch.
struct EtcdOp {
  enum class Type { kPut, kGet, kDelete };
  Type type = Type::kGet;
  std::string key;
  std::string value;    // kPut
  int64_t lease = 0;    // kPut; 0: none
  bool prefix = false;  // kGet, kDelete: every key that starts with `key`

  static EtcdOp Put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp Get(std::string key, bool prefix = false);
  static EtcdOp Delete(std::string key, bool prefix = false);
};

struct EtcdTxnResult {
  bool succeeded = false;  // the comparisons held: the success branch ran
  int64_t revision = 0;    // the store's revision after the transaction
  // What each kGet op of the branch that ran read, in the order of the ops.
  std::vector<EtcdRange> ranges;
};

// A change seen by a watch. A delete's kv holds the key and the revision of
// the deletion (mod_revision) only; prev_kv is set when the watch asked for
// it (and etcd still had the previous value).
struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;
  std::optional<EtcdKeyValue> prev_kv;
};

struct EtcdLease {
  int64_t id = 0;
  absl::Duration ttl;  // as granted: at least 1 s and etcd's minimum
};

// LeaseTimeToLive's answer.
struct EtcdLeaseInfo {
  absl::Duration ttl;             // remaining
  absl::Duration granted_ttl;     // as granted or last renewed to
  std::vector<std::string> keys;  // attached keys, when asked for
};

// Maintenance.Status of one member.
struct EtcdMemberStatus {
  uint64_t member_id = 0;
  uint64_t leader = 0;  // member id of the leader this member knows; 0: none
  uint64_t raft_term = 0;
  int64_t revision = 0;
  std::string version;  // etcd's version, e.g. "3.4.23"
};

class EtcdWatch;

class EtcdClient {
 public:
  // Validates `options` (INVALID_ARGUMENT naming the bad field) and builds
  // one channel per endpoint; connects nothing (the first call does).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Reads `key`, or with `prefix` every key that starts with it (an empty
  // key with prefix: every key), at most `limit` keys (0: all), in key order;
  // linearizable. A missing key is an empty range, not an error.
  absl::StatusOr<EtcdRange> Get(const std::string& key, bool prefix, absl::Time deadline,
                                int64_t limit = 0);
  // Writes `key` (attached to `lease` unless 0); the store's revision of the
  // write. NOT_FOUND when the lease has ended.
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease,
                              absl::Time deadline);
  // Deletes `key` (with `prefix`: every key that starts with it; an empty
  // key with prefix: every key); how many keys were deleted (0 is no error).
  absl::StatusOr<int64_t> Delete(const std::string& key, bool prefix, absl::Time deadline);
  // If every comparison holds runs `success`, else `failure`, atomically.
  // etcd refuses (INVALID_ARGUMENT) a transaction that writes one key twice
  // or has more ops than its --max-txn-ops (128 by default).
  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compare,
                                    const std::vector<EtcdOp>& success,
                                    const std::vector<EtcdOp>& failure, absl::Time deadline);

  // Grants a lease of `ttl` (rounded up to whole seconds, at least 1 s; etcd
  // raises it to its minimum, 1.5 election timeouts). Keys put with it are
  // deleted when it ends: revoked, or not kept alive for its ttl.
  absl::StatusOr<EtcdLease> GrantLease(absl::Duration ttl, absl::Time deadline);
  // Ends lease `id` now, deleting its keys. NOT_FOUND if it already ended.
  absl::Status RevokeLease(int64_t id, absl::Time deadline);
  // Renews lease `id` once (one request on a LeaseKeepAlive stream); its new
  // ttl. NOT_FOUND once the lease has ended (expired or revoked): grant a new
  // one. Call it every ttl/3 or so.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t id, absl::Time deadline);
  // The remaining and granted ttl of lease `id` (and with `keys`, its keys).
  // NOT_FOUND once it has ended.
  absl::StatusOr<EtcdLeaseInfo> LeaseTimeToLive(int64_t id, bool keys, absl::Time deadline);

  // Watches `key` (with `prefix`: every key that starts with it) from
  // `start_revision` on (0: from the next change), with the previous values
  // of changed keys when `prev_kv`. Returns once etcd has created the watch
  // (events before this call's return, from start_revision on, are
  // delivered too); OUT_OF_RANGE if start_revision was compacted.
  absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(const std::string& key, bool prefix,
                                                   int64_t start_revision, absl::Time deadline,
                                                   bool prev_kv = false);

  // Maintenance.Status of the member at `endpoint` (one of the options'
  // endpoints; INVALID_ARGUMENT otherwise), without failover: for tests and
  // diagnostics (which member leads).
  absl::StatusOr<EtcdMemberStatus> MemberStatus(const std::string& endpoint, absl::Time deadline);

  // The endpoint the next call will try first.
  std::string endpoint();
  const std::vector<std::string>& endpoints() const;

 private:
  explicit EtcdClient(std::shared_ptr<etcd_internal::Connection> conn);
  std::shared_ptr<etcd_internal::Connection> conn_;
};

// A watch of a key or prefix: delivers every change from its start revision
// on, in revision order, each exactly once. When its stream breaks (the
// endpoint went down, or its member lost the leader) it resumes on the next
// endpoint from the revision after the last event it received, for up to
// EtcdOptions::watch_resume_timeout; after that, or when etcd ends it, Next
// returns the error.
//
// Events wait in memory until Next takes them (there is no bound): call Next
// as they come.
//
// Thread model: one thread of its own reads the stream (and resumes it);
// Next and next_revision may be called from any thread; the destructor must
// not race with them. The watch holds the client's connection, so it may
// outlive the EtcdClient.
class EtcdWatch {
 public:
  // Cancels the watch: stops its thread, waiting for it at most a few ms
  // (an attempt in progress is cancelled, not waited for; see EtcdClient
  // for the last owner of a client).
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The next batch of events (never empty; the events of one revision come
  // in one batch). DEADLINE_EXCEEDED when none came by `deadline`; once the
  // watch has ended, the error that ended it: OUT_OF_RANGE when the
  // revisions it needed were compacted (read the keys again and watch from
  // the revision of that read + 1), UNAVAILABLE when no endpoint took it
  // back within watch_resume_timeout, PERMISSION_DENIED, ... Batches that
  // came before the end are all delivered first.
  absl::StatusOr<std::vector<EtcdEvent>> Next(absl::Time deadline);
  // The revision the watch goes on from: after the last event it received
  // (or its start). A caller whose watch ended watches again from here.
  int64_t next_revision();

 private:
  friend class EtcdClient;
  EtcdWatch(std::shared_ptr<etcd_internal::Connection> conn, std::string key, std::string range_end,
            int64_t start_revision, bool prev_kv);
  // The watch thread: streams on the endpoints in turn until stopped or
  // ended.
  void Run();
  // One stream on endpoint `index`, until it breaks; the status that ended
  // it (OK only when stopped). Sets *created when etcd created the watch.
  absl::Status RunStream(size_t index, const std::string& token, bool* created);
  // Handles one response of the stream; an error ends the stream.
  absl::Status OnResponse(size_t index, const etcdserverpb::WatchResponse& response, bool* created);
  // Ends the watch with `error` (for Next).
  void End(absl::Status error);
  // Sleeps `d` unless stopped; false when stopped.
  bool SleepUnlessStopped(absl::Duration d);
  std::string Describe() const;  // "watch of key \"k\"" / "watch of prefix \"p\""

  const std::shared_ptr<etcd_internal::Connection> conn_;
  const std::string key_;
  const std::string range_end_;
  const bool prev_kv_;

  Mutex mu_;
  CondVar wake_;  // signalled by the destructor
  std::deque<std::vector<EtcdEvent>> batches_ ABSL_GUARDED_BY(mu_);
  absl::Status end_ ABSL_GUARDED_BY(mu_);         // not OK once the watch ended
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);  // of the last stream that broke
  bool created_ ABSL_GUARDED_BY(mu_) = false;     // etcd created it once
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);                   // 0: from now, until created
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the attempt
  std::thread thread_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_ETCD_CLIENT_H_
