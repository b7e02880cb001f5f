#include "daemon/cluster/lease_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace collectived {

std::string ReadLeaseFile(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path);
  std::string id;
  if (!in || !std::getline(in, id)) return "";
  id = std::string(absl::StripAsciiWhitespace(id));
  // Lease ids are short printable tokens; anything else is not one.
  if (id.empty() || id.size() > 128) return "";
  for (char c : id) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) return "";
  }
  return id;
}

absl::Status WriteLeaseFile(const std::string& path, const std::string& lease_id) {
  if (path.empty()) return absl::OkStatus();
  if (lease_id.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("removing ", path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  const std::string tmp = absl::StrCat(path, ".tmp");
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("writing ", tmp, ": ", std::strerror(errno)));
  }
  const std::string line = lease_id + "\n";
  const bool wrote = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int saved = errno;
  close(fd);
  if (!wrote || rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = wrote ? errno : saved;
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace collectived
