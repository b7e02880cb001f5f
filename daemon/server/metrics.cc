#include "daemon/server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <exception>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sync.h"
#include "plan/op_plan.h"

namespace collectived {

const char* SizeClass(uint64_t bytes) {
  if (bytes <= (uint64_t{4} << 10)) return "le4KiB";
  if (bytes <= (uint64_t{1} << 20)) return "le1MiB";
  if (bytes <= (uint64_t{64} << 20)) return "le64MiB";
  return "gt64MiB";
}

struct Metrics::Families {
  prometheus::Family<prometheus::Counter>* ops;
  prometheus::Family<prometheus::Histogram>* latency;
};

namespace {

using MetricFamilies = std::vector<prometheus::MetricFamily>;

prometheus::ClientMetric Labelled(std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  return m;
}

void AddGauge(MetricFamilies& out, const char* name, const char* help, double v) {
  prometheus::MetricFamily f{name, help, prometheus::MetricType::Gauge, {}};
  prometheus::ClientMetric m;
  m.gauge.value = v;
  f.metric.push_back(m);
  out.push_back(std::move(f));
}

void AddPendingOps(MetricFamilies& out, Engine& engine) {
  // Always the three states, so that a dashboard sees zeros.
  std::map<std::string, int> by_state = {{"waiting", 0}, {"queued", 0}, {"running", 0}};
  auto ops = engine.ListPendingOps("");
  if (ops.ok()) {
    for (const PendingOpView& p : *ops) ++by_state[p.state];
  }
  prometheus::MetricFamily f{
      "collectived_pending_ops",
      "Ops not completed, by state: waiting (some members have not submitted; member-side "
      "ops included), queued (all have; an earlier op of the mesh runs), running.",
      prometheus::MetricType::Gauge, {}};
  for (const auto& [state, v] : by_state) {
    prometheus::ClientMetric m = Labelled({{"state", state}});
    m.gauge.value = v;
    f.metric.push_back(m);
  }
  out.push_back(std::move(f));
}

void AddBuffers(MetricFamilies& out, const EngineStats& stats) {
  prometheus::MetricFamily buffers{"collectived_buffers", "Shared buffers, by device and kind.",
                                   prometheus::MetricType::Gauge, {}};
  prometheus::MetricFamily bytes{"collectived_buffer_bytes",
                                 "Bytes of shared buffers, by device and kind.",
                                 prometheus::MetricType::Gauge, {}};
  for (const DeviceBuffers& d : stats.buffers_by_device) {
    prometheus::ClientMetric m = Labelled({{"device", d.device}, {"kind", d.kind}});
    m.gauge.value = d.buffers;
    buffers.metric.push_back(m);
    m.gauge.value = static_cast<double>(d.buffer_bytes);
    bytes.metric.push_back(m);
  }
  out.push_back(std::move(buffers));
  out.push_back(std::move(bytes));
}

void AddKinds(MetricFamilies& out, const EngineStats& stats) {
  prometheus::MetricFamily moved{"collectived_bytes_moved_total",
                                 "Bytes the executors read and wrote, by op kind.",
                                 prometheus::MetricType::Counter, {}};
  prometheus::MetricFamily input{"collectived_op_input_bytes_total",
                                 "Input bytes of completed ops over all members, by op kind.",
                                 prometheus::MetricType::Counter, {}};
  for (const KindStats& k : stats.by_kind) {
    const std::string kind(OpKindName(k.kind));
    for (auto [dir, v] : {std::pair<const char*, int64_t>{"read", k.bytes_read},
                          std::pair<const char*, int64_t>{"written", k.bytes_written}}) {
      prometheus::ClientMetric m = Labelled({{"kind", kind}, {"direction", dir}});
      m.counter.value = static_cast<double>(v);
      moved.metric.push_back(m);
    }
    prometheus::ClientMetric m = Labelled({{"kind", kind}});
    m.counter.value = static_cast<double>(k.bytes);
    input.metric.push_back(m);
  }
  out.push_back(std::move(moved));
  out.push_back(std::move(input));
}

// The fast path's share: submissions by the way they came in.
void AddSubmitted(MetricFamilies& out, const EngineStats& stats) {
  prometheus::MetricFamily submitted{
      "collectived_ops_submitted_total",
      "Op submissions by path: fast_path (the shared-memory queue), execute (the gRPC "
      "Execute stream), unary (the gRPC Submit call).",
      prometheus::MetricType::Counter, {}};
  for (auto [path, v] : {std::pair<const char*, int64_t>{"fast_path", stats.submitted_fast_path},
                         std::pair<const char*, int64_t>{"execute", stats.submitted_execute},
                         std::pair<const char*, int64_t>{"unary", stats.submitted_unary}}) {
    prometheus::ClientMetric m = Labelled({{"path", path}});
    m.counter.value = static_cast<double>(v);
    submitted.metric.push_back(m);
  }
  out.push_back(std::move(submitted));
}

void AddCluster(MetricFamilies& out, const ClusterView& c) {
  // Every state, so that a dashboard sees which one is 1.
  prometheus::MetricFamily state{
      "collectived_cluster_state",
      "1 for the daemon's state in its cluster (starting, joined, unavailable, stopped).",
      prometheus::MetricType::Gauge, {}};
  for (const char* name : {"starting", "joined", "unavailable", "stopped"}) {
    prometheus::ClientMetric m = Labelled({{"host_id", c.host_id}, {"state", name}});
    m.gauge.value = c.state == name ? 1 : 0;
    state.metric.push_back(m);
  }
  out.push_back(std::move(state));
  AddGauge(out, "collectived_cluster_meshes", "Meshes whose members are on several hosts.",
           c.meshes_across_hosts);
  prometheus::MetricFamily ops{"collectived_cluster_ops_total",
                               "Ops of meshes across hosts, by result (ok, failed).",
                               prometheus::MetricType::Counter, {}};
  for (auto [result, v] :
       {std::pair<const char*, int64_t>{"ok", c.ops_across_hosts},
        std::pair<const char*, int64_t>{"failed", c.ops_across_hosts_failed}}) {
    prometheus::ClientMetric m = Labelled({{"result", result}});
    m.counter.value = static_cast<double>(v);
    ops.metric.push_back(m);
  }
  out.push_back(std::move(ops));
}

}  // namespace

// Scrape-time metrics from the engine's snapshots.
class Metrics::Collector final : public prometheus::Collectable {
 public:
  void SetEngine(Engine* engine) { engine_.store(engine); }

