#include "daemon/cluster/etcd_connection.h"

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

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

std::string Quote(absl::string_view key) {
  if (key.size() <= kMaxQuotedKey) return absl::StrCat("\"", absl::CHexEscape(key), "\"");
  return absl::StrCat("\"", absl::CHexEscape(key.substr(0, kMaxQuotedKey)), "...\" (", key.size(),
                      " bytes)");
}

std::string KeyWhat(absl::string_view op, const std::string& key, bool prefix) {
  if (prefix && key.empty()) return absl::StrCat(op, " of every key");
  return absl::StrCat(op, prefix ? " of prefix " : " of key ", Quote(key));
}

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
}  // namespace collectived
