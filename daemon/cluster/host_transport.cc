#include "daemon/cluster/host_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/cluster/peer_stream.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {
namespace {

// Frames: a 32-byte header, little-endian, then `length` payload bytes.
enum FrameType : uint32_t {
  kReady = 1,   // slot: a receive was posted; total: its capacity
  kData = 2,    // slot; total: the transfer's bytes; offset: where this payload goes
  kBreak = 3,   // slot: the status code; payload: the reason
  kQuery = 4,   // slot: the op sequence asked about
  kAnswer = 5,  // slot: the op sequence; payload: the answer
};
constexpr size_t kFrameHeaderBytes = 32;

struct Frame {
  uint32_t type = 0;
  uint32_t length = 0;
  uint64_t slot = 0;
  uint64_t total = 0;
  uint64_t offset = 0;
};

void Put(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t Get(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

void EncodeFrame(const Frame& f, char* out) {
  Put(out, f.type, 4);
  Put(out + 4, f.length, 4);
  Put(out + 8, f.slot, 8);
  Put(out + 16, f.total, 8);
  Put(out + 24, f.offset, 8);
}

Frame DecodeFrame(const char* in) {
  Frame f;
  f.type = static_cast<uint32_t>(Get(in, 4));
  f.length = static_cast<uint32_t>(Get(in + 4, 4));
  f.slot = Get(in + 8, 8);
  f.total = Get(in + 16, 8);
  f.offset = Get(in + 24, 8);
  return f;
}

std::string ControlFrame(uint32_t type, uint64_t slot, uint64_t total,
                         absl::string_view payload = {}) {
  std::string out(kFrameHeaderBytes, '\0');
  Frame f;
  f.type = type;
  f.length = static_cast<uint32_t>(payload.size());
  f.slot = slot;
  f.total = total;
  EncodeFrame(f, out.data());
  out.append(payload.data(), payload.size());
  return out;
}

// Text a peer sent, made safe to print: printable ASCII, at most `max`.
std::string Clean(absl::string_view s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) out.push_back(absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?');
  return out;
}

// How much a DATA frame's sink takes per read.
constexpr size_t kSinkBytes = 64 * 1024;
// Most bytes a plain connection reads before the I/O thread looks at its
// other connections.
constexpr size_t kReadBudget = size_t{4} << 20;
// Answers kept (the oldest go first).
constexpr size_t kMaxAnswersKept = 256;

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

int PollMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
}

// Waits until `fd` is ready for `events` or `deadline`: false on timeout.
bool PollFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, PollMs(deadline));
    if (r > 0) return true;
    if (r < 0 && errno == EINTR) continue;
    if (absl::Now() >= deadline) return false;
  }
}

