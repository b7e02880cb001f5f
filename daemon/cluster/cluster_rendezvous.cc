#include "daemon/cluster/cluster_rendezvous.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/cluster/host_mesh.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

// The longest one registry wait lasts before Form looks at Stop again.
constexpr absl::Duration kWaitSlice = absl::Seconds(1);
// The least time a mesh that filled gets to connect its hosts, even when it
// filled at its joiners' deadline.
constexpr absl::Duration kMinConnect = absl::Milliseconds(500);

// The cluster's store as the meshes' address book: keys owned by this
// daemon's lease (they go with it), waits retried while the store cannot be
// reached, all within the deadline.
class ClusterAddressBook final : public AddressBook {
 public:
  explicit ClusterAddressBook(Cluster* cluster) : cluster_(cluster) {}
  absl::Status Publish(const std::string& key, const std::string& value) override {
    return cluster_->Set(key, value, /*overwrite=*/false, /*owned=*/true);
  }
  absl::StatusOr<std::vector<std::string>> Lookup(const std::vector<std::string>& keys,
                                                  absl::Time deadline) override {
    for (;;) {
      const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
      auto values = cluster_->Get(keys, left);
      if (values.ok() || absl::Now() >= deadline || !absl::IsUnavailable(values.status())) {
        return values;
      }
      absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
    }
  }

 private:
  Cluster* const cluster_;
};

}  // namespace

std::string AddressHost(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    const size_t end = address.find(']');
    return end == std::string::npos ? address : address.substr(1, end - 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;
  return address.substr(0, colon);
}

ClusterRendezvous::ClusterRendezvous(ClusterRendezvousOptions options)
    : options_(std::move(options)),
      serial_(std::make_unique<ThreadPool>(1)),
      forms_(std::make_unique<ThreadPool>(std::max(1, options_.form_threads))) {}

ClusterRendezvous::~ClusterRendezvous() { Stop(); }

void ClusterRendezvous::Attach(Cluster* client, std::string bind_host) {
  MutexLock lock(&mu_);
  client_ = client;
  bind_host_ = std::move(bind_host);
}

void ClusterRendezvous::Stop() {
  stopping_->store(true);
  std::unique_ptr<ThreadPool> serial, forms;
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    serial = std::move(serial_);
    forms = std::move(forms_);
  }
  // Queued work still runs, answering UNAVAILABLE; Forms in flight notice
  // within a wait slice, or while connecting within kCancelSlice.
  serial.reset();
  forms.reset();
}

bool ClusterRendezvous::Schedule(std::unique_ptr<ThreadPool> ClusterRendezvous::*pool,
                                 std::function<void()> fn) {
  MutexLock lock(&mu_);
  if (stopped_) return false;
  (this->*pool)->Schedule(std::move(fn));
  return true;
}

absl::StatusOr<Cluster*> ClusterRendezvous::Client() {
  MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the daemon is leaving the cluster");
  if (client_ == nullptr) {
    return absl::UnavailableError("this daemon has not reached the cluster yet");
  }
  return client_;
}

void ClusterRendezvous::Register(const MeshJoinInfo& info, int index, absl::Time deadline,
                                 absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  auto cb = std::make_shared<absl::AnyInvocable<void(absl::StatusOr<int64_t>)>>(std::move(done));
  const bool scheduled = Schedule(&ClusterRendezvous::serial_, [this, info, index, deadline, cb] {
    auto client = Client();
    if (!client.ok()) {
      (*cb)(client.status());
      return;
    }
    MeshRegistration r;
    r.key = info.key;
    r.axes = info.axes;
    r.members = info.members;
    r.token = info.token;
    r.op_timeout_ms = info.op_timeout_ms;
    r.indices = {index};
    if ((*client)->lease_id().empty()) {
      // Not joined (yet, or any more): the registry cannot be asked.
      const absl::Status why = (*client)->last_error();
      (*cb)(absl::UnavailableError(absl::StrCat(
          "this daemon is not joined to the cluster",
          why.ok() ? std::string(" yet") : absl::StrCat(": ", why.message()))));
      return;
    }
    absl::StatusOr<int64_t> g = (*client)->MeshRegister(std::move(r), deadline);
    // The registry was not reached, or this daemon's lease is gone: not a
    // refusal of the join (the engine tries again).
    if (!g.ok() && (absl::IsDeadlineExceeded(g.status()) || absl::IsNotFound(g.status()) ||
                    (absl::IsFailedPrecondition(g.status()) && (*client)->lease_id().empty()))) {
      g = absl::UnavailableError(absl::StrCat("the cluster's registry: ", g.status().message()));
    }
    (*cb)(std::move(g));
  });
  if (!scheduled) (*cb)(absl::UnavailableError("the daemon is leaving the cluster"));
}

void ClusterRendezvous::Leave(const std::string& key, int64_t generation, std::vector<int> indices,
                              bool broken, const std::string& reason) {
  Schedule(&ClusterRendezvous::serial_, [this, key, generation, indices = std::move(indices),
                                         broken, reason] {
    auto client = Client();
    absl::Status st = client.status();
    // At most kMaxKeysPerRequest indices a call (a broken mesh: one call).
    size_t at = 0;
    do {
      if (!st.ok()) break;
      const size_t end = std::min(indices.size(), at + kMaxKeysPerRequest);
      st = (*client)->MeshLeave(key, generation,
                                std::vector<int32_t>(indices.begin() + at, indices.begin() + end),
                                broken, reason.substr(0, 1000));
      at = end;
    } while (at < indices.size());
    if (!st.ok()) {
      LogEvent(LogLevel::kWarn, "cluster_mesh_leave_failed",
               {{"mesh", key}, {"generation", absl::StrCat(generation)},
                {"error", st.ToString()}});
    }
  });
}

