// The engine's meshes across hosts (engine_cluster.cc) in one process: the
// cluster's registry and the other hosts are a FakeRendezvous the test
// answers (tests/fakes/fake_rendezvous.h), so registration, forming, ops on
// the mesh's connections, and breaks and questions from other hosts are
// checked without daemons or sockets (the multi-daemon tests in
// tests/cluster/ run the same over the real rendezvous).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/engine.h"
#include "exec/cpu_executor.h"
#include "tests/fakes/fake_rendezvous.h"
#include "tests/harness/callback_result.h"

namespace collectived {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

template <typename T>
using Result = CallbackResult<T>;
using JoinResult = Result<absl::StatusOr<Joined>>;

class EngineAcrossHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.rendezvous = &rendezvous_;
    engine_ = std::make_unique<Engine>(
        options,
        std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 2, .chunk_bytes = 256}));
  }
  void TearDown() override { engine_.reset(); }

  std::string NewSession(const std::string& name) {
    auto s = engine_->CreateSession(name);
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(engine_->AttachSession(s->session_id, s->attach_token, 1000, 0).ok());
    return s->session_id;
  }

  // Member `index` of mesh "x" (one axis of `size`) joins on this host.
  void Join(const std::string& session, int index, int size, JoinResult& result,
            int64_t timeout_ms = 10000) {
    JoinRequest req;
    req.session_id = session;
    req.mesh_name = "x";
    req.axes.push_back(AxisRequest{"i", size});
    req.coordinate.push_back(index);
    req.timeout_ms = timeout_ms;
    engine_->JoinMesh(req, result.Callback());
  }

  FakeRendezvous::Registration TakeRegistration() {
    auto r = rendezvous_.registrations.Take(kWait);
    EXPECT_TRUE(r.has_value()) << "the engine never registered a join";
    return r.has_value() ? std::move(*r) : FakeRendezvous::Registration{};
  }
  FakeRendezvous::Formation TakeFormation() {
    auto f = rendezvous_.formations.Take(kWait);
    EXPECT_TRUE(f.has_value()) << "the engine never asked the mesh to form";
    return f.has_value() ? std::move(*f) : FakeRendezvous::Formation{};
  }

  // The registry's answer to a formation: members on `member_host`, this
  // host ("h1") rank `self` of `hosts`; the connections are a fake whose
  // state is returned.
  std::shared_ptr<FakeCrossHostMesh::State> Formed(FakeRendezvous::Formation& f,
                                                   std::vector<std::string> member_host,
                                                   std::vector<std::string> hosts, int self) {
    auto mesh = std::make_unique<FakeCrossHostMesh>();
    auto state = mesh->state();
    FormedMesh formed;
    formed.topology.generation = f.generation;
    formed.topology.member_host = std::move(member_host);
    formed.topology.hosts = hosts;
    formed.topology.addresses = hosts;
    formed.topology.self = self;
    formed.mesh = std::move(mesh);
    f.done(std::move(formed));
    return state;
  }

  // Members 0 and 1 on this host, 2 and 3 on h2: registered at generation 7
  // and formed. Returns the sessions and the mesh id.
  std::shared_ptr<FakeCrossHostMesh::State> FormTwoOfFour(std::vector<std::string>& sessions,
                                                          std::string& mesh_id) {
    sessions = {NewSession("a"), NewSession("b")};
    JoinResult j0, j1;
    Join(sessions[0], 0, 4, j0);
    Join(sessions[1], 1, 4, j1);
    for (int i = 0; i < 2; ++i) TakeRegistration().done(7);
    FakeRendezvous::Formation f = TakeFormation();
    auto state = Formed(f, {"h1", "h1", "h2", "h2"}, {"h1", "h2"}, 0);
    EXPECT_TRUE(j0.Get().ok()) << j0.Get().status();
    EXPECT_TRUE(j1.Get().ok()) << j1.Get().status();
    mesh_id = j0.Get().ok() ? j0.Get()->mesh.mesh_id : "";
    return state;
  }

  std::string Buffer(const std::string& session, int count, float value) {
    auto info = engine_->AllocateBuffer(session, count * 4, "");
    EXPECT_TRUE(info.ok()) << info.status();
    float* p = static_cast<float*>((*engine_->GetBuffer(session, info->buffer_id))->data());
    for (int i = 0; i < count; ++i) p[i] = value;
    return info->buffer_id;
  }

  // Both local members submit a psum (of `count0` and `count1` floats, in
  // b0 and b1); the op the connections were asked to start, once both had
  // (not before).
  std::optional<FakeCrossHostMesh::Started> SubmitBoth(
      const std::vector<std::string>& s, const std::string& mesh, FakeCrossHostMesh::State& cross,
      const std::string& b0, int count0, const std::string& b1, int count1, Result<OpOutcome>& d0,
      Result<OpOutcome>& d1) {
    EXPECT_TRUE(engine_->Submit(s[0], Psum(mesh, b0, count0), false, d0.Callback()).ok());
    // One member's op is not enough: the connections wait for every local one.
    EXPECT_FALSE(cross.starts.Take(absl::Milliseconds(20)).has_value());
    EXPECT_TRUE(engine_->Submit(s[1], Psum(mesh, b1, count1), false, d1.Callback()).ok());
    auto started = cross.starts.Take(kWait);
    EXPECT_TRUE(started.has_value()) << "the op never started on the connections";
    return started;
  }

  static OpRequest Psum(const std::string& mesh, const std::string& buffer, int count) {
    OpRequest op;
    op.mesh_id = mesh;
    op.kind = OpKind::kPsum;
    op.dtype = DType::kF32;
    op.shape.push_back(count);
    op.input.buffer_id = buffer;
    return op;
  }

  FakeRendezvous rendezvous_{"h1"};
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineAcrossHostsTest, AMeshFormsWithTheRegistrysGenerationAndPlacement) {
  const std::string a = NewSession("a"), b = NewSession("b");
  JoinResult j0, j1;
  Join(a, 0, 4, j0);
  Join(b, 1, 4, j1);
  FakeRendezvous::Registration r0 = TakeRegistration();
  FakeRendezvous::Registration r1 = TakeRegistration();
  EXPECT_EQ(r0.info.axes, "i=4");
  EXPECT_EQ(r0.info.members, 4);
  EXPECT_EQ(r0.info.key, r1.info.key);
  EXPECT_EQ(r0.index + r1.index, 1);
  // Nothing forms before the registry answered.
  EXPECT_FALSE(rendezvous_.formations.Take(absl::Milliseconds(50)).has_value());
  r0.done(7);
  r1.done(7);
  FakeRendezvous::Formation f = TakeFormation();
  EXPECT_EQ(f.key, r0.info.key);
  EXPECT_EQ(f.generation, 7);
  EXPECT_FALSE(j0.Done());
  Formed(f, {"h1", "h1", "h2", "h2"}, {"h1", "h2"}, 0);
  ASSERT_TRUE(j0.Get().ok()) << j0.Get().status();
  ASSERT_TRUE(j1.Get().ok()) << j1.Get().status();
  const MeshView& mesh = j1.Get()->mesh;
  EXPECT_EQ(mesh.state, "READY");
  EXPECT_EQ(mesh.generation, 7);
  ASSERT_EQ(mesh.members.size(), 4);
  EXPECT_EQ(mesh.members[0].host, "h1");
  EXPECT_EQ(mesh.members[3].host, "h2");
  // Ops of a mesh across hosts run through the daemon: no member-side path.
  EXPECT_EQ(mesh.member_op_bytes, 0);
  EXPECT_EQ(j1.Get()->self.index, 1);
}

