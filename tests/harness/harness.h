// Test harness: real daemon processes and real client processes.
//
// Tests start the built `collectived` binary on a private socket and run
// client programs as child processes (fork + exec, never fork alone, so no
// gRPC state crosses a fork). Every wait has a deadline: a child that does not
// finish in time is killed and reported as timed out.
#ifndef COLLECTIVED_TESTS_HARNESS_HARNESS_H_
#define COLLECTIVED_TESTS_HARNESS_HARNESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace collectived::testing {

// Paths of binaries built alongside the tests (set by CMake;
// $COLLECTIVED_TEST_DAEMON_BIN names another daemon binary).
std::string DaemonBinary();
// A fresh private directory under $TMPDIR (or /tmp): tests put sockets and
// logs there. Removed with what it holds when the test process exits
// normally (kept when COLLECTIVED_TEST_KEEP_TMP=1, to look at afterwards).
std::string MakeTempDir();

// A loopback TCP port that nothing listens on now and that bind(port 0)
// never hands out (it lies below the kernel's ephemeral range), so a daemon
// told to listen there later does not race with the other tests' daemons
// binding port 0. -1 if none was found.
int UnusedFixedPort();

struct ChildResult {
  int exit_code = -1;    // exit status, or 128 + signal
  bool timed_out = false;
  std::string output;    // stdout and stderr, interleaved
};

// A child process whose stdout+stderr are captured.
class Child {
 public:
  // Starts argv[0] with argv (argv[0] is a path).
  static absl::StatusOr<std::unique_ptr<Child>> Start(const std::vector<std::string>& argv);
  ~Child();  // kills the child if still running
  pid_t pid() const { return pid_; }
  // Sends `sig` to the child.
  void Signal(int sig);
  // Waits for exit (collecting output); kills with SIGKILL at the deadline.
  ChildResult Wait(absl::Duration timeout);
  // Reads output until it contains `needle` at or after offset `from` (true)
  // or `timeout` passes or the child exits without printing it (false).
  bool WaitForOutput(const std::string& needle, absl::Duration timeout, size_t from = 0);
  // Output read so far.
  const std::string& output() const { return output_; }

 private:
  Child(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void Drain(absl::Duration max_wait);
  pid_t pid_;
  int fd_;
  std::string output_;
  bool reaped_ = false;
  int status_ = 0;
};

// Runs `script` with /bin/sh -c, waiting at most `timeout`: its output, or
// INTERNAL naming the script, its exit status and its output.
absl::StatusOr<std::string> RunShell(const std::string& script,
                                     absl::Duration timeout = absl::Seconds(60));

// Runs all `argvs` concurrently; returns their results in order. Children
// still running at `timeout` are killed and marked timed_out.
std::vector<ChildResult> RunAll(const std::vector<std::vector<std::string>>& argvs,
                                absl::Duration timeout);

// A running collectived.
class Daemon {
 public:
  // Starts the daemon on a socket in a fresh temp dir with `flags` added and
  // waits (at most 20 s) until it accepts connections.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(std::vector<std::string> flags = {});
  // Starts a daemon on `socket` (e.g. the socket of a daemon that was killed).
  static absl::StatusOr<std::unique_ptr<Daemon>> StartAt(const std::string& socket,
                                                         std::vector<std::string> flags = {});
  // Starts the daemon through `wrapper` (a command that execs the rest of
  // its argv, e.g. prlimit), on a socket in a fresh temp dir.
  static absl::StatusOr<std::unique_ptr<Daemon>> StartWrapped(std::vector<std::string> wrapper,
                                                              std::vector<std::string> flags = {});
  ~Daemon();  // SIGKILL if still running

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return child_->pid(); }
  // SIGTERM and wait; returns the exit result (log in .output).
  ChildResult Stop(absl::Duration timeout = absl::Seconds(20));
  // SIGKILL and wait.
  ChildResult Kill();
  // Reads the daemon's log until it contains `needle` at or after offset
  // `from` (true), or `timeout` passes or the daemon exits (false).
  bool WaitForOutput(const std::string& needle, absl::Duration timeout, size_t from = 0) {
    return child_->WaitForOutput(needle, timeout, from);
  }
  // The log read so far (its size is an offset for WaitForOutput).
  const std::string& output() const { return child_->output(); }

 private:
  Daemon() = default;
  static absl::StatusOr<std::unique_ptr<Daemon>> StartWrappedAt(std::vector<std::string> wrapper,
                                                                const std::string& socket,
                                                                std::vector<std::string> flags);
  std::string socket_;
  std::unique_ptr<Child> child_;
  bool stopped_ = false;
};

// The argv of a test worker for member `member` of `members` in `mesh` on
// `daemon`: binary, --socket, --mesh, --members, --member, then `extra`.
std::vector<std::string> WorkerArgv(const std::string& binary, const Daemon& daemon,
                                    const std::string& mesh, int members, int member,
                                    std::vector<std::string> extra = {});

// The value of `key=` on the first line of a worker's `output` that starts
// with `tag ` (values end at a space; "msg" runs to the end of the line),
// or "" if there is none.
std::string OutputField(const std::string& output, const std::string& tag,
                        const std::string& key);

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_HARNESS_H_
