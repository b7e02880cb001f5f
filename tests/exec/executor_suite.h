// One test suite for every executor: the same cases run on each backend
// (GoogleTest type-parameterized tests), so a new executor is checked
// against what the CPU executor is checked against.
//
// A backend is a traits type:
//
//   struct MyBackend {
//     // Shown in skip messages.
//     static constexpr const char* kName = "...";
//     // The executor under test (never null).
//     static std::unique_ptr<Executor> MakeExecutor();
//     // Memory the executor runs on, for member `member` of an op: at least
//     // `bytes` bytes (bytes may be 0), or an error.
//     static absl::StatusOr<void*> Allocate(size_t bytes, int member);
//     static void Free(void* p);
//     // Host bytes into that memory, and back.
//     static absl::Status CopyIn(void* dst, const void* src, size_t bytes);
//     static absl::Status CopyOut(void* dst, const void* src, size_t bytes);
//     // MemberIo::device of `member` (the CPU: -1).
//     static int Device(int member);
//     // Optional: true for a backend that needs a GPU (see below).
//     static constexpr bool kNeedsGpu = true;
//   };
//   INSTANTIATE_TYPED_TEST_SUITE_P(My, ExecutorSuite, MyBackend);
//
// in a file of its own (tests/exec/cpu_executor_suite_test.cc is the CPU's).
// When the backend's executor is not viable here (IsViable() false, e.g. a
// CUDA executor on a host without a GPU) every case is skipped
// (GTEST_SKIP) with the executor's WhyNotViable(); for a backend with
// kNeedsGpu true, COLLECTIVED_REQUIRE_GPU=1 makes that a failure
// (tests/harness/require_gpu.h).
//
// A CUDA backend: Allocate is cudaSetDevice(Device(member)) then
// cudaMalloc (device memory: the suite never dereferences it on the host),
// Free is cudaFree, CopyIn / CopyOut are cudaMemcpy (HostToDevice /
// DeviceToHost), Device(member) spreads members over the visible GPUs
// (member % cudaGetDeviceCount()), and MakeExecutor returns the CUDA
// executor; Run must have finished writing when it returns, as for the CPU.
// Build that file only when COLLECTIVED_WITH_CUDA is on, into a test binary
// that links collectived_core and collectived_integration_sweep (as
// collectived_unit_tests does, tests/CMakeLists.txt) and the CUDA runtime.
//
// The cases: every op kind on every dtype, in place and out of place, over
// every axis choice of one- and two-axis meshes (groups), checked bit for
// bit against the integration tests' independent reference model
// (tests/integration/reference.h); the JAX edge cases (meshes and groups of
// one, the empty axis tuple, data movement keeping every bit); and that no
// op writes past its output region.
#ifndef COLLECTIVED_TESTS_EXEC_EXECUTOR_SUITE_H_
#define COLLECTIVED_TESTS_EXEC_EXECUTOR_SUITE_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "plan/wire_plan.h"
#include "exec/executor.h"
#include "tests/harness/require_gpu.h"
#include "tests/integration/reference.h"
#include "tests/integration/sweep.h"

namespace collectived::executor_suite {

// Bytes written after every output region before the op; still there after.
inline constexpr size_t kGuardBytes = 64;
inline constexpr uint8_t kFill = 0xA5;

// CopyIn / CopyOut of a backend whose memory is host memory.
inline absl::Status HostCopy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

// The memory half of a backend whose members' memory is plain host memory:
// a backend derives from it and adds kName and MakeExecutor (and may hide
// Allocate, Free or Device).
struct HostMemoryBackend {
  static absl::StatusOr<void*> Allocate(size_t bytes, int) {
    // 64-byte aligned, as the daemon's page-aligned buffers are at offset 0.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (p == nullptr) return absl::ResourceExhaustedError("aligned_alloc");
    return p;
  }
  static void Free(void* p) { std::free(p); }
  static absl::Status CopyIn(void* dst, const void* src, size_t bytes) {
    return HostCopy(dst, src, bytes);
  }
  static absl::Status CopyOut(void* dst, const void* src, size_t bytes) {
    return HostCopy(dst, src, bytes);
  }
  static int Device(int) { return -1; }
};

template <typename U>
std::vector<uint8_t> Bytes(const std::vector<U>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(U));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename U>
std::vector<U> FromBytes(const std::vector<uint8_t>& b) {
  std::vector<U> v(b.size() / sizeof(U));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(U));
  return v;
}

