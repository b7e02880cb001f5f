// A cluster of real daemons on loopback, each its own "host" (its own
// socket, TCP port and host id): host 0 serves the coordinator and is a host
// too; the others join it. For tests that spread a mesh's members over
// several daemons.
#ifndef COLLECTIVED_TESTS_HARNESS_CLUSTER_H_
#define COLLECTIVED_TESTS_HARNESS_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/harness/harness.h"

namespace collectived::testing {

// The TCP port from the daemon's "listening" line ("(port N)"); 0 if absent
// within `patience`.
inline int ListeningPort(Daemon& d, absl::Duration patience = absl::Seconds(30)) {
  if (!d.WaitForOutput("event=listening", patience)) return 0;
  const std::string& out = d.output();
  const size_t at = out.find("(port ", out.find("event=listening"));
  if (at == std::string::npos) return 0;
  int port = 0;
  const size_t begin = at + 6;
  if (!absl::SimpleAtoi(out.substr(begin, out.find(')', begin) - begin), &port)) return 0;
  return port;
}

// `hosts` daemons with host ids h0, h1, ...; h0 serves the coordinator
// (leases of 1 s). Every daemon gets `flags` too, and runs through
// `wrapper(h)` when given (Daemon::StartWrapped: e.g. `env VAR=...`).
// Returns once every host has joined the cluster.
inline absl::StatusOr<std::vector<std::unique_ptr<Daemon>>> StartLoopbackCluster(
    int hosts, const std::vector<std::string>& flags = {},
    absl::Duration patience = absl::Seconds(30),
    const std::function<std::vector<std::string>(int)>& wrapper = nullptr) {
  const auto start = [&](int h, std::vector<std::string> f) {
    return wrapper ? Daemon::StartWrapped(wrapper(h), std::move(f)) : Daemon::Start(std::move(f));
  };
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::vector<std::string> f = {"--tcp=127.0.0.1:0", "--coordinator", "--host-id=h0",
                                "--cluster-lease-ms=1000"};
  f.insert(f.end(), flags.begin(), flags.end());
  auto coord = start(0, f);
  if (!coord.ok()) return coord.status();
  const int port = ListeningPort(**coord, patience);
  if (port == 0) return absl::InternalError("the coordinator has no port: " + (*coord)->output());
  daemons.push_back(*std::move(coord));
  for (int h = 1; h < hosts; ++h) {
    f = {"--tcp=127.0.0.1:0", absl::StrCat("--cluster=127.0.0.1:", port),
         absl::StrCat("--host-id=h", h)};
    f.insert(f.end(), flags.begin(), flags.end());
    auto d = start(h, f);
    if (!d.ok()) return d.status();
    daemons.push_back(*std::move(d));
  }
  for (int h = 0; h < hosts; ++h) {
    if (!daemons[h]->WaitForOutput(absl::StrCat("event=cluster_state state=joined host_id=h", h),
                                   patience)) {
      return absl::InternalError(
          absl::StrCat("host h", h, " did not join the cluster: ", daemons[h]->output()));
    }
  }
  return daemons;
}

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_CLUSTER_H_
