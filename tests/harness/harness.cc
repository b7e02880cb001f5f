#include "tests/harness/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <cstring>
#include <string_view>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace collectived::testing {

std::string DaemonBinary() {
  // Another daemon binary may be named, e.g. to show that a test fails
  // against an older build.
  const char* other = getenv("COLLECTIVED_TEST_DAEMON_BIN");
  return other != nullptr && *other != '\0' ? other : COLLECTIVED_DAEMON_BIN;
}

namespace {

// MakeTempDir's directories, removed when the test process exits (not by a
// forked child that exits).
struct TempDirs {
  std::mutex mu;
  pid_t owner = 0;
  std::vector<std::string> dirs;
};

TempDirs& Made() {
  static TempDirs* made = new TempDirs();  // never destroyed: the exit handler uses it
  return *made;
}

void RemoveMadeDirs() {
  TempDirs& made = Made();
  std::lock_guard<std::mutex> lock(made.mu);
  if (getpid() != made.owner) return;
  for (const std::string& dir : made.dirs) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  made.dirs.clear();
}

}  // namespace

std::string MakeTempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp", "/cdtest-XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) abort();
  const char* keep = getenv("COLLECTIVED_TEST_KEEP_TMP");
  if (keep == nullptr || std::string_view(keep) != "1") {
    TempDirs& made = Made();
    std::lock_guard<std::mutex> lock(made.mu);
    if (made.owner != getpid()) {
      // The first directory of this process (a forked child's own list
      // starts afresh).
      made.owner = getpid();
      made.dirs.clear();
      std::atexit(RemoveMadeDirs);
    }
    made.dirs.emplace_back(buf.data());
  }
  return std::string(buf.data());
}

absl::StatusOr<std::unique_ptr<Child>> Child::Start(const std::vector<std::string>& argv) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(p[1], STDOUT_FILENO);
    dup2(p[1], STDERR_FILENO);
    execv(args[0], args.data());
    const char msg[] = "exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  return std::unique_ptr<Child>(new Child(pid, p[0]));
}

Child::~Child() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  close(fd_);
}

void Child::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

void Child::Drain(absl::Duration max_wait) {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(max_wait))) <= 0) return;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd_, buf, sizeof(buf))) > 0) output_.append(buf, static_cast<size_t>(n));
}

bool Child::WaitForOutput(const std::string& needle, absl::Duration timeout, size_t from) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (output_.find(needle, from) != std::string::npos) return true;
    if (reaped_ || absl::Now() > deadline) return false;
    Drain(absl::Milliseconds(20));
    siginfo_t info{};
    if (output_.find(needle, from) == std::string::npos &&
        waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      Drain(absl::ZeroDuration());
      return output_.find(needle, from) != std::string::npos;
    }
  }
}

ChildResult Child::Wait(absl::Duration timeout) {
  ChildResult r;
  const absl::Time deadline = absl::Now() + timeout;
  while (!reaped_) {
    Drain(absl::Milliseconds(20));
    pid_t w = waitpid(pid_, &status_, WNOHANG);
    if (w == pid_) {
      reaped_ = true;
      break;
    }
    if (absl::Now() > deadline) {
      r.timed_out = true;
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      reaped_ = true;
    }
  }
  Drain(absl::ZeroDuration());
  r.exit_code = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  r.output = output_;
  return r;
}

absl::StatusOr<std::string> RunShell(const std::string& script, absl::Duration timeout) {
  auto c = Child::Start({"/bin/sh", "-c", script});
  if (!c.ok()) return c.status();
  ChildResult r = (*c)->Wait(timeout);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("`", script, "` exited ", r.exit_code, ": ", r.output));
  }
  return r.output;
}

std::vector<ChildResult> RunAll(const std::vector<std::vector<std::string>>& argvs,
                                absl::Duration timeout) {
  std::vector<std::unique_ptr<Child>> children;
  std::vector<ChildResult> results(argvs.size());
  for (size_t i = 0; i < argvs.size(); ++i) {
    auto c = Child::Start(argvs[i]);
    if (!c.ok()) {
      results[i].output = c.status().ToString();
      children.push_back(nullptr);
      continue;
    }
    children.push_back(*std::move(c));
  }
  // Waiting on each in turn is fine: each child's output pipe is drained by
  // the kernel buffer until we get to it, and the deadline is shared.
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < children.size(); ++i) {
    if (!children[i]) continue;
    waiters.emplace_back([&, i] {
      results[i] = children[i]->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    });
  }
  for (auto& t : waiters) t.join();
  return results;
}

namespace {

bool SocketLive(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(std::vector<std::string> flags) {
  return StartAt(MakeTempDir() + "/collectived.sock", std::move(flags));
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::StartAt(const std::string& socket,
                                                        std::vector<std::string> flags) {
  return StartWrappedAt({}, socket, std::move(flags));
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::StartWrapped(std::vector<std::string> wrapper,
                                                             std::vector<std::string> flags) {
  return StartWrappedAt(std::move(wrapper), MakeTempDir() + "/collectived.sock", std::move(flags));
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::StartWrappedAt(std::vector<std::string> wrapper,
                                                               const std::string& socket,
                                                               std::vector<std::string> flags) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->socket_ = socket;
  std::vector<std::string> argv = std::move(wrapper);
  argv.push_back(DaemonBinary());
  argv.push_back("--socket=" + d->socket_);
  for (auto& f : flags) argv.push_back(std::move(f));
  auto child = Child::Start(argv);
  if (!child.ok()) return child.status();
  d->child_ = *std::move(child);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!SocketLive(d->socket_)) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(d->child_->pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == d->child_->pid()) {
      ChildResult r = d->child_->Wait(absl::Seconds(1));
      d->stopped_ = true;
      return absl::InternalError(absl::StrCat("daemon exited during start-up: ", r.output));
    }
    if (absl::Now() > deadline) return absl::DeadlineExceededError("daemon did not start in 20 s");
    absl::SleepFor(absl::Milliseconds(10));
  }
  return d;
}

Daemon::~Daemon() {
  if (!stopped_) Kill();
}

ChildResult Daemon::Stop(absl::Duration timeout) {
  stopped_ = true;
  child_->Signal(SIGTERM);
  return child_->Wait(timeout);
}

ChildResult Daemon::Kill() {
  stopped_ = true;
  child_->Signal(SIGKILL);
  return child_->Wait(absl::Seconds(10));
}

std::vector<std::string> WorkerArgv(const std::string& binary, const Daemon& daemon,
                                    const std::string& mesh, int members, int member,
                                    std::vector<std::string> extra) {
  std::vector<std::string> argv = {binary, "--socket=" + daemon.socket(), "--mesh=" + mesh,
                                   absl::StrCat("--members=", members),
                                   absl::StrCat("--member=", member)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::string OutputField(const std::string& output, const std::string& tag,
                        const std::string& key) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(line, tag + " ")) continue;
    const size_t at = line.find(" " + key + "=");
    if (at == absl::string_view::npos) return "";
    absl::string_view rest = line.substr(at + key.size() + 2);
    if (key == "msg") return std::string(rest);
    return std::string(rest.substr(0, rest.find(' ')));
  }
  return "";
}

int UnusedFixedPort() {
  int low = 32768;  // Linux's default ephemeral range starts here
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0, last = 0;
  if (range >> first >> last && first > 11000) low = first;
  std::mt19937 rng(static_cast<unsigned>(getpid()) * 7919u +
                   static_cast<unsigned>(std::random_device{}()));
  std::uniform_int_distribution<int> pick(10000, low - 1);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = pick(rng);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (free) return port;
  }
  return -1;
}

}  // namespace collectived::testing
