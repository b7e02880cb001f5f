#include "daemon/cluster/etcd_client.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "daemon/util/log.h"
#include "etcd/api/etcdserverpb/rpc.grpc.pb.h"

namespace collectived {
namespace etcd_internal {
namespace {

// Reconnection backoff of the channels: gRPC's default grows to two minutes;
// a restarted member should be found again within about a second.
constexpr int kMinReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 1000;
// HTTP/2 keepalive pings, so that a watch on a member that vanished without
// closing its connection (a cut network) breaks and resumes elsewhere. etcd
// answers pings more frequent than --grpc-keepalive-min-time (5 s by
// default) with GOAWAY.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 5000;
// Largest answer accepted: a get of a large prefix, a watch batch.
constexpr int kMaxReceiveBytes = 256 << 20;
// Pause between the attempts of a call: first, growth factor, cap.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(10);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(250);
// etcd's own limit on a lease's ttl (lease.MaxLeaseTTL).
constexpr int64_t kMaxLeaseTtlSeconds = 9000000000;
// How long each connectivity watch of the poller lasts (and so the longest
// the last owner of a client waits for the poller to stop).
constexpr absl::Duration kPollSlice = absl::Milliseconds(100);
// Keys quoted in messages are cut to this many bytes.
constexpr size_t kMaxQuotedKey = 80;

// gRPC metadata etcd reads: the auth token, and "fail at once when this
// member has no leader" (rpctypes.MetadataRequireLeaderKey).
constexpr char kTokenKey[] = "token";
constexpr char kRequireLeaderKey[] = "hasleader";
constexpr char kRequireLeaderValue[] = "true";

std::string Quote(absl::string_view key) {
  if (key.size() <= kMaxQuotedKey) return absl::StrCat("\"", absl::CHexEscape(key), "\"");
  return absl::StrCat("\"", absl::CHexEscape(key.substr(0, kMaxQuotedKey)), "...\" (", key.size(),
                      " bytes)");
}

std::string KeyWhat(absl::string_view op, const std::string& key, bool prefix) {
  if (prefix && key.empty()) return absl::StrCat(op, " of every key");
  return absl::StrCat(op, prefix ? " of prefix " : " of key ", Quote(key));
}

// The range_end that makes [key, range_end) every key starting with `key`.
std::string PrefixEnd(const std::string& key) {
  std::string end = key;
  while (!end.empty()) {
    const unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  // Empty key, or only 0xff bytes: "\0" means every key >= key.
  return std::string(1, '\0');
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

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

}  // namespace

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

namespace {

enum class Verdict { kFail, kRetry, kReauthenticate };

// What to do after an attempt failed with `st` (as Translate made it).
Verdict Classify(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return Verdict::kRetry;
    case absl::StatusCode::kResourceExhausted:
      return absl::StrContains(st.message(), "too many requests") ? Verdict::kRetry
                                                                  : Verdict::kFail;
    case absl::StatusCode::kUnauthenticated:
      return absl::StrContains(st.message(), "invalid auth token") ? Verdict::kReauthenticate
                                                                   : Verdict::kFail;
    case absl::StatusCode::kInvalidArgument:
      return absl::StrContains(st.message(), "revision of auth store is old")
                 ? Verdict::kReauthenticate
                 : Verdict::kFail;
    default:
      return Verdict::kFail;
  }
}

}  // namespace

Connection::Connection(EtcdOptions options) : options_(std::move(options)) {
  for (const std::string& address : options_.endpoints) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinReconnectBackoffMs);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kMinReconnectBackoffMs);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
    auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
    auto channel = grpc::CreateCustomChannel(address, creds, args);
    channels_.push_back(channel);
    auto e = std::make_unique<Endpoint>();
    e->address = address;
    e->kv = etcdserverpb::KV::NewStub(channel);
    e->lease = etcdserverpb::Lease::NewStub(channel);
    e->watch = etcdserverpb::Watch::NewStub(channel);
    e->auth = etcdserverpb::Auth::NewStub(channel);
    e->maintenance = etcdserverpb::Maintenance::NewStub(channel);
    endpoints_.push_back(std::move(e));
  }
  poller_ = std::thread([this] { Poll(); });
}

Connection::~Connection() {
  {
    MutexLock lock(&poll_mu_);
    poll_stopping_ = true;
    poll_cq_.Shutdown();
  }
  poller_.join();
}

void Connection::Arm(size_t index) {
  std::shared_ptr<grpc::Channel>& channel = channels_[index];
  channel->NotifyOnStateChange(channel->GetState(/*try_to_connect=*/false),
                               absl::ToChronoTime(absl::Now() + kPollSlice), &poll_cq_,
                               reinterpret_cast<void*>(static_cast<uintptr_t>(index)));
}

