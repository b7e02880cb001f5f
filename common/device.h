// Device names, as clients send them and the daemon and the SDK read them.
//
// Devices are named by strings, as clients send them:
//   ""  or "cpu"                   host memory (memfd)
//   "cuda:N"                       GPU ordinal N as this daemon sees it
//   "cuda:GPU-<uuid>", "GPU-<uuid>" a GPU by UUID (as nvidia-smi -L prints
//                                  it); ordinals differ between containers,
//                                  UUIDs do not
// ParseDevice checks the syntax only; the allocator checks that the device
// exists.
//
// Thread-safety: pure functions and a value type.
#ifndef COLLECTIVED_COMMON_DEVICE_H_
#define COLLECTIVED_COMMON_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace collectived {

struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  // kCuda: exactly one of ordinal (>= 0) and uuid ("GPU-...") is set.
  int ordinal = -1;
  std::string uuid;

  // "cpu", "cuda:0", "cuda:GPU-..." (the canonical form ParseDevice accepts).
  std::string ToString() const;
  // The buffer kind that serves this device: "memfd" or "cuda".
  absl::string_view buffer_kind() const { return kind == Kind::kCpu ? "memfd" : "cuda"; }
};

// INVALID_ARGUMENT naming the accepted forms for anything else.
absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text);

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_DEVICE_H_
