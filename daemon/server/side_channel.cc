#include "daemon/server/side_channel.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fast_queue.h"
#include "common/fd_limit.h"
#include "common/unix_socket.h"
#include "common/side_protocol.h"
#include "common/status_util.h"
#include "daemon/util/log.h"

namespace collectived {

using side::ErrorReply;

absl::Status SideChannel::Start(const std::string& path) {
  auto fd = ListenUnix(path, SOCK_SEQPACKET, options_.mode, options_.gid);
  if (!fd.ok()) return fd.status();
  path_ = path;
  listen_fd_ = *fd;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return ErrnoStatus(errno, "epoll/eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  UpdateListening();
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
  if (session.empty()) NoLongerUnattached(it->second.uid);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  conns_.erase(it);
  // The number may be reused by the next accept: it is no longer doomed.
  std::erase(doomed_, fd);
  if (!session.empty()) {
    if (fast_path_ != nullptr) fast_path_->Close(session);
    // NOT_FOUND when the client closed its session first: nothing to do.
    engine_->CloseSession(session, "client disconnected (side socket closed)").IgnoreError();
  }
}

void SideChannel::NoLongerUnattached(int uid) {
  --unattached_;
  if (--unattached_by_uid_[uid] == 0) unattached_by_uid_.erase(uid);
}

void SideChannel::UpdateListening() {
  const bool want = unattached_ < options_.max_unattached;
  if (want == listening_) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, listen_fd_, &ev);
  listening_ = want;
}

void SideChannel::AcceptAll() {
  while (unattached_ < options_.max_unattached) {
    int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors although the budget should prevent it: back
        // off instead of spinning on the still-readable listener.
        LogEvent(LogLevel::kWarn, "side_accept_failed", {{"error", std::strerror(errno)}});
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    Conn conn;
    conn.attach_deadline = absl::Now() + options_.attach_timeout;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      conn.pid = cred.pid;
      conn.uid = static_cast<int>(cred.uid);
    }
    std::string refusal;
    if (!FdAdmitted(c)) {
      refusal = ErrorReply(FdExhaustedError("a side-socket connection"));
    } else if (unattached_by_uid_[conn.uid] >= options_.max_unattached_per_uid) {
      refusal = ErrorReply(absl::ResourceExhaustedError(absl::StrCat(
          "uid ", conn.uid, " already has ", options_.max_unattached_per_uid,
          " side-socket connections waiting to attach")));
    }
    if (!refusal.empty()) {
      if (unattached_by_uid_[conn.uid] == 0) unattached_by_uid_.erase(conn.uid);
      SendPacket(c, refusal, -1, /*nonblocking=*/true).IgnoreError();
      close(c);
      ++refusals_unlogged_;
      if (absl::Now() >= next_refusal_log_) {
        LogEvent(LogLevel::kWarn, "side_connection_refused",
                 {{"uid", absl::StrCat(conn.uid)}, {"pid", absl::StrCat(conn.pid)},
                  {"refused", absl::StrCat(refusals_unlogged_)}, {"reason", refusal}});
        refusals_unlogged_ = 0;
        next_refusal_log_ = absl::Now() + absl::Seconds(1);
      }
      continue;
    }
    ++unattached_;
    ++unattached_by_uid_[conn.uid];
    conns_[c] = conn;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev);
  }
}

absl::Duration SideChannel::ExpireUnattached() {
  if (unattached_ == 0) return absl::InfiniteDuration();
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  std::vector<int> expired;
  for (const auto& [fd, conn] : conns_) {
    if (!conn.session_id.empty()) continue;
    if (conn.attach_deadline <= now) {
      expired.push_back(fd);
    } else {
      next = std::min(next, conn.attach_deadline);
    }
  }
  for (int fd : expired) {
    LogEvent(LogLevel::kDebug, "side_connection_expired",
             {{"pid", absl::StrCat(conns_[fd].pid)}, {"uid", absl::StrCat(conns_[fd].uid)}});
    Reply(fd, ErrorReply(absl::DeadlineExceededError(
                  "the connection did not attach a session in time")));
    CloseConn(fd);
  }
  doomed_.clear();  // any of these was just closed
  return next - now;
}