// Drives `stream` until its TLS handshake completes (or `deadline`).
absl::Status TlsHandshake(PeerStream& stream, absl::Time deadline) {
  for (;;) {
    std::string error;
    switch (stream.Handshake(&error)) {
      case PeerStream::Io::kOk: return absl::OkStatus();
      case PeerStream::Io::kWantRead:
        if (!PollFd(stream.fd(), POLLIN, deadline)) {
          return absl::DeadlineExceededError("the TLS handshake did not complete in time");
        }
        break;
      case PeerStream::Io::kWantWrite:
        if (!PollFd(stream.fd(), POLLOUT, deadline)) {
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
absl::Status WriteAll(PeerStream& stream, absl::string_view bytes, absl::Time deadline) {
  size_t at = 0;
  while (at < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data() + at), bytes.size() - at};
    PeerStream::Io io;
    std::string error;
    const size_t n = stream.Write(&iov, 1, &io, &error);
    at += n;
    if (n > 0) continue;
    if (io == PeerStream::Io::kWantWrite || io == PeerStream::Io::kWantRead) {
      if (!PollFd(stream.fd(), io == PeerStream::Io::kWantWrite ? POLLOUT : POLLIN, deadline)) {
        return absl::DeadlineExceededError("the peer did not take the handshake in time");
      }
      continue;
    }
    return HandshakeFailure(stream, error);
  }
  return absl::OkStatus();
}

// Reads exactly `n` bytes (or fails at `deadline`).
absl::StatusOr<std::string> ReadExactly(PeerStream& stream, size_t n, absl::Time deadline) {
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
          !PollFd(stream.fd(), io == PeerStream::Io::kWantRead ? POLLIN : POLLOUT, deadline)) {
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
absl::StatusOr<int> Dial(const std::string& address, absl::Time deadline) {
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
          if (!PollFd(fd, POLLOUT, deadline)) {
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
  } while (absl::Now() < deadline);
  return absl::DeadlineExceededError(
      absl::StrCat("cannot connect to ", address, " (", error, ")"));
}

}  // namespace

struct HostTransport::Connection {
  int rank = 0;
  int lane = 0;
  std::unique_ptr<PeerStream> stream;
  std::string peer;  // its address, for logs

  // Read side: the lane's I/O thread reads; posting threads add receives.
  std::mutex rx_mu;
  std::map<uint64_t, std::deque<HostTransfer*>> recvs;  // posted, READY sent; null: withdrawn
  char rx_hdr[kFrameHeaderBytes];
  size_t rx_hdr_got = 0;
  bool rx_in_frame = false;
  Frame rx_frame;
  uint64_t rx_payload_got = 0;
  std::string rx_small;  // a control frame's payload
  // The data transfer being received (its frames come in order).
  bool rx_active = false;
  HostTransfer* rx_target = nullptr;  // null while active: discarded
  uint64_t rx_total = 0;
  uint64_t rx_next = 0;
  std::unique_ptr<char[]> sink;
  std::atomic<bool> rx_done{false};  // the read side ended (end of stream, or error)

  // What the lane's epoll watches of this connection (UpdateEvents).
  std::mutex ev_mu;  // leaf
  bool ev_out = false;
  bool ev_registered = true;

  // Write side: any thread, under tx_mu.
  std::mutex tx_mu;
  std::deque<std::string> control;
  size_t control_sent = 0;
  std::map<uint64_t, std::deque<HostTransfer*>> sends;    // posted, no READY yet
  std::map<uint64_t, std::deque<uint64_t>> readies;   // READYs (capacities) without a send yet
  std::deque<HostTransfer*> outgoing;                     // matched, in order
  // The data frame being written.
  bool tx_in_frame = false;
  char tx_hdr[kFrameHeaderBytes];
  size_t tx_hdr_sent = 0;
  const uint8_t* tx_src = nullptr;
  uint64_t tx_len = 0;
  uint64_t tx_sent = 0;
  HostTransfer* tx_owner = nullptr;  // null after Break: tx_copy holds the rest
  std::string tx_copy;
  bool closing = false;    // after Break: the BREAK, then shut down
  bool out_of_step = false;  // a send was withdrawn: no more sends
  bool shut = false;       // the write side is shut down
  bool tx_dead = false;    // a write failed
};

struct HostTransport::Lane {
  int index = 0;
  int epoll = -1;
  int wake = -1;
  std::thread thread;
  std::vector<Connection*> conns;
};

HostTransport::HostTransport(std::vector<std::string> hosts, int self,
                             TransportSecurity security, TransportOptions options)
    : hosts_(std::move(hosts)), self_(self), security_(std::move(security)),
      options_(std::move(options)), dead_(hosts_.size() * static_cast<size_t>(options_.lanes)) {}

HostTransport::Connection& HostTransport::conn(int rank, int lane) {
  return *conns_[static_cast<size_t>(rank * options_.lanes + lane)];
}

// --- Connecting --------------------------------------------------------

namespace {

// Connections of a mesh generation being accepted: the handshakes in
// progress, run side by side on non-blocking sockets.
struct Pending {
  std::unique_ptr<PeerStream> stream;
  std::string peer;
  std::unique_ptr<peer_auth::ServerHandshake> handshake;
  bool tls_done = false;
  std::string out;  // handshake bytes still to send
  short want = POLLIN;
  absl::Time expiry;
};

}  // namespace

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
  auto t = std::unique_ptr<HostTransport>(
      new HostTransport(hosts, self, std::move(security), std::move(options)));
  t->conns_.resize(static_cast<size_t>(size * lanes));
  const std::string& desc = t->security_.description;

  // Listen and publish, for the higher ranks to connect.
  const int inbound = (size - 1 - self) * lanes;
  int listener = -1;
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
  }

  // The accepting side, on a thread of its own while this one connects out.
  const int cancel = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  absl::Status accepted;
  std::thread acceptor;
  if (inbound > 0) {
    acceptor = std::thread([&, listener] {
      std::vector<std::unique_ptr<Pending>> pending;
      int missing = inbound;
      auto refuse = [&](Pending& p, absl::string_view why) {
        LogEvent(LogLevel::kWarn, "cluster_connection_refused",
                 {{"mesh", desc}, {"peer", p.peer}, {"reason", std::string(why)}});
        p.stream.reset();
      };
      // A handshake that completes claims its (rank, lane) here.
      auto admit = [&](const peer_auth::Hello& h) -> absl::Status {
        if (static_cast<int>(h.from_rank) <= self) {
          return absl::FailedPreconditionError(
              absl::StrCat("rank ", h.from_rank, " connects to lower ranks only"));
        }
        if (t->conns_[h.from_rank * lanes + h.lane] != nullptr) {
          return absl::AlreadyExistsError(absl::StrCat(
              "host ", hosts[h.from_rank], " lane ", h.lane, " is connected already"));
        }
        return absl::OkStatus();
      };
      while (missing > 0) {
        const absl::Time now = absl::Now();
        if (now >= deadline) break;
        std::vector<pollfd> fds;
        fds.push_back({listener, POLLIN, 0});
        fds.push_back({cancel, POLLIN, 0});
        for (auto& p : pending) fds.push_back({p->stream->fd(), p->want, 0});
        absl::Time wake = deadline;
        for (auto& p : pending) wake = std::min(wake, p->expiry);
        const int r = poll(fds.data(), fds.size(), PollMs(wake));
        if (r < 0 && errno != EINTR) break;
        if (fds[1].revents != 0) break;  // cancelled
        if (fds[0].revents & POLLIN) {
          for (;;) {
            const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) break;
            SetNoDelay(fd);
            auto p = std::make_unique<Pending>();
            p->peer = PeerAddress(fd);
            p->expiry = std::min(deadline, absl::Now() + t->options_.handshake_timeout);
            if (static_cast<int>(pending.size()) >= t->options_.max_pending_handshakes) {
              p->stream = PeerStream::Plain(fd);
              refuse(*p, "too many connections handshaking at once");
              continue;
            }
            if (t->security_.tls != nullptr) {
              auto s = PeerStream::Tls(fd, *t->security_.tls, /*server=*/true);
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
            e.key = t->security_.key;
            e.tag = t->security_.tag;
            e.self = self;
            e.hosts = size;
            e.lanes = lanes;
            Pending* raw = p.get();
            e.admit = [&, raw](const peer_auth::Hello& h) -> absl::Status {
              if (absl::Status st = admit(h); !st.ok()) return st;
              if (raw->stream->ssl() != nullptr) {
                return PeerNamesHost(raw->stream->ssl(), hosts[h.from_rank]);
              }
              return absl::OkStatus();
            };
            p->handshake = std::make_unique<peer_auth::ServerHandshake>(std::move(e));
            pending.push_back(std::move(p));
          }
        }
        for (size_t i = 0; i < pending.size(); ++i) {
          Pending& p = *pending[i];
          // Connections accepted after the poll have no entry in fds: try them
          // at once (their first bytes may be waiting already).
          const short revents = i + 2 < fds.size() ? fds[i + 2].revents : p.want;
          if (absl::Now() >= p.expiry) {
            refuse(p, "did not complete the handshake in time");
            continue;
          }
          if (revents == 0) continue;
          // Advance as far as the socket allows.
          for (bool progress = true; progress && p.stream != nullptr;) {
            progress = false;
            std::string error;
            if (!p.tls_done) {
              const PeerStream::Io io = p.stream->Handshake(&error);
              if (io == PeerStream::Io::kOk) {
                p.tls_done = true;
                progress = true;
                p.want = POLLIN;
              } else if (io == PeerStream::Io::kWantRead || io == PeerStream::Io::kWantWrite) {
                p.want = io == PeerStream::Io::kWantRead ? POLLIN : POLLOUT;
              } else {
                refuse(p, error);
              }
              continue;
            }
            if (!p.out.empty()) {
              iovec iov{p.out.data(), p.out.size()};
              PeerStream::Io io;
              const size_t n = p.stream->Write(&iov, 1, &io, &error);
              p.out.erase(0, n);
              if (n > 0) {
                progress = true;
              } else if (io == PeerStream::Io::kWantWrite || io == PeerStream::Io::kWantRead) {
                p.want = io == PeerStream::Io::kWantWrite ? POLLOUT : POLLIN;
              } else {
                refuse(p, absl::StrCat("the connection failed: ", error));
              }
              continue;
            }
            if (p.handshake->done()) {
              // Authenticated, and the verdict is out: the pair's.
              const peer_auth::Hello& h = p.handshake->hello();
              const size_t at = h.from_rank * lanes + h.lane;
              if (t->conns_[at] != nullptr) {
                refuse(p, "a second connection for a connected pair");
                continue;
              }
              auto c = std::make_unique<Connection>();
              c->rank = static_cast<int>(h.from_rank);
              c->lane = static_cast<int>(h.lane);
              c->peer = p.peer;
              c->stream = std::move(p.stream);
              t->conns_[at] = std::move(c);
              --missing;
              continue;
            }
            char buf[peer_auth::kHelloBytes];
            const size_t want = std::min(sizeof(buf), p.handshake->wanted());
            PeerStream::Io io;
            const size_t n = p.stream->Read(buf, want, &io, &error);
            if (n == 0) {
              if (io == PeerStream::Io::kWantRead || io == PeerStream::Io::kWantWrite) {
                p.want = io == PeerStream::Io::kWantRead ? POLLIN : POLLOUT;
              } else {
                refuse(p, io == PeerStream::Io::kClosed
                              ? "closed the connection during the handshake"
                              : absl::StrCat("the connection failed: ", error));
              }
              continue;
            }
            auto reply = p.handshake->Feed(absl::string_view(buf, n));
            if (!reply.ok()) {
              refuse(p, reply.status().message());
              continue;
            }
            p.out += *reply;
            progress = true;
          }
        }
        pending.erase(std::remove_if(pending.begin(), pending.end(),
                                     [](const std::unique_ptr<Pending>& p) {
                                       return p->stream == nullptr;
                                     }),
                      pending.end());
      }
      for (auto& p : pending) refuse(*p, "the mesh's hosts stopped accepting connections");
      // Whoever is still waiting to be accepted is told no, and named.
      for (;;) {
        const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        Pending late;
        late.peer = PeerAddress(fd);
        late.stream = PeerStream::Plain(fd);
        refuse(late, missing > 0 ? "the mesh's hosts stopped accepting connections"
                                 : "every host of the mesh is connected already");
      }
      if (missing > 0) {
        std::vector<std::string> late;
        for (int r = self + 1; r < size; ++r) {
          for (int l = 0; l < lanes; ++l) {
            if (t->conns_[r * lanes + l] == nullptr) {
              late.push_back(absl::StrCat(hosts[r], " (lane ", l, ")"));
            }
          }
        }
        accepted = absl::DeadlineExceededError(absl::StrCat(
            "host", late.size() > 1 ? "s " : " ", absl::StrJoin(late, ", "),
            " did not connect to this host in time"));
      }
    });
  }

  // The connecting side: to every lower rank, each lane.
  absl::Status connected;
  if (self > 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < self; ++r) keys.push_back(absl::StrCat(prefix, "/addr/", r));
    auto addresses = book.Lookup(keys, deadline);
    if (!addresses.ok()) {
      connected = absl::Status(addresses.status().code(),
                               absl::StrCat("finding the hosts' addresses: ",
                                            addresses.status().message()));
    }
    for (int r = 0; r < self && connected.ok(); ++r) {
      for (int l = 0; l < lanes && connected.ok(); ++l) {
        const std::string& address = (*addresses)[r];
        auto named = [&](const absl::Status& st) {
          return absl::Status(st.code(), absl::StrCat("connecting to host ", hosts[r], " at ",
                                                      address, ": ", st.message()));
        };
        auto fd = Dial(address, deadline);
        if (!fd.ok()) {
          connected = named(fd.status());
          break;
        }
        std::unique_ptr<PeerStream> stream;
        if (t->security_.tls != nullptr) {
          auto s = PeerStream::Tls(*fd, *t->security_.tls, /*server=*/false);
          if (!s.ok()) {
            connected = named(s.status());
            break;
          }
          stream = *std::move(s);
          absl::Status st = TlsHandshake(*stream, deadline);
          if (st.ok()) st = PeerNamesHost(stream->ssl(), hosts[r]);
          if (!st.ok()) {
            connected = named(st);
            break;
          }
        } else {
          stream = PeerStream::Plain(*fd);
        }
        peer_auth::Hello hello;
        hello.lane = static_cast<uint32_t>(l);
        hello.from_rank = static_cast<uint32_t>(self);
        hello.to_rank = static_cast<uint32_t>(r);
        hello.tag = t->security_.tag;
        const std::string nonce = RandomBytes(peer_auth::kNonceBytes);
        std::memcpy(hello.nonce.data(), nonce.data(), nonce.size());
        peer_auth::ClientHandshake hs(t->security_.key, hello);
        absl::Status st = WriteAll(*stream, hs.hello_bytes(), deadline);
        while (st.ok() && !hs.done()) {
          auto in = ReadExactly(*stream, hs.wanted(), deadline);
          if (!in.ok()) {
            st = in.status();
            break;
          }
          auto reply = hs.Feed(*in);
          if (!reply.ok()) {
            st = reply.status();
            break;
          }
          if (!reply->empty()) st = WriteAll(*stream, *reply, deadline);
        }
        if (!st.ok()) {
          connected = named(st);
          break;
        }
        auto c = std::make_unique<Connection>();
        c->rank = r;
        c->lane = l;
        c->peer = address;
        c->stream = std::move(stream);
        t->conns_[r * lanes + l] = std::move(c);
      }
    }
  }
  if (acceptor.joinable()) {
    if (!connected.ok()) {
      const uint64_t one = 1;
      (void)!write(cancel, &one, sizeof(one));
    }
    acceptor.join();
  }
  close(cancel);
  if (listener >= 0) close(listener);
  if (!connected.ok()) return connected;
  if (!accepted.ok()) return accepted;
  t->Start();
  return t;
}

