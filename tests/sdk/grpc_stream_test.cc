// The SDK's gRPC Execute stream (ClientOptions::fast_path = false), driven by
// the threads that wait (no reader thread): several threads of one client
// waiting on ops of different meshes at once, futures waited in any order,
// futures polled without waiting, a waiter that polls only briefly before it
// sleeps, and a daemon killed under waiters.
#include <signal.h>
#include <time.h>

#include <gtest/gtest.h>

#include <atomic>
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

// CPU time the calling thread has used.
absl::Duration ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

TEST(GrpcStreamTest, AWaiterPollsForItsSpinThenSleepsUntilTheAnswer) {
  // No member-side ops: the op goes over the stream.
  auto d = Daemon::Start({"--member-op-bytes=0"});
  ASSERT_TRUE(d.ok()) << d.status();
  // A spin long enough to see in the waiter's CPU time.
  constexpr absl::Duration kSpin = absl::Milliseconds(300);
  std::vector<Member> m = Join(**d, 1, 4, kSpin);
  ASSERT_EQ(m.size(), static_cast<size_t>(kMembers));
  for (int i = 0; i < kMembers; ++i) {
    float* x = static_cast<float*>(m[i].buffers[0].data());
    for (int e = 0; e < 4; ++e) x[e] = static_cast<float>(i + 1);
  }
  // Member 0 waits 1.5 s for member 1's submission: it polls for kSpin
  // (yielding, so it gets a share of a CPU, loaded or not), then sleeps, so
  // it uses some CPU but far less than the whole wait.
  absl::Status st0;
  absl::Duration cpu, wall;
  std::thread waiter([&] {
    const absl::Duration cpu0 = ThreadCpuTime();
    const absl::Time t0 = absl::Now();
    st0 = m[0].meshes[0]->psum(Array::Of<float>(m[0].buffers[0], {4}), "x");
    wall = absl::Now() - t0;
    cpu = ThreadCpuTime() - cpu0;
  });
  absl::SleepFor(absl::Milliseconds(1500));
  const absl::Status st1 = m[1].meshes[0]->psum(Array::Of<float>(m[1].buffers[0], {4}), "x");
  waiter.join();
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int i = 0; i < kMembers; ++i) {
    EXPECT_EQ(static_cast<float*>(m[i].buffers[0].data())[3], 3.0f) << "member " << i;
  }
  EXPECT_GE(wall, absl::Milliseconds(1000));
  EXPECT_GE(cpu, kSpin / 10) << "the waiting thread used " << cpu << " of CPU in " << wall
                             << ": it slept at once, without polling";
  EXPECT_LT(cpu, absl::Milliseconds(900))
      << "the waiting thread used " << cpu << " of CPU in " << wall << ": it polled, not slept";
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
