#include "daemon/util/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace collectived {
namespace {

std::string Logged(const std::string& value) {
  testing::internal::CaptureStderr();
  LogEvent(LogLevel::kWarn, "probe", {{"reason", value}});
  return testing::internal::GetCapturedStderr();
}

TEST(LogTest, PlainValuesAreWrittenAsTheyAre) {
  const std::string line = Logged("host-1");
  EXPECT_NE(line.find(" event=probe reason=host-1\n"), std::string::npos) << line;
}

TEST(LogTest, AClientsControlBytesCannotForgeOrHideLines) {
  // A reason as a hostile peer could send it: a line break that would start
  // a forged event, a carriage return and an escape sequence that would
  // overwrite the line on a terminal, a tab, a NUL and DEL.
  const std::string value = std::string("gone\r\nts=x level=error event=forged\t\x1b[2K") +
                            '\0' + "\x7f" + "\xc2\x85" + "end";
  const std::string line = Logged(value);
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line only: " << line;
  for (char c : line.substr(0, line.size() - 1)) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE(u >= 0x20 && u < 0x7f) << "raw byte " << static_cast<int>(u);
  }
  EXPECT_NE(line.find(R"(reason="gone\r\nts=x level=error event=forged\t\x1b[2K\x00\x7f\xc2\x85end")"),
            std::string::npos)
      << line;
}

TEST(LogTest, QuotesAndBackslashesAreEscaped) {
  const std::string line = Logged(R"(say "a=b" \ c)");
  EXPECT_NE(line.find(R"(reason="say \"a=b\" \\ c")"), std::string::npos) << line;
}

TEST(LogTest, AStderrThatDoesNotDrainDropsLinesInsteadOfBlocking) {
  // stderr into a pipe that nobody reads yet, full.
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  ASSERT_EQ(fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK), 0);
  const char filler[4096] = {};
  int64_t filled = 0;
  for (ssize_t n; (n = write(pipe_fds[1], filler, sizeof(filler))) > 0 || errno == EINTR;) {
    if (n > 0) filled += n;
  }
  ASSERT_EQ(errno, EAGAIN);
  ASSERT_EQ(fcntl(pipe_fds[1], F_SETFL, 0), 0);
  std::fflush(stderr);
  const int saved_stderr = dup(2);
  ASSERT_GE(saved_stderr, 0);
  ASSERT_EQ(dup2(pipe_fds[1], 2), 2);

  // 50 lines: the first waits a moment for room, the others are dropped.
  auto logger = std::async(std::launch::async, [] {
    for (int i = 0; i < 50; ++i) LogEvent(LogLevel::kWarn, "stuck_probe", {{"i", absl::StrCat(i)}});
  });
  const bool returned = logger.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // Drain the filler (unblocking the logger if it blocked), then log again:
  // that line says how many were dropped. No ASSERT from here on: stderr
  // must be given back and the logger waited for.
  std::string drained;
  char buf[4096];
  for (int64_t left = filled; left > 0;) {
    const ssize_t n = read(pipe_fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    left -= n;
  }
  logger.wait();
  LogEvent(LogLevel::kWarn, "after_drain");
  EXPECT_EQ(dup2(saved_stderr, 2), 2);
  close(saved_stderr);
  close(pipe_fds[1]);
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    drained.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);

  EXPECT_TRUE(returned) << "LogEvent blocked on a stderr that did not drain";
  EXPECT_TRUE(absl::StrContains(drained, " event=log_lines_dropped count=50 ")) << drained;
  EXPECT_TRUE(absl::StrContains(drained, " event=after_drain\n")) << drained;
  EXPECT_FALSE(absl::StrContains(drained, "stuck_probe")) << drained;
}

}  // namespace
}  // namespace collectived
