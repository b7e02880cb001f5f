// HostTransport::Connect: the connections of one mesh generation, each
// authenticated before it carries anything. Listening, accepting and the
// server side of the handshakes run on an acceptor thread (Acceptor), while
// the connecting thread dials the lower ranks (ConnectLowerRanks). See
// host_transport.h for the protocol.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/cluster/host_transport.h"
#include "daemon/cluster/host_transport_internal.h"
#include "daemon/cluster/peer_stream.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {
namespace {

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown peer";
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return absl::StrCat(host, ":", port);
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return absl::StrCat("[", host, "]:", port);
  }
  return "unknown peer";
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// "host:port" for an address or name and a port ("[v6]:port" for IPv6).
std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && (host.empty() || host[0] != '[')) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

// Splits "host:port" / "[v6]:port".
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  if (!address.empty() && address[0] == '[') {
    const size_t end = address.find(']');
    if (end == std::string::npos || end + 1 >= address.size() || address[end + 1] != ':') {
      return false;
    }
    *host = address.substr(1, end - 1);
    *port = address.substr(end + 2);
    return !port->empty();
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  return true;
}

using Cancelled = std::function<bool()>;

bool IsCancelled(const Cancelled& cancelled) { return cancelled && cancelled(); }

// The next wake-up of a wait until `deadline`: sooner, every `slice`, when
// the wait can be cancelled.
absl::Time NextWake(absl::Time deadline, const Cancelled& cancelled,
                    absl::Duration slice = kCancelSlice) {
  return cancelled ? std::min(deadline, absl::Now() + slice) : deadline;
}

// The address book's waits are calls to the cluster's store: sliced more
// coarsely than the socket waits.
constexpr absl::Duration kLookupSlice = absl::Milliseconds(250);

int PollMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
}

// Waits until `fd` is ready for `events` or `deadline`: false on timeout.
bool PollFd(int fd, short events, absl::Time deadline, const Cancelled& cancelled) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, PollMs(NextWake(deadline, cancelled)));
    if (r > 0) return true;
    if (r < 0 && errno == EINTR) continue;
    if (absl::Now() >= deadline || IsCancelled(cancelled)) return false;
  }
}

// Drives `stream` until its TLS handshake completes (or `deadline`).
absl::Status TlsHandshake(PeerStream& stream, absl::Time deadline, const Cancelled& cancelled) {
  for (;;) {
    std::string error;
    switch (stream.Handshake(&error)) {
      case PeerStream::Io::kOk: return absl::OkStatus();
      case PeerStream::Io::kWantRead:
        if (!PollFd(stream.fd(), POLLIN, deadline, cancelled)) {
          return absl::DeadlineExceededError("the TLS handshake did not complete in time");
        }
        break;
      case PeerStream::Io::kWantWrite:
        if (!PollFd(stream.fd(), POLLOUT, deadline, cancelled)) {
          return absl::DeadlineExceededError("the TLS handshake did not complete in time");
        }
        break;
      default: return absl::PermissionDeniedError(absl::StrCat("TLS: ", error));
    }
  }
}

// A connection that fails during the handshake: over TLS, the peer's alert
// (it refused this host's certificate) or its close; otherwise the network.
absl::Status HandshakeFailure(const PeerStream& stream, const std::string& error) {
  if (stream.ssl() != nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the peer ended the TLS session during the handshake (", error,
        "): it refused this host's certificate (not of the cluster's CA, or not naming this "
        "host) or its proof"));
  }
  return absl::UnavailableError(absl::StrCat("the connection failed: ", error));
}

