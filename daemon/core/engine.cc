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
#include "daemon/core/join_request.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {
namespace {

constexpr size_t kMaxClientName = 128;

std::string CoordString(const std::vector<int>& c) {
  return absl::StrCat("(", absl::StrJoin(c, ","), ")");
}

std::string AxesString(const MeshShape& s) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < s.names.size(); ++i) parts.push_back(absl::StrCat(s.names[i], "=", s.sizes[i]));
  return absl::StrJoin(parts, ",");
}

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// Checks that [offset, offset + bytes) lies in a buffer of `size` bytes and
// that offset is aligned to `align`.
absl::Status CheckRange(absl::string_view what, const std::string& id, int64_t offset,
                        uint64_t bytes, size_t size, size_t align) {
  if (offset < 0) {
    return absl::OutOfRangeError(absl::StrCat(what, " offset ", offset, " is negative"));
  }
  uint64_t off = static_cast<uint64_t>(offset);
  if (off > size || bytes > size - off) {
    return absl::OutOfRangeError(absl::StrCat(what, " range [", off, ", ", off, "+", bytes,
                                              ") exceeds buffer '", id, "' of ", size,
                                              " bytes"));
  }
  if (align > 1 && off % align != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " offset ", off, " is not a multiple of the element size ", align));
  }
  return absl::OkStatus();
}

// Checks the declared length of a region (BufferRef.size_bytes), when the
// client gave one, against the `bytes` of `data` (e.g. "result f32[8]") that
// the op reads or writes there.
absl::Status CheckDeclared(absl::string_view kind, absl::string_view what,
                           const v1::BufferRef& ref, uint64_t bytes, absl::string_view data) {
  if (!ref.has_size_bytes()) return absl::OkStatus();
  if (ref.size_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, ": ", what, " size_bytes ", ref.size_bytes(), " is negative"));
  }
  if (static_cast<uint64_t>(ref.size_bytes()) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, ": ", what, " region of ", ref.size_bytes(), " bytes is smaller than the ", data,
        " of ", bytes, " bytes; give ", what == "output" ? "an output" : "an input",
        " of at least ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {
// Set while this thread runs an op inline (see EngineOptions::inline_op_bytes).
thread_local bool t_running_inline = false;

// How much later than its deadline a cluster mesh's joiner times out on its
// own while the registry is being asked (a Form is in flight), so that the
// registry's answer, which names the missing members of every host, comes
// first. Without a Form (no registry reached) it times out at its deadline.
constexpr absl::Duration kClusterJoinGrace = absl::Milliseconds(500);
// How soon a registration that found no coordinator is tried again.
constexpr absl::Duration kRegisterRetry = absl::Milliseconds(250);
}  // namespace

std::string DisplayId(const std::string& id) {
  return id.size() > 10 ? id.substr(0, 10) + "..." : id;
}

namespace {

Backends HostBackends(std::unique_ptr<Executor> executor) {
  Backends b;
  b.allocators.push_back(MakeMemfdAllocator());
  if (executor) b.executors.push_back(std::move(executor));
  return b;
}

// How errors name a kind of memory.
std::string KindLabel(absl::string_view kind) {
  if (kind == "memfd") return "host (memfd)";
  if (kind == "cuda") return "CUDA";
  return std::string(kind);
}

}  // namespace

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

// ---------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------

absl::StatusOr<v1::CreateSessionResponse> Engine::CreateSession(std::string client_name) {
  if (client_name.size() > kMaxClientName) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_name is ", client_name.size(), " bytes; the limit is ", kMaxClientName));
  }
  v1::CreateSessionResponse resp;
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
    resp.set_session_id(s->id);
    resp.set_attach_token(s->token);
    LogEventLater(logs, LogLevel::kInfo, "session_created",
                  {{"session", DisplayId(s->id)}, {"client", s->client_name}});
    sessions_.emplace(s->id, std::move(s));
  }
  Run(logs);
  resp.set_side_socket_path(options_.side_socket_path);
  resp.set_attach_timeout_ms(Millis(options_.attach_timeout));
  resp.set_daemon_id(options_.daemon_id);
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
  sessions_.erase(session_id);
}

// ---------------------------------------------------------------------------
// Meshes
// ---------------------------------------------------------------------------

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

namespace {

// The member-side ops member `index` reports in segment `seg` (0 for an
// index outside it): shown, never acted on.
int64_t ReportedMemberSideOps(const member_ops::View& seg, int index) {
  if (index < 0 || static_cast<uint32_t>(index) >= seg.layout.members) return 0;
  return seg.slot(static_cast<uint32_t>(index))->member_ops.v.load(std::memory_order_relaxed);
}

// The most member-side ops any member of `seg` reports.
int64_t MostMemberSideOps(const member_ops::View& seg) {
  int64_t most = 0;
  for (uint32_t m = 0; m < seg.layout.members; ++m) {
    most = std::max(most, ReportedMemberSideOps(seg, static_cast<int>(m)));
  }
  return most;
}

// Text a member wrote in the segment (it may write anything there):
// at most `limit` of its `len` bytes, anything but printable ASCII as '?'.
std::string MemberText(const char* text, size_t len, size_t limit) {
  std::string out(text, std::min(len, limit));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

// The signature text of a member's entry.
std::string EntrySignature(const member_ops::Entry& e) {
  return MemberText(e.signature, e.sig_len, member_ops::kMaxSignature);
}

// The kind of a member-side op from its signature's first word ("psum
// f32[4] over (i)"); kUnspecified when it names none (a member wrote it).
OpKind KindOfSignature(absl::string_view signature) {
  const absl::string_view word = signature.substr(0, signature.find(' '));
  for (int k = 1; k < kNumOpKinds; ++k) {
    if (OpKindName(static_cast<OpKind>(k)) == word) return static_cast<OpKind>(k);
  }
  return OpKind::kUnspecified;
}

// Why a member marked the segment broken (it gave up on a member-side op),
// bounded and printable (a member may write anything there).
std::string MemberBrokenReason(const member_ops::View& v) {
  const member_ops::Header* h = v.header();
  const uint32_t code = h->broken.v.load(std::memory_order_seq_cst);
  const std::string reason = MemberText(h->reason, h->reason_len, member_ops::kMaxReason);
  if (reason.empty() || code == member_ops::kBrokenWriting) {
    return "a member marked the mesh's member-side segment broken";
  }
  return reason;
}

// Whether place key `a` is after place key `b` (member_ops::Key: D first,
// then S, whose 24 bits wrap: compared modulo 2^24).
bool KeyAfter(uint64_t a, uint64_t b) {
  if ((a >> 24) != (b >> 24)) return (a >> 24) > (b >> 24);
  const uint32_t ds = static_cast<uint32_t>((a - b) & 0xffffff);
  return ds != 0 && ds < (1u << 23);
}

}  // namespace

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

void Engine::JoinMesh(const v1::JoinMeshRequest& req, JoinDone done) {
  Callbacks cbs;
  // Run after unlocking, on every return.
  absl::Cleanup run_callbacks = [&cbs] { Run(cbs); };
  MutexLock lock(&mu_);
  const absl::Status error = JoinLocked(req, done, cbs);
  if (error.ok()) return;
  LogEventLater(cbs, LogLevel::kWarn, "join_failed",
                {{"mesh", req.mesh_name()}, {"session", DisplayId(req.session_id())},
                 {"error", error.ToString()}});
  cbs.push_back([done = std::move(done), error] { done(error); });
}

absl::Status Engine::JoinLocked(const v1::JoinMeshRequest& req, JoinDone& done, Callbacks& cbs) {
  auto s = GetSession(req.session_id());
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
          "this session is already member ", member_index, " of mesh '", req.mesh_name(),
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
  if (req.op_timeout_ms() > 0 && !mesh->op_timeout_set) {
    mesh->op_timeout = absl::Milliseconds(req.op_timeout_ms());
    mesh->op_timeout_set = true;
  }
  mesh->member_session[index] = session->id;
  session->meshes[mesh->id] = index;
  JoinWaiter waiter;
  waiter.session_id = session->id;
  waiter.done = std::move(done);
  absl::Duration timeout =
      req.timeout_ms() > 0 ? absl::Milliseconds(req.timeout_ms()) : options_.join_timeout;
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

absl::StatusOr<Engine::Mesh*> Engine::MeshToJoinLocked(const v1::JoinMeshRequest& req,
                                                       const JoinSpec& spec, Session& session,
                                                       Callbacks& cbs) {
  auto by_name = mesh_by_name_.find(spec.key);
  if (by_name == mesh_by_name_.end()) return NewMeshLocked(req, spec, cbs);
  Mesh& mesh = *meshes_.at(by_name->second);
  if (mesh.state == MeshState::kReady && mesh.token == req.join_token()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' generation ", mesh.generation, " is already full (",
        mesh.shape.num_members(), " members)"));
  }
  absl::Status refused;
  if (mesh.token != req.join_token()) {
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
  } else if (req.op_timeout_ms() > 0 && mesh.op_timeout_set &&
             Millis(mesh.op_timeout) != req.op_timeout_ms()) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' has op_timeout_ms ", Millis(mesh.op_timeout),
        " but this join asks for ", req.op_timeout_ms()));
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