// --- Running -----------------------------------------------------------

void HostTransport::Start() {
  for (int l = 0; l < options_.lanes; ++l) {
    auto lane = std::make_unique<Lane>();
    lane->index = l;
    lane->epoll = epoll_create1(EPOLL_CLOEXEC);
    lane->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(lane->epoll, EPOLL_CTL_ADD, lane->wake, &ev);
    for (int r = 0; r < size(); ++r) {
      if (r == self_) continue;
      Connection& c = conn(r, l);
      c.sink = std::make_unique<char[]>(kSinkBytes);
      epoll_event cev{};
      cev.events = EPOLLIN | EPOLLRDHUP;
      cev.data.ptr = &c;
      epoll_ctl(lane->epoll, EPOLL_CTL_ADD, c.stream->fd(), &cev);
      lane->conns.push_back(&c);
    }
    lanes_.push_back(std::move(lane));
  }
  for (auto& lane : lanes_) {
    Lane* raw = lane.get();
    raw->thread = std::thread([this, raw] { Loop(*raw); });
  }
}

HostTransport::~HostTransport() {
  Break(absl::AbortedError(absl::StrCat("the mesh was closed on host ", hosts_[self_])));
  stopping_.store(true);
  for (auto& lane : lanes_) Wake(*lane);
  // Every lane's thread ends before any lane's descriptors close: a lane
  // wakes the others (PeerFailed), and a closed number may be reused.
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
  for (auto& lane : lanes_) {
    close(lane->epoll);
    close(lane->wake);
  }
}

