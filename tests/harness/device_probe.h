// Whether a test's members can have buffers on a device, asked of the daemon
// the way a member asks: SkipUnlessDeviceUsable returns at once for "cpu";
// for a GPU it allocates a 4 KiB buffer there through the SDK and, when the
// daemon (or this process's SDK) cannot give one, skips the calling test with
// the reason, or fails it under COLLECTIVED_REQUIRE_GPU=1 (require_gpu.h).
// The caller returns when IsSkipped() or HasFatalFailure().
#ifndef COLLECTIVED_TESTS_HARNESS_DEVICE_PROBE_H_
#define COLLECTIVED_TESTS_HARNESS_DEVICE_PROBE_H_

#include <string>

#include "absl/status/statusor.h"
#include "collectived/client.h"
#include "gtest/gtest.h"
#include "tests/harness/require_gpu.h"

namespace collectived::testing {

inline void SkipUnlessDeviceUsable(const std::string& socket, const std::string& device) {
  if (device == "cpu") return;
  auto client = Client::Connect({.socket_path = socket, .client_name = "gpu-probe"});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<Buffer> probe = (*client)->Allocate(4096, device);
  if (probe.ok()) return;
  COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU("no GPU memory on " << device << ": " << probe.status());
}

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_DEVICE_PROBE_H_