absl::StatusOr<Engine::Mesh*> Engine::NewMeshLocked(const v1::JoinMeshRequest& req,
                                                    const JoinSpec& spec, Callbacks& cbs) {
  // No mesh holds the name now, but an earlier generation's token may
  // still bind it.
  auto record = names_.find(spec.key);
  if (record != names_.end() && record->second.held(absl::Now(), options_.token_hold) &&
      record->second.token != req.join_token()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "mesh '", req.mesh_name(), "' needs the join token of its generation ",
        record->second.last_generation,
        " (a mesh's token carries over to its next generations)"));
  }
  if (static_cast<int>(meshes_.size()) >= options_.max_meshes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mesh limit reached (", options_.max_meshes, ")"));
  }
  auto m = std::make_unique<Mesh>();
  m->id = RandomId("m-");
  m->name = req.mesh_name();
  m->scope = req.scope();
  m->key = spec.key;
  m->token = req.join_token();
  m->shape = spec.shape;
  NameRecord& name = names_[spec.key];
  name.token = req.join_token();
  ++name.meshes;
  m->generation = ++name.last_generation;
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
    m->join_info.token = req.join_token();
    m->registered.assign(spec.members, false);
  }
  Mesh* mesh = m.get();
  mesh_by_name_[m->key] = m->id;
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
  v1::MeshInfo info = MeshInfoOf(mesh);
  for (auto& [index, waiter] : mesh.join_waiters) {
    timer_->Cancel(waiter.timer);
    v1::JoinMeshResponse resp;
    *resp.mutable_mesh() = info;
    *resp.mutable_self() = MemberInfo(mesh, index);
    cbs.push_back([done = std::move(waiter.done), resp = std::move(resp)] { done(resp); });
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
  auto name = mesh_by_name_.find(mesh.key);
  if (name != mesh_by_name_.end() && name->second == mesh.id) mesh_by_name_.erase(name);
  EraseMesh(it);
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
      // A mesh that did not fill by the first joiner's deadline: the joiners
      // whose own deadline has passed fail with the registry's answer, the
      // others keep waiting, until the next deadline among them.
      Mesh& mesh = *it->second;
      absl::Time next = absl::InfiniteFuture();
      if (formed.status().code() == absl::StatusCode::kDeadlineExceeded) {
        const absl::Time now = absl::Now();
        for (const auto& [index, waiter] : mesh.join_waiters) {
          if (waiter.deadline > now) next = std::min(next, waiter.deadline);
        }
      }
      if (next != absl::InfiniteFuture()) {
        std::vector<int> expired;
        for (const auto& [index, waiter] : mesh.join_waiters) {
          if (waiter.deadline < next) expired.push_back(index);
        }
        for (int index : expired) RemoveJoiner(mesh, index, formed.status(), cbs);
        StartForm(mesh, next, cbs);
      } else {
        LogEventLater(cbs, LogLevel::kWarn, "mesh_not_formed",
                      {{"mesh", mesh.name}, {"error", formed.status().ToString()}});
        FailForming(it, formed.status(), cbs);
      }
    } else {
      Mesh& mesh = *it->second;
      const MeshTopology& t = formed->topology;
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
        orphan = std::move(formed->mesh);
        TellCluster(mesh, {}, true, reason, cbs);
        FailForming(it, absl::AbortedError(absl::StrCat("mesh '", mesh.name, "': ", reason)),
                    cbs);
      } else {
        // A joiner here whose coordinate the registry gave to another host
        // (its own registration is refused, or still on its way).
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
        // Members of other hosts never leave here: for this host, they are
        // gone once the mesh breaks (MaybeEraseMesh waits for local ones).
        for (int i = 0; i < mesh.shape.num_members(); ++i) {
          if (t.member_host[i] != self) mesh.member_left[i] = true;
        }
        mesh.form_cancel.reset();
        mesh.generation = t.generation;
        if (t.op_timeout_ms > 0 && !mesh.op_timeout_set) {
          mesh.op_timeout = absl::Milliseconds(t.op_timeout_ms);
          mesh.op_timeout_set = true;
        }
        mesh.cross = std::shared_ptr<CrossHostMesh>(std::move(formed->mesh));
        // What the other hosts say between ops reaches the engine: a break
        // (named), a question about a late op. Installed outside the lock
        // (an earlier break is reported at once).
        cbs.push_back([this, cross = mesh.cross, mesh_id] {
          CrossHostObserver observer;
          observer.on_broken = [this, mesh_id](const absl::Status& why) {
            OnCrossBroken(mesh_id, why);
          };
          observer.on_query = [this, mesh_id](int64_t sequence) {
            return MissingAt(mesh_id, sequence);
          };
          cross->Observe(std::move(observer));
        });
        LogEventLater(cbs, LogLevel::kInfo, "mesh_formed_across_hosts",
                      {{"mesh", mesh.name}, {"generation", absl::StrCat(mesh.generation)},
                  {"hosts", absl::StrJoin(t.hosts, ",")},
                  {"local_members", absl::StrCat(local)}});
        CompleteJoin(mesh, cbs);
      }
    }
  }
  if (orphan) {
    orphan->Abort(absl::AbortedError(absl::StrCat("the mesh did not form on host ",
                                                  options_.rendezvous->host_id())));
  }
  orphan.reset();
  Run(cbs);
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
  auto name = mesh_by_name_.find(mesh.key);
  if (name != mesh_by_name_.end() && name->second == mesh.id) mesh_by_name_.erase(name);
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
      mesh_by_name_.erase(mesh.key);
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
  NameRecord& name = names_[it->second->key];
  if (--name.meshes == 0) name.idle_since = absl::Now();
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

// ---------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------