void HostTransport::Wake(Lane& lane) {
  const uint64_t one = 1;
  (void)!write(lane.wake, &one, sizeof(one));
}

void HostTransport::ArmWrite(Connection& c, bool on) {
  std::lock_guard<std::mutex> lock(c.ev_mu);
  if (on == c.ev_out && !c.rx_done.load()) return;
  c.ev_out = on;
  UpdateEvents(c);
}

void HostTransport::UpdateEvents(Connection& c) {
  if (static_cast<size_t>(c.lane) >= lanes_.size()) return;  // not started
  const int epoll = lanes_[c.lane]->epoll;
  const uint32_t events = (c.rx_done.load() ? 0u : (EPOLLIN | EPOLLRDHUP)) | (c.ev_out ? EPOLLOUT : 0u);
  if (events == 0) {
    if (c.ev_registered) epoll_ctl(epoll, EPOLL_CTL_DEL, c.stream->fd(), nullptr);
    c.ev_registered = false;
    return;
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = &c;
  epoll_ctl(epoll, c.ev_registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.stream->fd(), &ev);
  c.ev_registered = true;
}

void HostTransport::Loop(Lane& lane) {
  epoll_event events[64];
  for (;;) {
    int timeout = -1;
    if (stopping_.load()) {
      // Leave once every connection's BREAK went out, or the flush time is up.
      absl::Time broke_at;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        broke_at = broken_at_;
      }
      bool flushed = true;
      for (Connection* c : lane.conns) {
        std::lock_guard<std::mutex> lock(c->tx_mu);
        flushed = flushed && (c->shut || c->tx_dead);
      }
      if (flushed || absl::Now() >= broke_at + options_.break_flush) return;
      timeout = 10;
    }
    const int n = epoll_wait(lane.epoll, events, 64, timeout);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        uint64_t v;
        while (read(lane.wake, &v, sizeof(v)) > 0) {
        }
        continue;
      }
      Connection& c = *static_cast<Connection*>(events[i].data.ptr);
      absl::Status failure;
      if (events[i].events & EPOLLOUT) {
        std::lock_guard<std::mutex> lock(c.tx_mu);
        failure = Flush(c);
      }
      if (failure.ok() && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) {
        std::vector<int64_t> queries;
        {
          std::lock_guard<std::mutex> lock(c.rx_mu);
          failure = ReadSome(c, &queries);
        }
        if (c.rx_done.load()) {
          std::lock_guard<std::mutex> lock(c.ev_mu);
          UpdateEvents(c);
        }
        for (int64_t q : queries) {
          std::optional<std::string> answer;
          if (options_.on_query) answer = options_.on_query(q);
          if (!answer.has_value()) continue;
          if (answer->size() > kMaxQueryAnswerBytes) answer->resize(kMaxQueryAnswerBytes);
          std::lock_guard<std::mutex> lock(c.tx_mu);
          if (c.closing) break;
          c.control.push_back(ControlFrame(kAnswer, static_cast<uint64_t>(q), 0, *answer));
          if (absl::Status st = Flush(c); !st.ok() && failure.ok()) failure = st;
        }
      }
      if (!failure.ok()) PeerFailed(c, failure);
    }
  }
}

