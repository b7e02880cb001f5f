// The engine's diagnostics: what sessions, meshes and pending ops look
// like to collectivectl, the metrics and GetStats.
#include "daemon/core/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "collectived/member_ops_code.h"
#include "common/fast_queue.h"
#include "daemon/core/engine_internal.h"
#include "daemon/core/join_request.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {

using namespace engine_internal;  // NOLINT(build/namespaces): the engine's own helpers

std::string Engine::MemberLabel(const Mesh& mesh, int index) {
  std::string label = absl::StrCat(index, " ", CoordString(mesh.shape.Coordinate(index)));
  const std::string& sid = mesh.member_session[index];
  const std::string host = HostOf(mesh, index);
  if (Session* s = sid.empty() ? nullptr : FindSession(sid)) {
    absl::StrAppend(&label, " pid ", s->pid, " host ", host.empty() ? options_.host : host);
    if (!s->client_name.empty()) absl::StrAppend(&label, " '", s->client_name, "'");
  } else if (!host.empty()) {
    absl::StrAppend(&label, " on host ", host);
  }
  return label;
}

MemberView Engine::MemberInfo(const Mesh& mesh, int index) {
  MemberView m;
  m.index = index;
  m.coordinate = mesh.shape.Coordinate(index);
  const std::string& sid = mesh.member_session[index];
  m.session_id = DisplayId(sid);
  if (Session* s = sid.empty() ? nullptr : FindSession(sid)) {
    m.client_name = s->client_name;
    m.pid = s->pid;
  }
  const std::string host = HostOf(mesh, index);
  m.host = host.empty() ? options_.host : host;
  return m;
}

void Engine::AddMemberSidePending(const Mesh& mesh, std::vector<PendingOpView>& ops) {
  // Everything read here is the members' to write: keys are only compared,
  // text is bounded and cleaned, times are clamped.
  const member_ops::View& v = mesh.seg;
  // A member that gave up marked the segment: nobody waits in it any more.
  if (v.header()->broken.v.load(std::memory_order_seq_cst) != 0) return;
  const uint32_t n = v.layout.members;
  std::vector<uint64_t> latest(n, 0);  // each member's last place published
  std::map<uint64_t, int> standing;    // place -> members whose last place it is
  for (uint32_t m = 0; m < n; ++m) {
    for (uint64_t parity = 0; parity < 2; ++parity) {
      const uint64_t key = v.entry(m, parity)->key.load(std::memory_order_seq_cst);
      if (key == 0 || (key & 1) != parity) continue;  // none, or not written by this layout
      if (latest[m] == 0 || KeyAfter(key, latest[m])) latest[m] = key;
    }
    if (latest[m] != 0) ++standing[latest[m]];
  }
  // Honest members stand at one or two places; a segment a member scribbled
  // on may show one per member. Only the places most members stand at are
  // looked at, so the work under mu_ and the answer stay bounded.
  constexpr size_t kMostPlaces = 4;
  std::vector<std::pair<int, uint64_t>> ranked;
  for (const auto& [key, count] : standing) ranked.emplace_back(-count, key);
  std::sort(ranked.begin(), ranked.end());
  std::vector<uint64_t> keys;
  for (size_t i = 0; i < ranked.size() && i < kMostPlaces; ++i) keys.push_back(ranked[i].second);
  std::sort(keys.begin(), keys.end());  // shown in key order
  const int64_t now_ns = fastq::MonotonicNs();
  for (const uint64_t key : keys) {
    const uint32_t d = static_cast<uint32_t>((key >> 24) - 1);
    const uint64_t s = key & 0xffffff;
    std::vector<int32_t> here, missing;
    int64_t first_ns = now_ns;
    std::string what;
    for (uint32_t m = 0; m < n; ++m) {
      if (latest[m] != 0 && KeyAfter(latest[m], key)) continue;  // past this place
      switch (member_ops::PresenceAt(v, m, d, s, key)) {
        case member_ops::Presence::kHere: {
          here.push_back(static_cast<int32_t>(m));
          const member_ops::Entry& e = *v.entry(m, s);
          first_ns = std::min(first_ns, std::max<int64_t>(e.published_ns, 0));
          if (what.empty()) what = EntrySignature(e);
          break;
        }
        case member_ops::Presence::kDaemonPath: break;
        case member_ops::Presence::kNotYet: missing.push_back(static_cast<int32_t>(m)); break;
      }
    }
    if (here.empty() || missing.empty()) continue;  // done, or nobody waits at it
    PendingOpView& p = ops.emplace_back();
    p.mesh_id = mesh.id;
    p.mesh_name = mesh.name;
    p.sequence = -1;
    p.member_side = true;
    p.member_op = static_cast<int64_t>(s);
    p.description = what;
    p.submitted = std::move(here);
    p.missing = std::move(missing);
    p.state = "waiting";
    p.age_ms = std::max<int64_t>(0, (now_ns - first_ns) / 1000000);
    p.deadline_ms = std::max<int64_t>(0, Millis(mesh.op_timeout) - p.age_ms);
  }
}

