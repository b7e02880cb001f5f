#include "plan/wire_plan.h"

#include <gtest/gtest.h>

namespace collectived {
namespace {

MeshShape Mesh2x4() { return MeshShape{{"x", "y"}, {2, 4}}; }

v1::OpSpec Spec(v1::OpKind kind, std::vector<std::string> axes, std::vector<int64_t> shape,
                v1::DType dtype = v1::FLOAT32) {
  v1::OpSpec op;
  op.set_kind(kind);
  for (auto& a : axes) op.add_axes(a);
  for (int64_t d : shape) op.add_shape(d);
  op.set_dtype(dtype);
  return op;
}

TEST(MeshShapeTest, RowMajorCoordinates) {
  MeshShape m = Mesh2x4();
  EXPECT_EQ(m.num_members(), 8);
  EXPECT_EQ(m.Coordinate(6), (std::vector<int>{1, 2}));
  EXPECT_EQ(m.Index({1, 2}), 6);
}

TEST(OpPlanTest, GroupsOverOneAxisShareTheOtherCoordinates) {
  auto plan = PlanOp(Spec(v1::PSUM, {"x"}, {3}), Mesh2x4());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->group_size, 2);
  ASSERT_EQ(plan->groups.size(), 4u);
  // Members with y == 1 are 1 and 5.
  EXPECT_EQ(plan->groups[1], (std::vector<int>{1, 5}));
  EXPECT_EQ(plan->index_in_group[5], 1);
  EXPECT_EQ(plan->signature, "psum f32[3] over (x)");
}

TEST(OpPlanTest, TupleAxesLinearizeInTheGivenOrder) {
  auto yx = PlanOp(Spec(v1::ALL_GATHER, {"y", "x"}, {1}), Mesh2x4());
  ASSERT_TRUE(yx.ok()) << yx.status();
  ASSERT_EQ(yx->groups.size(), 1u);
  // Group index = iy * 2 + ix: member (x=1, y=0) = 4 has index 1.
  EXPECT_EQ(yx->index_in_group[4], 1);
  EXPECT_EQ(yx->index_in_group[1], 2);
  // ppermute numbers members by mesh position whatever the order (as JAX).
  auto p = PlanOp(Spec(v1::PPERMUTE, {"y", "x"}, {1}), Mesh2x4());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->index_in_group[4], 4);
  EXPECT_EQ(p->index_in_group[1], 1);
}

// An empty axes list without no_axes: every axis (what it has always meant
// on the wire; the SDK's AxisNames::All()).
TEST(OpPlanTest, EmptyAxesMeanAllAxes) {
  auto plan = PlanOp(Spec(v1::BARRIER, {}, {}), Mesh2x4());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->group_size, 8);
  EXPECT_EQ(plan->signature, "barrier over (x,y)");
}