absl::Status HostTransport::Flush(Connection& c) {
  for (;;) {
    if (c.tx_dead || c.shut) return absl::OkStatus();
    // Up to kControlBatch control frames go out in one write.
    constexpr int kControlBatch = 16;
    iovec iov[kControlBatch];
    int iovcnt = 0;
    bool data = false;
    if (!c.tx_in_frame && !c.control.empty()) {
      for (const std::string& f : c.control) {
        const size_t skip = iovcnt == 0 ? c.control_sent : 0;
        iov[iovcnt++] = {const_cast<char*>(f.data() + skip), f.size() - skip};
        if (iovcnt == kControlBatch) break;
      }
    } else if (c.tx_in_frame) {
      data = true;
      if (c.tx_hdr_sent < kFrameHeaderBytes) {
        iov[iovcnt++] = {c.tx_hdr + c.tx_hdr_sent, kFrameHeaderBytes - c.tx_hdr_sent};
      }
      if (c.tx_sent < c.tx_len) {
        iov[iovcnt++] = {const_cast<uint8_t*>(c.tx_src + c.tx_sent), c.tx_len - c.tx_sent};
      }
    } else if (!c.outgoing.empty() && !c.closing) {
      // The next frame of the first matched send.
      HostTransfer& t = *c.outgoing.front();
      Frame f;
      f.type = kData;
      f.slot = t.slot_;
      f.total = t.size_;
      f.offset = t.moved_;
      const uint64_t len = std::min<uint64_t>(options_.frame_bytes, t.size_ - t.moved_);
      f.length = static_cast<uint32_t>(len);
      EncodeFrame(f, c.tx_hdr);
      c.tx_hdr_sent = 0;
      c.tx_src = t.p_ + t.moved_;
      c.tx_len = len;
      c.tx_sent = 0;
      c.tx_owner = &t;
      c.tx_in_frame = true;
      continue;
    } else if (c.closing) {
      c.stream->ShutdownWrite();
      c.shut = true;
      ArmWrite(c, false);
      return absl::OkStatus();
    } else {
      ArmWrite(c, false);
      return absl::OkStatus();
    }
    PeerStream::Io io;
    std::string error;
    size_t n = iovcnt == 0 ? 0 : c.stream->Write(iov, iovcnt, &io, &error);
    if (n == 0 && iovcnt > 0) {
      if (io == PeerStream::Io::kWantWrite || io == PeerStream::Io::kWantRead) {
        ArmWrite(c, true);
        return absl::OkStatus();
      }
      c.tx_dead = true;
      return absl::AbortedError(absl::StrCat(
          "host ", hosts_[c.rank], " is gone: its connection failed (", error,
          "): its daemon ended or was killed, or the network failed"));
    }
    if (!data) {
      // The frames written whole go; the first one not is where the next
      // write starts.
      c.control_sent += n;
      while (!c.control.empty() && c.control_sent >= c.control.front().size()) {
        c.control_sent -= c.control.front().size();
        c.control.pop_front();
      }
      continue;
    }
    const size_t hdr = std::min<size_t>(n, kFrameHeaderBytes - c.tx_hdr_sent);
    c.tx_hdr_sent += hdr;
    c.tx_sent += n - hdr;
    if (c.tx_hdr_sent < kFrameHeaderBytes || c.tx_sent < c.tx_len) continue;
    // The frame is out.
    c.tx_in_frame = false;
    c.tx_copy.clear();
    if (HostTransfer* t = c.tx_owner) {
      c.tx_owner = nullptr;
      t->moved_ += c.tx_len;
      if (t->moved_ >= t->size_) {
        c.outgoing.pop_front();
        t->bytes_ = t->size_;
        Complete(*t, absl::OkStatus());
      }
    }
  }
}

