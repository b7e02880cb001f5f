#include "daemon/server/grpc_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <grpcpp/server_posix.h>

#include "absl/strings/str_cat.h"
#include "common/fd_limit.h"
#include "common/status_util.h"
#include "common/unix_socket.h"
#include "daemon/util/log.h"

namespace collectived {

absl::Status GrpcUnixListener::Bind(const std::string& path, int mode, int gid) {
  auto fd = ListenUnix(path, SOCK_STREAM, mode, gid);
  if (!fd.ok()) return fd.status();
  listen_fd_.reset(*fd);
  path_ = path;
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoStatus(errno, "eventfd");
  return absl::OkStatus();
}

void GrpcUnixListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { Loop(server); });
}

void GrpcUnixListener::Stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    unlink(path_.c_str());
  }
}

void GrpcUnixListener::Loop(grpc::Server* server) {
  absl::Time next_log;
  int refused = 0;         // connections closed over the budget, since the last log
  std::string reason;      // why accept() backs off, since the last log
  bool back_off = false;
  for (;;) {
    // While backing off, wait on the wake-up descriptor alone: the listener
    // stays readable and would spin.
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
    int r = poll(fds, back_off ? 1 : 2, back_off ? 100 : -1);
    if (r < 0 && errno != EINTR) {
      LogEvent(LogLevel::kError, "grpc_listener_failed", {{"error", std::strerror(errno)}});
      return;
    }
    if (r > 0 && (fds[0].revents & POLLIN)) return;
    back_off = false;
    for (;;) {
      int c = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The connection stays in the backlog: it is served after the
          // back-off, not refused.
          back_off = true;
          reason = absl::StrCat("accept4: ", std::strerror(errno));
        }
        break;
      }
      if (FdAdmitted(c)) {
        grpc::AddInsecureChannelFromFd(server, c);  // the server owns `c` now
        continue;
      }
      close(c);
      ++refused;
    }
    if ((refused > 0 || !reason.empty()) && absl::Now() >= next_log) {
      LogEvent(LogLevel::kWarn, refused > 0 ? "grpc_connection_refused" : "grpc_accept_backoff",
               {{"refused", absl::StrCat(refused)},
                {"reason", refused > 0 ? FdExhaustedError("a gRPC connection").ToString()
                                       : reason}});
      refused = 0;
      reason.clear();
      next_log = absl::Now() + absl::Seconds(1);
    }
  }
}

}  // namespace collectived