TEST_F(EngineAcrossHostsTest, AnOpRunsOnTheMeshsConnectionsWithThisHostsMembersOnly) {
  std::vector<std::string> s;
  std::string mesh;
  auto cross = FormTwoOfFour(s, mesh);
  const std::string b0 = Buffer(s[0], 4, 1.0f), b1 = Buffer(s[1], 4, 2.0f);
  Result<OpOutcome> d0, d1;
  auto started = SubmitBoth(s, mesh, *cross, b0, 4, b1, 4, d0, d1);
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->sequence, 0);
  EXPECT_TRUE(started->verdict.ok()) << started->verdict;
  EXPECT_EQ(started->plan->kind, OpKind::kPsum);
  ASSERT_EQ(started->io.size(), 4u);
  EXPECT_NE(started->io[0].in, nullptr);
  EXPECT_NE(started->io[1].in, nullptr);
  EXPECT_EQ(started->io[2].in, nullptr);  // members on h2
  EXPECT_EQ(started->io[3].in, nullptr);
  EXPECT_EQ(*reinterpret_cast<const float*>(started->io[1].in), 2.0f);
  // The other hosts' share, as the connections would write it.
  for (int m = 0; m < 2; ++m) {
    for (int e = 0; e < 4; ++e) reinterpret_cast<float*>(started->io[m].out)[e] = 10.0f;
  }
  EXPECT_FALSE(d0.Done());
  started->done(absl::OkStatus(), false, Traffic{});
  ASSERT_TRUE(d0.Get().status.ok()) << d0.Get().status;
  ASSERT_TRUE(d1.Get().status.ok()) << d1.Get().status;
  EXPECT_EQ(d1.Get().sequence, 0);
  float* p = static_cast<float*>((*engine_->GetBuffer(s[1], b1))->data());
  EXPECT_EQ(p[3], 10.0f);
}

