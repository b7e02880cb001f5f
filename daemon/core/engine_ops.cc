// The engine's ops: submission checks, matching the members' ops,
// verdicts, scheduling, completion, deadlines and waits.
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

// Set while this thread runs an op inline (see EngineOptions::inline_op_bytes).
thread_local bool t_running_inline = false;

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

namespace {

// A session's buffer by id, for a submission ("input", "output", ...).
absl::StatusOr<std::shared_ptr<SharedBuffer>> FindBuffer(const BufferTable& buffers,
                                                         const std::string& id,
                                                         absl::string_view what) {
  auto it = buffers.find(id);
  if (it == buffers.end()) {
    return absl::NotFoundError(absl::StrCat(what, " buffer '", id, "' not found in this session"));
  }
  return it->second;
}

}  // namespace

absl::Status ResolveBuffers(const OpRequest& op, const OpPlan& plan,
                            const BufferTable& buffers, SubmittedBuffers& out) {
  if (plan.kind == OpKind::kBarrier || (plan.in_bytes == 0 && plan.out_bytes == 0)) {
    return absl::OkStatus();
  }
  auto find = [&](const std::string& id, absl::string_view what) {
    return id.empty() ? absl::StatusOr<std::shared_ptr<SharedBuffer>>(
                            absl::InvalidArgumentError(absl::StrCat(what, " buffer_id is empty")))
                      : FindBuffer(buffers, id, what);
  };
  const absl::string_view kind = OpKindName(plan.kind);
  auto in = find(op.input.buffer_id, "input");
  if (!in.ok()) return in.status();
  absl::Status st = CheckDeclared(kind, "input", op.input, plan.in_bytes,
                                  absl::StrCat("input ", ShapeString(plan.dtype, plan.in_shape)));
  if (!st.ok()) return st;
  st = CheckRange("input", op.input.buffer_id, op.input.offset, plan.in_bytes,
                  (*in)->size(), DTypeSize(plan.dtype));
  if (!st.ok()) return st;
  out.in_buf = *in;
  out.in_offset = static_cast<uint64_t>(op.input.offset);
  if (!op.output.has_value()) {
    if (plan.out_bytes != plan.in_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          kind, ": the result ", ShapeString(plan.out_dtype, plan.out_shape),
          " does not fit in place of the input ", ShapeString(plan.dtype, plan.in_shape),
          "; give an output"));
    }
    out.out_buf = out.in_buf;
    out.out_offset = out.in_offset;
    return absl::OkStatus();
  }
  auto res = find(op.output->buffer_id, "output");
  if (!res.ok()) return res.status();
  // The result must fit in the region the client declared, not only in the
  // buffer: else it would overwrite what follows the region.
  st = CheckDeclared(kind, "output", *op.output, plan.out_bytes,
                     absl::StrCat("result ", ShapeString(plan.out_dtype, plan.out_shape)));
  if (!st.ok()) return st;
  st = CheckRange("output", op.output->buffer_id, op.output->offset, plan.out_bytes,
                  (*res)->size(), DTypeSize(plan.out_dtype));
  if (!st.ok()) return st;
  out.out_buf = *res;
  out.out_offset = static_cast<uint64_t>(op.output->offset);
  // One member's op runs on one kind of memory, on one device.
  if (out.out_buf->kind() != out.in_buf->kind() || out.out_buf->device() != out.in_buf->device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, ": the input buffer '", op.input.buffer_id, "' is ", out.in_buf->kind(),
        " memory on ", out.in_buf->device(), " but the output buffer '", op.output->buffer_id,
        "' is ", out.out_buf->kind(), " memory on ", out.out_buf->device(),
        "; an op's input and output must be on the same device"));
  }
  if (out.out_buf == out.in_buf &&
      !SameOrDisjoint(out.in_offset, plan.in_bytes, out.out_offset, plan.out_bytes)) {
    return absl::InvalidArgumentError(
        "input and output regions overlap without being the same region");
  }
  return absl::OkStatus();
}

