// The engine in one process: members are threads, buffers are real memfd
// buffers, ops run on the real CPU executor. Covers the rendezvous, matching,
// deadlines, member loss and validation paths quickly (and under TSan); the
// cross-process tests cover the same through gRPC and real processes.
#include "daemon/core/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fast_queue.h"
#include "common/sync.h"
#include "exec/cpu_executor.h"
#include "daemon/memory/buffer_allocator.h"
#include "daemon/util/log.h"
#include "tests/fakes/fake_gpu.h"
#include "tests/harness/callback_result.h"
#include "tests/harness/full_stderr.h"

namespace collectived {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

template <typename T>
using Result = CallbackResult<T>;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(EngineOptions{}); }

  void Start(EngineOptions options) {
    engine_.reset();
    engine_ = std::make_unique<Engine>(
        options, std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 2, .chunk_bytes = 256}));
  }
  void Start(EngineOptions options, Backends backends) {
    engine_.reset();
    engine_ = std::make_unique<Engine>(options, std::move(backends));
  }

  std::string NewSession(const std::string& name = "member") {
    auto s = engine_->CreateSession(name);
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(engine_->AttachSession(s->session_id, s->attach_token, 1000, 0).ok());
    return s->session_id;
  }

  JoinRequest JoinReq(const std::string& session, const std::string& mesh, int size,
                                  int64_t timeout_ms = 10000, int64_t op_timeout_ms = 0) {
    JoinRequest req;
    req.session_id = session;
    req.mesh_name = mesh;
    req.axes.push_back(AxisRequest{"i", size});
    req.timeout_ms = timeout_ms;
    req.op_timeout_ms = op_timeout_ms;
    return req;
  }

  // Joins `n` fresh sessions to a one-axis mesh; returns (session, mesh id).
  std::vector<std::pair<std::string, std::string>> FormMesh(const std::string& name, int n,
                                                            int64_t op_timeout_ms = 0) {
    std::vector<std::string> sessions;
    for (int i = 0; i < n; ++i) sessions.push_back(NewSession(absl::StrCat("m", i)));
    std::vector<std::unique_ptr<Result<absl::StatusOr<Joined>>>> results;
    for (int i = 0; i < n; ++i) {
      results.push_back(std::make_unique<Result<absl::StatusOr<Joined>>>());
      auto req = JoinReq(sessions[i], name, n, 10000, op_timeout_ms);
      req.coordinate.push_back(i);
      engine_->JoinMesh(req, results.back()->Callback());
    }
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < n; ++i) {
      const auto& r = results[i]->Get();
      EXPECT_TRUE(r.ok()) << r.status();
      out.emplace_back(sessions[i], r.ok() ? r->mesh.mesh_id : "");
    }
    return out;
  }

  // A float32 buffer of `count` elements filled with `value`, on `device`.
  std::string Buffer(const std::string& session, size_t count, float value,
                     const std::string& device = "") {
    auto info = engine_->AllocateBuffer(session, static_cast<int64_t>(count * 4), device);
    EXPECT_TRUE(info.ok()) << info.status();
    auto buf = engine_->GetBuffer(session, info->buffer_id);
    float* p = static_cast<float*>((*buf)->data());
    for (size_t i = 0; i < count; ++i) p[i] = value;
    return info->buffer_id;
  }

  float* Data(const std::string& session, const std::string& buffer) {
    return static_cast<float*>((*engine_->GetBuffer(session, buffer))->data());
  }

  static OpRequest Op(const std::string& mesh, OpKind kind, const std::string& buffer,
                       int64_t count) {
    OpRequest op;
    op.mesh_id = mesh;
    op.kind = kind;
    op.dtype = DType::kF32;
    op.shape.push_back(count);
    op.input.buffer_id = buffer;
    return op;
  }

  std::unique_ptr<Engine> engine_;
};

std::vector<absl::StatusOr<Joined>> JoinAll(Engine& engine,
                                                          const std::vector<std::string>& sessions,
                                                          const std::string& name,
                                                          const std::string& token) {
  const int n = static_cast<int>(sessions.size());
  std::vector<std::unique_ptr<Result<absl::StatusOr<Joined>>>> results;
  for (int i = 0; i < n; ++i) {
    results.push_back(std::make_unique<Result<absl::StatusOr<Joined>>>());
    JoinRequest req;
    req.session_id = sessions[i];
    req.mesh_name = name;
    req.axes.push_back(AxisRequest{"i", n});
    req.coordinate.push_back(i);
    req.timeout_ms = 10000;
    req.join_token = token;
    engine.JoinMesh(req, results.back()->Callback());
  }
  std::vector<absl::StatusOr<Joined>> out;
  for (auto& r : results) out.push_back(r->Get());
  return out;
}

