#include "common/status_util.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace collectived {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case EEXIST:
    case EADDRINUSE:
      return absl::AlreadyExistsError(msg);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace collectived
