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

v1::Member Engine::MemberInfo(const Mesh& mesh, int index) {
  v1::Member m;
  m.set_index(index);
  for (int c : mesh.shape.Coordinate(index)) m.add_coordinate(c);
  const std::string& sid = mesh.member_session[index];
  m.set_session_id(DisplayId(sid));
  if (Session* s = sid.empty() ? nullptr : FindSession(sid)) {
    m.set_client_name(s->client_name);
    m.set_pid(s->pid);
  }
  const std::string host = HostOf(mesh, index);
  m.set_host(host.empty() ? options_.host : host);
  return m;
}

void Engine::AddMemberSidePending(const Mesh& mesh, v1::ListPendingOpsResponse* resp) {
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
    auto* p = resp->add_ops();
    p->set_mesh_id(mesh.id);
    p->set_mesh_name(mesh.name);
    p->set_sequence(-1);
    p->set_member_side(true);
    p->set_member_op(static_cast<int64_t>(s));
    p->set_description(what);
    for (int32_t m : here) p->add_submitted(m);
    for (int32_t m : missing) p->add_missing(m);
    p->set_state("waiting");
    const int64_t age_ms = std::max<int64_t>(0, (now_ns - first_ns) / 1000000);
    p->set_age_ms(age_ms);
    p->set_deadline_ms(std::max<int64_t>(0, Millis(mesh.op_timeout) - age_ms));
  }
}

v1::MeshInfo Engine::MeshInfoOf(const Mesh& mesh) {
  v1::MeshInfo info;
  info.set_mesh_id(mesh.id);
  info.set_name(mesh.name);
  info.set_scope(mesh.scope);
  for (size_t i = 0; i < mesh.shape.names.size(); ++i) {
    auto* a = info.add_axes();
    a->set_name(mesh.shape.names[i]);
    a->set_size(mesh.shape.sizes[i]);
  }
  info.set_generation(mesh.generation);
  info.set_state(mesh.state == MeshState::kForming ? "FORMING"
                 : mesh.state == MeshState::kReady ? "READY"
                                                   : "BROKEN");
  for (size_t i = 0; i < mesh.member_session.size(); ++i) {
    if (!mesh.member_session[i].empty() || !HostOf(mesh, static_cast<int>(i)).empty()) {
      *info.add_members() = MemberInfo(mesh, static_cast<int>(i));
    }
  }
  info.set_op_timeout_ms(Millis(mesh.op_timeout));
  info.set_completed_ops(mesh.completed);
  if (mesh.segment) {
    info.set_member_op_bytes(mesh.seg.layout.payload_bytes);
    for (v1::Member& m : *info.mutable_members()) {
      m.set_member_side_ops(ReportedMemberSideOps(mesh.seg, m.index()));
    }
    info.set_member_side_ops(MostMemberSideOps(mesh.seg));
  }
  return info;
}

absl::StatusOr<v1::MeshInfo> Engine::DescribeMesh(const std::string& mesh_id,
                                                  const std::string& mesh_name,
                                                  const std::string& scope) {
  MutexLock lock(&mu_);
  std::string id = mesh_id;
  if (id.empty()) {
    if (mesh_name.empty()) return absl::InvalidArgumentError("give mesh_id or mesh_name");
    auto it = mesh_by_name_.find(MeshKey(scope, mesh_name));
    if (it == mesh_by_name_.end()) {
      return absl::NotFoundError(absl::StrCat("no forming or ready mesh named '", mesh_name, "'"));
    }
    id = it->second;
  }
  auto it = meshes_.find(id);
  if (it == meshes_.end()) return absl::NotFoundError(absl::StrCat("mesh '", id, "' not found"));
  return MeshInfoOf(*it->second);
}

void Engine::CountByDevice(const Session& s,
                           std::map<std::string, v1::DeviceBufferStats>& by_device) {
  for (const auto& [id, buffer] : s.buffers) {
    const std::string device = buffer->device();
    v1::DeviceBufferStats& d = by_device[device];
    d.set_device(device);
    d.set_kind(std::string(buffer->kind()));
    d.set_buffers(d.buffers() + 1);
    d.set_buffer_bytes(d.buffer_bytes() + static_cast<int64_t>(buffer->size()));
  }
}

v1::ListSessionsResponse Engine::ListSessions() {
  MutexLock lock(&mu_);
  v1::ListSessionsResponse resp;
  for (const auto& [id, s] : sessions_) {
    auto* info = resp.add_sessions();
    info->set_session_id(DisplayId(id));
    info->set_client_name(s->client_name);
    info->set_pid(s->pid);
    info->set_uid(s->uid);
    info->set_attached(s->attached);
    info->set_buffers(static_cast<int32_t>(s->buffers.size()));
    info->set_buffer_bytes(static_cast<int64_t>(s->buffer_bytes + s->gpu_buffer_bytes));
    std::map<std::string, v1::DeviceBufferStats> by_device;
    CountByDevice(*s, by_device);
    for (const auto& [device, d] : by_device) *info->add_buffers_by_device() = d;
    for (const auto& [mesh_id, index] : s->meshes) info->add_mesh_ids(mesh_id);
    info->set_ops_submitted(s->ops_submitted);
  }
  return resp;
}

