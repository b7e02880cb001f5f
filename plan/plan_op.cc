#include "plan/plan_op.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace collectived {
namespace {

absl::Status Invalid(absl::string_view kind, auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(kind, ": ", parts...));
}

// Normalizes a numpy-style axis: one in [-size, size) counts from the end
// when negative. False when out of range.
bool NormalizeAxis(int axis, int size, int* out) {
  if (axis < -size || axis >= size) return false;
  *out = axis < 0 ? axis + size : axis;
  return true;
}

// "(valid: -3..2)" for an axis of an array of `size` dimensions.
std::string ValidRange(int size) {
  if (size == 0) return "(it has no dimension)";
  return absl::StrCat("(valid: ", -size, "..", size - 1, ")");
}

// *out = a * b; false when the product overflows int64 or exceeds
// kMaxElements (the limit of every dimension and element count).
bool MulWithinLimit(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out) && *out <= kMaxElements;
}

// The number of elements of `shape` (the input's or the result's: `what`).
// Every dimension must be in [0, 2^40] and the product of the non-zero ones
// at most 2^40, so that a zero dimension cannot hide an oversized other one
// and every partial product of the shape fits in int64.
absl::StatusOr<int64_t> CheckedElements(absl::string_view name, absl::string_view what,
                                        const std::vector<int64_t>& shape) {
  int64_t extent = 1;  // the product of the non-zero dimensions
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      return Invalid(name, "negative dimension ", d, " in ", what, " [",
                     absl::StrJoin(shape, ","), "]");
    }
    if (d > kMaxElements) {
      return Invalid(name, what, " [", absl::StrJoin(shape, ","), "]: dimension ", i,
                     " of size ", d, " exceeds 2^40");
    }
    if (d == 0) {
      empty = true;
    } else if (!MulWithinLimit(extent, d, &extent)) {
      return Invalid(name, what, " [", absl::StrJoin(shape, ","), "] has more than 2^40 elements",
                     empty ? " (not counting its zero dimensions)" : "");
    }
  }
  return empty ? 0 : extent;
}

// The op's axes as mesh axis ids: names must exist and not repeat.
absl::Status PlanAxes(const OpRequest& op, const MeshShape& mesh, absl::string_view name,
                      OpPlan& plan) {
  // no_axes is the empty tuple (groups of one); an empty list without it
  // means every mesh axis.
  if (op.no_axes && !op.axes.empty()) {
    return Invalid(name, "no_axes is set but axes (", absl::StrJoin(op.axes, ","),
                   ") are named; give one or the other");
  }
  if (op.axes.empty() && !op.no_axes) {
    for (size_t i = 0; i < mesh.names.size(); ++i) plan.axis_ids.push_back(static_cast<int>(i));
  }
  for (const std::string& axis : op.axes) {
    auto it = std::find(mesh.names.begin(), mesh.names.end(), axis);
    if (it == mesh.names.end()) {
      return Invalid(name, "unknown axis name '", axis, "'; the mesh has axes (",
                     absl::StrJoin(mesh.names, ","), ")");
    }
    int id = static_cast<int>(it - mesh.names.begin());
    if (std::find(plan.axis_ids.begin(), plan.axis_ids.end(), id) != plan.axis_ids.end()) {
      return Invalid(name, "axis '", axis, "' named twice");
    }
    plan.axis_ids.push_back(id);
  }
  if (op.kind == OpKind::kPpermute) {
    // JAX numbers ppermute's group members by mesh position whatever the
    // order of a tuple axis_name (its lowering sorts each group), unlike
    // axis_index and the other collectives.
    std::sort(plan.axis_ids.begin(), plan.axis_ids.end());
  }
  return absl::OkStatus();
}

