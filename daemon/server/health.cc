#include "daemon/server/health.h"

#include <string>
#include <utility>

namespace collectived {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

bool KnownService(const std::string& name) {
  return name.empty() || name == "collectived.v1.Collective";
}

}  // namespace

class HealthService::Watcher final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, bool known, bool serving)
      : service_(service), known_(known) {
    Update(serving);
  }
  // Sends `serving` (coalescing updates while a write is in flight).
  void Update(bool serving) {
    MutexLock lock(&mu_);
    if (finished_) return;
    next_ = !known_ ? HealthCheckResponse::SERVICE_UNKNOWN
            : serving ? HealthCheckResponse::SERVING
                      : HealthCheckResponse::NOT_SERVING;
    have_next_ = true;
    MaybeWrite();
  }
  // Ends the call once the statuses queued so far are written.
  void End() {
    MutexLock lock(&mu_);
    ending_ = true;
    MaybeWrite();
  }
  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      have_next_ = false;
      ending_ = true;
    }
    MaybeWrite();
  }
  void OnCancel() override { End(); }
  void OnDone() override {
    service_->Remove(this);
    delete this;
  }

 private:
  void MaybeWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (have_next_) {
      response_.set_status(next_);
      have_next_ = false;
      writing_ = true;
      StartWrite(&response_);
    } else if (ending_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  HealthService* const service_;
  const bool known_;
  Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  HealthCheckResponse::ServingStatus next_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool have_next_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

void HealthService::SetServing(bool serving) {
  MutexLock lock(&mu_);
  serving_ = serving;
  for (Watcher* w : watchers_) w->Update(serving);
}

void HealthService::Shutdown() {
  MutexLock lock(&mu_);
  shutdown_ = true;
  serving_ = false;
  for (Watcher* w : watchers_) w->End();
}

void HealthService::Remove(Watcher* w) {
  MutexLock lock(&mu_);
  watchers_.erase(w);
}

void HealthService::AddService(std::string service) {
  MutexLock lock(&mu_);
  added_.insert(std::move(service));
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const HealthCheckRequest* req,
                                               HealthCheckResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  MutexLock lock(&mu_);
  if (!KnownService(req->service()) && added_.count(req->service()) == 0) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "unknown service '" + req->service() + "'"));
    return reactor;
  }
  resp->set_status(serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* ctx, const HealthCheckRequest* req) {
  MutexLock lock(&mu_);
  auto* w = new Watcher(this, KnownService(req->service()) || added_.count(req->service()) > 0,
                        serving_);
  if (shutdown_) {
    w->End();
  } else {
    watchers_.insert(w);
  }
  return w;
}

}  // namespace collectived
