// The process's descriptor budget: descriptors a client can make the daemon
// open (connections, buffers, queues) stop short of RLIMIT_NOFILE, so that
// gRPC's own listeners and the daemon's internal files always find one.
//
// Linux hands out the lowest free descriptor number, so a new descriptor
// numbered at or above `ceiling` means fewer than `limit - ceiling` remain:
// refusing such a descriptor keeps that reserve free without counting.
#ifndef COLLECTIVED_COMMON_FD_LIMIT_H_
#define COLLECTIVED_COMMON_FD_LIMIT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace collectived {

struct FdLimits {
  uint64_t soft_before = 0;  // RLIMIT_NOFILE soft limit found at start
  uint64_t soft = 0;         // soft limit now (the hard limit, when it could be raised)
  uint64_t hard = 0;
  std::string raise_error;  // empty when the limit is as high as it can be
};

// Raises the soft RLIMIT_NOFILE to the hard limit (capped at what the
// kernel's nr_open allows) and reports both. Never lowers it. When the limit
// cannot be raised (e.g. a seccomp filter), `soft` stays as it was and
// `raise_error` says why.
FdLimits RaiseFdLimit();

// Sets the ceiling: descriptors numbered at or above it are refused by
// FdAdmitted. Default: no ceiling. Thread-safe.
void SetFdCeiling(int ceiling);
int FdCeiling();

// Whether a freshly opened descriptor `fd` stays within the budget. The
// caller closes a refused descriptor and reports RESOURCE_EXHAUSTED
// (FdExhaustedError). Thread-safe.
bool FdAdmitted(int fd);

// RESOURCE_EXHAUSTED naming `what` could not be opened and why.
absl::Status FdExhaustedError(const std::string& what);

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_FD_LIMIT_H_
