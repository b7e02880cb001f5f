// The engine: construction, the executors and allocators it chose, running
// callbacks, sessions, shutdown. Its other jobs live in engine_*.cc (see
// DESIGN.md, Layers).
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

namespace {

constexpr size_t kMaxClientName = 128;

Backends HostBackends(std::unique_ptr<Executor> executor) {
  Backends b;
  b.allocators.push_back(MakeMemfdAllocator());
  if (executor) b.executors.push_back(std::move(executor));
  return b;
}

}  // namespace

std::string DisplayId(const std::string& id) {
  return id.size() > 10 ? id.substr(0, 10) + "..." : id;
}

Engine::Engine(EngineOptions options, Backends backends)
    : options_(std::move(options)),
      backends_(std::move(backends)),
      started_(absl::Now()),
      timer_(std::make_unique<DeadlineTimer>()),
      runners_(std::make_unique<ThreadPool>(options_.runner_threads)),
      stream_waiter_(std::make_unique<StreamWaiter>()) {
  for (const auto& a : backends_.allocators) allocators_.emplace(std::string(a->kind()), a.get());
  for (const auto& e : backends_.executors) {
    executors_.emplace(std::string(e->buffer_kind()), e.get());
  }
}

Engine::Engine(EngineOptions options, std::unique_ptr<Executor> executor)
    : Engine(std::move(options), HostBackends(std::move(executor))) {}

Executor* Engine::ExecutorFor(absl::string_view kind) const {
  auto it = executors_.find(kind);
  return it == executors_.end() ? nullptr : it->second;
}

std::string Engine::NoAllocatorReason(absl::string_view kind) const {
  auto it = backends_.unusable_allocators.find(std::string(kind));
  return it != backends_.unusable_allocators.end() ? it->second
                                                    : std::string("none was configured");
}

std::string Engine::NoExecutorReason(absl::string_view kind) const {
  auto it = backends_.unusable_executors.find(std::string(kind));
  return it != backends_.unusable_executors.end() ? it->second
                                                   : std::string("none was configured");
}

Engine::~Engine() {
  Shutdown("daemon stopped");  // aborts the connections to other hosts
  // Their threads call back into the engine: wait for every op started on
  // them to have called back (aborted, they do within moments), then drop
  // them while the engine is whole.
  std::vector<std::shared_ptr<CrossHostMesh>> crosses;
  {
    MutexLock lock(&mu_);
    while (cross_ops_in_flight_ > 0) cross_idle_.Wait(&mu_);
    for (auto& [id, mesh] : meshes_) {
      if (mesh->cross) crosses.push_back(std::move(mesh->cross));
    }
  }
  crosses.clear();
  stream_waiter_.reset();  // fails the ops that still wait for streams
  runners_.reset();        // finishes running ops
  timer_->Stop();    // callbacks may still use timer_ while it stops
  timer_.reset();
}

void Engine::Run(Callbacks& cbs) {
  for (auto& cb : cbs) cb();
  cbs.clear();
}

Engine::Session* Engine::FindSession(const std::string& id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Engine::Session*> Engine::GetSession(const std::string& id) {
  if (shutting_down_) {
    return absl::UnavailableError(absl::StrCat("daemon is shutting down: ", shutdown_reason_));
  }
  if (id.empty()) return absl::InvalidArgumentError("session_id is empty");
  Session* s = FindSession(id);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "session '", id, "' not found (closed, expired, or never created by this daemon)"));
  }
  return s;
}

absl::StatusOr<NewSession> Engine::CreateSession(std::string client_name) {
  if (client_name.size() > kMaxClientName) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_name is ", client_name.size(), " bytes; the limit is ", kMaxClientName));
  }
  NewSession resp;
  Callbacks logs;
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("daemon is shutting down");
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session limit reached (", options_.max_sessions, ")"));
    }
    auto s = std::make_unique<Session>();
    s->id = RandomId("s-");
    s->token = RandomId("t-");
    s->client_name = std::move(client_name);
    std::string id = s->id;
    s->attach_timer = timer_->Schedule(absl::Now() + options_.attach_timeout, [this, id] {
      Callbacks cbs;
      {
        MutexLock lock(&mu_);
        Session* s = FindSession(id);
        // Checked and closed under one lock: an attach cannot slip between.
        if (s != nullptr && !s->attached) {
          CloseSessionLocked(id, "side socket not attached in time", cbs);
        }
      }
      Run(cbs);
    });
    resp.session_id = s->id;
    resp.attach_token = s->token;
    LogEventLater(logs, LogLevel::kInfo, "session_created",
                  {{"session", DisplayId(s->id)}, {"client", s->client_name}});
    sessions_.emplace(s->id, std::move(s));
  }
  Run(logs);
  resp.side_socket_path = options_.side_socket_path;
  resp.attach_timeout_ms = Millis(options_.attach_timeout);
  resp.daemon_id = options_.daemon_id;
  return resp;
}