void Connection::Poll() {
  {
    MutexLock lock(&poll_mu_);
    if (poll_stopping_) return;
    for (size_t i = 0; i < channels_.size(); ++i) Arm(i);
  }
  void* tag = nullptr;
  bool ok = false;
  while (poll_cq_.Next(&tag, &ok)) {
    MutexLock lock(&poll_mu_);
    if (!poll_stopping_) Arm(static_cast<size_t>(reinterpret_cast<uintptr_t>(tag)));
  }
}

void Connection::MoveOn(size_t from, const absl::Status& why) {
  if (endpoints_.size() < 2) return;
  size_t to;
  {
    MutexLock lock(&mu_);
    if (current_ != from) return;
    to = current_ = (from + 1) % endpoints_.size();
  }
  LogEvent(LogLevel::kInfo, "etcd_failover",
           {{"from", endpoints_[from]->address},
            {"to", endpoints_[to]->address},
            {"error", std::string(why.message())}});
}

void Connection::Prepare(grpc::ClientContext* ctx, const std::string& token) {
  if (!token.empty()) ctx->AddMetadata(kTokenKey, token);
  ctx->AddMetadata(kRequireLeaderKey, kRequireLeaderValue);
}

absl::StatusOr<std::string> Connection::Token(size_t index, grpc::ClientContext* ctx) {
  if (!authenticates()) return std::string();
  {
    MutexLock lock(&mu_);
    if (!token_.empty()) return token_;
  }
  Endpoint& e = endpoint(index);
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.username);
  req.set_password(options_.password);
  etcdserverpb::AuthenticateResponse resp;
  Prepare(ctx, "");
  const grpc::Status s = e.auth->Authenticate(ctx, req, &resp);
  if (!s.ok()) {
    return Translate(s, e.address,
                     absl::StrCat("authentication as user ", Quote(options_.username)));
  }
  if (resp.token().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", e.address, ": authentication as user ", Quote(options_.username),
                     " returned no token; is authentication enabled there (etcdctl auth enable)?"));
  }
  MutexLock lock(&mu_);
  token_ = resp.token();
  return token_;
}

void Connection::DropToken(const std::string& token) {
  MutexLock lock(&mu_);
  if (token_ == token) token_.clear();
}

absl::Status Connection::Translate(const grpc::Status& s, const std::string& address,
                                   const std::string& what) const {
  if (s.ok()) return absl::OkStatus();
  absl::StatusCode code = static_cast<absl::StatusCode>(s.error_code());
  const std::string& message = s.error_message();
  const bool from_etcd = absl::StartsWith(message, "etcdserver: ");
  std::string detail;
  if (message.empty()) {
    detail = absl::StrCat(CodeName(s.error_code()), " with no message from the server");
  } else {
    detail = message;
  }
  // Hints, by what etcd (or gRPC) said.
  if (code == absl::StatusCode::kUnimplemented) {
    detail = absl::StrCat("the server does not implement this call (", detail,
                          "); is this an etcd v3 server, version 3.4 or later?");
  } else if (code == absl::StatusCode::kUnavailable && !from_etcd) {
    detail = absl::StrCat(
        "cannot reach etcd (is it running and listening there, with TLS "
        "exactly when credentials are given?): ",
        detail);
  } else if (code == absl::StatusCode::kDeadlineExceeded && !from_etcd) {
    detail = absl::StrCat("no answer in time (", detail, ")");
  } else if (absl::StrContains(message, "no leader")) {
    detail = absl::StrCat(
        "the etcd cluster has no leader (an election is under way, or too "
        "few members are up) (",
        message, ")");
  } else if (absl::StrContains(message, "leader changed")) {
    detail = absl::StrCat("etcd's leader changed during the request (", message, ")");
  } else if (absl::StrContains(message, "request timed out")) {
    detail = absl::StrCat("etcd did not commit the request in time; it may still be applied (",
                          message, ")");
  } else if (absl::StrContains(message, "authentication failed")) {
    code = absl::StatusCode::kUnauthenticated;
    detail = absl::StrCat("wrong user name or password for user ", Quote(options_.username), " (",
                          message, ")");
  } else if (absl::StrContains(message, "user name is empty")) {
    code = absl::StatusCode::kUnauthenticated;
    detail =
        absl::StrCat("etcd requires authentication: give a username and password (", message, ")");
  } else if (absl::StrContains(message, "authentication is not enabled")) {
    detail = absl::StrCat(
        "a username is given but etcd has authentication disabled: give no "
        "username, or enable authentication (etcdctl auth enable) (",
        message, ")");
  } else if (absl::StrContains(message, "invalid auth token")) {
    detail = absl::StrCat(
        "etcd refused the auth token (it expired, or the auth store "
        "changed) (",
        message, ")");
  } else if (code == absl::StatusCode::kPermissionDenied) {
    detail = absl::StrCat("permission denied: user ", Quote(options_.username),
                          " has no role that allows this (", message, ")");
  } else if (absl::StrContains(message, "requested lease not found")) {
    detail = absl::StrCat(
        "the lease has ended (expired or revoked) or never existed: grant a "
        "new one (",
        message, ")");
  } else if (absl::StrContains(message, "database space exceeded")) {
    detail = absl::StrCat(
        "etcd's database is full: compact and defragment it, or raise "
        "--quota-backend-bytes (",
        message, ")");
  }
  return absl::Status(code, absl::StrCat("etcd ", address, ": ", what, ": ", detail));
}

