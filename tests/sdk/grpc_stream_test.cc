// The SDK's gRPC Execute stream (ClientOptions::fast_path = false), driven by
// the threads that wait (no reader thread): several threads of one client
// waiting on ops of different meshes at once, futures waited in any order,
// futures polled without waiting, a waiter that polls only briefly before it
// sleeps, and a daemon killed under waiters.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectived/client.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

constexpr int kMembers = 2;

struct Member {
  std::unique_ptr<Client> client;
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<Buffer> buffers;
};

// kMembers clients on the gRPC path, each in `meshes` meshes (one buffer of
// `elems` floats per mesh); `grpc_spin`: ClientOptions::grpc_spin when set.
std::vector<Member> Join(const Daemon& d, int meshes, int64_t elems,
                         std::optional<absl::Duration> grpc_spin = std::nullopt) {
  std::vector<Member> m(kMembers);
  for (int i = 0; i < kMembers; ++i) {
    ClientOptions o{.socket_path = d.socket(), .client_name = absl::StrCat("grpc-", i)};
    o.fast_path = false;
    if (grpc_spin) o.grpc_spin = *grpc_spin;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    m[i].client = *std::move(c);
  }
  for (int k = 0; k < meshes; ++k) {
    std::vector<std::thread> threads;
    std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> joined(kMembers);
    for (int i = 0; i < kMembers; ++i) {
      threads.emplace_back([&, i] {
        joined[i] = m[i].client->JoinMesh(
            {.name = absl::StrCat("mesh-", k), .axes = {{"x", kMembers}}, .coordinate = {i}});
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kMembers; ++i) {
      EXPECT_TRUE(joined[i].ok()) << joined[i].status();
      if (!joined[i].ok()) return {};
      m[i].meshes.push_back(*std::move(joined[i]));
      auto b = m[i].client->Allocate(static_cast<size_t>(elems) * 4);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) return {};
      m[i].buffers.push_back(*std::move(b));
    }
  }
  return m;
}

TEST(GrpcStreamTest, ThreadsOfOneClientWaitOnOpsOfTheirMeshesAtOnce) {
  auto d = Daemon::Start();
  ASSERT_TRUE(d.ok()) << d.status();
  constexpr int kMeshes = 3, kOps = 150;
  std::vector<Member> m = Join(**d, kMeshes, 16);
  ASSERT_EQ(m.size(), static_cast<size_t>(kMembers));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    for (int k = 0; k < kMeshes; ++k) {
      threads.emplace_back([&, i, k] {
        float* x = static_cast<float*>(m[i].buffers[k].data());
        const Array a = Array::Of<float>(m[i].buffers[k], {16});
        for (int op = 0; op < kOps; ++op) {
          for (int e = 0; e < 16; ++e) x[e] = static_cast<float>(i + 1 + op + k);
          const absl::Status st = m[i].meshes[k]->psum(a, "x");
          // Members 1 and 2 (i + 1): 3 + 2 * (op + k).
          if (!st.ok() || x[5] != static_cast<float>(3 + 2 * (op + k))) {
            ADD_FAILURE() << "member " << i << " mesh " << k << " op " << op << ": " << st
                          << " x=" << x[5];
            ++bad;
            return;
          }
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(GrpcStreamTest, FuturesWaitedInAnyOrderOrOnlyPolledComplete) {
  auto d = Daemon::Start();
  ASSERT_TRUE(d.ok()) << d.status();
  constexpr int kOps = 8;
  std::vector<Member> m = Join(**d, 1, kOps);
  ASSERT_EQ(m.size(), static_cast<size_t>(kMembers));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kMembers);
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i] {
      float* x = static_cast<float*>(m[i].buffers[0].data());
      std::vector<OpFuture> f;
      for (int op = 0; op < kOps; ++op) {
        x[op] = static_cast<float>(op * (i + 1));
        f.push_back(m[i].meshes[0]->psum_async(
            Array::Of<float>(m[i].buffers[0], {1}, static_cast<size_t>(op) * 4), "x"));
      }
      if (i == 0) {
        for (int op = kOps - 1; op >= 0; --op) {  // the last first
          if (absl::Status st = f[op].Wait(); !st.ok()) errors[i] += st.ToString();
        }
      } else {
        // Only polled: Ready() drives the stream too.
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        for (int op = 0; op < kOps; ++op) {
          while (!f[op].Ready() && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(200));
          if (!f[op].Ready()) errors[i] += absl::StrCat("op ", op, " never ready; ");
        }
      }
      for (int op = 0; op < kOps; ++op) {
        if (x[op] != static_cast<float>(op * 3)) errors[i] += absl::StrCat("op ", op, " wrong; ");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kMembers; ++i) EXPECT_EQ(errors[i], "") << "member " << i;
}

// The scheduler's state of thread `tid` of this process: 'R' (running or
// waiting for a CPU), 'S' (sleeping), ...; '?' when it cannot be read.
char ThreadState(pid_t tid) {
  std::ifstream f(absl::StrCat("/proc/self/task/", tid, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // "tid (name) S ...": the name may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

TEST(GrpcStreamTest, AWaiterPollsForItsSpinThenSleepsUntilTheAnswer) {
  // No member-side ops: the op goes over the stream.
  auto d = Daemon::Start({"--member-op-bytes=0"});
  ASSERT_TRUE(d.ok()) << d.status();
  constexpr absl::Duration kSpin = absl::Milliseconds(300);
  std::vector<Member> m = Join(**d, 1, 4, kSpin);
  ASSERT_EQ(m.size(), static_cast<size_t>(kMembers));
  for (int i = 0; i < kMembers; ++i) {
    float* x = static_cast<float*>(m[i].buffers[0].data());
    for (int e = 0; e < 4; ++e) x[e] = static_cast<float>(i + 1);
  }
  // Member 0 waits 1.5 s for member 1's submission: it polls for kSpin,
  // then sleeps. Its scheduler state says which, loaded machine or not: a
  // thread that polls (yielding between looks) is always runnable ('R'),
  // whether or not it has a CPU; one that sleeps in the completion queue is
  // 'S'. (Its CPU time would depend on what else runs.)
  absl::Status st0;
  std::atomic<pid_t> tid{0};
  std::atomic<int64_t> t0_ns{0};  // when the waiter called psum
  std::thread waiter([&] {
    tid = static_cast<pid_t>(gettid());
    t0_ns = absl::ToUnixNanos(absl::Now());
    st0 = m[0].meshes[0]->psum(Array::Of<float>(m[0].buffers[0], {4}), "x");
  });
  while (t0_ns.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  const absl::Time t0 = absl::FromUnixNanos(t0_ns.load());
  int early = 0, early_running = 0, late = 0, late_sleeping = 0;
  std::string seen;  // "state@ms" of every sample, for the failure message
  for (absl::Duration at; (at = absl::Now() - t0) < absl::Milliseconds(1500);) {
    const char state = ThreadState(tid);
    absl::StrAppend(&seen, std::string(1, state), "@", absl::ToInt64Milliseconds(at), " ");
    if (at >= absl::Milliseconds(20) && at < kSpin - absl::Milliseconds(50)) {
      ++early;
      early_running += state == 'R';
    } else if (at >= kSpin + absl::Milliseconds(500)) {
      ++late;
      late_sleeping += state == 'S';
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Status st1 = m[1].meshes[0]->psum(Array::Of<float>(m[1].buffers[0], {4}), "x");
  waiter.join();
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int i = 0; i < kMembers; ++i) {
    EXPECT_EQ(static_cast<float*>(m[i].buffers[0].data())[3], 3.0f) << "member " << i;
  }
  // Samples that came too late to say anything (a starved test thread)
  // leave the check without its evidence: it then asks for some.
  ASSERT_GE(early, 3) << seen;
  ASSERT_GE(late, 3) << seen;
  EXPECT_GE(early_running * 2, early)
      << "the waiter slept during its spin (" << early_running << " of " << early
      << " samples runnable): it did not poll. Samples: " << seen;
  EXPECT_GE(late_sleeping * 5, late * 4)
      << "the waiter was not asleep after its spin (" << late_sleeping << " of " << late
      << " samples sleeping): it polled, not slept. Samples: " << seen;
}

TEST(GrpcStreamTest, AKilledDaemonFailsEveryWaiterPromptly) {
  auto d = Daemon::Start();
  ASSERT_TRUE(d.ok()) << d.status();
  constexpr int kMeshes = 2;
  std::vector<Member> m = Join(**d, kMeshes, 4);
  ASSERT_EQ(m.size(), static_cast<size_t>(kMembers));
  // Member 0 waits on an op in each mesh that member 1 never submits.
  std::vector<OpFuture> f;
  for (int k = 0; k < kMeshes; ++k) {
    f.push_back(m[0].meshes[k]->psum_async(Array::Of<float>(m[0].buffers[k], {4}), "x"));
  }
  std::vector<absl::Status> st(kMeshes);
  std::vector<std::thread> waiters;
  const absl::Time start = absl::Now();
  for (int k = 0; k < kMeshes; ++k) waiters.emplace_back([&, k] { st[k] = f[k].Wait(); });
  absl::SleepFor(absl::Milliseconds(100));
  (*d)->Kill();
  for (auto& t : waiters) t.join();
  const absl::Duration took = absl::Now() - start;
  for (int k = 0; k < kMeshes; ++k) {
    EXPECT_EQ(st[k].code(), absl::StatusCode::kUnavailable) << st[k];
  }
  EXPECT_LT(took, absl::Seconds(10)) << "the waiters learned of the daemon's death late";
}

}  // namespace
}  // namespace collectived::testing
