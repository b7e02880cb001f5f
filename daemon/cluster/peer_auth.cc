#include "daemon/cluster/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/util/random_id.h"

namespace collectived::peer_auth {
namespace {

constexpr char kMagic[kMagicBytes] = {'C', 'D', 'L', 'I', 'N', 'K', '0', '1'};

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// A length-prefixed field, so that no two inputs of the derivations read
// the same.
void PutField(std::string& out, absl::string_view s) {
  PutU64(out, s.size());
  out.append(s.data(), s.size());
}

std::array<uint8_t, kMacBytes> Hmac(absl::string_view key, absl::string_view message) {
  std::array<uint8_t, kMacBytes> mac{};
  unsigned int len = 0;
  // An empty key is a valid HMAC key (the cluster has no token): OpenSSL
  // wants a non-null pointer for it.
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &len);
  return mac;
}

absl::string_view View(const uint8_t* p, size_t n) {
  return absl::string_view(reinterpret_cast<const char*>(p), n);
}

// The MAC each end proves the key with: over the role, the Hello as sent
// and the accepting end's nonce.
std::array<uint8_t, kMacBytes> RoleMac(const Key& key, absl::string_view role,
                                       absl::string_view hello_bytes,
                                       absl::string_view server_nonce) {
  std::string m;
  PutField(m, role);
  PutField(m, hello_bytes);
  PutField(m, server_nonce);
  return Hmac(View(key.data(), key.size()), m);
}

bool SameMac(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kMacBytes) == 0; }

// Takes from `bytes` what the message of `size` still needs into `in`;
// INVALID_ARGUMENT when more arrived than the message holds (each end sends
// one message and waits for the answer).
absl::Status Gather(std::string& in, absl::string_view bytes, size_t size, const char* what) {
  if (in.size() + bytes.size() > size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the peer sent ", in.size() + bytes.size(), " bytes where the ", what, " has ", size));
  }
  in.append(bytes.data(), bytes.size());
  return absl::OkStatus();
}

}  // namespace

Key MeshKey(absl::string_view cluster_token, absl::string_view mesh_key, int64_t generation,
            absl::string_view generation_secret) {
  std::string m;
  PutField(m, "collectived mesh key v1");
  PutField(m, mesh_key);
  PutU64(m, static_cast<uint64_t>(generation));
  PutField(m, generation_secret);
  return Hmac(cluster_token, m);
}

Tag MeshTag(absl::string_view mesh_key, int64_t generation) {
  std::string m;
  PutField(m, "collectived mesh tag v1");
  PutField(m, mesh_key);
  PutU64(m, static_cast<uint64_t>(generation));
  Tag tag{};
  SHA256(reinterpret_cast<const unsigned char*>(m.data()), m.size(), tag.data());
  return tag;
}

std::string EncodeHello(const Hello& hello) {
  std::string out(kMagic, kMagicBytes);
  PutU32(out, hello.lane);
  PutU32(out, hello.from_rank);
  PutU32(out, hello.to_rank);
  PutU32(out, 0);
  out.append(reinterpret_cast<const char*>(hello.tag.data()), hello.tag.size());
  out.append(reinterpret_cast<const char*>(hello.nonce.data()), hello.nonce.size());
  return out;
}

ServerHandshake::ServerHandshake(ServerExpectation expectation)
    : expect_(std::move(expectation)) {}

absl::StatusOr<std::string> ServerHandshake::Refuse(absl::Status why) {
  state_ = State::kRefused;
  refused_ = why;
  return why;
}

