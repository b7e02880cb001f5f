// The Cluster kept in etcd (daemon/cluster/etcd_cluster.h), against a real
// etcd on loopback (tests/harness/etcd.h): hosts as EtcdCluster objects of
// this process. Membership and host identity, the store and its waits, the
// mesh registry (its answers are the in-memory registry's), registrations
// racing from many hosts, a host whose lease ends, the leader killed, and
// etcd gone and back.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cluster/etcd_cluster.h"
#include "tests/harness/etcd.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(30);

class EtcdClusterTest : public ::testing::Test {
 protected:
  void Start(int nodes) {
    if (std::string why = EtcdSkipReason(); !why.empty()) GTEST_SKIP() << why;
    auto e = EtcdServers::Start({.nodes = nodes});
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = *std::move(e);
    dir_ = MakeTempDir();
  }

  // Host `id` of the cluster (started, and joined unless `join` is false).
  std::unique_ptr<::collectived::EtcdCluster> Host(const std::string& id, bool join = true,
                                                   const std::string& lease_file = "") {
    ::collectived::EtcdClusterOptions o;
    o.etcd.endpoints = etcd_->endpoints();
    o.etcd.rpc_timeout = absl::Seconds(2);
    o.prefix = "/test/";
    o.host_id = id;
    o.address = absl::StrCat(id, ".example:7070");
    o.lease_ttl = absl::Seconds(2);
    o.retry_interval = absl::Milliseconds(200);
    o.lease_file = lease_file;
    auto c = ::collectived::EtcdCluster::Create(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    (*c)->Start();
    if (join) {
      EXPECT_TRUE((*c)->WaitForState(ClusterState::kJoined, kPatience))
          << id << ": " << (*c)->last_error();
    }
    return *std::move(c);
  }

  static MeshRegistration Reg(const std::string& key, std::vector<int32_t> indices,
                              int64_t members = 2, const std::string& axes = "x=2",
                              const std::string& token = "") {
    MeshRegistration r;
    r.key = key;
    r.axes = axes;
    r.members = members;
    r.token = token;
    r.indices = std::move(indices);
    return r;
  }

  std::unique_ptr<EtcdServers> etcd_;
  std::string dir_;
};

std::vector<std::string> Ids(::collectived::EtcdCluster& c) {
  auto hosts = c.ListHosts();
  EXPECT_TRUE(hosts.ok()) << hosts.status();
  std::vector<std::string> ids;
  if (hosts.ok()) {
    for (const auto& h : *hosts) ids.push_back(h.host_id);
  }
  return ids;
}

TEST_F(EtcdClusterTest, HostsHoldTheirIdsAndARestartTakesItsIdBackAtOnce) {
  Start(1);
  const std::string lease_file = dir_ + "/a.lease";
  auto a = Host("a", true, lease_file);
  auto b = Host("b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(Ids(*a), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a->description(), absl::StrCat("etcd://", etcd_->endpoint(0)));

  // An impostor with a's id is refused, naming the live daemon.
  auto impostor = Host("a", /*join=*/false);
  ASSERT_TRUE(impostor->WaitForState(ClusterState::kUnavailable, kPatience));
  EXPECT_EQ(impostor->last_error().code(), absl::StatusCode::kAlreadyExists)
      << impostor->last_error();
  EXPECT_NE(impostor->last_error().message().find(
                "host id 'a' is held by a live daemon at a.example:7070"),
            std::string::npos)
      << impostor->last_error();
  impostor.reset();
  const std::string lease = a->lease_id();
  ASSERT_FALSE(lease.empty());

  // b leaves: gone at once. a stops without leaving (as if killed) and a
  // new one with its lease file takes the id back long before the lease
  // (2 s) ends.
  b->Stop(/*leave=*/true);
  EXPECT_EQ(Ids(*a), (std::vector<std::string>{"a"}));
  a->Stop(/*leave=*/false);
  const absl::Time start = absl::Now();
  auto again = Host("a", true, lease_file);
  ASSERT_TRUE(again);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "waited for the old lease to end";
  EXPECT_NE(again->lease_id(), lease);

  // A host that stops heartbeating disappears after its ttl.
  auto c = Host("c");
  c->Stop(/*leave=*/false);
  EXPECT_EQ(Ids(*again), (std::vector<std::string>{"a", "c"}));
  absl::SleepFor(absl::Seconds(4));
  EXPECT_EQ(Ids(*again), (std::vector<std::string>{"a"}));
}

TEST_F(EtcdClusterTest, TheStoreWaitsForKeysAndOwnedKeysGoWithTheLease) {
  Start(1);
  auto a = Host("a");
  auto b = Host("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Set("k1", "v1", /*overwrite=*/false).ok());
  EXPECT_EQ(a->Set("k1", "other", false).code(), absl::StatusCode::kAlreadyExists);
  // Setting what is there already (a retried write) is fine.
  EXPECT_TRUE(a->Set("k1", "v1", false).ok());
  ASSERT_TRUE(a->Set("k1", "v2", /*overwrite=*/true).ok());
  // A wait for a key set later, from another host.
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(b->Set("k2", "from-b", false, /*owned=*/true).ok());
  });
  auto got = a->Get({"k1", "k2"}, absl::Seconds(10));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"v2", "from-b"}));
  // A key nobody sets: DEADLINE_EXCEEDED naming it, at the timeout.
  const absl::Time start = absl::Now();
  auto none = a->Get({"k1", "never"}, absl::Milliseconds(500));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  EXPECT_NE(none.status().message().find("never"), std::string::npos) << none.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(800));
  // b's owned key goes with its lease.
  b->Stop(/*leave=*/true);
  EXPECT_EQ(a->Get({"k2"}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // Bad input changes nothing.
  EXPECT_EQ(a->Set("bad key", "v", false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Get({}, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdClusterTest, TheRegistryFormsGenerationsAndAnswersAsTheInMemoryOne) {
  Start(1);
  auto a = Host("a");
  auto b = Host("b");
  ASSERT_TRUE(a && b);
  auto ga = a->MeshRegister(Reg("s/m", {0}));
  ASSERT_TRUE(ga.ok()) << ga.status();
  EXPECT_EQ(*ga, 1);
  // Not full yet: a wait with no time names who is missing.
  auto early = a->MeshWait("s/m", 1, absl::ZeroDuration());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(early.status().message(),
            "mesh 's/m' generation 1 did not fill before the deadline: 1 of 2 members "
            "registered; missing 1; registered by a (1)");
  // Refusals, word for word the in-memory registry's.
  EXPECT_EQ(b->MeshRegister(Reg("s/m", {1}, 2, "y=2")).status().message(),
            "mesh 's/m' generation 1 is forming with axes (x=2) and 2 members (first registered "
            "by host a); host b asks for (y=2)");
  EXPECT_EQ(b->MeshRegister(Reg("s/m", {1}, 2, "x=2", "tok")).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(b->MeshRegister(Reg("s/m", {0})).status().message(),
            "member 0 of mesh 's/m' generation 1 is already registered by host a");
  // b's wait, then its registration fills the mesh.
  absl::StatusOr<MeshMembership> waited;
  std::thread waiter([&] { waited = a->MeshWait("s/m", 1, absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(200));
  auto gb = b->MeshRegister(Reg("s/m", {1}));
  ASSERT_TRUE(gb.ok()) << gb.status();
  EXPECT_EQ(*gb, 1);
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->member_host, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(waited->hosts.size(), 2u);
  EXPECT_EQ(waited->hosts[1].address, "b.example:7070");
  EXPECT_EQ(waited->secret.size(), kMeshSecretBytes);
  auto from_b = b->MeshWait("s/m", 1, absl::ZeroDuration());
  ASSERT_TRUE(from_b.ok());
  EXPECT_EQ(from_b->secret, waited->secret);
  EXPECT_EQ(b->MeshRegister(Reg("s/m", {1})).value_or(-1), 1);  // a retry of its own write
  // Broken on b: the generation ends with b's reason, and the next starts.
  ASSERT_TRUE(b->MeshLeave("s/m", 1, {1}, /*broken=*/true, "member 1 is gone").ok());
  EXPECT_EQ(a->MeshWait("s/m", 1, absl::ZeroDuration()).status().message(),
            "mesh 's/m' generation 1 ended: host b: member 1 is gone");
  auto next = a->MeshRegister(Reg("s/m", {0}));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 2);
  EXPECT_NE(a->MeshWait("s/m", 2, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(a->MeshWait("s/m", 7, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
  // Members that all leave a forming generation end it.
  ASSERT_TRUE(a->MeshLeave("s/m", 2, {0}, false, "").ok());
  EXPECT_EQ(a->MeshWait("s/m", 2, absl::ZeroDuration()).status().message(),
            "mesh 's/m' generation 2 ended: every member left");
}

TEST_F(EtcdClusterTest, HostsRegisteringAtOnceNeverLoseAMember) {
  Start(1);
  constexpr int kHosts = 8;
  std::vector<std::unique_ptr<::collectived::EtcdCluster>> hosts;
  for (int h = 0; h < kHosts; ++h) hosts.push_back(Host(absl::StrCat("h", h)));
  for (int round = 0; round < 3; ++round) {
    const std::string key = absl::StrCat("race/", round);
    std::vector<absl::StatusOr<int64_t>> got(kHosts, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int h = 0; h < kHosts; ++h) {
      threads.emplace_back([&, h] {
        got[h] = hosts[h]->MeshRegister(Reg(key, {h}, kHosts, "x=8"));
      });
    }
    for (auto& t : threads) t.join();
    for (int h = 0; h < kHosts; ++h) {
      ASSERT_TRUE(got[h].ok()) << got[h].status();
      EXPECT_EQ(*got[h], 1);
    }
    auto m = hosts[0]->MeshWait(key, 1, absl::Seconds(5));
    ASSERT_TRUE(m.ok()) << m.status();
    for (int h = 0; h < kHosts; ++h) EXPECT_EQ(m->member_host[h], absl::StrCat("h", h));
  }
}

TEST_F(EtcdClusterTest, AGenerationWhoseHostIsGoneEndsForItsWaiters) {
  Start(1);
  auto a = Host("a");
  auto b = Host("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->MeshRegister(Reg("gone", {0}, 3, "x=3")).ok());
  ASSERT_TRUE(b->MeshRegister(Reg("gone", {1}, 3, "x=3")).ok());
  b->Stop(/*leave=*/false);  // as if killed: its lease (2 s) runs out
  const absl::Time start = absl::Now();
  auto w = a->MeshWait("gone", 1, absl::Seconds(20));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kAborted) << w.status();
  EXPECT_EQ(w.status().message(),
            "mesh 'gone' generation 1 ended: the lease of host b ended (its daemon is gone)");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The key's next registration starts generation 2.
  EXPECT_EQ(a->MeshRegister(Reg("gone", {0}, 3, "x=3")).value_or(-1), 2);
}

TEST_F(EtcdClusterTest, RegistrationsGoOnWhenTheLeaderIsKilled) {
  Start(3);
  auto a = Host("a");
  auto b = Host("b");
  ASSERT_TRUE(a && b);
  auto leader = etcd_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  etcd_->Kill(*leader);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 5; ++i) {
    const std::string key = absl::StrCat("after-kill/", i);
    auto ga = a->MeshRegister(Reg(key, {0}));
    ASSERT_TRUE(ga.ok()) << ga.status();
    auto gb = b->MeshRegister(Reg(key, {1}));
    ASSERT_TRUE(gb.ok()) << gb.status();
    auto m = b->MeshWait(key, *gb, absl::Seconds(10));
    ASSERT_TRUE(m.ok()) << m.status();
  }
  std::printf("etcd leader killed: 5 meshes registered and full %s later\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  // Both hosts kept their ids.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(Ids(*a), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a->state(), ClusterState::kJoined) << a->last_error();
}

TEST_F(EtcdClusterTest, WithEtcdGoneCallsFailUnavailableNamingItAndRecoverWhenItReturns) {
  Start(1);
  auto a = Host("a");
  ASSERT_TRUE(a);
  etcd_->Kill(0);
  const absl::Time start = absl::Now();
  auto g = a->MeshRegister(Reg("down", {0}), absl::Now() + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnavailable) << g.status();
  EXPECT_NE(g.status().message().find(absl::StrCat("etcd ", etcd_->endpoint(0))),
            std::string::npos)
      << g.status();
  EXPECT_LT(took, absl::Milliseconds(1300));
  ASSERT_TRUE(etcd_->Restart(0).ok());
  // etcd kept the lease through its restart: the host never lost its id.
  auto again = a->MeshRegister(Reg("down", {0}));
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(a->WaitForState(ClusterState::kJoined, kPatience)) << a->last_error();
}

}  // namespace
}  // namespace collectived::testing
