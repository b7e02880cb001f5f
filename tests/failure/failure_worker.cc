// collectived_failure_worker: a member process for the failure tests.
//
//   --socket=S --mesh=NAME --members=N --member=I
//   --mode=loop      psum in a loop until an op fails; print the failure
//   --mode=stall     join, then never submit (a stuck-but-alive member)
//   --mode=mismatch  submit --kind instead of psum as op 0, then one psum
//   --mode=mixed     --ops=N ops of random kinds (same --seed on every member),
//                    four in flight at a time; stops at the first failure
//   --mode=watch     submit one psum and, without waiting on it, poll
//                    OpFuture::Ready() until it completes (the partner
//                    stalls; the test kills the daemon)
//   --mode=teardown  run one psum, then wait for --wait-file; then submit
//                    one more psum (left pending), leave and destroy the
//                    mesh and destroy the client (the test stops the daemon
//                    before)
//   --reform         after a failure, join NAME again with --members-after
//                    members (coordinates assigned) and run one psum
//   --scope=S --token=T  join within scope S with join token T (--reform too)
//   --wait-file=F    with --reform, and in teardown mode: wait (at most 60 s)
//                    until file F exists before going on
//   --reconnect-ms=T after a failure, reconnect (to a restarted daemon)
//                    for up to T ms, rejoin and run one psum
//
// Output lines (one per event, parsed by failure_test.cc):
//   READY index=<i> pid=<pid>
//   FAILED code=<CODE> after_ms=<ms since the failing op was submitted>
//          at_ns=<CLOCK_MONOTONIC when the failure was seen> msg=<message>
//   NOTICED code=<CODE> at_ns=<CLOCK_MONOTONIC when Ready() turned true>
//   TORN_DOWN leave_ms=<Leave + ~Mesh> close_ms=<~Client> total_ms=<both>
//             leave=<CODE of Leave> pending=<CODE of the op left pending>
//   BUFFER_INTACT value=<v>         (the shared buffer is still readable)
//   REFORMED generation=<g> members=<n> sum=<s>
//   RECONNECTED sum=<s>
//   DONE
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectived/client.h"
#include "tests/harness/flags.h"

namespace {

using collectived::Array;

struct Flags : ::collectived::testing::MemberFlags {
  Flags() { mode = "loop"; }
  std::string kind = "psum", scope, token, wait_file;
  int members_after = 0;
  bool reform = false;
  int64_t reconnect_ms = 0, op_timeout_ms = 0, ops = 100, seed = 1;
};

bool Parse(int argc, char** argv, Flags& f) {
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    auto value = [&](const char* name, std::string* out) {
      return ::collectived::testing::FlagValue(arg, name, out);
    };
    std::string v;
    if (::collectived::testing::ParseMemberFlag(arg, &f) || value("kind", &f.kind) ||
        value("scope", &f.scope) || value("token", &f.token) ||
        value("wait-file", &f.wait_file)) {
    } else if (value("members-after", &v)) {
      f.members_after = std::atoi(v.c_str());
    } else if (value("reconnect-ms", &v)) {
      f.reconnect_ms = std::atoll(v.c_str());
    } else if (value("ops", &v)) {
      f.ops = std::atoll(v.c_str());
    } else if (value("seed", &v)) {
      f.seed = std::atoll(v.c_str());
    } else if (value("op-timeout-ms", &v)) {
      f.op_timeout_ms = std::atoll(v.c_str());
    } else if (arg == "--reform") {
      f.reform = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return false;
    }
  }
  return !f.socket.empty() && !f.mesh.empty();
}

