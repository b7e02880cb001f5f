// Two daemons as two hosts in two Linux network namespaces joined by a veth
// pair: a real (virtual) link between them, which the test can slow down
// (tc tbf) and cut (ip link set ... down), and a hostile process on host a
// that throws garbage at every port the daemon opens while meshes form and
// run. Host a (10.77.N.1) serves the
// coordinator; host b (10.77.N.2) joins it; each member is an SDK client of
// its host's daemon through the daemon's Unix socket (path sockets work
// across network namespaces).
//
// Needs root and iproute2 (CI runs as root); skipped, saying why, elsewhere.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectived/client.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

// Runs `script` with /bin/sh (its errors in its output).
absl::StatusOr<std::string> Sh(const std::string& script) {
  return RunShell(script + " 2>&1", absl::Seconds(30));
}

class NetnsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (!Sh("command -v ip && command -v tc").ok()) {
      GTEST_SKIP() << "needs iproute2 (ip, tc)";
    }
    const int id = getpid() % 100000;
    subnet_ = absl::StrCat("10.77.", getpid() % 200 + 20);
    ns_a_ = absl::StrCat("cd-a-", id);
    ns_b_ = absl::StrCat("cd-b-", id);
    veth_a_ = absl::StrCat("cda", id);
    veth_b_ = absl::StrCat("cdb", id);
    auto made = Sh(absl::StrCat(
        "set -e; ip netns add ", ns_a_, "; ip netns add ", ns_b_, "; ip link add ", veth_a_,
        " type veth peer name ", veth_b_, "; ip link set ", veth_a_, " netns ", ns_a_,
        "; ip link set ", veth_b_, " netns ", ns_b_, "; ip -n ", ns_a_, " addr add ", subnet_,
        ".1/24 dev ", veth_a_, "; ip -n ", ns_b_, " addr add ", subnet_, ".2/24 dev ", veth_b_,
        "; for n in ", ns_a_, " ", ns_b_, "; do ip -n $n link set lo up; done; ip -n ", ns_a_,
        " link set ", veth_a_, " up; ip -n ", ns_b_, " link set ", veth_b_, " up"));
    if (!made.ok()) {
      // A container without CAP_NET_ADMIN, or no netns support.
      TearDown();
      GTEST_SKIP() << "cannot create network namespaces here: " << made.status();
    }
    created_ = true;
  }

  void TearDown() override {
    daemons_.clear();  // SIGKILL, before their namespaces go
    if (!ns_a_.empty()) {
      (void)Sh(absl::StrCat("ip netns del ", ns_a_, " ; ip netns del ", ns_b_, " ; true"));
    }
  }

  // Starts host a (the coordinator) and host b; false (a test failure) if
  // they do not form a cluster.
  void StartHosts() {
    const std::string dir = MakeTempDir();
    const std::string token = dir + "/token";
    std::ofstream(token) << "netns-test-token\n";
    const std::vector<std::string> common = {"--tcp-insecure", "--cluster-token-file=" + token,
                                             "--cluster-lease-ms=1000"};
    std::vector<std::string> a = {absl::StrCat("--tcp=", subnet_, ".1:7070"), "--coordinator",
                                  "--host-id=a"};
    std::vector<std::string> b = {absl::StrCat("--tcp=", subnet_, ".2:7070"),
                                  absl::StrCat("--cluster=", subnet_, ".1:7070"),
                                  "--cluster-plaintext", "--host-id=b"};
    a.insert(a.end(), common.begin(), common.end());
    b.insert(b.end(), common.begin(), common.end());
    for (const auto& [ns, flags] : {std::pair{ns_a_, a}, std::pair{ns_b_, b}}) {
      auto d = Daemon::StartWrapped({"/usr/bin/env", "ip", "netns", "exec", ns}, flags);
      ASSERT_TRUE(d.ok()) << d.status();
      daemons_.push_back(*std::move(d));
    }
    for (const char* h : {"a", "b"}) {
      Daemon& d = *daemons_[h[0] - 'a'];
      ASSERT_TRUE(d.WaitForOutput(absl::StrCat("event=cluster_state state=joined host_id=", h),
                                  absl::Seconds(30)))
          << d.output();
    }
  }

  // Member i (0 on host a, 1 on host b) of mesh `name` {x: 2}.
  void JoinMembers(const std::string& name, absl::Duration op_timeout) {
    std::vector<std::thread> threads;
    std::string errors[2];
    clients_.resize(2);
    meshes_.resize(2);
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto c = Client::Connect({.socket_path = daemons_[i]->socket()});
        if (!c.ok()) {
          errors[i] = c.status().ToString();
          return;
        }
        auto m = (*c)->JoinMesh({.name = name, .axes = {{"x", 2}}, .coordinate = {i},
                                 .join_timeout = absl::Seconds(20), .op_timeout = op_timeout});
        if (!m.ok()) {
          errors[i] = m.status().ToString();
          return;
        }
        clients_[i] = *std::move(c);
        meshes_[i] = *std::move(m);
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(errors[0], "");
    ASSERT_EQ(errors[1], "");
  }

  // psum of `count` floats (member i holds i + 1 + k % 7 at k) on both
  // members; their statuses and the time it took.
  std::vector<absl::Status> Psum(int64_t count, std::vector<Buffer>& bufs, absl::Duration* took) {
    std::vector<absl::Status> st(2);
    std::vector<std::thread> threads;
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto x = bufs[i].as<float>();
        for (int64_t k = 0; k < count; ++k) x[k] = static_cast<float>(i + 1 + k % 7);
        st[i] = meshes_[i]->psum(Array::Of<float>(bufs[i], {count}), "x");
      });
    }
    for (auto& t : threads) t.join();
    *took = absl::Now() - t0;
    return st;
  }

  std::string subnet_, ns_a_, ns_b_, veth_a_, veth_b_;
  bool created_ = false;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<Mesh>> meshes_;
};

