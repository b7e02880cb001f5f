// Real daemons whose cluster is kept in a real three-node etcd on loopback
// (--cluster=etcd://...): no daemon is the coordinator. Meshes form across
// the daemons and give the one-host results; the etcd leader killed while a
// mesh runs and another forms (the running one never fails, the new one
// forms after the election); all of etcd down (running meshes go on, a new
// join across hosts fails UNAVAILABLE naming etcd within its timeout, and
// everything works again when etcd is back); a killed daemon's lease ends
// the generation it was forming.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectived/client.h"
#include "tests/harness/etcd.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(30);

class EtcdDaemonsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = EtcdSkipReason(); !why.empty()) GTEST_SKIP() << why;
    auto e = EtcdServers::Start({.nodes = 3});
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = *std::move(e);
    for (int h = 0; h < 3; ++h) {
      auto d = Daemon::Start({"--tcp=127.0.0.1:0",
                              absl::StrCat("--cluster=etcd://", absl::StrJoin(etcd_->endpoints(), ",")),
                              absl::StrCat("--host-id=h", h), "--cluster-lease-ms=2000"});
      ASSERT_TRUE(d.ok()) << d.status();
      daemons_.push_back(*std::move(d));
    }
    for (int h = 0; h < 3; ++h) {
      ASSERT_TRUE(daemons_[h]->WaitForOutput(
          absl::StrCat("event=cluster_state state=joined host_id=h", h), kPatience))
          << daemons_[h]->output();
    }
  }

  std::unique_ptr<EtcdServers> etcd_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
};

// One member of a mesh {x: n}: a client of daemon `host`.
struct Member {
  std::unique_ptr<Client> client;
  std::unique_ptr<Mesh> mesh;
  Buffer buffer;
};