TEST_F(EngineTest, JoinAssignsDistinctCoordinatesConcurrently) {
  constexpr int kMembers = 6;
  std::vector<std::string> sessions;
  for (int i = 0; i < kMembers; ++i) sessions.push_back(NewSession());
  std::vector<Result<absl::StatusOr<Joined>>> results(kMembers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i] {
      engine_->JoinMesh(JoinReq(sessions[i], "auto", kMembers), results[i].Callback());
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> indices;
  for (auto& r : results) {
    ASSERT_TRUE(r.Get().ok()) << r.Get().status();
    indices.insert(r.Get()->self.index);
    EXPECT_EQ(r.Get()->mesh.state, "READY");
    EXPECT_EQ(r.Get()->mesh.members.size(), kMembers);
  }
  EXPECT_EQ(indices.size(), static_cast<size_t>(kMembers));
}

TEST_F(EngineTest, JoinTimesOutNamingMissingCoordinates) {
  std::string s = NewSession();
  Result<absl::StatusOr<Joined>> r;
  auto req = JoinReq(s, "lonely", 3, /*timeout_ms=*/100);
  req.coordinate.push_back(1);
  engine_->JoinMesh(req, r.Callback());
  ASSERT_EQ(r.Get().status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string msg(r.Get().status().message());
  EXPECT_NE(msg.find("missing coordinates: (0) (2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 (1) pid 1000"), std::string::npos) << msg;
  // The name is free again.
  EXPECT_EQ(engine_->ListMeshes().size(), 0);
}

// A member waiting for the others is told, when its join times out, of
// the joins refused meanwhile (the others may have asked for other axes).
TEST_F(EngineTest, AJoinTimeoutNamesTheJoinsRefusedMeanwhile) {
  std::string a = NewSession(), b = NewSession();
  Result<absl::StatusOr<Joined>> ra, rb;
  auto req = JoinReq(a, "shape", 2, /*timeout_ms=*/300);
  req.coordinate.push_back(0);
  engine_->JoinMesh(req, ra.Callback());
  auto other = JoinReq(b, "shape", 4);
  other.coordinate.push_back(1);
  engine_->JoinMesh(other, rb.Callback());
  ASSERT_EQ(rb.Get().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(ra.Get().status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string msg(ra.Get().status().message());
  EXPECT_NE(msg.find("joins of this name refused meanwhile: pid 1000 'member': "), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("is forming with axes (i=2) but this join asks for (i=4)"),
            std::string::npos)
      << msg;
}

TEST_F(EngineTest, JoinRejectsDisagreeingAxesAndTakenCoordinates) {
  std::string a = NewSession(), b = NewSession(), c = NewSession();
  Result<absl::StatusOr<Joined>> ra, rb, rc;
  auto req = JoinReq(a, "m", 2);
  req.coordinate.push_back(0);
  engine_->JoinMesh(req, ra.Callback());
  auto other = JoinReq(b, "m", 3);
  other.coordinate.push_back(0);
  engine_->JoinMesh(other, rb.Callback());
  EXPECT_EQ(rb.Get().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(rb.Get().status().message().find("forming with axes (i=2)"), std::string::npos);
  auto taken = JoinReq(c, "m", 2);
  taken.coordinate.push_back(0);
  engine_->JoinMesh(taken, rc.Callback());
  EXPECT_EQ(rc.Get().status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(ra.Done());
  ASSERT_TRUE(engine_->CloseSession(a, "test").ok());
  EXPECT_EQ(ra.Get().status().code(), absl::StatusCode::kAborted);
}

TEST_F(EngineTest, ScopesKeepJobsApartAndTokensGuardJoins) {
  // Two jobs use the same mesh name in different scopes: two meshes.
  std::vector<Result<absl::StatusOr<Joined>>> joins(2);
  for (int job = 0; job < 2; ++job) {
    auto req = JoinReq(NewSession(), "train", 1);
    req.scope = absl::StrCat("job-", job);
    engine_->JoinMesh(req, joins[job].Callback());
  }
  ASSERT_TRUE(joins[0].Get().ok()) << joins[0].Get().status();
  ASSERT_TRUE(joins[1].Get().ok()) << joins[1].Get().status();
  EXPECT_NE(joins[0].Get()->mesh.mesh_id, joins[1].Get()->mesh.mesh_id);
  EXPECT_EQ(joins[1].Get()->mesh.scope, "job-1");
  EXPECT_EQ(joins[1].Get()->mesh.generation, 1);
  auto described = engine_->DescribeMesh("", "train", "job-1");
  ASSERT_TRUE(described.ok());
  EXPECT_EQ(described->mesh_id, joins[1].Get()->mesh.mesh_id);

  // A join token set by the first member keeps others out.
  Result<absl::StatusOr<Joined>> owner, intruder, teammate;
  auto req = JoinReq(NewSession(), "guarded", 2);
  req.join_token = "secret";
  engine_->JoinMesh(req, owner.Callback());
  auto bad = JoinReq(NewSession(), "guarded", 2);
  bad.join_token = "guess";
  engine_->JoinMesh(bad, intruder.Callback());
  EXPECT_EQ(intruder.Get().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(owner.Done());
  auto good = JoinReq(NewSession(), "guarded", 2);
  good.join_token = "secret";
  engine_->JoinMesh(good, teammate.Callback());
  ASSERT_TRUE(teammate.Get().ok()) << teammate.Get().status();
  ASSERT_TRUE(owner.Get().ok()) << owner.Get().status();

  auto bad_scope = JoinReq(NewSession(), "m", 1);
  bad_scope.scope = "a b";
  Result<absl::StatusOr<Joined>> rejected;
  engine_->JoinMesh(bad_scope, rejected.Callback());
  EXPECT_EQ(rejected.Get().status().code(), absl::StatusCode::kInvalidArgument);
}

// Joins `sessions` to mesh `name` of that many members with `token`,
// coordinates in order; returns the results.
std::vector<absl::StatusOr<Joined>> JoinAll(Engine& engine,
                                                          const std::vector<std::string>& sessions,
                                                          const std::string& name,
                                                          const std::string& token);

TEST_F(EngineTest, JoinTokenCarriesOverToTheNextGenerations) {
  // A job of two forms "job" with a token; member 1 dies: the mesh breaks.
  std::vector<std::string> job = {NewSession("m0"), NewSession("m1")};
  for (const auto& r : JoinAll(*engine_, job, "job", "secret")) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->mesh.generation, 1);
  }
  ASSERT_TRUE(engine_->CloseSession(job[1], "killed").ok());
  // A foreign process rejoins the name before the survivor: refused, with a
  // wrong token or none, and the refusal changes nothing.
  for (const std::string token : {"guess", ""}) {
    Result<absl::StatusOr<Joined>> intruder;
    auto req = JoinReq(NewSession("intruder"), "job", 1);
    req.join_token = token;
    engine_->JoinMesh(req, intruder.Callback());
    EXPECT_EQ(intruder.Get().status().code(), absl::StatusCode::kPermissionDenied)
        << "token '" << token << "': " << intruder.Get().status();
    EXPECT_NE(intruder.Get().status().message().find("carries over"), std::string::npos)
        << intruder.Get().status();
  }
  // The survivor and a replacement that holds the token re-form it.
  job[1] = NewSession("replacement");
  for (const auto& r : JoinAll(*engine_, job, "job", "secret")) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->mesh.generation, 2);
  }
  // Every member leaves: with the default hold (60 s) the name stays guarded
  // though no mesh of it is left, so a job restarting all its processes
  // cannot be overtaken either.
  for (const auto& s : job) ASSERT_TRUE(engine_->CloseSession(s, "job ended").ok());
  EXPECT_EQ(engine_->ListMeshes().size(), 0);
  auto late = JoinAll(*engine_, {NewSession("late")}, "job", "guess");
  EXPECT_EQ(late[0].status().code(), absl::StatusCode::kPermissionDenied) << late[0].status();
  auto restarted = JoinAll(*engine_, {NewSession("restarted")}, "job", "secret");
  ASSERT_TRUE(restarted[0].ok()) << restarted[0].status();
  EXPECT_EQ(restarted[0]->mesh.generation, 3);
}

TEST_F(EngineTest, CarriedJoinTokenIsForgottenOnceTheNameIsIdleForTheHold) {
  Start(EngineOptions{.token_hold = absl::ZeroDuration()});
  std::vector<std::string> job = {NewSession("m0"), NewSession("m1")};
  auto formed = JoinAll(*engine_, job, "job", "secret");
  for (const auto& r : formed) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(engine_->CloseSession(job[1], "killed").ok());
  // Even without a hold, the name is guarded while a member of the broken
  // generation is still in it (it has not rejoined or left yet).
  auto early = JoinAll(*engine_, {NewSession("other")}, "job", "other-token");
  EXPECT_EQ(early[0].status().code(), absl::StatusCode::kPermissionDenied) << early[0].status();
  // The survivor leaves too: no mesh of the name is left and the hold is 0,
  // so another job may take the name with its own token.
  ASSERT_TRUE(engine_->LeaveMesh(job[0], formed[0]->mesh.mesh_id).ok());
  EXPECT_EQ(engine_->ListMeshes().size(), 0);
  auto next = JoinAll(*engine_, {NewSession("next-job")}, "job", "other-token");
  ASSERT_TRUE(next[0].ok()) << next[0].status();
  EXPECT_EQ(next[0]->mesh.generation, 2);
}

TEST_F(EngineTest, PsumFromThreadsGivesEveryMemberTheSum) {
  constexpr int kMembers = 4;
  constexpr int kCount = 1000;
  auto members = FormMesh("sum", kMembers);
  std::vector<std::string> buffers;
  for (int i = 0; i < kMembers; ++i) buffers.push_back(Buffer(members[i].first, kCount, i + 1.0f));
  std::vector<Result<OpOutcome>> done(kMembers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i] {
      auto r = engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, buffers[i], kCount),
                               false, done[i].Callback());
      EXPECT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->sequence, 0);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kMembers; ++i) {
    ASSERT_TRUE(done[i].Get().status.ok()) << done[i].Get().status;
    const float* p = Data(members[i].first, buffers[i]);
    for (int e = 0; e < kCount; ++e) ASSERT_EQ(p[e], 10.0f) << "member " << i << " element " << e;
  }
  auto stats = engine_->GetStats();
  EXPECT_EQ(stats.ops_completed, 1);
}