// no_axes: JAX's empty tuple. Every member is a group of one, and the ops
// JAX drops for it (all_gather, psum_scatter) give the input's shape.
TEST(OpPlanTest, NoAxesFormGroupsOfOne) {
  auto none = [](v1::OpKind kind, std::vector<int64_t> shape) {
    auto op = Spec(kind, {}, std::move(shape));
    op.set_no_axes(true);
    return op;
  };
  auto plan = PlanOp(none(v1::PSUM, {3}), Mesh2x4());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->group_size, 1);
  EXPECT_TRUE(plan->axis_ids.empty());
  ASSERT_EQ(plan->groups.size(), 8u);
  for (int m = 0; m < 8; ++m) {
    EXPECT_EQ(plan->groups[plan->group_of[m]], (std::vector<int>{m}));
    EXPECT_EQ(plan->index_in_group[m], 0);
  }
  EXPECT_EQ(plan->out_shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(plan->signature, "psum f32[3] over ()");
  // Not the same op as over every axis: members must agree on it.
  EXPECT_NE(plan->signature, PlanOp(Spec(v1::PSUM, {}, {3}), Mesh2x4())->signature);

  auto out_shape = [](const v1::OpSpec& op) {
    auto p = PlanOp(op, Mesh2x4());
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->out_shape : std::vector<int64_t>{-1};
  };
  auto ag = none(v1::ALL_GATHER, {2, 3});
  ag.mutable_all_gather()->set_axis(1);
  EXPECT_EQ(out_shape(ag), (std::vector<int64_t>{2, 3}));  // no dimension inserted
  ag.mutable_all_gather()->set_tiled(true);
  EXPECT_EQ(out_shape(ag), (std::vector<int64_t>{2, 3}));
  auto rs = none(v1::PSUM_SCATTER, {5});
  EXPECT_EQ(out_shape(rs), (std::vector<int64_t>{5}));  // none scattered, whatever its size
  rs.mutable_psum_scatter()->set_tiled(true);
  EXPECT_EQ(out_shape(rs), (std::vector<int64_t>{5}));
  auto a2a = none(v1::ALL_TO_ALL, {1, 3});
  a2a.mutable_all_to_all()->set_concat_axis(1);
  EXPECT_EQ(out_shape(a2a), (std::vector<int64_t>{3, 1}));  // as JAX: a group of size 1
  auto pp = none(v1::PPERMUTE, {3});
  auto* pair = pp.mutable_ppermute()->add_perm();
  pair->set_source(0);
  pair->set_dest(0);
  EXPECT_EQ(out_shape(pp), (std::vector<int64_t>{3}));
  pair->set_dest(1);
  EXPECT_EQ(PlanOp(pp, Mesh2x4()).status().code(), absl::StatusCode::kInvalidArgument);
  auto bc = none(v1::BROADCAST, {3});
  bc.mutable_broadcast()->set_root(1);
  EXPECT_EQ(PlanOp(bc, Mesh2x4()).status().code(), absl::StatusCode::kInvalidArgument);
  auto barrier = PlanOp(none(v1::BARRIER, {}), Mesh2x4());
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  EXPECT_EQ(barrier->signature, "barrier over ()");

  // no_axes with axis names is contradictory.
  auto both = Spec(v1::PSUM, {"x"}, {3});
  both.set_no_axes(true);
  auto bad = PlanOp(both, Mesh2x4());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no_axes"), std::string::npos) << bad.status();
}

