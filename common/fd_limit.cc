#include "common/fd_limit.h"

#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace collectived {
namespace {

std::atomic<int> g_ceiling{INT_MAX};

}  // namespace

FdLimits RaiseFdLimit() {
  FdLimits out;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    out.raise_error = ErrnoStatus(errno, "getrlimit(RLIMIT_NOFILE)").ToString();
    out.soft = out.soft_before = out.hard = 1024;
    return out;
  }
  out.soft_before = lim.rlim_cur;
  out.hard = lim.rlim_max;
  rlim_t target = lim.rlim_max;
  // An unlimited hard limit cannot be the soft limit: the kernel caps
  // descriptors at fs.nr_open.
  uint64_t nr_open = 0;
  if (std::ifstream f("/proc/sys/fs/nr_open"); f >> nr_open && nr_open > 0) {
    if (target == RLIM_INFINITY || target > nr_open) target = nr_open;
  }
  if (target > lim.rlim_cur) {
    rlimit raised = lim;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      lim.rlim_cur = target;
    } else {
      out.raise_error =
          ErrnoStatus(errno, absl::StrCat("setrlimit(RLIMIT_NOFILE, ", target, ")")).ToString();
    }
  }
  out.soft = lim.rlim_cur;
  return out;
}

void SetFdCeiling(int ceiling) { g_ceiling.store(ceiling, std::memory_order_relaxed); }

int FdCeiling() { return g_ceiling.load(std::memory_order_relaxed); }

bool FdAdmitted(int fd) { return fd < FdCeiling(); }

absl::Status FdExhaustedError(const std::string& what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the daemon is at its descriptor budget (", FdCeiling(),
      " descriptors; see --fd-reserve and RLIMIT_NOFILE): cannot open ", what));
}

}  // namespace collectived
