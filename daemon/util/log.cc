#include "daemon/util/log.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
// SetLogStderrWait, in milliseconds; -1: no bound (see WriteLine).
std::atomic<int> g_stuck_wait_ms{100};

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

void SetLogStderrWait(absl::Duration wait) {
  g_stuck_wait_ms.store(wait == absl::InfiniteDuration()
                            ? -1
                            : static_cast<int>(std::clamp<int64_t>(
                                  absl::ToInt64Milliseconds(wait), 0, 24 * 3600 * 1000)),
                        std::memory_order_relaxed);
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

namespace {

std::string LinePrefix(LogLevel level, absl::string_view event) {
  return absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " level=", LevelName(level), " event=", event);
}

// Lines go to stderr one write at a time, under g_write_mu, so concurrent
// lines stay whole. A stderr that does not drain (a pipe whose reader
// stopped, a terminal stopped with ^S) must not stop the daemon. The engine
// and the coordinator write after unlocking (LogEventLater), so a stuck
// write holds up its own thread only; that thread may be serving an RPC or
// running the timer, so it must not wait forever either. So a line waits at
// most g_stuck_wait_ms for room; past that stderr counts as stuck, and lines are
// dropped at once (and counted) until there is room again; the first line
// written then is preceded by one that says how many were lost.
std::mutex g_write_mu;
bool g_stuck = false;    // guarded by g_write_mu
int64_t g_dropped = 0;   // guarded by g_write_mu

void WriteLine(std::string line) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  const int fd = fileno(stderr);
  pollfd p{};
  p.fd = fd;
  p.events = POLLOUT;
  const int wait_ms = g_stuck_wait_ms.load(std::memory_order_relaxed);
  int ready;
  do {
    ready = poll(&p, 1, g_stuck ? 0 : wait_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {  // no room: drop the line
    g_stuck = true;
    ++g_dropped;
    return;
  }
  // Room, or an error that the write reports at once (a closed stderr).
  if (g_dropped > 0) {
    line = absl::StrCat(LinePrefix(LogLevel::kWarn, "log_lines_dropped"), " count=", g_dropped,
                        " reason=\"stderr did not drain for ", wait_ms, " ms\"\n", line);
  }
  g_stuck = false;
  g_dropped = 0;
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string FormatLine(LogLevel level, absl::string_view event,
                       std::initializer_list<LogField> fields) {
  std::string line = LinePrefix(level, event);
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, " ", key, "=");
    AppendValue(&line, value);
  }
  line.push_back('\n');
  return line;
}

}  // namespace

void LogEvent(LogLevel level, absl::string_view event,
              std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  WriteLine(FormatLine(level, event, fields));
}

void LogEventLater(std::vector<std::function<void()>>& later, LogLevel level,
                   absl::string_view event, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  later.push_back([line = FormatLine(level, event, fields)]() mutable { WriteLine(std::move(line)); });
}

}  // namespace collectived
