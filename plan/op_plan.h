// The plan of one op: the contract between the core, which validates and
// matches ops, and the executors, which run them.
//
// Neutral on purpose: no protobuf and no executor code, so that the core
// (which plans from the wire format, plan/wire_plan.h) and every
// executor (CPU, CUDA) depend on this library and not on each other.
// Plain data and pure functions; thread-safe.
#ifndef COLLECTIVED_PLAN_OP_PLAN_H_
#define COLLECTIVED_PLAN_OP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "collectived/dtype.h"

namespace collectived {

// The collectives. Numbered as the wire format's v1::OpKind (the core
// converts, and checks the numbering at compile time).
enum class OpKind : int {
  kUnspecified = 0,
  kPsum = 1,
  kPmean = 2,
  kPmax = 3,
  kPmin = 4,
  kAllGather = 5,
  kPpermute = 6,
  kPsumScatter = 7,
  kAllToAll = 8,
  kBarrier = 9,
  kBroadcast = 10,
};
inline constexpr int kNumOpKinds = 11;

// The element-wise reduction of psum/psum_scatter (kSum), pmax, pmin, pmean.
enum class ReduceKind { kSum, kMax, kMin, kMean };

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
  OpKind kind = OpKind::kUnspecified;
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

  // A partition's share of a longer fold (spanning.h's chain): member 0 is
  // the running result of the members before (reduce.h's FoldPart), and
  // pmean multiplies by the reciprocal of mean_divisor (0: group_size).
  bool continues_fold = false;
  int mean_divisor = 0;

  // Members of the whole mesh when this plan is part of an op (a partition's
  // share, spanning.h); 0 for a whole op, whose mesh is members().
  uint64_t mesh_members = 0;

  // Members the op runs on (every group's).
  uint64_t members() const { return groups.size() * static_cast<uint64_t>(group_size); }
  // Whether a reduction combines nothing and gives each member its input's
  // value (reduce.h's ReduceMeshOfOne): a mesh of one member is a one-device
  // program in JAX, and an op over no axes (JAX's empty tuple) is no
  // collective. A group of one over a named axis of a bigger mesh does reduce.
  bool ReducesNothing() const {
    return (mesh_members > 0 ? mesh_members : members()) == 1 || axis_ids.empty();
  }
  // Bytes of all members' inputs and outputs: what the thresholds for
  // running inline, serially or with streaming stores are measured in.
  uint64_t bytes_touched() const { return (in_bytes + out_bytes) * members(); }

  // Canonical text used both to match members' ops and in error messages,
  // e.g. "psum f32[2,3] over (x)" or "all_gather f32[4] over (x,y) axis=0 tiled".
  std::string signature;
};

// The rule for an op's input and output regions in one buffer: the same
// region (an op in place) or regions that do not overlap.
inline bool SameOrDisjoint(uint64_t in_offset, uint64_t in_bytes, uint64_t out_offset,
                           uint64_t out_bytes) {
  const bool same = out_offset == in_offset && out_bytes == in_bytes;
  const bool disjoint = out_offset >= in_offset + in_bytes || in_offset >= out_offset + out_bytes;
  return same || disjoint;
}

// Whether `kind` is an all-reduce: psum, pmean, pmax or pmin.
bool IsReduction(OpKind kind);
// The element-wise reduction of a reducing op kind (kSum for psum and
// psum_scatter).
ReduceKind ToReduceKind(OpKind kind);
// "psum", "all_gather", ...; "unknown_op" outside the enum.
absl::string_view OpKindName(OpKind kind);

// "member 3 is waiting" / "members 0,1 are waiting": who waits in an op
// that timed out, for its error.
std::string WaitingMembers(const std::vector<std::string>& members);
// "f32[2,3]"
std::string ShapeString(DType dt, const std::vector<int64_t>& shape);

// The dtype of the result of reducing `dt` with `kind`, as jax.lax defines it:
//  - kSum/kMax/kMin keep the dtype, except kSum of bool which is int32 (psum
//    counts the true values);
//  - kMean of a float type (float8_e4m3fn and float8_e5m2 included) keeps it;
//    of bool, int8/16/32 and uint8/16/32 it is float32; of int64/uint64 it is
//    float64.
DType ReduceResultDType(ReduceKind kind, DType dt);

}  // namespace collectived

#endif  // COLLECTIVED_PLAN_OP_PLAN_H_
