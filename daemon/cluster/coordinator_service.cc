#include "daemon/cluster/coordinator_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <grpc/grpc_security_constants.h>
#include "common/sync.h"

namespace collectived {
namespace {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// A KeyGet or MeshWait: finishes when the coordinator answers, and when the
// call is cancelled (the client's deadline passed, it went away) cancels its
// wait, which frees the waiter's slot at once instead of when the wait's own
// timeout passes. Finish runs once: when both the answer is in and the
// coordinator's call returned (its wait id is known), whichever is last.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(Coordinator* coordinator, std::atomic<int64_t>* in_flight, int64_t budget)
      : coordinator_(coordinator), in_flight_(in_flight), budget_(budget) {}

  // The coordinator's answer (any thread, maybe inside its call): `status`,
  // and when it is OK an answer of about `bytes`, which `fill` writes into
  // the response once the bytes are counted against the budget (until the
  // call is done); past the budget the call gets RESOURCE_EXHAUSTED.
  void Respond(absl::Status status, int64_t bytes, absl::FunctionRef<void()> fill) {
    if (status.ok()) {
      if (Charge(bytes)) {
        fill();
      } else {
        status = absl::ResourceExhaustedError(absl::StrCat(
            "an answer of ", bytes, " bytes would take the coordinator past ", budget_,
            " bytes of answers not yet read by their callers; try again"));
      }
    }
    Answer(ToGrpcStatus(status));
  }
  // The coordinator's call returned `id` (0: answered already).
  void Registered(WaitId id) {
    bool finish, cancel;
    {
      MutexLock lock(&mu_);
      registered_ = true;
      id_ = id;
      finish = answered_;
      cancel = cancelled_ && !answered_;
    }
    if (finish) {
      Finish(answer_);
    } else if (cancel) {
      coordinator_->CancelWait(id);  // answers (CANCELLED), which finishes
    }
  }
  void OnCancel() override {
    WaitId id = 0;
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      if (registered_ && !answered_) id = id_;
    }
    if (id != 0) coordinator_->CancelWait(id);
  }
  void OnDone() override {
    in_flight_->fetch_sub(charged_);
    delete this;
  }

 private:
  // Counts `bytes` against the budget; false (nothing counted) when they do
  // not fit.
  bool Charge(int64_t bytes) {
    int64_t now = in_flight_->load();
    do {
      if (now + bytes > budget_) return false;
    } while (!in_flight_->compare_exchange_weak(now, now + bytes));
    charged_ = bytes;
    return true;
  }
  void Answer(grpc::Status status) {
    bool finish;
    {
      MutexLock lock(&mu_);
      answered_ = true;
      answer_ = std::move(status);
      finish = registered_;
    }
    if (finish) Finish(answer_);
  }

  Coordinator* const coordinator_;
  std::atomic<int64_t>* const in_flight_;
  const int64_t budget_;
  int64_t charged_ = 0;  // set by the answer, read in OnDone (after Finish)
  Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  WaitId id_ ABSL_GUARDED_BY(mu_) = 0;
  // Written once, under mu_, before Finish reads it.
  grpc::Status answer_;
};

void ToProto(const HostRecord& h, v1::HostInfo* out) {
  out->set_host_id(h.host_id);
  out->set_address(h.address);
  out->set_joined_at_unix_ms(UnixMs(h.joined_at));
  out->set_last_heartbeat_unix_ms(UnixMs(h.last_heartbeat));
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = static_cast<unsigned char>(diff | (static_cast<unsigned char>(a[i]) ^
                                              static_cast<unsigned char>(b[i])));
  }
  return diff == 0;
}

absl::Status CoordinatorService::CheckToken(grpc::CallbackServerContext* ctx) const {
  if (token_.empty()) return absl::OkStatus();
  const auto& md = ctx->client_metadata();
  auto it = md.find(kClusterTokenMetadataKey);
  if (it == md.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the cluster token is missing (request metadata '", kClusterTokenMetadataKey, "')"));
  }
  if (!ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), token_)) {
    return absl::UnauthenticatedError("wrong cluster token");
  }
  return absl::OkStatus();
}

namespace {

// With mutual TLS, the host id a daemon joins as must be one of the names
// its verified client certificate carries (a DNS name or the common name):
// a daemon cannot speak for another host. Without a client certificate
// there is nothing to check.
absl::Status CheckHostCertificate(const grpc::CallbackServerContext* ctx,
                                  absl::string_view host_id) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return absl::OkStatus();
  std::vector<std::string> names;
  for (const char* property : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
      names.emplace_back(v.data(), v.size());
      if (NameCoversHost(names.back(), host_id)) return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "host id '", host_id, "' is not named by the client certificate (it carries ",
      names.empty() ? std::string("no names") : absl::StrJoin(names, ", "),
      "): with TLS a host's certificate must name its host id"));
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::JoinCluster(grpc::CallbackServerContext* ctx,
                                                          const v1::JoinClusterRequest* req,
                                                          v1::JoinClusterResponse* resp) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  if (absl::Status st = CheckHostCertificate(ctx, req->host_id()); !st.ok()) {
    return Finish(ctx, st);
  }
  auto grant = coordinator_->Join(req->host_id(), req->address(), req->previous_lease_id());
  if (grant.ok()) {
    resp->set_lease_id(grant->lease_id);
    resp->set_lease_ttl_ms(absl::ToInt64Milliseconds(grant->ttl));
    for (const HostRecord& h : grant->hosts) ToProto(h, resp->add_hosts());
  }
  return Finish(ctx, grant.status());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const v1::HeartbeatRequest* req,
                                                        v1::HeartbeatResponse*) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  return Finish(ctx, coordinator_->Heartbeat(req->lease_id()));
}