  std::vector<prometheus::MetricFamily> Collect() const override {
    Engine* engine = engine_.load();
    if (engine == nullptr) return {};
    const EngineStats stats = engine->GetStats();
    std::vector<prometheus::MetricFamily> out;
    AddGauge(out, "collectived_uptime_seconds", "Seconds since the daemon started.",
             static_cast<double>(stats.uptime_ms) / 1000.0);
    AddGauge(out, "collectived_sessions", "Client sessions.", stats.sessions);
    AddGauge(out, "collectived_meshes", "Meshes (every generation the daemon still holds).",
             stats.meshes);
    AddPendingOps(out, *engine);
    AddBuffers(out, stats);
    AddKinds(out, stats);
    AddSubmitted(out, stats);
    if (stats.cluster.has_value()) AddCluster(out, *stats.cluster);
    return out;
  }

 private:
  std::atomic<Engine*> engine_{nullptr};
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_unique<Families>()),
      collector_(std::make_shared<Collector>()) {
  families_->ops = &prometheus::BuildCounter()
                        .Name("collectived_ops_total")
                        .Help("Ops ended, by op kind and status code (OK, ABORTED for a member "
                              "that died or left, FAILED_PRECONDITION for a mismatch, "
                              "DEADLINE_EXCEEDED for a timeout, ...).")
                        .Register(*registry_);
  families_->latency = &prometheus::BuildHistogram()
                            .Name("collectived_op_latency_seconds")
                            .Help("From the first member's submission to the op's end, by op "
                                  "kind and size class (bytes per member).")
                            .Register(*registry_);
}

Metrics::~Metrics() {
  exposer_.reset();  // no scrape runs after this
  collector_->SetEngine(nullptr);
}

OpObserver Metrics::Observer() {
  Families* f = families_.get();
  return [f](OpKind kind, absl::StatusCode code, uint64_t member_bytes, absl::Duration latency) {
    const std::string k(OpKindName(kind));
    f->ops->Add({{"kind", k}, {"code", absl::StatusCodeToString(code)}}).Increment();
    if (code != absl::StatusCode::kOk) return;
    static const prometheus::Histogram::BucketBoundaries kBuckets = {
        1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2,
        2e-2, 5e-2, 0.1,  0.2,  0.5,  1,    2,    5,    10,   60};
    f->latency->Add({{"kind", k}, {"size", SizeClass(member_bytes)}}, kBuckets)
        .Observe(absl::ToDoubleSeconds(latency));
  };
}

absl::Status Metrics::Serve(const std::string& address, Engine* engine) {
  if (address.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics=", address, ": want HOST:PORT, e.g. 127.0.0.1:9464"));
  }
  collector_->SetEngine(engine);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics=", address, ": cannot serve /metrics there: ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(collector_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? 0 : ports[0];
  return absl::OkStatus();
}

}  // namespace collectived