// Writes all of `bytes` (or fails at `deadline`).
absl::Status WriteAll(PeerStream& stream, absl::string_view bytes, absl::Time deadline,
                      const Cancelled& cancelled) {
  size_t at = 0;
  while (at < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data() + at), bytes.size() - at};
    PeerStream::Io io;
    std::string error;
    const size_t n = stream.Write(&iov, 1, &io, &error);
    at += n;
    if (n > 0) continue;
    if (io == PeerStream::Io::kWantWrite || io == PeerStream::Io::kWantRead) {
      if (!PollFd(stream.fd(), io == PeerStream::Io::kWantWrite ? POLLOUT : POLLIN, deadline,
                  cancelled)) {
        return absl::DeadlineExceededError("the peer did not take the handshake in time");
      }
      continue;
    }
    return HandshakeFailure(stream, error);
  }
  return absl::OkStatus();
}

// Reads exactly `n` bytes (or fails at `deadline`).
absl::StatusOr<std::string> ReadExactly(PeerStream& stream, size_t n, absl::Time deadline,
                                        const Cancelled& cancelled) {
  std::string out(n, '\0');
  size_t at = 0;
  while (at < n) {
    PeerStream::Io io;
    std::string error;
    const size_t got = stream.Read(out.data() + at, n - at, &io, &error);
    at += got;
    if (got > 0) continue;
    if (io == PeerStream::Io::kWantRead || io == PeerStream::Io::kWantWrite) {
      if (!stream.Buffered() &&
          !PollFd(stream.fd(), io == PeerStream::Io::kWantRead ? POLLIN : POLLOUT, deadline,
                  cancelled)) {
        return absl::DeadlineExceededError("the peer did not answer the handshake in time");
      }
      continue;
    }
    if (io == PeerStream::Io::kClosed) {
      return absl::PermissionDeniedError(
          "the peer closed the connection during the handshake: it refused this host's proof "
          "(another cluster token, or not this mesh generation)");
    }
    return HandshakeFailure(stream, error);
  }
  return out;
}

// A listening socket on `host` (kernel-picked port).
absl::StatusOr<std::pair<int, int>> Listen(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int gai = getaddrinfo(host.c_str(), "0", &hints, &res);
  if (gai != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve this host's address '", host, "': ", gai_strerror(gai)));
  }
  std::string error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      error = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    const int port = ss.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    freeaddrinfo(res);
    return std::pair<int, int>(fd, port);
  }
  freeaddrinfo(res);
  return absl::UnavailableError(
      absl::StrCat("cannot listen on this host's address '", host, "': ", error));
}

// A connected, non-blocking socket to `address` (retried while refused,
// until `deadline`).
absl::StatusOr<int> Dial(const std::string& address, absl::Time deadline,
                         const Cancelled& cancelled) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  std::string error;
  do {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      error = absl::StrCat("cannot resolve '", host, "': ", gai_strerror(gai));
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
          error = std::strerror(errno);
          continue;
        }
        int r = connect(fd, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
          if (!PollFd(fd, POLLOUT, deadline, cancelled)) {
            close(fd);
            freeaddrinfo(res);
            return absl::DeadlineExceededError(
                absl::StrCat("connecting to ", address, " did not complete in time"));
          }
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          r = err == 0 ? 0 : -1;
          errno = err;
        }
        if (r == 0) {
          freeaddrinfo(res);
          SetNoDelay(fd);
          return fd;
        }
        error = std::strerror(errno);
        close(fd);
      }
      freeaddrinfo(res);
    }
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  } while (absl::Now() < deadline && !IsCancelled(cancelled));
  return absl::DeadlineExceededError(
      absl::StrCat("cannot connect to ", address, " (", error, ")"));
}

// A connection of a mesh generation being accepted: its handshake in
// progress, run side by side with the others' on non-blocking sockets.
struct Pending {
  std::unique_ptr<PeerStream> stream;
  std::string peer;
  std::unique_ptr<peer_auth::ServerHandshake> handshake;
  bool tls_done = false;
  std::string out;  // handshake bytes still to send
  short want = POLLIN;
  absl::Time expiry;
};

