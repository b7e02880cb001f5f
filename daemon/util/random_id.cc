#include "daemon/util/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace collectived {

std::string RandomId(absl::string_view prefix) {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::abort();  // no entropy source: ids would be guessable
    }
    got += static_cast<size_t>(n);
  }
  return absl::StrCat(
      prefix, absl::BytesToHexString(absl::string_view(
                  reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

}  // namespace collectived