// Member m's int32 input: 1000 * m + e.
inline std::vector<uint8_t> Iota(int m, int64_t elems) {
  std::vector<int32_t> v(static_cast<size_t>(elems));
  for (int64_t e = 0; e < elems; ++e) v[e] = static_cast<int32_t>(1000 * m + e);
  return Bytes(v);
}

inline v1::OpSpec Typed(v1::OpKind k, v1::DType dt, std::vector<int64_t> shape) {
  v1::OpSpec op;
  op.set_kind(k);
  op.set_dtype(dt);
  for (auto d : shape) op.add_shape(d);
  return op;
}

// The wire form of an integration sweep case.
inline v1::OpSpec ToOpSpec(const integration::Case& c) {
  using integration::Op;
  static const v1::OpKind kKinds[] = {v1::PSUM,      v1::PMEAN,        v1::PMAX,
                                      v1::PMIN,      v1::ALL_GATHER,   v1::PPERMUTE,
                                      v1::PSUM_SCATTER, v1::ALL_TO_ALL, v1::BROADCAST,
                                      v1::BARRIER};
  v1::OpSpec op;
  op.set_kind(kKinds[static_cast<int>(c.op)]);
  op.set_dtype(static_cast<v1::DType>(static_cast<int>(c.dtype)));
  for (int64_t d : c.shape) op.add_shape(d);
  if (c.axes.empty()) {
    op.set_no_axes(true);
  } else if (c.axes != integration::kEveryAxis) {
    for (const auto& a : c.axes) op.add_axes(a);
  }
  const integration::OpParams& p = c.params;
  switch (c.op) {
    case Op::kAllGather:
      op.mutable_all_gather()->set_axis(p.axis);
      op.mutable_all_gather()->set_tiled(p.tiled);
      break;
    case Op::kPpermute:
      for (const auto& [s, d] : p.perm) {
        auto* pair = op.mutable_ppermute()->add_perm();
        pair->set_source(s);
        pair->set_dest(d);
      }
      break;
    case Op::kPsumScatter:
      op.mutable_psum_scatter()->set_scatter_dimension(p.axis);
      op.mutable_psum_scatter()->set_tiled(p.tiled);
      break;
    case Op::kAllToAll:
      op.mutable_all_to_all()->set_split_axis(p.axis);
      op.mutable_all_to_all()->set_concat_axis(p.concat_axis);
      op.mutable_all_to_all()->set_tiled(p.tiled);
      break;
    case Op::kBroadcast:
      op.mutable_broadcast()->set_root(p.root);
      break;
    default:
      break;
  }
  return op;
}

template <typename Backend>
class ExecutorSuite : public ::testing::Test {
 protected:
  // Backend::kNeedsGpu, false when the backend does not say.
  static constexpr bool NeedsGpu() {
    if constexpr (requires { Backend::kNeedsGpu; }) {
      return Backend::kNeedsGpu;
    } else {
      return false;
    }
  }

  void SetUp() override {
    executor_ = Backend::MakeExecutor();
    ASSERT_NE(executor_, nullptr);
    if (!executor_->IsViable()) {
      if constexpr (NeedsGpu()) {
        COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU("the " << Backend::kName << " executor cannot run here: "
                                                    << executor_->WhyNotViable());
      } else {
        GTEST_SKIP() << "the " << Backend::kName
                     << " executor cannot run here: " << executor_->WhyNotViable();
      }
    }
  }