TEST_F(EngineAcrossHostsTest, AMismatchHereIsSentAsTheVerdictForEveryHostToFail) {
  std::vector<std::string> s;
  std::string mesh;
  auto cross = FormTwoOfFour(s, mesh);
  Result<OpOutcome> d0, d1;
  auto started =
      SubmitBoth(s, mesh, *cross, Buffer(s[0], 4, 1.0f), 4, Buffer(s[1], 8, 2.0f), 8, d0, d1);
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->verdict.code(), absl::StatusCode::kFailedPrecondition);
  started->done(started->verdict, false, Traffic{});
  EXPECT_EQ(d0.Get().status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d1.Get().status.code(), absl::StatusCode::kFailedPrecondition);
  // Refused alike everywhere, not broken: the next op runs.
  auto info = engine_->DescribeMesh(mesh, "");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, "READY");
}

TEST_F(EngineAcrossHostsTest, AnOpThatBrokeTheConnectionsBreaksTheMeshAndTellsTheCluster) {
  std::vector<std::string> s;
  std::string mesh;
  auto cross = FormTwoOfFour(s, mesh);
  const std::string b0 = Buffer(s[0], 4, 1.0f);
  Result<OpOutcome> d0, d1;
  auto started = SubmitBoth(s, mesh, *cross, b0, 4, Buffer(s[1], 4, 2.0f), 4, d0, d1);
  ASSERT_TRUE(started.has_value());
  started->done(absl::AbortedError("host h2 is gone: its connection closed"), true, Traffic{});
  EXPECT_EQ(d0.Get().status.code(), absl::StatusCode::kAborted);
  EXPECT_NE(d0.Get().status.message().find("host h2 is gone"), std::string::npos)
      << d0.Get().status;
  auto info = engine_->DescribeMesh(mesh, "");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, "BROKEN");
  // The next op fails at once, naming the cause.
  Result<OpOutcome> again;
  auto r = engine_->Submit(s[0], Psum(mesh, b0, 4), false, again.Callback());
  const absl::Status st = r.ok() ? again.Get().status : r.status();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_NE(st.message().find("host h2 is gone"), std::string::npos) << st;
  // The cluster learns that the mesh broke here.
  auto left = rendezvous_.departures.Take(kWait);
  ASSERT_TRUE(left.has_value());
  EXPECT_TRUE(left->broken);
  EXPECT_EQ(left->generation, 7);
}