TEST(OpPlanTest, ResultShapes) {
  MeshShape m{{"i"}, {4}};
  auto op = Spec(v1::ALL_GATHER, {"i"}, {2, 3});
  op.mutable_all_gather()->set_axis(1);
  EXPECT_EQ(PlanOp(op, m)->out_shape, (std::vector<int64_t>{2, 4, 3}));
  op.mutable_all_gather()->set_tiled(true);
  EXPECT_EQ(PlanOp(op, m)->out_shape, (std::vector<int64_t>{2, 12}));

  auto rs = Spec(v1::PSUM_SCATTER, {"i"}, {3, 4});
  rs.mutable_psum_scatter()->set_scatter_dimension(1);
  EXPECT_EQ(PlanOp(rs, m)->out_shape, (std::vector<int64_t>{3}));
  rs = Spec(v1::PSUM_SCATTER, {"i"}, {8, 3});
  rs.mutable_psum_scatter()->set_tiled(true);
  EXPECT_EQ(PlanOp(rs, m)->out_shape, (std::vector<int64_t>{2, 3}));

  // Untiled all_to_all: insert(delete(shape, split), concat, n).
  auto a2a = Spec(v1::ALL_TO_ALL, {"i"}, {4, 2, 3});
  a2a.mutable_all_to_all()->set_split_axis(0);
  a2a.mutable_all_to_all()->set_concat_axis(2);
  EXPECT_EQ(PlanOp(a2a, m)->out_shape, (std::vector<int64_t>{2, 3, 4}));
  a2a = Spec(v1::ALL_TO_ALL, {"i"}, {2, 3, 4});
  a2a.mutable_all_to_all()->set_split_axis(2);
  a2a.mutable_all_to_all()->set_concat_axis(0);
  EXPECT_EQ(PlanOp(a2a, m)->out_shape, (std::vector<int64_t>{4, 2, 3}));
  a2a = Spec(v1::ALL_TO_ALL, {"i"}, {8, 3});
  a2a.mutable_all_to_all()->set_split_axis(0);
  a2a.mutable_all_to_all()->set_concat_axis(1);
  a2a.mutable_all_to_all()->set_tiled(true);
  EXPECT_EQ(PlanOp(a2a, m)->out_shape, (std::vector<int64_t>{2, 12}));

  auto mean = PlanOp(Spec(v1::PMEAN, {"i"}, {5}, v1::INT8), m);
  EXPECT_EQ(mean->out_dtype, DType::kF32);
  EXPECT_EQ(mean->out_bytes, 20u);
  EXPECT_EQ(PlanOp(Spec(v1::PMEAN, {"i"}, {5}, v1::UINT64), m)->out_dtype, DType::kF64);
  EXPECT_EQ(PlanOp(Spec(v1::PSUM, {"i"}, {5}, v1::BOOL), m)->out_dtype, DType::kI32);
  // float8: one byte per element; pmean keeps the dtype.
  for (auto [wire, dt] : {std::pair{v1::FLOAT8_E4M3FN, DType::kF8E4M3FN},
                          std::pair{v1::FLOAT8_E5M2, DType::kF8E5M2}}) {
    auto f8 = PlanOp(Spec(v1::PMEAN, {"i"}, {5}, wire), m);
    ASSERT_TRUE(f8.ok()) << f8.status();
    EXPECT_EQ(f8->dtype, dt);
    EXPECT_EQ(f8->out_dtype, dt);
    EXPECT_EQ(f8->in_bytes, 5u);
    EXPECT_EQ(f8->out_bytes, 5u);
  }
}

TEST(OpPlanTest, RejectsBadInputWithPreciseMessages) {
  MeshShape m{{"i"}, {4}};
  auto expect_invalid = [&](const v1::OpSpec& op, const std::string& fragment) {
    auto plan = PlanOp(op, m);
    ASSERT_FALSE(plan.ok()) << "accepted: " << fragment;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(fragment), std::string::npos) << plan.status();
  };
  expect_invalid(Spec(v1::OP_KIND_UNSPECIFIED, {"i"}, {1}), "unknown op kind");
  expect_invalid(Spec(v1::PSUM, {"j"}, {1}), "unknown axis name 'j'");
  expect_invalid(Spec(v1::PSUM, {"i", "i"}, {1}), "named twice");
  expect_invalid(Spec(v1::PSUM, {"i"}, {1}, v1::DTYPE_UNSPECIFIED), "dtype");
  expect_invalid(Spec(v1::PSUM, {"i"}, {1}, static_cast<v1::DType>(14)),
                 "dtype 14 is not one of");
  expect_invalid(Spec(v1::PSUM, {"i"}, {-1}), "negative dimension");
  expect_invalid(Spec(v1::PSUM, {"i"}, {1 << 30, 1 << 30, 4}), "2^40");
  expect_invalid(Spec(v1::PSUM_SCATTER, {"i"}, {4}, v1::BOOL), "bool");
  auto rs = Spec(v1::PSUM_SCATTER, {"i"}, {3});
  expect_invalid(rs, "must equal the group size 4");
  rs.mutable_psum_scatter()->set_tiled(true);
  expect_invalid(rs, "not divisible");
  auto ag = Spec(v1::ALL_GATHER, {"i"}, {3});
  ag.mutable_all_gather()->set_axis(2);
  expect_invalid(ag, "axis 2 out of range");
  auto pp = Spec(v1::PPERMUTE, {"i"}, {3});
  auto* pair = pp.mutable_ppermute()->add_perm();
  pair->set_source(0);
  pair->set_dest(1);
  pair = pp.mutable_ppermute()->add_perm();
  pair->set_source(0);
  pair->set_dest(2);
  expect_invalid(pp, "source 0 appears twice");
  pp.mutable_ppermute()->mutable_perm(1)->set_source(5);
  expect_invalid(pp, "out of range");
  auto bc = Spec(v1::BROADCAST, {"i"}, {3});
  bc.mutable_broadcast()->set_root(4);
  expect_invalid(bc, "root 4 out of range");
  auto a2a = Spec(v1::ALL_TO_ALL, {"i"}, {3});
  expect_invalid(a2a, "must equal the group size");
}