absl::Status HostTransport::ReadSome(Connection& c, std::vector<int64_t>* queries) {
  size_t budget = c.stream->ssl() != nullptr ? SIZE_MAX : kReadBudget;
  const std::string& peer = hosts_[c.rank];
  auto protocol = [&](const std::string& what) {
    c.rx_done = true;
    return absl::AbortedError(absl::StrCat(
        "host ", peer, " sent what this host cannot accept (", what,
        "): the mesh's connections cannot be trusted any more"));
  };
  const bool broken = !Failed(c).ok();
  while (!c.rx_done && budget > 0) {
    PeerStream::Io io;
    std::string error;
    size_t n = 0;
    if (broken) {
      // Nothing more is acted on: drain until the peer closes.
      n = c.stream->Read(c.sink.get(), kSinkBytes, &io, &error);
    } else if (!c.rx_in_frame) {
      n = c.stream->Read(c.rx_hdr + c.rx_hdr_got, kFrameHeaderBytes - c.rx_hdr_got, &io, &error);
    } else if (c.rx_frame.type == kData) {
      const uint64_t left = c.rx_frame.length - c.rx_payload_got;
      void* dst = c.rx_target != nullptr
                      ? static_cast<void*>(c.rx_target->p_ + c.rx_frame.offset + c.rx_payload_got)
                      : static_cast<void*>(c.sink.get());
      const uint64_t cap = c.rx_target != nullptr ? std::min<uint64_t>(left, budget)
                                                  : std::min<uint64_t>(left, kSinkBytes);
      n = c.stream->Read(dst, cap, &io, &error);
    } else {
      const size_t at = c.rx_small.size();
      c.rx_small.resize(c.rx_frame.length);
      n = c.stream->Read(c.rx_small.data() + at, c.rx_frame.length - at, &io, &error);
      c.rx_small.resize(at + n);
    }
    if (n == 0) {
      if (io == PeerStream::Io::kWantRead || io == PeerStream::Io::kWantWrite) {
        return absl::OkStatus();
      }
      c.rx_done = true;
      if (broken) return absl::OkStatus();
      return absl::AbortedError(absl::StrCat(
          "host ", peer, " is gone: its connection ",
          io == PeerStream::Io::kClosed ? "closed" : "failed", " without a reason (", error,
          "): its daemon ended or was killed"));
    }
    budget -= std::min<size_t>(budget, n);
    if (broken) continue;
    if (!c.rx_in_frame) {
      c.rx_hdr_got += n;
      if (c.rx_hdr_got < kFrameHeaderBytes) continue;
      c.rx_hdr_got = 0;
      c.rx_frame = DecodeFrame(c.rx_hdr);
      c.rx_payload_got = 0;
      c.rx_small.clear();
      const Frame& f = c.rx_frame;
      switch (f.type) {
        case kReady:
        case kQuery:
          if (f.length != 0) return protocol("a control frame with a payload");
          break;
        case kBreak:
        case kAnswer:
          if (f.length > kMaxBreakReasonBytes) {
            return protocol(absl::StrCat("a text of ", f.length, " bytes"));
          }
          break;
        case kData: {
          if (f.length > f.total || f.offset > f.total - f.length) {
            return protocol(absl::StrCat("a frame of ", f.length, " bytes at ", f.offset,
                                         " of a message of ", f.total));
          }
          if (!c.rx_active) {
            if (f.offset != 0) return protocol("a message that does not start at its beginning");
            auto it = c.recvs.find(f.slot);
            if (it == c.recvs.end() || it->second.empty()) {
              return protocol(absl::StrCat("a message of ", f.total, " bytes on slot ", f.slot,
                                           " that no receive asked for"));
            }
            HostTransfer* target = it->second.front();
            if (target != nullptr && f.total > target->size_) {
              // Left where it is: the break fails it.
              return protocol(absl::StrCat("a message of ", f.total, " bytes for a receive of ",
                                           target->size_, " bytes (slot ", f.slot, ")"));
            }
            it->second.pop_front();
            if (it->second.empty()) c.recvs.erase(it);
            c.rx_active = true;
            c.rx_target = target;
            c.rx_total = f.total;
            c.rx_next = 0;
          } else if (f.offset != c.rx_next || f.total != c.rx_total) {
            return protocol("a frame out of order");
          }
          break;
        }
        default:
          return protocol(absl::StrCat("a frame of unknown type ", f.type));
      }
      c.rx_in_frame = true;
    } else if (c.rx_frame.type == kData) {
      c.rx_payload_got += n;
    }
    if (c.rx_frame.type == kData ? c.rx_payload_got < c.rx_frame.length
                                 : c.rx_small.size() < c.rx_frame.length) {
      continue;
    }
    // A whole frame.
    c.rx_in_frame = false;
    const Frame& f = c.rx_frame;
    switch (f.type) {
      case kReady: {
        absl::Status st;
        {
          std::lock_guard<std::mutex> lock(c.tx_mu);
          if (c.closing) break;
          auto it = c.sends.find(f.slot);
          if (it != c.sends.end() && !it->second.empty()) {
            HostTransfer* t = it->second.front();
            it->second.pop_front();
            if (it->second.empty()) c.sends.erase(it);
            if (t->size_ > f.total) {
              c.sends[f.slot].push_front(t);
              st = absl::AbortedError(absl::StrCat(
                  "host ", peer, " posted a receive of ", f.total, " bytes for this host's send of ",
                  t->size_, " bytes (slot ", f.slot, "): the hosts run different schedules"));
            } else {
              c.outgoing.push_back(t);
              st = Flush(c);
            }
          } else {
            c.readies[f.slot].push_back(f.total);
          }
        }
        if (!st.ok()) return st;
        break;
      }
      case kData:
        c.rx_next += f.length;
        if (c.rx_next == c.rx_total) {
          c.rx_active = false;
          if (HostTransfer* t = c.rx_target) {
            c.rx_target = nullptr;
            t->bytes_ = c.rx_total;
            Complete(*t, absl::OkStatus());
          }
        }
        break;
      case kBreak: {
        int code = static_cast<int>(f.slot);
        if (code <= 0 || code > 16) code = static_cast<int>(absl::StatusCode::kAborted);
        c.rx_done = true;
        return absl::Status(static_cast<absl::StatusCode>(code),
                            Clean(c.rx_small, kMaxBreakReasonBytes));
      }
      case kQuery:
        queries->push_back(static_cast<int64_t>(f.slot));
        break;
      case kAnswer: {
        std::lock_guard<std::mutex> lock(state_mu_);
        answers_[{c.rank, static_cast<int64_t>(f.slot)}] = Clean(c.rx_small, kMaxQueryAnswerBytes);
        while (answers_.size() > kMaxAnswersKept) answers_.erase(answers_.begin());
        answers_cv_.notify_all();
        break;
      }
    }
  }
  return absl::OkStatus();
}

