#include "common/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace collectived {

std::string ResolveSocketPath(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  if (const char* env = std::getenv("COLLECTIVED_SOCKET"); env != nullptr && *env != '\0') {
    return env;
  }
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run != nullptr && *run != '\0') {
    return absl::StrCat(run, "/collectived/collectived.sock");
  }
  return absl::StrCat("/tmp/collectived-", getuid(), "/collectived.sock");
}

std::string SideSocketPath(const std::string& socket) { return socket + ".fds"; }

absl::Status EnsureSocketDir(const std::string& socket) {
  size_t slash = socket.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  std::string dir = socket.substr(0, slash);
  // Create each missing component.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string part = dir.substr(0, pos);
    if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("creating socket directory ", part));
    }
  }
  return absl::OkStatus();
}

}  // namespace collectived