v1::ListMeshesResponse Engine::ListMeshes() {
  MutexLock lock(&mu_);
  v1::ListMeshesResponse resp;
  for (const auto& [id, mesh] : meshes_) *resp.add_meshes() = MeshInfoOf(*mesh);
  return resp;
}

absl::StatusOr<v1::ListPendingOpsResponse> Engine::ListPendingOps(const std::string& mesh_id) {
  MutexLock lock(&mu_);
  if (!mesh_id.empty() && !meshes_.count(mesh_id)) {
    return absl::NotFoundError(absl::StrCat("mesh '", mesh_id, "' not found"));
  }
  v1::ListPendingOpsResponse resp;
  absl::Time now = absl::Now();
  for (const auto& [id, mesh] : meshes_) {
    if (!mesh_id.empty() && id != mesh_id) continue;
    for (const auto& [seq, op] : mesh->pending) {
      auto* p = resp.add_ops();
      p->set_mesh_id(id);
      p->set_mesh_name(mesh->name);
      p->set_sequence(seq);
      for (int i = 0; i < static_cast<int>(op.subs.size()); ++i) {
        if (op.subs[i]) {
          p->add_submitted(i);
          if (p->description().empty()) p->set_description(op.subs[i]->plan->signature);
        } else if (mesh->cluster && !mesh->member_host.empty() &&
                   mesh->member_host[i] != options_.rendezvous->host_id()) {
          p->add_elsewhere(i);
        } else {
          p->add_missing(i);
        }
      }
      p->set_state(op.running ? "running"
                   : op.submitted == mesh->local_members ? "queued"
                                                               : "waiting");
      p->set_age_ms(Millis(now - op.first_submit));
      p->set_deadline_ms(std::max<int64_t>(0, Millis(op.deadline - now)));
    }
    if (mesh->segment && mesh->state == MeshState::kReady) AddMemberSidePending(*mesh, &resp);
  }
  return resp;
}

v1::GetStatsResponse Engine::GetStats() {
  v1::GetStatsResponse resp;
  if (options_.rendezvous != nullptr) {
    // Outside mu_: the rendezvous takes its own locks.
    RendezvousStatus r = options_.rendezvous->Status();
    v1::ClusterStats* c = resp.mutable_cluster();
    c->set_host_id(options_.rendezvous->host_id());
    c->set_state(r.state);
    c->set_coordinator(r.coordinator);
    c->set_serves_coordinator(r.serves_coordinator);
    c->set_last_error(r.last_error);
  }
  MutexLock lock(&mu_);
  if (options_.rendezvous != nullptr) {
    v1::ClusterStats* c = resp.mutable_cluster();
    int32_t across = 0;
    for (const auto& [id, mesh] : meshes_) across += mesh->cross ? 1 : 0;
    c->set_meshes_across_hosts(across);
    c->set_ops_across_hosts(cross_ops_completed_);
    c->set_ops_across_hosts_failed(cross_ops_failed_);
  }
  resp.set_daemon_id(options_.daemon_id);
  resp.set_uptime_ms(Millis(absl::Now() - started_));
  resp.set_sessions(static_cast<int32_t>(sessions_.size()));
  resp.set_meshes(static_cast<int32_t>(meshes_.size()));
  int64_t member_side = 0;
  for (const auto& [id, mesh] : meshes_) {
    if (mesh->segment) member_side += MostMemberSideOps(mesh->seg);
  }
  resp.set_member_side_ops(member_side);
  resp.set_member_segment_bytes(static_cast<int64_t>(segment_bytes_));
  int64_t buffers = 0, bytes = 0;
  std::map<std::string, v1::DeviceBufferStats> by_device;
  for (const auto& [id, s] : sessions_) {
    buffers += static_cast<int64_t>(s->buffers.size());
    bytes += static_cast<int64_t>(s->buffer_bytes + s->gpu_buffer_bytes);
    CountByDevice(*s, by_device);
  }
  resp.set_buffers(static_cast<int32_t>(buffers));
  resp.set_buffer_bytes(bytes);
  int64_t completed = 0, failed = 0;
  for (const auto& [kind, k] : stats_) {
    auto* out = resp.add_by_kind();
    out->set_kind(std::string(OpKindName(static_cast<OpKind>(kind))));
    out->set_completed(k.completed);
    out->set_failed(k.failed);
    out->set_bytes(k.bytes);
    out->set_bytes_read(static_cast<int64_t>(k.bytes_read));
    out->set_bytes_written(static_cast<int64_t>(k.bytes_written));
    out->set_bytes_required(static_cast<int64_t>(k.bytes_required));
    completed += k.completed;
    failed += k.failed;
  }
  resp.set_ops_completed(completed);
  resp.set_ops_failed(failed);
  resp.set_submitted_fast_path(submitted_[0].load(std::memory_order_relaxed));
  resp.set_submitted_execute(submitted_[1].load(std::memory_order_relaxed));
  resp.set_submitted_unary(submitted_[2].load(std::memory_order_relaxed));
  Executor* host = ExecutorFor("memfd");
  resp.set_executor_threads(host != nullptr ? host->threads() : 0);
  for (const auto& [device, d] : by_device) *resp.add_buffers_by_device() = d;
  return resp;
}

}  // namespace collectived
