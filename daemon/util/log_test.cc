#include "daemon/util/log.h"

#include <chrono>
#include <future>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/harness/full_stderr.h"

namespace collectived {
namespace {

std::string Logged(const std::string& value) {
  ::testing::internal::CaptureStderr();
  LogEvent(LogLevel::kWarn, "probe", {{"reason", value}});
  return ::testing::internal::GetCapturedStderr();
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
  testing::FullStderr full;
  ASSERT_TRUE(full.ok());
  // 50 lines: the first waits a moment for room, the others are dropped.
  auto logger = std::async(std::launch::async, [] {
    for (int i = 0; i < 50; ++i) LogEvent(LogLevel::kWarn, "stuck_probe", {{"i", absl::StrCat(i)}});
  });
  const bool returned = logger.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // Room again (unblocking the logger if it blocked); the next line says
  // how many were dropped.
  full.DrainFiller();
  logger.wait();
  LogEvent(LogLevel::kWarn, "after_drain");
  const std::string written = full.Restore();

  EXPECT_TRUE(returned) << "LogEvent blocked on a stderr that did not drain";
  EXPECT_TRUE(absl::StrContains(written, " event=log_lines_dropped count=50 ")) << written;
  EXPECT_TRUE(absl::StrContains(written, " event=after_drain\n")) << written;
  EXPECT_FALSE(absl::StrContains(written, "stuck_probe")) << written;
}

}  // namespace
}  // namespace collectived
