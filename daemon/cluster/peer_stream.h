// PeerStream: the byte stream of one connection between two daemons, on a
// non-blocking socket: plain, or TLS (OpenSSL) with certificates on both
// ends. TlsConfig: the daemon's certificate, key and the cluster's CA, and
// the check that a certificate names a host id.
//
// A host's certificate names its host id when the id is one of its DNS
// subject alternative names or its subject's common name (ignoring case; a
// wildcard "*.rest" covers one leftmost label: NameCoversHost,
// coordinator.h). Both ends of a TLS connection present certificates signed by the
// cluster's CA (mutual TLS), and the transport checks the peer's against the
// host it expects at that rank of the mesh.
//
// Thread-safety: a PeerStream may be read by one thread while another
// writes it (the plain socket's two directions are independent; TLS calls
// are serialized by the stream's own lock). TlsConfig is immutable once
// loaded and shared by every connection.
#ifndef COLLECTIVED_DAEMON_CLUSTER_PEER_STREAM_H_
#define COLLECTIVED_DAEMON_CLUSTER_PEER_STREAM_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sync.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace collectived {

struct TlsFiles {
  std::string cert;  // PEM certificate chain
  std::string key;   // PEM private key
  std::string ca;    // PEM CA bundle that signs every host's certificate
};

class TlsConfig {
 public:
  // Loads and checks the files (INVALID_ARGUMENT naming the file and what
  // is wrong with it: unreadable, not PEM, a key that does not match the
  // certificate, no CA).
  static absl::StatusOr<std::shared_ptr<const TlsConfig>> Load(const TlsFiles& files);
  ~TlsConfig();
  TlsConfig(const TlsConfig&) = delete;
  TlsConfig& operator=(const TlsConfig&) = delete;

  // OK when this daemon's own certificate names `host_id`; else
  // INVALID_ARGUMENT saying which names it carries.
  absl::Status NamesHost(absl::string_view host_id) const;
  // For both ends: TLS 1.3, peer certificate required and verified
  // against the CA.
  SSL_CTX* context() const { return ctx_; }

 private:
  TlsConfig() = default;
  SSL_CTX* ctx_ = nullptr;
  std::string names_;  // the names the certificate carries, for messages
  std::vector<std::string> name_list_;
};

// OK when the peer of `ssl` presented a certificate (verified against the
// CA by the handshake) that names `host_id`; PERMISSION_DENIED naming what
// it carries otherwise.
absl::Status PeerNamesHost(SSL* ssl, absl::string_view host_id);

class PeerStream {
 public:
  enum class Io {
    kOk,         // progress (or done)
    kWantRead,   // wait until the socket is readable
    kWantWrite,  // wait until the socket is writable
    kClosed,     // the peer closed its end (end of stream)
    kError,      // see the error text
  };

  // Takes `fd` (non-blocking, connected); closes it when destroyed.
  static std::unique_ptr<PeerStream> Plain(int fd);
  // TLS over `fd` as the accepting (`server`) or the connecting end;
  // Handshake() runs it.
  static absl::StatusOr<std::unique_ptr<PeerStream>> Tls(int fd, const TlsConfig& config,
                                                         bool server);
  ~PeerStream();
  PeerStream(const PeerStream&) = delete;
  PeerStream& operator=(const PeerStream&) = delete;

  int fd() const { return fd_; }
  // null for a plain stream.
  SSL* ssl() const { return ssl_; }
  // Advances the TLS handshake (plain: kOk at once). kOk once complete.
  Io Handshake(std::string* error);
  // Reads at most `n` bytes into `p`: the count (> 0), or 0 and `*io` says
  // why none came (kWantRead: nothing now).
  size_t Read(void* p, size_t n, Io* io, std::string* error);
  // Writes from `iov`: the bytes written (possibly fewer than offered), or
  // 0 and `*io` says why none went.
  size_t Write(const struct iovec* iov, int iovcnt, Io* io, std::string* error);
  // TLS: decrypted bytes are buffered inside the stream, which the socket's
  // readiness does not show.
  bool Buffered();
  // Shuts the writing direction down (the peer reads the end of stream
  // after what was written).
  void ShutdownWrite();

 private:
  PeerStream(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  Io TlsIo(int ret, std::string* error);
  const int fd_;
  Mutex ssl_mu_;  // serializes TLS calls
  SSL* const ssl_ ABSL_PT_GUARDED_BY(ssl_mu_);
};

// The text of the last OpenSSL errors of this thread (and clears them).
std::string OpenSslErrors();

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_PEER_STREAM_H_