TEST_F(EngineTest, MismatchFailsEveryMemberWithOneMessageAndTheMeshGoesOn) {
  auto members = FormMesh("mm", 4);
  std::vector<std::string> buffers;
  for (auto& [s, m] : members) buffers.push_back(Buffer(s, 8, 1.0f));
  std::vector<Result<OpOutcome>> done(4);
  for (int i = 0; i < 4; ++i) {
    auto kind = i == 2 ? OpKind::kPmax : OpKind::kPsum;
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, kind, buffers[i], 8), false,
                                done[i].Callback()).ok());
  }
  for (int i = 0; i < 4; ++i) {
    const OpOutcome& o = done[i].Get();
    ASSERT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(std::string(o.status.message()),
              "op 0 on mesh 'mm' does not match across members: member 2 submitted pmax f32[8] "
              "over (i) while members 0,1,3 submitted psum f32[8] over (i)");
    EXPECT_EQ(Data(members[i].first, buffers[i])[0], 1.0f) << "a failed op wrote data";
  }
  std::vector<Result<OpOutcome>> next(4);
  for (int i = 0; i < 4; ++i) {
    auto r = engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, buffers[i], 8), false,
                             next[i].Callback());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->sequence, 1);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(next[i].Get().status.ok()) << next[i].Get().status;
    EXPECT_EQ(Data(members[i].first, buffers[i])[7], 4.0f);
  }
}

TEST_F(EngineTest, OpTimeoutNamesTheMissingMemberAndBreaksTheMesh) {
  auto members = FormMesh("slow", 3, /*op_timeout_ms=*/200);
  std::vector<std::string> buffers;
  for (auto& [s, m] : members) buffers.push_back(Buffer(s, 4, 1.0f));
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, buffers[i], 4),
                                false, done[i].Callback()).ok());
  }
  auto pending = engine_->ListPendingOps("");
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 1);
  EXPECT_EQ((*pending)[0].state, "waiting");
  EXPECT_EQ((*pending)[0].missing.size(), 1);
  EXPECT_EQ((*pending)[0].missing[0], 2);
  for (int i = 0; i < 2; ++i) {
    const OpOutcome& o = done[i].Get();
    ASSERT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
    const std::string msg(o.status.message());
    EXPECT_NE(msg.find("members 0,1 are waiting in psum f32[4] over (i)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing: 2 (2) pid 1000"), std::string::npos) << msg;
  }
  // The late member learns the mesh is broken.
  auto late = engine_->Submit(members[2].first, Op(members[2].second, OpKind::kPsum, buffers[2], 4),
                              false, [](const OpOutcome&) {});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted);
}

TEST_F(EngineTest, ClosedMemberBreaksTheMeshAndSurvivorsReform) {
  auto members = FormMesh("crash", 3);
  std::vector<std::string> buffers;
  for (auto& [s, m] : members) buffers.push_back(Buffer(s, 4, 2.0f));
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, buffers[i], 4),
                                false, done[i].Callback()).ok());
  }
  ASSERT_TRUE(engine_->CloseSession(members[2].first, "killed").ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(done[i].Get().status.code(), absl::StatusCode::kAborted);
    EXPECT_NE(std::string(done[i].Get().status.message()).find("member 2 (2)"), std::string::npos)
        << done[i].Get().status;
  }
  // Survivors re-form the name as generation 2 with a new member.
  std::string fresh = NewSession();
  std::vector<std::string> sessions = {members[0].first, members[1].first, fresh};
  std::vector<Result<absl::StatusOr<Joined>>> joins(3);
  for (int i = 0; i < 3; ++i) {
    auto req = JoinReq(sessions[i], "crash", 3);
    req.coordinate.push_back(i);
    engine_->JoinMesh(req, joins[i].Callback());
  }
  for (auto& j : joins) {
    ASSERT_TRUE(j.Get().ok()) << j.Get().status();
    EXPECT_EQ(j.Get()->mesh.generation, 2);
  }
  // The broken generation is gone once every member left it.
  EXPECT_EQ(engine_->ListMeshes().size(), 1);
}