// How a non-blocking read, write or TLS step that moved nothing ends:
// waiting for the socket (and which way), or failed.
bool Waiting(PeerStream::Io io, short* want) {
  if (io == PeerStream::Io::kWantRead) {
    *want = POLLIN;
    return true;
  }
  if (io == PeerStream::Io::kWantWrite) {
    *want = POLLOUT;
    return true;
  }
  return false;
}

}  // namespace

// The accepting side of Connect, on a thread of its own: accepts the
// higher ranks' connections until each (rank, lane) has one, runs their
// handshakes side by side, and refuses and logs every other connection.
// It writes only the conns_ slots of higher ranks; the connecting thread
// writes the lower ranks'.
class HostTransport::Acceptor {
 public:
  Acceptor(HostTransport& t, int listener, int inbound, absl::Time deadline,
           const Cancelled& cancelled)
      : t_(t), listener_(listener), missing_(inbound), deadline_(deadline), cancelled_(cancelled),
        cancel_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Acceptor() { close(cancel_); }

  // Stops accepting early (the connecting side failed) or waits for the
  // last connection; then what is missing, named.
  absl::Status Finish(bool cancel) {
    if (cancel) {
      const uint64_t one = 1;
      (void)!write(cancel_, &one, sizeof(one));
    }
    thread_.join();
    return accepted_;
  }

 private:
  void Run();
  void AcceptNew();
  // Advances `p`'s handshake as far as its socket allows.
  void Advance(Pending& p);
  // One step of `p`'s handshake: true when it made progress.
  bool Step(Pending& p);
  void Claim(Pending& p);
  absl::Status Admit(const peer_auth::Hello& h) const;
  void Refuse(Pending& p, absl::string_view why) const;
  void RefuseLate();
  absl::Status Missing() const;

  HostTransport& t_;
  const int listener_;
  int missing_;
  const absl::Time deadline_;
  const Cancelled& cancelled_;  // Connect's, which outlives the acceptor
  const int cancel_;
  std::vector<std::unique_ptr<Pending>> pending_;
  absl::Status accepted_;
  std::thread thread_;
};

void HostTransport::Acceptor::Run() {
  while (missing_ > 0) {
    if (absl::Now() >= deadline_ || IsCancelled(cancelled_)) break;
    std::vector<pollfd> fds;
    fds.push_back({listener_, POLLIN, 0});
    fds.push_back({cancel_, POLLIN, 0});
    for (auto& p : pending_) fds.push_back({p->stream->fd(), p->want, 0});
    absl::Time wake = deadline_;
    for (auto& p : pending_) wake = std::min(wake, p->expiry);
    const int r = poll(fds.data(), fds.size(), PollMs(NextWake(wake, cancelled_)));
    if (r < 0 && errno != EINTR) break;
    if (fds[1].revents != 0) break;  // cancelled
    if (fds[0].revents & POLLIN) AcceptNew();
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& p = *pending_[i];
      // Connections accepted after the poll have no entry in fds: try them
      // at once (their first bytes may be waiting already).
      const short revents = i + 2 < fds.size() ? fds[i + 2].revents : p.want;
      if (absl::Now() >= p.expiry) {
        Refuse(p, "did not complete the handshake in time");
        continue;
      }
      if (revents != 0) Advance(p);
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const std::unique_ptr<Pending>& p) {
                                    return p->stream == nullptr;
                                  }),
                   pending_.end());
  }
  for (auto& p : pending_) Refuse(*p, "the mesh's hosts stopped accepting connections");
  RefuseLate();
  if (missing_ > 0) accepted_ = Missing();
}

