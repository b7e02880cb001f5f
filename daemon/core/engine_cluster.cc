// The engine's meshes across hosts: registration with the cluster's
// registry, forming through the rendezvous, host meshes.
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

std::string Engine::HostOf(const Mesh& mesh, int index) const {
  if (!mesh.cluster) return "";
  if (!mesh.member_host.empty()) return mesh.member_host[index];
  return mesh.member_session[index].empty() ? "" : options_.rendezvous->host_id();
}

void Engine::TellCluster(const Mesh& mesh, std::vector<int> indices, bool broken,
                         const std::string& reason, Callbacks& cbs) {
  // A mesh of this host alone gave its indices back when it formed.
  if (!mesh.cluster || mesh.cluster_generation == 0 || (broken && mesh.local_only)) return;
  cbs.push_back([r = options_.rendezvous, key = mesh.join_info.key, g = mesh.cluster_generation,
                 indices = std::move(indices), broken, reason] {
    r->Leave(key, g, indices, broken, reason);
  });
}

void Engine::RetireCross(Mesh& mesh) {
  if (!mesh.cross) return;
  // A broken mesh closes with why it broke (this host may close it before
  // its BreakMesh's own Abort ran): the other hosts are told the cause, not
  // that it closed.
  const absl::Status why =
      !mesh.broken_status.ok()
          ? mesh.broken_status
          : absl::AbortedError(absl::StrCat("mesh '", mesh.name, "' was closed on host ",
                                            options_.rendezvous != nullptr
                                                ? options_.rendezvous->host_id()
                                                : options_.host));
  runners_->Schedule([cross = std::move(mesh.cross), why]() mutable {
    cross->Abort(why);
    cross.reset();
  });
  mesh.cross = nullptr;
}

void Engine::FailForming(absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it,
                         const absl::Status& status, Callbacks& cbs) {
  Mesh& mesh = *it->second;
  std::vector<int> joiners;
  for (const auto& [index, waiter] : mesh.join_waiters) joiners.push_back(index);
  for (int index : joiners) RemoveJoiner(mesh, index, status, cbs);
  names_.Release(mesh.key, mesh.id);
  EraseMesh(it);
}

void Engine::RegisterLater(const std::string& mesh_id, int index, const std::string& session_id) {
  timer_->Schedule(absl::Now() + kRegisterRetry, [this, mesh_id, index, session_id] {
    Callbacks retry;
    {
      MutexLock relock(&mu_);
      auto again = meshes_.find(mesh_id);
      if (again == meshes_.end() || shutting_down_) return;
      Mesh& m = *again->second;
      if (m.state != MeshState::kForming || m.member_session[index] != session_id ||
          !m.join_waiters.count(index)) {
        return;
      }
      Register(m, index, session_id, retry);
    }
    Run(retry);
  });
}

