// GPU end to end: the real daemon (CUDA variant) and K real member processes
// (collectived_gpu_e2e_worker) whose buffers are GPU memory the daemon
// allocated on "cuda:0".
//
// Gpu/E2eTest.* (label gpu; skipped, saying why, when the daemon has no
// usable GPU or this process cannot use CUDA; a failure instead with
// COLLECTIVED_REQUIRE_GPU=1):
//   - psum, pmax, all_gather and ppermute on f32 and i32 across K = 2, 4, 8
//     processes, every result checked exactly in every process;
//   - a member SIGKILLed while the others run ops: they fail with ABORTED
//     naming it, the daemon serves a new mesh, and the device's free memory
//     comes back once every session closed;
//   - a stalled member: the others' op times out with DEADLINE_EXCEEDED
//     naming it.
// Host/E2eTest.* (label integration): the same with host memory ("cpu"), all
//   but the device memory checks: the worker's and this test's logic, checked
//   anywhere.
// GpuE2eNoGpu.* (label integration): where the daemon has no usable GPU, the
//   worker is refused its GPU buffer saying why (skipped where there is a GPU).
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectived/client.h"
#include "common/cuda/driver.h"
#include "tests/harness/cluster.h"
#include "tests/harness/harness.h"
#include "tests/harness/require_gpu.h"

namespace collectived::testing {
namespace {

constexpr absl::Duration kStartup = absl::Seconds(60);
constexpr absl::Duration kFinish = absl::Seconds(120);
// Each member's buffer in the kill test: large enough that one member's
// buffer left behind shows well above kSlack.
constexpr size_t kKillBufferBytes = size_t{256} << 20;
// What device memory may differ by between two quiet moments (the daemon's
// and this process's own small allocations, rounding).
constexpr size_t kSlack = size_t{64} << 20;

std::string WorkerBinary() { return COLLECTIVED_GPU_E2E_WORKER_BIN; }

std::string Field(const std::string& output, const std::string& tag, const std::string& key) {
  return OutputField(output, tag, key);
}

std::string Tail(const std::string& s, size_t n = 4000) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

// What a daemon answers when asked for GPU memory: the device it gave
// ("cuda:GPU-..."), or why it gave none.
absl::StatusOr<std::string> DaemonGpu(const Daemon& daemon, const std::string& device) {
  auto client = Client::Connect({.socket_path = daemon.socket(), .client_name = "gpu-probe"});
  if (!client.ok()) return client.status();
  auto buf = (*client)->Allocate(4096, device);
  if (!buf.ok()) return buf.status();
  return buf->device();
}

// K member processes of one mesh.
struct Members {
  std::vector<std::unique_ptr<Child>> children;

  // Starts `n` workers of mesh `mesh`, member i with extra(i) added, and
  // waits until every one printed READY (a fatal failure if one did not).
  void StartAll(const Daemon& d, const std::string& mesh, int n,
                const std::function<std::vector<std::string>(int)>& extra) {
    for (int i = 0; i < n; ++i) {
      auto c = Child::Start(WorkerArgv(WorkerBinary(), d, mesh, n, i, extra(i)));
      ASSERT_TRUE(c.ok()) << c.status();
      children.push_back(*std::move(c));
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(children[i]->WaitForOutput("READY", kStartup))
          << "member " << i << " never got ready:\n" << children[i]->output();
    }
  }
  std::string Pid(int i) const { return Field(children[i]->output(), "READY", "pid"); }
};

// Parameters: the members' device ("cuda:0" or "cpu") and their number.
class E2eTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  const std::string& device() const { return std::get<0>(GetParam()); }
  int members() const { return std::get<1>(GetParam()); }
  bool gpu() const { return device() != "cpu"; }

