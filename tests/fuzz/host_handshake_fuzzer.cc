// libFuzzer target: what a stranger, or a connected host, can send to a
// daemon's connections between hosts (daemon/cluster/peer_auth.h,
// host_transport.h). The first byte picks the case:
//   0: the accepting end of the handshake fed the rest, in pieces whose
//      sizes the input also picks: it must never accept (no input holds
//      this mesh's key), and never read past the message it waits for;
//   1: the connecting end fed the rest as the accepting end's answer: it
//      must never take it (no input proves the key);
//   2: a real HostTransport (rank 0 of two, over loopback) whose rank 1 is
//      this input: a correct handshake, then the rest as frames. Whatever
//      they are, the transport must not crash, and a receive posted on it
//      must end (done, or failed with a reason) within a deadline.
//
// Built with clang -fsanitize=fuzzer (scripts/fuzz.sh) and as a plain
// program that replays the corpus (a ctest), via fuzz_main.cc.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/cluster/host_transport.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/util/log.h"
#include "tests/harness/memory_book.h"

namespace collectived {
namespace {

const peer_auth::Key kKey = peer_auth::MeshKey("fuzz-token", "fuzz/mesh", 1, "secret");
const peer_auth::Tag kTag = peer_auth::MeshTag("fuzz/mesh", 1);

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "host handshake fuzzer: %s\n", what);
    std::abort();
  }
}

// The sizes of the pieces the bytes arrive in: each byte of `sizes` (1..16).
std::vector<size_t> Pieces(const uint8_t* sizes, size_t n) {
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) out.push_back(1 + sizes[i] % 16);
  if (out.empty()) out.push_back(64);
  return out;
}

void Server(const uint8_t* data, size_t size) {
  peer_auth::ServerExpectation e;
  e.key = kKey;
  e.tag = kTag;
  e.self = 0;
  e.hosts = 4;
  e.lanes = 2;
  peer_auth::ServerHandshake hs(std::move(e));
  const size_t nsizes = size == 0 ? 0 : std::min<size_t>(data[0] % 8, size - 1);
  const std::vector<size_t> pieces = Pieces(data + 1, nsizes);
  size_t at = 1 + nsizes, k = 0;
  while (at < size) {
    const size_t n = std::min({pieces[k++ % pieces.size()], size - at});
    const size_t wanted = hs.wanted();
    auto out = hs.Feed(std::string(reinterpret_cast<const char*>(data + at), n));
    if (!out.ok()) {
      Check(!hs.done(), "a refused handshake is done");
      return;
    }
    Check(n <= wanted, "took more bytes than its message");
    at += n;
  }
  Check(!hs.done(), "accepted a handshake without the key");
}

void Client(const uint8_t* data, size_t size) {
  peer_auth::Hello hello;
  hello.from_rank = 1;
  hello.tag = kTag;
  peer_auth::ClientHandshake hs(kKey, hello);
  auto out = hs.Feed(std::string(reinterpret_cast<const char*>(data), size));
  Check(!hs.proved(), "proved the key to a peer that did not");
  (void)out;
}

// A blocking connection to "host:port"; -1 on failure.
int Dial(const std::string& address) {
  const size_t colon = address.rfind(':');
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints,
                  &res) != 0) {
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  return fd;
}

bool WriteAll(int fd, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

using Book = ::collectived::testing::MemoryBook;

void Frames(const uint8_t* data, size_t size) {
  Book book;
  TransportSecurity sec;
  sec.key = kKey;
  sec.tag = kTag;
  sec.description = "fuzz";
  TransportOptions o;
  o.lanes = 1;
  o.break_flush = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<HostTransport>> t = absl::UnknownError("not run");
  std::thread host0([&] {
    t = HostTransport::Connect(book, "f", {"h0", "h1"}, 0, "127.0.0.1", sec,
                               absl::Now() + absl::Seconds(5), o);
  });
  auto address = book.Lookup({"f/addr/0"}, absl::Now() + absl::Seconds(5));
  int fd = address.ok() ? Dial((*address)[0]) : -1;
  peer_auth::Hello hello;
  hello.from_rank = 1;
  hello.tag = kTag;
  peer_auth::ClientHandshake hs(kKey, hello);
  bool shook = fd >= 0 && WriteAll(fd, hs.hello_bytes());
  while (shook && !hs.done()) {
    std::string in(hs.wanted(), '\0');
    const ssize_t n = recv(fd, in.data(), in.size(), MSG_WAITALL);
    if (n != static_cast<ssize_t>(in.size())) break;
    auto out = hs.Feed(in);
    shook = out.ok() && (out->empty() || WriteAll(fd, *out));
  }
  host0.join();
  Check(t.ok(), "the honest handshake failed");
  // Receives on the first few slots, of 64 bytes: some frames land.
  std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(64));
  std::vector<std::unique_ptr<HostTransfer>> recvs;
  for (uint64_t slot = 0; slot < 3; ++slot) {
    auto r = (*t)->Recv(1, 0, slot, bufs[slot].data(), bufs[slot].size());
    if (r.ok()) recvs.push_back(*std::move(r));
  }
  WriteAll(fd, std::string(reinterpret_cast<const char*>(data), size));
  shutdown(fd, SHUT_WR);
  // Every receive ends: the peer closed, so each is done or failed. Its
  // status may be any code, DEADLINE_EXCEEDED included: a peer's break
  // frame carries the code of its own failure.
  for (auto& r : recvs) {
    (void)r->Wait(absl::Now() + absl::Seconds(10));
    Check(r->done(), "a receive outlived its peer's close");
  }
  recvs.clear();
  close(fd);
}

}  // namespace
}  // namespace collectived

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool init = [] {
    std::signal(SIGPIPE, SIG_IGN);
    collectived::SetLogLevel(collectived::LogLevel::kError);
    return true;
  }();
  (void)init;
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0: collectived::Server(data + 1, size - 1); break;
    case 1: collectived::Client(data + 1, size - 1); break;
    default: collectived::Frames(data + 1, size - 1); break;
  }
  return 0;
}