TEST_F(EngineTest, BadInputIsRejectedAndChangesNothing) {
  auto members = FormMesh("bad", 1);
  const auto& [s, mesh] = members[0];
  std::string buf = Buffer(s, 16, 1.0f);
  std::string other = NewSession();
  std::string foreign = Buffer(other, 16, 1.0f);
  auto submit = [&](const OpRequest& op) {
    return engine_->Submit(s, op, false, [](const OpOutcome&) { ADD_FAILURE() << "ran"; }).status();
  };
  EXPECT_EQ(submit(Op(mesh, OpKind::kPsum, "b-nope", 16)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(submit(Op(mesh, OpKind::kPsum, foreign, 16)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(submit(Op(mesh, OpKind::kPsum, buf, 1 << 20)).code(), absl::StatusCode::kOutOfRange);
  auto op = Op(mesh, OpKind::kPsum, buf, 4);
  op.input.offset = 2;
  EXPECT_EQ(submit(op).code(), absl::StatusCode::kInvalidArgument);
  op.input.offset = -4;
  EXPECT_EQ(submit(op).code(), absl::StatusCode::kOutOfRange);
  op.input.offset = int64_t{1} << 62;
  EXPECT_EQ(submit(op).code(), absl::StatusCode::kOutOfRange);
  op = Op(mesh, OpKind::kPsum, buf, 4);
  op.output = BufferRegion{buf};
  op.output->offset = 8;
  EXPECT_EQ(submit(op).code(), absl::StatusCode::kInvalidArgument);  // partial overlap
  auto gather = Op(mesh, OpKind::kAllGather, buf, 4);
  gather.all_gather.axis = 0;
  // A group of one: the gathered result has the input's size, so in place is fine.
  EXPECT_TRUE(engine_->Submit(s, gather, false, [](const OpOutcome&) {}).ok());
  // Sizes that overflow: f32[0, 2^62] gathered (tiled) over the group; the
  // zero dimension makes the input empty, the result's other one overflows.
  auto overflow = Op(mesh, OpKind::kAllGather, buf, 0);
  overflow.shape.push_back(int64_t{1} << 62);
  overflow.all_gather.axis = 1;
  overflow.all_gather.tiled = true;
  overflow.output = BufferRegion{buf};
  absl::Status st = submit(overflow);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("exceeds 2^40"), std::string::npos) << st;
  auto unknown_mesh = Op("m-nope", OpKind::kPsum, buf, 4);
  EXPECT_EQ(submit(unknown_mesh).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->Submit("s-nope", Op(mesh, OpKind::kPsum, buf, 4), false, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  // Only the accepted op took a sequence number.
  Result<OpOutcome> done;
  auto r = engine_->Submit(s, Op(mesh, OpKind::kPsum, buf, 4), false, done.Callback());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sequence, 1);
  EXPECT_TRUE(done.Get().status.ok());
}

// A declared output region shorter than the result is refused, naming both
// sizes, and nothing is written; a longer one is fine.
TEST_F(EngineTest, OutputRegionShorterThanTheResultIsRefused) {
  auto members = FormMesh("short-out", 1);
  const auto& [s, mesh] = members[0];
  std::string buf = Buffer(s, 64, 1.0f);
  auto submit = [&](const OpRequest& op) {
    return engine_->Submit(s, op, false, [](const OpOutcome&) { ADD_FAILURE() << "ran"; }).status();
  };
  // psum f32[8] into a region declared as 16 bytes (f32[4]) that the buffer
  // has room after: the result would be written past it.
  auto op = Op(mesh, OpKind::kPsum, buf, 8);
  op.output = BufferRegion{buf};
  op.output->offset = 128;
  op.output->size_bytes = 16;
  absl::Status st = submit(op);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("output region of 16 bytes"), std::string::npos) << st;
  EXPECT_NE(st.message().find("f32[8] of 32 bytes"), std::string::npos) << st;
  // An all_gather result (f32[1,8]) likewise; pmean of int8 gives float32.
  auto gather = op;
  gather.kind = OpKind::kAllGather;
  gather.output->size_bytes = 31;
  EXPECT_EQ(submit(gather).code(), absl::StatusCode::kInvalidArgument);
  auto mean = op;
  mean.kind = OpKind::kPmean;
  mean.dtype = DType::kI8;
  mean.output->size_bytes = 8;  // int8[8]; the result is f32[8]
  st = submit(mean);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("f32[8] of 32 bytes"), std::string::npos) << st;
  op.output->size_bytes = -1;
  EXPECT_EQ(submit(op).code(), absl::StatusCode::kInvalidArgument);
  // An input region shorter than its shape, too.
  auto in = Op(mesh, OpKind::kPsum, buf, 8);
  in.input.size_bytes = 28;
  EXPECT_EQ(submit(in).code(), absl::StatusCode::kInvalidArgument);
  const float* p = Data(s, buf);
  for (int e = 0; e < 64; ++e) ASSERT_EQ(p[e], 1.0f) << "element " << e << " changed";

  // Exactly the result's size, or more, is fine; the result starts at the
  // offset and nothing after it changes.
  Result<OpOutcome> exact, longer;
  op.output->size_bytes = 32;
  ASSERT_TRUE(engine_->Submit(s, op, false, exact.Callback()).ok());
  EXPECT_TRUE(exact.Get().status.ok()) << exact.Get().status;
  op.output->size_bytes = 4096;
  op.output->offset = 0;
  op.input.offset = 128;
  ASSERT_TRUE(engine_->Submit(s, op, false, longer.Callback()).ok());
  EXPECT_TRUE(longer.Get().status.ok()) << longer.Get().status;
  p = Data(s, buf);
  for (int e = 0; e < 64; ++e) EXPECT_EQ(p[e], 1.0f) << "element " << e;
}

TEST_F(EngineTest, BufferQuotas) {
  EngineOptions options;
  options.max_buffers_per_session = 2;
  options.max_buffer_bytes_per_session = 3 * 4096;
  options.max_buffer_size = 8192;
  Start(options);
  std::string s = NewSession();
  EXPECT_EQ(engine_->AllocateBuffer(s, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->AllocateBuffer(s, 8193).status().code(), absl::StatusCode::kInvalidArgument);
  auto a = engine_->AllocateBuffer(s, 8192);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(engine_->AllocateBuffer(s, 8192).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(engine_->AllocateBuffer(s, 1).ok());
  EXPECT_EQ(engine_->AllocateBuffer(s, 1).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(engine_->FreeBuffer(s, a->buffer_id).ok());
  EXPECT_EQ(engine_->FreeBuffer(s, a->buffer_id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->AllocateBuffer(s, 4096).ok());
}

TEST_F(EngineTest, SessionAndMeshQuotas) {
  EngineOptions options;
  options.max_sessions = 3;
  options.max_meshes = 1;
  Start(options);
  std::string a = NewSession(), b = NewSession(), c = NewSession();
  EXPECT_EQ(engine_->CreateSession("one too many").status().code(),
            absl::StatusCode::kResourceExhausted);
  Result<absl::StatusOr<Joined>> first, second;
  engine_->JoinMesh(JoinReq(a, "one", 1), first.Callback());
  ASSERT_TRUE(first.Get().ok());
  engine_->JoinMesh(JoinReq(b, "two", 1), second.Callback());
  EXPECT_EQ(second.Get().status().code(), absl::StatusCode::kResourceExhausted);
  // Closing frees the slots.
  ASSERT_TRUE(engine_->CloseSession(a, "test").ok());
  EXPECT_TRUE(engine_->CreateSession("fits again").ok());
  Result<absl::StatusOr<Joined>> third;
  engine_->JoinMesh(JoinReq(c, "three", 1), third.Callback());
  EXPECT_TRUE(third.Get().ok()) << third.Get().status();
}

TEST_F(EngineTest, WaitReturnsTheOutcomeOrTimesOut) {
  auto members = FormMesh("wait", 2);
  std::vector<std::string> buffers;
  for (auto& [s, m] : members) buffers.push_back(Buffer(s, 4, 1.0f));
  auto r0 = engine_->Submit(members[0].first, Op(members[0].second, OpKind::kPsum, buffers[0], 4), true,
                            nullptr);
  ASSERT_TRUE(r0.ok());
  Result<absl::StatusOr<Waited>> early;
  engine_->Wait(members[0].first, r0->op_id, absl::Milliseconds(50), early.Callback());
  EXPECT_EQ(early.Get().status().code(), absl::StatusCode::kDeadlineExceeded);
  auto r1 = engine_->Submit(members[1].first, Op(members[1].second, OpKind::kPsum, buffers[1], 4), true,
                            nullptr);
  ASSERT_TRUE(r1.ok());
  Result<absl::StatusOr<Waited>> w0, w1;
  engine_->Wait(members[0].first, r0->op_id, absl::ZeroDuration(), w0.Callback());
  engine_->Wait(members[1].first, r1->op_id, absl::ZeroDuration(), w1.Callback());
  ASSERT_TRUE(w0.Get().ok()) << w0.Get().status();
  ASSERT_TRUE(w1.Get().ok()) << w1.Get().status();
  EXPECT_EQ(Data(members[1].first, buffers[1])[3], 2.0f);
  Result<absl::StatusOr<Waited>> unknown;
  engine_->Wait(members[0].first, 999, absl::ZeroDuration(), unknown.Callback());
  EXPECT_EQ(unknown.Get().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EngineTest, ShutdownFailsPendingWorkWithUnavailable) {
  auto members = FormMesh("down", 2);
  std::string buf = Buffer(members[0].first, 4, 1.0f);
  Result<OpOutcome> op;
  ASSERT_TRUE(engine_->Submit(members[0].first, Op(members[0].second, OpKind::kPsum, buf, 4), false,
                              op.Callback()).ok());
  std::string joiner = NewSession();
  Result<absl::StatusOr<Joined>> join;
  engine_->JoinMesh(JoinReq(joiner, "other", 2), join.Callback());
  engine_->Shutdown("test");
  EXPECT_EQ(op.Get().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(join.Get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine_->CreateSession("late").status().code(), absl::StatusCode::kUnavailable);
}

// The engine writes its log lines after unlocking: a stderr that does not
// drain holds up the thread whose line it is, not every other caller.
TEST_F(EngineTest, ALogLineStuckOnStderrDoesNotHoldUpTheEngine) {
  auto members = FormMesh("stuck-log", 2);
  SetLogLevel(LogLevel::kInfo);  // session_closed and mesh_broken are logged at info and warn
  // A line's writer waits for room as long as it takes (not LogEvent's
  // usual 100 ms), so a write under the engine's lock would hold it.
  SetLogStderrWait(absl::InfiniteDuration());
  absl::Cleanup usual_wait = [] { SetLogStderrWait(absl::Milliseconds(100)); };
  testing::FullStderr full;
  ASSERT_TRUE(full.ok());

  // Breaks the mesh and closes the session, then logs both: its thread
  // stays in the log's write.
  std::thread closer([&] { EXPECT_TRUE(engine_->CloseSession(members[1].first, "stuck log").ok()); });
  // Meanwhile another caller gets its answer (the broken mesh, once it is).
  std::vector<std::future<std::string>> probes;  // kept: a stuck one is joined below
  bool stuck = false, broken = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5);
       !broken && !stuck && absl::Now() < deadline;) {
    probes.push_back(std::async(std::launch::async, [this] {
      std::vector<MeshView> list = engine_->ListMeshes();
      return list.size() == 1 ? list[0].state : std::string("?");
    }));
    if (probes.back().wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      stuck = true;
    } else if (probes.back().get() == "BROKEN") {
      broken = true;
    } else {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  // Unblock the writer whatever happened (no ASSERT from here on: the
  // threads must be joined); its lines then land in the pipe.
  full.DrainFiller();
  closer.join();
  const std::string written = full.Restore();
  EXPECT_FALSE(stuck) << "a ListMeshes waited for the engine's lock while a log line was stuck "
                         "on stderr";
  EXPECT_TRUE(broken);
  // The lines were written, whole, once stderr drained.
  EXPECT_NE(written.find(" event=mesh_broken mesh=stuck-log "), std::string::npos) << written;
  EXPECT_NE(written.find(" event=session_closed "), std::string::npos) << written;
}

TEST_F(EngineTest, UnattachedSessionsExpire) {
  EngineOptions options;
  options.attach_timeout = absl::Milliseconds(50);
  Start(options);
  auto s = engine_->CreateSession("never-attaches");
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 200 && engine_->ListSessions().size() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(engine_->ListSessions().size(), 0);
  EXPECT_EQ(engine_->AttachSession(s->session_id, s->attach_token, 1, 0).code(),
            absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Backends: buffers on devices, the executor of each kind of memory.
//
// The fake GPU of tests/fakes/fake_gpu.h (host memory calling itself
// "cuda") lets the engine's choices be checked without a GPU.

TEST_F(EngineTest, BuffersLiveOnTheDeviceAskedForAndStatsSplitThemByDevice) {
  FakeGpuExecutor* gpu = nullptr;
  Start(EngineOptions{}, HostAndFakeGpu(&gpu));
  std::string s = NewSession();
  auto host = engine_->AllocateBuffer(s, 100);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->kind, "memfd");
  EXPECT_EQ(host->device, "cpu");
  auto cpu = engine_->AllocateBuffer(s, 4096, "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->device, "cpu");
  auto g1 = engine_->AllocateBuffer(s, 8192, "cuda:1");
  ASSERT_TRUE(g1.ok()) << g1.status();
  EXPECT_EQ(g1->kind, "cuda");
  EXPECT_EQ(g1->device, FakeGpuBuffer::FakeDevice(1));
  EXPECT_EQ(g1->size_bytes, 8192);
  auto by_uuid = engine_->AllocateBuffer(s, 4096, "GPU-00000000-0000-0000-0000-000000000001");
  EXPECT_EQ(by_uuid.status().code(), absl::StatusCode::kNotFound);  // the fake knows ordinals only
  EXPECT_EQ(engine_->AllocateBuffer(s, 4096, "cuda:7").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->AllocateBuffer(s, 4096, "gpu7").status().code(),
            absl::StatusCode::kInvalidArgument);

  auto sessions = engine_->ListSessions();
  ASSERT_EQ(sessions.size(), 1);
  const auto& info = sessions[0];
  EXPECT_EQ(info.buffers, 3);
  EXPECT_EQ(info.buffer_bytes, 4096 + 4096 + 8192);
  ASSERT_EQ(info.buffers_by_device.size(), 2);
  EXPECT_EQ(info.buffers_by_device[0].device, "cpu");
  EXPECT_EQ(info.buffers_by_device[0].kind, "memfd");
  EXPECT_EQ(info.buffers_by_device[0].buffers, 2);
  EXPECT_EQ(info.buffers_by_device[0].buffer_bytes, 8192);
  EXPECT_EQ(info.buffers_by_device[1].device, FakeGpuBuffer::FakeDevice(1));
  EXPECT_EQ(info.buffers_by_device[1].kind, "cuda");
  EXPECT_EQ(info.buffers_by_device[1].buffers, 1);
  EXPECT_EQ(info.buffers_by_device[1].buffer_bytes, 8192);
  auto stats = engine_->GetStats();
  EXPECT_EQ(stats.buffers, 3);
  EXPECT_EQ(stats.buffer_bytes, 16384);
  ASSERT_EQ(stats.buffers_by_device.size(), 2);
  EXPECT_EQ(stats.buffers_by_device[1].buffer_bytes, 8192);
  EXPECT_EQ(stats.executor_threads, 1);  // the host executor's (threads = 1)

  ASSERT_TRUE(engine_->FreeBuffer(s, g1->buffer_id).ok());
  EXPECT_EQ(engine_->GetStats().buffers_by_device.size(), 1);
  EXPECT_EQ(engine_->GetStats().buffer_bytes, 8192);
}

TEST_F(EngineTest, HostAndGpuBytesHaveSeparateQuotas) {
  EngineOptions options;
  options.max_buffer_bytes_per_session = 4096;
  options.max_gpu_buffer_bytes_per_session = 8192;
  Start(options, HostAndFakeGpu(nullptr));
  std::string s = NewSession();
  ASSERT_TRUE(engine_->AllocateBuffer(s, 4096).ok());
  EXPECT_EQ(engine_->AllocateBuffer(s, 1).status().code(), absl::StatusCode::kResourceExhausted);
  auto g = engine_->AllocateBuffer(s, 8192, "cuda:0");
  ASSERT_TRUE(g.ok()) << g.status();
  auto over = engine_->AllocateBuffer(s, 1, "cuda:1");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(over.status().message()),
            "session holds 8192 GPU buffer bytes; 1 more exceeds the limit of 8192");
  ASSERT_TRUE(engine_->FreeBuffer(s, g->buffer_id).ok());
  EXPECT_TRUE(engine_->AllocateBuffer(s, 1, "cuda:1").ok());
  EXPECT_EQ(engine_->AllocateBuffer(s, 1).status().code(), absl::StatusCode::kResourceExhausted);
}

// Host buffers whose destructor asks whether the engine's lock is free: it
// calls ListSessions (which takes the lock) from another thread, and waits
// for it a while.
class LockProbingAllocator : public BufferAllocator {
 public:
  explicit LockProbingAllocator(Engine** engine, std::atomic<int>* destroyed_under_lock)
      : engine_(engine), under_lock_(destroyed_under_lock), inner_(MakeMemfdAllocator()) {}
  absl::string_view kind() const override { return "memfd"; }
  absl::Status Viable() const override { return absl::OkStatus(); }
  absl::StatusOr<std::shared_ptr<SharedBuffer>> Allocate(size_t bytes,
                                                         const DeviceSpec& device) override {
    auto b = inner_->Allocate(bytes, device);
    if (!b.ok()) return b;
    Engine** engine = engine_;
    std::atomic<int>* under_lock = under_lock_;
    std::shared_ptr<SharedBuffer> inner = *std::move(b);
    SharedBuffer* raw = inner.get();
    // Same buffer, with the probe run before it is destroyed.
    return std::shared_ptr<SharedBuffer>(raw, [inner, engine, under_lock](SharedBuffer*) mutable {
      // Detached: under the lock, it finishes once the lock is released.
      auto answered = std::make_shared<std::promise<void>>();
      std::future<void> probe = answered->get_future();
      std::thread([engine, answered] {
        (*engine)->ListSessions();
        answered->set_value();
      }).detach();
      if (probe.wait_for(std::chrono::seconds(2)) != std::future_status::ready) ++*under_lock;
      inner.reset();
    });
  }

 private:
  Engine** engine_;
  std::atomic<int>* under_lock_;
  std::unique_ptr<BufferAllocator> inner_;
};

TEST_F(EngineTest, AClosedSessionsBuffersAreUnmappedOutsideTheEnginesLock) {
  Engine* engine = nullptr;
  std::atomic<int> under_lock{0};
  Backends b;
  b.allocators.push_back(std::make_unique<LockProbingAllocator>(&engine, &under_lock));
  b.executors.push_back(std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 1}));
  Start(EngineOptions{}, std::move(b));
  engine = engine_.get();
  const std::string s = NewSession();
  ASSERT_TRUE(engine_->AllocateBuffer(s, 4096).ok());
  ASSERT_TRUE(engine_->AllocateBuffer(s, 8192).ok());
  ASSERT_TRUE(engine_->CloseSession(s, "test").ok());
  EXPECT_EQ(under_lock.load(), 0) << "buffers destroyed while the engine's lock was held";
  EXPECT_EQ(engine_->ListSessions().size(), 0);
  // FreeBuffer too.
  const std::string s2 = NewSession();
  auto buf = engine_->AllocateBuffer(s2, 4096);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE(engine_->FreeBuffer(s2, buf->buffer_id).ok());
  EXPECT_EQ(under_lock.load(), 0);
}

TEST_F(EngineTest, GpuDeviceWithoutAGpuAllocatorIsRefusedSayingWhyAndChangesNothing) {
  // The convenience constructor: host memory only, no reason recorded.
  std::string s = NewSession();
  auto r = engine_->AllocateBuffer(s, 4096, "cuda:0");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(r.status().message()),
            "device cuda:0: this daemon has no usable CUDA allocator: none was configured");
  // With the reason the daemon recorded at start.
  Backends b;
  b.allocators.push_back(MakeMemfdAllocator());
  b.executors.push_back(std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 1}));
  b.unusable_allocators["cuda"] = "built without CUDA";
  Start(EngineOptions{}, std::move(b));
  s = NewSession();
  r = engine_->AllocateBuffer(s, 4096, "GPU-ab12");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(r.status().message()),
            "device cuda:GPU-ab12: this daemon has no usable CUDA allocator: built without CUDA");
  r = engine_->AllocateBuffer(s, 4096, "gpu7");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("accepted: "), absl::string_view::npos) << r.status();
  // A malformed device is refused before the size is looked at.
  EXPECT_EQ(engine_->AllocateBuffer(s, 0, "cuda:x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->AllocateBuffer("s-nope", 4096, "cuda:0").status().code(),
            absl::StatusCode::kNotFound);
  auto sessions = engine_->ListSessions();
  ASSERT_EQ(sessions.size(), 1);
  EXPECT_EQ(sessions[0].buffers, 0);
  EXPECT_EQ(sessions[0].buffers_by_device.size(), 0);
  EXPECT_EQ(engine_->GetStats().buffers, 0);
}

TEST_F(EngineTest, OpsRunOnTheExecutorOfTheirBuffersKindWithTheirDevices) {
  FakeGpuExecutor* gpu = nullptr;
  Start(EngineOptions{}, HostAndFakeGpu(&gpu));
  auto members = FormMesh("gpu", 2);
  std::vector<std::string> gpu_bufs, host_bufs;
  for (int i = 0; i < 2; ++i) {
    gpu_bufs.push_back(Buffer(members[i].first, 8, i + 1.0f, absl::StrCat("cuda:", 1 - i)));
    host_bufs.push_back(Buffer(members[i].first, 8, i + 1.0f));
  }
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, gpu_bufs[i], 8),
                                false, done[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(done[i].Get().status.ok()) << done[i].Get().status;
    EXPECT_EQ(Data(members[i].first, gpu_bufs[i])[7], 3.0f);
  }
  EXPECT_EQ(gpu->runs(), 1);
  EXPECT_EQ(gpu->devices(), (std::vector<int>{1, 0}));
  // Host buffers: the CPU executor.
  std::vector<Result<OpOutcome>> host(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, host_bufs[i], 8),
                                false, host[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(host[i].Get().status.ok()) << host[i].Get().status;
    EXPECT_EQ(Data(members[i].first, host_bufs[i])[0], 3.0f);
  }
  EXPECT_EQ(gpu->runs(), 1);
}

TEST_F(EngineTest, AMembersBufferGoesToOtherMembersOfItsUserOnly) {
  auto mesh = FormMesh("peers", 3);
  const std::string& mesh_id = mesh[0].second;
  const std::string b1 = Buffer(mesh[1].first, 16, 1.0f);
  auto got = engine_->GetPeerBuffer(mesh[0].first, mesh_id, 1, b1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->data(), (*engine_->GetBuffer(mesh[1].first, b1))->data());
  // Not another member, not its buffer, not a member at all.
  EXPECT_EQ(engine_->GetPeerBuffer(mesh[1].first, mesh_id, 1, b1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->GetPeerBuffer(mesh[0].first, mesh_id, 3, b1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->GetPeerBuffer(mesh[0].first, mesh_id, 2, b1).status().code(),
            absl::StatusCode::kNotFound);
  const std::string outsider = NewSession("outsider");
  EXPECT_EQ(engine_->GetPeerBuffer(outsider, mesh_id, 1, b1).status().code(),
            absl::StatusCode::kNotFound);

  // A member of another user gets nothing of this one's, nor this one of its.
  std::vector<std::string> sessions;
  for (int uid : {1000, 1001}) {
    auto s = engine_->CreateSession(absl::StrCat("uid", uid));
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(engine_->AttachSession(s->session_id, s->attach_token, 2000 + uid, uid).ok());
    sessions.push_back(s->session_id);
  }
  auto joined = JoinAll(*engine_, sessions, "two-users", "");
  ASSERT_TRUE(joined[0].ok()) << joined[0].status();
  const std::string mixed = joined[0]->mesh.mesh_id;
  const std::string theirs = Buffer(sessions[1], 16, 2.0f);
  auto refused = engine_->GetPeerBuffer(sessions[0], mixed, 1, theirs);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "another user")) << refused.status();

  // A broken mesh gives nothing.
  ASSERT_TRUE(engine_->CloseSession(mesh[2].first, "killed").ok());
  EXPECT_EQ(engine_->GetPeerBuffer(mesh[0].first, mesh_id, 1, b1).status().code(),
            absl::StatusCode::kAborted);
}

TEST_F(EngineTest, WithoutMemberSideOpsNoMemberGetsAnothersBuffer) {
  Start(EngineOptions{.member_op_bytes = 0});
  auto mesh = FormMesh("no-segment", 2);
  const std::string b1 = Buffer(mesh[1].first, 16, 1.0f);
  EXPECT_EQ(engine_->GetPeerBuffer(mesh[0].first, mesh[0].second, 1, b1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(EngineTest, MembersOnDifferentKindsOfMemoryFailEveryMemberAndTheMeshGoesOn) {
  FakeGpuExecutor* gpu = nullptr;
  Start(EngineOptions{}, HostAndFakeGpu(&gpu));
  auto members = FormMesh("mix", 4);
  std::vector<std::string> bufs, host_bufs;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(Buffer(members[i].first, 8, 1.0f, i == 1 ? "cuda:0" : i == 3 ? "cuda:1" : ""));
    host_bufs.push_back(Buffer(members[i].first, 8, 1.0f));
  }
  std::vector<Result<OpOutcome>> done(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, bufs[i], 8), false,
                                done[i].Callback()).ok());
  }
  for (int i = 0; i < 4; ++i) {
    const OpOutcome& o = done[i].Get();
    ASSERT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
    EXPECT_EQ(std::string(o.status.message()),
              absl::StrCat("op 0 on mesh 'mix' mixes kinds of memory across members: member 1 has "
                           "cuda buffers on ", FakeGpuBuffer::FakeDevice(0),
                           " while member 3 has cuda buffers on ", FakeGpuBuffer::FakeDevice(1),
                           " while members 0,2 have memfd buffers on cpu; every member's buffers "
                           "of one op must be the same kind of memory (cuda or memfd)"));
    EXPECT_EQ(Data(members[i].first, bufs[i])[0], 1.0f) << "a failed op wrote data";
  }
  EXPECT_EQ(gpu->runs(), 0);
  EXPECT_EQ(engine_->GetStats().ops_failed, 1);
  std::vector<Result<OpOutcome>> next(4);
  for (int i = 0; i < 4; ++i) {
    auto r = engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, host_bufs[i], 8),
                             false, next[i].Callback());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->sequence, 1);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(next[i].Get().status.ok()) << next[i].Get().status;
    EXPECT_EQ(Data(members[i].first, host_bufs[i])[7], 4.0f);
  }
}

