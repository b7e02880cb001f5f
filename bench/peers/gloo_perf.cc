// gloo_perf: psum and all_gather over Gloo, measured and reported exactly as
// bench/collectived_perf does, so that the two can be compared row by row
// (bench/peers/compare.py does that).
//
//   gloo_perf [--members=2[,4,...]] [--op=psum,all_gather] [--dtype=float32]
//             [--min-bytes=8] [--max-bytes=64M] [--step-factor=2] [--iters=20]
//             [--warmup=5] [--check=true] [--json] [--timeout=60]
//
// For each member count N the parent starts N member processes (this same
// binary, fork+exec'd in member mode). The members rendezvous through a
// gloo::rendezvous::FileStore in a fresh temporary directory and connect a
// full mesh with Gloo's TCP transport on 127.0.0.1 (Debian's Gloo has no
// shared-memory transport). psum is gloo::allreduce with gloo::sum (ring
// algorithm), out of place: separate input and output buffers; all_gather is
// gloo::allgather (ring), out of place. Buffers are allocated once for the
// largest size.
//
// For every op and size, each member runs: one op whose result it verifies
// (with --check; exact small-integer data), a gloo::barrier, `warmup` untimed
// ops, then `iters` timed ops back to back, each timed with the monotonic
// clock. Members send their times to the parent through a pipe (fd 3); an
// iteration's time is the slowest member's, and a row reports the median and
// the minimum (see peer_common.h and bench/README.md). JSON rows carry
// collectived_perf's keys plus "system":"gloo".
//
// Nothing waits forever: every Gloo operation and the rendezvous have the
// --timeout (Gloo's context timeout), and the parent gives up when no member
// reported anything (members report at least once a second while they run
// ops) for --timeout plus 15 s. A member that fails (an error,
// a crash, a timeout) stops the run: the parent kills the others, prints the
// members' errors and exits 1. A failed check exits 1 at the end; a bad flag
// exits 2.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "peer_common.h"

namespace {

using peers::Config;
using peers::DType;
using peers::Op;
using peers::Row;

constexpr char kUsage[] =
    "usage: gloo_perf [flags]\n"
    "  --members=N[,M..]  member processes (default 2; at least 2)\n"
    "  --timeout=SECONDS  Gloo's timeout for the rendezvous and every op (default 60)\n";

struct Options {
  std::vector<int> members = {2};
  int timeout_s = 60;
  // Member mode (hidden flags, set by the parent).
  int member = -1;
  int report_fd = -1;
  std::string store_dir;
};

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "gloo_perf: %s\n%sflags:\n%s", message.c_str(), kUsage,
               peers::kCommonUsage);
  std::exit(2);
}

bool WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t w = write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

// ---------------------------------------------------------------------------
// Member mode. Protocol to the parent, one line each:
//   READY
//   TICK                       (alive; at most once a second, between ops)
//   CHECKFAIL <row> <text>
//   ROW <row> <ok|fail|skipped> <ns> <ns> ...
//   ERR <text>
//   DONE

int MemberFail(int fd, std::string what) {
  std::replace(what.begin(), what.end(), '\n', ' ');
  WriteAll(fd, "ERR " + what + "\n");
  return 1;
}

// Returns one row's op, with its Gloo options built once (outside the timed
// loop) and reused by every call.
std::function<void()> MakeOp(const std::shared_ptr<gloo::Context>& ctx, const Row& r, DType dt,
                             void* in, void* out, std::chrono::milliseconds timeout) {
  return peers::WithType(dt, [&](auto t) -> std::function<void()> {
    using T = decltype(t);
    if (r.op == Op::kPsum) {
      auto opts = std::make_shared<gloo::AllreduceOptions>(ctx);
      opts->setInput(static_cast<T*>(in), static_cast<size_t>(r.in_count));
      opts->setOutput(static_cast<T*>(out), static_cast<size_t>(r.out_count));
      void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<T>;
      opts->setReduceFunction(sum);
      opts->setTimeout(timeout);
      return [opts] { gloo::allreduce(*opts); };
    }
    auto opts = std::make_shared<gloo::AllgatherOptions>(ctx);
    opts->setInput(static_cast<T*>(in), static_cast<size_t>(r.in_count));
    opts->setOutput(static_cast<T*>(out), static_cast<size_t>(r.out_count));
    opts->setTimeout(timeout);
    return [opts] { gloo::allgather(*opts); };
  });
}

void Barrier(const std::shared_ptr<gloo::Context>& ctx, std::chrono::milliseconds timeout) {
  gloo::BarrierOptions opts(ctx);
  opts.setTimeout(timeout);
  gloo::barrier(opts);
}

