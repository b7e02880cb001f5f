#include "daemon/util/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace collectived {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      std::abort();  // no entropy source: ids and keys would be guessable
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

std::string RandomId(absl::string_view prefix) {
  return absl::StrCat(prefix, absl::BytesToHexString(RandomBytes(16)));
}

}  // namespace collectived
