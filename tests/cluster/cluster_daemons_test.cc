// Three real daemons form a cluster on loopback: one serves the coordinator
// (--coordinator), two join it (--cluster). Membership follows the daemons:
// a SIGKILLed member leaves ListHosts when its lease ends; a member whose
// coordinator died keeps serving its local clients and reports the cluster
// unavailable; a restarted coordinator gets every member back.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "collectived/client.h"
#include "collectived/v1/cluster.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/harness/cluster.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(30);
constexpr int64_t kLeaseMs = 1000;
constexpr char kToken[] = "integration-cluster-token";
constexpr char kTokenKey[] = "collectived-cluster-token";

class ClusterView {
 public:
  explicit ClusterView(int port)
      : stub_(v1::Cluster::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                       grpc::InsecureChannelCredentials()))) {}
  // ListHosts with the token (or `token`); the status of the call.
  grpc::Status List(std::vector<v1::HostInfo>* hosts, const std::string& token = kToken) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) ctx.AddMetadata(kTokenKey, token);
    v1::ListHostsRequest req;
    v1::ListHostsResponse resp;
    grpc::Status st = stub_->ListHosts(&ctx, req, &resp);
    hosts->assign(resp.hosts().begin(), resp.hosts().end());
    return st;
  }
  std::vector<std::string> Ids() {
    std::vector<v1::HostInfo> hosts;
    if (!List(&hosts).ok()) return {"<ListHosts failed>"};
    std::vector<std::string> ids;
    for (const auto& h : hosts) ids.push_back(h.host_id());
    return ids;
  }
  // Polls until the host ids are `want`; false after kPatience.
  bool WaitForIds(const std::vector<std::string>& want) {
    const absl::Time deadline = absl::Now() + kPatience;
    while (Ids() != want) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

 private:
  std::unique_ptr<v1::Cluster::Stub> stub_;
};

// grpc.health.v1 Check of `service` on the daemon's Unix socket: the
// status name, or the error code's number.
std::string HealthOf(const Daemon& d, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) return absl::StrCat("error ", st.error_code());
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) absl::StrAppend(&s, s.empty() ? "" : ",", x);
  return s;
}

// Two local clients of `socket` run one psum of 1.0 + 2.0 over a fresh mesh.
void ExpectLocalPsumWorks(const std::string& socket, const std::string& mesh) {
  float sums[2] = {0, 0};
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto client = collectived::Client::Connect(
          {.socket_path = socket, .client_name = absl::StrCat("local-", i)});
      if (!client.ok()) {
        errors[i] = client.status().ToString();
        return;
      }
      auto m = (*client)->JoinMesh({.name = mesh, .axes = {{"i", 2}}, .coordinate = {i},
                                   .join_timeout = absl::Seconds(20)});
      if (!m.ok()) {
        errors[i] = m.status().ToString();
        return;
      }
      auto buf = (*client)->Allocate(sizeof(float));
      if (!buf.ok()) {
        errors[i] = buf.status().ToString();
        return;
      }
      buf->as<float>()[0] = static_cast<float>(i + 1);
      absl::Status st = (*m)->psum(collectived::Array::Of<float>(*buf, {}), "i");
      if (!st.ok()) errors[i] = st.ToString();
      sums[i] = buf->as<float>()[0];
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(errors[i], "") << "member " << i;
    EXPECT_EQ(sums[i], 3.0f) << "member " << i;
  }
}

