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
#include "daemon/cluster/etcd_connection.h"
#include "daemon/util/log.h"
#include "etcd/api/etcdserverpb/rpc.grpc.pb.h"

namespace collectived {

using etcd_internal::Connection;
using etcd_internal::Endpoint;
using etcd_internal::KeyWhat;
using etcd_internal::PrefixEnd;
using etcd_internal::Quote;

namespace {

// etcd's own limit on a lease's ttl (lease.MaxLeaseTTL).
constexpr int64_t kMaxLeaseTtlSeconds = 9000000000;

using etcd_internal::FromProto;  // of a KeyValue

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

}  // namespace collectived