TEST_F(EngineAcrossHostsTest, ABreakFromAnotherHostBreaksTheMeshWithItsReason) {
  std::vector<std::string> s;
  std::string mesh;
  auto cross = FormTwoOfFour(s, mesh);
  auto observer = cross->Observer(kWait);
  ASSERT_TRUE(observer.has_value());
  observer->on_broken(absl::AbortedError("member 3 (3) pid 77 host h2 'c' is gone"));
  auto info = engine_->DescribeMesh(mesh, "");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, "BROKEN");
  const std::string b0 = Buffer(s[0], 4, 1.0f);
  Result<OpOutcome> d0;
  auto r = engine_->Submit(s[0], Psum(mesh, b0, 4), false, d0.Callback());
  const absl::Status st = r.ok() ? d0.Get().status : r.status();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_NE(st.message().find("member 3 (3) pid 77 host h2 'c' is gone"), std::string::npos) << st;
}

TEST_F(EngineAcrossHostsTest, AnotherHostsQuestionNamesTheMembersThisHostWaitsFor) {
  std::vector<std::string> s;
  std::string mesh;
  auto cross = FormTwoOfFour(s, mesh);
  auto observer = cross->Observer(kWait);
  ASSERT_TRUE(observer.has_value());
  EXPECT_NE(observer->on_query(0).find("1 (1) pid 1000 host h1 'b'"), std::string::npos)
      << observer->on_query(0);
  const std::string b0 = Buffer(s[0], 4, 1.0f);
  Result<OpOutcome> d0;
  ASSERT_TRUE(engine_->Submit(s[0], Psum(mesh, b0, 4), false, d0.Callback()).ok());
  const std::string missing = observer->on_query(0);
  EXPECT_EQ(missing.find("0 (0)"), std::string::npos) << missing;
  EXPECT_NE(missing.find("1 (1)"), std::string::npos) << missing;
  // The op never started: it fails when the daemon stops.
  engine_.reset();
  EXPECT_EQ(d0.Get().status.code(), absl::StatusCode::kUnavailable) << d0.Get().status;
}

