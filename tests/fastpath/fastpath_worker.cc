// collectived_fastpath_worker: member processes for the fast-path tests.
//
//   --socket=S --mesh=NAME --members=N --member=I [--sessions=K] [--fast=0|1]
//   [--env-fast-path=V] --mode=M
//
// Joins mesh NAME (one axis "i" of N members) as member I (K sessions, one
// thread each, as members I..I+K-1 with --sessions) with
// ClientOptions::fast_path = --fast. COLLECTIVED_FAST_PATH is removed from the
// environment unless --env-fast-path sets it to V.
//
// Modes and their output lines (parsed by fastpath_test.cc):
//   ops     psum, all_gather, ppermute with known inputs:
//             FAST value=<0|1>
//             PSUM code=<CODE> values=<v,...>
//             GATHER code=<CODE> values=<v,...>
//             PPERMUTE code=<CODE> values=<v,...>
//   timing  a psum_async and an invalid op, then their OpFuture::timing():
//             FAST value=<0|1>
//             TIMING code=<CODE> submitted=<ns> taken=<ns> started=<ns> completed=<ns> reaped=<ns>
//             BAD_TIMING code=<CODE> submitted=... (same fields)
//             BARRIER code=<CODE>     (a final barrier: nobody leaves early)
//   big     eight ops submitted async, two of them ppermutes whose OpSpec is
//           larger than a queue slot (they go over gRPC), then waited for;
//           each member checks its results. With --sessions=1:
//             FAST value=<0|1>
//             SPEC big_bytes=<serialized size> limit=<fastq::kMaxOpBytes>
//             SEQ <sequence of each op, in submission order>
//             CODES <code of each op>
//             PATHS <fast|grpc for each op, from OpFuture::timing()>
//             VALUES a=<v> b=<v,v,v,v> gather=<first>..<last> gather_ok=<0|1>
//           and with any --sessions:
//             MEMBERS n=<K> ok=<members whose every check passed>
//             MEMBER_FAIL member=<i> why=<first failed check>     (per failure)
//   idle    20 psums, then IDLE_BEGIN, --idle-ms of sleep, IDLE_END; then
//           member 0 waits in a psum that member 1 submits --idle-ms late:
//             DELAY_BEGIN                         (member 1, before its sleep)
//             WAITED code=<CODE> wall_ms=<ms> cpu_ms=<this process's CPU during the wait>
//   cross   --role=p|q|fill: two meshes, ops in different orders (see RunCross):
//             FAST value=<0|1>                        (p, q)
//             B_SUBMITTED after_ms=<how long psum_async took to return>   (p)
//             B code=<CODE> [after_ms=<ms> (q)] sum=<v> msg=<message>
//             A code=<CODE> msg=<message>
//             MEMBERS n=<K> ok=<fillers whose op succeeded>   (fill)
//   stall   READY, then sleeps --idle-ms without submitting anything
//   wait    READY fast=<0|1>; psum_async (SUBMITTED); wait for it; then one more op:
//             RESULT code=<CODE> msg=<message>
//             AFTER code=<CODE> after_ms=<ms the second op took to fail>
// Every mode ends with DONE; exit status 0 unless setup failed.
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "collectived/client.h"
#include "collectived/v1/collective.pb.h"
#include "common/fast_queue.h"
#include "tests/harness/flags.h"

namespace {

using collectived::Array;
using collectived::OpFuture;

struct Flags : ::collectived::testing::MemberFlags {
  Flags() { mode = "ops"; }
  std::string env_fast_path, role;
  bool set_env = false;
  int sessions = 1;
  bool fast = true;
  int64_t idle_ms = 1000;
};

bool Parse(int argc, char** argv, Flags& f) {
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    auto value = [&](const char* name, std::string* out) {
      return ::collectived::testing::FlagValue(arg, name, out);
    };
    std::string v;
    if (::collectived::testing::ParseMemberFlag(arg, &f) || value("role", &f.role)) {
    } else if (value("env-fast-path", &f.env_fast_path)) {
      f.set_env = true;
    } else if (value("sessions", &v)) {
      f.sessions = std::atoi(v.c_str());
    } else if (value("fast", &v)) {
      f.fast = v != "0";
    } else if (value("idle-ms", &v)) {
      f.idle_ms = std::atoll(v.c_str());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return false;
    }
  }
  return !f.socket.empty() && !f.mesh.empty() && f.sessions >= 1;
}