// Groups: members that share the coordinates of the other axes, and each
// member's group and index in it.
void PlanGroups(const MeshShape& mesh, OpPlan& plan) {
  const int n = plan.group_size;
  const int members = mesh.num_members();
  plan.group_of.assign(members, -1);
  plan.index_in_group.assign(members, 0);
  std::vector<std::vector<int>> key_of_group;
  for (int m = 0; m < members; ++m) {
    std::vector<int> c = mesh.Coordinate(m);
    std::vector<int> key;
    for (size_t a = 0; a < c.size(); ++a) {
      if (std::find(plan.axis_ids.begin(), plan.axis_ids.end(), static_cast<int>(a)) ==
          plan.axis_ids.end()) {
        key.push_back(c[a]);
      }
    }
    int index = 0;
    for (int id : plan.axis_ids) index = index * mesh.sizes[id] + c[id];
    auto it = std::find(key_of_group.begin(), key_of_group.end(), key);
    int g = static_cast<int>(it - key_of_group.begin());
    if (it == key_of_group.end()) {
      key_of_group.push_back(key);
      plan.groups.emplace_back(n, -1);
    }
    plan.group_of[m] = g;
    plan.index_in_group[m] = index;
    plan.groups[g][index] = m;
  }
}

// all_gather: the output shape, the gathered dimension's position.
absl::Status PlanAllGather(const OpRequest& op, absl::string_view name, int n, OpPlan& plan,
                           std::string& detail) {
  const int rank = static_cast<int>(plan.in_shape.size());
  const auto& p = op.all_gather;
  plan.tiled = p.tiled;
  // The position of the gathered dimension in the output, which has one
  // more dimension than the input when untiled (JAX normalizes against
  // it too).
  const int positions = plan.tiled ? rank : rank + 1;
  if (!NormalizeAxis(p.axis, positions, &plan.axis)) {
    return Invalid(name, "axis ", p.axis, " out of range for ", plan.tiled ? "tiled " : "",
                   "input of rank ", rank, " ", ValidRange(positions));
  }
  if (op.no_axes) {
    // JAX returns x for the empty tuple: no dimension is inserted. (The
    // executor's gather of one member copies the same bytes.)
  } else if (plan.tiled) {
    if (!MulWithinLimit(plan.in_shape[plan.axis], n, &plan.out_shape[plan.axis])) {
      return Invalid(name, "result dimension ", plan.axis, " (", plan.in_shape[plan.axis],
                     " x group size ", n, ") exceeds 2^40");
    }
  } else {
    plan.out_shape.insert(plan.out_shape.begin() + plan.axis, n);
  }
  detail = absl::StrCat(" axis=", plan.axis, plan.tiled ? " tiled" : "");
  return absl::OkStatus();
}

// psum_scatter: the scattered dimension and the output shape.
absl::Status PlanPsumScatter(const OpRequest& op, absl::string_view name, int n, OpPlan& plan,
                             std::string& detail) {
  const int rank = static_cast<int>(plan.in_shape.size());
  if (plan.dtype == DType::kBool) {
    return Invalid(name, "bool is not supported (JAX rejects it too)");
  }
  const auto& p = op.psum_scatter;
  plan.tiled = p.tiled;
  if (rank == 0) return Invalid(name, "the input of rank 0 has no dimension to scatter");
  if (!NormalizeAxis(p.scatter_dimension, rank, &plan.axis)) {
    return Invalid(name, "scatter_dimension ", p.scatter_dimension,
                   " out of range for input of rank ", rank, " ", ValidRange(rank));
  }
  int64_t d = plan.in_shape[plan.axis];
  if (op.no_axes) {
    // JAX returns x for the empty tuple, whatever the dimension's size:
    // nothing is scattered (the executor's one block is the whole input).
  } else if (plan.tiled) {
    if (d % n != 0) {
      return Invalid(name, "tiled: dimension ", plan.axis, " of size ", d,
                     " is not divisible by the group size ", n);
    }
    plan.out_shape[plan.axis] = d / n;
  } else {
    if (d != n) {
      return Invalid(name, "dimension ", plan.axis, " has size ", d,
                     " but must equal the group size ", n, " (or use tiled)");
    }
    plan.out_shape.erase(plan.out_shape.begin() + plan.axis);
  }
  detail = absl::StrCat(" scatter_dimension=", plan.axis, plan.tiled ? " tiled" : "");
  return absl::OkStatus();
}