  void SetUp() override {
    auto daemon = Daemon::Start();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    if (!gpu()) {
      device_ = "cpu";
      return;
    }

    // The daemon first: whether it can hand out GPU memory at all.
    absl::StatusOr<std::string> device = DaemonGpu(*daemon_, this->device());
    if (!device.ok()) {
      const absl::StatusCode code = device.status().code();
      ASSERT_TRUE(code == absl::StatusCode::kFailedPrecondition ||
                  code == absl::StatusCode::kUnimplemented)
          << "asking the daemon for GPU memory failed unexpectedly: " << device.status();
      COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU("asking the daemon for GPU memory on "
                                           << this->device() << ": "
                                           << device.status().message());
    }
    ASSERT_TRUE(absl::StartsWith(*device, "cuda:GPU-")) << *device;
    device_ = *device;

    // Then this process: it reads the device's free memory.
    absl::StatusOr<const cuda::DriverApi*> api = cuda::RequireDevices();
    if (!api.ok()) {
      COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU("this test process cannot use CUDA: "
                                           << api.status().message());
    }
    api_ = *api;
    absl::StatusOr<int> ordinal = cuda::ResolveUuid(device_);
    if (!ordinal.ok()) {
      COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU("this test process does not see the daemon's "
                                           << device_ << ": " << ordinal.status().message());
    }
    ordinal_ = *ordinal;
    ASSERT_TRUE(cuda::SetCurrentDevice(ordinal_).ok());
  }

  // The device's free memory, as the driver reports it (every process's
  // allocations and contexts count).
  size_t FreeBytes() {
    EXPECT_TRUE(cuda::SetCurrentDevice(ordinal_).ok());
    size_t free = 0, total = 0;
    EXPECT_EQ(api_->cuMemGetInfo(&free, &total), CUDA_SUCCESS);
    return free;
  }

  // The free memory once it stopped rising: the daemon frees a session's
  // buffers when it sees the session end, a moment after its process exited.
  // Read until no rise of over 1 MiB for 500 ms (at most 10 s).
  size_t SettledFreeBytes() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    size_t best = FreeBytes();
    absl::Time last_rise = absl::Now();
    while (absl::Now() - last_rise < absl::Milliseconds(500) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      const size_t free = FreeBytes();
      if (free > best + (size_t{1} << 20)) last_rise = absl::Now();
      best = std::max(best, free);
    }
    return best;
  }

  // Waits (at most `timeout`) until the free memory is back to `baseline`
  // within kSlack; returns the last reading.
  size_t WaitForFreeBytes(size_t baseline, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    size_t free = FreeBytes();
    while (free + kSlack < baseline && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      free = FreeBytes();
    }
    return free;
  }

  // Runs `n` workers in ops mode on mesh `mesh`; each must check every
  // result and exit 0.
  void RunOps(const std::string& mesh, int n) {
    std::vector<std::vector<std::string>> argvs;
    for (int i = 0; i < n; ++i) {
      argvs.push_back(
          WorkerArgv(WorkerBinary(), *daemon_, mesh, n, i, {"--mode=ops", "--device=" + device()}));
    }
    std::vector<ChildResult> results = RunAll(argvs, kFinish);
    for (int i = 0; i < n; ++i) {
      const ChildResult& r = results[i];
      EXPECT_FALSE(r.timed_out) << "member " << i << " of " << mesh << " timed out:\n"
                                << Tail(r.output);
      EXPECT_EQ(r.exit_code, 0) << "member " << i << " of " << mesh << ":\n" << Tail(r.output);
      EXPECT_EQ(Field(r.output, "READY", "device"), device_) << r.output;
      EXPECT_EQ(Field(r.output, "DONE", "failed"), "0") << r.output;
      EXPECT_EQ(Field(r.output, "DONE", "checks"), "9") << r.output;
      EXPECT_FALSE(absl::StrContains(r.output, " ok=0")) << r.output;
    }
  }

  std::unique_ptr<Daemon> daemon_;
  std::string device_;  // as the daemon names it: "cuda:GPU-..." or "cpu"
  const cuda::DriverApi* api_ = nullptr;  // GPU only
  int ordinal_ = -1;
};

TEST_P(E2eTest, CollectivesAcrossProcessesAreExact) {
  const int n = members();
  RunOps(absl::StrCat("ops-", n), n);
}

