// Conversions into absl::Status, done once where the failing call is made.
#ifndef COLLECTIVED_COMMON_STATUS_UTIL_H_
#define COLLECTIVED_COMMON_STATUS_UTIL_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace collectived {

// A status for a failed system call: "<what>: <strerror(err)>", with a code
// chosen from errno (ENOMEM -> RESOURCE_EXHAUSTED, ENOENT -> NOT_FOUND,
// EACCES/EPERM -> PERMISSION_DENIED, ...; INTERNAL otherwise).
absl::Status ErrnoStatus(int err, absl::string_view what);

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_STATUS_UTIL_H_