absl::Status Connection::Call(
    const std::string& what, absl::Time deadline,
    absl::FunctionRef<grpc::Status(Endpoint&, grpc::ClientContext*)> attempt) {
  Backoff backoff;
  absl::Status last;
  bool unavailable = false;
  bool reauthenticated = false;
  int attempts = 0;
  absl::flat_hash_set<size_t> tried;
  for (;;) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      if (last.ok()) {
        return absl::DeadlineExceededError(
            absl::StrCat("etcd ", endpoint(current()).address, ": ", what,
                         ": the deadline had passed before the first attempt"));
      }
      std::vector<std::string> names;
      for (size_t i = 0; i < endpoints_.size(); ++i) {
        if (tried.contains(i)) names.push_back(endpoints_[i]->address);
      }
      return absl::Status(
          unavailable ? absl::StatusCode::kUnavailable : last.code(),
          absl::StrCat(last.message(), " [no etcd endpoint answered before the deadline; ",
                       attempts, attempts == 1 ? " attempt" : " attempts", " on ",
                       absl::StrJoin(names, ", "), "]"));
    }
    const size_t index = current();
    Endpoint& e = endpoint(index);
    const absl::Time attempt_deadline = std::min(deadline, now + options_.rpc_timeout);
    ++attempts;
    tried.insert(index);
    absl::Status st;
    std::string token;
    if (authenticates()) {
      grpc::ClientContext auth_ctx;
      auth_ctx.set_deadline(absl::ToChronoTime(attempt_deadline));
      absl::StatusOr<std::string> t = Token(index, &auth_ctx);
      if (t.ok()) {
        token = *std::move(t);
      } else {
        st = t.status();
      }
    }
    if (st.ok()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(attempt_deadline));
      Prepare(&ctx, token);
      st = Translate(attempt(e, &ctx), e.address, what);
      if (st.ok()) return st;
    }
    switch (Classify(st)) {
      case Verdict::kFail:
        return st;
      case Verdict::kReauthenticate:
        if (reauthenticated) return st;
        reauthenticated = true;
        DropToken(token);
        continue;
      case Verdict::kRetry:
        break;
    }
    last = st;
    unavailable = unavailable || st.code() == absl::StatusCode::kUnavailable;
    MoveOn(index, st);
    const absl::Duration pause = std::min(backoff.Next(), deadline - absl::Now());
    if (pause > absl::ZeroDuration()) absl::SleepFor(pause);
  }
}

}  // namespace etcd_internal

using etcd_internal::Connection;
using etcd_internal::Endpoint;
using etcd_internal::KeyWhat;
using etcd_internal::kMaxLeaseTtlSeconds;
using etcd_internal::PrefixEnd;
using etcd_internal::Quote;

namespace {

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

EtcdRange FromProto(const etcdserverpb::RangeResponse& resp, int64_t revision) {
  EtcdRange out;
  out.kvs.reserve(resp.kvs_size());
  for (const mvccpb::KeyValue& kv : resp.kvs()) out.kvs.push_back(FromProto(kv));
  out.revision = resp.has_header() ? resp.header().revision() : revision;
  out.count = resp.count();
  out.more = resp.more();
  return out;
}

// INVALID_ARGUMENT for a key that must not be empty.
absl::Status CheckKey(absl::string_view op, const std::string& key, bool prefix) {
  if (key.empty() && !prefix) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd ", op, ": the key is empty; give a key (or an empty key with prefix for every key)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEndpoint(const std::string& endpoint) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint ", Quote(endpoint), " ", why,
                     "; give host:port, e.g. 127.0.0.1:2379 or [::1]:2379"));
  };
  if (endpoint.empty()) return bad("is empty");
  if (absl::StrContains(endpoint, "://")) {
    return bad("has a scheme (TLS is chosen by the credentials, not by https://)");
  }
  for (char c : endpoint) {
    if (c <= 0x20 || c >= 0x7f) return bad("has a space or a non-printable character");
  }
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return bad("has no port");
  const std::string host = endpoint.substr(0, colon);
  const std::string port = endpoint.substr(colon + 1);
  if (host.empty()) return bad("has no host");
  if (host.front() == '[' ? host.back() != ']' : absl::StrContains(host, ':')) {
    return bad("has an IPv6 address without brackets");
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535 ||
      !std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) {
    return bad("has no port number from 1 to 65535");
  }
  return absl::OkStatus();
}