std::mutex out_mu;
void Line(const std::string& s) {
  std::lock_guard<std::mutex> lock(out_mu);
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

std::string Code(const absl::Status& st) { return absl::StatusCodeToString(st.code()); }

int64_t ProcessCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

std::string TimingFields(const OpFuture& f) {
  const collectived::OpTiming t = f.timing();
  return absl::StrCat("submitted=", t.submitted_ns, " taken=", t.taken_ns,
                      " matched=", t.matched_ns, " ready=", t.ready_ns,
                      " started=", t.started_ns, " launched=", t.launched_ns,
                      " executed=", t.executed_ns, " completed=", t.completed_ns,
                      " reaped=", t.reaped_ns, " device=", t.device_ns);
}

template <typename T>
std::string Values(const collectived::Buffer& buf, size_t offset, size_t n) {
  const T* p = reinterpret_cast<const T*>(static_cast<const char*>(buf.data()) + offset);
  std::vector<T> v(p, p + n);
  return absl::StrJoin(v, ",");
}

struct Member {
  std::unique_ptr<collectived::Client> client;
  std::unique_ptr<collectived::Mesh> mesh;
  collectived::Buffer buf;
};

absl::StatusOr<Member> Setup(const Flags& f, int index, size_t bytes) {
  Member m;
  collectived::ClientOptions options;
  options.socket_path = f.socket;
  options.client_name = absl::StrCat("fastpath-", index);
  options.fast_path = f.fast;
  auto client = collectived::Client::Connect(options);
  if (!client.ok()) return client.status();
  m.client = *std::move(client);
  auto mesh = m.client->JoinMesh({.name = f.mesh,
                                  .axes = {{"i", f.members}},
                                  .coordinate = {index},
                                  .join_timeout = absl::Seconds(40)});
  if (!mesh.ok()) return mesh.status();
  m.mesh = *std::move(mesh);
  auto buf = m.client->Allocate(bytes);
  if (!buf.ok()) return buf.status();
  m.buf = *std::move(buf);
  return m;
}

// ---------------------------------------------------------------------------

int RunOps(const Flags& f, Member& m) {
  const int n = f.members, i = m.mesh->index();
  Line(absl::StrCat("FAST value=", m.client->fast_path() ? 1 : 0));
  // psum of int32[8]: member i holds (i+1)*(k+1).
  auto x = Array::Of<int32_t>(m.buf, {8}, 0);
  for (int k = 0; k < 8; ++k) x.data<int32_t>()[k] = (i + 1) * (k + 1);
  absl::Status st = m.mesh->psum(x, "i");
  Line(absl::StrCat("PSUM code=", Code(st), " values=", Values<int32_t>(m.buf, 0, 8)));
  // all_gather of int32[4] = i*100+k into int32[n,4].
  auto g_in = Array::Of<int32_t>(m.buf, {4}, 1024);
  auto g_out = Array::Of<int32_t>(m.buf, {n, 4}, 2048);
  for (int k = 0; k < 4; ++k) g_in.data<int32_t>()[k] = i * 100 + k;
  st = m.mesh->all_gather(g_in, "i", g_out);
  Line(absl::StrCat("GATHER code=", Code(st), " values=",
                    Values<int32_t>(m.buf, 2048, static_cast<size_t>(n) * 4)));
  // ppermute of f32[4] = i*10+k along the ring s -> s+1, out of place.
  auto p_in = Array::Of<float>(m.buf, {4}, 4096);
  auto p_out = Array::Of<float>(m.buf, {4}, 5120);
  for (int k = 0; k < 4; ++k) p_in.data<float>()[k] = static_cast<float>(i * 10 + k);
  std::vector<std::pair<int, int>> ring;
  for (int s = 0; s < n; ++s) ring.emplace_back(s, (s + 1) % n);
  st = m.mesh->ppermute(p_in, "i", ring, p_out);
  Line(absl::StrCat("PPERMUTE code=", Code(st), " values=", Values<float>(m.buf, 5120, 4)));
  return 0;
}

int RunTiming(const Flags& f, Member& m) {
  Line(absl::StrCat("FAST value=", m.client->fast_path() ? 1 : 0));
  auto x = Array::Of<float>(m.buf, {256}, 0);
  // One op first, so that the timed one is not the mesh's first.
  if (absl::Status st = m.mesh->psum(x, "i"); !st.ok()) {
    Line(absl::StrCat("WARMUP code=", Code(st), " msg=", st.message()));
  }
  OpFuture fut = m.mesh->psum_async(x, "i");
  absl::Status st = fut.Wait();
  Line(absl::StrCat("TIMING code=", Code(st), " ", TimingFields(fut)));
  // An op the daemon rejects when it takes it (unknown axis): it never runs.
  OpFuture bad = m.mesh->psum_async(x, "no-such-axis");
  st = bad.Wait();
  Line(absl::StrCat("BAD_TIMING code=", Code(st), " ", TimingFields(bad)));
  // Nobody leaves (breaking the mesh) before the other saw its refusal.
  st = m.mesh->barrier();
  Line(absl::StrCat("BARRIER code=", Code(st)));
  return 0;
}

// The "big" mode of one member; returns "" when every check passed, else
// the first failed check. `detail` (member processes run alone) prints the
// per-op lines.
std::string RunBigMember(const Flags& f, Member& m, bool detail) {
  const int n = f.members, i = m.mesh->index();
  const int64_t T = int64_t{n} * (n + 1) / 2;
  // Offsets: a at 0 (int64[4]); b at 1024 (int64[4]); c at 2048 (int64[1]);
  // gather output at 4096 (int64[n]).
  auto a = Array::Of<int64_t>(m.buf, {4}, 0);
  auto b = Array::Of<int64_t>(m.buf, {4}, 1024);
  auto c = Array::Of<int64_t>(m.buf, {1}, 2048);
  auto g = Array::Of<int64_t>(m.buf, {n}, 4096);
  for (int k = 0; k < 4; ++k) {
    a.data<int64_t>()[k] = i + 1;
    b.data<int64_t>()[k] = int64_t{i + 1} * (k + 1);
  }
  c.data<int64_t>()[0] = int64_t{i} * 3;
  // Each big perm has n-1 pairs: far more than a queue slot holds.
  std::vector<std::pair<int, int>> up, down;
  for (int s = 0; s + 1 < n; ++s) up.emplace_back(s, s + 1);
  for (int s = 1; s < n; ++s) down.emplace_back(s, s - 1);

  if (detail) {
    // The OpSpec exactly as the SDK builds it for ppermute_async(b, "i", up).
    collectived::v1::OpSpec spec;
    spec.set_mesh_id(m.mesh->id());
    spec.set_kind(collectived::v1::PPERMUTE);
    spec.add_axes("i");
    spec.set_dtype(collectived::v1::INT64);
    spec.add_shape(4);
    spec.mutable_input()->set_buffer_id(m.buf.id());
    spec.mutable_input()->set_offset(1024);
    for (const auto& [s, d] : up) {
      auto* p = spec.mutable_ppermute()->add_perm();
      p->set_source(s);
      p->set_dest(d);
    }
    Line(absl::StrCat("SPEC big_bytes=", spec.ByteSizeLong(),
                      " limit=", collectived::fastq::kMaxOpBytes));
  }

  // Submitted back to back; the SDK must keep them in this order although
  // ops 2, 4 and 5 take the gRPC stream and the others the queue.
  std::vector<OpFuture> ops;
  ops.push_back(m.mesh->psum_async(a, "i"));          // 0: a = T
  ops.push_back(m.mesh->psum_async(b, "i"));          // 1: b = T(k+1)
  ops.push_back(m.mesh->ppermute_async(b, "i", up));  // 2: big; member 0 gets 0
  ops.push_back(m.mesh->psum_async(b, "i"));          // 3: b = (n-1)T(k+1)
  ops.push_back(m.mesh->ppermute_async(b, "i", down));  // 4: big; member n-1 gets 0
  ops.push_back(m.mesh->ppermute_async(b, "i", down));  // 5: big; members n-2, n-1 get 0
  ops.push_back(m.mesh->psum_async(b, "i"));            // 6: b = (n-2)(n-1)T(k+1)
  ops.push_back(m.mesh->all_gather_async(c, "i", g, {.tiled = true}));  // 7: g[j] = 3j
  const std::vector<std::string> expect_paths = {"fast", "fast", "grpc", "fast",
                                                 "grpc", "grpc", "fast", "fast"};
  std::vector<std::string> seqs, codes, paths;
  std::string why;
  for (size_t k = 0; k < ops.size(); ++k) {
    absl::Status st = ops[k].Wait(absl::Seconds(60));
    seqs.push_back(absl::StrCat(ops[k].sequence()));
    codes.push_back(Code(st));
    const collectived::OpTiming t = ops[k].timing();
    paths.push_back(t.submitted_ns != 0 ? "fast" : "grpc");
    if (why.empty() && !st.ok()) why = absl::StrCat("op ", k, ": ", st.ToString());
    if (why.empty() && ops[k].sequence() != static_cast<int64_t>(k)) {
      why = absl::StrCat("op ", k, " has sequence ", ops[k].sequence());
    }
    if (why.empty() && m.client->fast_path() && paths[k] != expect_paths[k]) {
      why = absl::StrCat("op ", k, " took the ", paths[k], " path");
    }
  }
  const int64_t want_b = int64_t{n - 2} * (n - 1) * T;
  for (int k = 0; k < 4 && why.empty(); ++k) {
    if (a.data<int64_t>()[k] != T) {
      why = absl::StrCat("a[", k, "]=", a.data<int64_t>()[k], " want ", T);
    } else if (b.data<int64_t>()[k] != want_b * (k + 1)) {
      why = absl::StrCat("b[", k, "]=", b.data<int64_t>()[k], " want ", want_b * (k + 1));
    }
  }
  bool gather_ok = true;
  for (int j = 0; j < n; ++j) {
    if (g.data<int64_t>()[j] != int64_t{j} * 3) {
      gather_ok = false;
      if (why.empty()) why = absl::StrCat("g[", j, "]=", g.data<int64_t>()[j], " want ", 3 * j);
      break;
    }
  }
  if (detail) {
    Line(absl::StrCat("SEQ ", absl::StrJoin(seqs, ",")));
    Line(absl::StrCat("CODES ", absl::StrJoin(codes, ",")));
    Line(absl::StrCat("PATHS ", absl::StrJoin(paths, ",")));
    Line(absl::StrCat("VALUES a=", a.data<int64_t>()[0], " b=", Values<int64_t>(m.buf, 1024, 4),
                      " gather=", g.data<int64_t>()[0], "..", g.data<int64_t>()[n - 1],
                      " gather_ok=", gather_ok ? 1 : 0));
  }
  return why;
}

int RunBig(const Flags& f) {
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < f.sessions; ++s) {
    threads.emplace_back([&, s] {
      const int index = f.member + s;
      auto m = Setup(f, index, 4096 + 8 * static_cast<size_t>(f.members) + 4096);
      if (!m.ok()) {
        Line(absl::StrCat("MEMBER_FAIL member=", index, " why=setup: ", m.status().ToString()));
        return;
      }
      if (f.sessions == 1) Line(absl::StrCat("FAST value=", m->client->fast_path() ? 1 : 0));
      std::string why = RunBigMember(f, *m, f.sessions == 1);
      if (why.empty()) {
        ok.fetch_add(1);
      } else {
        Line(absl::StrCat("MEMBER_FAIL member=", index, " why=", why));
      }
    });
  }
  for (auto& t : threads) t.join();
  Line(absl::StrCat("MEMBERS n=", f.sessions, " ok=", ok.load()));
  return 0;
}

