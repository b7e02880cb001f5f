#include "daemon/cluster/cluster_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/cluster/coordinator_service.h"
#include "daemon/cluster/lease_file.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

// Reconnection backoff of the coordinator channels: gRPC's default grows to
// two minutes, far longer than a lease; a restarted coordinator should be
// found again within about a second.
constexpr int kMinReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;
// A KeyGet answer holds up to kMaxKeysPerRequest values of kMaxValueBytes.
constexpr int kMaxReceiveBytes =
    static_cast<int>(kMaxKeysPerRequest * kMaxValueBytes + (1 << 20));

absl::Status FromGrpc(const grpc::Status& s, const std::string& address) {
  if (s.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  std::string what = s.error_message();
  if (code == absl::StatusCode::kUnimplemented) {
    // A server without the Cluster service answers with no text at all.
    what = absl::StrCat(
        "it does not serve the cluster coordinator (collectived.v1.Cluster)",
        what.empty() ? "" : absl::StrCat(": ", what),
        "; point --cluster at a daemon started with --coordinator, or use etcd "
        "(--cluster=etcd://HOST:PORT)");
  } else if (what.empty()) {
    what = absl::StrCat(absl::StatusCodeToString(code), " with no message (is ", address,
                        " a collectived daemon's --tcp address?)");
  }
  return absl::Status(code, absl::StrCat("coordinator ", address, ": ", what));
}

}  // namespace

const char* ClusterStateName(ClusterState state) {
  switch (state) {
    case ClusterState::kStarting: return "starting";
    case ClusterState::kJoined: return "joined";
    case ClusterState::kUnavailable: return "unavailable";
    case ClusterState::kStopped: return "stopped";
  }
  return "unknown";
}

std::string ClusterClient::description() const {
  return absl::StrJoin(options_.coordinators, ",");
}

void LogClusterState(absl::string_view host_id, ClusterState state, const absl::Status& error) {
  if (state == ClusterState::kJoined) {
    LogEvent(LogLevel::kInfo, "cluster_state",
             {{"state", ClusterStateName(state)}, {"host_id", std::string(host_id)}});
  } else {
    LogEvent(LogLevel::kWarn, "cluster_state",
             {{"state", ClusterStateName(state)}, {"host_id", std::string(host_id)},
              {"error", error.ToString()}});
  }
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(
    ClusterClientOptions options) {
  if (options.coordinators.empty()) {
    return absl::InvalidArgumentError("no coordinator address given");
  }
  for (const std::string& a : options.coordinators) {
    if (absl::Status st = ValidateAddress(a); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("coordinator ", st.message()));
    }
  }
  if (absl::Status st = ValidateHostId(options.host_id); !st.ok()) return st;
  if (absl::Status st = ValidateAddress(options.address); !st.ok()) return st;
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rpc_timeout and retry_interval must be positive");
  }
  std::unique_ptr<ClusterClient> c(new ClusterClient(std::move(options)));
  return c;
}

ClusterClient::ClusterClient(ClusterClientOptions options) : options_(std::move(options)) {
  for (const std::string& address : options_.coordinators) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinReconnectBackoffMs);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kMinReconnectBackoffMs);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
    args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
    auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
    stubs_.push_back(v1::Cluster::NewStub(grpc::CreateCustomChannel(address, creds, args)));
  }
}

ClusterClient::~ClusterClient() { Stop(/*leave=*/false); }

void ClusterClient::Start() {
  MutexLock lock(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  previous_lease_ = ReadLeaseFile(options_.lease_file);
  thread_ = std::thread([this] { Loop(); });
}

void ClusterClient::Stop(bool leave) {
  {
    MutexLock lock(&mu_);
    if (state_ == ClusterState::kStopped) return;
    stopping_ = true;
    wake_.SignalAll();
    if (loop_call_ != nullptr) loop_call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
  std::string lease;
  size_t current;
  {
    MutexLock lock(&mu_);
    lease = std::move(lease_);
    lease_.clear();
    current = current_;
    state_ = ClusterState::kStopped;
  }
  if (leave && !lease.empty()) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.rpc_timeout);
    v1::LeaveClusterRequest req;
    req.set_lease_id(lease);
    v1::LeaveClusterResponse resp;
    absl::Status st = FromGrpc(stubs_[current]->LeaveCluster(&ctx, req, &resp),
                               options_.coordinators[current]);
    LogEvent(st.ok() ? LogLevel::kInfo : LogLevel::kWarn, "cluster_left",
             {{"host_id", options_.host_id}, {"status", st.ok() ? "ok" : st.ToString()}});
  }
}