// all_to_all: the split and concat axes, as JAX places them, and the shapes.
absl::Status PlanAllToAll(const OpRequest& op, absl::string_view name, int n, OpPlan& plan,
                          std::string& detail) {
  const int rank = static_cast<int>(plan.in_shape.size());
  const auto& p = op.all_to_all;
  plan.tiled = p.tiled;
  // concat_axis is a position in the output, which has the input's rank.
  int split = 0, concat = 0;
  if (rank == 0) return Invalid(name, "the input of rank 0 has no dimension to split");
  if (!NormalizeAxis(p.split_axis, rank, &split)) {
    return Invalid(name, "split_axis ", p.split_axis, " out of range for input of rank ",
                   rank, " ", ValidRange(rank));
  }
  if (!NormalizeAxis(p.concat_axis, rank, &concat)) {
    return Invalid(name, "concat_axis ", p.concat_axis, " out of range for input of rank ",
                   rank, " ", ValidRange(rank));
  }
  const int normalized_split = split, normalized_concat = concat;
  int64_t d = plan.in_shape[split];
  plan.a2a_shape = plan.in_shape;
  if (plan.tiled) {
    if (d % n != 0) {
      return Invalid(name, "tiled: split dimension ", split, " of size ", d,
                     " is not divisible by the group size ", n);
    }
  } else {
    if (d != n) {
      return Invalid(name, "split dimension ", split, " has size ", d,
                     " but must equal the group size ", n, " (or use tiled)");
    }
    // JAX inserts a singleton at the concat position, runs the tiled
    // primitive, then squeezes the split dimension.
    if (split < concat) {
      concat += 1;
      plan.a2a_shape.insert(plan.a2a_shape.begin() + concat, 1);
    } else if (concat < split) {
      plan.a2a_shape.insert(plan.a2a_shape.begin() + concat, 1);
      split += 1;
    }
  }
  plan.split_axis = split;
  plan.concat_axis = concat;
  std::vector<int64_t> out = plan.a2a_shape;
  out[split] /= n;
  const int64_t concat_in = out[concat];
  if (!MulWithinLimit(concat_in, n, &out[concat])) {
    return Invalid(name, "result dimension ", concat, " (", concat_in, " x group size ", n,
                   ") exceeds 2^40");
  }
  if (!plan.tiled && split != concat) out.erase(out.begin() + split);
  plan.out_shape = out;
  detail = absl::StrCat(" split_axis=", normalized_split, " concat_axis=", normalized_concat,
                        plan.tiled ? " tiled" : "");
  return absl::OkStatus();
}

// ppermute: each destination's source, every pair within the group once.
absl::Status PlanPpermute(const OpRequest& op, absl::string_view name, int n, OpPlan& plan,
                          std::string& detail) {
  plan.perm_source.assign(n, -1);
  std::vector<bool> is_source(n, false);
  std::vector<std::string> pairs;
  for (const auto& [s, d] : op.perm) {
    if (s < 0 || s >= n || d < 0 || d >= n) {
      return Invalid(name, "pair (", s, ",", d, ") out of range for group size ", n);
    }
    if (is_source[s]) return Invalid(name, "source ", s, " appears twice in perm");
    if (plan.perm_source[d] >= 0) return Invalid(name, "dest ", d, " appears twice in perm");
    is_source[s] = true;
    plan.perm_source[d] = s;
    pairs.push_back(absl::StrCat("(", s, ",", d, ")"));
  }
  detail = absl::StrCat(" perm=[", absl::StrJoin(pairs, ","), "]");
  return absl::OkStatus();
}