void HostTransport::Complete(HostTransfer& t, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(done_mu_);
  if (t.state_.load() != 0) return;
  t.status_ = status;
  t.state_.store(status.ok() ? 1 : 2);
  done_cv_.notify_all();
}

absl::StatusOr<std::unique_ptr<HostTransfer>> HostTransport::Send(int rank, int lane, uint64_t slot,
                                                              const void* p, uint64_t bytes) {
  return Post(true, rank, lane, slot, static_cast<uint8_t*>(const_cast<void*>(p)), bytes);
}

absl::StatusOr<std::unique_ptr<HostTransfer>> HostTransport::Recv(int rank, int lane, uint64_t slot,
                                                              void* p, uint64_t capacity) {
  return Post(false, rank, lane, slot, static_cast<uint8_t*>(p), capacity);
}

absl::StatusOr<std::unique_ptr<HostTransfer>> HostTransport::Post(bool send, int rank, int lane,
                                                              uint64_t slot, uint8_t* p,
                                                              uint64_t size) {
  if (rank < 0 || rank >= this->size() || rank == self_ || lane < 0 || lane >= options_.lanes) {
    return absl::InvalidArgumentError(absl::StrCat("a transfer with rank ", rank, " on lane ",
                                                   lane, " (this host is rank ", self_, " of ",
                                                   this->size(), ")"));
  }
  Connection& c = conn(rank, lane);
  auto t = std::unique_ptr<HostTransfer>(new HostTransfer(this, rank, lane, send, slot, p, size));
  absl::Status failure;
  if (send) {
    std::lock_guard<std::mutex> lock(c.tx_mu);
    if (absl::Status b = Failed(c); !b.ok()) return b;
    if (c.out_of_step) {
      return absl::InternalError(absl::StrCat(
          "the connection to host ", hosts_[rank], " is out of step (a send was withdrawn): ",
          "the mesh must break"));
    }
    auto it = c.readies.find(slot);
    if (it != c.readies.end() && !it->second.empty()) {
      const uint64_t capacity = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) c.readies.erase(it);
      if (size > capacity) {
        failure = absl::AbortedError(absl::StrCat(
            "host ", hosts_[rank], " posted a receive of ", capacity, " bytes for this host's send of ",
            size, " bytes (slot ", slot, "): the hosts run different schedules"));
        // Never queued: it fails here, with the connection.
        Complete(*t, failure);
      } else {
        c.outgoing.push_back(t.get());
        failure = Flush(c);
      }
    } else {
      c.sends[slot].push_back(t.get());
    }
  } else {
    {
      std::lock_guard<std::mutex> lock(c.rx_mu);
      if (absl::Status b = Failed(c); !b.ok()) return b;
      c.recvs[slot].push_back(t.get());
    }
    std::lock_guard<std::mutex> lock(c.tx_mu);
    if (!c.closing) {
      c.control.push_back(ControlFrame(kReady, slot, size));
      failure = Flush(c);
    }
  }
  if (!failure.ok()) PeerFailed(c, failure);
  return t;
}

void HostTransport::PeerFailed(Connection& c, const absl::Status& why) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    // After a local break every connection is detached already; a peer
    // whose failure was seen is not failed twice.
    const size_t at = static_cast<size_t>(c.rank * options_.lanes + c.lane);
    if (!broken_.ok() || !dead_[at].ok()) return;
    dead_[at] = why;
    first = !reported_;
    reported_ = true;
    if (broken_at_ == absl::InfinitePast()) broken_at_ = absl::Now();
  }
  answers_cv_.notify_all();
  // This connection ends; the others go on until theirs end too (a peer
  // that breaks sends a BREAK on each, after what it sent there before),
  // so an op that needs nothing more from that host can still finish.
  Detach(c, why);
  for (auto& lane : lanes_) Wake(*lane);
  if (first && options_.on_break) options_.on_break(c.rank, why);
}

void HostTransport::Break(const absl::Status& why_in) {
  const absl::Status why = why_in.ok() ? absl::AbortedError("the mesh was aborted") : why_in;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!broken_.ok()) return;
    broken_ = why;
    broken_at_ = absl::Now();
  }
  answers_cv_.notify_all();
  for (auto& cp : conns_) {
    if (cp != nullptr) Detach(*cp, why);
  }
  for (auto& lane : lanes_) Wake(*lane);
}

