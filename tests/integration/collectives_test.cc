// Integration tests: a real collectived daemon and real member processes
// (collectived_test_worker) running every collective through the SDK, each
// worker checking its outputs bitwise against a naive reference model.
//
// The driver knows every sweep's case list (sweep.h), so it checks that every
// worker reported every case exactly once and OK, that the members of each
// group got bitwise-identical results where the semantics say so, and (in
// RepeatableAcrossDaemonsAndMeshes) that the same sweep gives the same bits
// on another daemon with another chunking and on concurrent meshes.
//
// Every test runs per backend, the same cases: its parameter is the device of
// the workers' buffers, "cpu" (host memory, the CPU executor) and, in the CUDA
// variant, "cuda:0" (GPU memory, the CUDA executor; every member on that one
// GPU). The CUDA instantiations are named CudaGpu* (label gpu); they skip,
// saying why, when the daemon cannot give this process GPU memory, and fail
// instead with COLLECTIVED_REQUIRE_GPU=1.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "collectived/client.h"
#include "gtest/gtest.h"
#include "tests/harness/device_probe.h"
#include "tests/harness/cluster.h"
#include "tests/harness/harness.h"
#include "tests/harness/member_memory.h"
#include "tests/integration/sweep.h"

namespace collectived::integration {
namespace {

using collectived::testing::ChildResult;
using collectived::testing::Daemon;
using collectived::testing::RunAll;

// Generous: the large sweep under ASan with a dozen processes on two cores.
constexpr absl::Duration kWorkerTimeout = absl::Seconds(300);

// Flags of the daemon for most tests: 4 KiB chunks so that arrays of a few
// thousand elements already take the executor's multi-chunk paths.
const std::vector<std::string> kSmallChunks = {"--chunk_bytes=4096", "--threads=3",
                                               "--log_level=warn"};

struct MeshRun {
  std::string mesh;   // mesh name
  std::string axes;   // "x:2,y:4"
  std::string sweep;  // main, large, async, errors
  uint64_t seed = 1;
  std::string device = "cpu";  // of every member's buffers
};

// The backends every test runs on: the device of the workers' buffers.
const char* const kCpu = "cpu";
#if COLLECTIVED_TESTS_HAVE_CUDA
const char* const kCuda = "cuda:0";
#endif

// "cuda:0" -> "cuda0": a test name's part.
std::string DeviceTag(const std::string& device) {
  std::string tag;
  for (char ch : device) {
    if (ch != ':') tag.push_back(ch);
  }
  return tag;
}

// Host memory always works; a GPU skips the test, saying why, when the
// daemon gives no memory there.
using ::collectived::testing::SkipUnlessDeviceUsable;

// Per member: case name -> hash of its output.
using MemberHashes = std::map<std::string, std::string>;

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

// Checks one mesh's worker results against its sweep; returns the hashes.
std::vector<MemberHashes> CheckMesh(const MeshRun& run, const std::vector<ChildResult>& results) {
  MeshSpec spec;
  EXPECT_TRUE(ParseMeshSpec(run.axes, &spec)) << run.axes;
  std::vector<Case> cases;
  EXPECT_TRUE(BuildSweep(run.sweep, spec, &cases)) << run.sweep;
  std::set<std::string> names;
  for (const Case& c : cases) EXPECT_TRUE(names.insert(c.name).second) << "duplicate case " << c.name;
  EXPECT_FALSE(cases.empty());

  std::vector<MemberHashes> hashes(results.size());
  for (size_t m = 0; m < results.size(); ++m) {
    const ChildResult& r = results[m];
    const std::string who = absl::StrCat("mesh ", run.mesh, " (", run.axes, ", sweep ", run.sweep,
                                         ", ", run.device, ") member ", m);
    EXPECT_FALSE(r.timed_out) << who << " timed out; output:\n" << Tail(r.output, 4000);
    EXPECT_EQ(r.exit_code, 0) << who << " exited " << r.exit_code << "; output:\n"
                              << Tail(r.output, 4000);
    std::istringstream lines(r.output);
    std::string line;
    std::vector<std::string> failures, unexpected, duplicates, other;
    bool done = false;
    while (std::getline(lines, line)) {
      if (line.rfind("DONE ", 0) == 0) {
        done = true;
        continue;
      }
      if (line.rfind("CASE ", 0) != 0) {
        if (!line.empty()) other.push_back(line);
        continue;
      }
      std::istringstream words(line.substr(5));
      std::string name, verdict, hash;
      words >> name >> verdict >> hash;
      if (!names.count(name)) {
        unexpected.push_back(name);
      } else if (hashes[m].count(name)) {
        duplicates.push_back(name);
      } else if (verdict == "OK" && !hash.empty()) {
        hashes[m][name] = hash;
      } else {
        failures.push_back(line);
      }
    }
    EXPECT_TRUE(done) << who << " printed no DONE line; output:\n" << Tail(r.output, 4000);
    std::vector<std::string> missing;
    for (const Case& c : cases) {
      if (!hashes[m].count(c.name) &&
          std::none_of(failures.begin(), failures.end(),
                       [&](const std::string& f) { return f.rfind("CASE " + c.name + " ", 0) == 0; })) {
        missing.push_back(c.name);
      }
    }
    EXPECT_EQ(hashes[m].size(), cases.size())
        << who << ": " << hashes[m].size() << " of " << cases.size() << " cases OK";
    if (!failures.empty()) {
      std::vector<std::string> first(failures.begin(),
                                     failures.begin() + std::min<size_t>(failures.size(), 25));
      ADD_FAILURE() << who << ": " << failures.size() << " failed cases, e.g.\n"
                    << absl::StrJoin(first, "\n");
    }
    EXPECT_TRUE(missing.empty()) << who << ": " << missing.size() << " cases never reported, e.g. "
                                 << missing.front();
    EXPECT_TRUE(unexpected.empty()) << who << ": unexpected case " << unexpected.front();
    EXPECT_TRUE(duplicates.empty()) << who << ": case reported twice: " << duplicates.front();
    if (!other.empty()) {
      // FATAL lines (connect/join/allocate) and sanitizer reports land here.
      bool fatal = std::any_of(other.begin(), other.end(), [](const std::string& l) {
        return l.rfind("FATAL", 0) == 0 || l.find("Sanitizer") != std::string::npos;
      });
      EXPECT_FALSE(fatal) << who << ":\n" << Tail(r.output, 4000);
    }
  }

  // Members of one group must hold bitwise-identical results where the
  // semantics say so (reductions, all_gather, broadcast, the error cases'
  // follow-up psum, whose hash also covers its sequence number).
  for (const Case& c : cases) {
    if (!c.group_identical) continue;
    std::map<int, std::pair<int, std::string>> first_of_group;  // key -> (member, hash)
    for (size_t m = 0; m < results.size(); ++m) {
      auto it = hashes[m].find(c.name);
      if (it == hashes[m].end()) continue;
      const int key = GroupOf(spec, c.axes, static_cast<int>(m), c.op == Op::kPpermute).key;
      auto [g, inserted] = first_of_group.try_emplace(key, static_cast<int>(m), it->second);
      if (!inserted) {
        EXPECT_EQ(g->second.second, it->second)
            << "case " << c.name << " on mesh " << run.mesh << ": members " << g->second.first
            << " and " << m << " of one group got different results";
      }
    }
  }
  return hashes;
}

// Starts one worker per member of every mesh in `runs` (all at once), member
// m of M against daemons[m % daemons.size()] (members spread round robin
// over the hosts of a cluster) or, `in_runs`, daemons[m * daemons.size() /
// M] (each host a contiguous run of members), and checks them; returns the
// hashes per mesh and member.
std::vector<std::vector<MemberHashes>> RunMeshesOn(const std::vector<const Daemon*>& daemons,
                                                   const std::vector<MeshRun>& runs,
                                                   bool in_runs = false) {
  std::vector<std::vector<std::string>> argvs;
  std::vector<size_t> first;
  for (const MeshRun& run : runs) {
    MeshSpec spec;
    EXPECT_TRUE(ParseMeshSpec(run.axes, &spec));
    first.push_back(argvs.size());
    for (int m = 0; m < spec.num_members(); ++m) {
      const size_t host = in_runs ? m * daemons.size() / spec.num_members() : m % daemons.size();
      argvs.push_back({COLLECTIVED_TEST_WORKER_BIN, "--socket=" + daemons[host]->socket(),
                       "--mesh=" + run.mesh, "--axes=" + run.axes,
                       absl::StrCat("--member=", m), "--sweep=" + run.sweep,
                       absl::StrCat("--seed=", run.seed), "--device=" + run.device});
    }
  }
  std::vector<ChildResult> results = RunAll(argvs, kWorkerTimeout);
  std::vector<std::vector<MemberHashes>> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const size_t end = i + 1 < runs.size() ? first[i + 1] : results.size();
    out.push_back(CheckMesh(runs[i], std::vector<ChildResult>(results.begin() + first[i],
                                                              results.begin() + end)));
  }
  return out;
}

std::vector<std::vector<MemberHashes>> RunMeshes(const Daemon& daemon,
                                                 const std::vector<MeshRun>& runs) {
  return RunMeshesOn({&daemon}, runs);
}

std::unique_ptr<Daemon> StartDaemon(std::vector<std::string> flags = kSmallChunks) {
  auto d = Daemon::Start(std::move(flags));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// The daemon must still stop cleanly on SIGTERM after the workers are gone.
void StopDaemon(std::unique_ptr<Daemon> d) {
  ChildResult r = d->Stop(absl::Seconds(30));
  EXPECT_FALSE(r.timed_out) << "daemon did not stop on SIGTERM";
  EXPECT_EQ(r.exit_code, 0) << "daemon log:\n" << Tail(r.output, 6000);
}

// ---------------------------------------------------------------------------
// Large buffers, async batches, error paths and repeatability, per backend
// (the parameter: the device). Defined before the main sweep so that the CPU
// tests keep their order (the long LargeBuffers first), which is the order
// ctest -j starts them in on a fresh build.

class CollectivesIntegration : public ::testing::TestWithParam<std::string> {
 protected:
  // A daemon with `flags` that can give this process memory on the device;
  // null (the test skipped or failed) otherwise.
  std::unique_ptr<Daemon> StartDaemonFor(std::vector<std::string> flags = kSmallChunks) {
    auto daemon = StartDaemon(std::move(flags));
    if (daemon == nullptr) return nullptr;
    SkipUnlessDeviceUsable(daemon->socket(), GetParam());
    if (IsSkipped() || HasFailure()) return nullptr;
    return daemon;
  }
};

// Multi-MiB buffers (1024 chunks of 4 KiB) on two meshes at once.
TEST_P(CollectivesIntegration, LargeBuffers) {
  auto daemon = StartDaemonFor();
  if (daemon == nullptr) return;
  const std::string& device = GetParam();
  RunMeshes(*daemon, {{"large-x4", "x:4", "large", 7, device},
                      {"large-x2y4", "x:2,y:4", "large", 8, device}});
  StopDaemon(std::move(daemon));
}

// Batches of 8 ops submitted with the *_async API before any is waited for.
TEST_P(CollectivesIntegration, AsyncOpsOutstanding) {
  auto daemon = StartDaemonFor();
  if (daemon == nullptr) return;
  const std::string& device = GetParam();
  RunMeshes(*daemon, {{"async-x2y4", "x:2,y:4", "async", 11, device},
                      {"async-x3", "x:3", "async", 12, device}});
  StopDaemon(std::move(daemon));
}

// Invalid ops rejected at submit (in place with a different result size,
// out-of-range regions, unknown axes, ...), each followed by a valid psum.
TEST_P(CollectivesIntegration, ErrorPathsLeaveMeshUsable) {
  auto daemon = StartDaemonFor();
  if (daemon == nullptr) return;
  const std::string& device = GetParam();
  RunMeshes(*daemon, {{"errors-x2y2", "x:2,y:2", "errors", 21, device},
                      {"errors-x3", "x:3", "errors", 22, device}});
  StopDaemon(std::move(daemon));
}

// The same sweep on two daemons (different chunk size and thread count) and
// on two meshes running concurrently: every member's every result must be
// the same bits everywhere.
TEST_P(CollectivesIntegration, RepeatableAcrossDaemonsAndMeshes) {
  const std::string axes = "x:2,y:2";
  const uint64_t seed = 31;
  const std::string& device = GetParam();
  std::vector<std::vector<MemberHashes>> runs;
  {
    auto daemon = StartDaemonFor();
    if (daemon == nullptr) return;
    auto r = RunMeshes(*daemon, {{"repeat-1", axes, "main", seed, device}});
    runs.push_back(r[0]);
    StopDaemon(std::move(daemon));
  }
  {
    auto daemon = StartDaemonFor({"--threads=1", "--log_level=warn"});  // default chunks
    ASSERT_NE(daemon, nullptr);
    auto r = RunMeshes(*daemon, {{"repeat-2a", axes, "main", seed, device},
                                 {"repeat-2b", axes, "main", seed, device}});
    runs.push_back(r[0]);
    runs.push_back(r[1]);
    StopDaemon(std::move(daemon));
  }
  ASSERT_EQ(runs.size(), 3u);
  for (size_t m = 0; m < runs[0].size(); ++m) {
    EXPECT_FALSE(runs[0][m].empty());
    for (size_t k = 1; k < runs.size(); ++k) {
      ASSERT_EQ(runs[k].size(), runs[0].size());
      for (const auto& [name, hash] : runs[0][m]) {
        auto it = runs[k][m].find(name);
        if (it == runs[k][m].end()) continue;  // already reported as failed
        EXPECT_EQ(it->second, hash) << "case " << name << " member " << m << ": run " << k
                                    << " differs from run 0";
      }
    }
  }
}

std::string DeviceTestName(const ::testing::TestParamInfo<std::string>& info) {
  return DeviceTag(info.param);
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectivesIntegration, ::testing::Values(kCpu),
                         DeviceTestName);
#if COLLECTIVED_TESTS_HAVE_CUDA
INSTANTIATE_TEST_SUITE_P(CudaGpu, CollectivesIntegration, ::testing::Values(kCuda),
                         DeviceTestName);
#endif

// ---------------------------------------------------------------------------
// The main sweep on every mesh shape.

struct MeshConfig {
  const char* test_name;
  const char* axes;
  uint64_t seed;
};

void PrintTo(const MeshConfig& c, std::ostream* os) { *os << c.axes; }

const MeshConfig kMeshes[] = {
    {"x1", "x:1", 101},  // a mesh of one member
    {"x2", "x:2", 102},
    {"x3", "x:3", 103},
    {"x4", "x:4", 104},
    {"x8", "x:8", 108},
    {"x2y2", "x:2,y:2", 122},
    {"x2y4", "x:2,y:4", 124},
    // A size-1 axis (groups of one) and non-adjacent axis pairs.
    {"x2y1z3", "x:2,y:1,z:3", 213},
};

// (device, mesh)
class MainSweepTest : public ::testing::TestWithParam<std::tuple<std::string, MeshConfig>> {};

TEST_P(MainSweepTest, EveryOpDtypeShapeAndPlacement) {
  const auto& [device, cfg] = GetParam();
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  SkipUnlessDeviceUsable(daemon->socket(), device);
  if (IsSkipped() || HasFatalFailure()) return;
  RunMeshes(*daemon,
            {{absl::StrCat("main-", cfg.test_name), cfg.axes, "main", cfg.seed, device}});
  StopDaemon(std::move(daemon));
}

std::string MeshTestName(const ::testing::TestParamInfo<MainSweepTest::ParamType>& info) {
  return std::get<1>(info.param).test_name;
}

INSTANTIATE_TEST_SUITE_P(Meshes, MainSweepTest,
                         ::testing::Combine(::testing::Values(kCpu), ::testing::ValuesIn(kMeshes)),
                         MeshTestName);
#if COLLECTIVED_TESTS_HAVE_CUDA
INSTANTIATE_TEST_SUITE_P(CudaGpuMeshes, MainSweepTest,
                         ::testing::Combine(::testing::Values(kCuda), ::testing::ValuesIn(kMeshes)),
                         MeshTestName);
#endif

#if COLLECTIVED_TESTS_HAVE_GLOO
// ---------------------------------------------------------------------------
// The main sweep with each mesh's members spread round robin over the
// daemons of a cluster on loopback (2 and 3 hosts): every op, dtype, shape
// and axis choice across hosts must give the reference results.

// (hosts, mesh)
class AcrossHostsSweepTest : public ::testing::TestWithParam<std::tuple<int, MeshConfig>> {};

void SweepAcrossHosts(int hosts, const MeshConfig& cfg, bool in_runs) {
  // kSmallChunks but the log level: the cluster is watched in the logs.
  auto cluster = collectived::testing::StartLoopbackCluster(
      hosts, {"--chunk_bytes=4096", "--threads=3"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<const Daemon*> daemons;
  for (const auto& d : *cluster) daemons.push_back(d.get());
  RunMeshesOn(daemons, {{absl::StrCat("hosts-", cfg.test_name), cfg.axes, "main", cfg.seed, kCpu}},
              in_runs);
  for (auto& d : *cluster) StopDaemon(std::move(d));
}

TEST_P(AcrossHostsSweepTest, EveryOpDtypeShapeAndPlacement) {
  const auto& [hosts, cfg] = GetParam();
  SweepAcrossHosts(hosts, cfg, /*in_runs=*/false);
}

// Each host holding a contiguous run of the members: the layout whose
// reductions over the whole mesh take the chain (each host folds its own
// members and passes one running result on, spanning.h).
class InRunsAcrossHostsSweepTest : public AcrossHostsSweepTest {};

TEST_P(InRunsAcrossHostsSweepTest, EveryOpDtypeShapeAndPlacement) {
  const auto& [hosts, cfg] = GetParam();
  SweepAcrossHosts(hosts, cfg, /*in_runs=*/true);
}

const MeshConfig kSpreadMeshes[] = {
    {"x2", "x:2", 102}, {"x3", "x:3", 103}, {"x4", "x:4", 104},
    {"x2y4", "x:2,y:4", 124}, {"x2y1z3", "x:2,y:1,z:3", 213},
};

std::string HostsTestName(const ::testing::TestParamInfo<AcrossHostsSweepTest::ParamType>& info) {
  return absl::StrCat(std::get<1>(info.param).test_name, "_on_", std::get<0>(info.param),
                      "_hosts");
}

INSTANTIATE_TEST_SUITE_P(Hosts, AcrossHostsSweepTest,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::ValuesIn(kSpreadMeshes)),
                         HostsTestName);
INSTANTIATE_TEST_SUITE_P(HostsInRuns, InRunsAcrossHostsSweepTest,
                         ::testing::Values(std::make_tuple(2, kSpreadMeshes[2]),
                                           std::make_tuple(3, kSpreadMeshes[3])),
                         HostsTestName);
#endif

#if COLLECTIVED_TESTS_HAVE_CUDA
// ---------------------------------------------------------------------------
// Host and GPU memory in one op: the daemon refuses it, with
// FAILED_PRECONDITION on every member, and writes nothing. Member 0 (host
// memory) and member 1 (cuda:0) are two clients of this process.
TEST(CudaGpuMixedMemory, CpuAndCudaMembersOfOneOpAreRefused) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  SkipUnlessDeviceUsable(daemon->socket(), kCuda);
  if (IsSkipped() || HasFatalFailure()) return;

  const std::vector<std::string> devices = {kCpu, kCuda};
  constexpr int64_t kElements = 256;
  constexpr size_t kBytes = 4 * kElements;
  std::vector<absl::Status> op_status(devices.size());
  std::vector<std::string> problems(devices.size());
  std::vector<std::thread> members;
  for (size_t m = 0; m < devices.size(); ++m) {
    members.emplace_back([&, m] {
      std::string& problem = problems[m];
      auto memory = collectived::testing::MemberMemory::ForDevice(devices[m]);
      if (!memory.ok()) return void(problem = memory.status().ToString());
      auto client = Client::Connect({.socket_path = daemon->socket(),
                                     .client_name = absl::StrCat("mixed-", m)});
      if (!client.ok()) return void(problem = "connect: " + client.status().ToString());
      auto buffer = (*memory)->Allocate(**client, 2 * kBytes);
      if (!buffer.ok()) return void(problem = "allocate: " + buffer.status().ToString());
      std::vector<uint8_t> before(2 * kBytes);
      for (size_t k = 0; k < before.size(); ++k) before[k] = static_cast<uint8_t>(k * 7 + m);
      if (absl::Status st = (*memory)->Write(*buffer, 0, before.data(), before.size()); !st.ok()) {
        return void(problem = "write: " + st.ToString());
      }
      auto mesh = (*client)->JoinMesh({.name = "mixed",
                                       .axes = {{"x", 2}},
                                       .coordinate = {static_cast<int>(m)},
                                       .join_timeout = absl::Seconds(60),
                                       .op_timeout = absl::Seconds(60)});
      if (!mesh.ok()) return void(problem = "join: " + mesh.status().ToString());
      op_status[m] = (*mesh)->psum(Array{&*buffer, 0, DType::kF32, {kElements}}, "x",
                                   Array{&*buffer, kBytes, DType::kF32, {kElements}});
      auto after = (*memory)->Read(*buffer, 0, before.size());
      if (!after.ok()) return void(problem = "read: " + after.status().ToString());
      if (*after != before) problem = "the refused op changed the buffer";
      // Leave only after both members have their answer.
      if (absl::Status st = (*mesh)->barrier(); !st.ok()) problem = "barrier: " + st.ToString();
    });
  }
  for (std::thread& t : members) t.join();
  for (size_t m = 0; m < devices.size(); ++m) {
    EXPECT_EQ(problems[m], "") << "member " << m << " (" << devices[m] << ")";
    EXPECT_EQ(op_status[m].code(), absl::StatusCode::kFailedPrecondition)
        << "member " << m << " (" << devices[m] << "): " << op_status[m];
    EXPECT_TRUE(absl::StrContains(op_status[m].message(), "mixes kinds of memory across members"))
        << "member " << m << ": " << op_status[m];
  }
  StopDaemon(std::move(daemon));
}
#endif

}  // namespace
}  // namespace collectived::integration
