// CpuExecutor on plain heap memory: chunking, in-place staging and the
// block copies of all_gather / psum_scatter / all_to_all. Integer data keeps
// the expected values exact; float rules are covered in reduce_test.cc and by
// the cross-process and JAX conformance tests.
#include "daemon/exec/cpu_executor.h"
#include "daemon/core/op_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>
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

// ---------------------------------------------------------------------------
// Raw bytes, for the float edge cases (the expected bits are what jax.lax
// 0.10.2 returns on CPU for the same inputs).

template <typename U>
std::vector<uint8_t> Bytes(const std::vector<U>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(U));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename U>
std::vector<U> FromBytes(const std::vector<uint8_t>& b) {
  std::vector<U> v(b.size() / sizeof(U));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(U));
  return v;
}

// Runs `op` (dtype, shape and parameters set) over `axes` of `mesh`, member
// m's input being inputs[m]; returns every member's output bytes (out of
// place, or in place when the result has the input's size and `in_place`).
std::vector<std::vector<uint8_t>> RunBytes(v1::OpSpec op, const MeshShape& mesh,
                                           const std::vector<std::string>& axes,
                                           std::vector<std::vector<uint8_t>> inputs,
                                           bool in_place = false) {
  for (const auto& a : axes) op.add_axes(a);
  auto plan = PlanOp(op, mesh);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  EXPECT_EQ(inputs.size(), plan->group_of.size());
  if (in_place) {
    EXPECT_EQ(plan->in_bytes, plan->out_bytes);
  }
  std::vector<std::vector<uint8_t>> outs(inputs.size(),
                                         std::vector<uint8_t>(plan->out_bytes, 0xA5));
  std::vector<MemberIo> io(inputs.size());
  for (size_t m = 0; m < inputs.size(); ++m) {
    EXPECT_EQ(inputs[m].size(), plan->in_bytes);
    io[m].in = inputs[m].data();
    io[m].out = in_place ? inputs[m].data() : outs[m].data();
  }
  auto ex = Executor();
  EXPECT_TRUE(ex.Run(*plan, io).ok());
  return in_place ? inputs : outs;
}

v1::OpSpec Typed(v1::OpKind k, v1::DType dt, std::vector<int64_t> shape) {
  v1::OpSpec op = Kind(k, std::move(shape));
  op.set_dtype(dt);
  return op;
}

const MeshShape kMeshOfOne{{"x"}, {1}};

// In a program of one device XLA drops the all-reduce: psum, pmean, pmax and
// pmin of a mesh of one member return the input as is. -0.0 stays -0.0, a
// signaling NaN stays signaling, a subnormal stays (a reduction would give
// +0.0, a quiet NaN, +0.0), and pmax of a NaN is that NaN (not -inf).
TEST(CpuExecutorTest, MeshOfOneReduceReturnsTheInputBits) {
  const std::vector<uint32_t> f32 = {0x80000000, 0x7f800001, 0xffc00002,
                                     0x00000001, 0x80000003, 0x3f800000};
  const std::vector<uint64_t> f64 = {0x8000000000000000, 0x7ff0000000000001,
                                     0x8000000000000001, 0x3ff0000000000000,
                                     0xfff8000000000005, 0x0};
  const std::vector<uint16_t> f16 = {0x8000, 0x7c01, 0xfe03, 0x0001, 0x8003, 0x3c00};
  for (v1::OpKind kind : {v1::PSUM, v1::PMEAN, v1::PMAX, v1::PMIN}) {
    SCOPED_TRACE(v1::OpKind_Name(kind));
    for (bool in_place : {false, true}) {
      EXPECT_EQ(FromBytes<uint32_t>(RunBytes(Typed(kind, v1::FLOAT32, {6}), kMeshOfOne,
                                             {"x"}, {Bytes(f32)}, in_place)[0]),
                f32);
      EXPECT_EQ(FromBytes<uint64_t>(RunBytes(Typed(kind, v1::FLOAT64, {6}), kMeshOfOne,
                                             {"x"}, {Bytes(f64)}, in_place)[0]),
                f64);
      EXPECT_EQ(FromBytes<uint16_t>(RunBytes(Typed(kind, v1::FLOAT16, {6}), kMeshOfOne,
                                             {"x"}, {Bytes(f16)}, in_place)[0]),
                f16);
      // bfloat16: XLA converts to float32 and back around the (dropped)
      // all-reduce, which makes NaNs canonical; nothing else changes.
      EXPECT_EQ(FromBytes<uint16_t>(RunBytes(Typed(kind, v1::BFLOAT16, {6}), kMeshOfOne,
                                             {"x"},
                                             {Bytes(std::vector<uint16_t>{
                                                 0x8000, 0x7f81, 0xffc3, 0x1, 0x8003, 0x3f80})},
                                             in_place)[0]),
                (std::vector<uint16_t>{0x8000, 0x7fc0, 0xffc0, 0x1, 0x8003, 0x3f80}));
    }
  }
}

