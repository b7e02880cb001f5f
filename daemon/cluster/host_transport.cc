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
#include "daemon/cluster/host_transport_internal.h"
#include "daemon/cluster/peer_stream.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {
namespace {

using host_wire::Frame;
using host_wire::kAnswer;
using host_wire::kBreak;
using host_wire::kData;
using host_wire::kFrameHeaderBytes;
using host_wire::kQuery;
using host_wire::kReady;

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

}  // namespace

HostTransport::HostTransport(std::vector<std::string> hosts, int self,
                             TransportSecurity security, TransportOptions options)
    : hosts_(std::move(hosts)), self_(self), security_(std::move(security)),
      options_(std::move(options)), dead_(hosts_.size() * static_cast<size_t>(options_.lanes)) {}

HostTransport::Connection& HostTransport::conn(int rank, int lane) {
  return *conns_[static_cast<size_t>(rank * options_.lanes + lane)];
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
  MutexLock lock(&c.ev_mu);
  if (on == c.ev_out && !c.rx_done.load()) return;
  c.ev_out = on;
  UpdateEvents(c);
}

void HostTransport::UpdateEvents(Connection& c) {
  c.ev_mu.AssertHeld();
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
        MutexLock lock(&state_mu_);
        broke_at = broken_at_;
      }
      bool flushed = true;
      for (Connection* c : lane.conns) {
        MutexLock lock(&c->tx_mu);
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
        MutexLock lock(&c.tx_mu);
        failure = Flush(c);
      }
      if (failure.ok() && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) {
        std::vector<int64_t> queries;
        {
          MutexLock lock(&c.rx_mu);
          failure = ReadSome(c, &queries);
        }
        if (c.rx_done.load()) {
          MutexLock lock(&c.ev_mu);
          UpdateEvents(c);
        }
        for (int64_t q : queries) {
          std::optional<std::string> answer;
          if (options_.on_query) answer = options_.on_query(q);
          if (!answer.has_value()) continue;
          if (answer->size() > kMaxQueryAnswerBytes) answer->resize(kMaxQueryAnswerBytes);
          MutexLock lock(&c.tx_mu);
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
  c.tx_mu.AssertHeld();
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
      BeginDataFrame(c);
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
    DataWritten(c, n);
  }
}

// The next frame of the first matched send.
void HostTransport::BeginDataFrame(Connection& c) {
  c.tx_mu.AssertHeld();
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
}

