// A Mesh's member-side small ops: its segment and its daemon-path ops in
// flight.
#ifndef COLLECTIVED_CLIENT_SRC_MEMBER_SIDE_H_
#define COLLECTIVED_CLIENT_SRC_MEMBER_SIDE_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "client/src/member_ops.h"
#include "client/src/op_state.h"
#include "collectived/client.h"
#include "common/sync.h"

namespace collectived {

// Member-side small ops of one Mesh: the mapped segment, and this member's
// ops in flight on the daemon path (a member runs an op member-side only
// with none: then its count of daemon-path ops is the daemon's, and the op
// cannot overtake one of them).
struct Mesh::MemberSide {
  explicit MemberSide(std::unique_ptr<internal::MemberOps> member_ops)
      : ops(std::move(member_ops)) {}
  Mutex mu;
  // Set once, before the Mesh is shared. TryRun runs under mu (one op at a
  // time); MarkBroken (an atomic word in the segment) from any thread.
  const std::unique_ptr<internal::MemberOps> ops;
  std::vector<std::shared_ptr<OpState>> in_flight ABSL_GUARDED_BY(mu);

  // Drops the ops that completed; whether none is left.
  bool Idle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::erase_if(in_flight, [](const std::shared_ptr<OpState>& op) { return op->Poll(); });
    return in_flight.empty();
  }
  // Keeps `f` (an op sent to the daemon, stream-ordered ones too) until it
  // completed; drops those known to have (a program that never runs a
  // synchronous op does not collect them all).
  void Track(const OpFuture& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::erase_if(in_flight, [](const std::shared_ptr<OpState>& op) { return op->Ready(); });
    if (f.state_ != nullptr) in_flight.push_back(f.state_);
  }
};

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_MEMBER_SIDE_H_