// The result dtype still changes: pmean of integers and bool gives floats,
// psum of bool int32.
TEST(CpuExecutorTest, MeshOfOneReduceConvertsTheDType) {
  const std::vector<int8_t> i8 = {-128, 127, 3};
  EXPECT_EQ(FromBytes<float>(RunBytes(Typed(v1::PMEAN, v1::INT8, {3}), kMeshOfOne, {"x"},
                                      {Bytes(i8)})[0]),
            (std::vector<float>{-128.0f, 127.0f, 3.0f}));
  EXPECT_EQ(FromBytes<int8_t>(RunBytes(Typed(v1::PSUM, v1::INT8, {3}), kMeshOfOne, {"x"},
                                       {Bytes(i8)})[0]),
            i8);
  const std::vector<int32_t> i32 = {std::numeric_limits<int32_t>::max(), -7};
  EXPECT_EQ(FromBytes<float>(RunBytes(Typed(v1::PMEAN, v1::INT32, {2}), kMeshOfOne, {"x"},
                                      {Bytes(i32)})[0]),
            (std::vector<float>{2147483648.0f, -7.0f}));
  const std::vector<uint64_t> u64 = {std::numeric_limits<uint64_t>::max(), 3};
  EXPECT_EQ(FromBytes<double>(RunBytes(Typed(v1::PMEAN, v1::UINT64, {2}), kMeshOfOne, {"x"},
                                       {Bytes(u64)})[0]),
            (std::vector<double>{18446744073709551616.0, 3.0}));
  const std::vector<uint8_t> b = {1, 0, 1};
  EXPECT_EQ(FromBytes<int32_t>(RunBytes(Typed(v1::PSUM, v1::BOOL, {3}), kMeshOfOne, {"x"},
                                        {b})[0]),
            (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(FromBytes<float>(RunBytes(Typed(v1::PMEAN, v1::BOOL, {3}), kMeshOfOne, {"x"},
                                      {b})[0]),
            (std::vector<float>{1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(RunBytes(Typed(v1::PMAX, v1::BOOL, {3}), kMeshOfOne, {"x"}, {b})[0], b);
}

// A group of one inside a bigger mesh is reduced (XLA runs that all-reduce),
// and so is psum_scatter even in a mesh of one (XLA keeps a reduce-scatter):
// from +0.0, flushing subnormals, quieting NaNs; pmax from -inf.
TEST(CpuExecutorTest, GroupOfOneInABiggerMeshIsReduced) {
  const std::vector<uint32_t> f32 = {0x80000000, 0x7f800001, 0xffc00002,
                                     0x00000001, 0x80000003, 0x3f800000};
  const MeshShape x2y1{{"x", "y"}, {2, 1}};
  for (const auto& axes : std::vector<std::vector<std::string>>{{"y"}}) {
    auto sum = RunBytes(Typed(v1::PSUM, v1::FLOAT32, {6}), x2y1, axes, {Bytes(f32), Bytes(f32)});
    for (const auto& out : sum) {
      EXPECT_EQ(FromBytes<uint32_t>(out),
                (std::vector<uint32_t>{0x0, 0x7fc00001, 0xffc00002, 0x0, 0x0, 0x3f800000}));
    }
    auto max = RunBytes(Typed(v1::PMAX, v1::FLOAT32, {6}), x2y1, axes, {Bytes(f32), Bytes(f32)});
    EXPECT_EQ(FromBytes<uint32_t>(max[1]),
              (std::vector<uint32_t>{0x80000000, 0xff800000, 0xff800000, 0x0, 0x80000000,
                                     0x3f800000}));
  }
  auto scatter = Typed(v1::PSUM_SCATTER, v1::FLOAT32, {6});
  scatter.mutable_psum_scatter()->set_tiled(true);
  EXPECT_EQ(FromBytes<uint32_t>(RunBytes(scatter, kMeshOfOne, {"x"}, {Bytes(f32)})[0]),
            (std::vector<uint32_t>{0x0, 0x7fc00001, 0xffc00002, 0x0, 0x0, 0x3f800000}));
}

// JAX's empty axis tuple is no collective at all: psum(x, ()) returns x's
// bits, even inside a bigger mesh (where a group of one over a named axis is
// reduced, above).
TEST(CpuExecutorTest, NoAxesReturnTheInputBits) {
  const std::vector<uint32_t> a = {0x80000000, 0x7f800001, 0xffc00002, 0x00000001, 0x80000003, 0x3f800000};
  const std::vector<uint32_t> b = {0x00000002, 0x80000000, 0x7fa00000, 0x3f800000, 0x00000005, 0x80000000};
  const MeshShape x2y1{{"x", "y"}, {2, 1}};
  for (v1::OpKind kind : {v1::PSUM, v1::PMAX, v1::PMIN, v1::PMEAN}) {
    auto op = Typed(kind, v1::FLOAT32, {6});
    op.set_no_axes(true);
    auto out = RunBytes(op, x2y1, {}, {Bytes(a), Bytes(b)});
    EXPECT_EQ(FromBytes<uint32_t>(out[0]), a) << kind;
    EXPECT_EQ(FromBytes<uint32_t>(out[1]), b) << kind;
  }
}

// Data movement copies bits: a signaling NaN (and other payloads, -0.0 and
// subnormals) arrives unchanged, in every dtype, in place or not.
TEST(CpuExecutorTest, DataMovementKeepsEveryBit) {
  const std::vector<uint32_t> f32 = {0x7f800001, 0xffbfffff, 0x7fc00123, 0x80000000,
                                     0x00000001, 0x80000003};
  const std::vector<uint16_t> half = {0x7c01, 0xfd55, 0x7e01, 0x8000, 0x0001, 0x8003};
  const std::vector<uint16_t> bf16 = {0x7f81, 0xffbf, 0x7fc1, 0x8000, 0x0001, 0x8003};
  const std::vector<uint64_t> f64 = {0x7ff0000000000001, 0xfff7ffffffffffff,
                                     0x7ff8000000000123, 0x8000000000000000, 0x1,
                                     0x8000000000000003};
  const int n = 3;
  struct Typed16 {
    v1::DType dt;
    std::vector<uint8_t> bytes;
  };
  const std::vector<Typed16> data = {{v1::FLOAT32, Bytes(f32)},
                                     {v1::FLOAT16, Bytes(half)},
                                     {v1::BFLOAT16, Bytes(bf16)},
                                     {v1::FLOAT64, Bytes(f64)}};
  for (const auto& [dt, bytes] : data) {
    SCOPED_TRACE(v1::DType_Name(dt));
    // Member m holds the pattern rotated by m elements, so every output
    // element says where it came from.
    const size_t es = bytes.size() / 6;
    std::vector<std::vector<uint8_t>> in(n);
    for (int m = 0; m < n; ++m) {
      in[m].resize(bytes.size());
      for (size_t e = 0; e < 6; ++e) {
        std::memcpy(in[m].data() + e * es, bytes.data() + ((e + m) % 6) * es, es);
      }
    }
    const MeshShape mesh{{"i"}, {n}};
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "out of place");
      // all_gather tiled: every member gets the inputs concatenated.
      auto gather = Typed(v1::ALL_GATHER, dt, {6});
      gather.mutable_all_gather()->set_tiled(true);
      if (!in_place) {
        std::vector<uint8_t> want;
        for (int m = 0; m < n; ++m) want.insert(want.end(), in[m].begin(), in[m].end());
        for (const auto& out : RunBytes(gather, mesh, {"i"}, in)) {
          EXPECT_EQ(out, want);
        }
      }
      // ppermute: a ring, member m gets member m-1's input.
      auto perm = Typed(v1::PPERMUTE, dt, {6});
      for (int s = 0; s < n; ++s) {
        auto* pair = perm.mutable_ppermute()->add_perm();
        pair->set_source(s);
        pair->set_dest((s + 1) % n);
      }
      auto permuted = RunBytes(perm, mesh, {"i"}, in, in_place);
      for (int m = 0; m < n; ++m) EXPECT_EQ(permuted[m], in[(m + n - 1) % n]) << "member " << m;
      // broadcast from member 2.
      auto bcast = Typed(v1::BROADCAST, dt, {6});
      bcast.mutable_broadcast()->set_root(2);
      for (const auto& out : RunBytes(bcast, mesh, {"i"}, in, in_place)) EXPECT_EQ(out, in[2]);
      // all_to_all [3, 2] split 0, concat 0 (tiled): member r gets row r of
      // every member, in member order.
      auto a2a = Typed(v1::ALL_TO_ALL, dt, {3, 2});
      a2a.mutable_all_to_all()->set_tiled(true);
      auto moved = RunBytes(a2a, mesh, {"i"}, in, in_place);
      for (int r = 0; r < n; ++r) {
        std::vector<uint8_t> want;
        for (int j = 0; j < n; ++j) {
          want.insert(want.end(), in[j].begin() + r * 2 * es, in[j].begin() + (r + 1) * 2 * es);
        }
        EXPECT_EQ(moved[r], want) << "member " << r;
      }
    }
  }
  // The same in a mesh of one.
  for (v1::OpKind kind : {v1::ALL_GATHER, v1::PPERMUTE, v1::BROADCAST, v1::ALL_TO_ALL}) {
    SCOPED_TRACE(v1::OpKind_Name(kind));
    auto op = Typed(kind, v1::BFLOAT16, {6});
    if (kind == v1::PPERMUTE) {
      auto* pair = op.mutable_ppermute()->add_perm();
      pair->set_source(0);
      pair->set_dest(0);
    }
    if (kind == v1::ALL_TO_ALL) op.mutable_all_to_all()->set_tiled(true);
    EXPECT_EQ(RunBytes(op, kMeshOfOne, {"x"}, {Bytes(bf16)})[0], Bytes(bf16));
  }
}

}  // namespace
}  // namespace collectived