// `n` more bytes of the data frame went out; a frame that is out whole
// moves its send on, and a send that is out whole completes.
void HostTransport::DataWritten(Connection& c, size_t n) {
  c.tx_mu.AssertHeld();
  const size_t hdr = std::min<size_t>(n, kFrameHeaderBytes - c.tx_hdr_sent);
  c.tx_hdr_sent += hdr;
  c.tx_sent += n - hdr;
  if (c.tx_hdr_sent < kFrameHeaderBytes || c.tx_sent < c.tx_len) return;
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

absl::Status HostTransport::ProtocolError(Connection& c, absl::string_view what) {
  c.rx_done = true;
  return absl::AbortedError(absl::StrCat(
      "host ", hosts_[c.rank], " sent what this host cannot accept (", what,
      "): the mesh's connections cannot be trusted any more"));
}

size_t HostTransport::ReadChunk(Connection& c, bool broken, size_t budget, PeerStream::Io* io,
                                std::string* error) {
  c.rx_mu.AssertHeld();
  if (broken) {
    // Nothing more is acted on: drain until the peer closes.
    return c.stream->Read(c.sink.get(), kSinkBytes, io, error);
  }
  if (!c.rx_in_frame) {
    return c.stream->Read(c.rx_hdr + c.rx_hdr_got, kFrameHeaderBytes - c.rx_hdr_got, io, error);
  }
  if (c.rx_frame.type == kData) {
    const uint64_t left = c.rx_frame.length - c.rx_payload_got;
    void* dst = c.rx_target != nullptr
                    ? static_cast<void*>(c.rx_target->p_ + c.rx_frame.offset + c.rx_payload_got)
                    : static_cast<void*>(c.sink.get());
    const uint64_t cap = c.rx_target != nullptr ? std::min<uint64_t>(left, budget)
                                                : std::min<uint64_t>(left, kSinkBytes);
    return c.stream->Read(dst, cap, io, error);
  }
  const size_t at = c.rx_small.size();
  c.rx_small.resize(c.rx_frame.length);
  const size_t n = c.stream->Read(c.rx_small.data() + at, c.rx_frame.length - at, io, error);
  c.rx_small.resize(at + n);
  return n;
}

absl::Status HostTransport::ReadSome(Connection& c, std::vector<int64_t>* queries) {
  c.rx_mu.AssertHeld();
  size_t budget = c.stream->ssl() != nullptr ? SIZE_MAX : kReadBudget;
  const bool broken = !Failed(c).ok();
  while (!c.rx_done && budget > 0) {
    PeerStream::Io io;
    std::string error;
    const size_t n = ReadChunk(c, broken, budget, &io, &error);
    if (n == 0) {
      if (io == PeerStream::Io::kWantRead || io == PeerStream::Io::kWantWrite) {
        return absl::OkStatus();
      }
      c.rx_done = true;
      if (broken) return absl::OkStatus();
      return absl::AbortedError(absl::StrCat(
          "host ", hosts_[c.rank], " is gone: its connection ",
          io == PeerStream::Io::kClosed ? "closed" : "failed", " without a reason (", error,
          "): its daemon ended or was killed"));
    }
    budget -= std::min<size_t>(budget, n);
    if (broken) continue;
    if (!c.rx_in_frame) {
      c.rx_hdr_got += n;
      if (c.rx_hdr_got < kFrameHeaderBytes) continue;
      if (absl::Status st = StartFrame(c); !st.ok()) return st;
    } else if (c.rx_frame.type == kData) {
      c.rx_payload_got += n;
    }
    if (c.rx_frame.type == kData ? c.rx_payload_got < c.rx_frame.length
                                 : c.rx_small.size() < c.rx_frame.length) {
      continue;
    }
    c.rx_in_frame = false;
    if (absl::Status st = EndFrame(c, queries); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status HostTransport::StartFrame(Connection& c) {
  c.rx_mu.AssertHeld();
  c.rx_hdr_got = 0;
  c.rx_frame = DecodeFrame(c.rx_hdr);
  c.rx_payload_got = 0;
  c.rx_small.clear();
  const Frame f = c.rx_frame;  // a copy: clang 14 loses an asserted lock through a reference
  switch (f.type) {
    case kReady:
    case kQuery:
      if (f.length != 0) return ProtocolError(c, "a control frame with a payload");
      break;
    case kBreak:
    case kAnswer:
      if (f.length > kMaxBreakReasonBytes) {
        return ProtocolError(c, absl::StrCat("a text of ", f.length, " bytes"));
      }
      break;
    case kData:
      if (absl::Status st = StartData(c); !st.ok()) return st;
      break;
    default:
      return ProtocolError(c, absl::StrCat("a frame of unknown type ", f.type));
  }
  c.rx_in_frame = true;
  return absl::OkStatus();
}

absl::Status HostTransport::StartData(Connection& c) {
  c.rx_mu.AssertHeld();
  const Frame f = c.rx_frame;  // a copy: clang 14 loses an asserted lock through a reference
  if (f.length > f.total || f.offset > f.total - f.length) {
    return ProtocolError(c, absl::StrCat("a frame of ", f.length, " bytes at ", f.offset,
                                         " of a message of ", f.total));
  }
  if (c.rx_active) {
    if (f.offset != c.rx_next || f.total != c.rx_total) {
      return ProtocolError(c, "a frame out of order");
    }
    return absl::OkStatus();
  }
  if (f.offset != 0) return ProtocolError(c, "a message that does not start at its beginning");
  auto it = c.recvs.find(f.slot);
  if (it == c.recvs.end() || it->second.empty()) {
    return ProtocolError(c, absl::StrCat("a message of ", f.total, " bytes on slot ", f.slot,
                                         " that no receive asked for"));
  }
  HostTransfer* target = it->second.front();
  if (target != nullptr && f.total > target->size_) {
    // Left where it is: the break fails it.
    return ProtocolError(c, absl::StrCat("a message of ", f.total, " bytes for a receive of ",
                                         target->size_, " bytes (slot ", f.slot, ")"));
  }
  it->second.pop_front();
  if (it->second.empty()) c.recvs.erase(it);
  c.rx_active = true;
  c.rx_target = target;
  c.rx_total = f.total;
  c.rx_next = 0;
  return absl::OkStatus();
}

absl::Status HostTransport::EndFrame(Connection& c, std::vector<int64_t>* queries) {
  c.rx_mu.AssertHeld();
  const Frame f = c.rx_frame;  // a copy: clang 14 loses an asserted lock through a reference
  switch (f.type) {
    case kReady:
      return OnReady(c);
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
      return absl::OkStatus();
    case kBreak: {
      int code = static_cast<int>(f.slot);
      if (code <= 0 || code > 16) code = static_cast<int>(absl::StatusCode::kAborted);
      c.rx_done = true;
      c.rx_break = true;
      return absl::Status(static_cast<absl::StatusCode>(code),
                          Clean(c.rx_small, kMaxBreakReasonBytes));
    }
    case kQuery:
      queries->push_back(static_cast<int64_t>(f.slot));
      return absl::OkStatus();
    case kAnswer: {
      MutexLock lock(&state_mu_);
      answers_[{c.rank, static_cast<int64_t>(f.slot)}] = Clean(c.rx_small, kMaxQueryAnswerBytes);
      while (answers_.size() > kMaxAnswersKept) answers_.erase(answers_.begin());
      answers_cv_.SignalAll();
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// A peer's READY: its receive meets this host's oldest send of the slot, or
// waits for one.
absl::Status HostTransport::OnReady(Connection& c) {
  c.rx_mu.AssertHeld();  // EndFrame's, from the I/O thread
  const Frame f = c.rx_frame;  // a copy: clang 14 loses an asserted lock through a reference
  MutexLock lock(&c.tx_mu);
  if (c.closing) return absl::OkStatus();
  auto it = c.sends.find(f.slot);
  if (it == c.sends.end() || it->second.empty()) {
    c.readies[f.slot].push_back(f.total);
    return absl::OkStatus();
  }
  HostTransfer* t = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) c.sends.erase(it);
  if (t->size_ > f.total) {
    c.sends[f.slot].push_front(t);
    return absl::AbortedError(absl::StrCat(
        "host ", hosts_[c.rank], " posted a receive of ", f.total, " bytes for this host's send of ",
        t->size_, " bytes (slot ", f.slot, "): the hosts run different schedules"));
  }
  c.outgoing.push_back(t);
  return Flush(c);
}

void HostTransport::Complete(HostTransfer& t, const absl::Status& status) {
  MutexLock lock(&done_mu_);
  if (t.state_.load() != 0) return;
  t.status_ = status;
  t.state_.store(status.ok() ? 1 : 2);
  done_cv_.SignalAll();
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
    MutexLock lock(&c.tx_mu);
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
      MutexLock lock(&c.rx_mu);
      if (absl::Status b = Failed(c); !b.ok()) return b;
      c.recvs[slot].push_back(t.get());
    }
    MutexLock lock(&c.tx_mu);
    if (!c.closing) {
      c.control.push_back(ControlFrame(kReady, slot, size));
      failure = Flush(c);
    }
  }
  if (!failure.ok()) PeerFailed(c, failure);
  return t;
}

void HostTransport::PeerFailed(Connection& c, const absl::Status& failure) {
  // A write that failed because the peer went away: the peer may have said
  // why before it went (its BREAK, still unread here), and that is the
  // reason to report, not the broken pipe it left behind.
  absl::Status why = failure;
  {
    MutexLock lock(&c.rx_mu);
    if (!c.rx_done) {
      std::vector<int64_t> unanswered;  // the connection ends: no answers
      absl::Status read = ReadSome(c, &unanswered);
      if (c.rx_break) why = read;
    }
  }
  bool first;
  {
    MutexLock lock(&state_mu_);
    // After a local break every connection is detached already; a peer
    // whose failure was seen is not failed twice.
    const size_t at = static_cast<size_t>(c.rank * options_.lanes + c.lane);
    if (!broken_.ok() || !dead_[at].ok()) return;
    dead_[at] = why;
    first = !reported_;
    reported_ = true;
    if (broken_at_ == absl::InfinitePast()) broken_at_ = absl::Now();
  }
  answers_cv_.SignalAll();
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
    MutexLock lock(&state_mu_);
    if (!broken_.ok()) return;
    broken_ = why;
    broken_at_ = absl::Now();
  }
  answers_cv_.SignalAll();
  for (auto& cp : conns_) {
    if (cp != nullptr) Detach(*cp, why);
  }
  for (auto& lane : lanes_) Wake(*lane);
}

void HostTransport::Detach(Connection& c, const absl::Status& why) {
  {
    MutexLock lock(&c.rx_mu);
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
  MutexLock lock(&c.tx_mu);
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
  MutexLock lock(&state_mu_);
  return broken_.ok() ? dead_[static_cast<size_t>(c.rank * options_.lanes + c.lane)] : broken_;
}

absl::Status HostTransport::broken() const {
  MutexLock lock(&state_mu_);
  return broken_;
}

void HostTransport::Query(int rank, int64_t sequence) {
  if (rank < 0 || rank >= size() || rank == self_) return;
  Connection& c = conn(rank, 0);
  absl::Status failure;
  {
    MutexLock lock(&c.tx_mu);
    if (c.closing) return;
    c.control.push_back(ControlFrame(kQuery, static_cast<uint64_t>(sequence), 0));
    failure = Flush(c);
  }
  if (!failure.ok()) PeerFailed(c, failure);
}

std::map<int, std::string> HostTransport::Answers(const std::vector<int>& ranks,
                                                  int64_t sequence, absl::Time deadline) {
  MutexLock lock(&state_mu_);
  // Every rank answered, or can no longer.
  auto have = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    for (int r : ranks) {
      // Queries and answers travel on lane 0.
      if (answers_.count({r, sequence}) == 0 && dead_[static_cast<size_t>(r * options_.lanes)].ok()) {
        return false;
      }
    }
    return true;
  };
  while (!have() && broken_.ok() && absl::Now() < deadline) {
    answers_cv_.WaitWithDeadline(&state_mu_, deadline);
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
    MutexLock lock(&c.tx_mu);
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
  MutexLock lock(&c.rx_mu);
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
  MutexLock lock(&transport_->done_mu_);
  while (state_.load() == 0) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "host ", transport_->host(rank_), " did not ", send_ ? "take" : "send",
          " its part in time"));
    }
    transport_->done_cv_.WaitWithDeadline(&transport_->done_mu_,
                                          std::min(deadline, now + absl::Hours(1)));
  }
  return status_;
}

bool HostTransfer::done() const { return state_.load() != 0; }

}  // namespace collectived