int RunMember(const Config& cfg, const Options& opt) {
  const int fd = opt.report_fd;
  const int n = opt.members[0];
  const int me = opt.member;
  const std::vector<Row> rows = peers::PlanRows(cfg, n);
  size_t max_in = 0, max_out = 0;
  std::map<Op, int64_t> fill_count;
  for (const Row& r : rows) {
    max_in = std::max(max_in, r.in_bytes);
    max_out = std::max(max_out, r.out_bytes);
    fill_count[r.op] = std::max(fill_count[r.op], r.in_count);
  }
  std::unique_ptr<void, decltype(&std::free)> in(peers::AllocBuffer(max_in), &std::free);
  std::unique_ptr<void, decltype(&std::free)> out(peers::AllocBuffer(max_out), &std::free);
  const std::chrono::milliseconds timeout(int64_t{opt.timeout_s} * 1000);
  const auto op_name = [](const Row& r) {
    return std::string(peers::OpName(r.op)) + " " + std::to_string(r.bytes) + " B";
  };
  const Row* current = nullptr;  // for error messages
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    std::shared_ptr<gloo::transport::Device> dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(opt.store_dir);
    auto rctx = std::make_shared<gloo::rendezvous::Context>(me, n);
    rctx->setTimeout(timeout);  // also the rendezvous' (store wait, connect) timeout
    rctx->connectFullMesh(store, dev);
    const std::shared_ptr<gloo::Context> ctx = rctx;
    if (!WriteAll(fd, "READY\n")) return 1;

    // Between ops (never inside a timed one), a TICK line at most once a
    // second tells the parent that this member is alive during long rows.
    int64_t last_line_ns = peers::NowNs();
    auto tick = [&] {
      const int64_t now = peers::NowNs();
      if (now - last_line_ns < 1000000000) return true;
      last_line_ns = now;
      return WriteAll(fd, "TICK\n");
    };
    std::vector<int64_t> times(static_cast<size_t>(cfg.iters));
    bool have_filled = false;
    Op filled = Op::kPsum;
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const Row& r = rows[ri];
      current = &r;
      if (!have_filled || filled != r.op) {
        peers::FillInput(r.op, cfg.dtype, me, in.get(), fill_count[r.op]);
        filled = r.op;
        have_filled = true;
      }
      const std::function<void()> op = MakeOp(ctx, r, cfg.dtype, in.get(), out.get(), timeout);
      std::string check = "skipped";
      if (cfg.check) {
        std::memset(out.get(), 0xA5, r.out_bytes);
        op();
        const std::string bad = peers::Verify(r.op, cfg.dtype, n, r, out.get());
        check = bad.empty() ? "ok" : "fail";
        if (!bad.empty() &&
            !WriteAll(fd, "CHECKFAIL " + std::to_string(ri) + " " + bad + "\n")) {
          return 1;
        }
      }
      Barrier(ctx, timeout);  // start every size together
      for (int w = 0; w < cfg.warmup; ++w) {
        op();
        if (!tick()) return 1;
      }
      for (int it = 0; it < cfg.iters; ++it) {
        const int64_t t0 = peers::NowNs();
        op();
        times[static_cast<size_t>(it)] = peers::NowNs() - t0;
        if (!tick()) return 1;
      }
      last_line_ns = peers::NowNs();
      std::string line = "ROW " + std::to_string(ri) + " " + check;
      for (int64_t t : times) line += " " + std::to_string(t);
      if (!WriteAll(fd, line + "\n")) return 1;
    }
    current = nullptr;
    Barrier(ctx, timeout);  // nobody closes its connections before all are done
  } catch (const std::exception& e) {
    return MemberFail(fd, (current != nullptr ? op_name(*current) + ": " : std::string()) +
                              e.what());
  }
  WriteAll(fd, "DONE\n");
  return 0;
}

// ---------------------------------------------------------------------------
// Parent mode.

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

std::string SelfExe() {
  char buf[4096];
  ssize_t len = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (len <= 0) return "";
  return std::string(buf, static_cast<size_t>(len));
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended";
}