etcdserverpb::RequestOp ToProto(const EtcdOp& op) {
  etcdserverpb::RequestOp out;
  switch (op.type) {
    case EtcdOp::Type::kPut: {
      etcdserverpb::PutRequest* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case EtcdOp::Type::kGet: {
      etcdserverpb::RangeRequest* range = out.mutable_request_range();
      range->set_key(op.key);
      if (op.prefix) range->set_range_end(PrefixEnd(op.key));
      break;
    }
    case EtcdOp::Type::kDelete: {
      etcdserverpb::DeleteRangeRequest* del = out.mutable_request_delete_range();
      del->set_key(op.key);
      if (op.prefix) del->set_range_end(PrefixEnd(op.key));
      break;
    }
  }
  return out;
}

etcdserverpb::Compare ToProto(const EtcdCompare& c) {
  etcdserverpb::Compare out;
  out.set_key(c.key);
  switch (c.result) {
    case EtcdCompare::Result::kEqual:
      out.set_result(etcdserverpb::Compare::EQUAL);
      break;
    case EtcdCompare::Result::kNotEqual:
      out.set_result(etcdserverpb::Compare::NOT_EQUAL);
      break;
    case EtcdCompare::Result::kLess:
      out.set_result(etcdserverpb::Compare::LESS);
      break;
    case EtcdCompare::Result::kGreater:
      out.set_result(etcdserverpb::Compare::GREATER);
      break;
  }
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      out.set_target(etcdserverpb::Compare::VERSION);
      out.set_version(c.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      out.set_target(etcdserverpb::Compare::CREATE);
      out.set_create_revision(c.number);
      break;
    case EtcdCompare::Target::kModRevision:
      out.set_target(etcdserverpb::Compare::MOD);
      out.set_mod_revision(c.number);
      break;
    case EtcdCompare::Target::kValue:
      out.set_target(etcdserverpb::Compare::VALUE);
      out.set_value(c.value);
      break;
    case EtcdCompare::Target::kLease:
      out.set_target(etcdserverpb::Compare::LEASE);
      out.set_lease(c.number);
      break;
  }
  return out;
}

absl::Status CheckOps(const std::vector<EtcdOp>& ops, absl::string_view branch) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].key.empty() && !(ops[i].prefix && ops[i].type != EtcdOp::Type::kPut)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd txn: op ", i, " of the ", branch,
          " branch has an empty key; give a key (or an empty key with prefix for a get or "
          "delete of every key)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// --- EtcdCompare, EtcdOp ---

EtcdCompare EtcdCompare::Version(std::string key, Result result, int64_t version) {
  return {std::move(key), Target::kVersion, result, version, ""};
}
EtcdCompare EtcdCompare::CreateRevision(std::string key, Result result, int64_t revision) {
  return {std::move(key), Target::kCreateRevision, result, revision, ""};
}
EtcdCompare EtcdCompare::ModRevision(std::string key, Result result, int64_t revision) {
  return {std::move(key), Target::kModRevision, result, revision, ""};
}
EtcdCompare EtcdCompare::Value(std::string key, Result result, std::string value) {
  return {std::move(key), Target::kValue, result, 0, std::move(value)};
}
EtcdCompare EtcdCompare::Lease(std::string key, Result result, int64_t lease) {
  return {std::move(key), Target::kLease, result, lease, ""};
}
EtcdCompare EtcdCompare::Absent(std::string key) {
  return CreateRevision(std::move(key), Result::kEqual, 0);
}

EtcdOp EtcdOp::Put(std::string key, std::string value, int64_t lease) {
  return {Type::kPut, std::move(key), std::move(value), lease, false};
}
EtcdOp EtcdOp::Get(std::string key, bool prefix) {
  return {Type::kGet, std::move(key), "", 0, prefix};
}
EtcdOp EtcdOp::Delete(std::string key, bool prefix) {
  return {Type::kDelete, std::move(key), "", 0, prefix};
}

// --- EtcdClient ---

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError(
        "etcd: no endpoint given; give at least one host:port, e.g. 127.0.0.1:2379");
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& e : options.endpoints) {
    if (absl::Status st = ValidateEndpoint(e); !st.ok()) return st;
    if (!seen.insert(e).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint ", Quote(e), " is given twice; give each once"));
    }
  }
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.watch_resume_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd: rpc_timeout (", absl::FormatDuration(options.rpc_timeout),
                     ") and watch_resume_timeout (",
                     absl::FormatDuration(options.watch_resume_timeout), ") must be positive"));
  }
  if (options.username.empty() && !options.password.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a password is given without a username; give both or neither");
  }
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(std::make_shared<Connection>(std::move(options))));
}