void SideChannel::Loop() {
  std::vector<epoll_event> events(64);
  for (;;) {
    const absl::Duration wait = ExpireUnattached();
    UpdateListening();
    const int timeout_ms =
        wait == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1))), 1, 60000));
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      LogEvent(LogLevel::kError, "side_channel_failed", {{"error", std::strerror(errno)}});
      return;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_) return;
      if (fd == listen_fd_) {
        AcceptAll();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      if (events[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        CloseConn(fd);
        continue;
      }
      // Clients send no descriptors: any that come are dropped by the kernel.
      auto packet = ReceivePacket(fd, absl::ZeroDuration(), Descriptors::kNone);
      if (!packet.ok()) {
        if (absl::IsDeadlineExceeded(packet.status())) continue;  // spurious wake-up
        if (absl::IsInvalidArgument(packet.status())) Reply(fd, ErrorReply(packet.status()));
        CloseConn(fd);
        continue;
      }
      const bool was_attached = !it->second.session_id.empty();
      HandleRequest(fd, it->second, packet->data);
      if (!was_attached && !it->second.session_id.empty()) NoLongerUnattached(it->second.uid);
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

void SideChannel::HandlePeerFd(int fd, const Conn& conn, const std::vector<std::string>& words) {
  if (conn.session_id.empty()) {
    Reply(fd, ErrorReply(absl::FailedPreconditionError(
                  "attach the session before asking for descriptors")));
    return;
  }
  int member = -1;
  if (!absl::SimpleAtoi(words[2], &member)) {
    Reply(fd, ErrorReply(absl::InvalidArgumentError("PEERFD needs <mesh id> <member> <buffer id>")));
    return;
  }
  auto buffer = engine_->GetPeerBuffer(conn.session_id, words[1], member, words[3]);
  if (!buffer.ok()) {
    Reply(fd, ErrorReply(buffer.status()));
    return;
  }
  // The same file, opened anew for reading only: the member cannot map it
  // writable, nor resize it.
  const int read_only =
      open(absl::StrCat("/proc/self/fd/", (*buffer)->fd()).c_str(), O_RDONLY | O_CLOEXEC);
  if (read_only < 0) {
    Reply(fd, ErrorReply(absl::InternalError(
                  absl::StrCat("reopening the buffer for reading: ", strerror(errno)))));
    return;
  }
  Reply(fd, absl::StrCat(side::kOk, " ", (*buffer)->size()), read_only);
  close(read_only);
}

void SideChannel::HandleRequest(int fd, Conn& conn, const std::string& request) {
  std::vector<std::string> words = absl::StrSplit(request, ' ', absl::SkipEmpty());
  if (words.size() == 3 && words[0] == side::kAttach) {
    if (!conn.session_id.empty()) {
      Reply(fd, ErrorReply(absl::FailedPreconditionError("this connection is already attached")));
      return;
    }
    absl::Status st = engine_->AttachSession(words[1], words[2], conn.pid, conn.uid);
    if (st.ok()) conn.session_id = words[1];
    Reply(fd, st.ok() ? std::string(side::kOk) : ErrorReply(st));
    return;
  }
  if (words.size() == 2 && words[0] == side::kFd) {
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
    Reply(fd, absl::StrCat(side::kOk, " ", (*buffer)->size()), (*buffer)->fd());
    return;
  }
  if (words.size() == 4 && words[0] == side::kPeerFd) {
    HandlePeerFd(fd, conn, words);
    return;
  }
  if (words.size() == 1 && words[0] == side::kQueue) {
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
    Reply(fd, absl::StrCat(side::kOk, " ", fastq::kQueueBytes, " ", fastq::kVersion), *queue_fd);
    return;
  }
  if ((words.size() == 2 && words[0] == side::kSegment) ||
      (words.size() == 4 && words[0] == side::kExpired)) {
    if (conn.session_id.empty()) {
      Reply(fd, ErrorReply(absl::FailedPreconditionError(
                    "attach the session before asking for a mesh's segment")));
      return;
    }
    if (words[0] == side::kSegment) {
      auto segment = engine_->GetMemberSegment(conn.session_id, std::string(words[1]));
      if (!segment.ok()) {
        Reply(fd, ErrorReply(segment.status()));
        return;
      }
      Reply(fd, absl::StrCat(side::kOk, " ", (*segment)->size()), (*segment)->fd());
      return;
    }
    uint32_t d = 0, s = 0;
    if (!absl::SimpleAtoi(words[2], &d) || !absl::SimpleAtoi(words[3], &s)) {
      Reply(fd, ErrorReply(absl::InvalidArgumentError("EXPIRED needs <mesh id> <d> <s>")));
      return;
    }
    auto broke = engine_->MemberOpExpired(conn.session_id, std::string(words[1]), d, s);
    Reply(fd, broke.ok() ? absl::StrCat(side::kOk, " ", *broke ? 1 : 0) : ErrorReply(broke.status()));
    return;
  }
  Reply(fd, ErrorReply(absl::InvalidArgumentError(absl::StrCat(
                "malformed side-socket request (", request.size(), " bytes)"))));
}

}  // namespace collectived