std::string Tail(const std::string& s, size_t max = 4000) {
  std::string t = s.size() > max ? "..." + s.substr(s.size() - max) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct Member {
  pid_t pid = -1;
  int report_fd = -1;  // protocol lines
  int output_fd = -1;  // its stdout and stderr
  std::string report_buf, output;
  bool done = false;      // sent DONE
  bool failed = false;
  bool reported = false;  // failed with an ERR line (not a crash)
  int fail_order = 0;     // 1 for the first member that failed, ...
  std::string error;
  size_t rows_received = 0;
  std::vector<std::vector<int64_t>> times;  // per row
  std::vector<std::string> checks;          // per row
  int status = 0;
  bool reaped = false;
};

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// Runs one member count; returns 0, or 1 after a failure (reported on stderr).
int RunMembers(const Config& cfg, const Options& opt, int n, const std::string& store_dir,
               peers::Printer& printer, int* check_failures) {
  const std::vector<Row> rows = peers::PlanRows(cfg, n);
  const std::string self = SelfExe();
  std::vector<Member> members(static_cast<size_t>(n));
  auto kill_all = [&] {
    for (Member& m : members) {
      if (m.pid > 0 && !m.reaped) kill(m.pid, SIGKILL);
    }
    for (Member& m : members) {
      if (m.pid > 0 && !m.reaped) {
        waitpid(m.pid, &m.status, 0);
        m.reaped = true;
      }
      CloseFd(&m.report_fd);
      CloseFd(&m.output_fd);
    }
  };

  const pid_t parent = getpid();
  for (int i = 0; i < n; ++i) {
    int rep[2], outp[2];
    if (pipe2(rep, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "gloo_perf: pipe: %s\n", strerror(errno));
      kill_all();
      return 1;
    }
    if (pipe2(outp, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "gloo_perf: pipe: %s\n", strerror(errno));
      close(rep[0]);
      close(rep[1]);
      kill_all();
      return 1;
    }
    std::vector<std::string> argv = {self,
                                     "--member=" + std::to_string(i),
                                     "--members=" + std::to_string(n),
                                     "--report-fd=3",
                                     "--store-dir=" + store_dir,
                                     "--timeout=" + std::to_string(opt.timeout_s)};
    for (const std::string& a : peers::CommonArgs(cfg)) argv.push_back(a);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "gloo_perf: fork: %s\n", strerror(errno));
      close(rep[0]);
      close(rep[1]);
      close(outp[0]);
      close(outp[1]);
      kill_all();
      return 1;
    }
    if (pid == 0) {
      // Members die with the parent, whatever kills it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      dup2(rep[1], 3);  // dup2 clears FD_CLOEXEC on the copy
      dup2(outp[1], STDOUT_FILENO);
      dup2(outp[1], STDERR_FILENO);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
      execv(args[0], args.data());
      std::fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
      _exit(127);
    }
    close(rep[1]);
    close(outp[1]);
    Member& m = members[static_cast<size_t>(i)];
    m.pid = pid;
    m.report_fd = rep[0];
    m.output_fd = outp[0];
    m.times.resize(rows.size());
    m.checks.resize(rows.size());
  }

  using Clock = std::chrono::steady_clock;
  const double stall_s = opt.timeout_s + 15.0;  // no report line for this long: give up
  Clock::time_point last_progress = Clock::now();
  std::optional<Clock::time_point> fail_time;  // after the first failure: collect the others'
  size_t next_row = 0;
  int failures = 0;
  auto fail = [&](Member& m, std::string error) {
    if (m.failed || m.done) return;
    m.failed = true;
    m.fail_order = ++failures;
    m.error = std::move(error);
    if (!fail_time) fail_time = Clock::now();
  };
  auto handle_line = [&](Member& m, size_t index, const std::string& line) {
    last_progress = Clock::now();
    if (line == "READY" || line == "TICK") return;
    if (line == "DONE") {
      m.done = true;
      return;
    }
    if (line.rfind("ERR ", 0) == 0) {
      m.reported = true;
      fail(m, line.substr(4));
      return;
    }
    std::vector<std::string> parts;
    for (size_t start = 0; start <= line.size();) {
      size_t sp = line.find(' ', start);
      if (sp == std::string::npos) sp = line.size();
      parts.push_back(line.substr(start, sp - start));
      start = sp + 1;
    }
    auto row = parts.size() >= 2 ? peers::ParseInt(parts[1], 0, static_cast<int64_t>(rows.size()) - 1)
                                 : std::nullopt;
    if (row && parts[0] == "CHECKFAIL") {
      const Row& r = rows[static_cast<size_t>(*row)];
      const size_t skip = parts[0].size() + parts[1].size() + 2;
      std::fprintf(stderr, "gloo_perf: check failed: member %zu of %d, %s %" PRId64 " B: %s\n",
                   index, n, peers::OpName(r.op), r.bytes,
                   line.size() > skip ? line.substr(skip).c_str() : "");
      return;
    }
    if (row && parts[0] == "ROW" && parts.size() == 3 + static_cast<size_t>(cfg.iters)) {
      std::vector<int64_t> t;
      for (size_t i = 3; i < parts.size(); ++i) {
        auto v = peers::ParseInt(parts[i], 0, INT64_MAX / 4);
        if (!v) break;
        t.push_back(*v);
      }
      if (t.size() == static_cast<size_t>(cfg.iters)) {
        m.times[static_cast<size_t>(*row)] = std::move(t);
        m.checks[static_cast<size_t>(*row)] = parts[2];
        m.rows_received = std::max(m.rows_received, static_cast<size_t>(*row) + 1);
        return;
      }
    }
    fail(m, "unexpected report line: " + line);
  };
  auto drain_lines = [&](Member& m, size_t index) {
    size_t nl;
    while ((nl = m.report_buf.find('\n')) != std::string::npos) {
      std::string line = m.report_buf.substr(0, nl);
      m.report_buf.erase(0, nl + 1);
      handle_line(m, index, line);
    }
  };

  while (true) {
    // Print the rows every member has reported.
    while (next_row < rows.size() &&
           std::all_of(members.begin(), members.end(),
                       [&](const Member& m) { return m.rows_received > next_row; })) {
      std::vector<std::vector<int64_t>> times;
      bool all_ok = true, any_fail = false;
      for (const Member& m : members) {
        times.push_back(m.times[next_row]);
        all_ok = all_ok && m.checks[next_row] == "ok";
        any_fail = any_fail || m.checks[next_row] == "fail";
      }
      const std::string check = any_fail ? "fail" : all_ok ? "ok" : "skipped";
      if (any_fail) ++*check_failures;
      printer.PrintRow(rows[next_row], n, peers::Summarize(rows[next_row], n, times, check));
      ++next_row;
    }
    const bool all_done = std::all_of(members.begin(), members.end(), [](const Member& m) {
      return m.done && m.reaped && m.report_fd < 0 && m.output_fd < 0;
    });
    if (all_done) break;
    if (fail_time && SecondsSince(*fail_time) >= 1.0) break;
    if (g_stop_signal != 0) break;
    if (!fail_time && SecondsSince(last_progress) > stall_s) {
      for (Member& m : members) {
        if (!m.done) {
          fail(m, "no report from any member for " + std::to_string(static_cast<int>(stall_s)) +
                      " s (stuck; --timeout is " + std::to_string(opt.timeout_s) + " s)");
        }
      }
      break;
    }

    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> owner;  // member, is_report
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].report_fd >= 0) {
        fds.push_back({members[i].report_fd, POLLIN, 0});
        owner.emplace_back(i, true);
      }
      if (members[i].output_fd >= 0) {
        fds.push_back({members[i].output_fd, POLLIN, 0});
        owner.emplace_back(i, false);
      }
    }
    const int timeout_ms = fail_time ? 100 : 500;
    if (fds.empty()) {
      usleep(20 * 1000);
    } else if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      std::fprintf(stderr, "gloo_perf: poll: %s\n", strerror(errno));
      kill_all();
      return 1;
    }
    for (size_t f = 0; f < fds.size(); ++f) {
      if (fds[f].revents == 0) continue;
      Member& m = members[owner[f].first];
      int* fd = owner[f].second ? &m.report_fd : &m.output_fd;
      char buf[65536];
      ssize_t got = read(*fd, buf, sizeof(buf));
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) {
        CloseFd(fd);
        continue;
      }
      if (!owner[f].second) {
        m.output.append(buf, static_cast<size_t>(got));
        if (m.output.size() > 256 * 1024) m.output.erase(0, m.output.size() - 128 * 1024);
        continue;
      }
      m.report_buf.append(buf, static_cast<size_t>(got));
      drain_lines(m, owner[f].first);
    }
    // Members that ended: a clean exit after DONE is fine; anything else fails.
    for (size_t i = 0; i < members.size(); ++i) {
      Member& m = members[i];
      if (m.reaped || waitpid(m.pid, &m.status, WNOHANG) != m.pid) continue;
      m.reaped = true;
      for (int* fd : {&m.report_fd, &m.output_fd}) {  // what is left in its pipes
        if (*fd < 0) continue;
        fcntl(*fd, F_SETFL, O_NONBLOCK);
        char buf[65536];
        ssize_t got;
        while ((got = read(*fd, buf, sizeof(buf))) > 0) {
          (fd == &m.output_fd ? m.output : m.report_buf).append(buf, static_cast<size_t>(got));
        }
        CloseFd(fd);
      }
      drain_lines(m, i);
      if (!m.done || !WIFEXITED(m.status) || WEXITSTATUS(m.status) != 0) {
        m.done = false;
        const std::string out = Tail(m.output);
        fail(m, DescribeExit(m.status) + (out.empty() ? "" : ": " + out));
      }
    }
  }

  if (g_stop_signal != 0) {
    kill_all();
    std::fprintf(stderr, "gloo_perf: stopped by signal %d\n", static_cast<int>(g_stop_signal));
    return 1;
  }
  kill_all();  // reaps and closes what is left
  std::vector<size_t> order;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].failed) order.push_back(i);
  }
  if (order.empty()) return 0;
  printer.Footer();
  // The root cause first: a member that died without reporting an error (a
  // crash) is the likeliest one; otherwise the first to report. The others'
  // errors are usually consequences (connection closed by the peer).
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(members[a].reported, members[a].fail_order) <
           std::make_pair(members[b].reported, members[b].fail_order);
  });
  for (size_t i : order) {
    const Member& m = members[i];
    std::string error = m.error;
    if (m.reported && !Tail(m.output).empty()) error += " [output: " + Tail(m.output, 1000) + "]";
    std::fprintf(stderr, "gloo_perf: %s member %zu of %d (pid %d) failed: %s\n",
                 i == order[0] ? "error:" : "also:", i, n, static_cast<int>(m.pid),
                 error.c_str());
  }
  return 1;
}

