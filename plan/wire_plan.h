// The wire format's op (v1::OpSpec) in the project's own form
// (plan/op_request.h), and planning straight from it: the edge where the
// server and the SDK convert. The enum conversions keep the numbering,
// checked at compile time. Pure functions; thread-safe.
#ifndef COLLECTIVED_PLAN_WIRE_PLAN_H_
#define COLLECTIVED_PLAN_WIRE_PLAN_H_

#include "absl/status/statusor.h"
#include "collectived/v1/collective.pb.h"
#include "plan/op_plan.h"
#include "plan/op_request.h"
#include "plan/plan_op.h"

namespace collectived {

// `op` as the core takes it. Keeps every value as sent, an unknown kind or
// dtype included (PlanOp refuses them, naming the number; a dtype number
// beyond 255 becomes kInvalid).
OpRequest FromProto(const v1::OpSpec& op);
// The same into `request`, reusing its memory (the fast path converts every
// op into one request).
void FromProto(const v1::OpSpec& op, OpRequest& request);

// PlanOp(FromProto(op), shape).
absl::StatusOr<OpPlan> PlanOp(const v1::OpSpec& op, const MeshShape& shape);

// Conversions between the proto and internal dtype enums (same numbering).
DType FromProto(v1::DType dt);
v1::DType ToProto(DType dt);
// Conversions between the proto and internal op kinds (same numbering).
OpKind FromProto(v1::OpKind kind);
v1::OpKind ToProto(OpKind kind);

}  // namespace collectived

#endif  // COLLECTIVED_PLAN_WIRE_PLAN_H_