void HostTransport::Acceptor::AcceptNew() {
  const std::string& desc = t_.security_.description;
  for (;;) {
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    SetNoDelay(fd);
    auto p = std::make_unique<Pending>();
    p->peer = PeerAddress(fd);
    p->expiry = std::min(deadline_, absl::Now() + t_.options_.handshake_timeout);
    if (static_cast<int>(pending_.size()) >= t_.options_.max_pending_handshakes) {
      p->stream = PeerStream::Plain(fd);
      Refuse(*p, "too many connections handshaking at once");
      continue;
    }
    if (t_.security_.tls != nullptr) {
      auto s = PeerStream::Tls(fd, *t_.security_.tls, /*server=*/true);
      if (!s.ok()) {
        LogEvent(LogLevel::kWarn, "cluster_connection_refused",
                 {{"mesh", desc}, {"peer", p->peer}, {"reason", s.status().ToString()}});
        continue;
      }
      p->stream = *std::move(s);
    } else {
      p->stream = PeerStream::Plain(fd);
      p->tls_done = true;
    }
    peer_auth::ServerExpectation e;
    e.key = t_.security_.key;
    e.tag = t_.security_.tag;
    e.self = t_.self_;
    e.hosts = t_.size();
    e.lanes = t_.options_.lanes;
    Pending* raw = p.get();
    e.admit = [this, raw](const peer_auth::Hello& h) -> absl::Status {
      if (absl::Status st = Admit(h); !st.ok()) return st;
      if (raw->stream->ssl() != nullptr) {
        return PeerNamesHost(raw->stream->ssl(), t_.hosts_[h.from_rank]);
      }
      return absl::OkStatus();
    };
    p->handshake = std::make_unique<peer_auth::ServerHandshake>(std::move(e));
    pending_.push_back(std::move(p));
  }
}

void HostTransport::Acceptor::Advance(Pending& p) {
  while (p.stream != nullptr && Step(p)) {
  }
}

bool HostTransport::Acceptor::Step(Pending& p) {
  std::string error;
  if (!p.tls_done) {
    const PeerStream::Io io = p.stream->Handshake(&error);
    if (io == PeerStream::Io::kOk) {
      p.tls_done = true;
      p.want = POLLIN;
      return true;
    }
    if (!Waiting(io, &p.want)) Refuse(p, error);
    return false;
  }
  if (!p.out.empty()) {
    iovec iov{p.out.data(), p.out.size()};
    PeerStream::Io io;
    const size_t n = p.stream->Write(&iov, 1, &io, &error);
    p.out.erase(0, n);
    if (n > 0) return true;
    if (!Waiting(io, &p.want)) Refuse(p, absl::StrCat("the connection failed: ", error));
    return false;
  }
  if (p.handshake->done()) {
    Claim(p);
    return false;
  }
  char buf[peer_auth::kHelloBytes];
  const size_t want = std::min(sizeof(buf), p.handshake->wanted());
  PeerStream::Io io;
  const size_t n = p.stream->Read(buf, want, &io, &error);
  if (n == 0) {
    if (!Waiting(io, &p.want)) {
      Refuse(p, io == PeerStream::Io::kClosed ? "closed the connection during the handshake"
                                               : absl::StrCat("the connection failed: ", error));
    }
    return false;
  }
  auto reply = p.handshake->Feed(absl::string_view(buf, n));
  if (!reply.ok()) {
    Refuse(p, reply.status().message());
    return false;
  }
  p.out += *reply;
  return true;
}

// Authenticated, and the verdict is out: the connection becomes its pair's.
void HostTransport::Acceptor::Claim(Pending& p) {
  const peer_auth::Hello& h = p.handshake->hello();
  const size_t at = h.from_rank * t_.options_.lanes + h.lane;
  if (t_.conns_[at] != nullptr) {
    Refuse(p, "a second connection for a connected pair");
    return;
  }
  auto c = std::make_unique<Connection>();
  c->rank = static_cast<int>(h.from_rank);
  c->lane = static_cast<int>(h.lane);
  c->peer = p.peer;
  c->stream = std::move(p.stream);
  t_.conns_[at] = std::move(c);
  --missing_;
}