TEST(ClusterDaemonsTest, MembershipFollowsTheDaemonsAndSurvivesTheCoordinator) {
  const std::string dir = MakeTempDir();
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << kToken << "\n";
  const std::string lease_flag = absl::StrCat("--cluster-lease-ms=", kLeaseMs);

  auto coord = Daemon::Start({"--tcp=127.0.0.1:0", "--coordinator", "--host-id=coord",
                              lease_flag, "--cluster-token-file=" + token_file});
  ASSERT_TRUE(coord.ok()) << coord.status();
  const int port = ListeningPort(**coord);
  ASSERT_GT(port, 0) << (*coord)->output();
  const std::string cluster_flag = absl::StrCat("--cluster=127.0.0.1:", port);
  auto member = [&](const std::string& id) {
    return Daemon::Start({"--tcp=127.0.0.1:0", cluster_flag, "--host-id=" + id,
                          "--cluster-token-file=" + token_file});
  };
  auto m1 = member("member-1");
  ASSERT_TRUE(m1.ok()) << m1.status();
  auto m2 = member("member-2");
  ASSERT_TRUE(m2.ok()) << m2.status();

  // All three appear, with their advertised addresses and heartbeats.
  ClusterView view(port);
  ASSERT_TRUE(view.WaitForIds({"coord", "member-1", "member-2"}))
      << Join(view.Ids()) << "\n" << (*coord)->output();
  std::vector<v1::HostInfo> hosts;
  ASSERT_TRUE(view.List(&hosts).ok());
  for (const auto& h : hosts) {
    EXPECT_TRUE(absl::StartsWith(h.address(), "127.0.0.1:")) << h.address();
    EXPECT_NE(h.address(), "127.0.0.1:0");
    EXPECT_GE(h.last_heartbeat_unix_ms(), h.joined_at_unix_ms());
  }
  EXPECT_EQ(hosts[0].address(), absl::StrCat("127.0.0.1:", port));
  // The coordinator's health names the Cluster service; a member's does not.
  EXPECT_EQ(HealthOf(**coord, "collectived.v1.Cluster"), "SERVING");
  EXPECT_EQ(HealthOf(**m1, "collectived.v1.Cluster"),
            absl::StrCat("error ", grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(HealthOf(**m1, "collectived.v1.Collective"), "SERVING");
  // The token is required over the wire, and never logged.
  EXPECT_EQ(view.List(&hosts, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(view.List(&hosts, "wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ((*coord)->output().find(kToken), std::string::npos);
  EXPECT_EQ((*m1)->output().find(kToken), std::string::npos);

  // A SIGKILLed member leaves when its lease ends, not at once (it renewed
  // the lease every third of the ttl until it died); the other stays.
  const absl::Time killed = absl::Now();
  (*m2)->Kill();
  ASSERT_TRUE(view.WaitForIds({"coord", "member-1"})) << Join(view.Ids());
  EXPECT_GE(absl::Now() - killed, absl::Milliseconds(kLeaseMs / 3));
  EXPECT_TRUE((*coord)->WaitForOutput("event=cluster_lease_expired host_id=member-2", kPatience));

  // The coordinator dies: member-1 reports the cluster unavailable and keeps
  // serving its local clients.
  const size_t before_kill = (*m1)->output().size();
  (*coord)->Kill();
  ASSERT_TRUE((*m1)->WaitForOutput("event=cluster_state state=unavailable host_id=member-1",
                                   kPatience, before_kill))
      << (*m1)->output();
  ExpectLocalPsumWorks((*m1)->socket(), "local-while-coordinator-down");

  // A coordinator restarted on the same address: member-1 joins it again.
  const size_t before_restart = (*m1)->output().size();
  auto coord2 = Daemon::Start({absl::StrCat("--tcp=127.0.0.1:", port), "--coordinator",
                               "--host-id=coord", lease_flag,
                               "--cluster-token-file=" + token_file});
  ASSERT_TRUE(coord2.ok()) << coord2.status();
  ASSERT_TRUE((*m1)->WaitForOutput("event=cluster_state state=joined host_id=member-1",
                                   kPatience, before_restart))
      << (*m1)->output().substr(before_restart);
  ASSERT_TRUE(view.WaitForIds({"coord", "member-1"})) << Join(view.Ids());
  ExpectLocalPsumWorks((*m1)->socket(), "local-after-restart");

  // A member stopped with SIGTERM leaves at once (no wait for its lease).
  const absl::Time stopping = absl::Now();
  ChildResult stopped = (*m1)->Stop();
  EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("event=cluster_left host_id=member-1 status=ok"),
            std::string::npos)
      << stopped.output;
  ASSERT_TRUE(view.WaitForIds({"coord"})) << Join(view.Ids());
  EXPECT_LT(absl::Now() - stopping, absl::Milliseconds(kLeaseMs * 5));
  ChildResult coord_stopped = (*coord2)->Stop();
  EXPECT_EQ(coord_stopped.exit_code, 0) << coord_stopped.output;
}

// A member whose coordinator is not up yet starts anyway, keeps trying, and
// joins once the coordinator comes.
TEST(ClusterDaemonsTest, AMemberStartsBeforeItsCoordinatorAndJoinsLater) {
  // The coordinator's port, free now and outside what port-0 binds of the
  // other tests' daemons can take meanwhile.
  const int port = testing::UnusedFixedPort();
  ASSERT_GT(port, 0);
  auto m = Daemon::Start({"--tcp=127.0.0.1:0", absl::StrCat("--cluster=127.0.0.1:", port),
                          "--host-id=early"});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->WaitForOutput("event=cluster_state state=unavailable host_id=early",
                                  kPatience))
      << (*m)->output();
  ExpectLocalPsumWorks((*m)->socket(), "before-any-coordinator");
  auto coord = Daemon::Start({absl::StrCat("--tcp=127.0.0.1:", port), "--coordinator",
                              "--host-id=late-coord", "--cluster-lease-ms=1000"});
  ASSERT_TRUE(coord.ok()) << coord.status();
  ClusterView view(port);
  ASSERT_TRUE(view.WaitForIds({"early", "late-coord"})) << Join(view.Ids());
}

// Runs `script` with /bin/sh in `dir`; its output, or why it failed.
absl::StatusOr<std::string> Shell(const std::string& dir, const std::string& script) {
  return RunShell("cd '" + dir + "' && " + script);
}

// A cluster CA and certificates it signs for hosts `coord` and `good`, and
// another CA with one for `rogue`: each names its host id (common name and
// DNS name, as a host's certificate must) and 127.0.0.1 (no extended key
// usage: the daemons use them as servers and as clients). False (with the
// reason in `why`) when openssl is missing.
bool MakePki(const std::string& dir, std::string* why) {
  if (!Shell(dir, "command -v openssl").ok()) {
    *why = "openssl is not installed";
    return false;
  }
  const std::string script = R"(
set -e
for ca in ca rogue; do
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=$ca -keyout $ca.key -out $ca.pem 2>/dev/null
done
cert() {  # host ca
  printf 'subjectAltName=DNS:%s,IP:127.0.0.1,DNS:localhost\n' $1 > $1.ext
  openssl req -newkey rsa:2048 -nodes -subj /CN=$1 -keyout host-$1.key -out host-$1.csr 2>/dev/null
  openssl x509 -req -in host-$1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -days 1 \
    -extfile $1.ext -out host-$1.pem 2>/dev/null
}
cert coord ca; cert good ca; cert rogue rogue
)";
  auto out = Shell(dir, script);
  EXPECT_TRUE(out.ok()) << out.status();
  return true;
}

// Daemon to daemon over mTLS: the coordinator requires a client certificate
// of the cluster's CA; a member with one joins, a member with another CA's
// certificate or none (plaintext) cannot, and reports the cluster
// unavailable. A daemon whose certificate does not name its host id, or
// that has a certificate but not the cluster's CA, does not start.
TEST(ClusterDaemonsTest, MembersJoinOverMutualTlsAndOthersAreRefused) {
  const std::string dir = MakeTempDir();
  std::string why;
  if (!MakePki(dir, &why)) GTEST_SKIP() << why;
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto tls_flags = [&](const std::string& host, const std::string& ca) {
    return std::vector<std::string>{"--tls-cert=" + dir + "/host-" + host + ".pem",
                                    "--tls-key=" + dir + "/host-" + host + ".key",
                                    "--tls-client-ca=" + dir + "/" + ca + ".pem"};
  };
  std::vector<std::string> flags = {"--tcp=127.0.0.1:0", "--coordinator", "--host-id=coord",
                                    "--cluster-lease-ms=1000"};
  for (auto& f : tls_flags("coord", "ca")) flags.push_back(f);
  auto coord = Daemon::Start(flags);
  ASSERT_TRUE(coord.ok()) << coord.status();
  const int port = ListeningPort(**coord);
  ASSERT_GT(port, 0) << (*coord)->output();
  EXPECT_NE((*coord)->output().find("tcp_security=mtls"), std::string::npos);
  const std::string cluster_flag = absl::StrCat("--cluster=127.0.0.1:", port);

  auto member = [&](const std::string& id, const std::string& cert, const std::string& ca) {
    std::vector<std::string> f = {"--tcp=127.0.0.1:0", cluster_flag, "--host-id=" + id};
    if (!ca.empty()) {
      for (auto& x : tls_flags(cert, ca)) f.push_back(x);
    }
    return Daemon::Start(f);
  };
  auto good = member("good", "good", "ca");
  ASSERT_TRUE(good.ok()) << good.status();
  auto rogue = member("rogue", "rogue", "rogue");
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  auto plain = member("plain", "", "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  // A certificate of the cluster's CA that names another host.
  auto other = member("other", "good", "ca");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find(
                "the host id 'other' is not named by this daemon's certificate (it carries "
                "names good, localhost, good)"),
            std::string::npos)
      << other.status();
  // A certificate without the cluster's CA: the daemons could not verify
  // each other.
  auto no_ca = Daemon::Start({"--tcp=127.0.0.1:0", cluster_flag, "--host-id=good",
                              "--tls-cert=" + dir + "/host-good.pem",
                              "--tls-key=" + dir + "/host-good.key"});
  ASSERT_FALSE(no_ca.ok());
  EXPECT_NE(no_ca.status().message().find("--tls-cert in a cluster needs --tls-client-ca"),
            std::string::npos)
      << no_ca.status();

  ASSERT_TRUE((*good)->WaitForOutput("event=cluster_state state=joined host_id=good", kPatience))
      << (*good)->output();
  EXPECT_NE((*good)->output().find("security=tls"), std::string::npos);
  ASSERT_TRUE((*rogue)->WaitForOutput("event=cluster_state state=unavailable host_id=rogue",
                                      kPatience))
      << (*rogue)->output();
  ASSERT_TRUE((*plain)->WaitForOutput("event=cluster_state state=unavailable host_id=plain",
                                      kPatience))
      << (*plain)->output();

  // The coordinator's view, over mTLS with the cluster's certificate.
  auto read = [&](const std::string& name) {
    std::ifstream in(dir + "/" + name);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read("ca.pem");
  ssl.pem_cert_chain = read("host-good.pem");
  ssl.pem_private_key = read("host-good.key");
  auto stub = v1::Cluster::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                       grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListHostsRequest req;
  v1::ListHostsResponse resp;
  grpc::Status st = stub->ListHosts(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::vector<std::string> ids;
  for (const auto& h : resp.hosts()) ids.push_back(h.host_id());
  // The coordinator joined itself over TLS too.
  EXPECT_EQ(ids, (std::vector<std::string>{"coord", "good"}));
}

// Host ids are unique in a cluster: a second daemon claiming a live host's
// id is refused (it says so, naming the live daemon's address) and changes
// nothing for the live one; the same daemon restarted on its socket shows
// its previous lease and takes its id back at once, long before the lease
// would have ended.
TEST(ClusterDaemonsTest, ASecondDaemonWithALiveHostIdIsRefusedAndARestartIsNot) {
  // A long lease: a restart that had to wait for it would take 20 s.
  auto coord = Daemon::Start({"--tcp=127.0.0.1:0", "--coordinator", "--host-id=coord",
                              "--cluster-lease-ms=20000"});
  ASSERT_TRUE(coord.ok()) << coord.status();
  const int port = ListeningPort(**coord);
  ASSERT_GT(port, 0) << (*coord)->output();
  const std::string cluster_flag = absl::StrCat("--cluster=127.0.0.1:", port);
  auto h1 = Daemon::Start({"--tcp=127.0.0.1:0", cluster_flag, "--host-id=h1"});
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_TRUE((*h1)->WaitForOutput("event=cluster_state state=joined host_id=h1", kPatience))
      << (*h1)->output();
  const int h1_port = ListeningPort(**h1);
  ClusterView view(port);
  auto address_of_h1 = [&] {
    std::vector<v1::HostInfo> hosts;
    EXPECT_TRUE(view.List(&hosts, "").ok());
    for (const auto& h : hosts) {
      if (h.host_id() == "h1") return h.address();
    }
    return std::string("<none>");
  };
  ASSERT_EQ(address_of_h1(), absl::StrCat("127.0.0.1:", h1_port));

  // An impostor with h1's id.
  auto impostor = Daemon::Start({"--tcp=127.0.0.1:0", cluster_flag, "--host-id=h1"});
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  ASSERT_TRUE((*impostor)->WaitForOutput("event=cluster_state state=unavailable host_id=h1",
                                         kPatience))
      << (*impostor)->output();
  EXPECT_NE((*impostor)->output().find(absl::StrCat(
                "ALREADY_EXISTS: coordinator 127.0.0.1:", port,
                ": host id 'h1' is held by a live daemon at 127.0.0.1:", h1_port)),
            std::string::npos)
      << (*impostor)->output();
  // Over several heartbeats, the live daemon keeps its lease: never
  // replaced, never rejoining.
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(address_of_h1(), absl::StrCat("127.0.0.1:", h1_port));
  EXPECT_EQ((*h1)->output().find("state=unavailable"), std::string::npos) << (*h1)->output();
  EXPECT_EQ((*h1)->output().find("cluster_joined", (*h1)->output().find("cluster_joined") + 1),
            std::string::npos)
      << "h1 joined twice: " << (*h1)->output();
  impostor->reset();

  // h1 is killed and restarted on its socket: it is back at once.
  const std::string socket = (*h1)->socket();
  h1->reset();  // SIGKILL
  const absl::Time restarted = absl::Now();
  auto again = Daemon::StartAt(socket, {"--tcp=127.0.0.1:0", cluster_flag, "--host-id=h1"});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->WaitForOutput("event=cluster_state state=joined host_id=h1",
                                      absl::Seconds(10)))
      << (*again)->output();
  EXPECT_LT(absl::Now() - restarted, absl::Seconds(10));
  EXPECT_EQ(address_of_h1(), absl::StrCat("127.0.0.1:", ListeningPort(**again)));
}

// Misconfigurations say what to fix: --cluster at a daemon that serves no
// coordinator, --coordinator together with etcd, a malformed etcd address,
// plaintext etcd off loopback.
TEST(ClusterDaemonsTest, MisconfigurationsSayWhatToFix) {
  auto plain = Daemon::Start({"--tcp=127.0.0.1:0"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  const int port = ListeningPort(**plain);
  ASSERT_GT(port, 0);
  auto member = Daemon::Start({"--tcp=127.0.0.1:0", absl::StrCat("--cluster=127.0.0.1:", port),
                               "--host-id=lost"});
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->WaitForOutput("event=cluster_state state=unavailable host_id=lost",
                                       kPatience))
      << (*member)->output();
  EXPECT_NE((*member)->output().find(absl::StrCat(
                "UNIMPLEMENTED: coordinator 127.0.0.1:", port,
                ": it does not serve the cluster coordinator (collectived.v1.Cluster); point "
                "--cluster at a daemon started with --coordinator")),
            std::string::npos)
      << (*member)->output();
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  for (const Case& c :
       {Case{{"--tcp=127.0.0.1:0", "--coordinator", "--cluster=etcd://127.0.0.1:2379"},
             "name two coordinators"},
        Case{{"--tcp=127.0.0.1:0", "--cluster=etcd://127.0.0.1"}, "is not HOST:PORT"},
        Case{{"--tcp=127.0.0.1:0", "--cluster=etcd://10.1.2.3:2379"}, "--cluster-plaintext"}}) {
    auto d = Daemon::Start(c.flags);
    ASSERT_FALSE(d.ok()) << Join(c.flags);
    EXPECT_NE(d.status().message().find(c.message), std::string::npos)
        << Join(c.flags) << ": " << d.status();
  }
}

// Flags that cannot work are refused at start, with a message.
TEST(ClusterDaemonsTest, BadClusterFlagsAreRefusedAtStart) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::string dir = MakeTempDir();
  const std::string empty_token = dir + "/empty";
  std::ofstream(empty_token).close();
  const std::vector<Case> cases = {
      {{"--coordinator"}, "need --tcp"},
      {{"--cluster=127.0.0.1:1"}, "need --tcp"},
      {{"--tcp=127.0.0.1:0", "--cluster=127.0.0.1:1", "--host-id=bad/id"}, "--host-id"},
      {{"--tcp=127.0.0.1:0", "--cluster=10.1.2.3:7000"}, "--cluster-plaintext"},
      {{"--tcp=127.0.0.1:0", "--cluster=127.0.0.1:1", "--cluster-advertise=a b:1"},
       "--cluster-advertise"},
      {{"--tcp=0.0.0.0:0", "--tcp-insecure", "--coordinator"}, "--cluster-token-file"},
      {{"--tcp=127.0.0.1:0", "--coordinator", "--cluster-lease-ms=10"}, "--cluster-lease-ms"},
      {{"--tcp=127.0.0.1:0", "--coordinator", "--cluster-chunk-bytes=4095"},
       "--cluster-chunk-bytes"},
      {{"--tcp=127.0.0.1:0", "--coordinator", "--cluster-replicate-bytes=-1"},
       "--cluster-replicate-bytes must be >= 0"},
      {{"--tcp=127.0.0.1:0", "--coordinator", "--cluster-token-file=" + empty_token}, "is empty"},
  };
  for (const Case& c : cases) {
    auto d = Daemon::Start(c.flags);
    ASSERT_FALSE(d.ok()) << Join(c.flags);
    EXPECT_NE(d.status().message().find(c.message), std::string::npos)
        << Join(c.flags) << ": " << d.status();
  }
}

}  // namespace
}  // namespace collectived::testing
