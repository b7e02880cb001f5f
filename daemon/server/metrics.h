// Prometheus metrics of the daemon (--metrics=ADDR): /metrics over HTTP, by
// prometheus-cpp's exposer.
//
// Two sources:
//  - per op, as the engine ends it (EngineOptions::op_observer): ops by kind
//    and status code (member deaths and broken meshes are ABORTED,
//    mismatches FAILED_PRECONDITION, timeouts DEADLINE_EXCEEDED), and the
//    op latency (first member's submission to completion) by kind and size
//    class;
//  - at each scrape, from the engine's own snapshots: sessions, meshes,
//    buffers and bytes per device, pending ops, bytes moved by kind, uptime.
//
// Use: Metrics m; put m.Observer() in the EngineOptions; build the engine;
// then m.Serve(address, &engine). The Metrics must outlive the engine's use
// of the observer and be destroyed before the engine (it scrapes it).
//
// Thread-safety: the observer may be called from any thread; Serve once.
#ifndef COLLECTIVED_DAEMON_SERVER_METRICS_H_
#define COLLECTIVED_DAEMON_SERVER_METRICS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/engine.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace collectived {

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // What EngineOptions::op_observer should call.
  OpObserver Observer();

  // Serves /metrics on `address` ("127.0.0.1:9464"; port 0 picks a free
  // one, see port()). INVALID_ARGUMENT for an address without a port,
  // UNAVAILABLE when it cannot be bound.
  absl::Status Serve(const std::string& address, Engine* engine);
  // The port /metrics is served on (0 before Serve).
  int port() const { return port_; }

 private:
  class Collector;
  struct Families;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// The size class of an op of `bytes` per member in the latency histogram:
// "le4KiB", "le1MiB", "le64MiB" or "gt64MiB".
const char* SizeClass(uint64_t bytes);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_METRICS_H_