ClusterState ClusterClient::state() {
  MutexLock lock(&mu_);
  return state_;
}

std::string ClusterClient::lease_id() {
  MutexLock lock(&mu_);
  return lease_;
}

absl::Status ClusterClient::last_error() {
  MutexLock lock(&mu_);
  return last_error_;
}

bool ClusterClient::WaitForState(ClusterState want, absl::Duration timeout) {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_ == want; }, timeout);
}

void ClusterClient::PrepareContext(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.token.empty()) ctx->AddMetadata(kClusterTokenMetadataKey, options_.token);
}

void ClusterClient::SetState(ClusterState state, const absl::Status& error) {
  ClusterState before;
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    before = state_;
    state_ = state;
    last_error_ = error;
  }
  if (before != state) LogClusterState(options_.host_id, state, error);
}

grpc::Status ClusterClient::CancellableByStop(grpc::ClientContext* ctx,
                                              absl::FunctionRef<grpc::Status()> call) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::CANCELLED, "the daemon is stopping");
    loop_call_ = ctx;
  }
  grpc::Status st = call();
  MutexLock lock(&mu_);  // Stop cancels ctx only under mu_: it may go now
  loop_call_ = nullptr;
  return st;
}

bool ClusterClient::StopBegan() {
  MutexLock lock(&mu_);
  return stopping_;
}

bool ClusterClient::SleepUnlessStopping(absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  MutexLock lock(&mu_);
  while (!stopping_ && absl::Now() < deadline) wake_.WaitWithDeadline(&mu_, deadline);
  return !stopping_;
}

absl::Status ClusterClient::JoinOnce() {
  absl::Status last;
  for (size_t i = 0; i < stubs_.size(); ++i) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.rpc_timeout);
    v1::JoinClusterRequest req;
    req.set_host_id(options_.host_id);
    req.set_address(options_.address);
    req.set_previous_lease_id(previous_lease_);
    v1::JoinClusterResponse resp;
    last = FromGrpc(
        CancellableByStop(&ctx, [&] { return stubs_[i]->JoinCluster(&ctx, req, &resp); }),
        options_.coordinators[i]);
    // Another daemon holds the host id: every coordinator would say so.
    if (absl::IsAlreadyExists(last)) return last;
    if (!last.ok()) continue;
    previous_lease_ = resp.lease_id();
    if (absl::Status st = WriteLeaseFile(options_.lease_file, previous_lease_); !st.ok()) {
      LogEvent(LogLevel::kWarn, "cluster_lease_file",
               {{"error", st.ToString()},
                {"effect", "a restart of this daemon waits for its lease to end"}});
    }
    {
      MutexLock lock(&mu_);
      lease_ = resp.lease_id();
      ttl_ = absl::Milliseconds(std::max<int64_t>(3, resp.lease_ttl_ms()));
      current_ = i;
    }
    LogEvent(LogLevel::kInfo, "cluster_joined",
             {{"host_id", options_.host_id}, {"address", options_.address},
              {"coordinator", options_.coordinators[i]},
              {"lease_ttl_ms", absl::StrCat(resp.lease_ttl_ms())},
              {"hosts", absl::StrCat(resp.hosts_size())}});
    return absl::OkStatus();
  }
  return last;
}