void Engine::OnRegistered(const std::string& mesh_id, const std::string& key, int index,
                          const std::string& session_id, absl::StatusOr<int64_t> generation) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(mesh_id);
    Mesh* mesh = it == meshes_.end() ? nullptr : it->second.get();
    if (mesh != nullptr) --mesh->registering;
    // Gives this registration back to the registry.
    auto give_back = [&](const char* why) {
      if (!generation.ok()) return;
      cbs.push_back([r = options_.rendezvous, key, g = *generation, index, why] {
        r->Leave(key, g, {index}, false, why);
      });
    };
    if (mesh == nullptr || mesh->member_session[index] != session_id || shutting_down_) {
      // The joiner left (or the daemon is stopping) before the answer came.
      give_back("left before the mesh formed");
    } else if (mesh->local_only) {
      give_back("the mesh formed on one host");
    } else if (mesh->state != MeshState::kForming) {
      // Formed (the registry filled before this answer came) or broken.
      if (generation.ok() && *generation == mesh->cluster_generation) {
        mesh->registered[index] = true;
      } else {
        give_back("joined another generation");
      }
    } else if (absl::IsUnavailable(generation.status()) &&
               mesh->join_waiters.count(index) > 0 &&
               absl::Now() >= mesh->join_waiters.at(index).deadline) {
      // The registry could not be reached before the joiner's deadline
      // (the call ran until it): the joiner fails now, saying why.
      mesh->registry_error = generation.status();
      OnJoinDeadlineLocked(*mesh, index, cbs);
      MaybeEraseMesh(mesh_id);
    } else if (absl::IsUnavailable(generation.status())) {
      // No coordinator (yet): the mesh may still fill on this host alone,
      // and the registration is tried again while the joiner waits.
      mesh->registry_error = generation.status();
      RegisterLater(mesh_id, index, session_id);
    } else if (!generation.ok()) {
      LogEventLater(cbs, LogLevel::kWarn, "join_refused",
                    {{"mesh", mesh->name}, {"index", absl::StrCat(index)},
                {"error", generation.status().ToString()}});
      RemoveJoiner(*mesh, index, generation.status(), cbs);
      MaybeEraseMesh(mesh_id);
    } else if (mesh->cluster_generation == 0) {
      mesh->registry_error = absl::OkStatus();
      mesh->cluster_generation = *generation;
      mesh->generation = *generation;
      mesh->registered[index] = true;
      auto waiter = mesh->join_waiters.find(index);
      const absl::Time deadline =
          waiter != mesh->join_waiters.end() ? waiter->second.deadline : absl::Now();
      mesh->form_cancel = std::make_shared<std::atomic<bool>>(false);
      StartForm(*mesh, deadline, cbs);
    } else if (*generation != mesh->cluster_generation) {
      // The registry started another generation while this mesh formed
      // (the one it had ended): this member is in that one, not ours.
      give_back("joined a stale generation");
      RemoveJoiner(*mesh, index,
                   absl::AbortedError(absl::StrCat(
                       "mesh '", mesh->name, "' generation ", mesh->cluster_generation,
                       " ended on the cluster while this member joined; join again")),
                   cbs);
      MaybeEraseMesh(mesh_id);
    } else {
      mesh->registry_error = absl::OkStatus();
      mesh->registered[index] = true;
    }
  }
  Run(cbs);
}

void Engine::Register(Mesh& mesh, int index, const std::string& session_id,
                      Callbacks& cbs) {
  MeshJoinInfo info = mesh.join_info;
  if (mesh.op_timeout_set) info.op_timeout_ms = Millis(mesh.op_timeout);
  auto waiter = mesh.join_waiters.find(index);
  const absl::Time deadline =
      waiter != mesh.join_waiters.end() ? waiter->second.deadline : absl::Now();
  ++mesh.registering;
  cbs.push_back([this, info = std::move(info), mesh_id = mesh.id, index, session_id, deadline] {
    options_.rendezvous->Register(
        info, index, deadline,
        [this, mesh_id, key = info.key, index, session_id](absl::StatusOr<int64_t> g) {
          OnRegistered(mesh_id, key, index, session_id, std::move(g));
        });
  });
}

void Engine::StartForm(Mesh& mesh, absl::Time deadline, Callbacks& cbs) {
  cbs.push_back([this, key = mesh.join_info.key, g = mesh.cluster_generation, deadline,
                 mesh_id = mesh.id,
                 cancel = std::shared_ptr<const std::atomic<bool>>(mesh.form_cancel)] {
    options_.rendezvous->Form(key, g, deadline, cancel,
                              [this, mesh_id](absl::StatusOr<FormedMesh> formed) {
                                OnFormed(mesh_id, std::move(formed));
                              });
  });
}

void Engine::OnFormed(const std::string& mesh_id, absl::StatusOr<FormedMesh> formed) {
  Callbacks cbs;
  std::unique_ptr<CrossHostMesh> orphan;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(mesh_id);
    if (it == meshes_.end() || it->second->state != MeshState::kForming || shutting_down_) {
      // Every local joiner left meanwhile (the registry was told), or the
      // daemon is stopping.
      if (formed.ok()) orphan = std::move(formed->mesh);
    } else if (!formed.ok()) {
      NotFormed(it, formed.status(), cbs);
    } else {
      orphan = AdoptFormed(it, *std::move(formed), cbs);
    }
  }
  if (orphan) {
    orphan->Abort(absl::AbortedError(absl::StrCat("the mesh did not form on host ",
                                                  options_.rendezvous->host_id())));
  }
  orphan.reset();
  Run(cbs);
}

