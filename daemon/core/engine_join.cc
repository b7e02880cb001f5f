// The engine's meshes on one host: joins, forming, deadlines of joiners,
// leaving, breaking and erasing meshes.
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

void Engine::JoinMesh(const JoinRequest& req, JoinDone done) {
  Callbacks cbs;
  // Run after unlocking, on every return.
  absl::Cleanup run_callbacks = [&cbs] { Run(cbs); };
  MutexLock lock(&mu_);
  const absl::Status error = JoinLocked(req, done, cbs);
  if (error.ok()) return;
  LogEventLater(cbs, LogLevel::kWarn, "join_failed",
                {{"mesh", req.mesh_name}, {"session", DisplayId(req.session_id)},
                 {"error", error.ToString()}});
  cbs.push_back([done = std::move(done), error] { done(error); });
}

absl::Status Engine::JoinLocked(const JoinRequest& req, JoinDone& done, Callbacks& cbs) {
  auto s = GetSession(req.session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  const absl::StatusOr<JoinSpec> valid =
      ValidateJoin(req, {options_.max_mesh_members, options_.rendezvous != nullptr});
  if (!valid.ok()) return valid.status();
  const JoinSpec& spec = *valid;
  // An older, broken generation of the same name is left automatically,
  // once every check below has passed (a rejected join changes nothing).
  std::vector<std::pair<std::string, int>> stale;
  for (const auto& [mesh_id, member_index] : session->meshes) {
    auto m = meshes_.find(mesh_id);
    if (m == meshes_.end() || m->second->key != spec.key) continue;
    if (m->second->state != MeshState::kBroken) {
      return absl::AlreadyExistsError(absl::StrCat(
          "this session is already member ", member_index, " of mesh '", req.mesh_name,
          "' (generation ", m->second->generation, ")"));
    }
    stale.emplace_back(mesh_id, member_index);
  }
  absl::StatusOr<Mesh*> found = MeshToJoinLocked(req, spec, *session, cbs);
  if (!found.ok()) return found.status();
  Mesh* mesh = *found;
  int index = spec.index;
  if (spec.assign) {
    const auto free = std::find(mesh->member_session.begin(), mesh->member_session.end(), "");
    index = free == mesh->member_session.end()
                ? -1
                : static_cast<int>(free - mesh->member_session.begin());
  } else if (!mesh->member_session[index].empty()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "coordinate ", CoordString(spec.shape.Coordinate(index)), " of mesh '", mesh->name,
        "' is taken by member ", MemberLabel(*mesh, index)));
  }
  // Every check passed: from here on the join takes effect.
  for (const auto& [old_id, old_index] : stale) {
    session->meshes.erase(old_id);
    meshes_.at(old_id)->member_left[old_index] = true;
    MaybeEraseMesh(old_id);
  }
  if (req.op_timeout_ms > 0 && !mesh->op_timeout_set) {
    mesh->op_timeout = absl::Milliseconds(req.op_timeout_ms);
    mesh->op_timeout_set = true;
  }
  mesh->member_session[index] = session->id;
  session->meshes[mesh->id] = index;
  JoinWaiter waiter;
  waiter.session_id = session->id;
  waiter.done = std::move(done);
  absl::Duration timeout =
      req.timeout_ms > 0 ? absl::Milliseconds(req.timeout_ms) : options_.join_timeout;
  std::string mesh_id = mesh->id;
  waiter.deadline = absl::Now() + timeout;
  waiter.timer = timer_->Schedule(waiter.deadline,
                                  [this, mesh_id, index] { OnJoinDeadline(mesh_id, index); });
  mesh->join_waiters[index] = std::move(waiter);
  if (mesh->cluster && static_cast<int>(mesh->join_waiters.size()) == mesh->shape.num_members()) {
    // Every member joined here: a mesh of this host alone, whatever the
    // registry says (its indices there are given back).
    std::vector<int> all(mesh->shape.num_members());
    std::iota(all.begin(), all.end(), 0);
    TellCluster(*mesh, all, false, "the mesh formed on one host", cbs);
    mesh->local_only = true;
    mesh->local_members = mesh->shape.num_members();
    mesh->member_host.assign(mesh->shape.num_members(), options_.rendezvous->host_id());
    CompleteJoin(*mesh, cbs);
  } else if (mesh->cluster) {
    // The registry decides whether the join stands and when the mesh is
    // full; the joiner waits for it (OnRegistered, OnFormed).
    Register(*mesh, index, session->id, cbs);
  } else if (static_cast<int>(mesh->join_waiters.size()) == mesh->shape.num_members()) {
    CompleteJoin(*mesh, cbs);
  }
  return absl::OkStatus();
}

