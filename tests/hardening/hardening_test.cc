// A hostile local process against the real daemon: it may connect to both
// sockets, hold connections open, send descriptors, resize or punch the
// memory it is handed, and exhaust descriptors. None of it may crash the
// daemon, leak in it, or lock other clients out for good.
// Every wait has a deadline.
#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectived/client.h"
#include "common/fast_queue.h"
#include "common/socket_path.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "tests/harness/harness.h"
#include "tests/harness/raw_session.h"

namespace collectived::testing {
namespace {

// Open descriptors of process `pid`, or -1.
int OpenFds(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Waits until `pid` has at most `fds` open descriptors; returns the last count.
int WaitForFds(pid_t pid, int fds, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  int n = OpenFds(pid);
  while (n > fds && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    n = OpenFds(pid);
  }
  return n;
}

bool Alive(pid_t pid) {
  // A zombie still answers kill(0): look at the state too.
  std::string stat;
  if (FILE* f = fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r")) {
    char buf[512] = {};
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    stat.assign(buf, n);
  }
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// A client of the SDK that joins a one-member mesh and runs a psum: proof
// that the daemon serves new clients.
absl::Status ServeNewClient(const Daemon& d, const std::string& name,
                            absl::Duration connect_timeout = absl::Seconds(10)) {
  ClientOptions options;
  options.socket_path = d.socket();
  options.client_name = name;
  options.connect_timeout = connect_timeout;
  options.rpc_timeout = absl::Seconds(10);
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  auto mesh = (*client)->JoinMesh({.name = name, .axes = {{"i", 1}}});
  if (!mesh.ok()) return mesh.status();
  auto buf = (*client)->Allocate(4096);
  if (!buf.ok()) return buf.status();
  buf->as<float>()[0] = 2.5f;
  auto x = Array::Of<float>(*buf, {4});
  if (absl::Status st = (*mesh)->barrier(); !st.ok()) return st;
  if (absl::Status st = (*mesh)->pmax(x, {"i"}); !st.ok()) return st;
  if (buf->as<float>()[0] != 2.5f) return absl::InternalError("pmax of one member changed x");
  return absl::OkStatus();
}

// Runs psum f32[4] in place over `mesh` for each session (one thread each)
// through gRPC Submit + Wait.
std::vector<absl::Status> PsumAll(std::vector<RawSession*> sessions) {
  std::vector<absl::Status> out(sessions.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < sessions.size(); ++i) {
    threads.emplace_back([&, i] {
      RawSession& s = *sessions[i];
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::SubmitRequest req;
      req.set_session_id(s.id());
      v1::OpSpec& op = *req.mutable_op();
      op.set_mesh_id(s.mesh_id());
      op.set_kind(v1::PSUM);
      op.add_axes("i");
      op.set_dtype(v1::FLOAT32);
      op.add_shape(4);
      op.mutable_input()->set_buffer_id(s.buffer_id());
      v1::SubmitResponse resp;
      grpc::Status st = s.stub().Submit(&ctx, req, &resp);
      if (!st.ok()) {
        out[i] = absl::InternalError(absl::StrCat("Submit: ", st.error_message()));
        return;
      }
      grpc::ClientContext wctx;
      SetDeadline(wctx);
      v1::WaitRequest wait;
      wait.set_session_id(s.id());
      wait.set_op_id(resp.op_id());
      v1::WaitResponse wresp;
      st = s.stub().Wait(&wctx, wait, &wresp);
      out[i] = st.ok() ? absl::OkStatus()
                       : absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                                      st.error_message());
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Joins `sessions` (attached) into one mesh `name`, one thread each.
void JoinAll(std::vector<RawSession*> sessions, const std::string& name) {
  std::vector<absl::Status> st(sessions.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < sessions.size(); ++i) {
    threads.emplace_back([&, i] {
      st[i] = sessions[i]->Join(name, static_cast<int>(sessions.size()), static_cast<int>(i));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s;
}

// The descriptor of buffer `id` of session `s`, as the SDK would get it.
absl::StatusOr<UniqueFd> BufferFd(RawSession& s, const std::string& id) {
  auto reply = s.Request("FD " + id);
  if (!reply.ok()) return reply.status();
  if (!reply->fd.valid()) return absl::InternalError(reply->data);
  return std::move(reply->fd);
}

// ---------------------------------------------------------------------------
// Memory handed to clients is sealed
// ---------------------------------------------------------------------------

// A client that shrinks (or grows) a buffer or its queue and then submits or
// just waits would make the daemon's mapping fault (SIGBUS). The size is
// sealed; punching a hole is allowed and only zeroes the range.
TEST(SealedMemoryTest, ClientsCannotResizeBuffersOrQueuesAndHolesReadAsZeros) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RawSession a(**daemon, "seal-a"), b(**daemon, "seal-b");
  ASSERT_OK(a.Attach());
  ASSERT_OK(b.Attach());
  JoinAll({&a, &b}, "seal");
  ASSERT_OK(a.MapQueue());

  auto fa = BufferFd(a, a.buffer_id());
  auto fb = BufferFd(b, b.buffer_id());
  ASSERT_TRUE(fa.ok()) << fa.status();
  ASSERT_TRUE(fb.ok()) << fb.status();
  const int seals = fcntl(fa->get(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  // (ASSERT: after a successful resize the mappings below would fault.)
  errno = 0;
  ASSERT_EQ(ftruncate(fa->get(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  ASSERT_EQ(ftruncate(fa->get(), 1 << 20), -1);
  EXPECT_EQ(errno, EPERM);
  char byte = 1;
  ASSERT_EQ(pwrite(fa->get(), &byte, 1, 4096), -1);  // past the end: growing
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(fcntl(fa->get(), F_ADD_SEALS, F_SEAL_WRITE), -1);  // seals are sealed
  float* pa = static_cast<float*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fa->get(), 0));
  float* pb = static_cast<float*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fb->get(), 0));
  ASSERT_NE(pa, MAP_FAILED);
  ASSERT_NE(pb, MAP_FAILED);
  for (int i = 0; i < 4; ++i) {
    pa[i] = 1.0f;
    pb[i] = 2.0f;
  }
  // A hole reads back as zeros, in the client and in the daemon.
  ASSERT_EQ(fallocate(fa->get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0)
      << std::strerror(errno);
  EXPECT_EQ(pa[0], 0.0f);
  for (const absl::Status& st : PsumAll({&a, &b})) EXPECT_TRUE(st.ok()) << st;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pa[i], 2.0f) << i;
    EXPECT_EQ(pb[i], 2.0f) << i;
  }
  munmap(pa, 4096);
  munmap(pb, 4096);
  EXPECT_TRUE(Alive((*daemon)->pid()));
  ASSERT_OK(ServeNewClient(**daemon, "after-seal"));
}

// The fast-path queue's descriptor is sealed the same way: shrinking it under
// the daemon's queue thread is refused.
TEST(SealedMemoryTest, QueueCannotBeShrunk) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RawSession s(**daemon, "seal-queue");
  ASSERT_OK(s.Attach());
  auto reply = s.Request("QUEUE");
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->fd.valid()) << reply->data;
  errno = 0;
  ASSERT_EQ(ftruncate(reply->fd.get(), 0), -1);  // (else the mapping below faults)
  EXPECT_EQ(errno, EPERM);
  // Ring the daemon's doorbell so its queue thread reads the header, then
  // give it time to fault if it could.
  void* base = mmap(nullptr, fastq::kQueueBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                    reply->fd.get(), 0);
  ASSERT_NE(base, MAP_FAILED);
  fastq::QueueView q = fastq::QueueView::Of(base);
  fastq::Ring(q.header->daemon_bell, q.header->daemon_sleeping);
  absl::SleepFor(absl::Milliseconds(200));
  munmap(base, fastq::kQueueBytes);
  EXPECT_TRUE(Alive((*daemon)->pid()));
  ASSERT_OK(ServeNewClient(**daemon, "after-queue"));
}

// ---------------------------------------------------------------------------
// Descriptors sent to the daemon
// ---------------------------------------------------------------------------

// Sends `text` with `count` descriptors (copies of one pipe end) attached.
absl::Status SendWithFds(int sock, const std::string& text, int count) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  std::vector<int> fds(static_cast<size_t>(count), p[0]);
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  const int err = errno;
  close(p[0]);
  close(p[1]);
  if (n < 0) return absl::InternalError(absl::StrCat("sendmsg: ", std::strerror(err)));
  return absl::OkStatus();
}

// Every packet with descriptors used to leak all but the first in the
// daemon: 100 short connections took it from 11 to 111 descriptors.
TEST(SideSocketTest, DescriptorsSentToTheDaemonAreNeverKept) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_OK(ServeNewClient(**daemon, "warm-up"));  // threads and pools started
  const pid_t pid = (*daemon)->pid();
  const int before = WaitForFds(pid, 0, absl::Milliseconds(300));
  ASSERT_GT(before, 0);
  const std::string side = SideSocketPath((*daemon)->socket());
  std::string reply_text;
  for (int i = 0; i < 100; ++i) {
    auto sock = ConnectSeqPacket(side);
    ASSERT_TRUE(sock.ok()) << sock.status();
    // Two descriptors (the old leak), then many (control data truncated).
    ASSERT_OK(SendWithFds(*sock, "FD b-x", i % 2 == 0 ? 2 : 200));
    auto reply = ReceivePacket(*sock, absl::Seconds(10));
    if (reply.ok() && reply_text.empty()) reply_text = reply->data;
    close(*sock);
  }
  // Refused with a reason, and the connection closed.
  EXPECT_TRUE(absl::StartsWith(reply_text, "ERR 3 ")) << reply_text;
  EXPECT_TRUE(absl::StrContains(reply_text, "descriptors")) << reply_text;
  const int after = WaitForFds(pid, before);
  EXPECT_EQ(after, before) << "the daemon kept descriptors it was sent";
  ASSERT_OK(ServeNewClient(**daemon, "after-fds"));
  EXPECT_EQ(WaitForFds(pid, before), before);
}

// ---------------------------------------------------------------------------
// Connections that never attach
// ---------------------------------------------------------------------------

TEST(SideSocketTest, UnattachedConnectionsAreCappedPerUidAndTimedOut) {
  auto daemon = Daemon::Start({"--attach_timeout_ms=500", "--max_unattached_connections=64",
                               "--max_unattached_connections_per_uid=8"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string side = SideSocketPath((*daemon)->socket());
  std::vector<UniqueFd> conns;
  for (int i = 0; i < 20; ++i) {
    auto sock = ConnectSeqPacket(side);
    ASSERT_TRUE(sock.ok()) << sock.status();
    conns.emplace_back(*sock);
  }
  // The first 8 wait to attach; the other 12 are refused at once.
  int refused = 0, expired = 0;
  for (auto& c : conns) {
    auto reply = ReceivePacket(c.get(), absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    if (absl::StartsWith(reply->data, "ERR 8 ")) ++refused;
    if (absl::StartsWith(reply->data, "ERR 4 ")) ++expired;
  }
  EXPECT_EQ(refused, 12);
  EXPECT_EQ(expired, 8);
  // Expired connections are closed by the daemon.
  for (auto& c : conns) {
    auto next = ReceivePacket(c.get(), absl::Seconds(10));
    EXPECT_TRUE(absl::IsUnavailable(next.status())) << next.status();
  }
  // A burst of SDK clients (more than the per-uid cap at once) gets in: the
  // SDK retries a refused side connection.
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(24);
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&, i] { results[i] = ServeNewClient(**daemon, absl::StrCat("burst-", i)); });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) EXPECT_TRUE(st.ok()) << st;
  const ChildResult stop = (*daemon)->Stop();
  EXPECT_TRUE(absl::StrContains(stop.output, "side_connection_refused")) << stop.output;
}

// ---------------------------------------------------------------------------
// Descriptor exhaustion
// ---------------------------------------------------------------------------

absl::StatusOr<UniqueFd> ConnectStream(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(std::strerror(errno));
  }
  return fd;
}

// gRPC's own listener stopped for good at EMFILE, so a process that held
// enough connections locked every later client out. The daemon now accepts
// its Unix connections itself, within a descriptor budget, and recovers.
TEST(DescriptorBudgetTest, ExhaustionIsRefusedAndRecoveredFrom) {
  // A low hard limit (the soft one lower still: the daemon raises it).
  auto daemon = Daemon::StartWrapped(
      {"/usr/bin/prlimit", "--nofile=100:256", "--"},
      {"--fd_reserve=32", "--attach_timeout_ms=60000", "--max_unattached_connections=1000",
       "--max_unattached_connections_per_uid=1000"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_OK(ServeNewClient(**daemon, "before"));
  // Hold connections to both sockets until the daemon is at its budget.
  std::vector<UniqueFd> held;
  const std::string side = SideSocketPath((*daemon)->socket());
  for (int i = 0; i < 200; ++i) {
    auto g = ConnectStream((*daemon)->socket());
    if (g.ok()) held.push_back(*std::move(g));
    auto s = ConnectSeqPacket(side);
    if (s.ok()) held.emplace_back(*s);
  }
  const pid_t pid = (*daemon)->pid();
  absl::SleepFor(absl::Milliseconds(300));
  const int at_limit = OpenFds(pid);
  std::printf("daemon descriptors while flooded: %d (hard limit 256, reserve 32)\n", at_limit);
  EXPECT_LE(at_limit, 256 - 32 + 8);  // + what gRPC opened for itself
  // A new client is refused with an error, not left hanging.
  const absl::Time start = absl::Now();
  absl::Status refused = ServeNewClient(**daemon, "during", absl::Seconds(2));
  EXPECT_FALSE(refused.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << refused;
  std::printf("client during exhaustion: %s\n", refused.ToString().c_str());
  // Release: new clients are served again.
  held.clear();
  absl::Status after = absl::UnknownError("not tried");
  for (int attempt = 0; attempt < 20 && !after.ok(); ++attempt) {
    after = ServeNewClient(**daemon, absl::StrCat("after-", attempt));
    if (!after.ok()) absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_TRUE(after.ok()) << after;
  const ChildResult stop = (*daemon)->Stop();
  EXPECT_TRUE(absl::StrContains(stop.output, "open_files_limit=256")) << stop.output;
  EXPECT_TRUE(absl::StrContains(stop.output, "_connection_refused")) << stop.output;
}

// ---------------------------------------------------------------------------
// Socket permissions
// ---------------------------------------------------------------------------

// The sockets used to be bound at their path and then chmod'ed, so under
// umask 000 they were briefly 0777. Now they appear (renamed into place)
// with their final mode and group: the directory sees no IN_CREATE for them.
TEST(SocketPermissionTest, SocketsAppearWithTheirFinalModeWhateverTheUmask) {
  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/collectived.sock";
  UniqueFd watch(inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  ASSERT_TRUE(watch.valid());
  ASSERT_GE(inotify_add_watch(watch.get(), dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_ATTRIB), 0);
  const mode_t old_umask = umask(0);
  auto daemon = Daemon::StartAt(socket, {"--socket_mode=0600",
                                         absl::StrCat("--socket_group=", getgid())});
  umask(old_umask);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::vector<std::string> created, moved;
  alignas(inotify_event) char buf[8192];
  for (;;) {
    ssize_t n = read(watch.get(), buf, sizeof(buf));
    if (n <= 0) break;
    for (char* p = buf; p < buf + n;) {
      auto* e = reinterpret_cast<inotify_event*>(p);
      const std::string name = e->len > 0 ? std::string(e->name) : "";
      if (e->mask & IN_CREATE) created.push_back(name);
      if (e->mask & IN_MOVED_TO) moved.push_back(name);
      p += sizeof(inotify_event) + e->len;
    }
  }
  for (const std::string& name : {std::string("collectived.sock"), std::string("collectived.sock.fds")}) {
    EXPECT_EQ(std::count(created.begin(), created.end(), name), 0)
        << name << " was created in place (with the umask's mode first)";
    EXPECT_EQ(std::count(moved.begin(), moved.end(), name), 1) << name;
    struct stat st {};
    ASSERT_EQ(stat((dir + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 07777, 0600u) << name;
    EXPECT_EQ(st.st_gid, getgid()) << name;
  }
  // Nothing is left of the private directories.
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    EXPECT_FALSE(absl::StartsWith(e->d_name, ".bind-")) << e->d_name;
  }
  closedir(d);
  ASSERT_OK(ServeNewClient(**daemon, "perm"));
}

}  // namespace
}  // namespace collectived::testing