void HostTransport::Detach(Connection& c, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(c.rx_mu);
    for (auto& [slot, q] : c.recvs) {
      for (HostTransfer* t : q) {
        if (t != nullptr) Complete(*t, why);
      }
    }
    c.recvs.clear();
    if (c.rx_target != nullptr) {
      Complete(*c.rx_target, why);
      c.rx_target = nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(c.tx_mu);
  if (c.closing) return;
  if (c.tx_in_frame && c.tx_owner != nullptr) {
    // The frame being written is finished from a copy: its transfer's
    // memory is the caller's again once this returns.
    c.tx_copy.assign(reinterpret_cast<const char*>(c.tx_src + c.tx_sent), c.tx_len - c.tx_sent);
    c.tx_src = reinterpret_cast<const uint8_t*>(c.tx_copy.data());
    c.tx_len -= c.tx_sent;
    c.tx_sent = 0;
    c.tx_owner = nullptr;
  }
  for (auto& [slot, q] : c.sends) {
    for (HostTransfer* t : q) Complete(*t, why);
  }
  for (HostTransfer* t : c.outgoing) Complete(*t, why);
  c.sends.clear();
  c.outgoing.clear();
  c.readies.clear();
  // A control frame partly written is finished; the others are moot. The
  // peer is told why before the connection shuts down.
  while (c.control.size() > (c.control_sent > 0 ? 1u : 0u)) c.control.pop_back();
  c.control.push_back(ControlFrame(kBreak, static_cast<uint64_t>(why.code()), 0,
                                   why.message().substr(0, kMaxBreakReasonBytes)));
  c.closing = true;
  if (!c.tx_dead) {
    (void)Flush(c);
    ArmWrite(c, !c.shut);
  }
}

absl::Status HostTransport::Failed(const Connection& c) const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return broken_.ok() ? dead_[static_cast<size_t>(c.rank * options_.lanes + c.lane)] : broken_;
}

absl::Status HostTransport::broken() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return broken_;
}

void HostTransport::Query(int rank, int64_t sequence) {
  if (rank < 0 || rank >= size() || rank == self_) return;
  Connection& c = conn(rank, 0);
  absl::Status failure;
  {
    std::lock_guard<std::mutex> lock(c.tx_mu);
    if (c.closing) return;
    c.control.push_back(ControlFrame(kQuery, static_cast<uint64_t>(sequence), 0));
    failure = Flush(c);
  }
  if (!failure.ok()) PeerFailed(c, failure);
}

std::map<int, std::string> HostTransport::Answers(const std::vector<int>& ranks,
                                                  int64_t sequence, absl::Time deadline) {
  std::unique_lock<std::mutex> lock(state_mu_);
  // Every rank answered, or can no longer.
  auto have = [&] {
    for (int r : ranks) {
      // Queries and answers travel on lane 0.
      if (answers_.count({r, sequence}) == 0 && dead_[static_cast<size_t>(r * options_.lanes)].ok()) {
        return false;
      }
    }
    return true;
  };
  while (!have() && broken_.ok() && absl::Now() < deadline) {
    answers_cv_.wait_for(lock, absl::ToChronoMilliseconds(
                                   std::max(absl::Milliseconds(1), deadline - absl::Now())));
  }
  std::map<int, std::string> out;
  for (int r : ranks) {
    auto it = answers_.find({r, sequence});
    if (it != answers_.end()) out[r] = it->second;
  }
  return out;
}

void HostTransport::Withdraw(HostTransfer& t) {
  Connection& c = conn(t.rank_, t.lane_);
  if (t.send_) {
    std::lock_guard<std::mutex> lock(c.tx_mu);
    if (t.state_.load() != 0) return;
    auto it = c.sends.find(t.slot_);
    if (it != c.sends.end()) {
      auto& q = it->second;
      q.erase(std::remove(q.begin(), q.end(), &t), q.end());
      if (q.empty()) c.sends.erase(it);
    }
    c.outgoing.erase(std::remove(c.outgoing.begin(), c.outgoing.end(), &t), c.outgoing.end());
    if (c.tx_in_frame && c.tx_owner == &t) {
      // The frame being written is finished from a copy.
      c.tx_copy.assign(reinterpret_cast<const char*>(c.tx_src + c.tx_sent), c.tx_len - c.tx_sent);
      c.tx_src = reinterpret_cast<const uint8_t*>(c.tx_copy.data());
      c.tx_len -= c.tx_sent;
      c.tx_sent = 0;
      c.tx_owner = nullptr;
    }
    Complete(t, absl::CancelledError("withdrawn"));
    // The peer expects these bytes: the connection's messages are out of
    // step, and nothing more goes over it. The peer learns why when this
    // host breaks the mesh (a failed op does, with its cause).
    c.out_of_step = true;
    return;
  }
  std::lock_guard<std::mutex> lock(c.rx_mu);
  if (t.state_.load() != 0) return;
  if (c.rx_target == &t) {
    c.rx_target = nullptr;  // the rest of its frames are discarded
  } else if (auto it = c.recvs.find(t.slot_); it != c.recvs.end()) {
    for (HostTransfer*& x : it->second) {
      if (x == &t) x = nullptr;
    }
  }
  Complete(t, absl::CancelledError("withdrawn"));
}

HostTransfer::~HostTransfer() {
  if (state_.load() == 0) transport_->Withdraw(*this);
}

absl::Status HostTransfer::Wait(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(transport_->done_mu_);
  while (state_.load() == 0) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "host ", transport_->host(rank_), " did not ", send_ ? "take" : "send",
          " its part in time"));
    }
    transport_->done_cv_.wait_for(
        lock, absl::ToChronoMicroseconds(std::min(deadline - now, absl::Hours(1))));
  }
  return status_;
}

bool HostTransfer::done() const { return state_.load() != 0; }

}  // namespace collectived