namespace {

// A buffer the members of a mesh share: the allocator's buffer, marked with
// the mesh (SharedBuffer::shared_mesh).
class MeshSharedBuffer final : public SharedBuffer {
 public:
  MeshSharedBuffer(std::shared_ptr<SharedBuffer> inner, std::string mesh_id)
      : inner_(std::move(inner)), mesh_id_(std::move(mesh_id)) {}
  void* data() const override { return inner_->data(); }
  size_t size() const override { return inner_->size(); }
  int fd() const override { return inner_->fd(); }
  absl::string_view kind() const override { return inner_->kind(); }
  std::string device() const override { return inner_->device(); }
  int device_ordinal() const override { return inner_->device_ordinal(); }
  absl::string_view shared_mesh() const override { return mesh_id_; }

 private:
  const std::shared_ptr<SharedBuffer> inner_;
  const std::string mesh_id_;
};

v1::BufferInfo InfoOf(const std::string& id, const SharedBuffer& buffer) {
  v1::BufferInfo info;
  info.set_buffer_id(id);
  info.set_size_bytes(static_cast<int64_t>(buffer.size()));
  info.set_kind(std::string(buffer.kind()));
  info.set_device(buffer.device());
  return info;
}

}  // namespace

absl::StatusOr<v1::BufferInfo> Engine::AllocateBuffer(const std::string& session_id,
                                                      int64_t size_bytes,
                                                      const std::string& device,
                                                      const std::string& mesh_id) {
  auto spec = ParseDevice(device);
  BufferAllocator* allocator = nullptr;
  const bool gpu = spec.ok() && spec->kind != DeviceSpec::Kind::kCpu;
  // Whether `bytes` more fit in the session's host or GPU quota.
  auto fits = [&](const Session& s, uint64_t bytes) {
    const uint64_t held = gpu ? s.gpu_buffer_bytes : s.buffer_bytes;
    const uint64_t limit =
        gpu ? options_.max_gpu_buffer_bytes_per_session : options_.max_buffer_bytes_per_session;
    return held <= limit && bytes <= limit - held;
  };
  // The session's checks, before and after the allocation.
  auto check_quota = [&](const Session& session, uint64_t bytes) -> absl::Status {
    if (static_cast<int>(session.buffers.size()) >= options_.max_buffers_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session has ", session.buffers.size(), " buffers; the limit is ",
          options_.max_buffers_per_session));
    }
    if (!fits(session, bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session holds ", gpu ? session.gpu_buffer_bytes : session.buffer_bytes, " ",
          gpu ? "GPU" : "host", " buffer bytes; ", bytes, " more exceeds the limit of ",
          gpu ? options_.max_gpu_buffer_bytes_per_session : options_.max_buffer_bytes_per_session));
    }
    return absl::OkStatus();
  };
  // The mesh and this session's member index in it, for a mesh-shared buffer.
  auto member_of = [&](Session& session) -> absl::StatusOr<std::pair<Mesh*, int>> {
    auto m = session.meshes.find(mesh_id);
    auto it = meshes_.find(mesh_id);
    if (m == session.meshes.end() || it == meshes_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("a buffer shared by mesh '", mesh_id,
                       "': this session is not a member of that mesh"));
    }
    Mesh& mesh = *it->second;
    if (mesh.state == MeshState::kBroken) {
      return absl::AbortedError(absl::StrCat("mesh '", mesh.name, "' generation ",
                                             mesh.generation, " is broken: ",
                                             mesh.broken_reason));
    }
    if (mesh.state != MeshState::kReady) {
      return absl::FailedPreconditionError(
          absl::StrCat("mesh '", mesh.name, "' is still forming: shared buffers once it is ready"));
    }
    mesh.shared_asked.resize(mesh.shape.num_members(), 0);
    return std::make_pair(&mesh, m->second);
  };
  // Gives the session buffer number shared_asked[index] of the mesh, which
  // was made (`made_now`: by this call).
  auto attach = [&](Session& session, Mesh& mesh, int index,
                    bool made_now) -> absl::StatusOr<v1::BufferInfo> {
    const size_t k = mesh.shared_asked[index];
    auto e = mesh.shared.find(k);
    if (e == mesh.shared.end()) return absl::InternalError(absl::StrCat("no shared buffer ", k));
    const Mesh::Shared& shared = e->second;
    // Once every member has asked for number k, nobody asks for it again.
    auto asked = [&] {
      ++mesh.shared_asked[index];
      if (*std::min_element(mesh.shared_asked.begin(), mesh.shared_asked.end()) > k) {
        mesh.shared.erase(e);
      }
    };
    std::shared_ptr<SharedBuffer> buffer = shared.buffer.lock();
    // Gone once no member's session holds it: a reference the daemon keeps a
    // moment longer (a descriptor on its way) does not keep it for later
    // members.
    bool held = made_now;
    for (size_t i = 0; buffer != nullptr && !held && i < mesh.member_session.size(); ++i) {
      const std::string& sid = mesh.member_session[i];
      Session* holder = sid.empty() ? nullptr : FindSession(sid);
      held = holder != nullptr && holder->buffers.count(shared.id) > 0;
    }
    if (buffer == nullptr || !held) {
      // This member's k-th request is answered (the next one asks for k+1).
      const int creator = shared.creator;
      asked();
      return absl::FailedPreconditionError(absl::StrCat(
          "shared buffer ", k, " of mesh '", mesh.name, "' (made by member ", creator,
          ") was freed by every member that held it before member ", index,
          " asked for it; its next request gets the next shared buffer"));
    }
    if (size_bytes != shared.size_bytes || buffer->device() != spec->ToString()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shared buffer ", k, " of mesh '", mesh.name, "' is ", shared.size_bytes,
          " bytes on ", buffer->device(), " (member ", shared.creator,
          " asked first) but member ", index, " asks for ", size_bytes, " bytes on ",
          spec->ToString(), "; every member must ask for the same"));
    }
    if (absl::Status st = check_quota(session, buffer->size()); !st.ok()) return st;
    if (session.buffers.count(shared.id) > 0) {
      return absl::InternalError(absl::StrCat("shared buffer '", shared.id, "' already held"));
    }
    const v1::BufferInfo info = InfoOf(shared.id, *buffer);
    session.buffers.emplace(shared.id, std::move(buffer));
    session.buffer_bytes += static_cast<uint64_t>(info.size_bytes());
    asked();
    return info;
  };
  {
    MutexLock lock(&mu_);
    auto s = GetSession(session_id);
    if (!s.ok()) return s.status();
    Session* session = *s;
    if (!spec.ok()) return spec.status();
    auto a = allocators_.find(spec->buffer_kind());
    if (a == allocators_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", spec->ToString(), ": this daemon has no usable ",
          KindLabel(spec->buffer_kind()), " allocator: ", NoAllocatorReason(spec->buffer_kind())));
    }
    allocator = a->second;
    if (size_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("size_bytes must be >= 1; got ", size_bytes));
    }
    if (static_cast<uint64_t>(size_bytes) > options_.max_buffer_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "size_bytes ", size_bytes, " exceeds the per-buffer limit of ", options_.max_buffer_size));
    }
    if (absl::Status st = check_quota(*session, static_cast<uint64_t>(size_bytes)); !st.ok()) {
      return st;
    }
    if (!mesh_id.empty()) {
      if (gpu) {
        return absl::UnimplementedError(absl::StrCat(
            "device ", spec->ToString(), ": buffers shared by a mesh are host memory so far"));
      }
      auto member = member_of(*session);
      if (!member.ok()) return member.status();
      auto [mesh, index] = *member;
      if (mesh->shared_asked[index] < mesh->shared_made) {
        return attach(*session, *mesh, index, /*made_now=*/false);
      }
      if (static_cast<int>(mesh->shared.size()) >= options_.max_buffers_per_session) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "mesh '", mesh->name, "' has ", mesh->shared.size(),
            " shared buffers not yet asked for by every member; the limit is ",
            options_.max_buffers_per_session));
      }
    }
  }
  // Allocate outside the lock: faulting in pages takes time.
  auto buffer = allocator->Allocate(static_cast<size_t>(size_bytes), *spec);
  if (!buffer.ok()) return buffer.status();
  if ((*buffer)->kind() != allocator->kind()) {
    return absl::InternalError(absl::StrCat("the ", allocator->kind(), " allocator made a ",
                                            (*buffer)->kind(), " buffer"));
  }
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  if (!mesh_id.empty()) {
    auto member = member_of(*session);
    if (!member.ok()) return member.status();
    auto [mesh, index] = *member;
    // Another member's call may have made it meanwhile: then this one's
    // allocation is dropped.
    if (mesh->shared_asked[index] < mesh->shared_made) {
      return attach(*session, *mesh, index, /*made_now=*/false);
    }
    // Made only if this session can hold it: a failed call leaves nothing.
    std::shared_ptr<SharedBuffer> shared =
        std::make_shared<MeshSharedBuffer>(*std::move(buffer), mesh_id);
    if (absl::Status st = check_quota(*session, shared->size()); !st.ok()) return st;
    mesh->shared[mesh->shared_made++] = Mesh::Shared{RandomId("b-"), shared, size_bytes, index};
    return attach(*session, *mesh, index, /*made_now=*/true);
  }
  if (static_cast<int>(session->buffers.size()) >= options_.max_buffers_per_session ||
      !fits(*session, (*buffer)->size())) {
    return absl::ResourceExhaustedError("buffer quota exceeded by concurrent allocations");
  }
  const v1::BufferInfo info = InfoOf(RandomId("b-"), **buffer);
  (gpu ? session->gpu_buffer_bytes : session->buffer_bytes) += (*buffer)->size();
  session->buffers.emplace(info.buffer_id(), *std::move(buffer));
  return info;
}

