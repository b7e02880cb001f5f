#include "common/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace collectived {
namespace {

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path '", path, "' must be 1 to ", sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

bool IsLive(const std::string& path, int type) {
  auto addr = Address(path);
  if (!addr.ok()) return false;
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool live = connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) == 0;
  close(fd);
  return live;
}

}  // namespace

bool StreamSocketIsLive(const std::string& path) { return IsLive(path, SOCK_STREAM); }

absl::StatusOr<int> ListenSeqPacket(const std::string& path, int mode) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  if (IsLive(path, SOCK_SEQPACKET)) {
    return absl::AlreadyExistsError(absl::StrCat("another process listens on ", path));
  }
  unlink(path.c_str());
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  if (bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("bind ", path));
  }
  if (chmod(path.c_str(), static_cast<mode_t>(mode)) != 0 || listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("listen ", path));
  }
  return fd;
}

absl::StatusOr<int> ConnectSeqPacket(const std::string& path) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  if (connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("connect ", path));
  }
  return fd;
}

absl::Status SendPacket(int sock, const std::string& data, int fd, bool nonblocking) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0));
    if (n >= 0) return absl::OkStatus();
    if (errno == EINTR) continue;
    return ErrnoStatus(errno, "sendmsg on side socket");
  }
}

absl::StatusOr<Packet> ReceivePacket(int sock, absl::Duration timeout) {
  pollfd p{sock, POLLIN, 0};
  int ms = timeout == absl::InfiniteDuration()
               ? -1
               : static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  for (;;) {
    int r = poll(&p, 1, ms);
    if (r > 0) break;
    if (r == 0) return absl::DeadlineExceededError("no answer on the side socket");
    if (errno != EINTR) return ErrnoStatus(errno, "poll on side socket");
  }
  char buf[4096];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "recvmsg on side socket");
  Packet packet;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&packet.fd, CMSG_DATA(c), sizeof(int));
    }
  }
  if (n == 0 && packet.fd < 0) return absl::UnavailableError("side socket closed by peer");
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    if (packet.fd >= 0) close(packet.fd);
    return absl::InvalidArgumentError("oversized packet on side socket");
  }
  packet.data.assign(buf, static_cast<size_t>(n));
  return packet;
}

}  // namespace collectived
