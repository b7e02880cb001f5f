// Members of a one-axis mesh made in the test process with the SDK: each
// its own Client (session), its Mesh and a host buffer. For tests that need
// real sessions to look at (collectivectl, metrics).
#ifndef COLLECTIVED_TESTS_CTL_SDK_MEMBERS_H_
#define COLLECTIVED_TESTS_CTL_SDK_MEMBERS_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "collectived/client.h"

namespace collectived::testing {

struct SdkMembers {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<Buffer> buffers;
};

// `n` clients named <mesh>-<i> on `socket` join mesh `mesh` (axis "x" of
// size n) concurrently, and each allocates `buffer_bytes` of host memory.
// `op_timeout`: the mesh's (zero: the daemon's default).
inline absl::Status MakeSdkMembers(const std::string& socket, const std::string& mesh, int n,
                                   size_t buffer_bytes, SdkMembers* out,
                                   absl::Duration op_timeout = absl::ZeroDuration()) {
  for (int i = 0; i < n; ++i) {
    auto c = Client::Connect({.socket_path = socket, .client_name = absl::StrCat(mesh, "-", i)});
    if (!c.ok()) return c.status();
    out->clients.push_back(*std::move(c));
  }
  std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> joined(n);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        joined[i] = out->clients[i]->JoinMesh(
            {.name = mesh, .axes = {{"x", n}}, .coordinate = {i}, .op_timeout = op_timeout});
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < n; ++i) {
    if (!joined[i].ok()) return joined[i].status();
    out->meshes.push_back(*std::move(joined[i]));
    auto b = out->clients[i]->Allocate(buffer_bytes);
    if (!b.ok()) return b.status();
    out->buffers.push_back(*std::move(b));
  }
  return absl::OkStatus();
}

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_CTL_SDK_MEMBERS_H_
