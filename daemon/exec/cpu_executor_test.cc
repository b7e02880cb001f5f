// CpuExecutor on plain heap memory: chunking, in-place staging and the
// block copies of all_gather / psum_scatter / all_to_all. Integer data keeps
// the expected values exact; float rules are covered in reduce_test.cc and by
// the cross-process and JAX conformance tests.
#include "daemon/exec/cpu_executor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

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
// serial shortcut for small ops).
CpuExecutor Executor() {
  return CpuExecutor({.threads = 3, .chunk_bytes = 64, .serial_bytes = 0});
}
// The same, writing every result with streaming stores.
CpuExecutor StreamingExecutor() {
  return CpuExecutor({.threads = 3, .chunk_bytes = 64, .serial_bytes = 0, .stream_bytes = 0});
}

TEST(CpuExecutorTest, PsumInPlaceAcrossChunks) {
  const int n = 3;
  const int64_t count = 1001;
  Members m = Make(n, count, 0);
  auto expected = m.in[0];
  for (int64_t e = 0; e < count; ++e) expected[e] = m.in[0][e] + m.in[1][e] + m.in[2][e];
  auto ex = Executor();
  ASSERT_TRUE(ex.Run(Plan(Kind(v1::PSUM, {count}), n), m.io(true)).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(m.in[i], expected) << "member " << i;
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

TEST(CpuExecutorTest, PpermuteInPlaceRingIsStaged) {
  const int n = 4;
  Members m = Make(n, 50, 0);
  auto original = m.in;
  auto op = Kind(v1::PPERMUTE, {50});
  for (int s = 0; s < n - 1; ++s) {  // 3 -> 0 missing: member 0 gets zeros
    auto* p = op.mutable_ppermute()->add_perm();
    p->set_source(s);
    p->set_dest(s + 1);
  }
  auto ex = Executor();
  ASSERT_TRUE(ex.Run(Plan(op, n), m.io(true)).ok());
  EXPECT_EQ(m.in[0], std::vector<int32_t>(50, 0));
  for (int i = 1; i < n; ++i) EXPECT_EQ(m.in[i], original[i - 1]) << "member " << i;
}

TEST(CpuExecutorTest, AllGatherAlongInnerAxis) {
  const int n = 2;
  Members m = Make(n, 6, 12);  // [2,3] -> [2,2,3] with axis 1
  auto op = Kind(v1::ALL_GATHER, {2, 3});
  op.mutable_all_gather()->set_axis(1);
  auto ex = Executor();
  ASSERT_TRUE(ex.Run(Plan(op, n), m.io(false)).ok());
  std::vector<int32_t> expected;
  for (int row = 0; row < 2; ++row)
    for (int src = 0; src < n; ++src)
      for (int col = 0; col < 3; ++col) expected.push_back(m.in[src][row * 3 + col]);
  for (int i = 0; i < n; ++i) EXPECT_EQ(m.out[i], expected);
}

TEST(CpuExecutorTest, PsumScatterTiledAlongSecondDimension) {
  const int n = 2;
  Members m = Make(n, 3 * 4, 3 * 2);  // [3,4] tiled over dim 1 -> [3,2]
  auto op = Kind(v1::PSUM_SCATTER, {3, 4});
  op.mutable_psum_scatter()->set_scatter_dimension(1);
  op.mutable_psum_scatter()->set_tiled(true);
  auto ex = Executor();
  ASSERT_TRUE(ex.Run(Plan(op, n), m.io(false)).ok());
  for (int r = 0; r < n; ++r) {
    for (int row = 0; row < 3; ++row) {
      for (int c = 0; c < 2; ++c) {
        int col = r * 2 + c;
        EXPECT_EQ(m.out[r][row * 2 + c], m.in[0][row * 4 + col] + m.in[1][row * 4 + col]);
      }
    }
  }
}

TEST(CpuExecutorTest, AllToAllUntiledInPlace) {
  const int n = 3;
  Members m = Make(n, 3 * 2, 0);  // [3,2], split 0, concat 1 -> [2,3]
  auto original = m.in;
  auto op = Kind(v1::ALL_TO_ALL, {3, 2});
  op.mutable_all_to_all()->set_split_axis(0);
  op.mutable_all_to_all()->set_concat_axis(1);
  auto ex = Executor();
  ASSERT_TRUE(ex.Run(Plan(op, n), m.io(true)).ok());
  // out_r[k, j] = x_j[r, k]
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < n; ++j) EXPECT_EQ(m.in[r][k * n + j], original[j][r * 2 + k]);
}

TEST(CpuExecutorTest, BroadcastFromRoot) {
  const int n = 3;
  Members m = Make(n, 300, 300);
  auto op = Kind(v1::BROADCAST, {300});
  op.mutable_broadcast()->set_root(2);
  auto ex = Executor();
  ASSERT_TRUE(ex.Run(Plan(op, n), m.io(false)).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(m.out[i], m.in[2]);
}

}  // namespace
}  // namespace collectived
