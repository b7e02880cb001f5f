#include "plan/wire_plan.h"

namespace collectived {
namespace {

// Into `r`, reusing its strings' memory.
void Assign(const v1::BufferRef& ref, BufferRegion& r) {
  r.buffer_id.assign(ref.buffer_id());
  r.offset = ref.offset();
  r.size_bytes.reset();
  if (ref.has_size_bytes()) r.size_bytes = ref.size_bytes();
}

// `*slot` holds `ref` when `present`, else nothing.
void Assign(bool present, const v1::BufferRef& ref, std::optional<BufferRegion>& slot) {
  if (!present) {
    slot.reset();
    return;
  }
  if (!slot.has_value()) slot.emplace();
  Assign(ref, *slot);
}

}  // namespace

static_assert(static_cast<int>(DType::kF32) == v1::FLOAT32 &&
                  static_cast<int>(DType::kF64) == v1::FLOAT64 &&
                  static_cast<int>(DType::kF16) == v1::FLOAT16 &&
                  static_cast<int>(DType::kBF16) == v1::BFLOAT16 &&
                  static_cast<int>(DType::kI8) == v1::INT8 &&
                  static_cast<int>(DType::kU8) == v1::UINT8 &&
                  static_cast<int>(DType::kI32) == v1::INT32 &&
                  static_cast<int>(DType::kU32) == v1::UINT32 &&
                  static_cast<int>(DType::kI64) == v1::INT64 &&
                  static_cast<int>(DType::kU64) == v1::UINT64 &&
                  static_cast<int>(DType::kBool) == v1::BOOL &&
                  static_cast<int>(DType::kF8E4M3FN) == v1::FLOAT8_E4M3FN &&
                  static_cast<int>(DType::kF8E5M2) == v1::FLOAT8_E5M2 &&
                  v1::DType_MAX == v1::FLOAT8_E5M2,
              "DType is numbered as v1::DType, and kF8E5M2 is the last");

DType FromProto(v1::DType dt) {
  int v = static_cast<int>(dt);
  if (v < 1 || v > static_cast<int>(DType::kF8E5M2)) return DType::kInvalid;
  return static_cast<DType>(v);
}

v1::DType ToProto(DType dt) { return static_cast<v1::DType>(static_cast<int>(dt)); }

static_assert(static_cast<int>(OpKind::kPsum) == v1::PSUM &&
              static_cast<int>(OpKind::kPmean) == v1::PMEAN &&
              static_cast<int>(OpKind::kPmax) == v1::PMAX &&
              static_cast<int>(OpKind::kPmin) == v1::PMIN &&
              static_cast<int>(OpKind::kAllGather) == v1::ALL_GATHER &&
              static_cast<int>(OpKind::kPpermute) == v1::PPERMUTE &&
              static_cast<int>(OpKind::kPsumScatter) == v1::PSUM_SCATTER &&
              static_cast<int>(OpKind::kAllToAll) == v1::ALL_TO_ALL &&
              static_cast<int>(OpKind::kBarrier) == v1::BARRIER &&
              static_cast<int>(OpKind::kBroadcast) == v1::BROADCAST &&
              kNumOpKinds == v1::BROADCAST + 1,
              "OpKind is numbered as v1::OpKind");

OpKind FromProto(v1::OpKind kind) {
  const int v = static_cast<int>(kind);
  if (v < 1 || v >= kNumOpKinds) return OpKind::kUnspecified;
  return static_cast<OpKind>(v);
}

v1::OpKind ToProto(OpKind kind) { return static_cast<v1::OpKind>(static_cast<int>(kind)); }

OpRequest FromProto(const v1::OpSpec& op) {
  OpRequest r;
  FromProto(op, r);
  return r;
}

void FromProto(const v1::OpSpec& op, OpRequest& r) {
  r.mesh_id.assign(op.mesh_id());
  // Kept as sent (OpKind holds any int): PlanOp names an unknown one.
  r.kind = static_cast<OpKind>(static_cast<int>(op.kind()));
  r.axes.assign(op.axes().begin(), op.axes().end());
  r.no_axes = op.no_axes();
  const int dt = static_cast<int>(op.dtype());
  r.dtype = dt >= 0 && dt <= 255 ? static_cast<DType>(dt) : DType::kInvalid;
  r.shape.assign(op.shape().begin(), op.shape().end());
  Assign(op.input(), r.input);
  Assign(op.has_output(), op.output(), r.output);
  r.all_gather = {};
  r.psum_scatter = {};
  r.all_to_all = {};
  r.perm.clear();
  r.root = 0;
  switch (op.params_case()) {
    case v1::OpSpec::kAllGather:
      r.all_gather = {op.all_gather().axis(), op.all_gather().tiled()};
      break;
    case v1::OpSpec::kPsumScatter:
      r.psum_scatter = {op.psum_scatter().scatter_dimension(), op.psum_scatter().tiled()};
      break;
    case v1::OpSpec::kAllToAll:
      r.all_to_all = {op.all_to_all().split_axis(), op.all_to_all().concat_axis(),
                      op.all_to_all().tiled()};
      break;
    case v1::OpSpec::kPpermute:
      for (const v1::PermutePair& p : op.ppermute().perm()) {
        r.perm.emplace_back(p.source(), p.dest());
      }
      break;
    case v1::OpSpec::kBroadcast:
      r.root = op.broadcast().root();
      break;
    case v1::OpSpec::PARAMS_NOT_SET:
      break;
  }
  r.timeout_ms = op.timeout_ms();
  if (!op.has_stream_sync()) {
    r.stream_sync.reset();
  } else {
    if (!r.stream_sync.has_value()) r.stream_sync.emplace();
    Assign(op.stream_sync().ready(), r.stream_sync->ready);
    Assign(op.stream_sync().done(), r.stream_sync->done);
    r.stream_sync->value = op.stream_sync().value();
  }
}

absl::StatusOr<OpPlan> PlanOp(const v1::OpSpec& op, const MeshShape& shape) {
  return PlanOp(FromProto(op), shape);
}

}  // namespace collectived