int RunParent(const Config& cfg, const Options& opt) {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // A fresh directory for the rendezvous files; one subdirectory per member
  // count. Removed at the end, whatever happened.
  const char* base = getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr && *base ? base : "/tmp") + "/gloo_perf-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    std::fprintf(stderr, "gloo_perf: mkdtemp %s: %s\n", tmpl.c_str(), strerror(errno));
    return 1;
  }
  const std::string dir = buf.data();
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_dir{dir};

  peers::Printer printer(cfg, "gloo", "gloo_perf", "gloo tcp transport on 127.0.0.1, file store");
  int check_failures = 0;
  int rc = 0;
  for (int n : opt.members) {
    const std::string store_dir = dir + "/n" + std::to_string(n);
    if (mkdir(store_dir.c_str(), 0700) != 0) {
      std::fprintf(stderr, "gloo_perf: mkdir %s: %s\n", store_dir.c_str(), strerror(errno));
      rc = 1;
      break;
    }
    rc = RunMembers(cfg, opt, n, store_dir, printer, &check_failures);
    if (rc != 0) break;
  }
  printer.Footer();
  if (rc == 0 && check_failures > 0) {
    std::fprintf(stderr, "gloo_perf: %d row(s) failed the check\n", check_failures);
    rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  Options opt;
  const std::string err = peers::ParseFlags(
      argc, argv, cfg, {"members", "timeout", "member", "report-fd", "store-dir"},
      [&](const std::string& name, const std::string& value) -> std::string {
        if (name == "members") {
          opt.members.clear();
          for (const std::string& part : peers::SplitComma(value)) {
            auto v = peers::ParseInt(part, 2, 1024);
            if (!v) return "--members=" + value + ": expected a comma list of integers in 2..1024";
            opt.members.push_back(static_cast<int>(*v));
          }
          if (opt.members.empty()) return "--members is empty";
        } else if (name == "store-dir") {
          opt.store_dir = value;
        } else {
          const int64_t lo = name == "timeout" ? 1 : 0, hi = name == "timeout" ? 86400 : 1 << 20;
          auto v = peers::ParseInt(value, lo, hi);
          if (!v) {
            return "--" + name + "=" + value + ": expected an integer in " + std::to_string(lo) +
                   ".." + std::to_string(hi);
          }
          (name == "timeout" ? opt.timeout_s : name == "member" ? opt.member : opt.report_fd) =
              static_cast<int>(*v);
        }
        return "";
      });
  if (cfg.help) {
    std::printf("%sflags:\n%s", kUsage, peers::kCommonUsage);
    return 0;
  }
  if (!err.empty()) UsageError(err);
  if (opt.member >= 0) {
    if (opt.report_fd < 0 || opt.store_dir.empty() || opt.members.size() != 1 ||
        opt.member >= opt.members[0]) {
      UsageError("--member needs --report-fd, --store-dir and a single --members above it");
    }
    return RunMember(cfg, opt);
  }
  return RunParent(cfg, opt);
}
