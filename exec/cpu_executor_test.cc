// What is particular to the CPU executor: its streaming stores on unaligned
// outputs. Everything an executor must do (every op, dtype, group, in place
// and out of place, the JAX edge cases) is the executor suite's
// (tests/exec/executor_suite.h), which runs on the CPU executor in
// tests/exec/cpu_executor_suite_test.cc.
#include "exec/cpu_executor.h"
#include "plan/wire_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace collectived {
namespace {

struct Members {
  std::vector<std::vector<int32_t>> in, out;
  std::vector<MemberIo> io(bool in_place) {
    std::vector<MemberIo> r(in.size());
    for (size_t m = 0; m < in.size(); ++m) {
      r[m].in = reinterpret_cast<const uint8_t*>(in[m].data());
      r[m].out = in_place ? reinterpret_cast<uint8_t*>(in[m].data())
                          : reinterpret_cast<uint8_t*>(out[m].data());
    }
    return r;
  }
};

Members Make(int n, int64_t in_elems, int64_t out_elems) {
  Members m;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> v(in_elems);
    for (int64_t e = 0; e < in_elems; ++e) v[e] = static_cast<int32_t>(1000 * i + e);
    m.in.push_back(v);
    m.out.emplace_back(out_elems, -7);
  }
  return m;
}

