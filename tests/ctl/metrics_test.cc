// The daemon's Prometheus endpoint (--metrics): a real daemon process, real
// sessions from the SDK, scraped over HTTP; the values move as ops run.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "collectived/client.h"
#include "tests/ctl/sdk_members.h"
#include "tests/harness/eventually.h"
#include "tests/harness/harness.h"

namespace collectived {
namespace {

using testing::Daemon;

// GET /metrics; the body, or "" when the request failed.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (!absl::StartsWith(resp, "HTTP/1.") || body == std::string::npos) return "";
  return resp.substr(body + 4);
}

// The value of the sample `series` (name and labels exactly as exposed, e.g.
// collectived_sessions or collectived_ops_total{code="OK",kind="psum"}), or
// -1 when it is absent.
double Value(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      double v = 0;
      if (absl::SimpleAtod(line, &v)) return v;
    }
  }
  return -1;
}

TEST(MetricsTest, ValuesMoveAsOpsRun) {
  const int port = testing::UnusedFixedPort();
  ASSERT_GT(port, 0);
  auto daemon = Daemon::Start({absl::StrCat("--metrics=127.0.0.1:", port)});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::string before = Scrape(port);
  ASSERT_FALSE(before.empty()) << "no answer on /metrics";
  EXPECT_EQ(Value(before, "collectived_sessions"), 0) << before;
  EXPECT_EQ(Value(before, "collectived_pending_ops{state=\"waiting\"}"), 0) << before;
  EXPECT_EQ(Value(before, "collectived_meshes"), 0) << before;
  // Not in a cluster: no cluster series.
  EXPECT_FALSE(absl::StrContains(before, "collectived_cluster_")) << before;

  testing::SdkMembers m;
  ASSERT_TRUE(testing::MakeSdkMembers((*daemon)->socket(), "metrics", 2, 4096, &m).ok());
  auto& meshes = m.meshes;
  auto& buffers = m.buffers;
  // A waiting op shows as pending (once the daemon has taken the
  // asynchronous submission).
  OpFuture waiting = meshes[0]->psum_async(Array::Of<float>(buffers[0], {64}), "x");
  std::string mid;
  testing::Eventually([&] {
    mid = Scrape(port);
    return Value(mid, "collectived_pending_ops{state=\"waiting\"}") == 1;
  });
  EXPECT_EQ(Value(mid, "collectived_sessions"), 2) << mid;
  EXPECT_EQ(Value(mid, "collectived_pending_ops{state=\"waiting\"}"), 1) << mid;
  EXPECT_EQ(Value(mid, "collectived_buffers{device=\"cpu\",kind=\"memfd\"}"), 2) << mid;
  EXPECT_GE(Value(mid, "collectived_buffer_bytes{device=\"cpu\",kind=\"memfd\"}"), 8192) << mid;

  // Three psums complete; then a mismatch fails one op on both members.
  ASSERT_TRUE(meshes[1]->psum(Array::Of<float>(buffers[1], {64}), "x").ok());
  ASSERT_TRUE(waiting.Wait().ok());
  for (int k = 0; k < 2; ++k) {
    std::vector<OpFuture> f;
    for (int i = 0; i < 2; ++i) f.push_back(meshes[i]->psum_async(Array::Of<float>(buffers[i], {64}), "x"));
    for (auto& x : f) ASSERT_TRUE(x.Wait().ok());
  }
  OpFuture a = meshes[0]->psum_async(Array::Of<float>(buffers[0], {64}), "x");
  OpFuture b = meshes[1]->pmax_async(Array::Of<float>(buffers[1], {64}), "x");
  EXPECT_EQ(a.Wait().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.Wait().code(), absl::StatusCode::kFailedPrecondition);

  const std::string after = Scrape(port);
  EXPECT_TRUE(absl::StrContains(after, "# TYPE collectived_ops_total counter")) << after;
  EXPECT_TRUE(absl::StrContains(after, "# TYPE collectived_op_latency_seconds histogram")) << after;
  EXPECT_EQ(Value(after, "collectived_ops_total{code=\"OK\",kind=\"psum\"}"), 3) << after;
  // The mismatched op is counted once, under one of the kinds submitted.
  double mismatched = 0;
  for (const char* kind : {"psum", "pmax"}) {
    mismatched += std::max(0.0, Value(after, absl::StrCat("collectived_ops_total{code=\"FAILED_"
                                                          "PRECONDITION\",kind=\"",
                                                          kind, "\"}")));
  }
  EXPECT_EQ(mismatched, 1) << after;
  EXPECT_EQ(Value(after, "collectived_op_latency_seconds_count{kind=\"psum\",size=\"le4KiB\"}"), 3)
      << after;
  EXPECT_EQ(Value(after, "collectived_op_input_bytes_total{kind=\"psum\"}"), 3 * 2 * 64 * 4) << after;
  EXPECT_GT(Value(after, "collectived_bytes_moved_total{kind=\"psum\",direction=\"written\"}"), 0)
      << after;
  EXPECT_EQ(Value(after, "collectived_pending_ops{state=\"waiting\"}"), 0) << after;
  // Eight submissions, all through the SDK: the fast path's queue, or the
  // Execute stream where the fast path is off (COLLECTIVED_FAST_PATH=0).
  const bool fast = getenv("COLLECTIVED_FAST_PATH") == nullptr ||
                    std::string(getenv("COLLECTIVED_FAST_PATH")) != "0";
  EXPECT_EQ(Value(after, "collectived_ops_submitted_total{path=\"fast_path\"}"), fast ? 8 : 0)
      << after;
  EXPECT_EQ(Value(after, "collectived_ops_submitted_total{path=\"execute\"}"), fast ? 0 : 8)
      << after;
  EXPECT_EQ(Value(after, "collectived_ops_submitted_total{path=\"unary\"}"), 0) << after;
}

