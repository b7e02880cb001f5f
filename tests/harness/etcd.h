// Real etcd for tests: one node or a cluster of several on loopback, each
// node its own process (/usr/bin/etcd), data dir and pair of ports, with
// fast elections (heartbeat 50 ms, election timeout 500 ms). Optionally TLS
// on the client port with client certificates (made with `openssl` in the
// cluster's temp dir) and authentication (user root, etcdctl auth enable).
//
// A node dies with the test process (setpriv --pdeathsig, where setpriv is
// installed), so a crashed test leaves no etcd behind.
//
// Ports are picked among the ports below the kernel's ephemeral range that
// nothing listens on (UnusedFixedPort); a node that loses the race for one
// to another test's process fails to bind, and the whole cluster starts
// again on other ports. Every wait is bounded. Nodes write their log to a
// file in the temp dir (never to a pipe that could fill up); errors quote
// its tail.
//
// Thread model: an EtcdServers is used by the test's main thread only.
#ifndef COLLECTIVED_TESTS_HARNESS_ETCD_H_
#define COLLECTIVED_TESTS_HARNESS_ETCD_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/harness/harness.h"

namespace collectived::testing {

// Why tests that need etcd cannot run here; "" when they can.
inline std::string EtcdSkipReason() {
  if (!RunShell("command -v etcd && command -v etcdctl", absl::Seconds(10)).ok()) {
    return "etcd not installed: apt-get install etcd-server etcd-client";
  }
  return "";
}

struct EtcdServersOptions {
  int nodes = 1;
  // TLS on the client port; clients must present a certificate signed by
  // the cluster's CA (ca_file, client_cert_file, client_key_file).
  bool tls = false;
  // Non-empty: authentication is enabled, with user "root" of this password.
  std::string root_password;
  // Seconds a simple auth token lives unused (etcd's --auth-token-ttl).
  int auth_token_ttl_s = 300;
};

class EtcdServers {
 public:
  // Starts the nodes and waits (at most `patience`) until every node knows
  // the same leader (and, with auth, until auth is enabled).
  static absl::StatusOr<std::unique_ptr<EtcdServers>> Start(
      EtcdServersOptions options = {}, absl::Duration patience = absl::Seconds(30)) {
    std::unique_ptr<EtcdServers> c(new EtcdServers(std::move(options)));
    c->dir_ = MakeTempDir();
    if (c->options_.tls) {
      if (absl::Status st = c->MakeCertificates(); !st.ok()) return st;
    }
    absl::Status last;
    for (int round = 0; round < 5; ++round) {
      last = c->StartNodes(round, patience);
      if (last.ok()) break;
      c->KillAll();
      if (!absl::StrContains(last.message(), "address already in use")) return last;
    }
    if (!last.ok()) return last;
    if (!c->options_.root_password.empty()) {
      if (absl::Status st = c->EnableAuth(); !st.ok()) return st;
    }
    return c;
  }

  ~EtcdServers() {
    KillAll();
    if (!dir_.empty()) (void)RunShell("rm -rf '" + dir_ + "'", absl::Seconds(30));
  }
  EtcdServers(const EtcdServers&) = delete;
  EtcdServers& operator=(const EtcdServers&) = delete;

  int size() const { return static_cast<int>(nodes_.size()); }
  // The client endpoint of node `i`, "127.0.0.1:port".
  std::string endpoint(int i) const { return absl::StrCat("127.0.0.1:", nodes_[i].client_port); }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  bool running(int i) const { return nodes_[i].child != nullptr; }
  uint64_t member_id(int i) const { return nodes_[i].member_id; }
  const std::string& dir() const { return dir_; }
  std::string ca_file() const { return dir_ + "/ca.crt"; }
  std::string client_cert_file() const { return dir_ + "/client.crt"; }
  std::string client_key_file() const { return dir_ + "/client.key"; }

  // SIGKILLs node `i` and reaps it.
  void Kill(int i) {
    Node& n = nodes_[i];
    if (n.child == nullptr) return;
    n.child->Signal(SIGKILL);
    (void)n.child->Wait(absl::Seconds(10));
    n.child.reset();
  }
  void KillAll() {
    for (int i = 0; i < size(); ++i) Kill(i);
  }

  // Starts node `i` again from its data dir (same name and ports) and waits
  // until every running node knows the same leader.
  absl::Status Restart(int i, absl::Duration patience = absl::Seconds(20)) {
    if (running(i)) return absl::FailedPreconditionError(absl::StrCat("node ", i, " is running"));
    if (absl::Status st = Spawn(i); !st.ok()) return st;
    return WaitHealthy(patience);
  }

  // Starts every node that is not running (a cluster that lost its quorum
  // needs them all back at once) and waits until they agree on a leader.
  absl::Status RestartAll(absl::Duration patience = absl::Seconds(30)) {
    for (int i = 0; i < size(); ++i) {
      if (running(i)) continue;
      if (absl::Status st = Spawn(i); !st.ok()) return st;
    }
    return WaitHealthy(patience);
  }