  // Runs `op` (dtype, shape and parameters set) over `axes` of `mesh`
  // (empty: as `op` says), member m's input being inputs[m]; returns every
  // member's output bytes (in place when `in_place`: the result must have
  // the input's size). Checks that nothing is written past an output. On
  // failure: a failed expectation and empty outputs (never fewer entries
  // than members).
  std::vector<std::vector<uint8_t>> RunBytes(v1::OpSpec op, const MeshShape& mesh,
                                             const std::vector<std::string>& axes,
                                             const std::vector<std::vector<uint8_t>>& inputs,
                                             bool in_place = false) {
    std::vector<std::vector<uint8_t>> outs(inputs.size());
    for (const auto& a : axes) op.add_axes(a);
    auto plan = PlanOp(op, mesh);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return outs;
    EXPECT_EQ(inputs.size(), plan->group_of.size());
    if (inputs.size() != plan->group_of.size()) return outs;
    if (in_place && plan->in_bytes != plan->out_bytes) {
      ADD_FAILURE() << "in place, but the result has " << plan->out_bytes
                    << " bytes and the input " << plan->in_bytes;
      return outs;
    }
    std::vector<MemberIo> io(inputs.size());
    std::vector<void*> ins(inputs.size(), nullptr), outs_mem(inputs.size(), nullptr);
    struct Release {
      std::vector<void*>* a;
      std::vector<void*>* b;
      ~Release() {
        for (void* p : *a) if (p != nullptr) Backend::Free(p);
        for (void* p : *b) if (p != nullptr) Backend::Free(p);
      }
    } release{&ins, &outs_mem};
    const size_t out_region = plan->out_bytes + kGuardBytes;
    for (size_t m = 0; m < inputs.size(); ++m) {
      EXPECT_EQ(inputs[m].size(), plan->in_bytes) << "member " << m;
      if (inputs[m].size() != plan->in_bytes) return outs;
      const int member = static_cast<int>(m);
      // In place: the input region, followed by the guard.
      std::vector<uint8_t> region(in_place ? out_region : plan->in_bytes, kFill);
      if (!inputs[m].empty()) std::memcpy(region.data(), inputs[m].data(), inputs[m].size());
      auto in = Backend::Allocate(region.size(), member);
      EXPECT_TRUE(in.ok()) << in.status();
      if (!in.ok()) return outs;
      ins[m] = *in;
      absl::Status st = Backend::CopyIn(ins[m], region.data(), region.size());
      EXPECT_TRUE(st.ok()) << st;
      if (!in_place) {
        auto out = Backend::Allocate(out_region, member);
        EXPECT_TRUE(out.ok()) << out.status();
        if (!out.ok()) return outs;
        outs_mem[m] = *out;
        std::vector<uint8_t> fill(out_region, kFill);
        st = Backend::CopyIn(outs_mem[m], fill.data(), fill.size());
        EXPECT_TRUE(st.ok()) << st;
      }
      io[m].in = static_cast<const uint8_t*>(ins[m]);
      io[m].out = static_cast<uint8_t*>(in_place ? ins[m] : outs_mem[m]);
      io[m].device = Backend::Device(member);
    }
    absl::Status run = executor_->Run(*plan, io);
    EXPECT_TRUE(run.ok()) << run;
    if (!run.ok()) return outs;
    for (size_t m = 0; m < inputs.size(); ++m) {
      std::vector<uint8_t> region(out_region);
      absl::Status st = Backend::CopyOut(region.data(), io[m].out, region.size());
      EXPECT_TRUE(st.ok()) << st;
      for (size_t k = plan->out_bytes; k < out_region; ++k) {
        if (region[k] != kFill) {
          ADD_FAILURE() << "member " << m << ": byte " << k - plan->out_bytes
                        << " past the output was written";
          break;
        }
      }
      region.resize(plan->out_bytes);
      outs[m] = std::move(region);
    }
    return outs;
  }

  std::unique_ptr<Executor> executor_;
};

TYPED_TEST_SUITE_P(ExecutorSuite);

const MeshShape kMeshOfOne{{"x"}, {1}};

TYPED_TEST_P(ExecutorSuite, PsumInPlaceAndOutOfPlace) {
  const int n = 3;
  const int64_t count = 1001;  // odd: not a multiple of any vector width or chunk
  std::vector<std::vector<uint8_t>> in;
  for (int m = 0; m < n; ++m) in.push_back(Iota(m, count));
  std::vector<int32_t> expected(count);
  for (int64_t e = 0; e < count; ++e) {
    expected[e] = static_cast<int32_t>(1000 * 0 + e + 1000 * 1 + e + 1000 * 2 + e);
  }
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    auto out = this->RunBytes(Typed(v1::PSUM, v1::INT32, {count}), MeshShape{{"i"}, {n}}, {"i"},
                              in, in_place);
    for (int m = 0; m < n; ++m) EXPECT_EQ(FromBytes<int32_t>(out[m]), expected) << "member " << m;
  }
}

