#include "daemon/server/side_channel.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fast_queue.h"
#include "common/unix_socket.h"
#include "common/status_util.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

std::string ErrorReply(const absl::Status& status) {
  return absl::StrCat("ERR ", static_cast<int>(status.code()), " ", status.message());
}

}  // namespace

absl::Status SideChannel::Start(const std::string& path, int mode) {
  auto fd = ListenSeqPacket(path, mode);
  if (!fd.ok()) return fd.status();
  path_ = path;
  listen_fd_ = *fd;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return ErrnoStatus(errno, "epoll/eventfd");
  for (int f : {listen_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = f;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, f, &ev);
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void SideChannel::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  for (auto& [fd, conn] : conns_) close(fd);
  conns_.clear();
  close(listen_fd_);
  close(epoll_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void SideChannel::CloseConn(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  std::string session = it->second.session_id;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  conns_.erase(it);
  if (!session.empty()) {
    if (fast_path_ != nullptr) fast_path_->Close(session);
    // NOT_FOUND when the client closed its session first: nothing to do.
    engine_->CloseSession(session, "client disconnected (side socket closed)").IgnoreError();
  }
}

void SideChannel::Loop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LogEvent(LogLevel::kError, "side_channel_failed", {{"error", std::strerror(errno)}});
      return;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_) return;
      if (fd == listen_fd_) {
        for (;;) {
          int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (c < 0) {
            if (errno == EMFILE || errno == ENFILE) {
              // Out of descriptors: back off instead of spinning on the
              // still-readable listener.
              LogEvent(LogLevel::kWarn, "side_accept_failed", {{"error", std::strerror(errno)}});
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
            break;
          }
          ucred cred{};
          socklen_t len = sizeof(cred);
          Conn conn;
          if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
            conn.pid = cred.pid;
            conn.uid = static_cast<int>(cred.uid);
          }
          conns_[c] = conn;
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = c;
          epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev);
        }
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      if (events[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        CloseConn(fd);
        continue;
      }
      auto packet = ReceivePacket(fd, absl::ZeroDuration());
      if (!packet.ok()) {
        if (absl::IsDeadlineExceeded(packet.status())) continue;  // spurious wake-up
        CloseConn(fd);
        continue;
      }
      if (packet->fd >= 0) close(packet->fd);  // clients send no descriptors
      HandleRequest(fd, it->second, packet->data);
    }
    for (int fd : doomed_) CloseConn(fd);
    doomed_.clear();
  }
}

bool SideChannel::Reply(int fd, const std::string& data, int pass_fd) {
  // Never block the loop on one peer: a client that does not read its
  // replies loses its connection (and so its session).
  absl::Status st = SendPacket(fd, data, pass_fd, /*nonblocking=*/true);
  if (!st.ok()) {
    LogEvent(LogLevel::kWarn, "side_reply_failed", {{"error", st.ToString()}});
    doomed_.push_back(fd);
  }
  return st.ok();
}

void SideChannel::HandleRequest(int fd, Conn& conn, const std::string& request) {
  std::vector<std::string> words = absl::StrSplit(request, ' ', absl::SkipEmpty());
  if (words.size() == 3 && words[0] == "ATTACH") {
    if (!conn.session_id.empty()) {
      Reply(fd, ErrorReply(absl::FailedPreconditionError("this connection is already attached")));
      return;
    }
    absl::Status st = engine_->AttachSession(words[1], words[2], conn.pid, conn.uid);
    if (st.ok()) conn.session_id = words[1];
    Reply(fd, st.ok() ? "OK" : ErrorReply(st));
    return;
  }
  if (words.size() == 2 && words[0] == "FD") {
    if (conn.session_id.empty()) {
      Reply(fd, ErrorReply(absl::FailedPreconditionError(
                    "attach the session before asking for descriptors")));
      return;
    }
    auto buffer = engine_->GetBuffer(conn.session_id, words[1]);
    if (!buffer.ok()) {
      Reply(fd, ErrorReply(buffer.status()));
      return;
    }
    Reply(fd, absl::StrCat("OK ", (*buffer)->size()), (*buffer)->fd());
    return;
  }
  if (words.size() == 1 && words[0] == "QUEUE") {
    if (conn.session_id.empty()) {
      Reply(fd, ErrorReply(absl::FailedPreconditionError(
                    "attach the session before opening its queue")));
      return;
    }
    if (fast_path_ == nullptr) {
      Reply(fd, ErrorReply(absl::UnimplementedError("this daemon has no fast path")));
      return;
    }
    auto queue_fd = fast_path_->Open(conn.session_id);
    if (!queue_fd.ok()) {
      Reply(fd, ErrorReply(queue_fd.status()));
      return;
    }
    Reply(fd, absl::StrCat("OK ", fastq::kQueueBytes, " ", fastq::kVersion), *queue_fd);
    return;
  }
  Reply(fd, ErrorReply(absl::InvalidArgumentError(absl::StrCat(
                "malformed side-socket request (", request.size(), " bytes)"))));
}

}  // namespace collectived