grpc::ServerUnaryReactor* CoordinatorService::LeaveCluster(grpc::CallbackServerContext* ctx,
                                                           const v1::LeaveClusterRequest* req,
                                                           v1::LeaveClusterResponse*) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  return Finish(ctx, coordinator_->Leave(req->lease_id()));
}

grpc::ServerUnaryReactor* CoordinatorService::ListHosts(grpc::CallbackServerContext* ctx,
                                                        const v1::ListHostsRequest*,
                                                        v1::ListHostsResponse* resp) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  for (const HostRecord& h : coordinator_->ListHosts()) ToProto(h, resp->add_hosts());
  return Finish(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::KeySet(grpc::CallbackServerContext* ctx,
                                                     const v1::KeySetRequest* req,
                                                     v1::KeySetResponse*) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  SetOptions options;
  options.overwrite = req->overwrite();
  options.lease_id = req->lease_id();
  return Finish(ctx, coordinator_->Set(req->key(), req->value(), options));
}

grpc::ServerUnaryReactor* CoordinatorService::KeyGet(grpc::CallbackServerContext* ctx,
                                                     const v1::KeyGetRequest* req,
                                                     v1::KeyGetResponse* resp) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  if (req->timeout_ms() < 0) {
    return Finish(ctx, absl::InvalidArgumentError("timeout_ms must be >= 0"));
  }
  auto* reactor = new WaitReactor(coordinator_, &answer_bytes_, answer_budget_);
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  // The timeout is capped by the coordinator (kMaxKeyWait), so the reactor
  // is always finished.
  const int64_t timeout_ms =
      std::min<int64_t>(req->timeout_ms(), absl::ToInt64Milliseconds(kMaxKeyWait));
  reactor->Registered(coordinator_->Get(
      std::move(keys), absl::Milliseconds(timeout_ms),
      [reactor, resp](absl::StatusOr<std::vector<KeyValue>> r) {
        int64_t bytes = 0;
        if (r.ok()) {
          for (const KeyValue& kv : *r) bytes += kv.key.size() + kv.value.size();
        }
        reactor->Respond(r.status(), bytes, [&] {
          for (KeyValue& kv : *r) {
            v1::KeyValue* e = resp->add_entries();
            e->set_key(std::move(kv.key));
            e->set_value(std::move(kv.value));
          }
        });
      }));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::KeyDelete(grpc::CallbackServerContext* ctx,
                                                        const v1::KeyDeleteRequest* req,
                                                        v1::KeyDeleteResponse* resp) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  auto deleted = coordinator_->Delete(keys, req->prefix());
  if (deleted.ok()) resp->set_deleted(*deleted);
  return Finish(ctx, deleted.status());
}

grpc::ServerUnaryReactor* CoordinatorService::MeshRegister(grpc::CallbackServerContext* ctx,
                                                           const v1::MeshRegisterRequest* req,
                                                           v1::MeshRegisterResponse* resp) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  MeshRegistration reg;
  reg.key = req->key();
  reg.host_id = req->host_id();
  reg.lease_id = req->lease_id();
  reg.axes = req->axes();
  reg.members = req->members();
  reg.token = req->token();
  reg.op_timeout_ms = req->op_timeout_ms();
  reg.indices.assign(req->indices().begin(), req->indices().end());
  auto generation = coordinator_->MeshRegister(reg);
  if (generation.ok()) resp->set_generation(*generation);
  return Finish(ctx, generation.status());
}

grpc::ServerUnaryReactor* CoordinatorService::MeshWait(grpc::CallbackServerContext* ctx,
                                                       const v1::MeshWaitRequest* req,
                                                       v1::MeshWaitResponse* resp) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  if (req->timeout_ms() < 0) {
    return Finish(ctx, absl::InvalidArgumentError("timeout_ms must be >= 0"));
  }
  auto* reactor = new WaitReactor(coordinator_, &answer_bytes_, answer_budget_);
  // Capped by the coordinator too (kMaxKeyWait), so the reactor is always
  // finished, as KeyGet's.
  const int64_t timeout_ms =
      std::min<int64_t>(req->timeout_ms(), absl::ToInt64Milliseconds(kMaxKeyWait));
  reactor->Registered(coordinator_->MeshWait(
      req->key(), req->generation(), absl::Milliseconds(timeout_ms),
      [reactor, resp](absl::StatusOr<MeshMembership> r) {
        int64_t bytes = 0;
        if (r.ok()) {
          for (const std::string& h : r->member_host) bytes += h.size() + 2;
          for (const HostRecord& h : r->hosts) bytes += h.host_id.size() + h.address.size() + 32;
        }
        reactor->Respond(r.status(), bytes, [&] {
          resp->set_generation(r->generation);
          resp->set_op_timeout_ms(r->op_timeout_ms);
          resp->set_secret(r->secret);
          for (std::string& h : r->member_host) resp->add_member_host(std::move(h));
          for (const HostRecord& h : r->hosts) ToProto(h, resp->add_hosts());
        });
      }));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::MeshLeave(grpc::CallbackServerContext* ctx,
                                                        const v1::MeshLeaveRequest* req,
                                                        v1::MeshLeaveResponse*) {
  if (absl::Status st = CheckToken(ctx); !st.ok()) return Finish(ctx, st);
  std::vector<int32_t> indices(req->indices().begin(), req->indices().end());
  return Finish(ctx, coordinator_->MeshLeave(req->key(), req->generation(), req->host_id(),
                                             req->lease_id(), indices, req->broken(),
                                             req->reason()));
}

}  // namespace collectived