absl::StatusOr<Engine::Mesh*> Engine::MeshToJoinLocked(const JoinRequest& req,
                                                       const JoinSpec& spec, Session& session,
                                                       Callbacks& cbs) {
  const std::string* holder = names_.Holder(spec.key);
  if (holder == nullptr) return NewMeshLocked(req, spec, cbs);
  Mesh& mesh = *meshes_.at(*holder);
  if (mesh.state == MeshState::kReady && mesh.token == req.join_token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' generation ", mesh.generation, " is already full (",
        mesh.shape.num_members(), " members)"));
  }
  absl::Status refused;
  if (mesh.token != req.join_token) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        "mesh '", mesh.name, "' needs the join token its first member set"));
  } else if (mesh.shape.names != spec.shape.names || mesh.shape.sizes != spec.shape.sizes) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' is forming with axes (", AxesString(mesh.shape),
        ") but this join asks for (", AxesString(spec.shape), ")"));
  } else if (mesh.assign != spec.assign) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "': members ",
        mesh.assign ? "asked the daemon to assign coordinates"
                     : "gave explicit coordinates",
        "; every member must do the same"));
  } else if (req.op_timeout_ms > 0 && mesh.op_timeout_set &&
             Millis(mesh.op_timeout) != req.op_timeout_ms) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' has op_timeout_ms ", Millis(mesh.op_timeout),
        " but this join asks for ", req.op_timeout_ms));
  }
  if (!refused.ok()) {
    // The members already waiting hear of it if they time out.
    if (mesh.state == MeshState::kForming) {
      constexpr size_t kMaxRefusedJoins = 4;
      if (mesh.refused_joins.size() == kMaxRefusedJoins) {
        mesh.refused_joins.erase(mesh.refused_joins.begin());
      }
      mesh.refused_joins.push_back(absl::StrCat("pid ", session.pid, " '",
                                                 session.client_name, "': ",
                                                 refused.message()));
    }
    return refused;
  }
  return &mesh;
}

absl::StatusOr<Engine::Mesh*> Engine::NewMeshLocked(const JoinRequest& req,
                                                    const JoinSpec& spec, Callbacks& cbs) {
  // No mesh holds the name now, but an earlier generation's token may
  // still bind it.
  if (absl::Status st = names_.CheckToken(spec.key, req.mesh_name, req.join_token, absl::Now());
      !st.ok()) {
    return st;
  }
  if (static_cast<int>(meshes_.size()) >= options_.max_meshes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mesh limit reached (", options_.max_meshes, ")"));
  }
  auto m = std::make_unique<Mesh>();
  m->id = RandomId("m-");
  m->name = req.mesh_name;
  m->scope = req.scope;
  m->key = spec.key;
  m->token = req.join_token;
  m->shape = spec.shape;
  m->generation = names_.Begin(spec.key, m->id, req.join_token);
  m->assign = spec.assign;
  m->op_timeout = options_.op_timeout;
  m->member_session.assign(spec.members, "");
  m->member_left.assign(spec.members, false);
  m->next_sequence.assign(spec.members, 0);
  m->local_members = static_cast<int>(spec.members);
  if (options_.rendezvous != nullptr) {
    m->cluster = true;
    m->local_members = 0;  // known once formed
    m->join_info.key = absl::StrCat("mesh", spec.key);
    m->join_info.axes = AxesString(spec.shape);
    m->join_info.members = spec.members;
    m->join_info.token = req.join_token;
    m->registered.assign(spec.members, false);
  }
  Mesh* mesh = m.get();
  meshes_.emplace(m->id, std::move(m));
  LogEventLater(cbs, LogLevel::kInfo, "mesh_forming",
                {{"mesh", mesh->name}, {"id", mesh->id}, {"axes", AxesString(spec.shape)},
                 {"generation", absl::StrCat(mesh->generation)}});
  return mesh;
}