// Every dimension, derived dimension, element count and byte size is checked
// for overflow; a zero dimension does not hide an oversized other one.
TEST(OpPlanTest, SizesThatOverflowAreRejectedForEveryOpFamily) {
  MeshShape m{{"i"}, {2}};
  constexpr int64_t kHuge = int64_t{1} << 62;
  auto expect_invalid = [&](const v1::OpSpec& op, const std::string& fragment) {
    auto plan = PlanOp(op, m);
    ASSERT_FALSE(plan.ok()) << "accepted " << op.ShortDebugString() << " with result "
                            << ShapeString(plan->out_dtype, plan->out_shape);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(fragment), std::string::npos) << plan.status();
  };
  // The reported case: f32[0, 2^62] gathered over 2 members, tiled.
  auto ag = Spec(v1::ALL_GATHER, {"i"}, {0, kHuge});
  ag.mutable_all_gather()->set_axis(1);
  ag.mutable_all_gather()->set_tiled(true);
  expect_invalid(ag, "dimension 1 of size 4611686018427387904 exceeds 2^40");
  ag.mutable_all_gather()->set_tiled(false);
  expect_invalid(ag, "exceeds 2^40");
  for (v1::OpKind kind : {v1::PSUM, v1::PMEAN, v1::PMAX, v1::PMIN, v1::PPERMUTE, v1::BROADCAST}) {
    expect_invalid(Spec(kind, {"i"}, {kHuge, 0}), "dimension 0 of size");
  }
  auto rs = Spec(v1::PSUM_SCATTER, {"i"}, {2, 0, kHuge});
  rs.mutable_psum_scatter()->set_tiled(true);
  expect_invalid(rs, "dimension 2 of size");
  auto a2a = Spec(v1::ALL_TO_ALL, {"i"}, {2, 0, kHuge});
  a2a.mutable_all_to_all()->set_tiled(true);
  expect_invalid(a2a, "dimension 2 of size");
  // Zero dimensions do not hide non-zero ones whose product is too large
  // (2^30 * 2^30 overflows no int64, but exceeds 2^40).
  expect_invalid(Spec(v1::PSUM, {"i"}, {1 << 30, 0, 1 << 30}), "2^40");
  // Derived dimensions: within the limit in the input, over it in the result.
  constexpr int64_t kMax = kMaxElements;
  ag = Spec(v1::ALL_GATHER, {"i"}, {0, kMax});
  ag.mutable_all_gather()->set_axis(1);
  ag.mutable_all_gather()->set_tiled(true);
  expect_invalid(ag, "result dimension 1");
  a2a = Spec(v1::ALL_TO_ALL, {"i"}, {0, kMax});
  a2a.mutable_all_to_all()->set_split_axis(0);
  a2a.mutable_all_to_all()->set_concat_axis(1);
  a2a.mutable_all_to_all()->set_tiled(true);
  expect_invalid(a2a, "result dimension 1");
  // Element counts of the result: 2^40 elements gathered over 2.
  ag = Spec(v1::ALL_GATHER, {"i"}, {kMax}, v1::UINT8);
  expect_invalid(ag, "2^40");
  ag.mutable_all_gather()->set_tiled(true);
  expect_invalid(ag, "2^40");
  // At the limit everything is exact: 2^40 float64 elements are 2^43 bytes.
  auto big = PlanOp(Spec(v1::PSUM, {"i"}, {kMax}, v1::FLOAT64), m);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->in_bytes, uint64_t{1} << 43);
  EXPECT_EQ(big->out_bytes, uint64_t{1} << 43);
  auto empty = PlanOp(Spec(v1::ALL_GATHER, {"i"}, {0, kMax / 2}), m);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->out_shape, (std::vector<int64_t>{2, 0, kMax / 2}));
  EXPECT_EQ(empty->out_bytes, 0u);
}