void Engine::NotFormed(absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it,
                       const absl::Status& status, Callbacks& cbs) {
  // A mesh that did not fill by the first joiner's deadline: the joiners
  // whose own deadline has passed fail with the registry's answer, the
  // others keep waiting, until the next deadline among them.
  Mesh& mesh = *it->second;
  absl::Time next = absl::InfiniteFuture();
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    const absl::Time now = absl::Now();
    for (const auto& [index, waiter] : mesh.join_waiters) {
      if (waiter.deadline > now) next = std::min(next, waiter.deadline);
    }
  }
  if (next == absl::InfiniteFuture()) {
    LogEventLater(cbs, LogLevel::kWarn, "mesh_not_formed",
                  {{"mesh", mesh.name}, {"error", status.ToString()}});
    FailForming(it, status, cbs);
    return;
  }
  std::vector<int> expired;
  for (const auto& [index, waiter] : mesh.join_waiters) {
    if (waiter.deadline < next) expired.push_back(index);
  }
  for (int index : expired) RemoveJoiner(mesh, index, status, cbs);
  StartForm(mesh, next, cbs);
}

std::unique_ptr<CrossHostMesh> Engine::AdoptFormed(
    absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it, FormedMesh formed,
    Callbacks& cbs) {
  Mesh& mesh = *it->second;
  const MeshTopology& t = formed.topology;
  const std::string self = options_.rendezvous->host_id();
  std::vector<int> gone;
  int local = 0;
  for (int i = 0; i < mesh.shape.num_members(); ++i) {
    if (t.member_host[i] != self) continue;
    ++local;
    if (mesh.member_session[i].empty()) gone.push_back(i);
  }
  if (!gone.empty() || local == 0) {
    const std::string reason =
        local == 0 ? absl::StrCat("the registry placed no member on host ", self)
                   : absl::StrCat("members ", absl::StrJoin(gone, ","), " on host ", self,
                                  " left before the mesh formed");
    TellCluster(mesh, {}, true, reason, cbs);
    FailForming(it, absl::AbortedError(absl::StrCat("mesh '", mesh.name, "': ", reason)), cbs);
    return std::move(formed.mesh);
  }
  // A joiner here whose coordinate the registry gave to another host (its
  // own registration is refused, or still on its way).
  std::vector<int> elsewhere;
  for (const auto& [index, waiter] : mesh.join_waiters) {
    if (t.member_host[index] != self) elsewhere.push_back(index);
  }
  for (int index : elsewhere) {
    RemoveJoiner(mesh, index,
                 absl::AlreadyExistsError(absl::StrCat(
                     "coordinate ", CoordString(mesh.shape.Coordinate(index)), " of mesh '",
                     mesh.name, "' is taken by a member on host ", t.member_host[index])),
                 cbs);
  }
  mesh.member_host = t.member_host;
  mesh.local_members = local;
  // Members of other hosts never leave here: for this host, they are gone
  // once the mesh breaks (MaybeEraseMesh waits for local ones).
  for (int i = 0; i < mesh.shape.num_members(); ++i) {
    if (t.member_host[i] != self) mesh.member_left[i] = true;
  }
  mesh.form_cancel.reset();
  mesh.generation = t.generation;
  if (t.op_timeout_ms > 0 && !mesh.op_timeout_set) {
    mesh.op_timeout = absl::Milliseconds(t.op_timeout_ms);
    mesh.op_timeout_set = true;
  }
  mesh.cross = std::shared_ptr<CrossHostMesh>(std::move(formed.mesh));
  // What the other hosts say between ops reaches the engine: a break
  // (named), a question about a late op. Installed outside the lock (an
  // earlier break is reported at once).
  cbs.push_back([this, cross = mesh.cross, mesh_id = mesh.id] {
    CrossHostObserver observer;
    observer.on_broken = [this, mesh_id](const absl::Status& why) { OnCrossBroken(mesh_id, why); };
    observer.on_query = [this, mesh_id](int64_t sequence) { return MissingAt(mesh_id, sequence); };
    cross->Observe(std::move(observer));
  });
  LogEventLater(cbs, LogLevel::kInfo, "mesh_formed_across_hosts",
                {{"mesh", mesh.name}, {"generation", absl::StrCat(mesh.generation)},
                 {"hosts", absl::StrJoin(t.hosts, ",")}, {"local_members", absl::StrCat(local)}});
  CompleteJoin(mesh, cbs);
  return nullptr;
}

}  // namespace collectived