absl::StatusOr<Accepted> Engine::Submit(const std::string& session_id, const OpRequest& op,
                                        bool retain, OpDone done) {
  Callbacks cbs;
  // Run after unlocking, on every return (a refusal may have broken the mesh).
  absl::Cleanup run_callbacks = [&cbs] { Run(cbs); };
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  // Stream-ordered submission: the words first, so that a refusal below
  // still releases the client's stream (see StreamOrder).
  std::optional<SyncWords> sync;
  if (op.stream_sync.has_value()) {
    auto find = [&](const std::string& id, const char* what) {
      return FindBuffer(session->buffers, id, what);
    };
    auto words = SyncWords::Resolve(*op.stream_sync, find);
    if (!words.ok()) {
      SyncWords::ReleaseDoneIfValid(*op.stream_sync, find);
      return words.status();
    }
    sync = *std::move(words);
  }
  absl::Cleanup release_if_refused = [&sync] {
    if (sync.has_value()) sync->Release();
  };
  absl::StatusOr<Submission> sub = ResolveSubmissionLocked(*session, op, cbs);
  if (!sub.ok()) return sub.status();
  if (retain) {
    if (absl::Status st = MakeRoomToRetainLocked(*session); !st.ok()) return st;
  }
  Mesh& mesh = *meshes_.at(op.mesh_id);
  std::move(release_if_refused).Cancel();
  sub->done = retain ? RetainingDone(*session, std::move(done)) : std::move(done);
  sub->sync = sync;
  return EnqueueLocked(mesh, session->meshes.at(op.mesh_id), *std::move(sub), op, *session,
                       cbs);  // then run_callbacks
}

absl::StatusOr<Engine::Submission> Engine::ResolveSubmissionLocked(Session& session,
                                                                    const OpRequest& op,
                                                                    Callbacks& cbs) {
  auto member = session.meshes.find(op.mesh_id);
  if (member == session.meshes.end()) {
    return absl::NotFoundError(absl::StrCat(
        "mesh '", op.mesh_id, "' not found among this session's meshes (join it first)"));
  }
  Mesh& mesh = *meshes_.at(op.mesh_id);
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
  if (op.timeout_ms < 0) return absl::InvalidArgumentError("timeout_ms must be >= 0");
  auto plan = PlanOp(op, mesh.shape);
  if (!plan.ok()) return plan.status();
  Submission sub;
  sub.session_id = session.id;
  sub.plan = std::make_shared<const OpPlan>(*std::move(plan));
  SubmittedBuffers buffers;
  if (absl::Status st = ResolveBuffers(op, *sub.plan, session.buffers, buffers); !st.ok()) {
    return st;
  }
  sub.in_buf = std::move(buffers.in_buf);
  sub.out_buf = std::move(buffers.out_buf);
  sub.in_offset = buffers.in_offset;
  sub.out_offset = buffers.out_offset;
  return sub;
}

absl::Status Engine::MakeRoomToRetainLocked(Session& session) {
  if (static_cast<int>(session.retained.size()) < options_.max_retained_ops) {
    return absl::OkStatus();
  }
  auto done_op = std::find_if(session.retained.begin(), session.retained.end(),
                              [](const auto& r) { return r.second.done; });
  if (done_op == session.retained.end()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session has ", session.retained.size(),
                     " ops submitted and not completed; the limit is ", options_.max_retained_ops));
  }
  session.retained.erase(done_op);
  return absl::OkStatus();
}