TEST_F(NetnsClusterTest, ASlowLinkKeepsResultsExactAndACutLinkIsNamedAtTheOpTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartHosts());
  constexpr absl::Duration kOpTimeout = absl::Seconds(3);
  ASSERT_NO_FATAL_FAILURE(JoinMembers("over-veth", kOpTimeout));
  constexpr int64_t kCount = int64_t{1} << 20;  // 4 MiB of float32
  std::vector<Buffer> bufs;
  for (int i = 0; i < 2; ++i) {
    auto b = clients_[i]->Allocate(kCount * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    bufs.push_back(*std::move(b));
  }
  absl::Duration took;
  auto check = [&](const char* what) {
    for (int i = 0; i < 2; ++i) {
      auto x = bufs[i].as<float>();
      for (int64_t k = 0; k < kCount; k += 4099) {
        ASSERT_EQ(x[k], static_cast<float>(3 + 2 * (k % 7))) << what << " member " << i << " k " << k;
      }
    }
  };
  auto st = Psum(kCount, bufs, &took);
  ASSERT_TRUE(st[0].ok() && st[1].ok()) << st[0] << " / " << st[1];
  check("full speed");
  std::printf("psum of 4 MiB over the veth link: %s\n", absl::FormatDuration(took).c_str());

  // 200 Mbit/s each way: the same op, slower, the same bits.
  ASSERT_TRUE(Sh(absl::StrCat("ip netns exec ", ns_a_, " tc qdisc add dev ", veth_a_,
                              " root tbf rate 200mbit burst 256kb latency 100ms && ip netns exec ",
                              ns_b_, " tc qdisc add dev ", veth_b_,
                              " root tbf rate 200mbit burst 256kb latency 100ms"))
                  .ok());
  st = Psum(kCount, bufs, &took);
  ASSERT_TRUE(st[0].ok() && st[1].ok()) << st[0] << " / " << st[1];
  check("at 200 Mbit/s");
  std::printf("psum of 4 MiB at 200 Mbit/s: %s\n", absl::FormatDuration(took).c_str());

  // The link goes down: neither side hears from the other; each member is
  // told at the op timeout, naming the other host.
  ASSERT_TRUE(Sh(absl::StrCat("ip -n ", ns_a_, " link set ", veth_a_, " down")).ok());
  st = Psum(1024, bufs, &took);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(st[i]) || absl::IsAborted(st[i])) << i << ": " << st[i];
    const char* other = i == 0 ? "host b" : "host a";
    EXPECT_NE(st[i].message().find(other), std::string::npos) << i << ": " << st[i];
  }
  EXPECT_LT(took, kOpTimeout + absl::Seconds(10));
  std::printf("link cut: both members told after %s (op timeout %s): %s | %s\n",
              absl::FormatDuration(took).c_str(), absl::FormatDuration(kOpTimeout).c_str(),
              std::string(st[0].message()).c_str(), std::string(st[1].message()).c_str());
}