absl::Status ClusterClient::HeartbeatOnce() {
  std::string lease;
  size_t current;
  {
    MutexLock lock(&mu_);
    lease = lease_;
    current = current_;
  }
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_.rpc_timeout);
  v1::HeartbeatRequest req;
  req.set_lease_id(lease);
  v1::HeartbeatResponse resp;
  return FromGrpc(
      CancellableByStop(&ctx, [&] { return stubs_[current]->Heartbeat(&ctx, req, &resp); }),
      options_.coordinators[current]);
}

void ClusterClient::Loop() {
  for (;;) {
    bool joined;
    absl::Duration ttl;
    ClusterState now;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      joined = !lease_.empty();
      ttl = ttl_;
      now = state_;
    }
    if (!joined) {
      absl::Status st = JoinOnce();
      if (st.ok()) {
        SetState(ClusterState::kJoined, absl::OkStatus());
        continue;
      }
      // A join Stop cancelled ends here: once stopping, SetState changes
      // nothing and the sleep returns false at once.
      SetState(ClusterState::kUnavailable, st);
      if (!SleepUnlessStopping(options_.retry_interval)) return;
      continue;
    }
    // While the coordinator does not answer, heartbeat at the retry pace
    // (within ttl/3 still) to notice its return soon.
    const absl::Duration interval =
        now == ClusterState::kJoined ? ttl / 3 : std::min(ttl / 3, options_.retry_interval);
    if (!SleepUnlessStopping(interval)) return;
    absl::Status st = HeartbeatOnce();
    // Stop cancelled it: the lease stays, for Stop's leave.
    if (absl::IsCancelled(st) && StopBegan()) return;
    if (st.ok()) {
      SetState(ClusterState::kJoined, absl::OkStatus());
      continue;
    }
    // NOT_FOUND: the lease ended (expired, or the coordinator restarted):
    // join again at once. Any other failure with several coordinators: join
    // again over all of them (another one may answer). With one coordinator
    // keep the lease: it may still be valid when the coordinator answers.
    if (st.code() == absl::StatusCode::kNotFound || stubs_.size() > 1) {
      LogEvent(LogLevel::kWarn, "cluster_lease_lost",
               {{"host_id", options_.host_id}, {"error", st.ToString()}});
      MutexLock lock(&mu_);
      lease_.clear();
    }
    if (st.code() != absl::StatusCode::kNotFound) SetState(ClusterState::kUnavailable, st);
  }
}

absl::Status ClusterClient::Set(const std::string& key, const std::string& value,
                                bool overwrite, bool owned) {
  v1::KeySetRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_overwrite(overwrite);
  size_t current;
  {
    MutexLock lock(&mu_);
    current = current_;
    if (owned) {
      if (lease_.empty()) {
        return absl::FailedPreconditionError(
            "an owned key needs a lease: this daemon has not joined the cluster");
      }
      req.set_lease_id(lease_);
    }
  }
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_.rpc_timeout);
  v1::KeySetResponse resp;
  return FromGrpc(stubs_[current]->KeySet(&ctx, req, &resp), options_.coordinators[current]);
}

template <typename Request, typename Response>
absl::Status ClusterClient::CallCurrent(
    grpc::Status (v1::Cluster::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
    const Request& req, Response* resp, absl::Duration timeout) {
  size_t current;
  {
    MutexLock lock(&mu_);
    current = current_;
  }
  grpc::ClientContext ctx;
  PrepareContext(&ctx, timeout);
  return FromGrpc((stubs_[current].get()->*rpc)(&ctx, req, resp), options_.coordinators[current]);
}

absl::StatusOr<std::vector<std::string>> ClusterClient::Get(const std::vector<std::string>& keys,
                                                            absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be >= 0");
  }
  timeout = std::min(timeout, kMaxKeyWait);
  v1::KeyGetRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::KeyGetResponse resp;
  absl::Status st =
      CallCurrent(&v1::Cluster::Stub::KeyGet, req, &resp, timeout + AnswerMargin());
  if (!st.ok()) return st;
  if (resp.entries_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("coordinator answered ", resp.entries_size(),
                                            " values for ", keys.size(), " keys"));
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (auto& e : *resp.mutable_entries()) values.push_back(std::move(*e.mutable_value()));
  return values;
}