OpDone Engine::RetainingDone(Session& session, OpDone user_done) {
  const int64_t op_id = session.next_op_id;  // EnqueueLocked gives it to this op
  session.retained[op_id];
  return [this, sid = session.id, op_id, user_done = std::move(user_done)](
             const OpOutcome& outcome) {
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

Accepted Engine::EnqueueLocked(Mesh& mesh, int index, Submission sub, const OpRequest& op,
                               Session& session, Callbacks& cbs) {
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
        op.timeout_ms > 0 ? absl::Milliseconds(op.timeout_ms) : mesh.op_timeout;
    pending.deadline = pending.first_submit + timeout;
    std::string mesh_id = mesh.id;
    pending.timer = timer_->Schedule(pending.deadline,
                                     [this, mesh_id, seq] { OnOpDeadline(mesh_id, seq); });
  }
  const int64_t op_id = session.next_op_id++;
  ++session.ops_submitted;
  Accepted accepted{op_id, seq, sub.plan->out_shape, sub.plan->out_dtype};
  pending.subs[index] = std::move(sub);
  ++pending.submitted;
  if (pending.submitted == mesh.local_members) OnOpFull(mesh, pending, cbs);
  return accepted;
}

void Engine::DeliverOutcome(const Submission& sub, const OpOutcome& outcome, Callbacks& cbs) {
  // The client's stream goes on whatever the outcome (StreamOrder).
  if (sub.sync) sub.sync->Release();
  if (!sub.done) return;
  OpOutcome o = outcome;
  o.out_shape = sub.plan->out_shape;
  o.out_dtype = sub.plan->out_dtype;
  cbs.push_back([done = sub.done, o = std::move(o)] { done(o); });
}

void Engine::CountOp(OpKind kind, bool ok, uint64_t bytes, const Traffic& traffic) {
  KindStats& k = stats_[kind];
  k.kind = kind;
  if (ok) {
    ++k.completed;
    k.bytes += static_cast<int64_t>(bytes);
    k.bytes_read += static_cast<int64_t>(traffic.read);
    k.bytes_written += static_cast<int64_t>(traffic.written);
    k.bytes_required += static_cast<int64_t>(traffic.required);
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
      (IsReduction(plan.kind) || plan.kind == OpKind::kAllGather ||
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

Engine::PendingOp* Engine::FrontOpToStart(Mesh& mesh, Callbacks& cbs) {
  // The front op is the lowest sequence not yet completed; later ops wait.
  while (!mesh.pending.empty() && !shutting_down_) {
    PendingOp& op = mesh.pending.begin()->second;
    if (op.running || op.submitted < mesh.local_members) return nullptr;
    // A cluster mesh's other hosts must learn the verdict: it goes to them.
    if (op.verdict.ok() || mesh.cross) return &op;
    FailOp(mesh, op, op.verdict, cbs);
    ++mesh.completed;
    mesh.pending.erase(mesh.pending.begin());
  }
  return nullptr;
}

absl::string_view Engine::GatherMemberIo(const PendingOp& op, std::vector<MemberIo>& io,
                                         std::vector<std::shared_ptr<SharedBuffer>>& keep) {
  // Every member's buffers are of this kind (CheckMemory).
  absl::string_view kind = "memfd";
  for (size_t i = 0; i < op.subs.size(); ++i) {
    if (!op.subs[i]) continue;  // a member on another host
    const Submission& sub = *op.subs[i];
    if (!sub.in_buf) continue;
    io[i].in = static_cast<const uint8_t*>(sub.in_buf->data()) + sub.in_offset;
    io[i].out = static_cast<uint8_t*>(sub.out_buf->data()) + sub.out_offset;
    // Every member's output is one region of a mesh-shared buffer
    // (CheckSharedOutput): the first member's result is written there, the
    // others' are that one (out == nullptr: written elsewhere).
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
  return kind;
}

std::function<void(absl::Status, int64_t)> Engine::CrossStarter(
    Mesh& mesh, const PendingOp& op, Executor* executor, std::shared_ptr<const OpPlan> plan,
    std::vector<MemberIo> io, std::vector<std::shared_ptr<SharedBuffer>> keep) {
  ++cross_ops_in_flight_;
  // The connections run it on their thread and call back; the buffers stay
  // referenced until then.
  return [this, cross = mesh.cross, executor, plan = std::move(plan), io = std::move(io),
          keep = std::move(keep), mesh_id = mesh.id, seq = op.sequence, deadline = op.deadline,
          timeout = op.deadline - op.first_submit,
          matched_ns = op.matched_ns](absl::Status verdict, int64_t ready_ns) {
    OpStamps stamps;
    stamps.matched_ns = matched_ns;
    stamps.ready_ns = ready_ns;
    stamps.started_ns = fastq::MonotonicNs();
    // The callback runs on the mesh's thread and holds a reference to the
    // mesh until it has returned, then drops it on a runner: the thread must
    // never destroy (join) itself. Last, it counts itself out, so that the
    // engine's destructor waits for it.
    cross->Start(plan, seq, io, executor, std::move(verdict), deadline,
                 [this, keep, mesh_id, seq, stamps, cross](
                     absl::Status status, bool broken, Traffic traffic) mutable {
                   stamps.executed_ns = fastq::MonotonicNs();
                   {
                     // Counted before the members learn the result.
                     MutexLock lock(&mu_);
                     ++(status.ok() ? cross_ops_completed_ : cross_ops_failed_);
                   }
                   OnOpFinished(mesh_id, seq, std::move(status), stamps, traffic, broken);
                   runners_->Schedule([cross = std::move(cross)] {});
                   MutexLock lock(&mu_);
                   if (--cross_ops_in_flight_ == 0) cross_idle_.SignalAll();
                 },
                 timeout);
  };
}

bool Engine::WaitForStreams(Mesh& mesh, PendingOp& op, const std::string& signature,
                            std::function<void(int64_t)>& run,
                            std::function<void(absl::Status, int64_t)>& start_cross) {
  std::vector<MemberSync> streams;
  for (size_t i = 0; i < op.subs.size(); ++i) {
    if (op.subs[i] && op.subs[i]->sync) {
      streams.push_back(MemberSync{*op.subs[i]->sync, MemberLabel(mesh, static_cast<int>(i))});
    }
  }
  if (streams.empty() || StreamsReady(streams)) return false;
  op.cancel = std::make_shared<OpCancel>();
  stream_waiter_->Add(
      std::move(streams), op.deadline, op.cancel,
      absl::StrCat("mesh '", mesh.name, "': op ", op.sequence, " (", signature, ")"),
      [this, run = std::move(run), start_cross = std::move(start_cross), mesh_id = mesh.id,
       seq = op.sequence, matched_ns = op.matched_ns](absl::Status status) {
        if (status.ok()) {
          runners_->Schedule([run, ready_ns = fastq::MonotonicNs()] { run(ready_ns); });
        } else if (start_cross) {
          // The other hosts wait for this host's part of the op: they fail
          // it too.
          start_cross(std::move(status), 0);
        } else {
          OpStamps stamps;  // matched, never ready
          stamps.matched_ns = matched_ns;
          OnOpFinished(mesh_id, seq, std::move(status), stamps, Traffic{});
        }
      });
  return true;
}

void Engine::MaybeStartNext(Mesh& mesh, Callbacks& cbs) {
  PendingOp* front = FrontOpToStart(mesh, cbs);
  if (front == nullptr) return;
  PendingOp& op = *front;
  op.running = true;
  op.matched_ns = fastq::MonotonicNs();
  std::shared_ptr<const OpPlan> plan;
  for (const auto& sub : op.subs) {
    if (sub) {
      plan = sub->plan;
      break;
    }
  }
  std::vector<MemberIo> io(op.subs.size());
  std::vector<std::shared_ptr<SharedBuffer>> keep;
  Executor* executor = ExecutorFor(GatherMemberIo(op, io, keep));
  // Runs the op; its argument: when its inputs were ready.
  std::function<void(int64_t)> run;
  // Across hosts: starts the op on the mesh's connections with `verdict`
  // (every host then fails an op one host refused).
  std::function<void(absl::Status, int64_t)> start_cross;
  if (mesh.cross) {
    start_cross = CrossStarter(mesh, op, executor, plan, std::move(io), std::move(keep));
    run = [start_cross, verdict = op.verdict](int64_t ready_ns) { start_cross(verdict, ready_ns); };
  } else {
    run = [this, executor, plan, io = std::move(io), keep = std::move(keep), mesh_id = mesh.id,
           seq = op.sequence, matched_ns = op.matched_ns](int64_t ready_ns) {
      OpStamps stamps;
      stamps.matched_ns = matched_ns;
      stamps.ready_ns = ready_ns;
      stamps.started_ns = fastq::MonotonicNs();
      Traffic traffic;
      absl::Status status = executor->RunTimed(*plan, io, &traffic, &stamps.device);
      stamps.executed_ns = fastq::MonotonicNs();
      // Members sharing one output: the result was written once.
      if (const int64_t outputs = OutputsWritten(io);
          status.ok() && outputs < static_cast<int64_t>(io.size())) {
        traffic = AccountTraffic(*plan, 0, 0, outputs);
      }
      OnOpFinished(mesh_id, seq, status, stamps, traffic);
    };
  }
  // Stream-ordered members: unless their streams are there already, the op
  // waits for them on the stream waiter's thread (holding no runner), and
  // then runs on a runner.
  if (WaitForStreams(mesh, op, plan->signature, run, start_cross)) return;
  // Not inline while an inline op runs on this thread: OnOpFinished starts
  // the next op from inside it, and chains of queued ops must not recurse.
  if (mesh.cross || (plan->bytes_touched() <= options_.inline_op_bytes && !t_running_inline)) {
    cbs.push_back([run = std::move(run), ready_ns = op.matched_ns] {
      t_running_inline = true;
      run(ready_ns);
      t_running_inline = false;
    });
  } else {
    runners_->Schedule([run = std::move(run), ready_ns = op.matched_ns] { run(ready_ns); });
  }
}

void Engine::OnOpFinished(const std::string& mesh_id, int64_t sequence, absl::Status status,
                          const OpStamps& stamps, const Traffic& traffic, bool broken) {
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
      outcome.stamps = stamps;
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
                  std::function<void(absl::StatusOr<Waited>)> done) {
  auto respond = [op_id, done](const OpOutcome& outcome) {
    if (!outcome.status.ok()) {
      done(outcome.status);
      return;
    }
    done(Waited{op_id, outcome.sequence});
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

}  // namespace collectived