  // The index of the node that leads, as every running node agrees, waiting
  // at most `patience` for an agreement (an election).
  absl::StatusOr<int> Leader(absl::Duration patience = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + patience;
    absl::Status last;
    for (;;) {
      absl::StatusOr<int> leader = AgreedLeader();
      if (leader.ok()) return leader;
      last = leader.status();
      // A node that exited does not come back by waiting.
      if (last.code() == absl::StatusCode::kFailedPrecondition || absl::Now() > deadline) {
        return last;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  // Waits until every running node knows the same leader, itself running.
  absl::Status WaitHealthy(absl::Duration patience) { return Leader(patience).status(); }

  // Runs etcdctl against node `i` (with the cluster's TLS files and root
  // credentials) with `args`; its output.
  absl::StatusOr<std::string> Etcdctl(int i, const std::string& args,
                                      absl::Duration timeout = absl::Seconds(10)) {
    return RunShell(EtcdctlPrefix(i) + " " + args + " 2>&1", timeout);
  }

  // The last `bytes` of node `i`'s log.
  std::string LogTail(int i, size_t bytes = 3000) const {
    std::ifstream in(nodes_[i].log);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string all = ss.str();
    return all.size() > bytes ? all.substr(all.size() - bytes) : all;
  }

 private:
  struct Node {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log;
    std::unique_ptr<Child> child;
    uint64_t member_id = 0;
  };

  explicit EtcdServers(EtcdServersOptions options) : options_(std::move(options)) {}

  static std::string Scheme(bool tls) { return tls ? "https://" : "http://"; }

  absl::Status MakeCertificates() {
    // EC keys: fast to make. The server's certificate names 127.0.0.1 (gRPC
    // and Go check the IP SAN); the client's is for client auth, CN root.
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = absl::StrCat(
        "set -e; cd '", dir_, "'; ", "openssl req -x509 ", key,
        " -keyout ca.key -out ca.crt -days 2 -subj /CN=etcd-test-ca; ", "openssl req ", key,
        " -keyout server.key -out server.csr -subj /CN=localhost; ",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,"
        "clientAuth\\n' > server.ext; ",
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out server.crt -days 2 -extfile server.ext; ",
        "openssl req ", key, " -keyout client.key -out client.csr -subj /CN=root; ",
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; ",
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out client.crt -days 2 -extfile client.ext");
    absl::StatusOr<std::string> out = RunShell(script, absl::Seconds(30));
    return out.ok() ? absl::OkStatus()
                    : absl::InternalError(absl::StrCat("making test certificates failed: ",
                                                       out.status().message()));
  }

  // Starts every node (round `round`: fresh ports and data dirs) and waits
  // until they agree on a leader.
  absl::Status StartNodes(int round, absl::Duration patience) {
    nodes_.clear();
    nodes_.resize(options_.nodes);
    std::vector<int> used;
    const auto pick = [&]() {
      for (;;) {
        const int p = UnusedFixedPort();
        if (p < 0) return p;
        if (std::find(used.begin(), used.end(), p) == used.end()) {
          used.push_back(p);
          return p;
        }
      }
    };
    std::vector<std::string> peers;
    for (int i = 0; i < options_.nodes; ++i) {
      Node& n = nodes_[i];
      n.name = absl::StrCat("n", i);
      n.client_port = pick();
      n.peer_port = pick();
      if (n.client_port < 0 || n.peer_port < 0) {
        return absl::InternalError("no free loopback port for etcd");
      }
      n.data_dir = absl::StrCat(dir_, "/r", round, "-", n.name);
      n.log = absl::StrCat(dir_, "/r", round, "-", n.name, ".log");
      peers.push_back(absl::StrCat(n.name, "=http://127.0.0.1:", n.peer_port));
    }
    initial_cluster_ = absl::StrJoin(peers, ",");
    cluster_token_ =
        absl::StrCat("cdtest-", getpid(), "-", reinterpret_cast<uintptr_t>(this), "-", round);
    for (int i = 0; i < options_.nodes; ++i) {
      if (absl::Status st = Spawn(i); !st.ok()) return st;
    }
    absl::Status st = WaitHealthy(patience);
    if (!st.ok()) {
      std::string logs;
      for (int i = 0; i < size(); ++i) {
        absl::StrAppend(&logs, "\n--- log of etcd node ", i, " (", endpoint(i), "):\n", LogTail(i));
      }
      return absl::Status(st.code(),
                          absl::StrCat("etcd did not become healthy: ", st.message(), logs));
    }
    for (int i = 0; i < size(); ++i) {
      absl::StatusOr<std::pair<uint64_t, uint64_t>> s = MemberAndLeader(i);
      if (!s.ok()) return s.status();
      nodes_[i].member_id = s->first;
    }
    return absl::OkStatus();
  }

  absl::Status Spawn(int i) {
    Node& n = nodes_[i];
    const std::string client_url = absl::StrCat(Scheme(options_.tls), "127.0.0.1:", n.client_port);
    const std::string peer_url = absl::StrCat("http://127.0.0.1:", n.peer_port);
    // setpriv --pdeathsig: a test that crashes takes its etcd with it.
    static const bool setpriv = RunShell("command -v setpriv", absl::Seconds(10)).ok();
    std::string cmd = absl::StrCat(
        "exec ", setpriv ? "setpriv --pdeathsig KILL " : "", "etcd --name ", n.name,
        " --data-dir '", n.data_dir, "' --listen-client-urls ", client_url,
        " --advertise-client-urls ", client_url, " --listen-peer-urls ", peer_url,
        " --initial-advertise-peer-urls ", peer_url, " --initial-cluster ", initial_cluster_,
        " --initial-cluster-state new --initial-cluster-token ", cluster_token_,
        " --heartbeat-interval 50 --election-timeout 500 --logger zap --log-outputs stderr",
        " --auth-token-ttl ", options_.auth_token_ttl_s);
    if (options_.tls) {
      absl::StrAppend(&cmd, " --cert-file '", dir_, "/server.crt' --key-file '", dir_,
                      "/server.key' --trusted-ca-file '", ca_file(), "' --client-cert-auth");
    }
    absl::StrAppend(&cmd, " >>'", n.log, "' 2>&1");
    absl::StatusOr<std::unique_ptr<Child>> child = Child::Start({"/bin/sh", "-c", cmd});
    if (!child.ok()) return child.status();
    n.child = *std::move(child);
    return absl::OkStatus();
  }

  // True if node `i`'s process has exited (it stays unreaped).
  bool Exited(int i) {
    siginfo_t info{};
    const pid_t pid = nodes_[i].child->pid();
    return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid;
  }

  std::string EtcdctlPrefix(int i) const {
    std::string out = absl::StrCat("ETCDCTL_API=3 etcdctl --dial-timeout=1s --command-timeout=2s",
                                   " --endpoints=", Scheme(options_.tls), endpoint(i));
    if (options_.tls) {
      absl::StrAppend(&out, " --cacert '", ca_file(), "' --cert '", client_cert_file(), "' --key '",
                      client_key_file(), "'");
    }
    if (auth_enabled_) absl::StrAppend(&out, " --user 'root:", options_.root_password, "'");
    return out;
  }

  // (member id, leader id) as node `i` reports them (etcdctl endpoint status).
  absl::StatusOr<std::pair<uint64_t, uint64_t>> MemberAndLeader(int i) {
    absl::StatusOr<std::string> out = Etcdctl(i, "endpoint status -w json", absl::Seconds(5));
    if (!out.ok()) return out.status();
    const auto field = [&](const std::string& name) -> uint64_t {
      const size_t at = out->find("\"" + name + "\":");
      if (at == std::string::npos) return 0;
      const size_t begin = at + name.size() + 3;
      size_t end = begin;
      while (end < out->size() && (*out)[end] >= '0' && (*out)[end] <= '9') ++end;
      uint64_t v = 0;
      return absl::SimpleAtoi(out->substr(begin, end - begin), &v) ? v : 0;
    };
    const uint64_t member = field("member_id");
    if (member == 0) {
      return absl::InternalError(absl::StrCat("etcdctl endpoint status of ", endpoint(i),
                                              " printed no member_id: ", *out));
    }
    return std::make_pair(member, field("leader"));
  }

  absl::StatusOr<int> AgreedLeader() {
    // A node that exited first: it does not come back by waiting.
    for (int i = 0; i < size(); ++i) {
      if (!running(i) || !Exited(i)) continue;
      const std::string log = LogTail(i);
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd node ", i, " (", endpoint(i), ") exited",
          absl::StrContains(log, "address already in use") ? " (address already in use)" : "", ": ",
          log));
    }
    uint64_t leader = 0;
    for (int i = 0; i < size(); ++i) {
      if (!running(i)) continue;
      absl::StatusOr<std::pair<uint64_t, uint64_t>> s = MemberAndLeader(i);
      if (!s.ok()) return s.status();
      if (s->second == 0) {
        return absl::UnavailableError(absl::StrCat("etcd node ", i, " has no leader"));
      }
      if (leader != 0 && s->second != leader) {
        return absl::UnavailableError("the etcd nodes do not agree on a leader yet");
      }
      leader = s->second;
      if (nodes_[i].member_id == 0) nodes_[i].member_id = s->first;
    }
    for (int i = 0; i < size(); ++i) {
      if (running(i) && nodes_[i].member_id == leader) return i;
    }
    return absl::UnavailableError("the leader the etcd nodes name is not running");
  }

  absl::Status EnableAuth() {
    for (const std::string& args :
         {absl::StrCat("user add 'root:", options_.root_password, "'"),
          std::string("user grant-role root root"), std::string("auth enable")}) {
      absl::StatusOr<std::string> out = Etcdctl(0, args);
      if (!out.ok()) return out.status();
    }
    auth_enabled_ = true;
    return absl::OkStatus();
  }

  const EtcdServersOptions options_;
  std::string dir_;
  std::vector<Node> nodes_;
  std::string initial_cluster_;
  std::string cluster_token_;
  bool auth_enabled_ = false;
};

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_ETCD_H_