// Members i = 0..n-1 of mesh `name` {x: n}, member i on daemon host_of[i],
// joined at once (each in its own thread) within `timeout`; the statuses.
std::vector<absl::Status> JoinAll(std::vector<std::unique_ptr<Daemon>>& daemons,
                                  const std::vector<int>& host_of, const std::string& name,
                                  std::vector<Member>* members,
                                  absl::Duration timeout = absl::Seconds(20)) {
  const int n = static_cast<int>(host_of.size());
  members->resize(n);
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto c = Client::Connect({.socket_path = daemons[host_of[i]]->socket(),
                                .client_name = absl::StrCat(name, "-", i)});
      if (!c.ok()) {
        st[i] = c.status();
        return;
      }
      auto m = (*c)->JoinMesh({.name = name, .axes = {{"x", n}}, .coordinate = {i},
                               .join_timeout = timeout});
      if (!m.ok()) {
        st[i] = m.status();
        return;
      }
      auto b = (*c)->Allocate(1024 * sizeof(float));
      if (!b.ok()) {
        st[i] = b.status();
        return;
      }
      (*members)[i].client = *std::move(c);
      (*members)[i].mesh = *std::move(m);
      (*members)[i].buffer = *std::move(b);
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

// One psum of (i + 1) over every member: OK when every member got the sum.
absl::Status PsumOnce(std::vector<Member>& members) {
  const int n = static_cast<int>(members.size());
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto x = members[i].buffer.as<float>();
      for (int k = 0; k < 1024; ++k) x[k] = static_cast<float>(i + 1);
      st[i] = members[i].mesh->psum(Array::Of<float>(members[i].buffer, {1024}), "x");
      if (st[i].ok() && x[1023] != static_cast<float>(n * (n + 1) / 2)) {
        st[i] = absl::InternalError(absl::StrCat("member ", i, " got ", x[1023]));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : st) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void ExpectAllOk(const std::vector<absl::Status>& st) {
  for (size_t i = 0; i < st.size(); ++i) EXPECT_TRUE(st[i].ok()) << "member " << i << ": " << st[i];
}

TEST_F(EtcdDaemonsTest, MeshesFormAcrossDaemonsAndGiveTheOneHostResults) {
  std::vector<Member> m;
  ExpectAllOk(JoinAll(daemons_, {0, 1, 2, 1}, "across", &m));
  ASSERT_FALSE(HasFailure());
  for (int op = 0; op < 3; ++op) EXPECT_TRUE(PsumOnce(m).ok());
  // The daemons say where their cluster is kept.
  EXPECT_NE(daemons_[0]->output().find("coordinator=etcd://"), std::string::npos)
      << daemons_[0]->output();
}

TEST_F(EtcdDaemonsTest, TheLeaderKilledStopsNeitherARunningMeshNorANewOneFromForming) {
  std::vector<Member> running;
  ExpectAllOk(JoinAll(daemons_, {0, 1, 2}, "running", &running));
  ASSERT_FALSE(HasFailure());
  std::atomic<bool> stop{false};
  std::atomic<int> ops{0};
  absl::Status failure;
  std::thread loop([&] {
    while (!stop.load()) {
      absl::Status st = PsumOnce(running);
      if (!st.ok()) {
        failure = st;
        return;
      }
      ops.fetch_add(1);
    }
  });
  absl::SleepFor(absl::Milliseconds(300));
  auto leader = etcd_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  etcd_->Kill(*leader);
  const absl::Time killed = absl::Now();
  std::vector<Member> fresh;
  ExpectAllOk(JoinAll(daemons_, {2, 0, 1}, "formed-after-the-kill", &fresh));
  const absl::Duration formed = absl::Now() - killed;
  EXPECT_TRUE(PsumOnce(fresh).ok());
  absl::SleepFor(absl::Milliseconds(300));
  stop.store(true);
  loop.join();
  EXPECT_TRUE(failure.ok()) << failure;
  EXPECT_GT(ops.load(), 0);
  std::printf("etcd leader killed: a new mesh across 3 daemons formed %s later; the running "
              "mesh ran %d psums meanwhile, none failed\n",
              absl::FormatDuration(formed).c_str(), ops.load());
}

TEST_F(EtcdDaemonsTest, WithAllOfEtcdDownRunningMeshesGoOnAndNewJoinsFailNamingEtcd) {
  std::vector<Member> running;
  ExpectAllOk(JoinAll(daemons_, {0, 1, 2}, "before", &running));
  ASSERT_FALSE(HasFailure());
  etcd_->KillAll();
  for (int op = 0; op < 5; ++op) EXPECT_TRUE(PsumOnce(running).ok());
  // A join across hosts: UNAVAILABLE naming etcd, within its timeout.
  std::vector<Member> none;
  const absl::Time start = absl::Now();
  std::vector<absl::Status> st =
      JoinAll(daemons_, {0, 1}, "while-down", &none, absl::Milliseconds(1000));
  const absl::Duration took = absl::Now() - start;
  for (const absl::Status& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("etcd 127.0.0.1:"), std::string::npos) << s;
  }
  std::printf("all of etcd down: a join of 1000 ms across hosts failed after %s\n",
              absl::FormatDuration(took).c_str());
  // A mesh of one daemon needs no registry.
  std::vector<Member> local;
  ExpectAllOk(JoinAll(daemons_, {1, 1}, "local", &local, absl::Seconds(5)));
  absl::Status local_psum = PsumOnce(local);
  EXPECT_TRUE(local_psum.ok()) << local_psum;
  // etcd back: new meshes form again.
  ASSERT_TRUE(etcd_->RestartAll().ok());
  std::vector<Member> after;
  ExpectAllOk(JoinAll(daemons_, {2, 1, 0}, "after", &after));
  EXPECT_TRUE(PsumOnce(after).ok());
  EXPECT_TRUE(PsumOnce(running).ok());
}

TEST_F(EtcdDaemonsTest, AKilledDaemonsLeaseEndsTheGenerationItWasForming) {
  // Members 0 (h0) and 1 (h2) join a mesh of 3; member 2 never comes. h2 is
  // killed: when its lease (2 s) ends, member 0's join is told so.
  std::vector<Member> m(2);
  absl::Status h0_join;
  std::thread joiner([&] {
    auto c = Client::Connect({.socket_path = daemons_[0]->socket(), .client_name = "m0"});
    ASSERT_TRUE(c.ok());
    auto mesh = (*c)->JoinMesh({.name = "orphan", .axes = {{"x", 3}}, .coordinate = {0},
                                .join_timeout = absl::Seconds(20)});
    h0_join = mesh.status();
  });
  auto c2 = Client::Connect({.socket_path = daemons_[2]->socket(), .client_name = "m1"});
  ASSERT_TRUE(c2.ok());
  std::thread other([&] {
    (void)(*c2)->JoinMesh({.name = "orphan", .axes = {{"x", 3}}, .coordinate = {1},
                           .join_timeout = absl::Seconds(20)});
  });
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Time killed = absl::Now();
  daemons_[2]->Kill();
  joiner.join();
  other.join();
  EXPECT_EQ(h0_join.code(), absl::StatusCode::kAborted) << h0_join;
  EXPECT_NE(h0_join.message().find("the lease of host h2 ended"), std::string::npos) << h0_join;
  std::printf("daemon h2 killed while its mesh formed: the joiner on h0 was told %s later "
              "(lease 2 s)\n",
              absl::FormatDuration(absl::Now() - killed).c_str());
}

// etcd with authentication: a daemon with the right user and password
// joins; one with a wrong password says so and never joins.
TEST(EtcdAuthDaemonsTest, DaemonsAuthenticateToEtcd) {
  if (std::string why = EtcdSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto etcd = EtcdServers::Start({.nodes = 1, .root_password = "s3cret"});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/good") << "s3cret\n";
  std::ofstream(dir + "/bad") << "guess\n";
  auto start = [&](const std::string& id, const std::string& password) {
    return Daemon::Start({"--tcp=127.0.0.1:0",
                          absl::StrCat("--cluster=etcd://", (*etcd)->endpoint(0)),
                          absl::StrCat("--host-id=", id), "--etcd-user=root",
                          absl::StrCat("--etcd-password-file=", dir, "/", password)});
  };
  auto good = start("good", "good");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->WaitForOutput("event=cluster_state state=joined host_id=good", kPatience))
      << (*good)->output();
  auto bad = start("bad", "bad");
  ASSERT_TRUE(bad.ok()) << bad.status();
  ASSERT_TRUE((*bad)->WaitForOutput("event=cluster_state state=unavailable host_id=bad", kPatience))
      << (*bad)->output();
  EXPECT_NE((*bad)->output().find("UNAUTHENTICATED"), std::string::npos) << (*bad)->output();
  // The password is never logged.
  EXPECT_EQ((*good)->output().find("s3cret"), std::string::npos);
  EXPECT_EQ((*bad)->output().find("guess"), std::string::npos);
}

}  // namespace
}  // namespace collectived::testing