// Stream-ordered submission: every member submits without synchronizing
// its stream; the daemon waits for each stream and releases it.
TEST_P(E2eTest, StreamOrderedOpsWaitForTheStreamAndReleaseIt) {
  if (!gpu()) GTEST_SKIP() << "stream-ordered submission needs GPU buffers";
  const int n = members();
  std::vector<std::vector<std::string>> argvs;
  for (int i = 0; i < n; ++i) {
    argvs.push_back(WorkerArgv(WorkerBinary(), *daemon_, absl::StrCat("stream-", n), n, i,
                               {"--mode=stream", "--device=" + device()}));
  }
  std::vector<ChildResult> results = RunAll(argvs, kFinish);
  for (int i = 0; i < n; ++i) {
    const ChildResult& r = results[i];
    EXPECT_FALSE(r.timed_out) << "member " << i << " timed out:\n" << Tail(r.output);
    EXPECT_EQ(r.exit_code, 0) << "member " << i << ":\n" << Tail(r.output);
    EXPECT_EQ(Field(r.output, "DONE", "failed"), "0") << r.output;
    EXPECT_EQ(Field(r.output, "DONE", "checks"), "2") << r.output;
    EXPECT_FALSE(absl::StrContains(r.output, " ok=0")) << r.output;
  }
}

// SIGKILL one member while the others run ops on GPU buffers.
TEST_P(E2eTest, KilledMemberAbortsTheOthersAndItsMemoryIsFreed) {
  const int n = members();
  // A first round, so that the daemon has set up whatever it keeps for
  // ops on this GPU before the baseline is read.
  ASSERT_NO_FATAL_FAILURE(RunOps(absl::StrCat("warm-up-", n), n));
  if (HasFailure()) return;
  const size_t baseline = gpu() ? SettledFreeBytes() : 0;

  Members m;
  ASSERT_NO_FATAL_FAILURE(m.StartAll(*daemon_, absl::StrCat("kill-", n), n, [this](int) {
    return std::vector<std::string>{"--mode=loop", "--device=" + device(),
                                    absl::StrCat("--bytes=", kKillBufferBytes)};
  }));
  // The members' buffers are device memory (this is what the check after
  // the kill relies on to see a leak).
  const size_t during = gpu() ? FreeBytes() : 0;
  if (gpu()) {
    EXPECT_LE(during + n * (kKillBufferBytes * 9 / 10), baseline)
        << "the members' buffers took no device memory? before " << baseline
        << ", with them " << during;
  }

  const int victim = n - 1;
  const std::string victim_pid = m.Pid(victim);
  ASSERT_FALSE(victim_pid.empty()) << m.children[victim]->output();
  absl::SleepFor(absl::Milliseconds(200));  // let them run a few ops
  m.children[victim]->Signal(SIGKILL);
  for (int i = 0; i < n - 1; ++i) {
    ChildResult r = m.children[i]->Wait(kFinish);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAILED", "code"), "ABORTED") << r.output;
    const std::string msg = Field(r.output, "FAILED", "msg");
    EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("member ", victim))) << msg;
    EXPECT_TRUE(absl::StrContains(msg, "pid " + victim_pid)) << msg;
  }
  EXPECT_EQ(m.children[victim]->Wait(absl::Seconds(10)).exit_code, 128 + SIGKILL);
  m.children.clear();

  // The daemon goes on serving GPU meshes.
  ASSERT_NO_FATAL_FAILURE(RunOps(absl::StrCat("after-kill-", n), n));

  // Every session is closed: the members' buffers, the killed one's
  // included, and their processes' contexts are gone.
  if (gpu()) {
    const size_t after = WaitForFreeBytes(baseline, absl::Seconds(15));
    EXPECT_GE(after + kSlack, baseline)
        << "device memory did not come back: " << baseline << " free before the members, "
        << during << " with them, " << after << " after they all ended ("
        << (baseline - after) / (1 << 20) << " MiB missing)";
  }

  ChildResult stopped = daemon_->Stop();
  EXPECT_EQ(stopped.exit_code, 0) << Tail(stopped.output);
}