int RunIdle(const Flags& f, Member& m) {
  const int i = m.mesh->index();
  auto x = Array::Of<float>(m.buf, {256}, 0);
  for (int k = 0; k < 20; ++k) {
    if (absl::Status st = m.mesh->psum(x, "i"); !st.ok()) {
      Line(absl::StrCat("WARMUP code=", Code(st), " msg=", st.message()));
      return 1;
    }
  }
  Line("IDLE_BEGIN");
  absl::SleepFor(absl::Milliseconds(f.idle_ms));
  Line("IDLE_END");
  // Line up both members, then member 1 keeps member 0 waiting.
  if (absl::Status st = m.mesh->barrier(); !st.ok()) {
    Line(absl::StrCat("BARRIER code=", Code(st)));
    return 1;
  }
  if (i == 1) {
    Line("DELAY_BEGIN");
    absl::SleepFor(absl::Milliseconds(f.idle_ms));
  }
  const int64_t cpu0 = ProcessCpuNs();
  const absl::Time t0 = absl::Now();
  absl::Status st = m.mesh->psum(x, "i");
  const absl::Duration wall = absl::Now() - t0;
  const int64_t cpu = ProcessCpuNs() - cpu0;
  Line(absl::StrCat("WAITED code=", Code(st), " wall_ms=", absl::ToInt64Milliseconds(wall),
                    " cpu_ms=", cpu / 1000000));
  return 0;
}

