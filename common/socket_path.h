// Where the daemon's sockets live, as both the daemon and the SDK compute it.
#ifndef COLLECTIVED_COMMON_SOCKET_PATH_H_
#define COLLECTIVED_COMMON_SOCKET_PATH_H_

#include <string>

#include "absl/status/status.h"

namespace collectived {

// `explicit_path` if not empty; else $COLLECTIVED_SOCKET; else
// $XDG_RUNTIME_DIR/collectived/collectived.sock; else
// /tmp/collectived-<uid>/collectived.sock.
std::string ResolveSocketPath(const std::string& explicit_path);
// The descriptor side socket that goes with control socket `socket`.
std::string SideSocketPath(const std::string& socket);
// Creates the socket's directory (mode 0755) if it does not exist.
absl::Status EnsureSocketDir(const std::string& socket);

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_SOCKET_PATH_H_
