// Meshes across hosts: real daemons on loopback form a cluster (one serves
// the coordinator and is a host too), and meshes whose members joined on
// different daemons run collectives through Gloo between the daemons. Each
// member is its own SDK client (its own session) of the daemon of its host.
//
// Checked: results across 2 and 3 daemons equal what one daemon computes
// (exact values), Describe names each member's host, ops that differ across
// hosts fail alike and the mesh goes on, a member closed on one host and a
// daemon killed are seen by the members on the other hosts (ABORTED naming
// the host, timed and printed), the coordinator's death leaves running
// meshes working, and a mesh whose members are all on one daemon works
// without a coordinator.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <atomic>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectived/client.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "tests/harness/cluster.h"
#include "tests/harness/eventually.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(30);

// A cluster of `hosts` daemons on loopback (tests/harness/cluster.h).
class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(int hosts) {
    auto daemons = StartLoopbackCluster(hosts, {}, kPatience);
    if (!daemons.ok()) return daemons.status();
    auto c = std::unique_ptr<Cluster>(new Cluster);
    c->daemons_ = *std::move(daemons);
    return c;
  }
  Daemon& daemon(int h) { return *daemons_[h]; }

 private:
  Cluster() = default;
  std::vector<std::unique_ptr<Daemon>> daemons_;
};

// Members of one mesh, member i a client of daemon host_of[i].
struct Members {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<Buffer> in, out;
};

void RunEach(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (auto& t : threads) t.join();
}

// Connects, joins (axes, coordinates from the linear index) and allocates
// `bytes` in and out for every member; every error is a test failure.
void JoinAll(Cluster& cluster, const std::vector<int>& host_of, const std::string& name,
             const std::vector<std::pair<std::string, int>>& axes, size_t bytes, Members* m,
             absl::Duration op_timeout = absl::ZeroDuration()) {
  const int n = static_cast<int>(host_of.size());
  m->clients.resize(n);
  m->meshes.resize(n);
  std::vector<std::string> errors(n);
  RunEach(n, [&](int i) {
    auto c = Client::Connect({.socket_path = cluster.daemon(host_of[i]).socket(),
                              .client_name = absl::StrCat(name, "-", i)});
    if (!c.ok()) {
      errors[i] = c.status().ToString();
      return;
    }
    std::vector<int> coord(axes.size());
    int rest = i;
    for (int a = static_cast<int>(axes.size()) - 1; a >= 0; --a) {
      coord[a] = rest % axes[a].second;
      rest /= axes[a].second;
    }
    auto mesh = (*c)->JoinMesh({.name = name, .axes = axes, .coordinate = coord,
                                .join_timeout = absl::Seconds(20), .op_timeout = op_timeout});
    if (!mesh.ok()) {
      errors[i] = mesh.status().ToString();
      return;
    }
    m->clients[i] = *std::move(c);
    m->meshes[i] = *std::move(mesh);
  });
  for (int i = 0; i < n; ++i) ASSERT_EQ(errors[i], "") << "member " << i;
  for (int i = 0; i < n; ++i) {
    auto in = m->clients[i]->Allocate(bytes);
    auto out = m->clients[i]->Allocate(bytes * n);
    ASSERT_TRUE(in.ok() && out.ok());
    m->in.push_back(*std::move(in));
    m->out.push_back(*std::move(out));
  }
}

std::unique_ptr<v1::Collective::Stub> StubOf(Daemon& d) {
  return v1::Collective::NewStub(
      grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials()));
}

v1::MeshInfo Describe(Daemon& d, const std::string& name) {
  auto stub = StubOf(d);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::DescribeMeshRequest req;
  req.set_mesh_name(name);
  v1::MeshInfo info;
  grpc::Status st = stub->DescribeMesh(&ctx, req, &info);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return info;
}

v1::GetStatsResponse Stats(Daemon& d) {
  auto stub = StubOf(d);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatsResponse stats;
  grpc::Status st = stub->GetStats(&ctx, v1::GetStatsRequest(), &stats);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return stats;
}

