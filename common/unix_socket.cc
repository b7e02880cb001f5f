#include "common/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

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

absl::StatusOr<int> ListenUnix(const std::string& path, int type, int mode, int gid) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  if (IsLive(path, type)) {
    return absl::AlreadyExistsError(absl::StrCat("another process listens on ", path));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  std::string private_dir = absl::StrCat(dir, "/.bind-XXXXXX");
  if (private_dir.size() + 2 >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path '", path, "' is too long: binding it needs ", private_dir.size() + 2,
        " bytes, at most ", sizeof(sockaddr_un::sun_path) - 1));
  }
  if (mkdtemp(private_dir.data()) == nullptr) {
    return ErrnoStatus(errno, absl::StrCat("creating a private directory in ", dir));
  }
  const std::string bind_path = private_dir + "/s";
  auto bind_addr = Address(bind_path);
  auto fail = [&](int err, const std::string& what) {
    unlink(bind_path.c_str());
    rmdir(private_dir.c_str());
    return ErrnoStatus(err, what);
  };
  if (!bind_addr.ok()) return fail(EINVAL, bind_path);
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return fail(errno, "socket(AF_UNIX)");
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&*bind_addr), sizeof(*bind_addr)) != 0) {
    return fail(errno, absl::StrCat("bind ", bind_path));
  }
  if (chmod(bind_path.c_str(), static_cast<mode_t>(mode)) != 0) {
    return fail(errno, absl::StrCat("chmod ", path));
  }
  if (gid >= 0 && chown(bind_path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) {
    return fail(errno, absl::StrCat("chown ", path, " to group ", gid));
  }
  if (listen(fd.get(), SOMAXCONN) != 0) return fail(errno, absl::StrCat("listen ", path));
  if (rename(bind_path.c_str(), path.c_str()) != 0) {
    return fail(errno, absl::StrCat("rename ", bind_path, " to ", path));
  }
  rmdir(private_dir.c_str());
  return fd.release();
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

absl::StatusOr<Packet> ReceivePacket(int sock, absl::Duration timeout, Descriptors descriptors) {
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
  // Room for two descriptors, so that a packet carrying more than one is
  // seen as such (then refused) instead of merely truncated.
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (descriptors != Descriptors::kNone) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "recvmsg on side socket");
  // Own every descriptor the kernel installed before looking at anything
  // else, so that each error path below closes them.
  std::vector<UniqueFd> fds;
  if (msg.msg_control != nullptr) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
  }
  if (n == 0 && fds.empty() && !(msg.msg_flags & MSG_CTRUNC)) {
    return absl::UnavailableError("side socket closed by peer");
  }
  if (msg.msg_flags & MSG_TRUNC) {
    return absl::InvalidArgumentError(
        absl::StrCat("oversized packet on side socket (at most ", sizeof(buf), " bytes)"));
  }
  if (descriptors == Descriptors::kNone && (msg.msg_flags & MSG_CTRUNC)) {
    return absl::InvalidArgumentError("a packet on the side socket carried descriptors; none are accepted");
  }
  if (fds.size() > 1 || (msg.msg_flags & MSG_CTRUNC)) {
    return absl::InvalidArgumentError(
        "a packet on the side socket carried more than one descriptor");
  }
  Packet packet;
  packet.data.assign(buf, static_cast<size_t>(n));
  if (!fds.empty()) packet.fd = std::move(fds[0]);
  return packet;
}

}  // namespace collectived