absl::Status Engine::FreeBuffer(const std::string& session_id, const std::string& buffer_id) {
  std::shared_ptr<SharedBuffer> released;  // unmapped outside the lock
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  auto it = session->buffers.find(buffer_id);
  if (it == session->buffers.end()) {
    return absl::NotFoundError(absl::StrCat("buffer '", buffer_id, "' not found in this session"));
  }
  (it->second->kind() == "memfd" ? session->buffer_bytes : session->gpu_buffer_bytes) -=
      it->second->size();
  released = std::move(it->second);
  session->buffers.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Engine::GetBuffer(const std::string& session_id,
                                                                const std::string& buffer_id) {
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  auto it = (*s)->buffers.find(buffer_id);
  if (it == (*s)->buffers.end()) {
    return absl::NotFoundError(absl::StrCat("buffer '", buffer_id, "' not found in this session"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Engine::GetMemberSegment(
    const std::string& session_id, const std::string& mesh_id) {
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  if ((*s)->meshes.count(mesh_id) == 0) {
    return absl::NotFoundError(absl::StrCat(
        "mesh '", mesh_id, "' not found among this session's meshes (join it first)"));
  }
  const Mesh& mesh = *meshes_.at(mesh_id);
  if (mesh.state == MeshState::kBroken) {
    return absl::AbortedError(absl::StrCat("mesh '", mesh.name, "' generation ", mesh.generation,
                                           " is broken: ", mesh.broken_reason));
  }
  if (!mesh.segment) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' has no member-side segment (",
        mesh.state == MeshState::kForming ? "it has not formed yet"
        : mesh.cluster                    ? "it may span hosts"
                                          : "member-side ops are off on this daemon",
        ")"));
  }
  return mesh.segment;
}

absl::StatusOr<bool> Engine::MemberOpExpired(const std::string& session_id,
                                             const std::string& mesh_id, uint32_t d,
                                             uint32_t s) {
  Callbacks cbs;
  bool broke = false;
  {
    MutexLock lock(&mu_);
    auto session = GetSession(session_id);
    if (!session.ok()) return session.status();
    auto member = (*session)->meshes.find(mesh_id);
    if (member == (*session)->meshes.end()) {
      return absl::NotFoundError(absl::StrCat(
          "mesh '", mesh_id, "' not found among this session's meshes (join it first)"));
    }
    Mesh& mesh = *meshes_.at(mesh_id);
    if (!mesh.segment) return absl::FailedPreconditionError("the mesh has no member-side segment");
    if (mesh.state == MeshState::kBroken) return true;  // the segment says why
    // Everything read here is the members' to write: only compared, and
    // the signature's text is bounded and cleaned before it is shown.
    const member_ops::View& v = mesh.seg;
    const uint64_t key = member_ops::Key(d, s);
    std::vector<std::string> waiting, missing;
    for (uint32_t m = 0; m < v.layout.members; ++m) {
      switch (member_ops::PresenceAt(v, m, d, s, key)) {
        case member_ops::Presence::kHere: waiting.push_back(absl::StrCat(m)); break;
        case member_ops::Presence::kDaemonPath: break;
        case member_ops::Presence::kNotYet:
          missing.push_back(MemberLabel(mesh, static_cast<int>(m)));
          break;
      }
    }
    if (missing.empty()) return false;
    const member_ops::Entry& mine = *v.entry(static_cast<uint32_t>(member->second), s);
    const std::string what = EntrySignature(mine);
    const std::string reason = absl::StrCat(
        "member-side op ", s, " after daemon op ", d, " timed out after ",
        Millis(mesh.op_timeout), " ms: ", WaitingMembers(waiting), " in ", what,
        "; missing: ", absl::StrJoin(missing, "; "));
    MarkSegmentBroken(mesh, absl::DeadlineExceededError(
                                absl::StrCat("mesh '", mesh.name, "': ", reason)));
    BreakMesh(mesh, reason, cbs);
    broke = true;
    // Counted as the daemon counts its own ops' timeouts (once per op, by
    // the first member that asks: the mesh is broken for the others).
    if (options_.op_observer) {
      options_.op_observer(KindOfSignature(what), absl::StatusCode::kDeadlineExceeded,
                           mine.in_bytes, mesh.op_timeout);
    }
  }
  Run(cbs);
  return broke;
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------

absl::StatusOr<v1::SubmitResponse> Engine::Submit(const std::string& session_id,
                                                  const v1::OpSpec& op, bool retain,
                                                  OpDone done) {
  Callbacks cbs;
  // Run after unlocking, on every return (a refusal may have broken the mesh).
  absl::Cleanup run_callbacks = [&cbs] { Run(cbs); };
  v1::SubmitResponse resp;
  {
    MutexLock lock(&mu_);
    auto s = GetSession(session_id);
    if (!s.ok()) return s.status();
    Session* session = *s;
    // Stream-ordered submission: the words first, so that a refusal below
    // still releases the client's stream (see v1::StreamSync).
    std::optional<SyncWords> sync;
    if (op.has_stream_sync()) {
      auto find = [&](const std::string& id,
                      const char* what) -> absl::StatusOr<std::shared_ptr<SharedBuffer>> {
        auto it = session->buffers.find(id);
        if (it == session->buffers.end()) {
          return absl::NotFoundError(
              absl::StrCat(what, " buffer '", id, "' not found in this session"));
        }
        return it->second;
      };
      auto words = SyncWords::Resolve(op.stream_sync(), find);
      if (!words.ok()) {
        SyncWords::ReleaseDoneIfValid(op.stream_sync(), find);
        return words.status();
      }
      sync = *std::move(words);
    }
    struct ReleaseIfRefused {
      std::optional<SyncWords>* sync;
      bool accepted = false;
      ~ReleaseIfRefused() {
        if (!accepted && sync->has_value()) (*sync)->Release();
      }
    } release_if_refused{&sync};
    auto member = session->meshes.find(op.mesh_id());
    if (member == session->meshes.end()) {
      return absl::NotFoundError(absl::StrCat(
          "mesh '", op.mesh_id(), "' not found among this session's meshes (join it first)"));
    }
    Mesh& mesh = *meshes_.at(op.mesh_id());
    const int index = member->second;
    if (mesh.state == MeshState::kForming) {
      return absl::FailedPreconditionError(
          absl::StrCat("mesh '", mesh.name, "' has not formed yet"));
    }
    // A member that gave up on a member-side op marked the segment broken;
    // from then on every member sends its ops here, and a member that had
    // not reached that op yet would send it too, to be matched with the
    // others' next ones (a mismatch, or with equal signatures wrong
    // results). The mesh breaks instead, for the reason that member gave.
    if (mesh.state == MeshState::kReady && mesh.segment &&
        mesh.seg.header()->broken.v.load(std::memory_order_seq_cst) != 0) {
      BreakMesh(mesh, MemberBrokenReason(mesh.seg), cbs);
    }
    if (mesh.state == MeshState::kBroken) {
      return absl::AbortedError(absl::StrCat("mesh '", mesh.name, "' generation ",
                                             mesh.generation, " is broken: ", mesh.broken_reason));
    }
    if (op.timeout_ms() < 0) return absl::InvalidArgumentError("timeout_ms must be >= 0");
    auto plan_or = PlanOp(op, mesh.shape);
    if (!plan_or.ok()) return plan_or.status();
    auto plan = std::make_shared<const OpPlan>(*std::move(plan_or));

    Submission sub;
    sub.session_id = session_id;
    sub.plan = plan;
    if (plan->kind != OpKind::kBarrier && (plan->in_bytes > 0 || plan->out_bytes > 0)) {
      auto find = [&](const std::string& id,
                      absl::string_view what) -> absl::StatusOr<std::shared_ptr<SharedBuffer>> {
        if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " buffer_id is empty"));
        auto it = session->buffers.find(id);
        if (it == session->buffers.end()) {
          return absl::NotFoundError(
              absl::StrCat(what, " buffer '", id, "' not found in this session"));
        }
        return it->second;
      };
      auto in = find(op.input().buffer_id(), "input");
      if (!in.ok()) return in.status();
      absl::Status st = CheckDeclared(OpKindName(plan->kind), "input", op.input(), plan->in_bytes,
                                      absl::StrCat("input ", ShapeString(plan->dtype, plan->in_shape)));
      if (!st.ok()) return st;
      st = CheckRange("input", op.input().buffer_id(), op.input().offset(),
                                   plan->in_bytes, (*in)->size(), DTypeSize(plan->dtype));
      if (!st.ok()) return st;
      sub.in_buf = *in;
      sub.in_offset = static_cast<uint64_t>(op.input().offset());
      if (!op.has_output()) {
        if (plan->out_bytes != plan->in_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              OpKindName(plan->kind), ": the result ", ShapeString(plan->out_dtype, plan->out_shape),
              " does not fit in place of the input ", ShapeString(plan->dtype, plan->in_shape),
              "; give an output"));
        }
        sub.out_buf = sub.in_buf;
        sub.out_offset = sub.in_offset;
      } else {
        auto out = find(op.output().buffer_id(), "output");
        if (!out.ok()) return out.status();
        // The result must fit in the region the client declared, not only
        // in the buffer: else it would overwrite what follows the region.
        st = CheckDeclared(OpKindName(plan->kind), "output", op.output(), plan->out_bytes,
                           absl::StrCat("result ", ShapeString(plan->out_dtype, plan->out_shape)));
        if (!st.ok()) return st;
        st = CheckRange("output", op.output().buffer_id(), op.output().offset(), plan->out_bytes,
                        (*out)->size(), DTypeSize(plan->out_dtype));
        if (!st.ok()) return st;
        sub.out_buf = *out;
        sub.out_offset = static_cast<uint64_t>(op.output().offset());
        // One member's op runs on one kind of memory, on one device.
        if (sub.out_buf->kind() != sub.in_buf->kind() ||
            sub.out_buf->device() != sub.in_buf->device()) {
          return absl::InvalidArgumentError(absl::StrCat(
              OpKindName(plan->kind), ": the input buffer '", op.input().buffer_id(), "' is ",
              sub.in_buf->kind(), " memory on ", sub.in_buf->device(), " but the output buffer '",
              op.output().buffer_id(), "' is ", sub.out_buf->kind(), " memory on ",
              sub.out_buf->device(), "; an op's input and output must be on the same device"));
        }
        if (sub.out_buf == sub.in_buf) {
          if (!SameOrDisjoint(sub.in_offset, plan->in_bytes, sub.out_offset, plan->out_bytes)) {
            return absl::InvalidArgumentError(
                "input and output regions overlap without being the same region");
          }
        }
      }
    }

    if (retain && static_cast<int>(session->retained.size()) >= options_.max_retained_ops) {
      auto done_op = std::find_if(session->retained.begin(), session->retained.end(),
                                  [](const auto& r) { return r.second.done; });
      if (done_op == session->retained.end()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "session has ", session->retained.size(), " ops submitted and not completed; the limit is ",
            options_.max_retained_ops));
      }
      session->retained.erase(done_op);
    }

    const int64_t seq = mesh.next_sequence[index]++;
    if (mesh.segment) {
      // Members waiting member-side at this place take the daemon path too.
      mesh.seg.slot(index)->daemon_ops.v.store(static_cast<uint32_t>(mesh.next_sequence[index]),
                                              std::memory_order_seq_cst);
      // The wake-ups (system calls) after unlocking; the callback holds the
      // segment.
      cbs.push_back([segment = mesh.segment, view = mesh.seg, index] {
        member_ops::RingAll(view, index);
      });
    }
    PendingOp& pending = mesh.pending[seq];
    if (pending.subs.empty()) {
      pending.sequence = seq;
      pending.subs.resize(mesh.shape.num_members());
      pending.first_submit = absl::Now();
      absl::Duration timeout =
          op.timeout_ms() > 0 ? absl::Milliseconds(op.timeout_ms()) : mesh.op_timeout;
      pending.deadline = pending.first_submit + timeout;
      std::string mesh_id = mesh.id;
      pending.timer = timer_->Schedule(pending.deadline,
                                       [this, mesh_id, seq] { OnOpDeadline(mesh_id, seq); });
    }
    const int64_t op_id = session->next_op_id++;
    ++session->ops_submitted;
    if (retain) {
      session->retained[op_id];
      std::string sid = session_id;
      OpDone user_done = std::move(done);
      done = [this, sid, op_id, user_done](const OpOutcome& outcome) {
        std::vector<std::function<void(const OpOutcome&)>> waiters;
        {
          MutexLock lock(&mu_);
          if (Session* s = FindSession(sid)) {
            auto it = s->retained.find(op_id);
            if (it != s->retained.end()) {
              it->second.done = true;
              it->second.outcome = outcome;
              waiters.swap(it->second.waiters);
            }
          }
        }
        for (auto& w : waiters) w(outcome);
        if (user_done) user_done(outcome);
      };
    }
    sub.done = std::move(done);
    sub.sync = sync;
    release_if_refused.accepted = true;
    pending.subs[index] = std::move(sub);
    ++pending.submitted;
    resp.set_op_id(op_id);
    resp.set_sequence(seq);
    for (int64_t d : plan->out_shape) resp.add_out_shape(d);
    resp.set_out_dtype(ToProto(plan->out_dtype));
    if (pending.submitted == mesh.local_members) OnOpFull(mesh, pending, cbs);
  }
  return resp;  // then run_callbacks
}