// A handshake that completes claims its (rank, lane) here.
absl::Status HostTransport::Acceptor::Admit(const peer_auth::Hello& h) const {
  if (static_cast<int>(h.from_rank) <= t_.self_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", h.from_rank, " connects to lower ranks only"));
  }
  if (t_.conns_[h.from_rank * t_.options_.lanes + h.lane] != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("host ", t_.hosts_[h.from_rank], " lane ",
                                                 h.lane, " is connected already"));
  }
  return absl::OkStatus();
}

void HostTransport::Acceptor::Refuse(Pending& p, absl::string_view why) const {
  LogEvent(LogLevel::kWarn, "cluster_connection_refused",
           {{"mesh", t_.security_.description}, {"peer", p.peer}, {"reason", std::string(why)}});
  p.stream.reset();
}

// Whoever is still waiting to be accepted is told no, and named.
void HostTransport::Acceptor::RefuseLate() {
  for (;;) {
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    Pending late;
    late.peer = PeerAddress(fd);
    late.stream = PeerStream::Plain(fd);
    Refuse(late, missing_ > 0 ? "the mesh's hosts stopped accepting connections"
                              : "every host of the mesh is connected already");
  }
}

absl::Status HostTransport::Acceptor::Missing() const {
  std::vector<std::string> late;
  for (int r = t_.self_ + 1; r < t_.size(); ++r) {
    for (int l = 0; l < t_.options_.lanes; ++l) {
      if (t_.conns_[r * t_.options_.lanes + l] == nullptr) {
        late.push_back(absl::StrCat(t_.hosts_[r], " (lane ", l, ")"));
      }
    }
  }
  return absl::DeadlineExceededError(absl::StrCat("host", late.size() > 1 ? "s " : " ",
                                                  absl::StrJoin(late, ", "),
                                                  " did not connect to this host in time"));
}

absl::StatusOr<std::unique_ptr<HostTransport::Connection>> HostTransport::ConnectLane(
    int rank, int lane, const std::string& address, absl::Time deadline,
    const Cancelled& cancelled) const {
  auto fd = Dial(address, deadline, cancelled);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<PeerStream> stream;
  if (security_.tls != nullptr) {
    auto s = PeerStream::Tls(*fd, *security_.tls, /*server=*/false);
    if (!s.ok()) return s.status();
    stream = *std::move(s);
    absl::Status st = TlsHandshake(*stream, deadline, cancelled);
    if (st.ok()) st = PeerNamesHost(stream->ssl(), hosts_[rank]);
    if (!st.ok()) return st;
  } else {
    stream = PeerStream::Plain(*fd);
  }
  peer_auth::Hello hello;
  hello.lane = static_cast<uint32_t>(lane);
  hello.from_rank = static_cast<uint32_t>(self_);
  hello.to_rank = static_cast<uint32_t>(rank);
  hello.tag = security_.tag;
  const std::string nonce = RandomBytes(peer_auth::kNonceBytes);
  std::memcpy(hello.nonce.data(), nonce.data(), nonce.size());
  peer_auth::ClientHandshake hs(security_.key, hello);
  if (absl::Status st = WriteAll(*stream, hs.hello_bytes(), deadline, cancelled); !st.ok()) {
    return st;
  }
  while (!hs.done()) {
    auto in = ReadExactly(*stream, hs.wanted(), deadline, cancelled);
    if (!in.ok()) return in.status();
    auto reply = hs.Feed(*in);
    if (!reply.ok()) return reply.status();
    if (reply->empty()) continue;
    if (absl::Status st = WriteAll(*stream, *reply, deadline, cancelled); !st.ok()) return st;
  }
  auto c = std::make_unique<Connection>();
  c->rank = rank;
  c->lane = lane;
  c->peer = address;
  c->stream = std::move(stream);
  return c;
}