MeshView Engine::MeshInfoOf(const Mesh& mesh) {
  MeshView info;
  info.mesh_id = mesh.id;
  info.name = mesh.name;
  info.scope = mesh.scope;
  info.shape = mesh.shape;
  info.generation = mesh.generation;
  info.state = mesh.state == MeshState::kForming ? "FORMING"
               : mesh.state == MeshState::kReady ? "READY"
                                                 : "BROKEN";
  for (size_t i = 0; i < mesh.member_session.size(); ++i) {
    if (!mesh.member_session[i].empty() || !HostOf(mesh, static_cast<int>(i)).empty()) {
      info.members.push_back(MemberInfo(mesh, static_cast<int>(i)));
    }
  }
  info.op_timeout_ms = Millis(mesh.op_timeout);
  info.completed_ops = mesh.completed;
  if (mesh.segment) {
    info.member_op_bytes = static_cast<int64_t>(mesh.seg.layout.payload_bytes);
    for (MemberView& m : info.members) {
      m.member_side_ops = ReportedMemberSideOps(mesh.seg, m.index);
    }
    info.member_side_ops = MostMemberSideOps(mesh.seg);
  }
  return info;
}

absl::StatusOr<MeshView> Engine::DescribeMesh(const std::string& mesh_id,
                                              const std::string& mesh_name,
                                              const std::string& scope) {
  MutexLock lock(&mu_);
  std::string id = mesh_id;
  if (id.empty()) {
    if (mesh_name.empty()) return absl::InvalidArgumentError("give mesh_id or mesh_name");
    const std::string* holder = names_.Holder(MeshKey(scope, mesh_name));
    if (holder == nullptr) {
      return absl::NotFoundError(absl::StrCat("no forming or ready mesh named '", mesh_name, "'"));
    }
    id = *holder;
  }
  auto it = meshes_.find(id);
  if (it == meshes_.end()) return absl::NotFoundError(absl::StrCat("mesh '", id, "' not found"));
  return MeshInfoOf(*it->second);
}

void Engine::CountByDevice(const Session& s,
                           std::map<std::string, DeviceBuffers>& by_device) {
  for (const auto& [id, buffer] : s.buffers) {
    const std::string device = buffer->device();
    DeviceBuffers& d = by_device[device];
    d.device = device;
    d.kind = std::string(buffer->kind());
    ++d.buffers;
    d.buffer_bytes += static_cast<int64_t>(buffer->size());
  }
}

std::vector<SessionView> Engine::ListSessions() {
  MutexLock lock(&mu_);
  std::vector<SessionView> sessions;
  for (const auto& [id, s] : sessions_) {
    SessionView& info = sessions.emplace_back();
    info.session_id = DisplayId(id);
    info.client_name = s->client_name;
    info.pid = s->pid;
    info.uid = s->uid;
    info.attached = s->attached;
    info.buffers = static_cast<int32_t>(s->buffers.size());
    info.buffer_bytes = static_cast<int64_t>(s->buffer_bytes + s->gpu_buffer_bytes);
    std::map<std::string, DeviceBuffers> by_device;
    CountByDevice(*s, by_device);
    for (auto& [device, d] : by_device) info.buffers_by_device.push_back(std::move(d));
    for (const auto& [mesh_id, index] : s->meshes) info.mesh_ids.push_back(mesh_id);
    info.ops_submitted = s->ops_submitted;
  }
  return sessions;
}

std::vector<MeshView> Engine::ListMeshes() {
  MutexLock lock(&mu_);
  std::vector<MeshView> meshes;
  for (const auto& [id, mesh] : meshes_) meshes.push_back(MeshInfoOf(*mesh));
  return meshes;
}

