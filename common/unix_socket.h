// Unix-domain socket helpers shared by the daemon and the client SDK:
// binding a listener, connecting, and passing a file descriptor with a packet
// (SCM_RIGHTS). All calls are thin wrappers that turn errno into a status.
#ifndef COLLECTIVED_COMMON_UNIX_SOCKET_H_
#define COLLECTIVED_COMMON_UNIX_SOCKET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace collectived {

// Listens on a Unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET) at `path`
// with permissions `mode` and, when `gid` >= 0, that group; the descriptor is
// non-blocking and close-on-exec. The socket is bound in a private (0700)
// directory beside `path`, given its mode and group there, and renamed into
// place, so `path` never exists with looser permissions whatever the umask.
// A leftover socket file nobody listens on is replaced; a live one is
// ALREADY_EXISTS. `path` needs 9 bytes of headroom below the 107-byte limit
// for the private directory.
absl::StatusOr<int> ListenUnix(const std::string& path, int type, int mode, int gid = -1);
// Connects to a SOCK_SEQPACKET socket at `path`.
absl::StatusOr<int> ConnectSeqPacket(const std::string& path);
// True if something accepts connections on the stream socket `path`.
bool StreamSocketIsLive(const std::string& path);

// Sends one packet, with `fd` attached when fd >= 0. With `nonblocking`, a
// full socket buffer is UNAVAILABLE instead of a wait.
absl::Status SendPacket(int sock, const std::string& data, int fd = -1, bool nonblocking = false);
// One received packet: its bytes and the descriptor that came with it, if any
// (owned: closed with the packet unless released).
struct Packet {
  std::string data;
  UniqueFd fd;
};
// What a receiver takes from a packet besides its bytes.
enum class Descriptors {
  // Descriptors a peer attaches are refused: the kernel drops them before
  // they reach this process's table, and the packet is INVALID_ARGUMENT.
  kNone,
  // At most one descriptor; a packet with more (or with truncated control
  // data) is INVALID_ARGUMENT, and every descriptor it carried is closed.
  kAtMostOne,
};
// Receives one packet (at most 4 KiB), waiting at most `timeout`.
// UNAVAILABLE when the peer closed, DEADLINE_EXCEEDED on timeout,
// INVALID_ARGUMENT for an oversized packet or descriptors `descriptors`
// does not allow. Whatever the outcome, no received descriptor is leaked.
absl::StatusOr<Packet> ReceivePacket(int sock, absl::Duration timeout,
                                     Descriptors descriptors = Descriptors::kAtMostOne);

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_UNIX_SOCKET_H_