EtcdClient::EtcdClient(std::shared_ptr<Connection> conn) : conn_(std::move(conn)) {}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoint() { return conn_->endpoint(conn_->current()).address; }

const std::vector<std::string>& EtcdClient::endpoints() const { return conn_->options().endpoints; }

absl::StatusOr<EtcdRange> EtcdClient::Get(const std::string& key, bool prefix, absl::Time deadline,
                                          int64_t limit) {
  if (absl::Status st = CheckKey("get", key, prefix); !st.ok()) return st;
  if (limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd get: limit is ", limit, "; give 0 (no limit) or more"));
  }
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  if (prefix) req.set_range_end(PrefixEnd(key));
  req.set_limit(limit);
  etcdserverpb::RangeResponse resp;
  absl::Status st = conn_->Call(KeyWhat("get", key, prefix), deadline,
                                [&](Endpoint& e, grpc::ClientContext* ctx) {
                                  resp.Clear();
                                  return e.kv->Range(ctx, req, &resp);
                                });
  if (!st.ok()) return st;
  return FromProto(resp, 0);
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key, const std::string& value,
                                        int64_t lease, absl::Time deadline) {
  if (absl::Status st = CheckKey("put", key, false); !st.ok()) return st;
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  absl::Status st =
      conn_->Call(KeyWhat("put", key, false), deadline, [&](Endpoint& e, grpc::ClientContext* ctx) {
        resp.Clear();
        return e.kv->Put(ctx, req, &resp);
      });
  if (!st.ok()) return st;
  return resp.header().revision();
}

absl::StatusOr<int64_t> EtcdClient::Delete(const std::string& key, bool prefix,
                                           absl::Time deadline) {
  if (absl::Status st = CheckKey("delete", key, prefix); !st.ok()) return st;
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  if (prefix) req.set_range_end(PrefixEnd(key));
  etcdserverpb::DeleteRangeResponse resp;
  absl::Status st = conn_->Call(KeyWhat("delete", key, prefix), deadline,
                                [&](Endpoint& e, grpc::ClientContext* ctx) {
                                  resp.Clear();
                                  return e.kv->DeleteRange(ctx, req, &resp);
                                });
  if (!st.ok()) return st;
  return resp.deleted();
}

absl::StatusOr<EtcdTxnResult> EtcdClient::Txn(const std::vector<EtcdCompare>& compare,
                                              const std::vector<EtcdOp>& success,
                                              const std::vector<EtcdOp>& failure,
                                              absl::Time deadline) {
  for (size_t i = 0; i < compare.size(); ++i) {
    if (compare[i].key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd txn: comparison ", i, " has an empty key; give a key"));
    }
  }
  if (absl::Status st = CheckOps(success, "success"); !st.ok()) return st;
  if (absl::Status st = CheckOps(failure, "failure"); !st.ok()) return st;
  etcdserverpb::TxnRequest req;
  for (const EtcdCompare& c : compare) *req.add_compare() = ToProto(c);
  for (const EtcdOp& op : success) *req.add_success() = ToProto(op);
  for (const EtcdOp& op : failure) *req.add_failure() = ToProto(op);
  std::string what = "txn";
  if (!compare.empty()) {
    absl::StrAppend(&what, " on key ", Quote(compare[0].key),
                    compare.size() > 1 ? absl::StrCat(" and ", compare.size() - 1, " more") : "");
  }
  etcdserverpb::TxnResponse resp;
  absl::Status st = conn_->Call(what, deadline, [&](Endpoint& e, grpc::ClientContext* ctx) {
    resp.Clear();
    return e.kv->Txn(ctx, req, &resp);
  });
  if (!st.ok()) return st;
  EtcdTxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  const std::vector<EtcdOp>& ran = out.succeeded ? success : failure;
  for (size_t i = 0; i < ran.size() && i < static_cast<size_t>(resp.responses_size()); ++i) {
    if (ran[i].type != EtcdOp::Type::kGet) continue;
    out.ranges.push_back(
        FromProto(resp.responses(static_cast<int>(i)).response_range(), out.revision));
  }
  return out;
}

absl::StatusOr<EtcdLease> EtcdClient::GrantLease(absl::Duration ttl, absl::Time deadline) {
  if (ttl <= absl::ZeroDuration() || ttl > absl::Seconds(kMaxLeaseTtlSeconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd lease grant: ttl is ", absl::FormatDuration(ttl),
                     "; give more than 0 and at most ", kMaxLeaseTtlSeconds, " s"));
  }
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse resp;
  std::string used;
  absl::Status st =
      conn_->Call("lease grant", deadline, [&](Endpoint& e, grpc::ClientContext* ctx) {
        resp.Clear();
        used = e.address;
        return e.lease->LeaseGrant(ctx, req, &resp);
      });
  if (!st.ok()) return st;
  if (!resp.error().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", used, ": lease grant: ", resp.error()));
  }
  return EtcdLease{resp.id(), absl::Seconds(resp.ttl())};
}