TEST(ClusterMeshTest, CollectivesAcrossThreeDaemonsGiveTheOneHostResults) {
  auto cluster = Cluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // 6 members on a 2x3 mesh, spread unevenly: h1 holds three, h2 two, h0 one.
  const std::vector<int> host_of = {1, 2, 1, 0, 2, 1};
  const int n = 6;
  constexpr int kCount = 1000;  // not a multiple of the lane count
  Members m;
  JoinAll(**cluster, host_of, "spread", {{"a", 2}, {"b", 3}}, kCount * sizeof(float), &m);
  ASSERT_EQ(m.meshes.size(), 6u);

  // Describe on any host names every member's host.
  v1::MeshInfo info = Describe((*cluster)->daemon(2), "spread");
  ASSERT_EQ(info.members_size(), n) << info.DebugString();
  for (const auto& member : info.members()) {
    EXPECT_EQ(member.host(), absl::StrCat("h", host_of[member.index()])) << member.DebugString();
  }
  EXPECT_EQ(info.state(), "READY");

  // psum over every member (lanes across hosts), f32 with values whose sum
  // depends on the order: the group order of one host is the reference.
  auto value = [](int i, int k) { return 1.0f / static_cast<float>(3 + i * 7 + k % 13); };
  std::vector<std::string> errors(n);
  RunEach(n, [&](int i) {
    auto x = m.in[i].as<float>();
    for (int k = 0; k < kCount; ++k) x[k] = value(i, k);
    absl::Status st = m.meshes[i]->psum(Array::Of<float>(m.in[i], {kCount}), AxisNames::All());
    if (!st.ok()) errors[i] = st.ToString();
  });
  for (int i = 0; i < n; ++i) ASSERT_EQ(errors[i], "") << "member " << i;
  for (int k = 0; k < kCount; ++k) {
    float want = 0;
    for (int i = 0; i < n; ++i) want += value(i, k);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(m.in[i].as<float>()[k], want) << "member " << i << " element " << k;
    }
  }

  // psum over axis "b" (groups of 3 across hosts) of int32.
  RunEach(n, [&](int i) {
    auto x = m.in[i].as<int32_t>();
    for (int k = 0; k < 8; ++k) x[k] = i * 100 + k;
    absl::Status st = m.meshes[i]->psum(Array::Of<int32_t>(m.in[i], {8}), "b");
    errors[i] = st.ok() ? "" : st.ToString();
  });
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(errors[i], "") << "member " << i;
    const int a = i / 3;
    for (int k = 0; k < 8; ++k) {
      int32_t want = 0;
      for (int b = 0; b < 3; ++b) want += (a * 3 + b) * 100 + k;
      EXPECT_EQ(m.in[i].as<int32_t>()[k], want) << "member " << i;
    }
  }

  // all_gather over every member.
  RunEach(n, [&](int i) {
    auto x = m.in[i].as<int32_t>();
    for (int k = 0; k < 4; ++k) x[k] = i * 10 + k;
    absl::Status st = m.meshes[i]->all_gather(Array::Of<int32_t>(m.in[i], {4}), AxisNames::All(),
                                              Array::Of<int32_t>(m.out[i], {n, 4}));
    errors[i] = st.ok() ? "" : st.ToString();
  });
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(errors[i], "") << "member " << i;
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < 4; ++k) {
        EXPECT_EQ(m.out[i].as<int32_t>()[j * 4 + k], j * 10 + k) << "member " << i;
      }
    }
  }

  // ppermute: a ring over axis "b".
  RunEach(n, [&](int i) {
    m.in[i].as<int32_t>()[0] = i;
    absl::Status st = m.meshes[i]->ppermute(Array::Of<int32_t>(m.in[i], {1}), "b",
                                            {{0, 1}, {1, 2}, {2, 0}},
                                            Array::Of<int32_t>(m.out[i], {1}));
    errors[i] = st.ok() ? "" : st.ToString();
  });
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(errors[i], "") << "member " << i;
    const int a = i / 3, b = i % 3;
    EXPECT_EQ(m.out[i].as<int32_t>()[0], a * 3 + (b + 2) % 3) << "member " << i;
  }

  // pmax over axis "a" and a barrier.
  RunEach(n, [&](int i) {
    m.in[i].as<float>()[0] = static_cast<float>((i * 5) % 7);
    absl::Status st = m.meshes[i]->pmax(Array::Of<float>(m.in[i], {1}), "a");
    if (st.ok()) st = m.meshes[i]->barrier();
    errors[i] = st.ok() ? "" : st.ToString();
  });
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(errors[i], "") << "member " << i;
    const int b = i % 3;
    EXPECT_EQ(m.in[i].as<float>()[0],
              std::max(static_cast<float>((b * 5) % 7), static_cast<float>(((3 + b) * 5) % 7)));
  }

  // GetStats on every host: joined, one mesh across hosts, its 6 ops, none
  // failed; h0 serves the coordinator.
  for (int h = 0; h < 3; ++h) {
    const v1::GetStatsResponse stats = Stats((*cluster)->daemon(h));
    ASSERT_TRUE(stats.has_cluster()) << stats.DebugString();
    const v1::ClusterStats& c = stats.cluster();
    EXPECT_EQ(c.host_id(), absl::StrCat("h", h));
    EXPECT_EQ(c.state(), "joined");
    EXPECT_EQ(c.serves_coordinator(), h == 0);
    EXPECT_NE(c.coordinator(), "");
    EXPECT_EQ(c.last_error(), "");
    EXPECT_EQ(c.meshes_across_hosts(), 1);
    EXPECT_EQ(c.ops_across_hosts(), 6) << "host h" << h;
    EXPECT_EQ(c.ops_across_hosts_failed(), 0);
  }
}