void Engine::DeliverOutcome(const Submission& sub, const OpOutcome& outcome, Callbacks& cbs) {
  // The client's stream goes on whatever the outcome (v1::StreamSync).
  if (sub.sync) sub.sync->Release();
  if (!sub.done) return;
  OpOutcome o = outcome;
  o.out_shape = sub.plan->out_shape;
  o.out_dtype = sub.plan->out_dtype;
  cbs.push_back([done = sub.done, o = std::move(o)] { done(o); });
}

void Engine::CountOp(OpKind kind, bool ok, uint64_t bytes, const Traffic& traffic) {
  KindStats& k = stats_[static_cast<int>(kind)];
  if (ok) {
    ++k.completed;
    k.bytes += static_cast<int64_t>(bytes);
    k.bytes_read += traffic.read;
    k.bytes_written += traffic.written;
    k.bytes_required += traffic.required;
  } else {
    ++k.failed;
  }
}

void Engine::FailOp(Mesh& mesh, PendingOp& op, const absl::Status& status, Callbacks& cbs) {
  timer_->Cancel(op.timer);
  OpKind kind = OpKind::kUnspecified;
  uint64_t member_bytes = 0;
  for (auto& sub : op.subs) {
    if (!sub) continue;
    kind = sub->plan->kind;
    member_bytes = sub->plan->in_bytes;
    DeliverOutcome(*sub, OpOutcome{status, op.sequence}, cbs);
  }
  CountOp(kind, false, 0);
  if (options_.op_observer) {
    options_.op_observer(kind, status.code(), member_bytes, absl::Now() - op.first_submit);
  }
  LogEventLater(cbs, LogLevel::kWarn, "op_failed",
                {{"mesh", mesh.name}, {"seq", absl::StrCat(op.sequence)},
            {"code", absl::StatusCodeToString(status.code())},
            {"error", std::string(status.message())}});
}