OpPlan Plan(v1::OpSpec op, int n) {
  op.set_dtype(v1::INT32);
  op.add_axes("i");
  auto plan = PlanOp(op, MeshShape{{"i"}, {n}});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

v1::OpSpec Kind(v1::OpKind k, std::vector<int64_t> shape) {
  v1::OpSpec op;
  op.set_kind(k);
  for (auto d : shape) op.add_shape(d);
  return op;
}

// Small chunks so that every op crosses many work items, on the pool (no
// serial shortcut for small ops), writing every result with streaming stores.
CpuExecutor StreamingExecutor() {
  return CpuExecutor({.threads = 3, .chunk_bytes = 64, .serial_bytes = 0, .stream_bytes = 0});
}

TEST(CpuExecutorTest, StreamingPsumInPlaceAndOutOfPlaceUnaligned) {
  const int n = 3;
  const int64_t count = 1001;  // not a multiple of any vector width
  Members m = Make(n, count, count + 1);
  std::vector<int32_t> expected(count);
  for (int64_t e = 0; e < count; ++e) expected[e] = m.in[0][e] + m.in[1][e] + m.in[2][e];
  auto ex = StreamingExecutor();
  // Out of place, each output starting 4 bytes past a 16-byte boundary or
  // wherever the vector put it: head, body and tail of StreamCopy.
  auto io = m.io(false);
  for (auto& x : io) x.out += sizeof(int32_t);
  ASSERT_TRUE(ex.Run(Plan(Kind(v1::PSUM, {count}), n), io).ok());
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(m.out[i][0], -7) << "member " << i << ": wrote before its output";
    EXPECT_EQ(std::vector<int32_t>(m.out[i].begin() + 1, m.out[i].end()), expected)
        << "member " << i;
  }
  ASSERT_TRUE(ex.Run(Plan(Kind(v1::PSUM, {count}), n), m.io(true)).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(m.in[i], expected) << "member " << i;
}

TEST(CpuExecutorTest, StreamingAllGatherAlongInnerAxis) {
  const int n = 3;
  const int rows = 5, cols = 37;  // rows of 148 bytes: runs cross the chunks
  Members m = Make(n, rows * cols, rows * n * cols);
  auto op = Kind(v1::ALL_GATHER, {rows, cols});
  op.mutable_all_gather()->set_axis(1);
  auto ex = StreamingExecutor();
  ASSERT_TRUE(ex.Run(Plan(op, n), m.io(false)).ok());
  std::vector<int32_t> expected;
  for (int row = 0; row < rows; ++row)
    for (int src = 0; src < n; ++src)
      for (int col = 0; col < cols; ++col) expected.push_back(m.in[src][row * cols + col]);
  for (int i = 0; i < n; ++i) EXPECT_EQ(m.out[i], expected) << "member " << i;
}

// RunOneMember (a member-side op's own result, without Run's layers) writes
// exactly Run's bytes: every reduction and all_gathers along either
// dimension, tiled or not, float and integer dtypes, random bit patterns
// (NaNs with payloads, subnormals, infinities), groups along either axis of
// a 2x2 mesh, every axis, the empty tuple and a mesh of one.
TEST(CpuExecutorTest, RunOneMemberWritesRunsBytes) {
  struct Op {
    v1::OpKind kind;
    int axis;
    bool tiled;
  };
  const std::vector<Op> kinds = {{v1::PSUM, 0, false},      {v1::PMEAN, 0, false},
                                 {v1::PMAX, 0, false},      {v1::PMIN, 0, false},
                                 {v1::ALL_GATHER, 0, true}, {v1::ALL_GATHER, 0, false},
                                 {v1::ALL_GATHER, 1, true}, {v1::ALL_GATHER, 1, false}};
  const std::vector<v1::DType> dtypes = {v1::FLOAT32, v1::FLOAT64, v1::FLOAT16, v1::BFLOAT16,
                                         v1::INT32,   v1::UINT8,   v1::BOOL,    v1::FLOAT8_E5M2};
  struct Mesh {
    MeshShape shape;
    std::vector<std::string> axes;
    bool no_axes;
  };
  const std::vector<Mesh> meshes = {{{{"i", "j"}, {2, 2}}, {"i"}, false},
                                    {{{"i", "j"}, {2, 2}}, {"j"}, false},
                                    {{{"i", "j"}, {2, 2}}, {"i", "j"}, false},
                                    {{{"i", "j"}, {2, 2}}, {}, true},
                                    {{{"i"}, {1}}, {"i"}, false}};
  std::mt19937_64 rng(7);
  CpuExecutor ex({.threads = 1});
  int checked = 0, small_groups = 0;
  for (const Mesh& mesh : meshes) {
    const int n = static_cast<int>(mesh.shape.num_members());
    for (const Op& kind : kinds) {
      for (v1::DType dtype : dtypes) {
        v1::OpSpec op = Kind(kind.kind, {3, 5});
        op.set_dtype(dtype);
        if (kind.kind == v1::ALL_GATHER) {
          op.mutable_all_gather()->set_axis(kind.axis);
          op.mutable_all_gather()->set_tiled(kind.tiled);
        }
        for (const std::string& a : mesh.axes) op.add_axes(a);
        op.set_no_axes(mesh.no_axes);
        absl::StatusOr<OpPlan> plan = PlanOp(op, mesh.shape);
        if (!plan.ok()) continue;  // a combination the daemon refuses too
        std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(plan->in_bytes));
        for (auto& v : in) {
          for (auto& b : v) b = static_cast<uint8_t>(rng());
          if (dtype == v1::BOOL) {
            for (auto& b : v) b &= 1;
          }
        }
        std::vector<std::vector<uint8_t>> want(n, std::vector<uint8_t>(plan->out_bytes, 0xa5));
        std::vector<MemberIo> io(n);
        for (int m = 0; m < n; ++m) {
          io[m].in = in[m].data();
          io[m].out = want[m].data();
        }
        ASSERT_TRUE(ex.Run(*plan, io).ok());
        for (int m = 0; m < n; ++m) {
          std::vector<uint8_t> got(plan->out_bytes, 0x5a);
          std::vector<MemberIo> own(n);
          for (int k = 0; k < n; ++k) own[k].in = in[k].data();
          own[m].out = got.data();
          ASSERT_TRUE(ex.RunOneMember(*plan, own, m));
          EXPECT_EQ(got, want[m]) << op.ShortDebugString() << " over " << n << " members, member "
                                  << m;
          ++checked;
          // RunSmallGroup: the same bytes from the group's inputs, for a
          // group of the whole mesh (a reduction: one that reduces something);
          // else false, nothing written.
          std::fill(got.begin(), got.end(), 0x5a);
          const bool whole = plan->groups.size() == 1 &&
                             (kind.kind == v1::ALL_GATHER || !plan->ReducesNothing());
          std::vector<const void*> group_in;
          if (whole) {
            for (int k : plan->groups[0]) group_in.push_back(in[k].data());
          }
          ASSERT_EQ(ex.RunSmallGroup(*plan, group_in.data(), got.data()), whole)
              << op.ShortDebugString() << " over " << n << " members";
          if (whole) {
            EXPECT_EQ(got, want[m]) << "from the group's inputs: " << op.ShortDebugString()
                                    << " over " << n << " members, member " << m;
            ++small_groups;
          } else {
            EXPECT_EQ(got, std::vector<uint8_t>(plan->out_bytes, 0x5a));
          }
          if (kind.kind == v1::ALL_GATHER) continue;
          // ReduceShare: the same bytes, in three shares (one of them with
          // streaming stores) and an empty one.
          std::fill(got.begin(), got.end(), 0x5a);
          const size_t count = plan->in_bytes / DTypeSize(plan->dtype);
          const size_t cuts[] = {0, 4, 4, 11, count};
          for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
            ASSERT_TRUE(ex.ReduceShare(*plan, own, m, cuts[c], cuts[c + 1] - cuts[c], c == 2));
          }
          EXPECT_EQ(got, want[m]) << "in shares: " << op.ShortDebugString() << " over " << n
                                  << " members, member " << m;
        }
      }
    }
  }
  EXPECT_GT(checked, 600);
  EXPECT_GT(small_groups, 150);
}