// The TCP ports listening on `ip` in the calling thread's network
// namespace (/proc/thread-self/net/tcp).
std::set<int> ListeningPorts(const std::string& ip) {
  std::set<int> ports;
  in_addr want{};
  inet_pton(AF_INET, ip.c_str(), &want);
  std::ifstream in("/proc/thread-self/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    f >> slot >> local >> remote >> state;
    if (state != "0A") continue;  // LISTEN
    const size_t colon = local.find(':');
    const uint32_t addr = static_cast<uint32_t>(std::stoul(local.substr(0, colon), nullptr, 16));
    if (addr != want.s_addr && addr != 0) continue;
    ports.insert(static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16)));
  }
  return ports;
}

// What a stranger sends: garbage, an HTTP request, a Gloo pair's preamble
// (what ended a daemon over Gloo), a collectived hello for another mesh,
// silence.
std::vector<std::string> HostilePayloads() {
  std::string gloo(48, '\0');  // six size_t: nbytes, opcode, slot, offset, length, roffset
  gloo[0] = 48;
  gloo[16] = 1;
  gloo[32] = 8;
  std::string hello = "CDLINK01";
  hello += std::string(4 * 4, '\0');
  hello += std::string(64, '\x5a');
  return {"\x01\x02\x03garbage\xff\xfe", "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n", gloo, hello,
          std::string(4096, '\x7f'), ""};
}