absl::Status Engine::AttachSession(const std::string& session_id, const std::string& token,
                                   int pid, int uid) {
  {
    MutexLock lock(&mu_);
    auto s = GetSession(session_id);
    if (!s.ok()) return s.status();
    Session* session = *s;
    if (session->token != token) {
      return absl::PermissionDeniedError("attach token does not match the session");
    }
    if (session->attached) {
      return absl::FailedPreconditionError("session is already attached to a side socket");
    }
    session->attached = true;
    session->pid = pid;
    session->uid = uid;
    timer_->Cancel(session->attach_timer);
  }
  LogEvent(LogLevel::kInfo, "session_attached",
           {{"session", DisplayId(session_id)}, {"pid", absl::StrCat(pid)}, {"uid", absl::StrCat(uid)}});
  return absl::OkStatus();
}

absl::Status Engine::CloseSession(const std::string& session_id, const std::string& reason) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    if (FindSession(session_id) == nullptr) {
      return absl::NotFoundError(absl::StrCat("session '", DisplayId(session_id), "' not found"));
    }
    CloseSessionLocked(session_id, reason, cbs);
  }
  Run(cbs);
  return absl::OkStatus();
}

void Engine::CloseSessionLocked(const std::string& session_id, const std::string& reason,
                                Callbacks& cbs) {
  Session* session = FindSession(session_id);
  timer_->Cancel(session->attach_timer);
  const std::map<std::string, int> memberships = session->meshes;
  for (const auto& [mesh_id, index] : memberships) {
    auto it = meshes_.find(mesh_id);
    if (it == meshes_.end()) continue;
    Mesh& mesh = *it->second;
    if (mesh.state == MeshState::kForming) {
      RemoveJoiner(mesh, index,
                   absl::AbortedError(absl::StrCat("session closed: ", reason)), cbs);
    } else {
      if (mesh.state == MeshState::kReady) {
        // The same words on every host of the mesh: its index, coordinate,
        // pid, host and name.
        BreakMesh(mesh, absl::StrCat("member ", MemberLabel(mesh, index), " is gone: ", reason),
                  cbs);
      }
      mesh.member_left[index] = true;
    }
    MaybeEraseMesh(mesh_id);
  }
  for (auto& [op_id, op] : session->retained) {
    for (auto& w : op.waiters) {
      cbs.push_back([w = std::move(w), reason] {
        w(OpOutcome{absl::CancelledError(absl::StrCat("session closed: ", reason)), -1});
      });
    }
  }
  LogEventLater(cbs, LogLevel::kInfo, "session_closed",
                {{"session", DisplayId(session_id)}, {"pid", absl::StrCat(session->pid)},
            {"buffers", absl::StrCat(session->buffers.size())}, {"reason", reason}});
  // Its buffers are unmapped once the engine's lock is released (giving a
  // large one back takes milliseconds, every op would wait): the callbacks
  // hold them until they have run.
  if (!session->buffers.empty()) {
    cbs.push_back([buffers = std::make_shared<BufferTable>(std::move(session->buffers))] {});
  }
  if (session->member_side) member_side_sessions_.fetch_sub(1, std::memory_order_relaxed);
  sessions_.erase(session_id);
}

void Engine::Shutdown(const std::string& reason) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    shutdown_reason_ = reason;
    absl::Status status = absl::UnavailableError(absl::StrCat("daemon shutting down: ", reason));
    for (auto& [id, mesh] : meshes_) {
      for (auto& [index, waiter] : mesh->join_waiters) {
        timer_->Cancel(waiter.timer);
        cbs.push_back([done = std::move(waiter.done), status] { done(status); });
      }
      mesh->join_waiters.clear();
      MarkSegmentBroken(*mesh, status);  // members waiting member-side
      if (mesh->cross) {
        cbs.push_back([cross = mesh->cross,
                       why = absl::UnavailableError(absl::StrCat(
                           "the daemon of host ", options_.rendezvous->host_id(),
                           " is shutting down (", reason, ")"))] { cross->Abort(why); });
      }
      for (auto it = mesh->pending.begin(); it != mesh->pending.end();) {
        if (it->second.running) {
          if (it->second.cancel) it->second.cancel->Cancel(status);
          ++it;
          continue;
        }
        FailOp(*mesh, it->second, status, cbs);
        it = mesh->pending.erase(it);
      }
    }
    LogEventLater(cbs, LogLevel::kInfo, "engine_shutdown", {{"reason", reason}});
  }
  Run(cbs);
}

}  // namespace collectived
