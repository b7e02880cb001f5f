#include "daemon/cluster/cluster_rendezvous.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/cluster/gloo_mesh.h"
#include "daemon/cluster/gloo_store.h"
#include "daemon/util/log.h"
#include "gloo/rendezvous/prefix_store.h"

namespace collectived {
namespace {

// The longest one registry wait lasts before Form looks at Stop again.
constexpr absl::Duration kWaitSlice = absl::Seconds(1);

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

void ClusterRendezvous::Attach(ClusterClient* client, std::string bind_host) {
  MutexLock lock(&mu_);
  client_ = client;
  bind_host_ = std::move(bind_host);
}

void ClusterRendezvous::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // Queued work still runs, answering UNAVAILABLE; Forms in flight notice
  // within a wait slice.
  serial_.reset();
  forms_.reset();
}

absl::StatusOr<ClusterClient*> ClusterRendezvous::Client() {
  MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the daemon is leaving the cluster");
  if (client_ == nullptr) {
    return absl::UnavailableError("this daemon has not reached the cluster yet");
  }
  return client_;
}

void ClusterRendezvous::Register(const MeshJoinInfo& info, int index,
                                 absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  auto cb = std::make_shared<absl::AnyInvocable<void(absl::StatusOr<int64_t>)>>(std::move(done));
  serial_->Schedule([this, info, index, cb] {
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
    (*cb)((*client)->MeshRegister(std::move(r)));
  });
}

void ClusterRendezvous::Leave(const std::string& key, int64_t generation, std::vector<int> indices,
                              bool broken, const std::string& reason) {
  serial_->Schedule([this, key, generation, indices = std::move(indices), broken, reason] {
    auto client = Client();
    absl::Status st = client.status();
    if (st.ok()) {
      st = (*client)->MeshLeave(key, generation,
                                std::vector<int32_t>(indices.begin(), indices.end()), broken,
                                reason.substr(0, 1000));
    }
    if (!st.ok()) {
      LogEvent(LogLevel::kWarn, "cluster_mesh_leave_failed",
               {{"mesh", key}, {"generation", absl::StrCat(generation)},
                {"error", st.ToString()}});
    }
  });
}

void ClusterRendezvous::Form(const std::string& key, int64_t generation, absl::Time deadline,
                             absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)> done) {
  auto cb =
      std::make_shared<absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)>>(std::move(done));
  forms_->Schedule(
      [this, key, generation, deadline, cb] { (*cb)(FormNow(key, generation, deadline)); });
}

absl::StatusOr<FormedMesh> ClusterRendezvous::FormNow(const std::string& key, int64_t generation,
                                                      absl::Time deadline) {
  absl::StatusOr<MeshMembership> membership;
  while (true) {
    auto client = Client();
    if (!client.ok()) return client.status();
    const absl::Duration left = deadline - absl::Now();
    membership = (*client)->MeshWait(key, generation,
                                     std::clamp(left, absl::ZeroDuration(), kWaitSlice));
    if (membership.ok() || !absl::IsDeadlineExceeded(membership.status()) ||
        absl::Now() >= deadline) {
      break;
    }
  }
  if (!membership.ok()) return membership.status();
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
  ClusterClient* client;
  std::string bind_host;
  {
    MutexLock lock(&mu_);
    client = client_;
    bind_host = bind_host_;
  }
  ClusterGlooStore store(client, std::chrono::milliseconds(
                                     absl::ToInt64Milliseconds(options_.connect_timeout)));
  gloo::rendezvous::PrefixStore prefixed(absl::StrCat("gloo", key, "/g", generation), store);
  auto mesh = ConnectGlooMesh(
      prefixed, t, bind_host,
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.connect_timeout)));
  if (!mesh.ok()) {
    return absl::Status(mesh.status().code(),
                        absl::StrCat("connecting the hosts of mesh '", key, "' generation ",
                                     generation, " (", absl::StrJoin(t.hosts, ","),
                                     "): ", mesh.status().message()));
  }
  formed.mesh = *std::move(mesh);
  return formed;
}

}  // namespace collectived
