// HealthService: grpc.health.v1.Health for the daemon.
//
// Reports SERVING for "", "collectived.v1.Collective" and the services added
// with AddService until SetServing(false) is called at shutdown; NOT_FOUND for
// other service names. Watch
// sends the current status and then every change, until the call ends.
// Implemented here (rather than gRPC's built-in health service) so that
// server reflection can describe it.
#ifndef COLLECTIVED_DAEMON_SERVER_HEALTH_H_
#define COLLECTIVED_DAEMON_SERVER_HEALTH_H_

#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/sync.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace collectived {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  class Watcher;
  HealthService() = default;
  // Reports `service` too (e.g. "collectived.v1.Cluster" on a coordinator).
  // Thread-safe.
  void AddService(std::string service);
  // Thread-safe. Watchers get the new status.
  void SetServing(bool serving);
  // Ends every Watch call (before the server shuts down).
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* req) override;

  // Used by watchers.
  void Remove(Watcher* w);

 private:
  Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> added_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_HEALTH_H_