namespace {

// Member indices 0..n-1 grouped by *key(i) (members whose key is null left
// out), the groups in first-seen order and then the smallest first (stable):
// the order in which errors list who did what. The key is copied once per
// group (this runs for every op).
std::vector<std::pair<std::string, std::vector<int>>> GroupMembers(
    int n, const std::function<const std::string*(int)>& key) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int i = 0; i < n; ++i) {
    const std::string* k = key(i);
    if (k == nullptr) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == *k; });
    if (it == groups.end()) {
      groups.push_back({*k, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  return groups;
}

// "member 2 <one> X while members 0,1,3 <many> Y".
std::string ListGroups(const std::vector<std::pair<std::string, std::vector<int>>>& groups,
                       absl::string_view one, absl::string_view many) {
  std::vector<std::string> parts;
  for (const auto& [what, members] : groups) {
    parts.push_back(absl::StrCat(members.size() == 1 ? "member " : "members ",
                                 absl::StrJoin(members, ","), members.size() == 1 ? one : many,
                                 what));
  }
  return absl::StrJoin(parts, " while ");
}

}  // namespace

void Engine::OnOpFull(Mesh& mesh, PendingOp& op, Callbacks& cbs) {
  timer_->Cancel(op.timer);
  // Every member's n-th op must be the same op.
  auto variants = GroupMembers(static_cast<int>(op.subs.size()), [&](int i) {
    return op.subs[i] ? &op.subs[i]->plan->signature : nullptr;
  });
  if (variants.size() > 1) {
    const std::string parts = ListGroups(variants, " submitted ", " submitted ");
    // Failed in order, when the op reaches the front of the mesh's queue.
    op.verdict = absl::FailedPreconditionError(absl::StrCat(
        "op ", op.sequence, " on mesh '", mesh.name, "' does not match across members: ",
        parts));
  } else {
    op.verdict = CheckMemory(mesh, op);
    if (op.verdict.ok()) op.verdict = CheckSharedOutput(mesh, op);
  }
  MaybeStartNext(mesh, cbs);
}

absl::Status Engine::CheckSharedOutput(const Mesh& mesh, const PendingOp& op) const {
  const Submission* first = nullptr;  // a member writing into a mesh-shared buffer
  for (const auto& sub : op.subs) {
    if (sub && sub->out_buf && !sub->out_buf->shared_mesh().empty()) {
      first = &*sub;
      break;
    }
  }
  if (first == nullptr) return absl::OkStatus();
  const OpPlan& plan = *first->plan;
  if (first->out_buf->shared_mesh() != mesh.id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "op ", op.sequence, " on mesh '", mesh.name,
        "' writes into a buffer shared by another mesh; a shared buffer may be the output of "
        "ops of its own mesh only"));
  }
  const std::string what = absl::StrCat("op ", op.sequence, " on mesh '", mesh.name,
                                        "' writes into a buffer the mesh shares, at offset ",
                                        first->out_offset);
  const std::string rule =
      "a shared buffer may be the output of every member of an op whose result is the same for "
      "all (psum, pmean, pmax, pmin, all_gather or broadcast over every axis of the mesh), "
      "each naming the same region, which no input overlaps";
  const bool same_for_all =
      (plan.kind == OpKind::kPsum || plan.kind == OpKind::kPmean || plan.kind == OpKind::kPmax ||
       plan.kind == OpKind::kPmin || plan.kind == OpKind::kAllGather ||
       plan.kind == OpKind::kBroadcast) &&
      plan.groups.size() == 1;
  if (!same_for_all) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ", but ", OpKindName(plan.kind),
        plan.groups.size() == 1 ? "" : " over some axes", " gives members different results; ",
        rule));
  }
  if (mesh.cross) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ", but the mesh spans hosts: shared buffers are of one host"));
  }
  std::vector<int> elsewhere, overlapping;
  for (size_t i = 0; i < op.subs.size(); ++i) {
    if (!op.subs[i]) continue;
    const Submission* sub = &*op.subs[i];
    if (sub->out_buf != first->out_buf || sub->out_offset != first->out_offset) {
      elsewhere.push_back(static_cast<int>(i));
    }
    if (sub->in_buf == first->out_buf && plan.in_bytes > 0 &&
        sub->in_offset < first->out_offset + plan.out_bytes &&
        first->out_offset < sub->in_offset + plan.in_bytes) {
      overlapping.push_back(static_cast<int>(i));
    }
  }
  if (!elsewhere.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ", but ", elsewhere.size() == 1 ? "member " : "members ",
        absl::StrJoin(elsewhere, ","), elsewhere.size() == 1 ? " writes" : " write",
        " its result elsewhere; ", rule));
  }
  if (!overlapping.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ", but the input of ", overlapping.size() == 1 ? "member " : "members ",
        absl::StrJoin(overlapping, ","), " overlaps it; ", rule));
  }
  return absl::OkStatus();
}

