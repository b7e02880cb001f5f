#include "daemon/util/log.h"

#include <atomic>
#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

// Control bytes (below 0x20, and 0x7f) could forge or hide log lines when a
// value comes from a client, and so could bytes past ASCII (UTF-8's NEL,
// C1 controls, U+2028): they are quoted and escaped (\n, \r, \t, else \xNN),
// so that a log line is printable ASCII.
bool IsControl(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u < 0x20 || u >= 0x7f;
}

void AppendValue(std::string* out, absl::string_view value) {
  bool quote = value.empty();
  for (char c : value) quote = quote || c == ' ' || c == '"' || c == '=' || c == '\\' || IsControl(c);
  if (!quote) {
    out->append(value.data(), value.size());
    return;
  }
  out->push_back('"');
  for (char c : value) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (IsControl(c)) {
      constexpr char kHex[] = "0123456789abcdef";
      const auto u = static_cast<unsigned char>(c);
      out->append("\\x");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 15]);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn,
                     LogLevel::kError}) {
    if (text == LevelName(l)) {
      *level = l;
      return true;
    }
  }
  return false;
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

void LogEvent(LogLevel level, absl::string_view event,
              std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                              absl::UTCTimeZone()),
      " level=", LevelName(level), " event=", event);
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, " ", key, "=");
    AppendValue(&line, value);
  }
  line.push_back('\n');
  // One write call per line keeps concurrent lines whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace collectived
