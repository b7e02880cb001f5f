// JAX conformance: every case of tests/conformance/data/vectors.json (made by
// gen_vectors.py from real jax.lax collectives) runs through a real daemon
// with one real client process per mesh member, and each member's result must
// equal JAX's bit for bit. One test per mesh layout and backend: the
// workers' buffers in host memory ("cpu", Layouts/*) and, in the CUDA variant,
// on "cuda:0" (CudaGpuLayouts/*, label gpu), the same cases. The GPU ones skip,
// saying why, when the daemon cannot give this process GPU memory, and fail
// instead with COLLECTIVED_REQUIRE_GPU=1.
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "collectived/client.h"
#include "gtest/gtest.h"
#include "tests/conformance/vectors.h"
#include "tests/harness/device_probe.h"
#include "tests/harness/cluster.h"
#include "tests/harness/harness.h"

namespace collectived::conformance {
namespace {

using collectived::testing::ChildResult;
using collectived::testing::Daemon;
using collectived::testing::RunAll;

// The layouts gen_vectors.py generates (its MESHES table).
const std::vector<std::string> kLayouts = {"x:1",     "x:2",     "x:3",     "x:4",
                                           "x:8",     "x:2,y:1", "x:2,y:2", "x:2,y:4"};

std::string VectorsPath() {
  return std::string(COLLECTIVED_SOURCE_DIR) + "/tests/conformance/data/vectors.json";
}

// Loaded once per test binary.
const Vectors& LoadedVectors() {
  static const Vectors* v = [] {
    auto loaded = LoadVectors(VectorsPath());
    if (!loaded.ok()) {
      ADD_FAILURE() << "cannot load " << VectorsPath() << ": " << loaded.status();
      return new Vectors();
    }
    return new Vectors(*std::move(loaded));
  }();
  return *v;
}

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

TEST(ConformanceVectors, LayoutsMatchTheData) {
  const Vectors& v = LoadedVectors();
  ASSERT_FALSE(v.cases.empty());
  std::map<std::string, int> per_layout;
  std::set<std::string> names;
  for (const Case& c : v.cases) {
    ++per_layout[LayoutString(c.mesh)];
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
  }
  std::set<std::string> expected(kLayouts.begin(), kLayouts.end());
  for (const auto& [layout, n] : per_layout) {
    EXPECT_TRUE(expected.count(layout)) << "layout " << layout << " (" << n
                                        << " cases) has no test; add it to kLayouts";
  }
  for (const std::string& layout : kLayouts) {
    EXPECT_GT(per_layout[layout], 0) << "no cases for layout " << layout;
  }
}

const char* const kCpu = "cpu";
#if COLLECTIVED_TESTS_HAVE_CUDA
const char* const kCuda = "cuda:0";
#endif

// Host memory always works; a GPU skips the test, saying why, when the
// daemon gives no memory there.
using ::collectived::testing::SkipUnlessDeviceUsable;

// (device of the workers' buffers, mesh layout)
class ConformanceTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// Every case of `layout_text` on `device`, with the members spread round
// robin over `hosts` daemons (a cluster on loopback when more than one).
void RunConformance(const std::string& device, const std::string& layout_text, int hosts) {
  const Vectors& v = LoadedVectors();
  auto layout = ParseLayout(layout_text);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::set<std::string> case_names;
  for (const Case& c : v.cases) {
    if (c.mesh == *layout) case_names.insert(c.name);
  }
  ASSERT_GT(case_names.size(), 0u) << "no cases for layout " << layout_text;
  const int members = NumMembers(*layout);

  std::vector<std::unique_ptr<Daemon>> daemons;
  if (hosts == 1) {
    auto daemon = Daemon::Start({"--log_level=warn"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemons.push_back(*std::move(daemon));
  } else {
    auto cluster = collectived::testing::StartLoopbackCluster(hosts);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    daemons = *std::move(cluster);
  }
  SkipUnlessDeviceUsable(daemons[0]->socket(), device);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;

  std::vector<std::vector<std::string>> argvs;
  for (int m = 0; m < members; ++m) {
    argvs.push_back({COLLECTIVED_CONFORMANCE_WORKER,
                     "--socket=" + daemons[m % hosts]->socket(),
                     "--vectors=" + VectorsPath(), "--mesh=" + layout_text,
                     absl::StrCat("--member=", m), "--device=" + device});
  }
  const absl::Time start = absl::Now();
  std::vector<ChildResult> results = RunAll(argvs, absl::Seconds(180));
  const absl::Duration took = absl::Now() - start;

  // Per case (in file order): the members that failed it and their details.
  std::map<std::string, std::vector<std::pair<int, std::string>>> failed_cases;
  bool broken = false;  // a member crashed, hung or did not report every case
  for (int m = 0; m < members; ++m) {
    const ChildResult& r = results[m];
    std::set<std::string> ok;
    size_t reported = 0;
    std::vector<std::string> other;  // lines that are not CASE lines
    for (absl::string_view line : absl::StrSplit(r.output, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> words = absl::StrSplit(line, absl::MaxSplits(' ', 2));
      if (words.size() >= 3 && words[0] == "CASE") {
        const std::string name(words[1]);
        EXPECT_TRUE(case_names.count(name)) << "member " << m << " reported an unknown case: "
                                            << line;
        ++reported;
        if (words[2] == "OK") {
          EXPECT_TRUE(ok.insert(name).second) << "member " << m << " reported a case twice: "
                                              << line;
        } else {
          std::string detail(words[2]);
          if (absl::StartsWith(detail, "FAIL ")) detail = detail.substr(5);
          failed_cases[name].emplace_back(m, detail);
        }
      } else if (!absl::StartsWith(line, "WORKER ") && !absl::StartsWith(line, "SUMMARY ")) {
        other.push_back(std::string(line));
      }
    }
    if (r.timed_out || (r.exit_code != 0 && r.exit_code != 1) || reported != case_names.size()) {
      broken = true;
    }
    EXPECT_FALSE(r.timed_out) << "member " << m << " timed out; output tail:\n"
                              << Tail(r.output, 4000);
    EXPECT_EQ(r.exit_code, 0) << "member " << m << " of " << layout_text << " on " << device
                              << " (" << case_names.size() - ok.size() << " case(s) not OK)"
                              << (other.empty() ? "" : "; other output:\n")
                              << Tail(absl::StrJoin(other, "\n"), 4000);
    EXPECT_EQ(ok.size(), case_names.size())
        << "member " << m << " of " << layout_text << " passed " << ok.size() << " of "
        << case_names.size() << " cases";
  }
  if (!failed_cases.empty()) {
    // Grouped by op and dtype, then each failing case with its members.
    std::map<std::string, std::vector<std::string>> by_op_dtype;
    std::string lines;
    for (const Case& c : v.cases) {
      auto it = failed_cases.find(c.name);
      if (c.mesh != *layout || it == failed_cases.end()) continue;
      by_op_dtype[absl::StrCat(c.op, "/", c.dtype)].push_back(c.name);
      std::vector<int> who;
      for (const auto& [m, detail] : it->second) who.push_back(m);
      absl::StrAppend(&lines, "CASE ", c.name, " FAIL on member(s) [", absl::StrJoin(who, ","),
                      "]\n");
      for (size_t i = 0; i < it->second.size() && i < 2; ++i) {
        absl::StrAppend(&lines, "    member ", it->second[i].first, ": ", it->second[i].second,
                        "\n");
      }
    }
    std::string summary;
    for (const auto& [key, names] : by_op_dtype) {
      absl::StrAppend(&summary, "  ", key, ": ", names.size(), "\n");
    }
    ADD_FAILURE() << failed_cases.size() << " of " << case_names.size() << " cases of "
                  << layout_text << " differ from JAX; by op/dtype:\n"
                  << summary << lines;
  }
  if (broken) {
    for (auto& daemon : daemons) {
      ChildResult log = daemon->Stop();
      ADD_FAILURE() << "a member did not finish normally; daemon log tail:\n"
                    << Tail(log.output, 4000);
    }
  }
  std::printf("layout %s on %s over %d host(s): %zu cases x %d members in %s\n",
              layout_text.c_str(), device.c_str(), hosts, case_names.size(), members,
              absl::FormatDuration(took).c_str());
}

TEST_P(ConformanceTest, MatchesJax) {
  const auto& [device, layout_text] = GetParam();
  RunConformance(device, layout_text, 1);
}

// The same cases with the members spread over 2 and 3 daemons of a cluster
// (Gloo between them): every result must still equal JAX's.
class ConformanceAcrossHostsTest
    : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ConformanceAcrossHostsTest, MatchesJax) {
  const auto& [hosts, layout_text] = GetParam();
  RunConformance(kCpu, layout_text, hosts);
}

std::string LayoutTestName(const ::testing::TestParamInfo<ConformanceTest::ParamType>& info) {
  auto layout = ParseLayout(std::get<1>(info.param));
  return layout.ok() ? LayoutTag(*layout) : std::string("invalid");
}

#if COLLECTIVED_TESTS_HAVE_GLOO
// Layouts with at least as many members as hosts.
const std::vector<std::string> kSpreadLayouts = {"x:2", "x:3", "x:4", "x:2,y:2", "x:2,y:4"};

std::string HostsTestName(
    const ::testing::TestParamInfo<ConformanceAcrossHostsTest::ParamType>& info) {
  auto layout = ParseLayout(std::get<1>(info.param));
  return absl::StrCat(layout.ok() ? LayoutTag(*layout) : std::string("invalid"), "_on_",
                      std::get<0>(info.param), "_hosts");
}

INSTANTIATE_TEST_SUITE_P(Hosts, ConformanceAcrossHostsTest,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::ValuesIn(kSpreadLayouts)),
                         HostsTestName);
#endif

INSTANTIATE_TEST_SUITE_P(Layouts, ConformanceTest,
                         ::testing::Combine(::testing::Values(kCpu), ::testing::ValuesIn(kLayouts)),
                         LayoutTestName);
#if COLLECTIVED_TESTS_HAVE_CUDA
INSTANTIATE_TEST_SUITE_P(CudaGpuLayouts, ConformanceTest,
                         ::testing::Combine(::testing::Values(kCuda), ::testing::ValuesIn(kLayouts)),
                         LayoutTestName);
#endif

}  // namespace
}  // namespace collectived::conformance