TEST(ClusterMeshTest, OpsThatDifferAcrossHostsFailAlikeAndTheMeshGoesOn) {
  auto cluster = Cluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Members m;
  JoinAll(**cluster, {0, 1}, "differ", {{"x", 2}}, 64, &m);
  std::vector<absl::Status> st(2);
  RunEach(2, [&](int i) {
    st[i] = i == 0 ? m.meshes[i]->psum(Array::Of<float>(m.in[i], {4}), "x")
                   : m.meshes[i]->pmax(Array::Of<float>(m.in[i], {4}), "x");
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << i << ": " << st[i];
    EXPECT_NE(st[i].message().find("h1"), std::string::npos) << st[i];
  }
  RunEach(2, [&](int i) {
    m.in[i].as<float>()[0] = static_cast<float>(i + 1);
    st[i] = m.meshes[i]->psum(Array::Of<float>(m.in[i], {1}), "x");
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(st[i].ok()) << st[i];
    EXPECT_EQ(m.in[i].as<float>()[0], 3.0f);
  }
}

// Starts a psum on every member of `m` but `skip`, runs `then` while they
// wait in it, and returns their statuses.
std::vector<absl::Status> PsumAllBut(Members& m, int skip, const std::function<void()>& then) {
  const int n = static_cast<int>(m.meshes.size());
  std::vector<absl::Status> r(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    if (i == skip) continue;
    threads.emplace_back([&, i] {
      r[i] = m.meshes[i]->psum(Array::Of<float>(m.in[i], {4}), AxisNames::All());
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // the others are waiting in the op
  then();
  for (auto& t : threads) t.join();
  return r;
}

TEST(ClusterMeshTest, AMemberClosedOnOneHostIsSeenOnTheOthers) {
  auto cluster = Cluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Members m;
  JoinAll(**cluster, {0, 1, 2, 1}, "closing", {{"x", 4}}, 64, &m, absl::Seconds(30));
  absl::Time closed;
  auto r = PsumAllBut(m, 2, [&] {
    // On h1 the op has both its members (1 and 3) once the daemon has taken
    // both submissions: it runs, waiting for h2; members 0 and 2 are on
    // other hosts, not missing here.
    auto stub = StubOf((*cluster)->daemon(1));
    v1::ListPendingOpsResponse pending;
    Eventually([&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      pending.Clear();
      grpc::Status st = stub->ListPendingOps(&ctx, v1::ListPendingOpsRequest(), &pending);
      return st.ok() && pending.ops_size() == 1 && pending.ops(0).state() == "running";
    });
    EXPECT_EQ(pending.ops_size(), 1) << pending.DebugString();
    if (pending.ops_size() == 1) {
      const v1::PendingOp& op = pending.ops(0);
      EXPECT_EQ(std::vector<int>(op.submitted().begin(), op.submitted().end()),
                (std::vector<int>{1, 3}));
      EXPECT_EQ(std::vector<int>(op.elsewhere().begin(), op.elsewhere().end()),
                (std::vector<int>{0, 2}));
      EXPECT_EQ(op.missing_size(), 0);
      EXPECT_EQ(op.state(), "running");
    }
    closed = absl::Now();
    m.meshes[2].reset();
    m.clients[2].reset();  // closes its session on h2
  });
  for (int i : {0, 1, 3}) {
    EXPECT_EQ(r[i].code(), absl::StatusCode::kAborted) << i << ": " << r[i];
    EXPECT_NE(r[i].message().find("h2"), std::string::npos) << r[i];
  }
  std::printf("member closed on h2: members on h0/h1 told after %s (op timeout 30 s)\n",
              absl::FormatDuration(absl::Now() - closed).c_str());
}

int MeshCount(Daemon& d) {
  auto stub = StubOf(d);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListMeshesResponse resp;
  grpc::Status st = stub->ListMeshes(&ctx, v1::ListMeshesRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp.meshes_size();
}

TEST(ClusterMeshTest, ABrokenMeshReformsAsTheNextGenerationAndLeavesNothingBehind) {
  auto cluster = Cluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<int> host_of = {0, 1, 2, 1};
  Members m;
  JoinAll(**cluster, host_of, "reform", {{"x", 4}}, 64, &m, absl::Seconds(30));
  const int64_t first = m.meshes[0]->generation();
  auto r = PsumAllBut(m, 2, [&] {
    m.meshes[2].reset();
    m.clients[2].reset();
  });
  for (int i : {0, 1, 3}) ASSERT_EQ(r[i].code(), absl::StatusCode::kAborted) << r[i];
  // Every member drops the broken mesh: no daemon keeps it.
  for (auto& mesh : m.meshes) mesh.reset();
  for (int h = 0; h < 3; ++h) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (MeshCount((*cluster)->daemon(h)) != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(MeshCount((*cluster)->daemon(h)), 0) << "host h" << h;
  }
  // The same name forms again, as the next generation, and works.
  Members again;
  JoinAll(**cluster, host_of, "reform", {{"x", 4}}, 64, &again, absl::Seconds(30));
  EXPECT_GT(again.meshes[0]->generation(), first);
  std::vector<absl::Status> st(4);
  RunEach(4, [&](int i) {
    again.in[i].as<float>()[0] = static_cast<float>(i);
    st[i] = again.meshes[i]->psum(Array::Of<float>(again.in[i], {1}), "x");
  });
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(st[i].ok()) << st[i];
    EXPECT_EQ(again.in[i].as<float>()[0], 6.0f);
  }
}

TEST(ClusterMeshTest, AKilledDaemonIsSeenByTheMembersOfTheOtherHosts) {
  auto cluster = Cluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Members m;
  JoinAll(**cluster, {1, 2, 1, 0}, "killed", {{"x", 4}}, 64, &m, absl::Seconds(30));
  absl::Time killed;
  auto r = PsumAllBut(m, 1, [&] {
    killed = absl::Now();
    (*cluster)->daemon(2).Kill();
  });
  const absl::Duration told = absl::Now() - killed;
  for (int i : {0, 2, 3}) {
    EXPECT_EQ(r[i].code(), absl::StatusCode::kAborted) << i << ": " << r[i];
    EXPECT_NE(r[i].message().find("h2"), std::string::npos) << r[i];
  }
  // Within the op timeout (30 s): the connections closed with the process.
  EXPECT_LT(told, absl::Seconds(30));
  std::printf("daemon h2 killed: members on h0/h1 told after %s (op timeout 30 s)\n",
              absl::FormatDuration(told).c_str());
}

TEST(ClusterMeshTest, RunningMeshesOutliveTheCoordinatorAndLocalMeshesNeedNone) {
  auto cluster = Cluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Members m;
  JoinAll(**cluster, {1, 2}, "outlive", {{"x", 2}}, 64, &m);
  (*cluster)->daemon(0).Kill();  // the coordinator
  ASSERT_TRUE((*cluster)->daemon(1).WaitForOutput(
      "event=cluster_state state=unavailable host_id=h1", kPatience));
  const v1::ClusterStats unavailable = Stats((*cluster)->daemon(1)).cluster();
  EXPECT_EQ(unavailable.state(), "unavailable");
  EXPECT_NE(unavailable.last_error(), "");
  EXPECT_EQ(unavailable.meshes_across_hosts(), 1);
  for (int round = 0; round < 3; ++round) {
    std::vector<absl::Status> st(2);
    RunEach(2, [&](int i) {
      m.in[i].as<float>()[0] = static_cast<float>(i + round);
      st[i] = m.meshes[i]->psum(Array::Of<float>(m.in[i], {1}), "x");
    });
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(st[i].ok()) << st[i];
      EXPECT_EQ(m.in[i].as<float>()[0], static_cast<float>(1 + 2 * round));
    }
  }
  // Every member on one daemon: forms there, without the registry.
  Members local;
  JoinAll(**cluster, {1, 1}, "all-on-h1", {{"x", 2}}, 64, &local);
  std::vector<absl::Status> st(2);
  RunEach(2, [&](int i) {
    local.in[i].as<float>()[0] = 2.0f;
    st[i] = local.meshes[i]->psum(Array::Of<float>(local.in[i], {1}), "x");
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(st[i].ok()) << st[i];
    EXPECT_EQ(local.in[i].as<float>()[0], 4.0f);
  }
  // A mesh across hosts cannot form: the join says the registry is
  // unreachable.
  auto c = Client::Connect({.socket_path = (*cluster)->daemon(1).socket()});
  ASSERT_TRUE(c.ok());
  auto mesh = (*c)->JoinMesh({.name = "needs-h2", .axes = {{"x", 2}}, .coordinate = {0},
                              .join_timeout = absl::Seconds(1)});
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kUnavailable) << mesh.status();
}

TEST(ClusterMeshTest, JoinsThatConflictAcrossHostsAreRefused) {
  auto cluster = Cluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto a = Client::Connect({.socket_path = (*cluster)->daemon(0).socket()});
  auto b = Client::Connect({.socket_path = (*cluster)->daemon(1).socket()});
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<std::unique_ptr<Mesh>> first;
  std::thread t([&] {
    first = (*a)->JoinMesh({.name = "conflict", .axes = {{"x", 2}}, .coordinate = {0},
                            .join_timeout = absl::Seconds(5)});
  });
  absl::SleepFor(absl::Milliseconds(500));
  // The same coordinate on the other host.
  auto taken = (*b)->JoinMesh({.name = "conflict", .axes = {{"x", 2}}, .coordinate = {0},
                               .join_timeout = absl::Seconds(5)});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
  EXPECT_NE(taken.status().message().find("h0"), std::string::npos) << taken.status();
  // Other axes.
  auto shape = (*b)->JoinMesh({.name = "conflict", .axes = {{"x", 4}}, .coordinate = {1},
                               .join_timeout = absl::Seconds(5)});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kFailedPrecondition) << shape.status();
  // The refusals changed nothing: the right member still completes it.
  auto good = (*b)->JoinMesh({.name = "conflict", .axes = {{"x", 2}}, .coordinate = {1},
                              .join_timeout = absl::Seconds(5)});
  t.join();
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE(first.ok()) << first.status();
  // The daemons cannot assign coordinates across hosts.
  auto assign = (*b)->JoinMesh({.name = "assigned", .axes = {{"x", 2}}});
  EXPECT_EQ(assign.status().code(), absl::StatusCode::kInvalidArgument) << assign.status();
}

TEST(ClusterMeshTest, AJoinerWithALongerTimeoutOutlivesTheFirstJoinersDeadline) {
  // On h0, member 0 joins first and waits 1 s (the deadline the mesh
  // starts forming with), member 1 joins next and waits 15 s; member 2 (on
  // h1) is late. Member 0 fails at its deadline; member 1 keeps waiting (it
  // is not failed with member 0), and the mesh forms once member 2 and a
  // new member 0 are in.
  auto cluster = Cluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Client>> clients;
  for (int h : {0, 0, 1, 0}) {
    auto c = Client::Connect({.socket_path = (*cluster)->daemon(h).socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  const std::vector<std::pair<std::string, int>> axes = {{"x", 3}};
  absl::StatusOr<std::unique_ptr<Mesh>> hasty, patient;
  std::atomic<bool> patient_done{false};
  std::thread h([&] {
    hasty = clients[0]->JoinMesh(
        {.name = "patience", .axes = axes, .coordinate = {0}, .join_timeout = absl::Seconds(1)});
  });
  absl::SleepFor(absl::Milliseconds(300));  // member 0 registered first
  std::thread t([&] {
    patient = clients[1]->JoinMesh(
        {.name = "patience", .axes = axes, .coordinate = {1}, .join_timeout = absl::Seconds(15)});
    patient_done = true;
  });
  h.join();
  EXPECT_EQ(hasty.status().code(), absl::StatusCode::kDeadlineExceeded) << hasty.status();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(patient_done.load()) << "member 1 failed with member 0: " << patient.status();
  std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> late(2);
  RunEach(2, [&](int i) {
    late[i] = clients[i == 0 ? 2 : 3]->JoinMesh({.name = "patience", .axes = axes,
                                                 .coordinate = {i == 0 ? 2 : 0},
                                                 .join_timeout = absl::Seconds(15)});
  });
  t.join();
  ASSERT_TRUE(patient.ok()) << patient.status();
  for (auto& m : late) ASSERT_TRUE(m.ok()) << m.status();
}

}  // namespace
}  // namespace collectived::testing