TYPED_TEST_P(ExecutorSuite, PpermuteInPlaceRingIsStaged) {
  const int n = 4;
  std::vector<std::vector<uint8_t>> in;
  for (int m = 0; m < n; ++m) in.push_back(Iota(m, 50));
  auto op = Typed(v1::PPERMUTE, v1::INT32, {50});
  for (int s = 0; s < n - 1; ++s) {  // 3 -> 0 missing: member 0 gets zeros
    auto* p = op.mutable_ppermute()->add_perm();
    p->set_source(s);
    p->set_dest(s + 1);
  }
  auto out = this->RunBytes(op, MeshShape{{"i"}, {n}}, {"i"}, in, /*in_place=*/true);
  EXPECT_EQ(FromBytes<int32_t>(out[0]), std::vector<int32_t>(50, 0));
  for (int m = 1; m < n; ++m) EXPECT_EQ(out[m], in[m - 1]) << "member " << m;
}

TYPED_TEST_P(ExecutorSuite, AllGatherAlongInnerAxis) {
  const int n = 2;
  std::vector<std::vector<uint8_t>> in;
  for (int m = 0; m < n; ++m) in.push_back(Iota(m, 6));
  auto op = Typed(v1::ALL_GATHER, v1::INT32, {2, 3});  // [2,3] -> [2,2,3] with axis 1
  op.mutable_all_gather()->set_axis(1);
  auto out = this->RunBytes(op, MeshShape{{"i"}, {n}}, {"i"}, in);
  std::vector<int32_t> expected;
  for (int row = 0; row < 2; ++row)
    for (int src = 0; src < n; ++src)
      for (int col = 0; col < 3; ++col) expected.push_back(1000 * src + row * 3 + col);
  for (int m = 0; m < n; ++m) EXPECT_EQ(FromBytes<int32_t>(out[m]), expected) << "member " << m;
}

TYPED_TEST_P(ExecutorSuite, PsumScatterTiledAlongSecondDimension) {
  const int n = 2;
  std::vector<std::vector<uint8_t>> in;
  for (int m = 0; m < n; ++m) in.push_back(Iota(m, 12));
  auto op = Typed(v1::PSUM_SCATTER, v1::INT32, {3, 4});  // tiled over dim 1 -> [3,2]
  op.mutable_psum_scatter()->set_scatter_dimension(1);
  op.mutable_psum_scatter()->set_tiled(true);
  auto out = this->RunBytes(op, MeshShape{{"i"}, {n}}, {"i"}, in);
  for (int r = 0; r < n; ++r) {
    auto got = FromBytes<int32_t>(out[r]);
    ASSERT_EQ(got.size(), 6u);
    for (int row = 0; row < 3; ++row) {
      for (int c = 0; c < 2; ++c) {
        const int col = r * 2 + c;
        EXPECT_EQ(got[row * 2 + c], (row * 4 + col) + (1000 + row * 4 + col));
      }
    }
  }
}

TYPED_TEST_P(ExecutorSuite, AllToAllUntiledInPlace) {
  const int n = 3;
  std::vector<std::vector<uint8_t>> in;
  for (int m = 0; m < n; ++m) in.push_back(Iota(m, 6));
  auto op = Typed(v1::ALL_TO_ALL, v1::INT32, {3, 2});  // split 0, concat 1 -> [2,3]
  op.mutable_all_to_all()->set_split_axis(0);
  op.mutable_all_to_all()->set_concat_axis(1);
  auto out = this->RunBytes(op, MeshShape{{"i"}, {n}}, {"i"}, in, /*in_place=*/true);
  // out_r[k, j] = x_j[r, k]
  for (int r = 0; r < n; ++r) {
    auto got = FromBytes<int32_t>(out[r]);
    ASSERT_EQ(got.size(), 6u);
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < n; ++j) EXPECT_EQ(got[k * n + j], 1000 * j + r * 2 + k);
  }
}

TYPED_TEST_P(ExecutorSuite, BroadcastFromRoot) {
  const int n = 3;
  std::vector<std::vector<uint8_t>> in;
  for (int m = 0; m < n; ++m) in.push_back(Iota(m, 300));
  auto op = Typed(v1::BROADCAST, v1::INT32, {300});
  op.mutable_broadcast()->set_root(2);
  for (bool in_place : {false, true}) {
    auto out = this->RunBytes(op, MeshShape{{"i"}, {n}}, {"i"}, in, in_place);
    for (int m = 0; m < n; ++m) EXPECT_EQ(out[m], in[2]) << "member " << m;
  }
}