// Anything but a small reduction is left to Run: false, nothing written.
TEST(CpuExecutorTest, RunOneMemberRefusesOtherOpsAndLargeOnes) {
  CpuExecutor ex({.threads = 1, .serial_bytes = 256});
  Members m = Make(2, 64, 128);
  v1::OpSpec scatter = Kind(v1::PSUM_SCATTER, {4});
  scatter.mutable_psum_scatter()->set_tiled(true);
  for (const v1::OpSpec& op : {scatter, Kind(v1::PSUM, {64})}) {
    const OpPlan plan = Plan(op, 2);
    auto io = m.io(false);
    EXPECT_FALSE(ex.RunOneMember(plan, io, 0)) << op.ShortDebugString();
    EXPECT_FALSE(ex.RunOneMember(plan, io, 2)) << "no member 2";
    const void* inputs[] = {m.in[0].data(), m.in[1].data()};
    EXPECT_FALSE(ex.RunSmallGroup(plan, inputs, m.out[0].data())) << op.ShortDebugString();
    EXPECT_EQ(m.out[0], std::vector<int32_t>(128, -7)) << op.ShortDebugString();
  }
  EXPECT_TRUE(ex.RunOneMember(Plan(Kind(v1::PSUM, {4}), 2), m.io(false), 1));
  EXPECT_EQ(m.out[1][0], 0 + 1000);
  EXPECT_EQ(m.out[1][3], 3 + 1003);
}

// ReduceShare computes a range of a reduction's result only: false, nothing
// written, for anything else.
TEST(CpuExecutorTest, ReduceShareRefusesOtherOpsRangesAndMembers) {
  CpuExecutor ex({.threads = 1});
  Members m = Make(2, 64, 128);
  auto io = m.io(false);
  const OpPlan psum = Plan(Kind(v1::PSUM, {64}), 2);
  const OpPlan gather = Plan(Kind(v1::ALL_GATHER, {64}), 2);
  EXPECT_FALSE(ex.ReduceShare(gather, io, 0, 0, 64, false));
  EXPECT_FALSE(ex.ReduceShare(psum, io, 2, 0, 64, false)) << "no member 2";
  EXPECT_FALSE(ex.ReduceShare(psum, io, 0, 65, 0, false)) << "starts past the end";
  EXPECT_FALSE(ex.ReduceShare(psum, io, 0, 60, 5, false)) << "ends past the end";
  EXPECT_FALSE(ex.ReduceShare(psum, io, 0, 1, ~size_t{0}, false)) << "wraps";
  EXPECT_EQ(m.out[0], std::vector<int32_t>(128, -7));
  EXPECT_EQ(m.out[1], std::vector<int32_t>(128, -7));
  io[1].out = nullptr;  // member 0's output only
  ASSERT_TRUE(ex.ReduceShare(psum, io, 0, 60, 4, false));
  EXPECT_EQ(m.out[0][59], -7);
  EXPECT_EQ(m.out[0][60], 60 + 1060);
  EXPECT_EQ(m.out[0][63], 63 + 1063);
  EXPECT_EQ(m.out[0][64], -7);
  EXPECT_EQ(m.out[1], std::vector<int32_t>(128, -7));
}

}  // namespace
}  // namespace collectived