void Line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the host,
// so the test can compare it with the moment it killed the daemon.
int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Waits until `path` exists; false after 60 s.
bool WaitForFile(const std::string& path) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  struct stat st;
  while (stat(path.c_str(), &st) != 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Joins `name` and runs one psum of 1.0 per member; returns the sum.
absl::StatusOr<float> JoinAndSum(collectived::Client& client, const std::string& name,
                                 int members, int64_t* generation, const Flags& f) {
  auto mesh = client.JoinMesh({.name = name, .axes = {{"i", members}},
                               .join_timeout = absl::Seconds(20),
                               .scope = f.scope,
                               .join_token = f.token});
  if (!mesh.ok()) return mesh.status();
  *generation = (*mesh)->generation();
  auto buf = client.Allocate(sizeof(float));
  if (!buf.ok()) return buf.status();
  buf->as<float>()[0] = 1.0f;
  absl::Status st = (*mesh)->psum(Array::Of<float>(*buf, {}), "i");
  if (!st.ok()) return st;
  return buf->as<float>()[0];
}

int Run(const Flags& f) {
  auto client = collectived::Client::Connect(
      {.socket_path = f.socket, .client_name = absl::StrCat("failure-", f.member)});
  if (!client.ok()) {
    Line(absl::StrCat("CONNECT_FAILED ", client.status().ToString()));
    return 1;
  }
  auto mesh = (*client)->JoinMesh({.name = f.mesh,
                                   .axes = {{"i", f.members}},
                                   .coordinate = {f.member},
                                   .join_timeout = absl::Seconds(20),
                                   .op_timeout = absl::Milliseconds(f.op_timeout_ms),
                                   .scope = f.scope,
                                   .join_token = f.token});
  if (!mesh.ok()) {
    Line(absl::StrCat("JOIN_FAILED code=", absl::StatusCodeToString(mesh.status().code()),
                      " msg=", mesh.status().message()));
    return 1;
  }
  auto buf = (*client)->Allocate(1 << 20);
  if (!buf.ok()) return 1;
  Line(absl::StrCat("READY index=", (*mesh)->index(), " pid=", getpid()));
  auto x = Array::Of<float>(*buf, {1024});

  if (f.mode == "stall") {
    absl::SleepFor(absl::Seconds(60));
    return 0;
  }
  if (f.mode == "mismatch") {
    collectived::OpFuture fut;
    if (f.kind == "pmax") {
      fut = (*mesh)->pmax_async(x, "i");
    } else if (f.kind == "shape") {
      fut = (*mesh)->psum_async(Array::Of<float>(*buf, {512}), "i");
    } else if (f.kind == "dtype") {
      fut = (*mesh)->psum_async(Array::Of<int32_t>(*buf, {1024}), "i");
    } else if (f.kind == "perm") {
      fut = (*mesh)->ppermute_async(x, "i", {{0, 1}, {1, 0}});
    } else if (f.kind == "perm-other") {
      fut = (*mesh)->ppermute_async(x, "i", {{0, 0}, {1, 1}});
    } else if (f.kind == "root") {
      fut = (*mesh)->broadcast_async(x, "i", f.member == 0 ? 1 : 0);
    } else if (f.kind == "tiled") {
      // Member 0 gathers tiled, the others untiled: same bytes, different op.
      auto out = Array::Of<float>(*buf, {f.members * 1024}, 8192);
      if (f.member != 0) out.shape = {f.members, 1024};
      fut = (*mesh)->all_gather_async(x, "i", out, {.tiled = f.member == 0});
    } else {
      fut = (*mesh)->psum_async(x, "i");
    }
    absl::Status st = fut.Wait();
    Line(absl::StrCat("FAILED code=", absl::StatusCodeToString(st.code()), " after_ms=0 msg=",
                      st.message()));
    // The mesh goes on: a matching op succeeds.
    buf->as<float>()[0] = 1.0f;
    st = (*mesh)->psum(Array::Of<float>(*buf, {}), "i");
    Line(absl::StrCat("NEXT code=", absl::StatusCodeToString(st.code()),
                      " sum=", buf->as<float>()[0]));
    return 0;
  }

  if (f.mode == "watch") {
    // The partner stalls, so the op stays pending until the daemon dies.
    collectived::OpFuture fut = (*mesh)->psum_async(x, "i");
    Line("SUBMITTED");
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!fut.Ready() && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(100));
    const int64_t at_ns = MonotonicNs();
    if (!fut.Ready()) {
      Line("NOT_NOTICED within 20 s");
      return 1;
    }
    Line(absl::StrCat("NOTICED code=", absl::StatusCodeToString(fut.Wait().code()),
                      " at_ns=", at_ns));
    return 0;
  }

  if (f.mode == "teardown") {
    // One op first, so that the gRPC path has its stream open.
    absl::Status st = (*mesh)->psum(Array::Of<float>(*buf, {}), "i");
    Line(absl::StrCat("FIRST code=", absl::StatusCodeToString(st.code())));
    if (!WaitForFile(f.wait_file)) {
      Line("NO_WAIT_FILE");
      return 1;
    }
    collectived::OpFuture pending = (*mesh)->psum_async(Array::Of<float>(*buf, {}), "i");
    const absl::Time start = absl::Now();
    const absl::Status leave = (*mesh)->Leave();
    mesh->reset();
    const absl::Time left = absl::Now();
    client->reset();
    const absl::Time closed = absl::Now();
    Line(absl::StrCat("TORN_DOWN leave_ms=", absl::ToInt64Milliseconds(left - start),
                      " close_ms=", absl::ToInt64Milliseconds(closed - left),
                      " total_ms=", absl::ToInt64Milliseconds(closed - start),
                      " leave=", absl::StatusCodeToString(leave.code()), " pending=",
                      pending.Ready() ? absl::StatusCodeToString(pending.Wait().code())
                                      : std::string("NOT_READY")));
    return 0;
  }

  if (f.mode == "mixed") {
    std::mt19937_64 rng(static_cast<uint64_t>(f.seed));
    const int n = f.members;
    std::vector<std::pair<int, int>> ring;
    for (int s = 0; s < n; ++s) ring.emplace_back(s, (s + 1) % n);
    int64_t done = 0;
    absl::Status failure;
    while (done < f.ops && failure.ok()) {
      std::vector<collectived::OpFuture> batch;
      for (int k = 0; k < 4; ++k) {
        // Each op uses its own 64 KiB slice, so ops in flight do not overlap.
        const size_t base = static_cast<size_t>(k) * 65536;
        auto in = Array::Of<float>(*buf, {256}, base);
        auto out = Array::Of<float>(*buf, {n * 256}, base + 32768);
        switch (rng() % 6) {
          case 0: batch.push_back((*mesh)->psum_async(in, "i")); break;
          case 1: batch.push_back((*mesh)->pmax_async(in, "i")); break;
          case 2: batch.push_back((*mesh)->all_gather_async(in, "i", out, {.tiled = true})); break;
          case 3: batch.push_back((*mesh)->ppermute_async(in, "i", ring)); break;
          case 4: batch.push_back((*mesh)->broadcast_async(in, "i", 0)); break;
          default: batch.push_back((*mesh)->barrier_async()); break;
        }
      }
      for (auto& fut : batch) {
        absl::Status st = fut.Wait();
        if (st.ok()) {
          ++done;
        } else if (failure.ok()) {
          failure = st;
        }
      }
    }
    if (!failure.ok()) {
      Line(absl::StrCat("FAILED code=", absl::StatusCodeToString(failure.code()),
                        " after_ms=0 msg=", failure.message()));
    }
    Line(absl::StrCat("COMPLETED ops=", done));
    return 0;
  }

  // loop: psum until something fails.
  buf->as<float>()[1023] = 42.0f;
  absl::Status failure;
  absl::Time submitted;
  for (int64_t n = 0;; ++n) {
    submitted = absl::Now();
    failure = (*mesh)->psum(Array::Of<float>(*buf, {1}), "i");
    if (!failure.ok()) break;
  }
  const int64_t failed_ns = MonotonicNs();
  Line(absl::StrCat("FAILED code=", absl::StatusCodeToString(failure.code()),
                    " after_ms=", absl::ToInt64Milliseconds(absl::Now() - submitted),
                    " at_ns=", failed_ns, " msg=", failure.message()));
  Line(absl::StrCat("BUFFER_INTACT value=", buf->as<float>()[1023]));
  if (f.reform) {
    if (!f.wait_file.empty() && !WaitForFile(f.wait_file)) {
      Line("NO_WAIT_FILE");
      return 1;
    }
    int64_t generation = 0;
    auto sum = JoinAndSum(**client, f.mesh, f.members_after, &generation, f);
    if (!sum.ok()) {
      Line(absl::StrCat("REFORM_FAILED ", sum.status().ToString()));
      return 1;
    }
    Line(absl::StrCat("REFORMED generation=", generation, " members=", f.members_after,
                      " sum=", *sum));
  }
  if (f.reconnect_ms > 0) {
    mesh->reset();
    client->reset();
    const absl::Time deadline = absl::Now() + absl::Milliseconds(f.reconnect_ms);
    absl::Status last;
    while (absl::Now() < deadline) {
      auto again = collectived::Client::Connect(
          {.socket_path = f.socket, .connect_timeout = absl::Milliseconds(500)});
      if (!again.ok()) {
        last = again.status();
        absl::SleepFor(absl::Milliseconds(50));
        continue;
      }
      int64_t generation = 0;
      auto sum = JoinAndSum(**again, f.mesh, f.members, &generation, f);
      if (!sum.ok()) {
        Line(absl::StrCat("RECONNECT_FAILED ", sum.status().ToString()));
        return 1;
      }
      Line(absl::StrCat("RECONNECTED sum=", *sum));
      Line("DONE");
      return 0;
    }
    Line(absl::StrCat("RECONNECT_FAILED ", last.ToString()));
    return 1;
  }
  Line("DONE");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, f)) {
    std::fprintf(stderr, "usage: see the comment at the top of failure_worker.cc\n");
    return 2;
  }
  return Run(f);
}