// A member-side op (small, in place, among the members) that times out is
// counted as the daemon's own ops are: alerts on DEADLINE_EXCEEDED see the
// commonest hang, a member that never comes.
TEST(MetricsTest, AMemberSideTimeoutIsCountedAsDeadlineExceeded) {
  const int port = testing::UnusedFixedPort();
  ASSERT_GT(port, 0);
  auto daemon = Daemon::Start({absl::StrCat("--metrics=127.0.0.1:", port)});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  testing::SdkMembers m;
  ASSERT_TRUE(testing::MakeSdkMembers((*daemon)->socket(), "metrics-timeout", 2, 4096, &m,
                                      absl::Milliseconds(300))
                  .ok());
  ASSERT_TRUE(m.meshes[0]->member_side().ok()) << m.meshes[0]->member_side();
  // Member 1 never submits.
  const absl::Status st = m.meshes[0]->psum(Array::Of<float>(m.buffers[0], {4}), "x");
  ASSERT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "member-side")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "member 0 is waiting in psum f32[4]")) << st;
  const std::string after = Scrape(port);
  EXPECT_EQ(Value(after, "collectived_ops_total{code=\"DEADLINE_EXCEEDED\",kind=\"psum\"}"), 1)
      << after;
}

TEST(MetricsTest, ADaemonInAClusterShowsItsState) {
  // A cluster of one: the daemon serves the coordinator and joins it.
  const int port = testing::UnusedFixedPort();
  ASSERT_GT(port, 0);
  auto daemon = Daemon::Start({absl::StrCat("--metrics=127.0.0.1:", port), "--tcp=127.0.0.1:0",
                               "--coordinator", "--host-id=solo"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::string text;
  testing::Eventually([&] {
    text = Scrape(port);
    return Value(text, "collectived_cluster_state{host_id=\"solo\",state=\"joined\"}") == 1;
  });
  EXPECT_EQ(Value(text, "collectived_cluster_state{host_id=\"solo\",state=\"joined\"}"), 1)
      << text;
  EXPECT_EQ(Value(text, "collectived_cluster_state{host_id=\"solo\",state=\"unavailable\"}"), 0)
      << text;
  EXPECT_EQ(Value(text, "collectived_cluster_meshes"), 0) << text;
  EXPECT_EQ(Value(text, "collectived_cluster_ops_total{result=\"ok\"}"), 0) << text;
}

TEST(MetricsTest, AnAddressWithoutAPortIsRefusedAtStart) {
  auto daemon = Daemon::Start({"--metrics=localhost"});
  ASSERT_FALSE(daemon.ok());
  EXPECT_TRUE(absl::StrContains(daemon.status().message(), "--metrics=localhost")) << daemon.status();
}

}  // namespace
}  // namespace collectived
