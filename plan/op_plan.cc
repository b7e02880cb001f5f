#include "plan/op_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace collectived {

bool IsReduction(OpKind kind) {
  return kind == OpKind::kPsum || kind == OpKind::kPmean || kind == OpKind::kPmax ||
         kind == OpKind::kPmin;
}

ReduceKind ToReduceKind(OpKind kind) {
  switch (kind) {
    case OpKind::kPmax: return ReduceKind::kMax;
    case OpKind::kPmin: return ReduceKind::kMin;
    case OpKind::kPmean: return ReduceKind::kMean;
    default: return ReduceKind::kSum;
  }
}

int MeshShape::num_members() const {
  int n = 1;
  for (int s : sizes) n *= s;
  return n;
}

std::vector<int> MeshShape::Coordinate(int index) const {
  std::vector<int> c(sizes.size());
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    c[i] = index % sizes[i];
    index /= sizes[i];
  }
  return c;
}

int MeshShape::Index(const std::vector<int>& coordinate) const {
  int index = 0;
  for (size_t i = 0; i < sizes.size(); ++i) index = index * sizes[i] + coordinate[i];
  return index;
}

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kPsum: return "psum";
    case OpKind::kPmean: return "pmean";
    case OpKind::kPmax: return "pmax";
    case OpKind::kPmin: return "pmin";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kPpermute: return "ppermute";
    case OpKind::kPsumScatter: return "psum_scatter";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kBroadcast: return "broadcast";
    default: return "unknown_op";
  }
}

std::string WaitingMembers(const std::vector<std::string>& members) {
  if (members.size() == 1) return absl::StrCat("member ", members[0], " is waiting");
  return absl::StrCat("members ", absl::StrJoin(members, ","), " are waiting");
}

std::string ShapeString(DType dt, const std::vector<int64_t>& shape) {
  return absl::StrCat(std::string(DTypeShortName(dt)), "[", absl::StrJoin(shape, ","), "]");
}

DType ReduceResultDType(ReduceKind kind, DType dt) {
  if (kind == ReduceKind::kSum && dt == DType::kBool) return DType::kI32;
  if (kind != ReduceKind::kMean) return dt;
  switch (dt) {
    case DType::kBool:
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kU32:
      return DType::kF32;
    case DType::kI64:
    case DType::kU64:
      return DType::kF64;
    default:
      return dt;  // float types, and kInvalid
  }
}

}  // namespace collectived
