// The connections between hosts (daemon/cluster/host_transport.h) and their
// handshake (peer_auth.h), in one process over loopback: hosts as threads,
// and raw sockets playing strangers and hostile peers. Checked: messages
// arrive whole and in order per slot, across frames and lanes; a stranger
// (garbage, a wrong key, a replayed proof, another mesh, silence, a flood of
// connections) neither joins nor delays the mesh; nothing a connected peer
// sends ends the process: malformed frames, data nobody asked for, a message
// longer than its receive, random bytes; a peer's BREAK reaches the others
// with its code and reason; a peer that vanishes is named as gone; queries
// are answered; TLS with certificates that must name the expected host.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/host_transport.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/cluster/peer_stream.h"
#include "daemon/util/random_id.h"
#include "tests/harness/memory_book.h"

namespace collectived {
namespace {

const bool kSigpipeIgnored = [] { return std::signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();

// --- The handshake alone ----------------------------------------------------

peer_auth::Hello MakeHello(uint32_t from, uint32_t to, uint32_t lane, const peer_auth::Tag& tag) {
  peer_auth::Hello h;
  h.from_rank = from;
  h.to_rank = to;
  h.lane = lane;
  h.tag = tag;
  const std::string nonce = RandomBytes(peer_auth::kNonceBytes);
  std::memcpy(h.nonce.data(), nonce.data(), nonce.size());
  return h;
}

peer_auth::ServerExpectation Expect(const peer_auth::Key& key, const peer_auth::Tag& tag) {
  peer_auth::ServerExpectation e;
  e.key = key;
  e.tag = tag;
  e.self = 0;
  e.hosts = 2;
  e.lanes = 2;
  return e;
}

// Runs a handshake between the two ends in memory: the server's final
// status, and the client's.
std::pair<absl::Status, absl::Status> Shake(peer_auth::ServerHandshake& server,
                                            peer_auth::ClientHandshake& client,
                                            std::string* proof = nullptr) {
  auto challenge = server.Feed(client.hello_bytes());
  if (!challenge.ok()) return {challenge.status(), absl::OkStatus()};
  auto answer = client.Feed(*challenge);
  if (!answer.ok()) return {absl::OkStatus(), answer.status()};
  if (proof != nullptr) *proof = *answer;
  auto verdict = server.Feed(*answer);
  if (!verdict.ok()) return {verdict.status(), absl::OkStatus()};
  auto end = client.Feed(*verdict);
  return {absl::OkStatus(), end.status()};
}

TEST(PeerAuthTest, EndsWithTheSameKeyAuthenticateEachOther) {
  const auto key = peer_auth::MeshKey("token", "s/m", 3, "secret");
  const auto tag = peer_auth::MeshTag("s/m", 3);
  peer_auth::ServerHandshake server(Expect(key, tag));
  peer_auth::ClientHandshake client(key, MakeHello(1, 0, 1, tag));
  EXPECT_EQ(server.wanted(), peer_auth::kHelloBytes);
  EXPECT_EQ(client.wanted(), peer_auth::kChallengeBytes);
  const auto [s, c] = Shake(server, client);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(c.ok()) << c;
  EXPECT_TRUE(server.done());
  EXPECT_TRUE(client.done());
  EXPECT_EQ(server.hello().from_rank, 1u);
  EXPECT_EQ(server.hello().lane, 1u);
  EXPECT_EQ(server.wanted(), 0u);
}

TEST(PeerAuthTest, EveryInputOfTheKeyMatters) {
  const auto key = peer_auth::MeshKey("token", "s/m", 3, "secret");
  EXPECT_EQ(key, peer_auth::MeshKey("token", "s/m", 3, "secret"));
  EXPECT_NE(key, peer_auth::MeshKey("token2", "s/m", 3, "secret"));
  EXPECT_NE(key, peer_auth::MeshKey("token", "s/n", 3, "secret"));
  EXPECT_NE(key, peer_auth::MeshKey("token", "s/m", 4, "secret"));
  EXPECT_NE(key, peer_auth::MeshKey("token", "s/m", 3, "secres"));
  EXPECT_NE(key, peer_auth::MeshKey("", "s/m", 3, "secret"));
  // Fields are length-prefixed: moving bytes between them changes the key.
  EXPECT_NE(peer_auth::MeshKey("", "ab", 1, "c"), peer_auth::MeshKey("", "a", 1, "bc"));
  EXPECT_NE(peer_auth::MeshTag("s/m", 3), peer_auth::MeshTag("s/m", 4));
}

TEST(PeerAuthTest, AClientWithAnotherKeyIsRefusedAndCannotTellTheServersKey) {
  const auto tag = peer_auth::MeshTag("s/m", 1);
  const auto good = peer_auth::MeshKey("token", "s/m", 1, "secret");
  const auto bad = peer_auth::MeshKey("guess", "s/m", 1, "secret");
  {
    // The stranger's end refuses the server (it cannot check its MAC).
    peer_auth::ServerHandshake server(Expect(good, tag));
    peer_auth::ClientHandshake client(bad, MakeHello(1, 0, 0, tag));
    const auto [s, c] = Shake(server, client);
    EXPECT_EQ(c.code(), absl::StatusCode::kPermissionDenied) << c;
    EXPECT_FALSE(server.done());
  }
  {
    // A stranger that sends any proof is refused by the server.
    peer_auth::ServerHandshake server(Expect(good, tag));
    peer_auth::ClientHandshake client(bad, MakeHello(1, 0, 0, tag));
    auto challenge = server.Feed(client.hello_bytes());
    ASSERT_TRUE(challenge.ok());
    auto verdict = server.Feed(std::string(peer_auth::kProofBytes, 'x'));
    EXPECT_EQ(verdict.status().code(), absl::StatusCode::kPermissionDenied) << verdict.status();
    EXPECT_FALSE(server.done());
    // And stays refused.
    EXPECT_FALSE(server.Feed("").ok());
  }
  {
    // A server with another key is refused by an honest client.
    peer_auth::ServerHandshake server(Expect(bad, tag));
    peer_auth::ClientHandshake client(good, MakeHello(1, 0, 0, tag));
    const auto [s, c] = Shake(server, client);
    EXPECT_EQ(c.code(), absl::StatusCode::kPermissionDenied) << c;
  }
}

TEST(PeerAuthTest, ARecordedProofCannotBeReplayed) {
  const auto key = peer_auth::MeshKey("token", "s/m", 1, "secret");
  const auto tag = peer_auth::MeshTag("s/m", 1);
  const peer_auth::Hello hello = MakeHello(1, 0, 0, tag);
  std::string proof;
  {
    peer_auth::ServerHandshake server(Expect(key, tag));
    peer_auth::ClientHandshake client(key, hello);
    ASSERT_TRUE(Shake(server, client, &proof).first.ok());
  }
  // The eavesdropper sends the same hello and proof to a new session: the
  // server's nonce differs, so the proof does not hold.
  peer_auth::ServerHandshake server(Expect(key, tag));
  ASSERT_TRUE(server.Feed(peer_auth::EncodeHello(hello)).ok());
  auto verdict = server.Feed(proof);
  EXPECT_EQ(verdict.status().code(), absl::StatusCode::kPermissionDenied) << verdict.status();
}

TEST(PeerAuthTest, HellosThatAreNotForThisHostAreRefusedBeforeTheChallenge) {
  const auto key = peer_auth::MeshKey("token", "s/m", 1, "secret");
  const auto tag = peer_auth::MeshTag("s/m", 1);
  struct Case {
    std::string bytes;
    absl::StatusCode code;
    std::string text;
  };
  std::vector<Case> cases = {
      {"GET / HTTP/1.1\r\n", absl::StatusCode::kInvalidArgument, "not a collectived data connection"},
      {peer_auth::EncodeHello(MakeHello(1, 0, 0, peer_auth::MeshTag("s/m", 2))),
       absl::StatusCode::kFailedPrecondition, "another mesh or generation"},
      {peer_auth::EncodeHello(MakeHello(1, 1, 0, tag)), absl::StatusCode::kFailedPrecondition,
       "to rank 1"},
      {peer_auth::EncodeHello(MakeHello(5, 0, 0, tag)), absl::StatusCode::kFailedPrecondition,
       "from rank 5"},
      {peer_auth::EncodeHello(MakeHello(1, 0, 9, tag)), absl::StatusCode::kFailedPrecondition,
       "lane 9"},
      {peer_auth::EncodeHello(MakeHello(1, 0, 0, tag)) + "extra", absl::StatusCode::kInvalidArgument,
       "bytes where the hello has"},
  };
  for (const Case& c : cases) {
    peer_auth::ServerHandshake server(Expect(key, tag));
    auto out = server.Feed(c.bytes);
    EXPECT_EQ(out.status().code(), c.code) << out.status();
    EXPECT_NE(out.status().message().find(c.text), std::string::npos) << out.status();
  }
  // The admit hook refuses too (the transport's: a taken lane, a
  // certificate that does not name the host).
  auto e = Expect(key, tag);
  e.admit = [](const peer_auth::Hello&) { return absl::AlreadyExistsError("lane taken"); };
  peer_auth::ServerHandshake server(std::move(e));
  auto out = server.Feed(peer_auth::EncodeHello(MakeHello(1, 0, 0, tag)));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kAlreadyExists) << out.status();
}

TEST(PeerAuthTest, BytesArriveInAnyPieces) {
  const auto key = peer_auth::MeshKey("t", "k", 1, "s");
  const auto tag = peer_auth::MeshTag("k", 1);
  peer_auth::ServerHandshake server(Expect(key, tag));
  peer_auth::ClientHandshake client(key, MakeHello(1, 0, 0, tag));
  std::string challenge;
  for (char b : client.hello_bytes()) {
    auto out = server.Feed(std::string(1, b));
    ASSERT_TRUE(out.ok()) << out.status();
    challenge += *out;
  }
  std::string proof;
  for (char b : challenge) {
    auto out = client.Feed(std::string(1, b));
    ASSERT_TRUE(out.ok()) << out.status();
    proof += *out;
  }
  std::string verdict;
  for (char b : proof) {
    auto out = server.Feed(std::string(1, b));
    ASSERT_TRUE(out.ok()) << out.status();
    verdict += *out;
  }
  ASSERT_TRUE(client.Feed(verdict).ok());
  EXPECT_TRUE(server.done() && client.done());
}

TEST(CertificateNamesTest, ANameCoversItsHostAndAWildcardOneLeftmostLabel) {
  EXPECT_TRUE(NameCoversHost("h1", "h1"));
  EXPECT_TRUE(NameCoversHost("H1", "h1"));
  EXPECT_FALSE(NameCoversHost("h1", "h10"));
  EXPECT_TRUE(NameCoversHost("*.nodes.example", "gpu-3.nodes.example"));
  EXPECT_FALSE(NameCoversHost("*.nodes.example", "a.gpu-3.nodes.example"));
  EXPECT_FALSE(NameCoversHost("*.nodes.example", "nodes.example"));
  EXPECT_FALSE(NameCoversHost("*.nodes.example", ".nodes.example"));
  EXPECT_FALSE(NameCoversHost("*", "h1"));
  EXPECT_FALSE(NameCoversHost("a*.nodes.example", "ab.nodes.example"));
}

// --- The transport ------------------------------------------------------

using ::collectived::testing::MemoryBook;

TransportSecurity Security(const std::string& token = "token", int generation = 1) {
  TransportSecurity s;
  s.key = peer_auth::MeshKey(token, "mesh", generation, "secret");
  s.tag = peer_auth::MeshTag("mesh", generation);
  s.description = "test mesh";
  return s;
}

std::vector<std::string> Hosts(int n) {
  std::vector<std::string> h;
  for (int i = 0; i < n; ++i) h.push_back(absl::StrCat("h", i));
  return h;
}

// What a transport reported through its callbacks.
struct Events {
  std::mutex mu;
  std::vector<std::pair<int, absl::Status>> breaks;
  void Add(int rank, const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu);
    breaks.emplace_back(rank, why);
  }
  std::vector<std::pair<int, absl::Status>> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return breaks;
  }
  bool WaitForBreak(absl::Duration limit) {
    const absl::Time end = absl::Now() + limit;
    while (absl::Now() < end) {
      if (!Get().empty()) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return false;
  }
};

// `n` hosts connected over loopback (threads), each with its events.
struct Mesh {
  MemoryBook book;
  std::vector<std::unique_ptr<Events>> events;  // outlive the hosts' callbacks
  std::vector<std::unique_ptr<HostTransport>> hosts;
};

std::unique_ptr<Mesh> ConnectMesh(int n, TransportOptions options = {},
                                  std::vector<TransportSecurity> security = {},
                                  absl::Status* failure = nullptr) {
  auto m = std::make_unique<Mesh>();
  std::vector<absl::StatusOr<std::unique_ptr<HostTransport>>> got;
  for (int h = 0; h < n; ++h) {
    got.emplace_back(absl::UnknownError("not run"));
    m->events.push_back(std::make_unique<Events>());
  }
  std::vector<std::thread> threads;
  for (int h = 0; h < n; ++h) {
    threads.emplace_back([&, h] {
      TransportOptions o = options;
      Events* ev = m->events[h].get();
      o.on_break = [ev](int rank, const absl::Status& why) { ev->Add(rank, why); };
      if (!o.on_query) {
        o.on_query = [h](int64_t seq) -> std::optional<std::string> {
          return absl::StrCat("host h", h, " at op ", seq);
        };
      }
      got[h] = HostTransport::Connect(m->book, "p", Hosts(n), h, "127.0.0.1",
                                      security.empty() ? Security() : security[h],
                                      absl::Now() + absl::Seconds(20), o);
    });
  }
  for (auto& t : threads) t.join();
  for (int h = 0; h < n; ++h) {
    if (!got[h].ok()) {
      if (failure != nullptr) {
        *failure = got[h].status();
      } else {
        ADD_FAILURE() << "host " << h << ": " << got[h].status();
      }
      return nullptr;
    }
    m->hosts.push_back(std::move(*got[h]));
  }
  return m;
}

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(HostTransportTest, MessagesArriveWholeAndInOrderOnEverySlotAndLane) {
  TransportOptions o;
  o.lanes = 2;
  o.frame_bytes = 64 * 1024;  // large messages span many frames
  auto m = ConnectMesh(3, o);
  ASSERT_NE(m, nullptr);
  // Every pair, both directions, both lanes: two messages on one slot (in
  // order), a large one over many frames, an empty one.
  struct Msg {
    int from, to, lane;
    uint64_t slot;
    size_t bytes;
  };
  std::vector<Msg> msgs;
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      if (a == b) continue;
      for (int lane = 0; lane < 2; ++lane) {
        msgs.push_back({a, b, lane, 7, 1000});
        msgs.push_back({a, b, lane, 7, 3000});
        msgs.push_back({a, b, lane, 9, 1 << 20});
        msgs.push_back({a, b, lane, 11, 0});
      }
    }
  }
  std::vector<std::vector<uint8_t>> src, dst;
  std::vector<std::unique_ptr<HostTransfer>> transfers;
  for (size_t i = 0; i < msgs.size(); ++i) {
    src.push_back(Pattern(msgs[i].bytes, static_cast<int>(i)));
    dst.emplace_back(msgs[i].bytes + 16, 0);  // receives may be larger
  }
  // Receives first for half, sends first for the other half.
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Msg& x = msgs[i];
    auto post_recv = [&] {
      auto r = m->hosts[x.to]->Recv(x.from, x.lane, x.slot, dst[i].data(), dst[i].size());
      ASSERT_TRUE(r.ok()) << r.status();
      transfers.push_back(*std::move(r));
    };
    auto post_send = [&] {
      auto s = m->hosts[x.from]->Send(x.to, x.lane, x.slot, src[i].data(), src[i].size());
      ASSERT_TRUE(s.ok()) << s.status();
      transfers.push_back(*std::move(s));
    };
    if (i % 2 == 0) {
      post_recv();
      post_send();
    } else {
      post_send();
      post_recv();
    }
  }
  for (auto& t : transfers) ASSERT_TRUE(t->Wait(absl::Now() + absl::Seconds(30)).ok());
  for (size_t i = 0; i < msgs.size(); ++i) {
    EXPECT_TRUE(std::equal(src[i].begin(), src[i].end(), dst[i].begin())) << "message " << i;
  }
  // A receive reports what came.
  std::vector<uint8_t> small(5, 1), big(100);
  auto r = m->hosts[0]->Recv(1, 0, 42, big.data(), big.size());
  auto s = m->hosts[1]->Send(0, 0, 42, small.data(), small.size());
  ASSERT_TRUE(r.ok() && s.ok());
  ASSERT_TRUE((*r)->Wait(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ((*r)->bytes(), 5u);
  for (auto& e : m->events) EXPECT_TRUE(e->Get().empty());
}

TEST(HostTransportTest, BadArgumentsAreRefused) {
  auto m = ConnectMesh(2);
  ASSERT_NE(m, nullptr);
  uint8_t b = 0;
  EXPECT_EQ(m->hosts[0]->Send(0, 0, 1, &b, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->hosts[0]->Send(2, 0, 1, &b, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->hosts[0]->Recv(1, 5, 1, &b, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(m->hosts[0]->broken().ok());
}

TEST(HostTransportTest, ABreakReachesEveryHostWithItsCodeAndReason) {
  auto m = ConnectMesh(3);
  ASSERT_NE(m, nullptr);
  // Host 0 waits for a message from host 1 and one from host 2.
  std::vector<uint8_t> a(10), b(10, 3);
  auto r1 = m->hosts[0]->Recv(1, 0, 5, a.data(), a.size());
  auto r2 = m->hosts[0]->Recv(2, 0, 5, b.data(), b.size());
  ASSERT_TRUE(r1.ok() && r2.ok());
  const absl::Status why = absl::DeadlineExceededError(
      "op 7 timed out after 1000 ms: members 0,1 are waiting in psum; missing: 2 (2) pid 9 host h2");
  const absl::Time start = absl::Now();
  m->hosts[2]->Break(why);
  // What waited on host 2 fails with its code and reason, at once.
  EXPECT_EQ((*r2)->Wait(absl::Now() + absl::Seconds(10)), why);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (int h : {0, 1}) {
    ASSERT_TRUE(m->events[h]->WaitForBreak(absl::Seconds(10))) << "host " << h;
    const auto breaks = m->events[h]->Get();
    ASSERT_EQ(breaks.size(), 1u) << "host " << h;  // once
    EXPECT_EQ(breaks[0].first, 2) << "host " << h;
    EXPECT_EQ(breaks[0].second, why) << "host " << h;
    // Nothing more comes from host 2, on either lane, and every attempt
    // says why.
    for (int lane : {0, 1}) {
      auto r = m->hosts[h]->Recv(2, lane, 6, a.data(), 1);
      const absl::Status st = r.ok() ? (*r)->Wait(absl::Now() + absl::Seconds(10)) : r.status();
      EXPECT_EQ(st, why) << "host " << h << " lane " << lane;
    }
    // The host itself did not break: what it still needs from a live host
    // arrives (an op another host finished just before it broke the mesh
    // completes here too).
    EXPECT_TRUE(m->hosts[h]->broken().ok());
  }
  std::vector<uint8_t> from1(10, 7);
  auto s1 = m->hosts[1]->Send(0, 0, 5, from1.data(), from1.size());
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_TRUE((*r1)->Wait(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(a, from1);
  // The breaking host itself reports nothing (it knows why).
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(m->events[2]->Get().empty());
  EXPECT_EQ(m->hosts[2]->broken(), why);
  // Idempotent: the first reason stands.
  m->hosts[2]->Break(absl::AbortedError("second"));
  EXPECT_EQ(m->hosts[2]->broken(), why);
}

TEST(HostTransportTest, ASendLongerThanItsReceiveBreaksTheTransportWithANameNotTheProcess) {
  auto m = ConnectMesh(2);
  ASSERT_NE(m, nullptr);
  std::vector<uint8_t> small(10), big(100, 7);
  auto r = m->hosts[0]->Recv(1, 0, 3, small.data(), small.size());
  auto s = m->hosts[1]->Send(0, 0, 3, big.data(), big.size());
  ASSERT_TRUE(r.ok() && s.ok());
  const absl::Status st = (*s)->Wait(absl::Now() + absl::Seconds(10));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_NE(st.message().find("posted a receive of 10 bytes for this host's send of 100 bytes"),
            std::string::npos)
      << st;
  const absl::Status got = (*r)->Wait(absl::Now() + absl::Seconds(10));
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted) << got;
  EXPECT_EQ(small, std::vector<uint8_t>(10, 0));
}

TEST(HostTransportTest, QueriesAreAnsweredAndAHostWithoutAnAnswerStaysSilent) {
  TransportOptions o;
  o.on_query = [](int64_t seq) -> std::optional<std::string> {
    if (seq == 13) return std::nullopt;
    return absl::StrCat("2 (1,0) pid 4 host somewhere at ", seq);
  };
  auto m = ConnectMesh(3, o);
  ASSERT_NE(m, nullptr);
  m->hosts[0]->Query(1, 12);
  m->hosts[0]->Query(2, 12);
  auto answers = m->hosts[0]->Answers({1, 2}, 12, absl::Now() + absl::Seconds(10));
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[1], "2 (1,0) pid 4 host somewhere at 12");
  m->hosts[0]->Query(1, 13);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(m->hosts[0]->Answers({1}, 13, start + absl::Milliseconds(200)).empty());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
}

TEST(HostTransportTest, AMissingHostIsNamedAtTheConnectDeadline) {
  MemoryBook book;
  for (int self : {0, 1}) {
    const absl::Time start = absl::Now();
    auto t = HostTransport::Connect(book, absl::StrCat("alone", self), Hosts(3), self, "127.0.0.1",
                                    Security(), start + absl::Milliseconds(400));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(550)) << t.status();
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(390)) << t.status();
    // Host 0 waits for h1 and h2 to connect; host 1 for h0's address.
    EXPECT_NE(t.status().message().find(self == 0 ? "h1 (lane 0)" : "addresses"),
              std::string::npos)
        << t.status();
  }
}

// A Connect with a long deadline, cancelled `after` in: its status, and how
// long it took.
std::pair<absl::Status, absl::Duration> ConnectCancelledAfter(MemoryBook& book,
                                                              const std::string& prefix, int self,
                                                              absl::Duration after) {
  std::atomic<bool> cancel{false};
  TransportOptions o;
  o.cancelled = [&cancel] { return cancel.load(); };
  const absl::Time start = absl::Now();
  std::thread canceller([&] {
    absl::SleepFor(after);
    cancel = true;
  });
  auto t = HostTransport::Connect(book, prefix, Hosts(2), self, "127.0.0.1", Security(),
                                  start + absl::Seconds(60), o);
  canceller.join();
  return {t.status(), absl::Now() - start};
}

// Cancelling a Connect ends it within a slice wherever it waits: for the
// other host to connect, for its address, for its answer to the handshake.
TEST(HostTransportTest, AConnectEndsPromptlyWhenCancelledWhereverItWaits) {
  MemoryBook book;
  for (int self : {0, 1}) {  // 0 accepts, 1 waits for 0's address
    auto [st, took] = ConnectCancelledAfter(book, absl::StrCat("c", self), self,
                                            absl::Milliseconds(200));
    EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
    EXPECT_NE(st.message().find("was cancelled"), std::string::npos) << st;
    EXPECT_GE(took, absl::Milliseconds(190));
    EXPECT_LT(took, absl::Seconds(5)) << st;
  }
  // Host 0's address leads to a listener that accepts and never answers.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_TRUE(book.Publish("silent/addr/0", absl::StrCat("127.0.0.1:", ntohs(a.sin_port))).ok());
  auto [st, took] = ConnectCancelledAfter(book, "silent", 1, absl::Milliseconds(200));
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_LT(took, absl::Seconds(5)) << st;
  close(listener);
  // Cancelled as it starts.
  auto [now, quick] = ConnectCancelledAfter(book, "c9", 0, absl::ZeroDuration());
  EXPECT_EQ(now.code(), absl::StatusCode::kCancelled) << now;
  EXPECT_LT(quick, absl::Seconds(5)) << now;
}

// An address book whose store is unreachable for its first `outage`.
class FlakyBook final : public AddressBook {
 public:
  explicit FlakyBook(absl::Duration outage) : until_(absl::Now() + outage) {}
  absl::Status Publish(const std::string& key, const std::string& value) override {
    return book_.Publish(key, value);
  }
  absl::StatusOr<std::vector<std::string>> Lookup(const std::vector<std::string>& keys,
                                                  absl::Time deadline) override {
    if (absl::Now() < until_) {
      absl::SleepFor(std::min(until_, deadline) - absl::Now());
      return absl::UnavailableError("the store is unreachable");
    }
    return book_.Lookup(keys, deadline);
  }

 private:
  const absl::Time until_;
  MemoryBook book_;
};

// A cancellable Connect waits for the address book in slices, and still
// rides out a store that is unreachable for longer than a slice.
TEST(HostTransportTest, ACancellableConnectRidesOutAnUnreachableStore) {
  FlakyBook book(absl::Milliseconds(700));
  std::atomic<bool> never{false};
  TransportOptions o;
  o.cancelled = [&never] { return never.load(); };
  absl::StatusOr<std::unique_ptr<HostTransport>> got[2];
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      got[h] = HostTransport::Connect(book, "flaky", Hosts(2), h, "127.0.0.1", Security(),
                                      absl::Now() + absl::Seconds(20), o);
    });
  }
  for (auto& t : hosts) t.join();
  EXPECT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_TRUE(got[1].ok()) << got[1].status();
}