absl::Status HostTransport::ConnectLowerRanks(AddressBook& book, const std::string& prefix,
                                              absl::Time deadline, const Cancelled& cancelled) {
  if (self_ == 0) return absl::OkStatus();
  std::vector<std::string> keys;
  for (int r = 0; r < self_; ++r) keys.push_back(absl::StrCat(prefix, "/addr/", r));
  // In slices when cancellable: the book waits for the keys, and rides out
  // its store being unreachable, within each slice; a slice that ends
  // either way is followed by the next until the deadline.
  absl::StatusOr<std::vector<std::string>> addresses;
  do {
    addresses = book.Lookup(keys, NextWake(deadline, cancelled, kLookupSlice));
  } while ((absl::IsDeadlineExceeded(addresses.status()) ||
            absl::IsUnavailable(addresses.status())) &&
           absl::Now() < deadline && !IsCancelled(cancelled));
  if (!addresses.ok()) {
    return absl::Status(addresses.status().code(), absl::StrCat("finding the hosts' addresses: ",
                                                                addresses.status().message()));
  }
  for (int r = 0; r < self_; ++r) {
    const std::string& address = (*addresses)[r];
    for (int l = 0; l < options_.lanes; ++l) {
      auto c = ConnectLane(r, l, address, deadline, cancelled);
      if (!c.ok()) {
        return absl::Status(c.status().code(),
                            absl::StrCat("connecting to host ", hosts_[r], " at ", address, ": ",
                                         c.status().message()));
      }
      conns_[r * options_.lanes + l] = *std::move(c);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostTransport>> HostTransport::Connect(
    AddressBook& book, const std::string& prefix, const std::vector<std::string>& hosts, int self,
    const std::string& bind_host, TransportSecurity security, absl::Time deadline,
    TransportOptions options) {
  const int size = static_cast<int>(hosts.size());
  if (size < 1 || self < 0 || self >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", self, " of ", size, " hosts"));
  }
  if (options.lanes < 1 || options.lanes > 16) {
    return absl::InvalidArgumentError(absl::StrCat(options.lanes, " lanes (1 to 16)"));
  }
  if (options.frame_bytes < 4096) options.frame_bytes = 4096;
  const int lanes = options.lanes;
  const Cancelled cancelled = std::move(options.cancelled);
  options.cancelled = nullptr;
  auto t = std::unique_ptr<HostTransport>(
      new HostTransport(hosts, self, std::move(security), std::move(options)));
  t->conns_.resize(static_cast<size_t>(size * lanes));

  // Listen and publish, for the higher ranks to connect; accept on a thread
  // of its own while this one connects out.
  const int inbound = (size - 1 - self) * lanes;
  int listener = -1;
  std::unique_ptr<Acceptor> acceptor;
  if (inbound > 0) {
    auto l = Listen(bind_host);
    if (!l.ok()) return l.status();
    listener = l->first;
    if (absl::Status st =
            book.Publish(absl::StrCat(prefix, "/addr/", self), JoinHostPort(bind_host, l->second));
        !st.ok()) {
      close(listener);
      return absl::UnavailableError(
          absl::StrCat("publishing this host's address: ", st.message()));
    }
    acceptor = std::make_unique<Acceptor>(*t, listener, inbound, deadline, cancelled);
  }
  const absl::Status connected = t->ConnectLowerRanks(book, prefix, deadline, cancelled);
  absl::Status accepted;
  if (acceptor != nullptr) accepted = acceptor->Finish(/*cancel=*/!connected.ok());
  acceptor.reset();
  if (listener >= 0) close(listener);
  // Whatever failed after a cancel failed because of it.
  if (IsCancelled(cancelled)) {
    const std::string& what = t->security_.description;
    return absl::CancelledError(
        absl::StrCat("connecting the hosts of ", what.empty() ? "the mesh" : what,
                     " was cancelled"));
  }
  if (!connected.ok()) return connected;
  if (!accepted.ok()) return accepted;
  t->Start();
  return t;
}

}  // namespace collectived