absl::StatusOr<int64_t> ClusterClient::Delete(const std::vector<std::string>& keys,
                                              const std::string& prefix) {
  v1::KeyDeleteRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  req.set_prefix(prefix);
  v1::KeyDeleteResponse resp;
  absl::Status st = CallCurrent(&v1::Cluster::Stub::KeyDelete, req, &resp, options_.rpc_timeout);
  if (!st.ok()) return st;
  return resp.deleted();
}

absl::StatusOr<std::vector<HostRecord>> ClusterClient::ListHosts() {
  v1::ListHostsResponse resp;
  absl::Status st = CallCurrent(&v1::Cluster::Stub::ListHosts, v1::ListHostsRequest(), &resp,
                                options_.rpc_timeout);
  if (!st.ok()) return st;
  std::vector<HostRecord> out;
  for (const v1::HostInfo& h : resp.hosts()) {
    out.push_back({h.host_id(), h.address(), absl::FromUnixMillis(h.joined_at_unix_ms()),
                   absl::FromUnixMillis(h.last_heartbeat_unix_ms())});
  }
  return out;
}

absl::StatusOr<int64_t> ClusterClient::MeshRegister(MeshRegistration registration,
                                                    absl::Time deadline) {
  v1::MeshRegisterRequest req;
  {
    MutexLock lock(&mu_);
    if (lease_.empty()) return absl::FailedPreconditionError("not joined to the cluster");
    req.set_lease_id(lease_);
  }
  req.set_key(std::move(registration.key));
  req.set_host_id(options_.host_id);
  req.set_axes(std::move(registration.axes));
  req.set_members(registration.members);
  req.set_token(std::move(registration.token));
  req.set_op_timeout_ms(registration.op_timeout_ms);
  for (int32_t i : registration.indices) req.add_indices(i);
  v1::MeshRegisterResponse resp;
  // By the joiner's deadline (a few ms at least, so that a call is made).
  const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(10));
  absl::Status st = CallCurrent(&v1::Cluster::Stub::MeshRegister, req, &resp,
                                std::min(options_.rpc_timeout, left));
  if (!st.ok()) return st;
  return resp.generation();
}

absl::StatusOr<MeshMembership> ClusterClient::MeshWait(const std::string& key,
                                                       int64_t generation,
                                                       absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be >= 0");
  }
  timeout = std::min(timeout, kMaxKeyWait);
  v1::MeshWaitRequest req;
  req.set_key(key);
  req.set_generation(generation);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::MeshWaitResponse resp;
  absl::Status st =
      CallCurrent(&v1::Cluster::Stub::MeshWait, req, &resp, timeout + AnswerMargin());
  if (!st.ok()) return st;
  MeshMembership m;
  m.generation = resp.generation();
  m.op_timeout_ms = resp.op_timeout_ms();
  m.secret = resp.secret();
  for (std::string& h : *resp.mutable_member_host()) m.member_host.push_back(std::move(h));
  for (const v1::HostInfo& h : resp.hosts()) {
    m.hosts.push_back({h.host_id(), h.address(), absl::FromUnixMillis(h.joined_at_unix_ms()),
                       absl::FromUnixMillis(h.last_heartbeat_unix_ms())});
  }
  return m;
}

absl::Status ClusterClient::MeshLeave(const std::string& key, int64_t generation,
                                      const std::vector<int32_t>& indices, bool broken,
                                      const std::string& reason) {
  v1::MeshLeaveRequest req;
  {
    MutexLock lock(&mu_);
    if (lease_.empty()) return absl::FailedPreconditionError("not joined to the cluster");
    req.set_lease_id(lease_);
  }
  req.set_key(key);
  req.set_generation(generation);
  req.set_host_id(options_.host_id);
  for (int32_t i : indices) req.add_indices(i);
  req.set_broken(broken);
  req.set_reason(reason);
  v1::MeshLeaveResponse resp;
  return CallCurrent(&v1::Cluster::Stub::MeshLeave, req, &resp, options_.rpc_timeout);
}

}  // namespace collectived