// The "cross" mode: meshes <mesh>-big (--members members, one axis "i") and
// <mesh>-small (members p and q only, op timeout 2 s). p and q are one
// session each, in both meshes, at index 0 and 1; fillers only in the big one.
//   p: A = big ppermute on -big (async), then B = psum on -small (async);
//   q: B (waits for it), then A.
// q's B needs only p's B, which p submitted without waiting for anything.
int RunCross(const Flags& f) {
  const int n = f.members;
  std::vector<std::pair<int, int>> up;
  for (int s = 0; s + 1 < n; ++s) up.emplace_back(s, s + 1);
  auto join_big = [&](collectived::Client& client, int index) {
    return client.JoinMesh({.name = f.mesh + "-big",
                            .axes = {{"i", n}},
                            .coordinate = {index},
                            .join_timeout = absl::Seconds(40)});
  };
  if (f.role == "fill") {
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int s = 0; s < f.sessions; ++s) {
      threads.emplace_back([&, s] {
        const int index = f.member + s;
        collectived::ClientOptions options;
        options.socket_path = f.socket;
        options.fast_path = f.fast;
        auto client = collectived::Client::Connect(options);
        if (!client.ok()) return;
        auto mesh = join_big(**client, index);
        auto buf = (*client)->Allocate(4096);
        if (!mesh.ok() || !buf.ok()) return;
        if ((*mesh)->ppermute(Array::Of<float>(*buf, {4}), "i", up).ok()) ok.fetch_add(1);
      });
    }
    for (auto& t : threads) t.join();
    Line(absl::StrCat("MEMBERS n=", f.sessions, " ok=", ok.load()));
    return 0;
  }
  const int index = f.role == "p" ? 0 : 1;
  collectived::ClientOptions options;
  options.socket_path = f.socket;
  options.client_name = absl::StrCat("cross-", f.role);
  options.fast_path = f.fast;
  auto client = collectived::Client::Connect(options);
  if (!client.ok()) {
    Line(absl::StrCat("SETUP_FAILED ", client.status().ToString()));
    return 1;
  }
  auto big = join_big(**client, index);
  if (!big.ok()) {
    Line(absl::StrCat("SETUP_FAILED ", big.status().ToString()));
    return 1;
  }
  auto small = (*client)->JoinMesh({.name = f.mesh + "-small",
                                    .axes = {{"i", 2}},
                                    .coordinate = {index},
                                    .join_timeout = absl::Seconds(40),
                                    .op_timeout = absl::Seconds(2)});
  auto buf = (*client)->Allocate(4096);
  if (!small.ok() || !buf.ok()) {
    Line("SETUP_FAILED small mesh or buffer");
    return 1;
  }
  Line(absl::StrCat("FAST value=", (*client)->fast_path() ? 1 : 0));
  auto a = Array::Of<float>(*buf, {4}, 0);
  auto b = Array::Of<float>(*buf, {4}, 1024);
  b.data<float>()[0] = 1.0f;
  if (f.role == "p") {
    const absl::Time t0 = absl::Now();
    OpFuture fa = (*big)->ppermute_async(a, "i", up);
    OpFuture fb = (*small)->psum_async(b, "i");
    Line(absl::StrCat("B_SUBMITTED after_ms=", absl::ToInt64Milliseconds(absl::Now() - t0)));
    absl::Status sb = fb.Wait();
    absl::Status sa = fa.Wait();
    Line(absl::StrCat("B code=", Code(sb), " sum=", b.data<float>()[0], " msg=", sb.message()));
    Line(absl::StrCat("A code=", Code(sa), " msg=", sa.message()));
  } else {
    const absl::Time t0 = absl::Now();
    absl::Status sb = (*small)->psum(b, "i");
    Line(absl::StrCat("B code=", Code(sb), " after_ms=",
                      absl::ToInt64Milliseconds(absl::Now() - t0), " sum=", b.data<float>()[0],
                      " msg=", sb.message()));
    absl::Status sa = (*big)->ppermute(a, "i", up);
    Line(absl::StrCat("A code=", Code(sa), " msg=", sa.message()));
  }
  return 0;
}