// --- Strangers and hostile peers --------------------------------------------

// A plain TCP connection to "host:port" (blocking); -1 on failure.
int Dial(const std::string& address) {
  const size_t colon = address.rfind(':');
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints,
                  &res) != 0) {
    return -1;
  }
  const int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    close(fd);
    freeaddrinfo(res);
    return -1;
  }
  freeaddrinfo(res);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool WriteAll(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

std::string ReadUpTo(int fd, size_t n) {
  std::string out(n, '\0');
  size_t at = 0;
  while (at < n) {
    const ssize_t r = recv(fd, out.data() + at, n - at, 0);
    if (r <= 0) break;
    at += static_cast<size_t>(r);
  }
  out.resize(at);
  return out;
}

// Completes the handshake on `fd` as rank `from` to rank `to`, lane `lane`;
// true when the accepting end took it.
bool Handshake(int fd, const TransportSecurity& sec, uint32_t from, uint32_t to, uint32_t lane) {
  peer_auth::ClientHandshake hs(sec.key, MakeHello(from, to, lane, sec.tag));
  if (!WriteAll(fd, hs.hello_bytes())) return false;
  while (!hs.done()) {
    const std::string in = ReadUpTo(fd, hs.wanted());
    if (in.empty()) return false;
    auto out = hs.Feed(in);
    if (!out.ok()) return false;
    if (!out->empty() && !WriteAll(fd, *out)) return false;
  }
  return true;
}

// A frame as the transport writes it (host_transport.cc).
std::string Frame(uint32_t type, uint32_t length, uint64_t slot, uint64_t total, uint64_t offset,
                  const std::string& payload = "") {
  std::string f(32, '\0');
  auto put = [&](size_t at, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) f[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(0, type, 4);
  put(4, length, 4);
  put(8, slot, 8);
  put(16, total, 8);
  put(24, offset, 8);
  return f + payload;
}

// Host 0 of two, connecting while rank 1 is played by raw sockets: `play`
// gets host 0's address and returns once rank 1's single lane is connected
// (or not). The transport, once connected.
absl::StatusOr<std::unique_ptr<HostTransport>> HostZeroWith(
    MemoryBook& book, const std::function<void(const std::string&)>& play, Events* events,
    absl::Duration limit = absl::Seconds(10)) {
  TransportOptions o;
  o.lanes = 1;
  o.handshake_timeout = absl::Milliseconds(500);
  o.on_break = [events](int rank, const absl::Status& why) { events->Add(rank, why); };
  absl::StatusOr<std::unique_ptr<HostTransport>> t = absl::UnknownError("not run");
  std::thread host0([&] {
    t = HostTransport::Connect(book, "raw", Hosts(2), 0, "127.0.0.1", Security(),
                               absl::Now() + limit, o);
  });
  play(book.Wait("raw/addr/0"));
  host0.join();
  return t;
}

// Host 0 of two with rank 1 played by a raw socket that completed the
// handshake (into *peer): what a connected host that goes rogue can send.
absl::StatusOr<std::unique_ptr<HostTransport>> HostZeroWithRawPeer(MemoryBook& book, int* peer,
                                                                   Events* events) {
  return HostZeroWith(book, [&](const std::string& address) {
    *peer = Dial(address);
    ASSERT_GE(*peer, 0);
    ASSERT_TRUE(Handshake(*peer, Security(), 1, 0, 0));
  }, events);
}

TEST(HostTransportTest, StrangersNeitherJoinNorDelayTheMesh) {
  MemoryBook book;
  Events events;
  int peer = -1;
  const absl::Time start = absl::Now();
  auto t = HostZeroWith(book, [&](const std::string& address) {
    // Garbage, an HTTP request, a hello for another mesh, a hello with a
    // wrong key (and its made-up proof), a connection that says nothing,
    // and a thousand bytes of zeros: each refused, side by side.
    std::vector<int> strangers;
    auto stranger = [&](const std::string& bytes) {
      const int fd = Dial(address);
      ASSERT_GE(fd, 0);
      if (!bytes.empty()) WriteAll(fd, bytes);
      strangers.push_back(fd);
    };
    stranger("\x01\x02garbage");
    stranger("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    stranger(peer_auth::EncodeHello(MakeHello(1, 0, 0, peer_auth::MeshTag("mesh", 2))));
    stranger(std::string(1000, '\0'));
    stranger("");
    {
      const int fd = Dial(address);
      ASSERT_GE(fd, 0);
      EXPECT_FALSE(Handshake(fd, Security("wrong-token"), 1, 0, 0));
      strangers.push_back(fd);
    }
    // The real rank 1 connects among them.
    peer = Dial(address);
    ASSERT_GE(peer, 0);
    ASSERT_TRUE(Handshake(peer, Security(), 1, 0, 0));
    // Refused strangers are closed by host 0.
    for (int fd : strangers) {
      const std::string rest = ReadUpTo(fd, 1 << 16);
      EXPECT_LE(rest.size(), peer_auth::kChallengeBytes);
      close(fd);
    }
  }, &events);
  ASSERT_TRUE(t.ok()) << t.status();
  // The silent stranger did not hold the mesh up for its handshake time.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The mesh works with the real peer: a message from it arrives.
  std::vector<uint8_t> in(4);
  auto r = (*t)->Recv(1, 0, 1, in.data(), in.size());
  ASSERT_TRUE(r.ok());
  // Its READY came first; then the data.
  const std::string ready = ReadUpTo(peer, 32);
  ASSERT_EQ(ready.size(), 32u);
  ASSERT_TRUE(WriteAll(peer, Frame(2, 4, 1, 4, 0, "abcd")));
  ASSERT_TRUE((*r)->Wait(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(std::string(in.begin(), in.end()), "abcd");
  close(peer);
  // A peer whose connection ends without a BREAK is gone.
  ASSERT_TRUE(events.WaitForBreak(absl::Seconds(10)));
  const absl::Status gone = events.Get()[0].second;
  EXPECT_EQ(gone.code(), absl::StatusCode::kAborted) << gone;
  EXPECT_NE(gone.message().find("host h1 is gone"), std::string::npos) << gone;
  r->reset();
}

TEST(HostTransportTest, AFloodOfConnectionsIsCappedAndTheRealPeerStillConnects) {
  MemoryBook book;
  Events events;
  auto t = HostZeroWith(book, [&](const std::string& address) {
    std::vector<int> flood;
    for (int i = 0; i < 100; ++i) {
      const int fd = Dial(address);
      if (fd >= 0) flood.push_back(fd);
    }
    // Past the cap, connections are closed at once; the rest time out.
    absl::SleepFor(absl::Milliseconds(600));
    const int peer = Dial(address);
    ASSERT_GE(peer, 0);
    EXPECT_TRUE(Handshake(peer, Security(), 1, 0, 0));
    for (int fd : flood) close(fd);
    close(peer);
  }, &events);
  ASSERT_TRUE(t.ok()) << t.status();
}

// Connected peers that send what no honest host sends: the transport
// breaks, naming the host and what it sent; the process goes on.
TEST(HostTransportTest, NothingAConnectedPeerSendsEndsTheProcess) {
  struct Case {
    std::string name;
    std::function<std::string()> bytes;  // after the handshake
    std::string text;                    // in the break's reason
  };
  const std::vector<Case> cases = {
      {"data nobody asked for", [] { return Frame(2, 4, 99, 4, 0, "abcd"); },
       "that no receive asked for"},
      {"an unknown frame", [] { return Frame(77, 0, 0, 0, 0); }, "unknown type 77"},
      {"a frame past its message", [] { return Frame(2, 10, 1, 4, 0); }, "a frame of 10 bytes"},
      {"a huge reason", [] { return Frame(3, 1u << 30, 10, 0, 0); }, "a text of"},
      {"a ready with a payload", [] { return Frame(1, 5, 1, 4, 0, "xxxxx"); },
       "a control frame with a payload"},
      {"a message larger than its receive",
       [] { return Frame(2, 64, 1, 64, 0, std::string(64, 'x')); }, "for a receive of 4 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    MemoryBook book;
    Events events;
    int peer = -1;
    auto t = HostZeroWithRawPeer(book, &peer, &events);
    ASSERT_TRUE(t.ok()) << t.status();
    std::vector<uint8_t> in(4);
    auto r = (*t)->Recv(1, 0, 1, in.data(), in.size());
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(WriteAll(peer, c.bytes()));
    const absl::Status st = (*r)->Wait(absl::Now() + absl::Seconds(10));
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    EXPECT_NE(st.message().find("host h1 sent what this host cannot accept"), std::string::npos)
        << st;
    EXPECT_NE(st.message().find(c.text), std::string::npos) << st;
    ASSERT_TRUE(events.WaitForBreak(absl::Seconds(5)));
    // Host 0 tells the peer why, then shuts its end.
    const std::string told = ReadUpTo(peer, 1 << 16);
    EXPECT_NE(told.find("cannot accept"), std::string::npos);
    close(peer);
    r->reset();
  }
}

TEST(HostTransportTest, RandomBytesFromAConnectedPeerNeverEndTheProcess) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 30; ++round) {
    MemoryBook book;
    Events events;
    int peer = -1;
    auto t = HostZeroWithRawPeer(book, &peer, &events);
    ASSERT_TRUE(t.ok()) << t.status();
    std::vector<uint8_t> in(64);
    auto r = (*t)->Recv(1, 0, rng() % 4, in.data(), in.size());
    ASSERT_TRUE(r.ok());
    std::string junk(rng() % 300 + 1, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    // Sometimes a plausible frame type leads.
    if (round % 3 == 0) junk[0] = static_cast<char>(1 + rng() % 5);
    WriteAll(peer, junk);
    close(peer);
    // Whatever it was, the receive ends (done, or failed with a reason).
    const absl::Status st = (*r)->Wait(absl::Now() + absl::Seconds(10));
    if (!st.ok()) {
      EXPECT_FALSE(st.message().empty());
    }
    r->reset();
  }
}

// --- TLS ----------------------------------------------------------------

// Certificates for hosts h0 and h1 from a CA, one naming "h9" from the same
// CA, and one for h1 from another CA; in `dir`. False when openssl is
// missing.
bool MakeCertificates(const std::string& dir, std::string* why) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    *why = "openssl is not installed";
    return false;
  }
  const std::string script = absl::StrCat("cd '", dir, R"(' && set -e
for ca in ca rogue; do
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=$ca -keyout $ca.key -out $ca.pem 2>/dev/null
done
cert() {  # name ca
  printf 'subjectAltName=DNS:%s,IP:127.0.0.1\n' $1 > $1.ext
  openssl req -newkey rsa:2048 -nodes -subj /CN=$1 -keyout $1-$2.key -out $1-$2.csr 2>/dev/null
  openssl x509 -req -in $1-$2.csr -CA $2.pem -CAkey $2.key -CAcreateserial -days 1 \
    -extfile $1.ext -out $1-$2.pem 2>/dev/null
}
cert h0 ca; cert h1 ca; cert h9 ca; cert h1 rogue
)");
  if (std::system(script.c_str()) != 0) {
    *why = "openssl failed to make the certificates";
    return false;
  }
  return true;
}

std::shared_ptr<const TlsConfig> Tls(const std::string& dir, const std::string& name,
                                     const std::string& ca) {
  auto c = TlsConfig::Load({absl::StrCat(dir, "/", name, "-", ca, ".pem"),
                            absl::StrCat(dir, "/", name, "-", ca, ".key"),
                            absl::StrCat(dir, "/ca.pem")});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::string TempDir() {
  char tmpl[] = "/tmp/collectived-tls-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d == nullptr ? "/tmp" : d;
}

TEST(HostTransportTest, OverTlsEveryCertificateMustNameItsHost) {
  const std::string dir = TempDir();
  std::string why;
  if (!MakeCertificates(dir, &why)) GTEST_SKIP() << why;
  // A certificate names its host; another name is refused at load time by
  // the daemon (NamesHost).
  auto h0 = Tls(dir, "h0", "ca");
  ASSERT_NE(h0, nullptr);
  EXPECT_TRUE(h0->NamesHost("h0").ok());
  EXPECT_EQ(h0->NamesHost("h1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h0->NamesHost("h1").message().find("carries names h0, h0"), std::string::npos)
      << h0->NamesHost("h1");

  auto with = [&](const std::string& second, const std::string& ca) {
    std::vector<TransportSecurity> sec(2, Security());
    sec[0].tls = Tls(dir, "h0", "ca");
    sec[1].tls = Tls(dir, second, ca);
    return sec;
  };
  {
    // Good certificates: messages go through TLS.
    auto m = ConnectMesh(2, {}, with("h1", "ca"));
    ASSERT_NE(m, nullptr);
    std::vector<uint8_t> src = Pattern(3 << 20, 5), dst(3 << 20);
    auto r = m->hosts[0]->Recv(1, 1, 4, dst.data(), dst.size());
    auto s = m->hosts[1]->Send(0, 1, 4, src.data(), src.size());
    ASSERT_TRUE(r.ok() && s.ok());
    ASSERT_TRUE((*r)->Wait(absl::Now() + absl::Seconds(30)).ok());
    EXPECT_EQ(src, dst);
  }
  // Rank 1 with a certificate for another host, or of another CA: refused.
  for (const auto& [name, ca] : {std::pair<std::string, std::string>{"h9", "ca"},
                                 std::pair<std::string, std::string>{"h1", "rogue"}}) {
    SCOPED_TRACE(name + " " + ca);
    std::vector<TransportSecurity> sec = with(name, ca);
    for (auto& s : sec) s.description = "tls test";
    MemoryBook book;
    std::vector<absl::StatusOr<std::unique_ptr<HostTransport>>> got;
    for (int h = 0; h < 2; ++h) got.emplace_back(absl::UnknownError("x"));
    std::vector<std::thread> threads;
    for (int h = 0; h < 2; ++h) {
      threads.emplace_back([&, h] {
        TransportOptions o;
        o.handshake_timeout = absl::Seconds(1);
        got[h] = HostTransport::Connect(book, "p", Hosts(2), h, "127.0.0.1", sec[h],
                                        absl::Now() + absl::Seconds(2), o);
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_FALSE(got[0].ok());
    EXPECT_FALSE(got[1].ok());
    EXPECT_EQ(got[1].status().code(), absl::StatusCode::kPermissionDenied) << got[1].status();
  }
  // A plaintext peer cannot talk to a TLS host.
  {
    std::vector<TransportSecurity> sec(2, Security());
    sec[0].tls = Tls(dir, "h0", "ca");
    absl::Status failure;
    MemoryBook book;
    std::vector<absl::StatusOr<std::unique_ptr<HostTransport>>> got;
    for (int h = 0; h < 2; ++h) got.emplace_back(absl::UnknownError("x"));
    std::vector<std::thread> threads;
    for (int h = 0; h < 2; ++h) {
      threads.emplace_back([&, h] {
        got[h] = HostTransport::Connect(book, "p", Hosts(2), h, "127.0.0.1", sec[h],
                                        absl::Now() + absl::Seconds(2));
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_FALSE(got[0].ok());
    EXPECT_FALSE(got[1].ok());
  }
}

}  // namespace
}  // namespace collectived