// Negative axes count from the end, as numpy's and JAX's: for an untiled
// all_gather from the end of the output (which has one more dimension), for
// the others from the end of the input. The plan and the signature hold the
// normalized axis, so members spelling it either way submit the same op.
TEST(OpPlanTest, NegativeAxesCountFromTheEnd) {
  MeshShape m{{"i"}, {4}};
  auto same = [&](const v1::OpSpec& negative, const v1::OpSpec& positive) {
    auto a = PlanOp(negative, m);
    auto b = PlanOp(positive, m);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->out_shape, b->out_shape) << negative.ShortDebugString();
    EXPECT_EQ(a->signature, b->signature);
    EXPECT_EQ(a->axis, b->axis);
    EXPECT_EQ(a->split_axis, b->split_axis);
    EXPECT_EQ(a->concat_axis, b->concat_axis);
    EXPECT_EQ(a->a2a_shape, b->a2a_shape);
  };
  auto out_shape = [&](const v1::OpSpec& op) {
    auto plan = PlanOp(op, m);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->out_shape : std::vector<int64_t>{-1};
  };
  auto gather = [](int axis, bool tiled) {
    auto op = Spec(v1::ALL_GATHER, {"i"}, {2, 3, 5});
    op.mutable_all_gather()->set_axis(axis);
    op.mutable_all_gather()->set_tiled(tiled);
    return op;
  };
  // Untiled: the output has rank 4, so -1 is 3 (a new last dimension) and -4 is 0.
  EXPECT_EQ(out_shape(gather(-1, false)), (std::vector<int64_t>{2, 3, 5, 4}));
  for (int a = -4; a <= -1; ++a) same(gather(a, false), gather(a + 4, false));
  for (int a = -3; a <= -1; ++a) same(gather(a, true), gather(a + 3, true));
  EXPECT_EQ(out_shape(gather(-1, true)), (std::vector<int64_t>{2, 3, 20}));
  auto last = PlanOp(gather(-1, false), m);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->signature, "all_gather f32[2,3,5] over (i) axis=3");

  auto scatter = [](std::vector<int64_t> shape, int dim, bool tiled) {
    auto op = Spec(v1::PSUM_SCATTER, {"i"}, std::move(shape));
    op.mutable_psum_scatter()->set_scatter_dimension(dim);
    op.mutable_psum_scatter()->set_tiled(tiled);
    return op;
  };
  same(scatter({3, 4}, -1, false), scatter({3, 4}, 1, false));
  same(scatter({4, 3}, -2, false), scatter({4, 3}, 0, false));
  same(scatter({3, 8}, -1, true), scatter({3, 8}, 1, true));
  EXPECT_EQ(out_shape(scatter({3, 8}, -1, true)), (std::vector<int64_t>{3, 2}));

  auto a2a = [](std::vector<int64_t> shape, int split, int concat, bool tiled) {
    auto op = Spec(v1::ALL_TO_ALL, {"i"}, std::move(shape));
    op.mutable_all_to_all()->set_split_axis(split);
    op.mutable_all_to_all()->set_concat_axis(concat);
    op.mutable_all_to_all()->set_tiled(tiled);
    return op;
  };
  // Untiled: the output has the input's rank, so concat_axis counts from the
  // end of either.
  same(a2a({2, 3, 4}, -1, 0, false), a2a({2, 3, 4}, 2, 0, false));
  same(a2a({4, 2, 3}, 0, -1, false), a2a({4, 2, 3}, 0, 2, false));
  same(a2a({2, 4, 3}, -2, -3, false), a2a({2, 4, 3}, 1, 0, false));
  same(a2a({2, 4, 3}, -2, -2, false), a2a({2, 4, 3}, 1, 1, false));
  EXPECT_EQ(out_shape(a2a({4, 2, 3}, 0, -1, false)), (std::vector<int64_t>{2, 3, 4}));
  same(a2a({3, 8}, -1, -2, true), a2a({3, 8}, 1, 0, true));
  same(a2a({8, 3}, -2, -1, true), a2a({8, 3}, 0, 1, true));
  EXPECT_EQ(out_shape(a2a({3, 8}, -1, -2, true)), (std::vector<int64_t>{12, 2}));
}