absl::StatusOr<std::string> ServerHandshake::Feed(absl::string_view bytes) {
  switch (state_) {
    case State::kRefused:
      return refused_;
    case State::kDone:
      if (bytes.empty()) return std::string();
      return Refuse(absl::InvalidArgumentError("the peer sent bytes before the verdict"));
    case State::kHello: {
      if (absl::Status st = Gather(in_, bytes, kHelloBytes, "hello"); !st.ok()) return Refuse(st);
      if (in_.size() < kHelloBytes) {
        // A wrong magic is refused as soon as it shows.
        if (std::memcmp(in_.data(), kMagic, std::min(in_.size(), kMagicBytes)) != 0) {
          return Refuse(absl::InvalidArgumentError(
              "not a collectived data connection (or one of another version)"));
        }
        return std::string();
      }
      const char* p = in_.data();
      if (std::memcmp(p, kMagic, kMagicBytes) != 0) {
        return Refuse(absl::InvalidArgumentError(
            "not a collectived data connection (or one of another version)"));
      }
      p += kMagicBytes;
      hello_.lane = GetU32(p);
      hello_.from_rank = GetU32(p + 4);
      hello_.to_rank = GetU32(p + 8);
      p += 16;
      std::memcpy(hello_.tag.data(), p, kTagBytes);
      std::memcpy(hello_.nonce.data(), p + kTagBytes, kNonceBytes);
      if (CRYPTO_memcmp(hello_.tag.data(), expect_.tag.data(), kTagBytes) != 0) {
        return Refuse(absl::FailedPreconditionError(
            "a connection for another mesh or generation"));
      }
      if (hello_.to_rank != static_cast<uint32_t>(expect_.self) ||
          hello_.from_rank >= static_cast<uint32_t>(expect_.hosts) ||
          hello_.from_rank == static_cast<uint32_t>(expect_.self) ||
          hello_.lane >= static_cast<uint32_t>(expect_.lanes)) {
        return Refuse(absl::FailedPreconditionError(absl::StrCat(
            "a hello from rank ", hello_.from_rank, " to rank ", hello_.to_rank, " on lane ",
            hello_.lane, " (this host is rank ", expect_.self, " of ", expect_.hosts, ", with ",
            expect_.lanes, " lanes)")));
      }
      if (expect_.admit) {
        if (absl::Status st = expect_.admit(hello_); !st.ok()) return Refuse(st);
      }
      hello_bytes_ = std::move(in_);
      in_.clear();
      const std::string nonce = collectived::RandomBytes(kNonceBytes);
      std::memcpy(server_nonce_.data(), nonce.data(), kNonceBytes);
      const auto mac = RoleMac(expect_.key, "server", hello_bytes_, nonce);
      std::string out(kMagic, kMagicBytes);
      out += nonce;
      out.append(reinterpret_cast<const char*>(mac.data()), mac.size());
      state_ = State::kProof;
      return out;
    }
    case State::kProof: {
      if (absl::Status st = Gather(in_, bytes, kProofBytes, "proof"); !st.ok()) return Refuse(st);
      if (in_.size() < kProofBytes) return std::string();
      const auto want = RoleMac(expect_.key, "client", hello_bytes_,
                                View(server_nonce_.data(), server_nonce_.size()));
      if (!SameMac(want.data(), reinterpret_cast<const uint8_t*>(in_.data()))) {
        return Refuse(absl::PermissionDeniedError(
            "the peer's proof is wrong: it does not hold this mesh generation's key (another "
            "cluster token, or not a host of the mesh)"));
      }
      state_ = State::kDone;
      return std::string(1, kAccepted);
    }
  }
  return Refuse(absl::InternalError("handshake state"));
}

size_t ServerHandshake::wanted() const {
  switch (state_) {
    case State::kHello: return kHelloBytes - in_.size();
    case State::kProof: return kProofBytes - in_.size();
    default: return 0;
  }
}

size_t ClientHandshake::wanted() const {
  switch (state_) {
    case State::kChallenge: return kChallengeBytes - in_.size();
    case State::kVerdict: return kVerdictBytes;
    default: return 0;
  }
}

ClientHandshake::ClientHandshake(const Key& key, const Hello& hello)
    : key_(key), hello_bytes_(EncodeHello(hello)) {}

absl::StatusOr<std::string> ClientHandshake::Feed(absl::string_view bytes) {
  auto refuse = [this](absl::Status why) -> absl::StatusOr<std::string> {
    state_ = State::kRefused;
    refused_ = why;
    return why;
  };
  switch (state_) {
    case State::kRefused:
      return refused_;
    case State::kDone:
      if (bytes.empty()) return std::string();
      return refuse(absl::InvalidArgumentError("the peer sent bytes after its verdict"));
    case State::kChallenge: {
      if (absl::Status st = Gather(in_, bytes, kChallengeBytes, "challenge"); !st.ok()) {
        return refuse(st);
      }
      if (in_.size() < kChallengeBytes) return std::string();
      if (std::memcmp(in_.data(), kMagic, kMagicBytes) != 0) {
        return refuse(absl::InvalidArgumentError(
            "the peer is not a collectived host (or one of another version)"));
      }
      const absl::string_view nonce(in_.data() + kMagicBytes, kNonceBytes);
      const auto want = RoleMac(key_, "server", hello_bytes_, nonce);
      if (!SameMac(want.data(),
                   reinterpret_cast<const uint8_t*>(in_.data() + kMagicBytes + kNonceBytes))) {
        return refuse(absl::PermissionDeniedError(
            "the peer does not hold this mesh generation's key (another cluster token, or "
            "not a host of the mesh)"));
      }
      const auto mac = RoleMac(key_, "client", hello_bytes_, nonce);
      in_.clear();
      state_ = State::kVerdict;
      return std::string(View(mac.data(), mac.size()));
    }
    case State::kVerdict: {
      if (bytes.empty()) return std::string();
      if (bytes.size() != kVerdictBytes || bytes[0] != kAccepted) {
        return refuse(absl::InvalidArgumentError("the peer's verdict is not a handshake byte"));
      }
      state_ = State::kDone;
      return std::string();
    }
  }
  return refuse(absl::InternalError("handshake state"));
}

}  // namespace collectived::peer_auth