void ClusterRendezvous::Form(const std::string& key, int64_t generation, absl::Time deadline,
                             std::shared_ptr<const std::atomic<bool>> cancel,
                             absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)> done) {
  auto cb =
      std::make_shared<absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)>>(std::move(done));
  const bool scheduled =
      Schedule(&ClusterRendezvous::forms_, [this, key, generation, deadline, cancel, cb] {
        (*cb)(FormNow(key, generation, deadline, cancel));
      });
  if (!scheduled) (*cb)(absl::UnavailableError("the daemon is leaving the cluster"));
}

RendezvousStatus ClusterRendezvous::Status() {
  RendezvousStatus s;
  s.serves_coordinator = options_.serves_coordinator;
  Cluster* client;
  bool stopped;
  {
    MutexLock lock(&mu_);
    client = client_;
    stopped = stopped_;
  }
  if (stopped) {
    s.state = "stopped";
    return s;
  }
  if (client == nullptr) {
    s.state = ClusterStateName(ClusterState::kStarting);
    return s;
  }
  // The client is destroyed at the end of main, after the servers and the
  // metrics endpoint (every caller of the engine's GetStats) have stopped.
  s.state = ClusterStateName(client->state());
  s.coordinator = client->description();
  const absl::Status error = client->last_error();
  if (!error.ok()) s.last_error = std::string(error.message());
  return s;
}

absl::StatusOr<MeshMembership> ClusterRendezvous::AwaitMembership(
    const std::string& key, int64_t generation, absl::Time deadline,
    const std::atomic<bool>& cancel, const absl::Status& cancelled) {
  absl::StatusOr<MeshMembership> membership;
  while (true) {
    if (cancel.load()) return cancelled;
    auto client = Client();
    if (!client.ok()) return client.status();
    const absl::Duration left = deadline - absl::Now();
    membership = (*client)->MeshWait(key, generation,
                                     std::clamp(left, absl::ZeroDuration(), kWaitSlice));
    if (membership.ok() || absl::Now() >= deadline) break;
    if (absl::IsUnavailable(membership.status())) {
      // The coordinator is away for a moment: wait for it until the deadline.
      absl::SleepFor(std::min(deadline - absl::Now(), absl::Milliseconds(250)));
      continue;
    }
    if (!absl::IsDeadlineExceeded(membership.status())) break;
  }
  if (absl::IsNotFound(membership.status())) {
    // A coordinator that restarted has no record of the generation.
    return absl::AbortedError(absl::StrCat("mesh '", key, "' generation ", generation,
                                           " is unknown to the coordinator (restarted?): ",
                                           membership.status().message()));
  }
  return membership;
}

absl::StatusOr<FormedMesh> ClusterRendezvous::FormNow(
    const std::string& key, int64_t generation, absl::Time deadline,
    std::shared_ptr<const std::atomic<bool>> cancel_flag) {
  const std::atomic<bool>& cancel = *cancel_flag;
  const absl::Status cancelled = absl::CancelledError("the mesh went away on this host");
  absl::StatusOr<MeshMembership> membership =
      AwaitMembership(key, generation, deadline, cancel, cancelled);
  if (!membership.ok()) return membership.status();
  if (cancel.load()) return cancelled;
  FormedMesh formed;
  MeshTopology& t = formed.topology;
  t.generation = membership->generation;
  t.member_host = membership->member_host;
  t.op_timeout_ms = membership->op_timeout_ms;
  for (const HostRecord& h : membership->hosts) {
    if (h.host_id == options_.host_id) t.self = static_cast<int>(t.hosts.size());
    t.hosts.push_back(h.host_id);
    t.addresses.push_back(h.address);
  }
  if (t.self < 0) {
    return absl::InternalError(absl::StrCat("the registry's mesh '", key, "' generation ",
                                            generation, " has no member on this host"));
  }
  Cluster* client;
  std::string bind_host;
  {
    MutexLock lock(&mu_);
    client = client_;
    bind_host = bind_host_;
  }
  TransportSecurity security;
  security.key = peer_auth::MeshKey(options_.cluster_token, key, generation, membership->secret);
  security.tag = peer_auth::MeshTag(key, generation);
  security.tls = options_.tls;
  security.description = absl::StrCat("mesh '", key, "' generation ", generation);
  ClusterAddressBook book(client);
  const absl::Time now = absl::Now();
  const absl::Time connect_by =
      std::min(std::max(deadline, now + kMinConnect), now + options_.connect_timeout);
  HostMeshOptions mesh_options = options_.mesh;
  mesh_options.transport.cancelled = [cancel_flag, stopping = stopping_] {
    return cancel_flag->load() || stopping->load();
  };
  auto mesh = ConnectHostMesh(book, MeshStorePrefix(key, generation), t, bind_host,
                              std::move(security), connect_by, mesh_options);
  if (absl::IsCancelled(mesh.status()) && stopping_->load()) {
    return absl::UnavailableError("the daemon is leaving the cluster");
  }
  if (absl::IsCancelled(mesh.status())) return cancelled;
  if (!mesh.ok()) {
    return absl::Status(mesh.status().code(),
                        absl::StrCat("connecting the hosts of mesh '", key, "' generation ",
                                     generation, " (", absl::StrJoin(t.hosts, ","),
                                     "): ", mesh.status().message()));
  }
  formed.mesh = *std::move(mesh);
  if (cancel.load()) {
    formed.mesh->Abort(absl::AbortedError(absl::StrCat(
        "the mesh went away on host ", options_.host_id, " while its hosts connected")));
    return cancelled;
  }
  return formed;
}

}  // namespace collectived