void Engine::CompleteJoin(Mesh& mesh, Callbacks& cbs) {
  mesh.state = MeshState::kReady;
  if (options_.member_op_bytes > 0 && !mesh.cluster) {
    const member_ops::Layout layout = member_ops::Layout::For(
        static_cast<uint32_t>(mesh.shape.num_members()), options_.member_op_bytes);
    if (layout.total_bytes > 0 &&
        segment_bytes_ + layout.total_bytes > options_.member_segment_total_bytes) {
      // Its members learn it from MeshInfo (member_op_bytes 0): the mesh
      // works, through the daemon only.
      LogEventLater(cbs, LogLevel::kWarn, "member_segment_refused",
                    {{"mesh", mesh.name},
                {"segment_bytes", absl::StrCat(layout.total_bytes)},
                {"in_use", absl::StrCat(segment_bytes_)},
                {"limit", absl::StrCat(options_.member_segment_total_bytes)}});
    } else if (layout.total_bytes > 0) {
      auto segment = CreateMemfdBuffer(layout.total_bytes);
      if (segment.ok()) {
        mesh.segment = *std::move(segment);
        segment_bytes_ += layout.total_bytes;
        mesh.seg = member_ops::View{static_cast<uint8_t*>(mesh.segment->data()), layout};
        member_ops::Init(mesh.segment->data(), layout, Millis(mesh.op_timeout),
                         COLLECTIVED_MEMBER_OPS_CODE);
      } else {
        // Every member learns it from MeshInfo: the mesh works, through the
        // daemon only.
        LogEventLater(cbs, LogLevel::kWarn, "member_segment_failed",
                      {{"mesh", mesh.name}, {"error", std::string(segment.status().message())}});
      }
    }
  }
  const MeshView info = MeshInfoOf(mesh);
  for (auto& [index, waiter] : mesh.join_waiters) {
    timer_->Cancel(waiter.timer);
    Joined joined{info, MemberInfo(mesh, index)};
    cbs.push_back([done = std::move(waiter.done), joined = std::move(joined)] { done(joined); });
  }
  mesh.join_waiters.clear();
  LogEventLater(cbs, LogLevel::kInfo, "mesh_ready",
                {{"mesh", mesh.name},
                 {"id", mesh.id},
                 {"generation", absl::StrCat(mesh.generation)},
                 {"members", absl::StrCat(mesh.shape.num_members())}});
}

void Engine::RemoveJoiner(Mesh& mesh, int index, const absl::Status& status, Callbacks& cbs) {
  auto it = mesh.join_waiters.find(index);
  if (it != mesh.join_waiters.end()) {
    timer_->Cancel(it->second.timer);
    cbs.push_back([done = std::move(it->second.done), status] { done(status); });
    mesh.join_waiters.erase(it);
  }
  const std::string sid = mesh.member_session[index];
  if (Session* s = FindSession(sid)) s->meshes.erase(mesh.id);
  mesh.member_session[index].clear();
  // Its index is free again on the cluster (an index whose registration
  // has not been answered yet is given back by OnRegistered).
  if (mesh.cluster && mesh.registered[index]) {
    mesh.registered[index] = false;
    TellCluster(mesh, {index}, false, std::string(status.message()), cbs);
  }
}

void Engine::OnJoinDeadline(const std::string& mesh_id, int index) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(mesh_id);
    if (it == meshes_.end()) return;
    Mesh& mesh = *it->second;
    if (mesh.state != MeshState::kForming || !mesh.join_waiters.count(index)) return;
    JoinWaiter& waiter = mesh.join_waiters.at(index);
    if (mesh.cluster && (mesh.form_cancel || mesh.registering > 0) &&
        absl::Now() < waiter.deadline + kClusterJoinGrace) {
      // The registry answers at this deadline too (naming every host's
      // missing members, or why it cannot be reached): its answer first.
      waiter.timer = timer_->Schedule(waiter.deadline + kClusterJoinGrace,
                                      [this, mesh_id, index] { OnJoinDeadline(mesh_id, index); });
      return;
    }
    OnJoinDeadlineLocked(mesh, index, cbs);
    MaybeEraseMesh(mesh_id);
  }
  Run(cbs);
}

void Engine::OnJoinDeadlineLocked(Mesh& mesh, int index, Callbacks& cbs) {
  {
    std::vector<std::string> joined, missing;
    for (int i = 0; i < mesh.shape.num_members(); ++i) {
      if (mesh.member_session[i].empty()) {
        missing.push_back(CoordString(mesh.shape.Coordinate(i)));
      } else {
        joined.push_back(MemberLabel(mesh, i));
      }
    }
    absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "mesh '", mesh.name, "' (", AxesString(mesh.shape), "): timed out waiting for ",
        missing.size(), " of ", mesh.shape.num_members(), " members to join; joined: ",
        absl::StrJoin(joined, "; "), "; missing coordinates: ", absl::StrJoin(missing, " ")));
    if (!mesh.refused_joins.empty()) {
      status = absl::DeadlineExceededError(
          absl::StrCat(status.message(), "; joins of this name refused meanwhile: ",
                       absl::StrJoin(mesh.refused_joins, "; ")));
    }
    if (!mesh.registry_error.ok()) {
      // Members elsewhere could not be reached: say so, as UNAVAILABLE.
      status = absl::UnavailableError(absl::StrCat(
          status.message(), "; the cluster's mesh registry could not be reached: ",
          mesh.registry_error.message()));
    }
    LogEventLater(cbs, LogLevel::kWarn, "join_timeout",
                  {{"mesh", mesh.name}, {"error", status.ToString()}});
    RemoveJoiner(mesh, index, status, cbs);
  }
}

