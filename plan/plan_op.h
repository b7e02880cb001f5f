// Validation of one op against a mesh: the plan the executor runs
// (plan/op_plan.h).
//
// PlanOp checks everything that can be checked from the op alone (kind, axes,
// dtype, shape, parameters) and derives the result shape and the groups of
// members that communicate. Buffer ranges are checked by the engine, which
// owns the buffers. Pure functions; thread-safe.
#ifndef COLLECTIVED_PLAN_PLAN_OP_H_
#define COLLECTIVED_PLAN_PLAN_OP_H_

#include "absl/status/statusor.h"
#include "plan/op_plan.h"
#include "plan/op_request.h"

namespace collectived {

// Builds the plan of `op` on a mesh of `shape`. INVALID_ARGUMENT with a precise
// message for any problem (unknown kind or axis, unsupported dtype for the
// kind, a negative or oversized dimension or element count of the input or
// the result (kMaxElements), parameters out of range, a perm with
// duplicates, ...). Looks at neither the mesh id nor the buffers.
absl::StatusOr<OpPlan> PlanOp(const OpRequest& op, const MeshShape& shape);

}  // namespace collectived

#endif  // COLLECTIVED_PLAN_PLAN_OP_H_