TEST(OpPlanTest, AxesOutOfRangeNameTheValidRange) {
  MeshShape m{{"i"}, {4}};
  auto expect_invalid = [&](const v1::OpSpec& op, const std::string& fragment) {
    auto plan = PlanOp(op, m);
    ASSERT_FALSE(plan.ok()) << "accepted: " << op.ShortDebugString();
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(fragment), std::string::npos) << plan.status();
  };
  auto ag = Spec(v1::ALL_GATHER, {"i"}, {2, 3, 5});
  ag.mutable_all_gather()->set_axis(-5);
  expect_invalid(ag, "axis -5 out of range for input of rank 3 (valid: -4..3)");
  ag.mutable_all_gather()->set_axis(4);
  expect_invalid(ag, "axis 4 out of range for input of rank 3 (valid: -4..3)");
  ag.mutable_all_gather()->set_tiled(true);
  ag.mutable_all_gather()->set_axis(-4);
  expect_invalid(ag, "axis -4 out of range for tiled input of rank 3 (valid: -3..2)");
  auto rs = Spec(v1::PSUM_SCATTER, {"i"}, {4, 4});
  rs.mutable_psum_scatter()->set_scatter_dimension(-3);
  expect_invalid(rs, "scatter_dimension -3 out of range for input of rank 2 (valid: -2..1)");
  auto a2a = Spec(v1::ALL_TO_ALL, {"i"}, {4, 4});
  a2a.mutable_all_to_all()->set_split_axis(-3);
  expect_invalid(a2a, "split_axis -3 out of range for input of rank 2 (valid: -2..1)");
  a2a.mutable_all_to_all()->set_split_axis(0);
  a2a.mutable_all_to_all()->set_concat_axis(2);
  expect_invalid(a2a, "concat_axis 2 out of range for input of rank 2 (valid: -2..1)");
  // A scalar has no dimension to concatenate, scatter or split along.
  auto tiled_scalar = Spec(v1::ALL_GATHER, {"i"}, {});
  tiled_scalar.mutable_all_gather()->set_tiled(true);
  expect_invalid(tiled_scalar, "axis 0 out of range for tiled input of rank 0 (it has no dimension)");
  auto scalar = Spec(v1::PSUM_SCATTER, {"i"}, {});
  scalar.mutable_psum_scatter()->set_scatter_dimension(-1);
  expect_invalid(scalar, "input of rank 0 has no dimension");
}

TEST(OpPlanTest, SignatureCarriesEveryParameter) {
  MeshShape m{{"i"}, {2}};
  auto a = Spec(v1::PPERMUTE, {"i"}, {3});
  auto* p = a.mutable_ppermute()->add_perm();
  p->set_source(0);
  p->set_dest(1);
  auto b = a;
  b.mutable_ppermute()->mutable_perm(0)->set_dest(0);
  EXPECT_NE(PlanOp(a, m)->signature, PlanOp(b, m)->signature);
  EXPECT_EQ(PlanOp(a, m)->signature, "ppermute f32[3] over (i) perm=[(0,1)]");
}

TEST(WaitingMembersTest, OneMemberIsWaitingSeveralAreWaiting) {
  EXPECT_EQ(WaitingMembers({"1"}), "member 1 is waiting");
  EXPECT_EQ(WaitingMembers({"0", "2"}), "members 0,2 are waiting");
}

}  // namespace
}  // namespace collectived