void Engine::BreakMesh(Mesh& mesh, const std::string& reason, Callbacks& cbs, LogLevel level,
                       absl::StatusCode code, bool from_other_host) {
  if (mesh.state == MeshState::kBroken) return;
  mesh.state = MeshState::kBroken;
  mesh.broken_reason = reason;
  mesh.broken_status = absl::Status(code, reason);
  names_.Release(mesh.key, mesh.id);
  absl::Status status = absl::AbortedError(absl::StrCat(
      "mesh '", mesh.name, "' generation ", mesh.generation, " is broken: ", reason));
  MarkSegmentBroken(mesh, status);
  // Across hosts: the registry ends the generation, and closing the
  // connections fails the other hosts' ops in flight.
  TellCluster(mesh, {}, true, reason, cbs);
  if (mesh.cross && !from_other_host) {
    // The other hosts are told the reason itself (their messages add their
    // own mesh prefix).
    cbs.push_back([cross = mesh.cross, why = absl::Status(code, reason)] { cross->Abort(why); });
  }
  for (auto it = mesh.pending.begin(); it != mesh.pending.end();) {
    if (it->second.running) {
      // Finishes on its own; its outcome stands. One still waiting for its
      // members' streams stops waiting and fails with `status`.
      if (it->second.cancel) it->second.cancel->Cancel(status);
      ++it;
      continue;
    }
    FailOp(mesh, it->second, status, cbs);
    it = mesh.pending.erase(it);
  }
  LogEventLater(cbs, level, "mesh_broken",
                {{"mesh", mesh.name},
                 {"id", mesh.id},
                 {"generation", absl::StrCat(mesh.generation)},
                 {"reason", reason}});
}

void Engine::MarkSegmentBroken(Mesh& mesh, const absl::Status& status) {
  if (!mesh.segment) return;
  member_ops::MarkBroken(mesh.seg, static_cast<uint32_t>(status.code()),
                         status.message().data(), status.message().size());
}

void Engine::MaybeEraseMesh(const std::string& mesh_id) {
  auto it = meshes_.find(mesh_id);
  if (it == meshes_.end()) return;
  Mesh& mesh = *it->second;
  if (mesh.state == MeshState::kForming) {
    if (mesh.join_waiters.empty()) {
      names_.Release(mesh.key, mesh.id);
      EraseMesh(it);
    }
    return;
  }
  if (mesh.state != MeshState::kBroken) return;
  for (size_t i = 0; i < mesh.member_left.size(); ++i) {
    if (!mesh.member_left[i]) return;
  }
  for (const auto& [seq, op] : mesh.pending) {
    if (op.running) return;  // erased when the op finishes
  }
  EraseMesh(it);
}

void Engine::EraseMesh(absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it) {
  names_.MeshGone(it->second->key, absl::Now());
  RetireCross(*it->second);
  if (it->second->form_cancel) it->second->form_cancel->store(true);
  if (it->second->segment) segment_bytes_ -= it->second->seg.layout.total_bytes;
  meshes_.erase(it);
}

absl::Status Engine::LeaveMesh(const std::string& session_id, const std::string& mesh_id) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    auto s = GetSession(session_id);
    if (!s.ok()) return s.status();
    Session* session = *s;
    auto m = session->meshes.find(mesh_id);
    if (m == session->meshes.end()) {
      return absl::NotFoundError(
          absl::StrCat("this session is not a member of mesh '", mesh_id, "'"));
    }
    int index = m->second;
    Mesh& mesh = *meshes_.at(mesh_id);
    if (mesh.state == MeshState::kForming) {
      RemoveJoiner(mesh, index, absl::CancelledError("left the mesh before it formed"), cbs);
    } else {
      if (mesh.state == MeshState::kReady) {
        BreakMesh(mesh, absl::StrCat("member ", MemberLabel(mesh, index), " left the mesh"), cbs,
                  LogLevel::kInfo);
      }
      mesh.member_left[index] = true;
      session->meshes.erase(m);
    }
    MaybeEraseMesh(mesh_id);
  }
  Run(cbs);
  return absl::OkStatus();
}

}  // namespace collectived