int RunWait(const Flags& f, Member& m) {
  auto x = Array::Of<float>(m.buf, {256}, 0);
  Line(absl::StrCat("READY fast=", m.client->fast_path() ? 1 : 0));
  OpFuture fut = m.mesh->psum_async(x, "i");
  Line("SUBMITTED");
  absl::Status st = fut.Wait();
  Line(absl::StrCat("RESULT code=", Code(st), " msg=", st.message()));
  const absl::Time t0 = absl::Now();
  st = m.mesh->psum(x, "i");
  Line(absl::StrCat("AFTER code=", Code(st),
                    " after_ms=", absl::ToInt64Milliseconds(absl::Now() - t0)));
  return 0;
}

int Run(const Flags& f) {
  if (f.mode == "big") return RunBig(f);
  if (f.mode == "cross") return RunCross(f);
  auto m = Setup(f, f.member, 1 << 16);
  if (!m.ok()) {
    Line(absl::StrCat("SETUP_FAILED ", m.status().ToString()));
    return 1;
  }
  if (f.mode == "ops") return RunOps(f, *m);
  if (f.mode == "timing") return RunTiming(f, *m);
  if (f.mode == "idle") return RunIdle(f, *m);
  if (f.mode == "wait") return RunWait(f, *m);
  if (f.mode == "stall") {
    Line("READY");
    absl::SleepFor(absl::Milliseconds(f.idle_ms));
    return 0;
  }
  Line(absl::StrCat("unknown mode ", f.mode));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, f)) {
    std::fprintf(stderr, "usage: see the comment at the top of fastpath_worker.cc\n");
    return 2;
  }
  if (f.set_env) {
    setenv("COLLECTIVED_FAST_PATH", f.env_fast_path.c_str(), 1);
  } else {
    unsetenv("COLLECTIVED_FAST_PATH");
  }
  const int rc = Run(f);
  Line("DONE");
  return rc;
}
