// Unix-domain socket helpers shared by the daemon and the client SDK:
// binding a listener, connecting, and passing a file descriptor with a packet
// (SCM_RIGHTS). All calls are thin wrappers that turn errno into a status.
#ifndef COLLECTIVED_COMMON_UNIX_SOCKET_H_
#define COLLECTIVED_COMMON_UNIX_SOCKET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace collectived {

// Listens on a SOCK_SEQPACKET socket at `path` with mode `mode`. A leftover
// socket file nobody listens on is replaced; a live one is ALREADY_EXISTS.
absl::StatusOr<int> ListenSeqPacket(const std::string& path, int mode);
// Connects to a SOCK_SEQPACKET socket at `path`.
absl::StatusOr<int> ConnectSeqPacket(const std::string& path);
// True if something accepts connections on the stream socket `path`.
bool StreamSocketIsLive(const std::string& path);

// Sends one packet, with `fd` attached when fd >= 0. With `nonblocking`, a
// full socket buffer is UNAVAILABLE instead of a wait.
absl::Status SendPacket(int sock, const std::string& data, int fd = -1, bool nonblocking = false);
// Receives one packet (at most 4 KiB) and the descriptor attached to it, if
// any (-1 otherwise), waiting at most `timeout`. UNAVAILABLE when the peer
// closed, DEADLINE_EXCEEDED on timeout.
struct Packet {
  std::string data;
  int fd = -1;
};
absl::StatusOr<Packet> ReceivePacket(int sock, absl::Duration timeout);

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_UNIX_SOCKET_H_