absl::StatusOr<std::vector<PendingOpView>> Engine::ListPendingOps(const std::string& mesh_id) {
  MutexLock lock(&mu_);
  if (!mesh_id.empty() && !meshes_.count(mesh_id)) {
    return absl::NotFoundError(absl::StrCat("mesh '", mesh_id, "' not found"));
  }
  std::vector<PendingOpView> ops;
  absl::Time now = absl::Now();
  for (const auto& [id, mesh] : meshes_) {
    if (!mesh_id.empty() && id != mesh_id) continue;
    for (const auto& [seq, op] : mesh->pending) {
      PendingOpView& p = ops.emplace_back();
      p.mesh_id = id;
      p.mesh_name = mesh->name;
      p.sequence = seq;
      for (int i = 0; i < static_cast<int>(op.subs.size()); ++i) {
        if (op.subs[i]) {
          p.submitted.push_back(i);
          if (p.description.empty()) p.description = op.subs[i]->plan->signature;
        } else if (mesh->cluster && !mesh->member_host.empty() &&
                   mesh->member_host[i] != options_.rendezvous->host_id()) {
          p.elsewhere.push_back(i);
        } else {
          p.missing.push_back(i);
        }
      }
      p.state = op.running ? "running"
                : op.submitted == mesh->local_members ? "queued"
                                                      : "waiting";
      p.age_ms = Millis(now - op.first_submit);
      p.deadline_ms = std::max<int64_t>(0, Millis(op.deadline - now));
    }
    if (mesh->segment && mesh->state == MeshState::kReady) AddMemberSidePending(*mesh, ops);
  }
  return ops;
}

EngineStats Engine::GetStats() {
  EngineStats resp;
  if (options_.rendezvous != nullptr) {
    // Outside mu_: the rendezvous takes its own locks.
    RendezvousStatus r = options_.rendezvous->Status();
    ClusterView& c = resp.cluster.emplace();
    c.host_id = options_.rendezvous->host_id();
    c.state = r.state;
    c.coordinator = r.coordinator;
    c.serves_coordinator = r.serves_coordinator;
    c.last_error = r.last_error;
  }
  MutexLock lock(&mu_);
  if (resp.cluster.has_value()) {
    ClusterView& c = *resp.cluster;
    for (const auto& [id, mesh] : meshes_) c.meshes_across_hosts += mesh->cross ? 1 : 0;
    c.ops_across_hosts = cross_ops_completed_;
    c.ops_across_hosts_failed = cross_ops_failed_;
  }
  resp.daemon_id = options_.daemon_id;
  resp.uptime_ms = Millis(absl::Now() - started_);
  resp.sessions = static_cast<int32_t>(sessions_.size());
  resp.meshes = static_cast<int32_t>(meshes_.size());
  for (const auto& [id, mesh] : meshes_) {
    if (mesh->segment) resp.member_side_ops += MostMemberSideOps(mesh->seg);
  }
  resp.member_segment_bytes = static_cast<int64_t>(segment_bytes_);
  resp.member_side_sessions = member_side_sessions();
  int64_t buffers = 0;
  std::map<std::string, DeviceBuffers> by_device;
  for (const auto& [id, s] : sessions_) {
    buffers += static_cast<int64_t>(s->buffers.size());
    resp.buffer_bytes += static_cast<int64_t>(s->buffer_bytes + s->gpu_buffer_bytes);
    CountByDevice(*s, by_device);
  }
  resp.buffers = static_cast<int32_t>(buffers);
  for (const auto& [kind, k] : stats_) {
    resp.by_kind.push_back(k);
    resp.ops_completed += k.completed;
    resp.ops_failed += k.failed;
  }
  resp.submitted_fast_path = submitted_[0].load(std::memory_order_relaxed);
  resp.submitted_execute = submitted_[1].load(std::memory_order_relaxed);
  resp.submitted_unary = submitted_[2].load(std::memory_order_relaxed);
  Executor* host = ExecutorFor("memfd");
  resp.executor_threads = host != nullptr ? host->threads() : 0;
  for (auto& [device, d] : by_device) resp.buffers_by_device.push_back(std::move(d));
  return resp;
}

}  // namespace collectived
