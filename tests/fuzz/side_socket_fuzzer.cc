// libFuzzer target: what a local process can send on the side socket.
//
// A real SideChannel (with a real Engine and FastPath) listens on a socket in
// a temp directory; each input is a script of packets sent on real
// connections:
//   repeated { u8 flags; u8 len_lo; u8 len_hi; len bytes of text }
// flags bits 0-1: descriptors attached to the packet (0, 1, 2 or 40);
//       bit 2: replace "$S", "$T" and "$B" in the text with the id and attach
//              token of a fresh session and the id of its buffer, so the
//              ATTACH, FD and QUEUE paths are reached;
//       bit 3: close the connection and open a new one before sending;
//       bit 4: do not wait for a reply.
// The daemon side must never crash, leak or hang: every packet on a live
// connection is answered or the connection closed, within a deadline.
//
// Built with clang -fsanitize=fuzzer (scripts/fuzz.sh) and as a plain
// program that replays the corpus (a ctest), via fuzz_main.cc.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/core/engine.h"
#include "exec/cpu_executor.h"
#include "daemon/server/fast_path.h"
#include "daemon/server/side_channel.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

struct Fixture;
Fixture& GetFixture();

struct Fixture {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<FastPath> fast_path;
  std::unique_ptr<SideChannel> side;
  std::string path;
  UniqueFd null_fd;

  Fixture() {
    SetLogLevel(LogLevel::kError);
    EngineOptions options;
    options.max_buffer_size = 1 << 20;
    options.max_sessions = 1 << 16;
    options.attach_timeout = absl::Milliseconds(200);
    engine = std::make_unique<Engine>(
        options, std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 1, .chunk_bytes = 4096}));
    fast_path = std::make_unique<FastPath>(engine.get(), FastPathOptions{.spin = absl::ZeroDuration()});
    SideChannelOptions side_options;
    side_options.attach_timeout = absl::Milliseconds(200);
    side = std::make_unique<SideChannel>(engine.get(), fast_path.get(), side_options);
    char dir[] = "/tmp/collectived-fuzz-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    path = std::string(dir) + "/s.fds";
    if (!side->Start(path).ok()) std::abort();
    static std::string to_remove;
    to_remove = dir;
    std::atexit([] {
      GetFixture().side->Stop();  // unlinks the socket
      rmdir(to_remove.c_str());
    });
    null_fd.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
};

Fixture& GetFixture() {
  static Fixture* f = new Fixture();
  return *f;
}

// Sends `text` with `count` copies of `fd` attached.
void SendWithFds(int sock, const std::string& text, int fd, int count) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (count > 0) {
    control.resize(CMSG_SPACE(sizeof(int) * count));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * count);
    for (int i = 0; i < count; ++i) std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof(int));
  }
  (void)sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace
}  // namespace collectived

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace collectived;
  Fixture& f = GetFixture();
  UniqueFd conn;
  bool open = false;
  std::string session, token, buffer;
  size_t at = 0;
  int packets = 0;
  while (at + 3 <= size && packets < 64) {
    const uint8_t flags = data[at];
    const size_t len = std::min<size_t>(data[at + 1] | (size_t{data[at + 2]} << 8), size - at - 3);
    std::string text(reinterpret_cast<const char*>(data + at + 3), len);
    at += 3 + len;
    ++packets;
    if (!open || (flags & 8)) {
      auto c = ConnectSeqPacket(f.path);
      if (!c.ok()) std::abort();  // the listener must keep accepting
      conn.reset(*c);
      open = true;
    }
    if (flags & 4) {
      if (session.empty()) {
        auto s = f.engine->CreateSession("fuzz");
        if (s.ok()) {
          session = s->session_id;
          token = s->attach_token;
          auto b = f.engine->AllocateBuffer(session, 4096);
          if (b.ok()) buffer = b->buffer_id;
        }
      }
      text = absl::StrReplaceAll(text, {{"$S", session}, {"$T", token}, {"$B", buffer}});
    }
    static constexpr int kFds[] = {0, 1, 2, 40};
    SendWithFds(conn.get(), text, f.null_fd.get(), kFds[flags & 3]);
    if (flags & 16) continue;
    auto reply = ReceivePacket(conn.get(), absl::Seconds(10));
    if (absl::IsDeadlineExceeded(reply.status())) std::abort();  // no answer: a hang
    if (!reply.ok()) open = false;                              // closed by the daemon
  }
  return 0;
}