// broadcast: the root within the group.
absl::Status PlanBroadcast(const OpRequest& op, absl::string_view name, int n, OpPlan& plan,
                           std::string& detail) {
  plan.root = op.root;
  if (plan.root < 0 || plan.root >= n) {
    return Invalid(name, "root ", plan.root, " out of range for group size ", n);
  }
  detail = absl::StrCat(" root=", plan.root);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpPlan> PlanOp(const OpRequest& op, const MeshShape& mesh) {
  OpPlan plan;
  plan.kind = op.kind;
  const absl::string_view name = OpKindName(plan.kind);
  if (name == "unknown_op") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown op kind ", static_cast<int>(op.kind)));
  }

  if (absl::Status st = PlanAxes(op, mesh, name, plan); !st.ok()) return st;
  std::vector<std::string> axis_names;
  for (int id : plan.axis_ids) {
    plan.group_size *= mesh.sizes[id];
    axis_names.push_back(mesh.names[id]);
  }
  const int n = plan.group_size;

  PlanGroups(mesh, plan);

  std::string over = absl::StrCat(" over (", absl::StrJoin(axis_names, ","), ")");
  if (op.kind == OpKind::kBarrier) {
    plan.signature = absl::StrCat("barrier", over);
    return plan;
  }

  // Dtype and shape.
  plan.dtype = op.dtype;
  if (DTypeSize(plan.dtype) == 0) {  // kInvalid, or a number no dtype has
    // kInvalid: unset, or a number the request could not carry (wire_plan.h).
    return Invalid(name, "dtype ",
                   plan.dtype == DType::kInvalid ? std::string("(unset or out of range)")
                                                 : absl::StrCat(static_cast<int>(op.dtype)),
                   " is not one of float32, float64, float16, bfloat16, int8, "
                   "uint8, int32, uint32, int64, uint64, bool, float8_e4m3fn, "
                   "float8_e5m2");
  }
  if (op.shape.size() > static_cast<size_t>(kMaxRank)) {
    return Invalid(name, "rank ", op.shape.size(), " exceeds the maximum ", kMaxRank);
  }
  plan.in_shape = op.shape;
  auto elements = CheckedElements(name, "input shape", plan.in_shape);
  if (!elements.ok()) return elements.status();
  // At most 2^40 elements of at most 8 bytes: no overflow.
  plan.in_bytes = static_cast<uint64_t>(*elements) * DTypeSize(plan.dtype);
  plan.out_dtype = plan.dtype;
  plan.out_shape = plan.in_shape;
  std::string detail;

  switch (op.kind) {
    case OpKind::kPsum:
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
      plan.out_dtype = ReduceResultDType(ToReduceKind(plan.kind), plan.dtype);
      break;
    case OpKind::kAllGather:
      if (absl::Status st = PlanAllGather(op, name, n, plan, detail); !st.ok()) return st;
      break;
    case OpKind::kPsumScatter:
      if (absl::Status st = PlanPsumScatter(op, name, n, plan, detail); !st.ok()) return st;
      break;
    case OpKind::kAllToAll:
      if (absl::Status st = PlanAllToAll(op, name, n, plan, detail); !st.ok()) return st;
      break;
    case OpKind::kPpermute:
      if (absl::Status st = PlanPpermute(op, name, n, plan, detail); !st.ok()) return st;
      break;
    case OpKind::kBroadcast:
      if (absl::Status st = PlanBroadcast(op, name, n, plan, detail); !st.ok()) return st;
      break;
    default:
      break;
  }
  auto out_elements = CheckedElements(name, "result shape", plan.out_shape);
  if (!out_elements.ok()) return out_elements.status();
  plan.out_bytes = static_cast<uint64_t>(*out_elements) * DTypeSize(plan.out_dtype);
  plan.signature = absl::StrCat(name, " ", ShapeString(plan.dtype, plan.in_shape), over, detail);
  return plan;
}

}  // namespace collectived