TEST_F(EngineTest, BuffersWithoutAUsableExecutorFailEveryMemberSayingWhy) {
  Start(EngineOptions{}, HostAndFakeGpu(nullptr));  // a GPU allocator, no GPU executor
  auto members = FormMesh("noexec", 2);
  std::vector<std::string> bufs, host_bufs;
  for (int i = 0; i < 2; ++i) {
    bufs.push_back(Buffer(members[i].first, 8, 1.0f, "cuda:0"));
    host_bufs.push_back(Buffer(members[i].first, 8, 1.0f));
  }
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPmax, bufs[i], 8), false,
                                done[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) {
    const OpOutcome& o = done[i].Get();
    ASSERT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
    EXPECT_EQ(std::string(o.status.message()),
              "op 0 on mesh 'noexec' runs on cuda buffers, but this daemon has no usable CUDA "
              "executor: no CUDA driver: libcuda.so.1 not found");
  }
  std::vector<Result<OpOutcome>> next(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].first, Op(members[i].second, OpKind::kPsum, host_bufs[i], 8),
                                false, next[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(next[i].Get().status.ok()) << next[i].Get().status;
}

TEST_F(EngineTest, InputAndOutputOnDifferentDevicesAreRefusedAtSubmit) {
  Start(EngineOptions{}, HostAndFakeGpu(nullptr));
  auto members = FormMesh("split", 1);
  const auto& [s, mesh] = members[0];
  std::string host = Buffer(s, 8, 1.0f);
  std::string gpu0 = Buffer(s, 8, 1.0f, "cuda:0");
  std::string gpu1 = Buffer(s, 8, 1.0f, "cuda:1");
  auto op = Op(mesh, OpKind::kPsum, host, 8);
  op.output = BufferRegion{gpu0};
  auto r = engine_->Submit(s, op, false, [](const OpOutcome&) { ADD_FAILURE() << "ran"; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            absl::StrCat("psum: the input buffer '", host, "' is memfd memory on cpu but the output "
                         "buffer '", gpu0, "' is cuda memory on ", FakeGpuBuffer::FakeDevice(0),
                         "; an op's input and output must be on the same device"));
  op = Op(mesh, OpKind::kPsum, gpu0, 8);
  op.output = BufferRegion{gpu1};
  EXPECT_EQ(engine_->Submit(s, op, false, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing changed: the next op is still op 0.
  Result<OpOutcome> done;
  auto ok = engine_->Submit(s, Op(mesh, OpKind::kPsum, host, 8), false, done.Callback());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->sequence, 0);
  EXPECT_TRUE(done.Get().status.ok());
}

// Stream-ordered submission (StreamOrder): each member's ready and done
// words in a host buffer of its session, written here by hand as a CUDA
// stream would write them.
class StreamSyncTest : public EngineTest {
 protected:
  struct Member {
    std::string session, mesh, data, words;
  };
  std::vector<Member> Form(const std::string& name, int n, int64_t op_timeout_ms = 0) {
    std::vector<Member> out;
    for (auto& [s, m] : FormMesh(name, n, op_timeout_ms)) {
      Member member{s, m, Buffer(s, 4, 1.0f), ""};
      auto info = engine_->AllocateBuffer(s, 64, "");
      EXPECT_TRUE(info.ok()) << info.status();
      member.words = info->buffer_id;
      out.push_back(member);
    }
    return out;
  }
  std::atomic_ref<uint64_t> Word(const Member& m, int index) {
    auto buf = engine_->GetBuffer(m.session, m.words);
    return std::atomic_ref<uint64_t>(static_cast<uint64_t*>((*buf)->data())[index]);
  }
  // The member's psum of its data, ordered by its words 0 (ready) and 1 (done).
  OpRequest SyncedPsum(const Member& m, uint64_t value) {
    OpRequest op = Op(m.mesh, OpKind::kPsum, m.data, 4);
    op.stream_sync = StreamOrder{BufferRegion{m.words, 0}, BufferRegion{m.words, 8}, value};
    return op;
  }
};

TEST_F(StreamSyncTest, TheOpWaitsForEveryStreamAndThenReleasesEveryStream) {
  auto members = Form("ss", 2);
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].session, SyncedPsum(members[i], 1), false,
                                done[i].Callback()).ok());
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done[0].Done()) << "the op ran before any stream was ready";
  Word(members[0], 0).store(1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(done[0].Done()) << "the op ran before member 1's stream was ready";
  EXPECT_EQ(Data(members[0].session, members[0].data)[0], 1.0f) << "an input was read early";
  EXPECT_EQ(Word(members[0], 1).load(), 0u);
  const int64_t last_ready_ns = fastq::MonotonicNs();
  Word(members[1], 0).store(7);  // any value >= 1 will do
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(done[i].Get().status.ok()) << done[i].Get().status;
    EXPECT_EQ(Data(members[i].session, members[i].data)[0], 2.0f);
    EXPECT_EQ(Word(members[i], 1).load(), 1u) << "member " << i << "'s stream was not released";
    // Its stages: matched at the second submission, its inputs ready only
    // once the last stream got there (200 ms later), then run.
    const OpStamps& t = done[i].Get().stamps;
    EXPECT_GT(t.matched_ns, 0);
    EXPECT_LT(t.matched_ns, last_ready_ns - 150'000'000) << "matched only when it ran";
    EXPECT_GE(t.ready_ns, last_ready_ns);
    EXPECT_GE(t.started_ns, t.ready_ns);
    EXPECT_GE(t.executed_ns, t.started_ns);
    EXPECT_EQ(t.device.launched_ns, 0) << "a CPU op launches nothing";
  }
}

