// Unguessable identifiers for sessions, buffers and meshes, and random bytes
// for keys and nonces.
#ifndef COLLECTIVED_DAEMON_UTIL_RANDOM_ID_H_
#define COLLECTIVED_DAEMON_UTIL_RANDOM_ID_H_

#include <string>
#include "absl/strings/string_view.h"

namespace collectived {

// Returns `prefix` followed by 128 bits from the kernel's CSPRNG (getrandom)
// in lowercase hex, e.g. "s-3f2a...". Thread-safe.
std::string RandomId(absl::string_view prefix);

// `n` bytes from the kernel's CSPRNG (getrandom). Thread-safe.
std::string RandomBytes(size_t n);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_UTIL_RANDOM_ID_H_
