// collectivectl against a real daemon process, with real client sessions
// made by the SDK in this process: what each command shows, its JSON, and
// its answers when no daemon runs or the command line is wrong.
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "collectived/client.h"
#include "tests/ctl/sdk_members.h"
#include "tests/harness/harness.h"

namespace collectived {
namespace {

using testing::Child;
using testing::ChildResult;
using testing::Daemon;

constexpr absl::Duration kRun = absl::Seconds(20);

std::string CtlBinary() { return COLLECTIVECTL_BIN; }

ChildResult Ctl(const std::string& socket, std::vector<std::string> args) {
  std::vector<std::string> argv = {CtlBinary()};
  if (!socket.empty()) argv.push_back("--socket=" + socket);
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = Child::Start(argv);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return ChildResult{};
  return (*child)->Wait(kRun);
}

class CollectivectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = Daemon::Start();
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
  }
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(CollectivectlTest, ShowsSessionsMeshesPendingOpsAndStats) {
  const std::string socket = daemon_->socket();
  testing::SdkMembers m;
  ASSERT_TRUE(testing::MakeSdkMembers(socket, "ctl-mesh", 2, 1024, &m).ok());
  auto& meshes = m.meshes;
  auto& buffers = m.buffers;
  // Member 0 submits; member 1 has not yet: the op is pending.
  const Array x0 = Array::Of<float>(buffers[0], {16});
  OpFuture first = meshes[0]->psum_async(x0, "x");

  ChildResult sessions = Ctl(socket, {"sessions"});
  EXPECT_EQ(sessions.exit_code, 0) << sessions.output;
  EXPECT_TRUE(absl::StrContains(sessions.output, "ctl-mesh-0")) << sessions.output;
  EXPECT_TRUE(absl::StrContains(sessions.output, "ctl-mesh-1")) << sessions.output;

  ChildResult mesh_list = Ctl(socket, {"meshes"});
  EXPECT_EQ(mesh_list.exit_code, 0) << mesh_list.output;
  EXPECT_TRUE(absl::StrContains(mesh_list.output, "ctl-mesh")) << mesh_list.output;
  EXPECT_TRUE(absl::StrContains(mesh_list.output, "x=2")) << mesh_list.output;
  EXPECT_TRUE(absl::StrContains(mesh_list.output, meshes[0]->id())) << mesh_list.output;

  ChildResult pending = Ctl(socket, {"pending"});
  EXPECT_EQ(pending.exit_code, 0) << pending.output;
  EXPECT_TRUE(absl::StrContains(pending.output, "psum f32[16] over (x)")) << pending.output;
  ChildResult pending_json = Ctl(socket, {"--json", "pending", meshes[0]->id()});
  EXPECT_EQ(pending_json.exit_code, 0) << pending_json.output;
  EXPECT_TRUE(absl::StrContains(pending_json.output, "\"submitted\":[0]")) << pending_json.output;
  EXPECT_TRUE(absl::StrContains(pending_json.output, "\"missing\":[1]")) << pending_json.output;
  // By the name `meshes` shows, too; a name no mesh has is an error.
  ChildResult by_name = Ctl(socket, {"pending", "ctl-mesh"});
  EXPECT_EQ(by_name.exit_code, 0) << by_name.output;
  EXPECT_TRUE(absl::StrContains(by_name.output, "psum f32[16] over (x)")) << by_name.output;
  ChildResult no_such = Ctl(socket, {"pending", "no-such-mesh"});
  EXPECT_NE(no_such.exit_code, 0) << no_such.output;
  EXPECT_TRUE(absl::StrContains(no_such.output, "no mesh has the id or name 'no-such-mesh'"))
      << no_such.output;

  // Member 1 submits: the op completes, and the stats count it.
  const Array x1 = Array::Of<float>(buffers[1], {16});
  ASSERT_TRUE(meshes[1]->psum(x1, "x").ok());
  ASSERT_TRUE(first.Wait().ok());
  ChildResult none = Ctl(socket, {"pending"});
  EXPECT_TRUE(absl::StrContains(none.output, "(none)")) << none.output;

  ChildResult stats = Ctl(socket, {"stats"});
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  bool psum_row = false;
  for (absl::string_view line : absl::StrSplit(stats.output, '\n')) {
    if (absl::StartsWith(line, "psum ")) {
      std::vector<absl::string_view> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
      ASSERT_GE(cells.size(), 3u) << line;
      EXPECT_EQ(cells[1], "1") << "completed: " << line;
      EXPECT_EQ(cells[2], "0") << "failed: " << line;
      psum_row = true;
    }
  }
  EXPECT_TRUE(psum_row) << stats.output;
  EXPECT_TRUE(absl::StrContains(stats.output, "cpu")) << "buffers per device: " << stats.output;

  ChildResult status_json = Ctl(socket, {"--json", "status"});
  EXPECT_EQ(status_json.exit_code, 0) << status_json.output;
  EXPECT_TRUE(absl::StrContains(status_json.output, "\"sessions\":2")) << status_json.output;
  EXPECT_TRUE(absl::StrContains(status_json.output, "\"ops_completed\":\"1\"")) << status_json.output;

  ChildResult watch = Ctl(socket, {"--json", "watch", "--count=3", "--interval-ms=50"});
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  std::vector<std::string> lines = absl::StrSplit(watch.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << watch.output;
  for (const std::string& l : lines) {
    EXPECT_TRUE(absl::StrContains(l, "\"sessions\": 2")) << l;
    EXPECT_TRUE(absl::StrContains(l, "\"ops_completed\": 1")) << l;
  }

  ChildResult health = Ctl(socket, {"health"});
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_TRUE(absl::StrContains(health.output, "SERVING")) << health.output;
}

// A synchronous small op runs member-side: while member 0 waits in it for
// member 1, `pending` lists it from the mesh's segment.
TEST_F(CollectivectlTest, PendingShowsAMemberSideOpAndWhoIsMissing) {
  const std::string socket = daemon_->socket();
  testing::SdkMembers m;
  ASSERT_TRUE(testing::MakeSdkMembers(socket, "ctl-side", 2, 1024, &m).ok());
  ASSERT_TRUE(m.meshes[0]->member_side().ok()) << m.meshes[0]->member_side();
  absl::Status first;
  std::thread waiter(
      [&] { first = m.meshes[0]->psum(Array::Of<float>(m.buffers[0], {8}), "x"); });
  ChildResult pending;
  for (absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
    pending = Ctl(socket, {"pending"});
    if (absl::StrContains(pending.output, "member-side")) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(pending.exit_code, 0) << pending.output;
  // Its place among the mesh's member-side ops, not a daemon sequence.
  EXPECT_TRUE(absl::StrContains(pending.output, " m0 ")) << pending.output;
  EXPECT_TRUE(absl::StrContains(pending.output, "psum f32[8]")) << pending.output;
  EXPECT_TRUE(absl::StrContains(pending.output, "waiting (member-side)")) << pending.output;
  ChildResult json = Ctl(socket, {"--json", "pending", m.meshes[0]->id()});
  EXPECT_TRUE(absl::StrContains(json.output, "\"member_side\":true")) << json.output;
  EXPECT_TRUE(absl::StrContains(json.output, "\"submitted\":[0]")) << json.output;
  EXPECT_TRUE(absl::StrContains(json.output, "\"missing\":[1]")) << json.output;
  EXPECT_TRUE(m.meshes[1]->psum(Array::Of<float>(m.buffers[1], {8}), "x").ok());
  waiter.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(absl::StrContains(Ctl(socket, {"pending"}).output, "(none)"));
}

TEST_F(CollectivectlTest, FindsTheDaemonThroughTheEnvironmentAsTheSdkDoes) {
  std::vector<std::string> argv = {"/usr/bin/env", "COLLECTIVED_SOCKET=" + daemon_->socket(),
                                   CtlBinary(), "health"};
  auto child = Child::Start(argv);
  ASSERT_TRUE(child.ok()) << child.status();
  ChildResult r = (*child)->Wait(kRun);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CollectivectlNoDaemonTest, SaysNoDaemonAnswersAndExits3) {
  const std::string socket = testing::MakeTempDir() + "/absent.sock";
  for (const char* command : {"status", "sessions", "meshes", "pending", "stats", "health"}) {
    ChildResult r = Ctl(socket, {"--timeout-ms=500", command});
    EXPECT_EQ(r.exit_code, 3) << command << ": " << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "no daemon answers on " + socket)) << r.output;
  }
}

TEST(CollectivectlNoDaemonTest, BadCommandLinesExit2WithUsage) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{}, {"bogus"}, {"--frobnicate", "status"},
                                             {"sessions", "extra"}, {"watch", "--count=0"},
                                             {"--timeout-ms=x", "status"}}) {
    ChildResult r = Ctl("", args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << ": " << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "usage: collectivectl")) << r.output;
  }
}

// The daemon's own command line: --help lists its flags (absl's default
// matches none of them), named by the file that defines them, without the
// build machine's path.
TEST(DaemonCommandLineTest, HelpListsTheDaemonsFlags) {
  for (const char* flag : {"--help", "--helpshort"}) {
    auto child = Child::Start({testing::DaemonBinary(), flag});
    ASSERT_TRUE(child.ok()) << child.status();
    ChildResult r = (*child)->Wait(kRun);
    EXPECT_FALSE(absl::StrContains(r.output, "No flags matched")) << flag << ": " << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "Usage: collectived")) << flag << ": " << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, "Flags from daemon/server/main.cc:")) << r.output;
    for (const char* listed : {"--socket", "--tcp", "--cluster", "--member_op_bytes",
                               "--log_level"}) {
      EXPECT_TRUE(absl::StrContains(r.output, listed)) << flag << " lacks " << listed;
    }
    EXPECT_FALSE(absl::StrContains(r.output, "--flagfile")) << flag << " lists absl's flags";
  }
}

}  // namespace
}  // namespace collectived
