// Authentication of the connections between the daemons of a mesh.
//
// Every connection between two hosts of a mesh generation proves, before a
// byte of the mesh's traffic crosses it, that both ends hold that
// generation's key: a key derived (HMAC-SHA256) from the cluster token, the
// mesh key, the generation and a random secret the registry hands only to
// the generation's hosts. A stranger who reaches the port cannot complete
// the handshake, a recorded handshake cannot be replayed (each side brings a
// fresh nonce), and a connection of another mesh or generation is told
// apart by its tag. With TLS the same handshake runs inside the TLS session
// (host_transport.h), so the certificates prove who the host is and the key
// what it is connecting for.
//
// The handshake, all fields fixed-size, integers little-endian:
//
//   1. Hello     (connecting host -> accepting host, kHelloBytes):
//                magic "CDLINK01", lane, from rank, to rank, reserved,
//                mesh tag (32), client nonce (32).
//   2. Challenge (accepting -> connecting, kChallengeBytes): magic, server
//                nonce (32), server MAC = HMAC(key, "server" | Hello | nonce).
//   3. Proof     (connecting -> accepting, kProofBytes): client MAC =
//                HMAC(key, "client" | Hello | server nonce).
//   4. Verdict   (accepting -> connecting, 1 byte 'A'): the connection is
//                the mesh's. A refusal is a closed connection, never a reason
//                a stranger could learn from.
//
// ServerHandshake and ClientHandshake are the two ends as state machines fed
// with the bytes that arrived (so the transport drives them on non-blocking
// sockets, and the fuzzer drives them with anything): they never read past
// what they are given and refuse any byte beyond the message they expect.
// Not thread-safe; one object per connection attempt.
#ifndef COLLECTIVED_DAEMON_CLUSTER_PEER_AUTH_H_
#define COLLECTIVED_DAEMON_CLUSTER_PEER_AUTH_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace collectived::peer_auth {

inline constexpr size_t kKeyBytes = 32;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kTagBytes = 32;
inline constexpr size_t kMagicBytes = 8;
inline constexpr size_t kHelloBytes = kMagicBytes + 4 * 4 + kTagBytes + kNonceBytes;
inline constexpr size_t kChallengeBytes = kMagicBytes + kNonceBytes + kMacBytes;
inline constexpr size_t kProofBytes = kMacBytes;
inline constexpr size_t kVerdictBytes = 1;
inline constexpr char kAccepted = 'A';

using Key = std::array<uint8_t, kKeyBytes>;
using Tag = std::array<uint8_t, kTagBytes>;

// The key of the connections of generation `generation` of mesh `mesh_key`:
// HMAC-SHA256 keyed by the cluster token ("" when the cluster has none) over
// the mesh key, the generation and the registry's secret for it.
Key MeshKey(absl::string_view cluster_token, absl::string_view mesh_key, int64_t generation,
            absl::string_view generation_secret);
// The non-secret name of that generation's connections (SHA-256 of the mesh
// key and generation): tells a connection of another mesh from a stranger.
Tag MeshTag(absl::string_view mesh_key, int64_t generation);

// What a Hello says.
struct Hello {
  uint32_t lane = 0;
  uint32_t from_rank = 0;
  uint32_t to_rank = 0;
  Tag tag{};
  std::array<uint8_t, kNonceBytes> nonce{};
};

// What the accepting end expects of a connection.
struct ServerExpectation {
  Key key{};
  Tag tag{};
  int self = 0;   // this host's rank
  int hosts = 0;  // ranks in the mesh
  int lanes = 0;  // connections per pair of hosts
  // Called with the Hello once it is well-formed and for this mesh, before
  // the challenge goes out: a non-OK answer refuses the connection (the
  // transport checks that the rank connects to this host, that the lane is
  // not taken, and, with TLS, that the certificate names the rank's host).
  std::function<absl::Status(const Hello&)> admit;
};

// The accepting end. Feed it what arrives; it says what to send back.
class ServerHandshake {
 public:
  explicit ServerHandshake(ServerExpectation expectation);
  // Takes the next bytes that arrived. Returns the bytes to send (possibly
  // none), or why the connection is refused (PERMISSION_DENIED for a wrong
  // proof, INVALID_ARGUMENT for bytes that are no handshake of this
  // version, FAILED_PRECONDITION for another mesh or a refused admit); after
  // a refusal every later call refuses too.
  absl::StatusOr<std::string> Feed(absl::string_view bytes);
  // The connection is authenticated (the verdict was produced).
  bool done() const { return state_ == State::kDone; }
  // How many more bytes the message now awaited needs (0 when done or
  // refused): the transport reads no further, since what follows the
  // handshake is the mesh's traffic.
  size_t wanted() const;
  const Hello& hello() const { return hello_; }

 private:
  enum class State { kHello, kProof, kDone, kRefused };
  absl::StatusOr<std::string> Refuse(absl::Status why);
  ServerExpectation expect_;
  State state_ = State::kHello;
  std::string in_;
  std::string hello_bytes_;
  Hello hello_;
  std::array<uint8_t, kNonceBytes> server_nonce_{};
  absl::Status refused_;
};

// The connecting end.
class ClientHandshake {
 public:
  // `hello.nonce` must be fresh for every attempt (RandomBytes, util/random_id.h); tests and
  // the fuzzer give fixed ones for reproducible transcripts.
  ClientHandshake(const Key& key, const Hello& hello);
  // The Hello to send first.
  const std::string& hello_bytes() const { return hello_bytes_; }
  // Takes the next bytes that arrived; returns the bytes to send (the proof
  // once the challenge is complete), or why the accepting end is not the
  // mesh's host (PERMISSION_DENIED: it does not hold the key;
  // INVALID_ARGUMENT: not this handshake).
  absl::StatusOr<std::string> Feed(absl::string_view bytes);
  // The proof went out; the verdict is awaited.
  bool proved() const { return state_ == State::kVerdict || state_ == State::kDone; }
  // The accepting end took the proof.
  bool done() const { return state_ == State::kDone; }
  // How many more bytes the message now awaited needs (as the server's).
  size_t wanted() const;

 private:
  enum class State { kChallenge, kVerdict, kDone, kRefused };
  Key key_;
  std::string hello_bytes_;
  State state_ = State::kChallenge;
  std::string in_;
  absl::Status refused_;
};

// Encodes a Hello (kHelloBytes).
std::string EncodeHello(const Hello& hello);

}  // namespace collectived::peer_auth

#endif  // COLLECTIVED_DAEMON_CLUSTER_PEER_AUTH_H_
