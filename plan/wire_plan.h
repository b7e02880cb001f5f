// Validation of one op, as the wire format gives it, against a mesh: the
// plan the executor runs (plan/op_plan.h).
//
// PlanOp checks everything that can be checked from the op alone (kind, axes,
// dtype, shape, parameters) and derives the result shape and the groups of
// members that communicate. Buffer ranges are checked by the engine, which
// owns the buffers. Pure functions; thread-safe.
#ifndef COLLECTIVED_PLAN_WIRE_PLAN_H_
#define COLLECTIVED_PLAN_WIRE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectived/v1/collective.pb.h"
#include "plan/op_plan.h"

namespace collectived {

// Builds the plan of `op` on a mesh of `shape`. INVALID_ARGUMENT with a precise
// message for any problem (unknown kind or axis, unsupported dtype for the
// kind, a negative or oversized dimension or element count of the input or
// the result (kMaxElements), parameters out of range, a perm with
// duplicates, ...).
absl::StatusOr<OpPlan> PlanOp(const v1::OpSpec& op, const MeshShape& shape);

// Conversions between the proto and internal dtype enums (same numbering).
DType FromProto(v1::DType dt);
v1::DType ToProto(DType dt);
// Conversions between the proto and internal op kinds (same numbering).
OpKind FromProto(v1::OpKind kind);
v1::OpKind ToProto(OpKind kind);

}  // namespace collectived

#endif  // COLLECTIVED_PLAN_WIRE_PLAN_H_