// In a program of one device XLA drops the all-reduce: psum, pmean, pmax and
// pmin of a mesh of one member return the input as is (the expected bits are
// what jax.lax 0.10.2 returns on CPU). -0.0 stays -0.0, a signaling NaN
// stays signaling, a subnormal stays, and pmax of a NaN is that NaN.
TYPED_TEST_P(ExecutorSuite, MeshOfOneReduceReturnsTheInputBits) {
  const std::vector<uint32_t> f32 = {0x80000000, 0x7f800001, 0xffc00002,
                                     0x00000001, 0x80000003, 0x3f800000};
  const std::vector<uint64_t> f64 = {0x8000000000000000, 0x7ff0000000000001,
                                     0x8000000000000001, 0x3ff0000000000000,
                                     0xfff8000000000005, 0x0};
  const std::vector<uint16_t> f16 = {0x8000, 0x7c01, 0xfe03, 0x0001, 0x8003, 0x3c00};
  for (v1::OpKind kind : {v1::PSUM, v1::PMEAN, v1::PMAX, v1::PMIN}) {
    SCOPED_TRACE(v1::OpKind_Name(kind));
    for (bool in_place : {false, true}) {
      EXPECT_EQ(FromBytes<uint32_t>(this->RunBytes(Typed(kind, v1::FLOAT32, {6}), kMeshOfOne,
                                                   {"x"}, {Bytes(f32)}, in_place)[0]),
                f32);
      EXPECT_EQ(FromBytes<uint64_t>(this->RunBytes(Typed(kind, v1::FLOAT64, {6}), kMeshOfOne,
                                                   {"x"}, {Bytes(f64)}, in_place)[0]),
                f64);
      EXPECT_EQ(FromBytes<uint16_t>(this->RunBytes(Typed(kind, v1::FLOAT16, {6}), kMeshOfOne,
                                                   {"x"}, {Bytes(f16)}, in_place)[0]),
                f16);
      // bfloat16: XLA converts to float32 and back around the (dropped)
      // all-reduce, which makes NaNs canonical; nothing else changes.
      EXPECT_EQ(FromBytes<uint16_t>(this->RunBytes(
                    Typed(kind, v1::BFLOAT16, {6}), kMeshOfOne, {"x"},
                    {Bytes(std::vector<uint16_t>{0x8000, 0x7f81, 0xffc3, 0x1, 0x8003, 0x3f80})},
                    in_place)[0]),
                (std::vector<uint16_t>{0x8000, 0x7fc0, 0xffc0, 0x1, 0x8003, 0x3f80}));
      // float8: XLA converts to float16 and back. float8_e4m3fn keeps every
      // bit (its NaNs survive); a float8_e5m2 NaN becomes 0x7f, sign dropped.
      const std::vector<uint8_t> e4m3 = {0x80, 0x7f, 0xff, 0x01, 0x81, 0x7e};
      EXPECT_EQ(this->RunBytes(Typed(kind, v1::FLOAT8_E4M3FN, {6}), kMeshOfOne, {"x"}, {e4m3},
                               in_place)[0],
                e4m3);
      EXPECT_EQ(this->RunBytes(Typed(kind, v1::FLOAT8_E5M2, {6}), kMeshOfOne, {"x"},
                               {std::vector<uint8_t>{0x80, 0x7d, 0xfe, 0x01, 0xfc, 0x3c}},
                               in_place)[0],
                (std::vector<uint8_t>{0x80, 0x7f, 0x7f, 0x01, 0xfc, 0x3c}));
    }
  }
}