// A member that joined and never submits: the others' op times out naming it.
TEST_P(E2eTest, StalledMemberIsNamedWhenTheOpTimesOut) {
  const int n = members();
  Members m;
  ASSERT_NO_FATAL_FAILURE(m.StartAll(*daemon_, absl::StrCat("stall-", n), n, [this, n](int i) {
    return std::vector<std::string>{i == n - 1 ? "--mode=stall" : "--mode=loop",
                                    "--device=" + device(), "--op-timeout-ms=700"};
  }));
  const int stalled = n - 1;
  const std::string stalled_pid = m.Pid(stalled);
  ASSERT_FALSE(stalled_pid.empty()) << m.children[stalled]->output();
  std::vector<std::string> waiting;
  for (int i = 0; i < n - 1; ++i) waiting.push_back(absl::StrCat(i));
  for (int i = 0; i < n - 1; ++i) {
    ChildResult r = m.children[i]->Wait(kFinish);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAILED", "code"), "DEADLINE_EXCEEDED") << r.output;
    const std::string msg = Field(r.output, "FAILED", "msg");
    EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("missing: ", stalled, " (", stalled,
                                                    ") pid ", stalled_pid)))
        << msg;
    const std::string who = waiting.size() == 1
                                ? absl::StrCat("member ", waiting[0], " is waiting")
                                : absl::StrCat("members ", absl::StrJoin(waiting, ","),
                                               " are waiting");
    EXPECT_TRUE(absl::StrContains(msg, absl::StrCat(who, " in psum f32[1024] over (i)"))) << msg;
  }
  m.children[stalled]->Signal(SIGKILL);
  m.children[stalled]->Wait(absl::Seconds(10));
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return absl::StrCat(std::get<1>(info.param), "Processes");
}
INSTANTIATE_TEST_SUITE_P(Gpu, E2eTest,
                         ::testing::Combine(::testing::Values("cuda:0"), ::testing::Values(2, 4, 8)),
                         ParamName);
INSTANTIATE_TEST_SUITE_P(Host, E2eTest,
                         ::testing::Combine(::testing::Values("cpu"), ::testing::Values(2, 4, 8)),
                         ParamName);

// Members of one mesh on two daemons of a cluster (loopback, host ids h0 and
// h1): with GPU buffers the daemons move the bytes between hosts over NCCL
// (each daemon sets NCCL_HOSTID from its host id, so NCCL treats the two
// daemons on one machine's GPU as two hosts and connects them over its
// socket transport, here on loopback), with host memory over Gloo.
class AcrossHostsE2eTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& device() const { return GetParam(); }
  bool gpu() const { return device() != "cpu"; }

  void SetUp() override {
    auto daemons = StartLoopbackCluster(2, {}, kStartup, [](int) {
      return std::vector<std::string>{"/usr/bin/env", "NCCL_SOCKET_IFNAME=lo"};
    });
    ASSERT_TRUE(daemons.ok()) << daemons.status();
    daemons_ = *std::move(daemons);
    if (!gpu()) return;
    absl::StatusOr<std::string> device = DaemonGpu(*daemons_[0], this->device());
    if (!device.ok()) {
      COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU("asking the daemon for GPU memory on "
                                           << this->device() << ": "
                                           << device.status().message());
    }
  }

  // The host of member i of 4: h0 holds 0 and 1 ("runs") or 0 and 2.
  static int HostOf(int i, bool runs) { return runs ? i / 2 : i % 2; }

  std::vector<std::unique_ptr<Daemon>> daemons_;
};

