#include "daemon/util/log.h"

#include <string>

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

}  // namespace
}  // namespace collectived
