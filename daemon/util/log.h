// Structured, leveled logs: one logfmt line per event on stderr, e.g.
//   ts=2026-12-02T10:00:00.123Z level=warn event=op_failed mesh=train seq=4 msg="..."
//
// Thread-safe: lines from concurrent threads never interleave. Never blocks
// on a stderr that does not drain for more than 100 ms: lines are then
// dropped (and counted in a log_lines_dropped line once stderr drains).
#ifndef COLLECTIVED_DAEMON_UTIL_LOG_H_
#define COLLECTIVED_DAEMON_UTIL_LOG_H_

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace collectived {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Sets the lowest level that is printed (default kInfo).
void SetLogLevel(LogLevel level);
// Parses "debug", "info", "warn" or "error"; false if unknown.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
bool LogEnabled(LogLevel level);
// How long a line waits for room on a stderr that does not drain before
// lines are dropped (default 100 ms; InfiniteDuration: never dropped, the
// writer waits as long as it takes).
void SetLogStderrWait(absl::Duration wait);

using LogField = std::pair<absl::string_view, std::string>;

// Prints one event with its fields; values with spaces or quotes are quoted.
void LogEvent(LogLevel level, absl::string_view event,
              std::initializer_list<LogField> fields = {});

// The same line, formatted now (its time is now), written when `later`'s
// callbacks run: for code that holds a lock, so that no write (which may
// wait for a stderr that does not drain) happens under it.
void LogEventLater(std::vector<std::function<void()>>& later, LogLevel level,
                   absl::string_view event, std::initializer_list<LogField> fields = {});

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_UTIL_LOG_H_
