// collectived_demo: several processes run every jax.lax collective through
// the daemon and print what each member got.
//
//   collectived_demo [--socket=PATH] [--members=4]
//
// The parent starts one process per member (this same binary with --member=i),
// collects their output through pipes, and prints it in member order. It
// reproduces the pmap examples: members holding 0,1,2,3 get psum 6 and pmean
// 1.5; members holding 2,5,1,4 get pmax 5.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectived/client.h"

namespace {

using collectived::Array;
using collectived::AxisNames;

std::string Fmt(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

template <typename T>
std::string List(const T* p, size_t n) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < n; ++i) parts.push_back(Fmt(static_cast<float>(p[i])));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

#define CHECK_OK(expr)                                                        \
  do {                                                                        \
    absl::Status _st = (expr);                                                \
    if (!_st.ok()) {                                                          \
      std::fprintf(stderr, "member failed: %s: %s\n", #expr, _st.ToString().c_str()); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

int RunMember(const std::string& socket, int members, int me) {
  auto client = collectived::Client::Connect(
      {.socket_path = socket, .client_name = absl::StrCat("demo-", me)});
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto mesh = (*client)->JoinMesh({.name = "demo",
                                   .axes = {{"devices", members}},
                                   .coordinate = {me},
                                   .join_timeout = absl::Seconds(30)});
  if (!mesh.ok()) {
    std::fprintf(stderr, "join: %s\n", mesh.status().ToString().c_str());
    return 1;
  }
  collectived::Mesh& m = **mesh;
  auto buf = (*client)->Allocate(64 * 1024);
  if (!buf.ok()) {
    std::fprintf(stderr, "allocate: %s\n", buf.status().ToString().c_str());
    return 1;
  }
  const int n = members;
  const int i = m.axis_index("devices");
  float* x = buf->as<float>().data();
  float* y = x + 1024;
  auto scalar = Array::Of<float>(*buf, {});
  auto row = Array::Of<float>(*buf, {n});
  auto out = [&](std::vector<int64_t> shape) { return Array::Of<float>(*buf, shape, 1024 * 4); };

  std::printf("member %d: axis_index('devices') = %d, axis_size = %d\n", me, i,
              m.axis_size("devices"));
  // psum / pmean of arange(n): each member holds its index.
  x[0] = static_cast<float>(i);
  CHECK_OK(m.psum(scalar, "devices"));
  std::printf("member %d: psum(%d) = %s\n", me, i, Fmt(x[0]).c_str());
  x[0] = static_cast<float>(i);
  CHECK_OK(m.pmean(scalar, "devices"));
  std::printf("member %d: pmean(%d) = %s\n", me, i, Fmt(x[0]).c_str());
  // pmax / pmin of [2, 5, 1, 4, ...].
  const float values[] = {2, 5, 1, 4, 7, 3, 8, 6};
  const float mine = values[i % 8];
  x[0] = mine;
  CHECK_OK(m.pmax(scalar, "devices"));
  std::printf("member %d: pmax(%s) = %s\n", me, Fmt(mine).c_str(), Fmt(x[0]).c_str());
  x[0] = mine;
  CHECK_OK(m.pmin(scalar, "devices"));
  std::printf("member %d: pmin(%s) = %s\n", me, Fmt(mine).c_str(), Fmt(x[0]).c_str());
  // all_gather of the index: every member gets [0, 1, ..., n-1].
  x[0] = static_cast<float>(i);
  CHECK_OK(m.all_gather(Array::Of<float>(*buf, {1}), "devices", out({n}), {.tiled = true}));
  std::printf("member %d: all_gather(%d) = %s\n", me, i, List(y, n).c_str());
  // ppermute: a ring shift, i -> i+1.
  std::vector<std::pair<int, int>> ring;
  for (int s = 0; s < n; ++s) ring.emplace_back(s, (s + 1) % n);
  x[0] = static_cast<float>(10 * i);
  CHECK_OK(m.ppermute(scalar, "devices", ring));
  std::printf("member %d: ppermute(%d, shift +1) = %s\n", me, 10 * i, Fmt(x[0]).c_str());
  // psum_scatter: row j of the sum goes to member j.
  for (int j = 0; j < n; ++j) x[j] = static_cast<float>(i + j);
  std::string before = List(x, n);
  CHECK_OK(m.psum_scatter(row, "devices", out({}), {}));
  std::printf("member %d: psum_scatter(%s) = %s\n", me, before.c_str(), Fmt(y[0]).c_str());
  // all_to_all: element j goes to member j.
  for (int j = 0; j < n; ++j) x[j] = static_cast<float>(10 * i + j);
  before = List(x, n);
  CHECK_OK(m.all_to_all(row, "devices", {.split_axis = 0, .concat_axis = 0}));
  std::printf("member %d: all_to_all(%s) = %s\n", me, before.c_str(), List(x, n).c_str());
  // broadcast from member 0.
  x[0] = static_cast<float>(100 + i);
  CHECK_OK(m.broadcast(scalar, "devices", 0));
  std::printf("member %d: broadcast(%d, root 0) = %s\n", me, 100 + i, Fmt(x[0]).c_str());
  CHECK_OK(m.barrier());
  std::printf("member %d: barrier passed\n", me);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  int members = 4;
  int member = -1;
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    if (arg.rfind("--socket=", 0) == 0) {
      socket = arg.substr(9);
    } else if (arg.rfind("--members=", 0) == 0) {
      members = std::atoi(arg.c_str() + 10);
    } else if (arg.rfind("--member=", 0) == 0) {
      member = std::atoi(arg.c_str() + 9);
    } else {
      std::fprintf(stderr, "usage: %s [--socket=PATH] [--members=N]\n", argv[0]);
      return 2;
    }
  }
  if (members < 1 || members > 64) {
    std::fprintf(stderr, "--members must be 1..64\n");
    return 2;
  }
  if (member >= 0) return RunMember(socket, members, member);

  // Parent: one process per member, output gathered through pipes.
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int i = 0; i < members; ++i) {
    int p[2];
    if (pipe(p) != 0) return 1;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], STDOUT_FILENO);
      close(p[0]);
      close(p[1]);
      std::string m = absl::StrCat("--member=", i), n = absl::StrCat("--members=", members),
                  s = absl::StrCat("--socket=", socket);
      execl("/proc/self/exe", argv[0], m.c_str(), n.c_str(), s.c_str(), nullptr);
      _exit(127);
    }
    close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  std::vector<std::string> outputs(members);
  for (int i = 0; i < members; ++i) {
    char chunk[4096];
    ssize_t got;
    while ((got = read(fds[i], chunk, sizeof(chunk))) > 0) outputs[i].append(chunk, got);
    close(fds[i]);
  }
  int failed = 0;
  for (int i = 0; i < members; ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::printf("collectived demo: %d member processes, mesh 'demo' with axis 'devices'\n\n",
              members);
  for (int i = 0; i < members; ++i) std::fputs(outputs[i].c_str(), stdout);
  std::printf("\n%s\n", failed == 0 ? "all members completed every collective"
                                    : absl::StrCat(failed, " member(s) failed").c_str());
  return failed == 0 ? 0 : 1;
}