absl::Status Engine::CheckMemory(const Mesh& mesh, const PendingOp& op) const {
  // Ops without buffers (barriers, empty arrays) run on the host executor.
  std::string kind = "memfd";
  // Members by "<kind> buffers on <device>" (members without buffers aside),
  // and the kinds seen.
  std::set<std::string> kinds;
  for (const auto& sub : op.subs) {
    if (!sub || !sub->in_buf) continue;
    kind = std::string(sub->in_buf->kind());
    kinds.insert(kind);
  }
  if (kinds.size() > 1) {
    std::vector<std::string> place(op.subs.size());
    for (size_t i = 0; i < op.subs.size(); ++i) {
      if (!op.subs[i]) continue;
      const Submission& sub = *op.subs[i];
      if (sub.in_buf) {
        place[i] = absl::StrCat(sub.in_buf->kind(), " buffers on ", sub.in_buf->device());
      }
    }
    auto places = GroupMembers(static_cast<int>(op.subs.size()), [&](int i) {
      return op.subs[i] && op.subs[i]->in_buf ? &place[i] : nullptr;
    });
    return absl::FailedPreconditionError(absl::StrCat(
        "op ", op.sequence, " on mesh '", mesh.name, "' mixes kinds of memory across members: ",
        ListGroups(places, " has ", " have "),
        "; every member's buffers of one op must be the same kind of memory (",
        absl::StrJoin(kinds, " or "), ")"));
  }
  Executor* executor = ExecutorFor(kind);
  if (executor == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "op ", op.sequence, " on mesh '", mesh.name, "' runs on ", kind,
        " buffers, but this daemon has no usable ", KindLabel(kind),
        " executor: ", NoExecutorReason(kind)));
  }
  // Across hosts, the host transport moves host memory; other memory needs an executor
  // that connects the hosts itself (GPU memory: NCCL).
  if (mesh.cross && kind != "memfd" && !executor->ConnectsHosts()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "op ", op.sequence, " on mesh '", mesh.name, "' runs on ", kind, " buffers, but the ",
        executor->name(), " executor cannot move them between hosts"));
  }
  return absl::OkStatus();
}

void Engine::MaybeStartNext(Mesh& mesh, Callbacks& cbs) {
  // The front op is the lowest sequence not yet completed; later ops wait.
  while (!mesh.pending.empty() && !shutting_down_) {
    PendingOp& op = mesh.pending.begin()->second;
    if (op.running || op.submitted < mesh.local_members) return;
    // A cluster mesh's other hosts must learn the verdict: it goes to them.
    if (op.verdict.ok() || mesh.cross) break;
    FailOp(mesh, op, op.verdict, cbs);
    ++mesh.completed;
    mesh.pending.erase(mesh.pending.begin());
  }
  if (mesh.pending.empty() || shutting_down_) return;
  PendingOp& op = mesh.pending.begin()->second;
  if (op.running || op.submitted < mesh.local_members) return;
  op.running = true;
  std::shared_ptr<const OpPlan> plan;
  for (const auto& sub : op.subs) {
    if (sub) {
      plan = sub->plan;
      break;
    }
  }
  std::vector<MemberIo> io(op.subs.size());
  std::vector<std::shared_ptr<SharedBuffer>> keep;
  // Every member's buffers are of this kind (CheckMemory).
  absl::string_view kind = "memfd";
  for (size_t i = 0; i < op.subs.size(); ++i) {
    if (!op.subs[i]) continue;  // a member on another host
    const Submission& sub = *op.subs[i];
    if (sub.in_buf) {
      io[i].in = static_cast<const uint8_t*>(sub.in_buf->data()) + sub.in_offset;
      io[i].out = static_cast<uint8_t*>(sub.out_buf->data()) + sub.out_offset;
      // Every member's output is one region of a mesh-shared buffer
      // (CheckSharedOutput): the first member's result is written there,
      // the others' are that one (out == nullptr: written elsewhere).
      if (!sub.out_buf->shared_mesh().empty()) {
        for (size_t j = 0; j < i; ++j) {
          if (io[j].out == io[i].out) {
            io[i].out = nullptr;
            break;
          }
        }
      }
      io[i].device = sub.in_buf->device_ordinal();
      kind = sub.in_buf->kind();
      keep.push_back(sub.in_buf);
      keep.push_back(sub.out_buf);
    }
  }
  Executor* executor = ExecutorFor(kind);
  std::string mesh_id = mesh.id;
  int64_t seq = op.sequence;
  std::function<void()> run;
  // Across hosts: starts the op on the mesh's connections with `verdict`
  // (every host then fails an op one host refused).
  std::function<void(absl::Status)> start_cross;
  if (mesh.cross) {
    ++cross_ops_in_flight_;
    // The connections run it on their thread and call back; the buffers
    // stay referenced until then.
    start_cross = [this, cross = mesh.cross, executor, plan, io = std::move(io),
                   keep = std::move(keep), mesh_id, seq, deadline = op.deadline,
                   timeout = op.deadline - op.first_submit](absl::Status verdict) {
      const int64_t started_ns = fastq::MonotonicNs();
      // The callback runs on the mesh's thread and holds a reference to the
      // mesh until it has returned, then drops it on a runner: the thread
      // must never destroy (join) itself. Last, it counts itself out, so
      // that the engine's destructor waits for it.
      cross->Start(plan, seq, io, executor, std::move(verdict), deadline,
                   [this, keep, mesh_id, seq, started_ns, cross](
                       absl::Status status, bool broken, Traffic traffic) mutable {
                     {
                       // Counted before the members learn the result.
                       MutexLock lock(&mu_);
                       ++(status.ok() ? cross_ops_completed_ : cross_ops_failed_);
                     }
                     OnOpFinished(mesh_id, seq, std::move(status), started_ns, traffic, broken);
                     runners_->Schedule([cross = std::move(cross)] {});
                     MutexLock lock(&mu_);
                     if (--cross_ops_in_flight_ == 0) cross_idle_.SignalAll();
                   },
                   timeout);
    };
    run = [start_cross, verdict = op.verdict] { start_cross(verdict); };
  } else {
    run = [this, executor, plan, io = std::move(io), keep = std::move(keep), mesh_id, seq] {
      const int64_t started_ns = fastq::MonotonicNs();
      Traffic traffic;
      absl::Status status = executor->Run(*plan, io, &traffic);
      // Members sharing one output: the result was written once.
      if (const int64_t outputs = OutputsWritten(io);
          status.ok() && outputs < static_cast<int64_t>(io.size())) {
        traffic = AccountTraffic(*plan, 0, 0, outputs);
      }
      OnOpFinished(mesh_id, seq, status, started_ns, traffic);
    };
  }
  // Stream-ordered members: unless their streams are there already, the op
  // waits for them on the stream waiter's thread (holding no runner), and
  // then runs on a runner.
  std::vector<MemberSync> streams;
  for (size_t i = 0; i < op.subs.size(); ++i) {
    if (op.subs[i] && op.subs[i]->sync) {
      streams.push_back(MemberSync{*op.subs[i]->sync, MemberLabel(mesh, static_cast<int>(i))});
    }
  }
  if (!streams.empty() && !StreamsReady(streams)) {
    op.cancel = std::make_shared<OpCancel>();
    stream_waiter_->Add(
        std::move(streams), op.deadline, op.cancel,
        absl::StrCat("mesh '", mesh.name, "': op ", seq, " (", plan->signature, ")"),
        [this, run = std::move(run), start_cross, mesh_id, seq](absl::Status status) {
          if (status.ok()) {
            runners_->Schedule(run);
          } else if (start_cross) {
            // The other hosts wait for this host's part of the op: they
            // fail it too.
            start_cross(std::move(status));
          } else {
            OnOpFinished(mesh_id, seq, std::move(status), fastq::MonotonicNs(), Traffic{});
          }
        });
    return;
  }
  // Not inline while an inline op runs on this thread: OnOpFinished starts
  // the next op from inside it, and chains of queued ops must not recurse.
  if (mesh.cross || (plan->bytes_touched() <= options_.inline_op_bytes && !t_running_inline)) {
    cbs.push_back([run = std::move(run)] {
      t_running_inline = true;
      run();
      t_running_inline = false;
    });
  } else {
    runners_->Schedule(std::move(run));
  }
}

