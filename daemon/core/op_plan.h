// Validation of one op against a mesh, and the plan the executor runs.
//
// PlanOp checks everything that can be checked from the op alone (kind, axes,
// dtype, shape, parameters) and derives the result shape and the groups of
// members that communicate. Buffer ranges are checked by the engine, which
// owns the buffers. Pure functions; thread-safe.
#ifndef COLLECTIVED_DAEMON_CORE_OP_PLAN_H_
#define COLLECTIVED_DAEMON_CORE_OP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectived/v1/collective.pb.h"
#include "daemon/exec/dtype.h"
#include "daemon/exec/reduce.h"

namespace collectived {

// Axis names and sizes of a mesh, major to minor.
struct MeshShape {
  std::vector<std::string> names;
  std::vector<int> sizes;

  int num_members() const;
  // Row-major coordinate of member `index`.
  std::vector<int> Coordinate(int index) const;
  // Row-major index of `coordinate`.
  int Index(const std::vector<int>& coordinate) const;
};

// Largest dimension and number of elements of an op's input and of its
// result (zero dimensions aside: the non-zero dimensions of an empty array
// obey the limit too), and largest rank. Byte sizes (at most 2^43) and every
// partial product of a shape then fit in int64.
inline constexpr int64_t kMaxElements = int64_t{1} << 40;
inline constexpr int kMaxRank = 16;

struct OpPlan {
  v1::OpKind kind = v1::OP_KIND_UNSPECIFIED;
  DType dtype = DType::kInvalid;
  DType out_dtype = DType::kInvalid;
  std::vector<int64_t> in_shape;
  std::vector<int64_t> out_shape;
  uint64_t in_bytes = 0;
  uint64_t out_bytes = 0;
  // Mesh axes the op runs over, in the order given (the linearization order).
  std::vector<int> axis_ids;
  int group_size = 1;
  // groups[g][i]: the member with group index i in group g.
  std::vector<std::vector<int>> groups;
  // Per member: its group and its index in the group.
  std::vector<int> group_of;
  std::vector<int> index_in_group;

  // all_gather: `axis` / psum_scatter: scatter_dimension.
  int axis = 0;
  bool tiled = false;
  // all_to_all, as the tiled primitive on `a2a_shape` (the input with the
  // singleton dimension JAX inserts for the untiled form).
  int split_axis = 0;
  int concat_axis = 0;
  std::vector<int64_t> a2a_shape;
  // ppermute: source group index for each destination group index, or -1.
  std::vector<int> perm_source;
  // broadcast: root group index.
  int root = 0;

  // Members the op runs on (every group's).
  uint64_t members() const { return groups.size() * static_cast<uint64_t>(group_size); }
  // Bytes of all members' inputs and outputs: what the thresholds for
  // running inline, serially or with streaming stores are measured in.
  uint64_t bytes_touched() const { return (in_bytes + out_bytes) * members(); }

  // Canonical text used both to match members' ops and in error messages,
  // e.g. "psum f32[2,3] over (x)" or "all_gather f32[4] over (x,y) axis=0 tiled".
  std::string signature;
};

// Builds the plan of `op` on a mesh of `shape`. INVALID_ARGUMENT with a precise
// message for any problem (unknown kind or axis, unsupported dtype for the
// kind, a negative or oversized dimension or element count of the input or
// the result (kMaxElements), parameters out of range, a perm with
// duplicates, ...).
absl::StatusOr<OpPlan> PlanOp(const v1::OpSpec& op, const MeshShape& shape);

// The element-wise reduction of a reducing op kind (kSum for psum and
// psum_scatter).
ReduceKind ToReduceKind(v1::OpKind kind);
// "psum", "all_gather", ...
absl::string_view OpKindName(v1::OpKind kind);
// Conversions between the proto and internal dtype enums (same numbering).
DType FromProto(v1::DType dt);
v1::DType ToProto(DType dt);
// "f32[2,3]"
std::string ShapeString(DType dt, const std::vector<int64_t>& shape);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_OP_PLAN_H_