TEST_F(EngineAcrossHostsTest, TheRegistrysRefusalFailsThatJoinerWithItsAnswer) {
  const std::string a = NewSession("a");
  JoinResult j0;
  Join(a, 0, 2, j0);
  TakeRegistration().done(absl::AlreadyExistsError("coordinate (0) is taken on host h2"));
  ASSERT_EQ(j0.Get().status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(j0.Get().status().message(), "coordinate (0) is taken on host h2");
  EXPECT_EQ(engine_->ListMeshes().size(), 0);
}

TEST_F(EngineAcrossHostsTest, AnUnreachableRegistryIsAskedAgainWhileTheJoinerWaits) {
  const std::string a = NewSession("a");
  JoinResult j0;
  Join(a, 0, 2, j0);
  const absl::Time first = absl::Now();
  TakeRegistration().done(absl::UnavailableError("no coordinator answers"));
  FakeRendezvous::Registration again = TakeRegistration();
  EXPECT_GE(absl::Now() - first, absl::Milliseconds(200));  // kRegisterRetry, 250 ms
  EXPECT_EQ(again.index, 0);
  EXPECT_FALSE(j0.Done());
  again.done(3);
  FakeRendezvous::Formation f = TakeFormation();
  EXPECT_EQ(f.generation, 3);
  Formed(f, {"h1", "h2"}, {"h1", "h2"}, 0);
  ASSERT_TRUE(j0.Get().ok()) << j0.Get().status();
  EXPECT_EQ(j0.Get()->mesh.generation, 3);
}

TEST_F(EngineAcrossHostsTest, ACoordinateTheRegistryPlacedElsewhereFailsItsJoinerHere) {
  const std::string a = NewSession("a"), b = NewSession("b");
  JoinResult j0, j1;
  Join(a, 0, 3, j0);
  Join(b, 1, 3, j1);
  // Member 0's registration stands; member 1's answer is still on its way
  // when the registry fills the mesh with member 1 on h2.
  FakeRendezvous::Registration r0 = TakeRegistration();
  FakeRendezvous::Registration r1 = TakeRegistration();
  (r0.index == 0 ? r0 : r1).done(5);
  FakeRendezvous::Formation f = TakeFormation();
  Formed(f, {"h1", "h2", "h2"}, {"h1", "h2"}, 0);
  ASSERT_TRUE(j0.Get().ok()) << j0.Get().status();
  ASSERT_EQ(j1.Get().status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(j1.Get().status().message(),
            "coordinate (1) of mesh 'x' is taken by a member on host h2");
  // The late answer for member 1 gives its registration back.
  (r0.index == 0 ? r1 : r0).done(5);
  auto left = rendezvous_.departures.Take(kWait);
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(left->indices, std::vector<int>{1});
  EXPECT_FALSE(left->broken);
}

TEST_F(EngineAcrossHostsTest, AMeshNotFilledInTimeFailsTheJoinersPastTheirDeadline) {
  const std::string a = NewSession("a"), b = NewSession("b");
  JoinResult j0, j1;
  Join(a, 0, 3, j0, /*timeout_ms=*/100);
  Join(b, 1, 3, j1, /*timeout_ms=*/20000);
  for (int i = 0; i < 2; ++i) TakeRegistration().done(4);
  FakeRendezvous::Formation f = TakeFormation();
  absl::SleepFor(absl::Milliseconds(150));  // past member 0's deadline only
  f.done(absl::DeadlineExceededError("missing coordinates: (2)"));
  ASSERT_EQ(j0.Get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(j0.Get().status().message(), "missing coordinates: (2)");
  // Member 1 waits on: the mesh is asked to form again, by its deadline.
  FakeRendezvous::Formation next = TakeFormation();
  EXPECT_EQ(next.generation, 4);
  EXPECT_GT(next.deadline, absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(j1.Done());
  // The cluster is told that member 0 left the forming mesh.
  auto left = rendezvous_.departures.Take(kWait);
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(left->indices, std::vector<int>{0});
  EXPECT_FALSE(left->broken);
  // A registry that formed the mesh before it learned it: member 0, placed
  // here, is gone, so the mesh cannot run, and the cluster is told it broke
  // here.
  Formed(next, {"h1", "h1", "h2"}, {"h1", "h2"}, 0);
  ASSERT_EQ(j1.Get().status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(j1.Get().status().message().find("members 0 on host h1 left before the mesh formed"),
            std::string::npos)
      << j1.Get().status();
  auto broke = rendezvous_.departures.Take(kWait);
  ASSERT_TRUE(broke.has_value());
  EXPECT_TRUE(broke->broken);
}

TEST_F(EngineAcrossHostsTest, AMeshWhoseJoinersLeftDropsTheConnectionsItIsGiven) {
  const std::string a = NewSession("a");
  JoinResult j0;
  Join(a, 0, 2, j0);
  TakeRegistration().done(9);
  FakeRendezvous::Formation f = TakeFormation();
  ASSERT_TRUE(engine_->CloseSession(a, "the test closed it").ok());
  EXPECT_FALSE(j0.Get().ok());
  // The forming wait is cancelled, and connections made anyway are aborted.
  EXPECT_TRUE(f.cancel != nullptr && f.cancel->load());
  auto cross = Formed(f, {"h1", "h2"}, {"h1", "h2"}, 0);
  for (int i = 0; i < 2000 && !cross->destroyed; ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(cross->destroyed);
  ASSERT_FALSE(cross->Aborts().empty());
  EXPECT_NE(cross->Aborts().front().message().find("did not form on host h1"), std::string::npos)
      << cross->Aborts().front();
}

}  // namespace
}  // namespace collectived
