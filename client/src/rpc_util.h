// The SDK's small helpers around gRPC calls to the daemon.
#ifndef COLLECTIVED_CLIENT_SRC_RPC_UTIL_H_
#define COLLECTIVED_CLIENT_SRC_RPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived {

// Added to every deadline the daemon enforces, so that the daemon's precise
// error arrives before the SDK's own fallback deadline.
inline constexpr absl::Duration kGrace = absl::Seconds(10);

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

inline void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_RPC_UTIL_H_