absl::Status EtcdClient::RevokeLease(int64_t id, absl::Time deadline) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  return conn_->Call(absl::StrCat("revoke of lease ", id), deadline,
                     [&](Endpoint& e, grpc::ClientContext* ctx) {
                       resp.Clear();
                       return e.lease->LeaseRevoke(ctx, req, &resp);
                     });
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t id, absl::Time deadline) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse resp;
  std::string used;
  const std::string what = absl::StrCat("keep-alive of lease ", id);
  absl::Status st = conn_->Call(what, deadline, [&](Endpoint& e, grpc::ClientContext* ctx) {
    resp.Clear();
    used = e.address;
    auto stream = e.lease->LeaseKeepAlive(ctx);
    if (!stream->Write(req) || !stream->Read(&resp)) return stream->Finish();
    stream->WritesDone();
    // The answer is in; how the stream ends does not change it.
    (void)stream->Finish();
    return grpc::Status::OK;
  });
  if (!st.ok()) return st;
  if (resp.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat(
        "etcd ", used, ": ", what, ": the lease has ended (expired or revoked); grant a new one"));
  }
  return absl::Seconds(resp.ttl());
}

absl::StatusOr<EtcdLeaseInfo> EtcdClient::LeaseTimeToLive(int64_t id, bool keys,
                                                          absl::Time deadline) {
  etcdserverpb::LeaseTimeToLiveRequest req;
  req.set_id(id);
  req.set_keys(keys);
  etcdserverpb::LeaseTimeToLiveResponse resp;
  std::string used;
  const std::string what = absl::StrCat("time-to-live of lease ", id);
  absl::Status st = conn_->Call(what, deadline, [&](Endpoint& e, grpc::ClientContext* ctx) {
    resp.Clear();
    used = e.address;
    return e.lease->LeaseTimeToLive(ctx, req, &resp);
  });
  if (!st.ok()) return st;
  if (resp.ttl() < 0) {
    return absl::NotFoundError(absl::StrCat(
        "etcd ", used, ": ", what, ": the lease has ended (expired or revoked); grant a new one"));
  }
  EtcdLeaseInfo out;
  out.ttl = absl::Seconds(resp.ttl());
  out.granted_ttl = absl::Seconds(resp.grantedttl());
  out.keys.assign(resp.keys().begin(), resp.keys().end());
  return out;
}

absl::StatusOr<EtcdMemberStatus> EtcdClient::MemberStatus(const std::string& endpoint,
                                                          absl::Time deadline) {
  size_t index = conn_->size();
  for (size_t i = 0; i < conn_->size(); ++i) {
    if (conn_->endpoint(i).address == endpoint) index = i;
  }
  if (index == conn_->size()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd member status: ", Quote(endpoint),
                                                   " is not one of the client's endpoints"));
  }
  Endpoint& e = conn_->endpoint(index);
  std::string token;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    absl::StatusOr<std::string> t = conn_->Token(index, &ctx);
    if (!t.ok()) return t.status();
    token = *std::move(t);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  if (!token.empty()) ctx.AddMetadata("token", token);  // no hasleader: asked without one too
  etcdserverpb::StatusRequest req;
  etcdserverpb::StatusResponse resp;
  if (absl::Status st =
          conn_->Translate(e.maintenance->Status(&ctx, req, &resp), e.address, "member status");
      !st.ok()) {
    return st;
  }
  EtcdMemberStatus out;
  out.member_id = resp.header().member_id();
  out.leader = resp.leader();
  out.raft_term = resp.header().raft_term();
  out.revision = resp.header().revision();
  out.version = resp.version();
  return out;
}

absl::StatusOr<std::unique_ptr<EtcdWatch>> EtcdClient::Watch(const std::string& key, bool prefix,
                                                             int64_t start_revision,
                                                             absl::Time deadline, bool prev_kv) {
  if (absl::Status st = CheckKey("watch", key, prefix); !st.ok()) return st;
  if (start_revision < 0) {
    return absl::InvalidArgumentError(absl::StrCat("etcd watch: start_revision is ", start_revision,
                                                   "; give 0 (from now) or more"));
  }
  std::unique_ptr<EtcdWatch> watch(
      new EtcdWatch(conn_, key, prefix ? PrefixEnd(key) : "", start_revision, prev_kv));
  EtcdWatch* w = watch.get();
  w->thread_ = std::thread([w] { w->Run(); });
  absl::Status failed;
  {
    MutexLock lock(&w->mu_);
    w->mu_.AwaitWithDeadline(
        [w]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->created_ || !w->end_.ok(); }, deadline);
    if (w->created_) {
      failed = absl::OkStatus();
    } else if (!w->end_.ok()) {
      failed = w->end_;
    } else if (!w->last_error_.ok()) {
      failed =
          absl::Status(w->last_error_.code() == absl::StatusCode::kUnavailable
                           ? absl::StatusCode::kUnavailable
                           : absl::StatusCode::kDeadlineExceeded,
                       absl::StrCat(w->last_error_.message(),
                                    " [no etcd endpoint created the watch before the deadline]"));
    } else {
      failed = absl::DeadlineExceededError(absl::StrCat("etcd ", endpoint(), ": ", w->Describe(),
                                                        ": not created before the deadline"));
    }
  }
  if (!failed.ok()) return failed;  // ~EtcdWatch cancels the attempt in progress
  return watch;
}

