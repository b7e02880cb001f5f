// The SDK's one description of an op (OpArgs) and the one mapping from it
// to the wire (SpecOf): every typed Mesh method, run, start and submit
// describe their op as OpArgs, by reference (nothing is copied on the
// synchronous path), and nothing else builds an OpSpec.
//
// Thread-safety: pure functions.
#ifndef COLLECTIVED_CLIENT_SRC_OP_SPEC_H_
#define COLLECTIVED_CLIENT_SRC_OP_SPEC_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/src/member_ops.h"
#include "collectived/client.h"
#include "collectived/v1/collective.pb.h"

namespace collectived::internal {

struct OpArgs {
  CollectiveKind kind = CollectiveKind::kPsum;
  const Array* x = nullptr;  // null for a barrier
  const AxisNames& axes;
  const Array* out = nullptr;  // null: in place; all_gather and psum_scatter need one
  const std::vector<std::pair<int, int>>* perm = nullptr;  // ppermute (null: none)
  // all_gather: axis; psum_scatter: scatter_dimension; all_to_all:
  // split_axis; broadcast: root (Collective's meaning).
  int axis = 0;
  int concat_axis = 0;  // all_to_all
  bool tiled = false;   // all_gather, psum_scatter, all_to_all
};

// `op` by reference (it must outlive the result).
OpArgs ArgsOf(const Collective& op);

// The wire's kind of a CollectiveKind (OP_KIND_UNSPECIFIED for a value that
// is none of them).
v1::OpKind WireKind(CollectiveKind kind);

// What the SDK refuses without asking the daemon (INVALID_ARGUMENT): a kind
// it does not know, all_gather or psum_scatter without an output, axes that
// name nothing (a default-constructed AxisNames), an output whose shape has
// no byte size.
absl::Status CheckArgs(const OpArgs& args);

// The op's OpSpec on mesh `mesh_id` (args passed CheckArgs).
v1::OpSpec SpecOf(const std::string& mesh_id, const OpArgs& args);

// Whether a synchronous op of this kind may run member-side (the
// reductions, barrier, all_gather); the others always go to the daemon.
bool MayRunMemberSide(const OpArgs& args);

// What the op's member-side plan depends on, as SpecOf would say it (for a
// kind MayRunMemberSide allows). Refers to args' arrays and axes.
MemberOpKey KeyOf(const OpArgs& args);

}  // namespace collectived::internal

#endif  // COLLECTIVED_CLIENT_SRC_OP_SPEC_H_