void Engine::OnOpFinished(const std::string& mesh_id, int64_t sequence, absl::Status status,
                          int64_t started_ns, const Traffic& traffic, bool broken) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(mesh_id);
    if (it == meshes_.end()) return;
    Mesh& mesh = *it->second;
    auto op_it = mesh.pending.find(sequence);
    if (op_it == mesh.pending.end()) return;
    PendingOp& op = op_it->second;
    std::shared_ptr<const OpPlan> first;
    for (const auto& sub : op.subs) {
      if (sub) {
        first = sub->plan;
        break;
      }
    }
    const OpPlan& plan = *first;
    if (status.ok()) {
      CountOp(plan.kind, true, plan.in_bytes * op.submitted, traffic);
      if (options_.op_observer) {
        options_.op_observer(plan.kind, absl::StatusCode::kOk, plan.in_bytes,
                             absl::Now() - op.first_submit);
      }
      OpOutcome outcome{status, sequence};
      outcome.started_ns = started_ns;
      outcome.traffic = traffic;
      for (auto& sub : op.subs) {
        if (sub) DeliverOutcome(*sub, outcome, cbs);
      }
    } else if (mesh.cross && !absl::StartsWith(status.message(), "mesh '")) {
      // What the other hosts or the connections said, in the words of this
      // mesh's other failures.
      FailOp(mesh, op,
             absl::Status(status.code(), absl::StrCat("mesh '", mesh.name, "': ", status.message())),
             cbs);
    } else {
      FailOp(mesh, op, status, cbs);
    }
    ++mesh.completed;
    mesh.pending.erase(op_it);
    // The connections to the other hosts failed: the mesh cannot go on (and
    // the other hosts are told why, with its code).
    if (broken) {
      BreakMesh(mesh, std::string(status.message()), cbs, LogLevel::kWarn, status.code());
    }
    if (mesh.state == MeshState::kBroken) {
      MaybeEraseMesh(mesh_id);
    } else {
      MaybeStartNext(mesh, cbs);
    }
  }
  Run(cbs);
}

void Engine::OnOpDeadline(const std::string& mesh_id, int64_t sequence) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(mesh_id);
    if (it == meshes_.end()) return;
    Mesh& mesh = *it->second;
    auto op_it = mesh.pending.find(sequence);
    if (op_it == mesh.pending.end()) return;
    PendingOp& op = op_it->second;
    if (op.submitted == mesh.local_members) return;  // complete; queued or running
    std::vector<std::string> missing, waiting;
    std::string what;
    for (int i = 0; i < static_cast<int>(op.subs.size()); ++i) {
      if (op.subs[i]) {
        waiting.push_back(absl::StrCat(i));
        if (what.empty()) what = op.subs[i]->plan->signature;
      } else if (!mesh.cluster || mesh.member_host[i] == options_.rendezvous->host_id()) {
        missing.push_back(MemberLabel(mesh, i));
      }
    }
    std::string reason = absl::StrCat(
        "op ", sequence, " timed out after ", Millis(op.deadline - op.first_submit),
        " ms: ", WaitingMembers(waiting), " in ", what, "; missing: ",
        absl::StrJoin(missing, "; "));
    absl::Status status = absl::DeadlineExceededError(
        absl::StrCat("mesh '", mesh.name, "': ", reason));
    FailOp(mesh, op, status, cbs);
    mesh.pending.erase(op_it);
    // The members no longer agree on the op sequence: the mesh cannot go on
    // (the other hosts' members get the same DEADLINE_EXCEEDED and words).
    BreakMesh(mesh, reason, cbs, LogLevel::kWarn, absl::StatusCode::kDeadlineExceeded);
  }
  Run(cbs);
}

void Engine::OnCrossBroken(const std::string& mesh_id, const absl::Status& why) {
  Callbacks cbs;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(mesh_id);
    if (it == meshes_.end() || it->second->state != MeshState::kReady) return;
    BreakMesh(*it->second, std::string(why.message()), cbs, LogLevel::kWarn, why.code(),
              /*from_other_host=*/true);
    MaybeEraseMesh(mesh_id);
  }
  Run(cbs);
}

std::string Engine::MissingAt(const std::string& mesh_id, int64_t sequence) {
  MutexLock lock(&mu_);
  auto it = meshes_.find(mesh_id);
  if (it == meshes_.end()) return "(the mesh is gone from this host)";
  const Mesh& mesh = *it->second;
  std::vector<std::string> missing;
  for (int i = 0; i < mesh.shape.num_members(); ++i) {
    if (!mesh.member_session[i].empty() && mesh.next_sequence[i] <= sequence) {
      missing.push_back(MemberLabel(mesh, i));
    }
  }
  return absl::StrJoin(missing, "; ");
}

void Engine::Wait(const std::string& session_id, int64_t op_id, absl::Duration timeout,
                  std::function<void(absl::StatusOr<v1::WaitResponse>)> done) {
  auto respond = [op_id, done](const OpOutcome& outcome) {
    if (!outcome.status.ok()) {
      done(outcome.status);
      return;
    }
    v1::WaitResponse resp;
    resp.set_op_id(op_id);
    resp.set_sequence(outcome.sequence);
    done(resp);
  };
  absl::Status error;
  std::optional<OpOutcome> ready;
  {
    MutexLock lock(&mu_);
    auto s = GetSession(session_id);
    if (!s.ok()) {
      error = s.status();
    } else {
      auto it = (*s)->retained.find(op_id);
      if (it == (*s)->retained.end()) {
        error = absl::NotFoundError(absl::StrCat(
            "op ", op_id, " not found in this session (never submitted with Submit, or too old)"));
      } else if (it->second.done) {
        ready = it->second.outcome;
      } else {
        // Both the op and the wait timer may fire; the first one answers
        // (and the op cancels the timer, so no closure lingers).
        auto once = std::make_shared<std::atomic<bool>>(false);
        auto timer_id = std::make_shared<std::atomic<DeadlineTimer::TimerId>>(0);
        it->second.waiters.push_back([this, once, timer_id, respond](const OpOutcome& o) {
          if (once->exchange(true)) return;
          timer_->Cancel(timer_id->load());
          respond(o);
        });
        if (timeout > absl::ZeroDuration()) {
          timer_id->store(timer_->Schedule(absl::Now() + timeout, [once, respond, op_id, timeout] {
            if (!once->exchange(true)) {
              respond(OpOutcome{absl::DeadlineExceededError(absl::StrCat(
                                    "op ", op_id, " still running after waiting ",
                                    Millis(timeout), " ms")),
                                -1});
            }
          }));
        }
      }
    }
  }
  if (!error.ok()) {
    done(error);
  } else if (ready) {
    respond(*ready);
  }
}

// ---------------------------------------------------------------------------
// Diagnostics and shutdown
// ---------------------------------------------------------------------------

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