// --- EtcdWatch ---

EtcdWatch::EtcdWatch(std::shared_ptr<Connection> conn, std::string key, std::string range_end,
                     int64_t start_revision, bool prev_kv)
    : conn_(std::move(conn)),
      key_(std::move(key)),
      range_end_(std::move(range_end)),
      prev_kv_(prev_kv),
      next_revision_(start_revision) {}

EtcdWatch::~EtcdWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

std::string EtcdWatch::Describe() const { return KeyWhat("watch", key_, !range_end_.empty()); }

absl::StatusOr<std::vector<EtcdEvent>> EtcdWatch::Next(absl::Time deadline) {
  MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(
      [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !batches_.empty() || !end_.ok(); },
      deadline);
  if (!batches_.empty()) {
    std::vector<EtcdEvent> batch = std::move(batches_.front());
    batches_.pop_front();
    return batch;
  }
  if (!end_.ok()) return end_;
  return absl::DeadlineExceededError(absl::StrCat("etcd ",
                                                  conn_->endpoint(conn_->current()).address, ": ",
                                                  Describe(), ": no event before the deadline"));
}

int64_t EtcdWatch::next_revision() {
  MutexLock lock(&mu_);
  return next_revision_;
}

void EtcdWatch::End(absl::Status error) {
  MutexLock lock(&mu_);
  if (end_.ok()) end_ = std::move(error);
}

bool EtcdWatch::SleepUnlessStopped(absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  MutexLock lock(&mu_);
  while (!stopping_ && absl::Now() < deadline) wake_.WaitWithDeadline(&mu_, deadline);
  return !stopping_;
}

void EtcdWatch::Run() {
  etcd_internal::Backoff backoff;
  absl::Time broken_since = absl::Now();
  bool reauthenticated = false;
  for (;;) {
    const size_t index = conn_->current();
    const std::string& address = conn_->endpoint(index).address;
    absl::Status st;
    std::string token;
    if (conn_->authenticates()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + conn_->options().rpc_timeout));
      {
        MutexLock lock(&mu_);
        if (stopping_) return;
        context_ = &ctx;
      }
      absl::StatusOr<std::string> t = conn_->Token(index, &ctx);
      {
        MutexLock lock(&mu_);
        context_ = nullptr;
      }
      if (t.ok()) {
        token = *std::move(t);
      } else {
        st = t.status();
      }
    }
    bool created = false;
    if (st.ok()) st = RunStream(index, token, &created);
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (created) {
      backoff.Reset();
      reauthenticated = false;
      broken_since = absl::Now();
    }
    if (st.ok()) {
      st = absl::UnavailableError(
          absl::StrCat("etcd ", address, ": ", Describe(), ": etcd closed the watch stream"));
    }
    switch (etcd_internal::Classify(st)) {
      case etcd_internal::Verdict::kFail:
        End(st);
        return;
      case etcd_internal::Verdict::kReauthenticate:
        if (reauthenticated) {
          End(st);
          return;
        }
        reauthenticated = true;
        conn_->DropToken(token);
        continue;
      case etcd_internal::Verdict::kRetry:
        break;
    }
    int64_t next;
    {
      MutexLock lock(&mu_);
      last_error_ = st;
      next = next_revision_;
    }
    conn_->MoveOn(index, st);
    const absl::Duration broken = absl::Now() - broken_since;
    if (broken >= conn_->options().watch_resume_timeout) {
      End(absl::UnavailableError(
          absl::StrCat(st.message(), " [the watch could not resume on any etcd endpoint for ",
                       absl::FormatDuration(absl::Trunc(broken, absl::Milliseconds(1))),
                       next > 0 ? absl::StrCat("; watch again from revision ", next) : "", "]")));
      return;
    }
    if (!SleepUnlessStopped(backoff.Next())) return;
  }
}