TEST_F(StreamSyncTest, AStreamThatNeverArrivesIsNamedAtTheDeadlineAndTheMeshGoesOn) {
  auto members = Form("late", 2, /*op_timeout_ms=*/300);
  Word(members[0], 0).store(1);
  std::vector<Result<OpOutcome>> done(2);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].session, SyncedPsum(members[i], 1), false,
                                done[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) {
    const absl::Status& st = done[i].Get().status;
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_NE(st.message().find("the streams of these members did not reach the op"),
              std::string::npos) << st;
    EXPECT_NE(st.message().find("1 (1) pid 1000"), std::string::npos) << st;
    EXPECT_NE(st.message().find("(ready word 0, awaited 1)"), std::string::npos) << st;
    EXPECT_EQ(st.message().find("0 (0) pid"), std::string::npos) << "member 0 was ready: " << st;
    EXPECT_EQ(Word(members[i], 1).load(), 1u) << "a failed op must release the stream too";
    EXPECT_EQ(Data(members[i].session, members[i].data)[0], 1.0f) << "a failed op wrote data";
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The members still agree on the sequence: the next op runs.
  std::vector<Result<OpOutcome>> next(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].session, Op(members[i].mesh, OpKind::kPsum,
                                                       members[i].data, 4),
                                false, next[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(next[i].Get().status.ok()) << next[i].Get().status;
}

TEST_F(StreamSyncTest, OpsWaitingForStreamsHoldNoRunnerThread) {
  EngineOptions options;
  options.runner_threads = 1;
  options.inline_op_bytes = 0;  // every op runs on the one runner
  Start(options);
  // Three meshes whose ops wait for streams that have not arrived.
  std::vector<std::vector<Member>> waiting;
  std::vector<std::vector<Result<OpOutcome>>> waiting_done(3);
  for (int k = 0; k < 3; ++k) {
    waiting.push_back(Form(absl::StrCat("w", k), 1));
    waiting_done[k] = std::vector<Result<OpOutcome>>(1);
    ASSERT_TRUE(engine_->Submit(waiting[k][0].session, SyncedPsum(waiting[k][0], 1), false,
                                waiting_done[k][0].Callback()).ok());
  }
  // An op without streams still runs at once.
  auto plain = Form("plain", 2);
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(plain[i].session, Op(plain[i].mesh, OpKind::kPsum, plain[i].data, 4),
                                false, done[i].Callback()).ok());
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(done[i].Get().status.ok()) << done[i].Get().status;
  for (int k = 0; k < 3; ++k) EXPECT_FALSE(waiting_done[k][0].Done());
  // Then the streams arrive, and those ops run too.
  for (int k = 0; k < 3; ++k) Word(waiting[k][0], 0).store(1);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(waiting_done[k][0].Get().status.ok()) << waiting_done[k][0].Get().status;
    EXPECT_EQ(Word(waiting[k][0], 1).load(), 1u);
  }
}

