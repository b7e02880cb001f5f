#include "client/src/op_spec.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "plan/op_plan.h"

namespace collectived::internal {
namespace {

// The public kinds and the wire's: one table, checked at compile time
// against both enums.
struct KindRow {
  CollectiveKind kind;
  v1::OpKind wire;
};
constexpr KindRow kKinds[] = {
    {CollectiveKind::kPsum, v1::PSUM},
    {CollectiveKind::kPmean, v1::PMEAN},
    {CollectiveKind::kPmax, v1::PMAX},
    {CollectiveKind::kPmin, v1::PMIN},
    {CollectiveKind::kAllGather, v1::ALL_GATHER},
    {CollectiveKind::kPpermute, v1::PPERMUTE},
    {CollectiveKind::kPsumScatter, v1::PSUM_SCATTER},
    {CollectiveKind::kAllToAll, v1::ALL_TO_ALL},
    {CollectiveKind::kBroadcast, v1::BROADCAST},
    {CollectiveKind::kBarrier, v1::BARRIER},
};
static_assert(std::size(kKinds) == kNumOpKinds - 1, "every op kind has a CollectiveKind");
constexpr bool RowsInOrder() {
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (static_cast<size_t>(kKinds[i].kind) != i) return false;
  }
  return true;
}
static_assert(RowsInOrder(), "kKinds is indexed by CollectiveKind");
// (plan/wire_plan.cc checks that the plan's OpKind is the wire's, value for
// value.)

bool Known(CollectiveKind kind) {
  return static_cast<size_t>(kind) < std::size(kKinds);
}

v1::BufferRef RefOf(const Array& a, bool with_size) {
  v1::BufferRef ref;
  ref.set_buffer_id(a.buffer != nullptr ? a.buffer->id() : "");
  ref.set_offset(static_cast<int64_t>(a.offset));
  // The daemon refuses a result longer than the region declared here
  // (CheckArgs has refused sizes that overflow).
  if (with_size) ref.set_size_bytes(static_cast<int64_t>(a.num_bytes()));
  return ref;
}

}  // namespace

OpArgs ArgsOf(const Collective& op) {
  return OpArgs{.kind = op.kind,
                .x = op.kind == CollectiveKind::kBarrier ? nullptr : &op.x,
                .axes = op.axes,
                .out = op.out ? &*op.out : nullptr,
                .perm = &op.perm,
                .axis = op.axis,
                .concat_axis = op.concat_axis,
                .tiled = op.tiled};
}

v1::OpKind WireKind(CollectiveKind kind) {
  return Known(kind) ? kKinds[static_cast<size_t>(kind)].wire : v1::OP_KIND_UNSPECIFIED;
}

absl::Status CheckArgs(const OpArgs& args) {
  if (!Known(args.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown collective kind ", static_cast<int>(args.kind)));
  }
  if (args.out == nullptr && (args.kind == CollectiveKind::kAllGather ||
                              args.kind == CollectiveKind::kPsumScatter)) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.kind == CollectiveKind::kAllGather ? "all_gather" : "psum_scatter",
        " needs an output array"));
  }
  if (args.axes.unset()) {
    return absl::InvalidArgumentError(
        "the op's axes name nothing (an empty AxisNames, as a bare {} gives): write "
        "AxisNames::All() for every axis of the mesh (what {} once meant) or "
        "AxisNames::None() for the empty tuple (JAX's axis_name=(): each member gets its "
        "own input back)");
  }
  if (args.out != nullptr &&
      args.out->num_bytes() > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    std::string shape;
    for (int64_t d : args.out->shape) absl::StrAppend(&shape, shape.empty() ? "" : ",", d);
    return absl::InvalidArgumentError(absl::StrCat(
        "out array of shape [", shape,
        "] has a negative dimension or a byte size that overflows int64"));
  }
  return absl::OkStatus();
}

v1::OpSpec SpecOf(const std::string& mesh_id, const OpArgs& args) {
  v1::OpSpec spec;
  spec.set_mesh_id(mesh_id);
  spec.set_kind(WireKind(args.kind));
  // All(): an empty list, which means every axis; the empty tuple: no_axes.
  for (const std::string& a : args.axes.names()) spec.add_axes(a);
  if (args.axes.none()) spec.set_no_axes(true);
  if (args.x != nullptr) {
    spec.set_dtype(static_cast<v1::DType>(args.x->dtype));
    for (int64_t d : args.x->shape) spec.add_shape(d);
    *spec.mutable_input() = RefOf(*args.x, false);
  }
  if (args.out != nullptr) {
    const size_t bytes = args.out->num_bytes();
    *spec.mutable_output() =
        RefOf(*args.out, bytes <= static_cast<size_t>(std::numeric_limits<int64_t>::max()));
  }
  switch (args.kind) {
    case CollectiveKind::kAllGather:
      spec.mutable_all_gather()->set_axis(args.axis);
      spec.mutable_all_gather()->set_tiled(args.tiled);
      break;
    case CollectiveKind::kPsumScatter:
      spec.mutable_psum_scatter()->set_scatter_dimension(args.axis);
      spec.mutable_psum_scatter()->set_tiled(args.tiled);
      break;
    case CollectiveKind::kAllToAll:
      spec.mutable_all_to_all()->set_split_axis(args.axis);
      spec.mutable_all_to_all()->set_concat_axis(args.concat_axis);
      spec.mutable_all_to_all()->set_tiled(args.tiled);
      break;
    case CollectiveKind::kBroadcast:
      spec.mutable_broadcast()->set_root(args.axis);
      break;
    case CollectiveKind::kPpermute: {
      v1::PpermuteParams* p = spec.mutable_ppermute();  // present even when empty
      if (args.perm != nullptr) {
        for (const auto& [s, d] : *args.perm) {
          v1::PermutePair* pair = p->add_perm();
          pair->set_source(s);
          pair->set_dest(d);
        }
      }
      break;
    }
    default:
      break;
  }
  return spec;
}

bool MayRunMemberSide(const OpArgs& args) {
  switch (args.kind) {
    case CollectiveKind::kPsum:
    case CollectiveKind::kPmean:
    case CollectiveKind::kPmax:
    case CollectiveKind::kPmin:
    case CollectiveKind::kBarrier:
    case CollectiveKind::kAllGather:
      return true;
    default:
      return false;
  }
}

MemberOpKey KeyOf(const OpArgs& args) {
  MemberOpKey key;
  key.kind = WireKind(args.kind);
  if (args.x != nullptr) {
    key.dtype = static_cast<int>(static_cast<v1::DType>(args.x->dtype));
    key.shape = args.x->shape;
  }
  key.axes = args.axes.names();
  key.no_axes = args.axes.none();
  if (args.kind == CollectiveKind::kAllGather) {
    key.gather_axis = args.axis;
    key.gather_tiled = args.tiled;
  }
  return key;
}

}  // namespace collectived::internal