TEST_F(NetnsClusterTest, HostileConnectionsToEveryPortNeitherEndADaemonNorTakeAPair) {
  ASSERT_NO_FATAL_FAILURE(StartHosts());
  const std::string a_ip = subnet_ + ".1";
  // The stranger: a thread of this process moved into host a's network
  // namespace (a local process there), that watches for every port a's
  // daemon listens on and connects to each, again and again, with each
  // payload.
  std::atomic<bool> stop{false};
  std::atomic<int> connections{0}, ports_seen{0};
  std::thread stranger([&] {
    const int ns = open(absl::StrCat("/var/run/netns/", ns_a_).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) return;
    close(ns);
    const std::vector<std::string> payloads = HostilePayloads();
    std::set<int> seen;
    size_t n = 0;
    while (!stop.load()) {
      std::set<int> ports = ListeningPorts(a_ip);
      ports.insert(7070);  // the gRPC listener (an IPv6 socket: not in /proc/net/tcp)
      for (int port : ports) {
        if (seen.insert(port).second) ports_seen.fetch_add(1);
        for (int k = 0; k < 2; ++k) {
          const int fd = socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in sa{};
          sa.sin_family = AF_INET;
          sa.sin_port = htons(static_cast<uint16_t>(port));
          inet_pton(AF_INET, a_ip.c_str(), &sa.sin_addr);
          if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
            connections.fetch_add(1);
            const std::string& p = payloads[n++ % payloads.size()];
            (void)!send(fd, p.data(), p.size(), MSG_NOSIGNAL);
          }
          close(fd);
        }
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  // Host b's side of the link is slowed to 256 kbit/s, so that its
  // connections to a mesh's listener on host a take tens of milliseconds:
  // the stranger, polling every 0.2 ms, gets its connections in while the
  // listener is open.
  ASSERT_TRUE(Sh(absl::StrCat("ip netns exec ", ns_b_, " tc qdisc add dev ", veth_b_,
                              " root tbf rate 256kbit burst 1600 latency 500ms"))
                  .ok());
  // Meanwhile meshes form, run and leave, one after the other.
  constexpr int kMeshes = 12;
  for (int round = 0; round < kMeshes; ++round) {
    SCOPED_TRACE(absl::StrCat("mesh ", round));
    ASSERT_NO_FATAL_FAILURE(JoinMembers(absl::StrCat("besieged-", round), absl::Seconds(20)));
    std::vector<Buffer> bufs;
    for (int i = 0; i < 2; ++i) {
      auto b = clients_[i]->Allocate(64 * sizeof(float));
      ASSERT_TRUE(b.ok()) << b.status();
      bufs.push_back(*std::move(b));
    }
    absl::Duration took;
    for (int op = 0; op < 3; ++op) {
      auto st = Psum(64, bufs, &took);
      ASSERT_TRUE(st[0].ok() && st[1].ok()) << st[0] << " / " << st[1];
      for (int i = 0; i < 2; ++i) {
        for (int64_t k = 0; k < 64; ++k) {
          ASSERT_EQ(bufs[i].as<float>()[k], static_cast<float>(3 + 2 * (k % 7))) << "member " << i;
        }
      }
    }
    meshes_.clear();
    clients_.clear();
  }
  stop.store(true);
  stranger.join();
  // The stranger reached the data ports of meshes forming (not only the
  // gRPC port), and both daemons are alive and serving.
  EXPECT_GT(ports_seen.load(), 1) << "the stranger never saw a mesh's listener";
  EXPECT_GT(connections.load(), 0);
  for (auto& d : daemons_) {
    EXPECT_EQ(d->output().find("terminate"), std::string::npos) << d->output();
    auto c = Client::Connect({.socket_path = d->socket()});
    EXPECT_TRUE(c.ok()) << c.status();
  }
  // The log is read as it is waited for.
  EXPECT_TRUE(daemons_[0]->WaitForOutput("event=cluster_connection_refused", absl::Seconds(10)))
      << "no refusal logged: " << daemons_[0]->output();
  (void)daemons_[0]->WaitForOutput("<read what came>", absl::Milliseconds(200));
  const std::string& log = daemons_[0]->output();
  const size_t refused = log.find("event=cluster_connection_refused");
  if (refused != std::string::npos) {
    EXPECT_NE(log.find(absl::StrCat("peer=", a_ip, ":"), refused), std::string::npos) << log;
  }
  int refusals = 0;
  std::map<std::string, int> reasons;
  for (size_t at = log.find("cluster_connection_refused"); at != std::string::npos;
       at = log.find("cluster_connection_refused", at + 1)) {
    ++refusals;
    const size_t r = log.find("reason=", at);
    const size_t end = log.find('\n', at);
    if (r != std::string::npos && r < end) ++reasons[log.substr(r + 7, std::min<size_t>(end - r - 7, 60))];
  }
  std::printf("hostile peer: %d connections to %d ports of host a while %d meshes formed and "
              "ran; %d refusals logged:\n",
              connections.load(), ports_seen.load(), kMeshes, refusals);
  for (const auto& [reason, n] : reasons) std::printf("  %4d  %s\n", n, reason.c_str());
}

}  // namespace
}  // namespace collectived::testing