TEST_F(StreamSyncTest, AMemberThatDiesWhileOthersWaitForItsStreamAbortsThemAtOnce) {
  auto members = Form("dies", 2, /*op_timeout_ms=*/60000);
  Word(members[0], 0).store(1);
  std::vector<Result<OpOutcome>> done(2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(engine_->Submit(members[i].session, SyncedPsum(members[i], 1), false,
                                done[i].Callback()).ok());
  }
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(engine_->CloseSession(members[1].session, "killed").ok());
  const absl::Status& st = done[0].Get().status;
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_NE(st.message().find("killed"), std::string::npos) << st;
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5)) << "waited for the op deadline";
  EXPECT_EQ(Word(members[0], 1).load(), 1u);
  // The closed session's own op fails too (its callback still runs).
  EXPECT_FALSE(done[1].Get().status.ok());
}

TEST_F(StreamSyncTest, ARefusedOpReleasesTheStreamAndBadWordsAreRefused) {
  auto members = Form("bad", 1);
  const Member& m = members[0];
  // A valid stream_sync on an op refused for another reason: released.
  OpRequest op = SyncedPsum(m, 3);
  op.input.buffer_id = "no-such-buffer";
  auto r = engine_->Submit(m.session, op, false, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_EQ(Word(m, 1).load(), 3u);
  // The words never go down.
  Word(m, 1).store(10);
  Word(m, 0).store(10);
  Result<OpOutcome> ok;
  ASSERT_TRUE(engine_->Submit(m.session, SyncedPsum(m, 4), false, ok.Callback()).ok());
  EXPECT_TRUE(ok.Get().status.ok()) << ok.Get().status;
  EXPECT_EQ(Word(m, 1).load(), 10u);

  struct Bad {
    std::function<void(StreamOrder*)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {[](StreamOrder* s) { s->value = 0; }, absl::StatusCode::kInvalidArgument,
       "value must be > 0"},
      {[](StreamOrder* s) { s->done.offset = 0; },
       absl::StatusCode::kInvalidArgument, "same word"},
      {[](StreamOrder* s) { s->done.offset = 4; },
       absl::StatusCode::kInvalidArgument, "not a multiple of 8"},
      {[](StreamOrder* s) { s->done.offset = 1 << 20; },
       absl::StatusCode::kOutOfRange, "not inside buffer"},
      {[](StreamOrder* s) { s->done.buffer_id = "nope"; },
       absl::StatusCode::kNotFound, "stream_sync done buffer 'nope' not found"},
      {[](StreamOrder* s) { s->done.size_bytes = 16; },
       absl::StatusCode::kInvalidArgument, "a stream_sync word is 8 bytes"},
  };
  for (const Bad& b : bad) {
    Word(m, 0).store(0);
    Word(m, 1).store(0);
    OpRequest op = SyncedPsum(m, 5);
    b.edit(&*op.stream_sync);
    auto refused = engine_->Submit(m.session, op, false, nullptr);
    EXPECT_EQ(refused.status().code(), b.code) << refused.status();
    EXPECT_NE(refused.status().message().find(b.message), std::string::npos) << refused.status();
    EXPECT_EQ(Word(m, 0).load(), 0u);
    EXPECT_EQ(Word(m, 1).load(), 0u) << "invalid words were written: " << refused.status();
  }
  // Only the ready word is wrong: the done word is still raised, so the
  // client's stream goes on.
  Word(m, 1).store(0);
  OpRequest bad_ready = SyncedPsum(m, 6);
  bad_ready.stream_sync->ready.offset = 4;
  EXPECT_EQ(engine_->Submit(m.session, bad_ready, false, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Word(m, 1).load(), 6u);
  // The session's mesh still works after every refusal.
  Result<OpOutcome> after;
  Word(m, 0).store(100);
  ASSERT_TRUE(engine_->Submit(m.session, SyncedPsum(m, 100), false, after.Callback()).ok());
  EXPECT_TRUE(after.Get().status.ok()) << after.Get().status;
}

}  // namespace
}  // namespace collectived