// The result dtype still changes: pmean of integers and bool gives floats,
// psum of bool int32.
TYPED_TEST_P(ExecutorSuite, MeshOfOneReduceConvertsTheDType) {
  const std::vector<int8_t> i8 = {-128, 127, 3};
  EXPECT_EQ(FromBytes<float>(this->RunBytes(Typed(v1::PMEAN, v1::INT8, {3}), kMeshOfOne, {"x"},
                                            {Bytes(i8)})[0]),
            (std::vector<float>{-128.0f, 127.0f, 3.0f}));
  EXPECT_EQ(FromBytes<int8_t>(this->RunBytes(Typed(v1::PSUM, v1::INT8, {3}), kMeshOfOne, {"x"},
                                             {Bytes(i8)})[0]),
            i8);
  const std::vector<int32_t> i32 = {std::numeric_limits<int32_t>::max(), -7};
  EXPECT_EQ(FromBytes<float>(this->RunBytes(Typed(v1::PMEAN, v1::INT32, {2}), kMeshOfOne, {"x"},
                                            {Bytes(i32)})[0]),
            (std::vector<float>{2147483648.0f, -7.0f}));
  const std::vector<uint64_t> u64 = {std::numeric_limits<uint64_t>::max(), 3};
  EXPECT_EQ(FromBytes<double>(this->RunBytes(Typed(v1::PMEAN, v1::UINT64, {2}), kMeshOfOne,
                                             {"x"}, {Bytes(u64)})[0]),
            (std::vector<double>{18446744073709551616.0, 3.0}));
  const std::vector<uint8_t> b = {1, 0, 1};
  EXPECT_EQ(FromBytes<int32_t>(this->RunBytes(Typed(v1::PSUM, v1::BOOL, {3}), kMeshOfOne, {"x"},
                                              {b})[0]),
            (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(FromBytes<float>(this->RunBytes(Typed(v1::PMEAN, v1::BOOL, {3}), kMeshOfOne, {"x"},
                                            {b})[0]),
            (std::vector<float>{1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(this->RunBytes(Typed(v1::PMAX, v1::BOOL, {3}), kMeshOfOne, {"x"}, {b})[0], b);
}

// A group of one inside a bigger mesh is reduced (XLA runs that all-reduce),
// and so is psum_scatter even in a mesh of one (XLA keeps a reduce-scatter):
// from +0.0, flushing subnormals, quieting NaNs; pmax from -inf.
TYPED_TEST_P(ExecutorSuite, GroupOfOneInABiggerMeshIsReduced) {
  const std::vector<uint32_t> f32 = {0x80000000, 0x7f800001, 0xffc00002,
                                     0x00000001, 0x80000003, 0x3f800000};
  const MeshShape x2y1{{"x", "y"}, {2, 1}};
  auto sum = this->RunBytes(Typed(v1::PSUM, v1::FLOAT32, {6}), x2y1, {"y"},
                            {Bytes(f32), Bytes(f32)});
  for (const auto& out : sum) {
    EXPECT_EQ(FromBytes<uint32_t>(out),
              (std::vector<uint32_t>{0x0, 0x7fc00001, 0xffc00002, 0x0, 0x0, 0x3f800000}));
  }
  auto max = this->RunBytes(Typed(v1::PMAX, v1::FLOAT32, {6}), x2y1, {"y"},
                            {Bytes(f32), Bytes(f32)});
  EXPECT_EQ(FromBytes<uint32_t>(max[1]),
            (std::vector<uint32_t>{0x80000000, 0xff800000, 0xff800000, 0x0, 0x80000000,
                                   0x3f800000}));
  auto scatter = Typed(v1::PSUM_SCATTER, v1::FLOAT32, {6});
  scatter.mutable_psum_scatter()->set_tiled(true);
  EXPECT_EQ(FromBytes<uint32_t>(this->RunBytes(scatter, kMeshOfOne, {"x"}, {Bytes(f32)})[0]),
            (std::vector<uint32_t>{0x0, 0x7fc00001, 0xffc00002, 0x0, 0x0, 0x3f800000}));
}

// JAX's empty axis tuple is no collective at all: psum(x, ()) returns x's
// bits, even inside a bigger mesh.
TYPED_TEST_P(ExecutorSuite, NoAxesReturnTheInputBits) {
  const std::vector<uint32_t> a = {0x80000000, 0x7f800001, 0xffc00002,
                                   0x00000001, 0x80000003, 0x3f800000};
  const std::vector<uint32_t> b = {0x00000002, 0x80000000, 0x7fa00000,
                                   0x3f800000, 0x00000005, 0x80000000};
  const MeshShape x2y1{{"x", "y"}, {2, 1}};
  for (v1::OpKind kind : {v1::PSUM, v1::PMAX, v1::PMIN, v1::PMEAN}) {
    auto op = Typed(kind, v1::FLOAT32, {6});
    op.set_no_axes(true);
    auto out = this->RunBytes(op, x2y1, {}, {Bytes(a), Bytes(b)});
    EXPECT_EQ(FromBytes<uint32_t>(out[0]), a) << kind;
    EXPECT_EQ(FromBytes<uint32_t>(out[1]), b) << kind;
  }
  // No conversion either (JAX 0.10.2 returns these bits for psum over ()):
  // bfloat16 and float8_e5m2 NaNs are not made canonical, as they are in a
  // mesh of one.
  const std::vector<uint16_t> bf16 = {0x7f81, 0xffc3, 0x8000, 0x0001};
  const std::vector<uint8_t> e5m2 = {0x7d, 0xfe, 0x80, 0x01};
  for (const auto& [mesh, members] : std::vector<std::pair<MeshShape, int>>{{x2y1, 2},
                                                                            {kMeshOfOne, 1}}) {
    for (v1::OpKind kind : {v1::PSUM, v1::PMAX, v1::PMIN, v1::PMEAN}) {
      auto op = Typed(kind, v1::BFLOAT16, {4});
      op.set_no_axes(true);
      for (const auto& out : this->RunBytes(
               op, mesh, {}, std::vector<std::vector<uint8_t>>(members, Bytes(bf16)))) {
        EXPECT_EQ(FromBytes<uint16_t>(out), bf16) << kind;
      }
      op = Typed(kind, v1::FLOAT8_E5M2, {4});
      op.set_no_axes(true);
      for (const auto& out :
           this->RunBytes(op, mesh, {}, std::vector<std::vector<uint8_t>>(members, e5m2))) {
        EXPECT_EQ(out, e5m2) << kind;
      }
    }
  }
}

// Data movement copies bits: a signaling NaN (and other payloads, -0.0 and
// subnormals) arrives unchanged, in every dtype, in place or not.
TYPED_TEST_P(ExecutorSuite, DataMovementKeepsEveryBit) {
  const std::vector<uint32_t> f32 = {0x7f800001, 0xffbfffff, 0x7fc00123, 0x80000000,
                                     0x00000001, 0x80000003};
  const std::vector<uint16_t> half = {0x7c01, 0xfd55, 0x7e01, 0x8000, 0x0001, 0x8003};
  const std::vector<uint16_t> bf16 = {0x7f81, 0xffbf, 0x7fc1, 0x8000, 0x0001, 0x8003};
  const std::vector<uint64_t> f64 = {0x7ff0000000000001, 0xfff7ffffffffffff,
                                     0x7ff8000000000123, 0x8000000000000000, 0x1,
                                     0x8000000000000003};
  const std::vector<uint8_t> f8e5m2 = {0x7d, 0xfe, 0x7f, 0x80, 0x01, 0xfc};
  const int n = 3;
  struct TypedBytes {
    v1::DType dt;
    std::vector<uint8_t> bytes;
  };
  const std::vector<TypedBytes> data = {{v1::FLOAT32, Bytes(f32)},
                                        {v1::FLOAT16, Bytes(half)},
                                        {v1::BFLOAT16, Bytes(bf16)},
                                        {v1::FLOAT64, Bytes(f64)},
                                        {v1::FLOAT8_E5M2, f8e5m2}};
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
      auto gather = Typed(v1::ALL_GATHER, dt, {6});
      gather.mutable_all_gather()->set_tiled(true);
      if (!in_place) {
        std::vector<uint8_t> want;
        for (int m = 0; m < n; ++m) want.insert(want.end(), in[m].begin(), in[m].end());
        for (const auto& out : this->RunBytes(gather, mesh, {"i"}, in)) EXPECT_EQ(out, want);
      }
      auto perm = Typed(v1::PPERMUTE, dt, {6});
      for (int s = 0; s < n; ++s) {
        auto* pair = perm.mutable_ppermute()->add_perm();
        pair->set_source(s);
        pair->set_dest((s + 1) % n);
      }
      auto permuted = this->RunBytes(perm, mesh, {"i"}, in, in_place);
      for (int m = 0; m < n; ++m) EXPECT_EQ(permuted[m], in[(m + n - 1) % n]) << "member " << m;
      auto bcast = Typed(v1::BROADCAST, dt, {6});
      bcast.mutable_broadcast()->set_root(2);
      for (const auto& out : this->RunBytes(bcast, mesh, {"i"}, in, in_place)) {
        EXPECT_EQ(out, in[2]);
      }
      auto a2a = Typed(v1::ALL_TO_ALL, dt, {3, 2});
      a2a.mutable_all_to_all()->set_tiled(true);
      auto moved = this->RunBytes(a2a, mesh, {"i"}, in, in_place);
      for (int r = 0; r < n; ++r) {
        std::vector<uint8_t> want;
        for (int j = 0; j < n; ++j) {
          want.insert(want.end(), in[j].begin() + r * 2 * es, in[j].begin() + (r + 1) * 2 * es);
        }
        EXPECT_EQ(moved[r], want) << "member " << r;
      }
    }
  }
  for (v1::OpKind kind : {v1::ALL_GATHER, v1::PPERMUTE, v1::BROADCAST, v1::ALL_TO_ALL}) {
    SCOPED_TRACE(v1::OpKind_Name(kind));
    auto op = Typed(kind, v1::BFLOAT16, {6});
    if (kind == v1::PPERMUTE) {
      auto* pair = op.mutable_ppermute()->add_perm();
      pair->set_source(0);
      pair->set_dest(0);
    }
    if (kind == v1::ALL_TO_ALL) op.mutable_all_to_all()->set_tiled(true);
    EXPECT_EQ(this->RunBytes(op, kMeshOfOne, {"x"}, {Bytes(bf16)})[0], Bytes(bf16));
  }
}

// The integration tests' "main" sweep (every op x dtype x shapes x in place
// and out of place, over every axis choice of the mesh) run on the executor
// directly, every member's output checked bit for bit against the reference
// model.
inline void RunSweep(const std::string& mesh_text,
                     const std::function<std::vector<std::vector<uint8_t>>(
                         v1::OpSpec, const MeshShape&, const std::vector<std::vector<uint8_t>>&,
                         bool)>& run) {
  integration::MeshSpec spec;
  ASSERT_TRUE(integration::ParseMeshSpec(mesh_text, &spec));
  MeshShape mesh;
  for (const auto& [name, size] : spec.axes) {
    mesh.names.push_back(name);
    mesh.sizes.push_back(size);
  }
  std::vector<integration::Case> cases;
  ASSERT_TRUE(integration::BuildSweep("main", spec, &cases));
  const int n = spec.num_members();
  int ran = 0;
  for (const integration::Case& c : cases) {
    if (!c.special.empty() || c.op == integration::Op::kBarrier) continue;
    SCOPED_TRACE(absl::StrCat("mesh ", mesh_text, " case ", c.name));
    constexpr uint64_t kSeed = 0x5eed;
    std::vector<std::vector<uint8_t>> inputs;
    for (int m = 0; m < n; ++m) inputs.push_back(integration::MakeInput(c, kSeed, m));
    auto outs = run(ToOpSpec(c), mesh, inputs, c.in_place);
    for (int m = 0; m < n; ++m) {
      const integration::Group g =
          integration::GroupOf(spec, c.axes, m, c.op == integration::Op::kPpermute);
      std::vector<const uint8_t*> ptrs;
      for (int member : g.members) ptrs.push_back(inputs[member].data());
      const std::vector<uint8_t> want =
          integration::Reference(c.op, c.dtype, c.shape, c.params, ptrs, g.rank, n == 1);
      if (outs[m] != want) {
        ADD_FAILURE() << "member " << m << ": the output differs from the reference ("
                      << outs[m].size() << " bytes, expected " << want.size() << ")";
        return;  // one case's report is enough
      }
    }
    ++ran;
  }
  EXPECT_GT(ran, 100) << "the sweep ran too few cases";
}

TYPED_TEST_P(ExecutorSuite, MatchesTheReferenceOverEveryOpDtypeAndGroup) {
  for (const char* mesh : {"i:3", "x:2,y:2"}) {
    RunSweep(mesh, [this](v1::OpSpec op, const MeshShape& shape,
                          const std::vector<std::vector<uint8_t>>& inputs, bool in_place) {
      return this->RunBytes(std::move(op), shape, {}, inputs, in_place);
    });
    if (this->HasFailure()) return;
  }
}

REGISTER_TYPED_TEST_SUITE_P(ExecutorSuite, PsumInPlaceAndOutOfPlace, PpermuteInPlaceRingIsStaged,
                            AllGatherAlongInnerAxis, PsumScatterTiledAlongSecondDimension,
                            AllToAllUntiledInPlace, BroadcastFromRoot,
                            MeshOfOneReduceReturnsTheInputBits, MeshOfOneReduceConvertsTheDType,
                            GroupOfOneInABiggerMeshIsReduced, NoAxesReturnTheInputBits,
                            DataMovementKeepsEveryBit,
                            MatchesTheReferenceOverEveryOpDtypeAndGroup);

}  // namespace collectived::executor_suite

#endif  // COLLECTIVED_TESTS_EXEC_EXECUTOR_SUITE_H_