namespace {

// Waits for the one operation in flight on `cq`; its ok. When `deadline`
// passes first, cancels `ctx` (the operation then completes, failed) and
// sets *timed_out.
bool WaitOp(grpc::CompletionQueue* cq, grpc::ClientContext* ctx, absl::Time deadline,
            bool* timed_out) {
  void* tag = nullptr;
  bool ok = false;
  for (;;) {
    if (deadline == absl::InfiniteFuture()) return cq->Next(&tag, &ok) && ok;
    switch (cq->AsyncNext(&tag, &ok, absl::ToChronoTime(deadline))) {
      case grpc::CompletionQueue::GOT_EVENT:
        return ok;
      case grpc::CompletionQueue::SHUTDOWN:
        return false;
      case grpc::CompletionQueue::TIMEOUT:
        *timed_out = true;
        ctx->TryCancel();
        deadline = absl::InfiniteFuture();
        break;
    }
  }
}

}  // namespace

absl::Status EtcdWatch::RunStream(size_t index, const std::string& token, bool* created) {
  Endpoint& e = conn_->endpoint(index);
  grpc::ClientContext ctx;
  Connection::Prepare(&ctx, token);
  etcdserverpb::WatchRequest req;
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    context_ = &ctx;
    etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(range_end_);
    create->set_start_revision(next_revision_);
    create->set_prev_kv(prev_kv_);
  }
  grpc::CompletionQueue cq;
  void* const tag = this;
  const absl::Time create_deadline = absl::Now() + conn_->options().rpc_timeout;
  bool timed_out = false;
  absl::Status result;
  auto stream = e.watch->PrepareAsyncWatch(&ctx, &cq);
  stream->StartCall(tag);
  bool ok = WaitOp(&cq, &ctx, create_deadline, &timed_out);
  if (ok) {
    stream->Write(req, tag);
    ok = WaitOp(&cq, &ctx, create_deadline, &timed_out);
  }
  etcdserverpb::WatchResponse resp;
  while (ok) {
    stream->Read(&resp, tag);
    if (!WaitOp(&cq, &ctx, *created ? absl::InfiniteFuture() : create_deadline, &timed_out)) {
      break;
    }
    result = OnResponse(index, resp, created);
    if (!result.ok()) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status finish;
  stream->Finish(&finish, tag);
  bool unused = false;
  WaitOp(&cq, &ctx, absl::InfiniteFuture(), &unused);
  {
    MutexLock lock(&mu_);
    context_ = nullptr;
  }
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
  if (!result.ok()) return result;
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("etcd ", e.address, ": ", Describe(), ": not created within ",
                     absl::FormatDuration(conn_->options().rpc_timeout)));
  }
  return conn_->Translate(finish, e.address, Describe());
}

absl::Status EtcdWatch::OnResponse(size_t index, const etcdserverpb::WatchResponse& resp,
                                   bool* created) {
  const std::string& address = conn_->endpoint(index).address;
  if (resp.canceled()) {
    int64_t next;
    {
      MutexLock lock(&mu_);
      next = next_revision_;
    }
    if (resp.compact_revision() > 0) {
      return absl::OutOfRangeError(
          absl::StrCat("etcd ", address, ": ", Describe(), " from revision ", next,
                       ": etcd has compacted the revisions before ", resp.compact_revision(),
                       "; read the keys again and watch from the revision of that read + 1"));
    }
    const std::string& reason = resp.cancel_reason();
    // The codes etcd gives these errors on unary calls (Classify reads them).
    absl::StatusCode code = absl::StatusCode::kAborted;
    if (absl::StrContains(reason, "invalid auth token") ||
        absl::StrContains(reason, "user name is empty")) {
      code = absl::StatusCode::kUnauthenticated;
    } else if (absl::StrContains(reason, "revision of auth store is old")) {
      code = absl::StatusCode::kInvalidArgument;
    } else if (absl::StrContains(reason, "permission denied")) {
      code = absl::StatusCode::kPermissionDenied;
    }
    return absl::Status(
        code, absl::StrCat("etcd ", address, ": ", Describe(), ": etcd cancelled the watch (",
                           reason.empty() ? "no reason given" : reason, ")",
                           next > 0 ? absl::StrCat("; watch again from revision ", next) : ""));
  }
  if (resp.created()) {
    *created = true;
    MutexLock lock(&mu_);
    created_ = true;
    last_error_ = absl::OkStatus();
    if (next_revision_ == 0) next_revision_ = resp.header().revision() + 1;
  }
  if (resp.events_size() == 0) return absl::OkStatus();
  std::vector<EtcdEvent> batch;
  batch.reserve(resp.events_size());
  for (const mvccpb::Event& ev : resp.events()) {
    EtcdEvent out;
    out.type =
        ev.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
    out.kv = FromProto(ev.kv());
    if (ev.has_prev_kv()) out.prev_kv = FromProto(ev.prev_kv());
    batch.push_back(std::move(out));
  }
  const int64_t next = batch.back().kv.mod_revision + 1;
  MutexLock lock(&mu_);
  next_revision_ = std::max(next_revision_, next);
  batches_.push_back(std::move(batch));
  return absl::OkStatus();
}

}  // namespace collectived
