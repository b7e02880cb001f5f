// Soak: rounds of members running thousands of mixed ops against one daemon,
// some rounds with a member killed by SIGKILL at a random moment. The daemon
// must never hang, never crash, and end with no sessions, meshes or buffers
// left and no more threads than after the first round.
#include <signal.h>

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

int Threads(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int n = 0;
    if (line.rfind("Threads:", 0) == 0 && absl::SimpleAtoi(line.substr(8), &n)) return n;
  }
  return -1;
}

v1::GetStatsResponse Stats(const std::string& socket) {
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto stub = v1::Collective::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsResponse resp;
  grpc::Status st = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp;
}

// Stats settle shortly after the last member's session closes.
v1::GetStatsResponse SettledStats(const std::string& socket) {
  v1::GetStatsResponse s;
  for (int i = 0; i < 100; ++i) {
    s = Stats(socket);
    if (s.sessions() == 0 && s.meshes() == 0 && s.buffers() == 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return s;
}

TEST(SoakTest, MixedOpsWithRandomKillsLeakNothing) {
  auto daemon = Daemon::Start({"--op-timeout-ms=20000"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string socket = (*daemon)->socket();
  std::mt19937 rng(20261202);
  constexpr int kRounds = 12;
  constexpr int kOpsPerMember = 400;
  int baseline_threads = -1;
  int64_t kills = 0, completed_ops = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int n = 2 + static_cast<int>(rng() % 3);
    const bool kill_one = round % 2 == 1;
    std::vector<std::unique_ptr<Child>> members;
    for (int i = 0; i < n; ++i) {
      auto c = Child::Start({COLLECTIVED_FAILURE_WORKER_BIN, "--socket=" + socket,
                             absl::StrCat("--mesh=soak-", round), absl::StrCat("--members=", n),
                             absl::StrCat("--member=", i), "--mode=mixed",
                             absl::StrCat("--ops=", kOpsPerMember),
                             absl::StrCat("--seed=", round)});
      ASSERT_TRUE(c.ok());
      members.push_back(*std::move(c));
    }
    int victim = -1;
    if (kill_one) {
      victim = static_cast<int>(rng() % n);
      ASSERT_TRUE(members[victim]->WaitForOutput("READY", absl::Seconds(30)));
      absl::SleepFor(absl::Milliseconds(rng() % 200));
      members[victim]->Signal(SIGKILL);
      ++kills;
    }
    for (int i = 0; i < n; ++i) {
      ChildResult r = members[i]->Wait(absl::Seconds(60));
      ASSERT_FALSE(r.timed_out) << "member " << i << " of round " << round << " hung:\n"
                                << r.output;
      if (i == victim) continue;
      ASSERT_EQ(r.exit_code, 0) << r.output;
      size_t at = r.output.find("COMPLETED ops=");
      ASSERT_NE(at, std::string::npos) << r.output;
      int64_t ops = 0;
      ASSERT_TRUE(absl::SimpleAtoi(r.output.substr(at + 14, r.output.find('\n', at) - at - 14), &ops));
      completed_ops += ops;
      if (!kill_one) {
        EXPECT_EQ(ops, kOpsPerMember) << r.output;
      } else if (ops < kOpsPerMember) {
        EXPECT_NE(r.output.find("FAILED code=ABORTED"), std::string::npos) << r.output;
      }
    }
    v1::GetStatsResponse s = SettledStats(socket);
    EXPECT_EQ(s.sessions(), 0) << "round " << round;
    EXPECT_EQ(s.meshes(), 0) << "round " << round;
    EXPECT_EQ(s.buffers(), 0) << "round " << round;
    EXPECT_EQ(s.buffer_bytes(), 0) << "round " << round;
    const int threads = Threads((*daemon)->pid());
    if (round == 0) baseline_threads = threads;
    // gRPC may grow its pool under load but must not grow per round.
    EXPECT_LE(threads, baseline_threads + 8) << "round " << round;
  }
  v1::GetStatsResponse final_stats = Stats(socket);
  std::printf("soak: %d rounds, %lld member kills, %lld ops completed by members, daemon "
              "completed %lld ops and failed %lld; threads %d (after round 0: %d)\n",
              kRounds, static_cast<long long>(kills), static_cast<long long>(completed_ops),
              static_cast<long long>(final_stats.ops_completed()),
              static_cast<long long>(final_stats.ops_failed()), Threads((*daemon)->pid()),
              baseline_threads);
  ChildResult stop = (*daemon)->Stop();
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  EXPECT_EQ(stop.output.find("level=error"), std::string::npos) << stop.output;
}

}  // namespace
}  // namespace collectived::testing