TEST_P(AcrossHostsE2eTest, CollectivesAcrossTwoDaemonsAreExact) {
  constexpr int n = 4;
  for (bool runs : {true, false}) {
    const std::string mesh = absl::StrCat("across-", runs ? "runs" : "interleaved");
    std::vector<std::vector<std::string>> argvs;
    for (int i = 0; i < n; ++i) {
      argvs.push_back(WorkerArgv(WorkerBinary(), *daemons_[HostOf(i, runs)], mesh, n, i,
                                 {"--mode=ops", "--device=" + device()}));
    }
    std::vector<ChildResult> results = RunAll(argvs, kFinish);
    for (int i = 0; i < n; ++i) {
      const ChildResult& r = results[i];
      EXPECT_FALSE(r.timed_out) << mesh << " member " << i << " timed out:\n" << Tail(r.output);
      EXPECT_EQ(r.exit_code, 0) << mesh << " member " << i << ":\n" << Tail(r.output);
      EXPECT_EQ(Field(r.output, "DONE", "failed"), "0") << r.output;
      EXPECT_EQ(Field(r.output, "DONE", "checks"), "9") << r.output;
      EXPECT_FALSE(absl::StrContains(r.output, " ok=0")) << r.output;
    }
  }
}

// A member killed on h1 while the mesh runs ops: the members on h0 fail with
// ABORTED naming h1, and both daemons serve the next mesh.
TEST_P(AcrossHostsE2eTest, AMemberKilledOnOneHostAbortsTheOthers) {
  constexpr int n = 4;
  Members m;
  for (int i = 0; i < n; ++i) {
    auto c = Child::Start(WorkerArgv(WorkerBinary(), *daemons_[HostOf(i, true)], "across-kill", n,
                                     i, {"--mode=loop", "--device=" + device()}));
    ASSERT_TRUE(c.ok()) << c.status();
    m.children.push_back(*std::move(c));
  }
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(m.children[i]->WaitForOutput("READY", kStartup))
        << "member " << i << " never got ready:\n" << m.children[i]->output();
  }
  absl::SleepFor(absl::Milliseconds(200));  // let them run a few ops
  m.children[n - 1]->Signal(SIGKILL);
  for (int i = 0; i < 2; ++i) {
    ChildResult r = m.children[i]->Wait(kFinish);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAILED", "code"), "ABORTED") << r.output;
    EXPECT_TRUE(absl::StrContains(Field(r.output, "FAILED", "msg"), "h1")) << r.output;
  }
  m.children.clear();
  std::vector<std::vector<std::string>> argvs;
  for (int i = 0; i < n; ++i) {
    argvs.push_back(WorkerArgv(WorkerBinary(), *daemons_[HostOf(i, true)], "across-after", n, i,
                               {"--mode=ops", "--device=" + device()}));
  }
  for (const ChildResult& r : RunAll(argvs, kFinish)) {
    EXPECT_EQ(r.exit_code, 0) << Tail(r.output);
    EXPECT_EQ(Field(r.output, "DONE", "failed"), "0") << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(GpuAcrossHosts, AcrossHostsE2eTest, ::testing::Values("cuda:0"),
                         [](const auto&) { return std::string("TwoDaemons"); });
INSTANTIATE_TEST_SUITE_P(HostAcrossHosts, AcrossHostsE2eTest, ::testing::Values("cpu"),
                         [](const auto&) { return std::string("TwoDaemons"); });

// Without a usable GPU in the daemon, a member process is refused its GPU
// buffer with the daemon's reason (and the worker says so rather than hang).
TEST(GpuE2eNoGpu, WorkerIsRefusedGpuMemorySayingWhy) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  absl::StatusOr<std::string> device = DaemonGpu(**daemon, "cuda:0");
  if (device.ok()) GTEST_SKIP() << "the daemon has a usable GPU (" << *device << ")";
  ASSERT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
  std::vector<ChildResult> r =
      RunAll({WorkerArgv(WorkerBinary(), **daemon, "no-gpu", 1, 0, {"--mode=ops"})}, kFinish);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].exit_code, 3) << r[0].output;
  EXPECT_EQ(Field(r[0].output, "ALLOCATE_FAILED", "code"), "FAILED_PRECONDITION") << r[0].output;
  EXPECT_EQ(Field(r[0].output, "ALLOCATE_FAILED", "msg"), device.status().message())
      << r[0].output;
}

}  // namespace
}  // namespace collectived::testing
