// Tests of the CUDA executor.
//
// CPU-runnable (label `unit`, test suites CudaArith*, CudaLayout*,
// CudaExecutorNoGpu*):
//  - the device arithmetic: reduce_ops.h's recipes in SoftwareEnv (exactly
//    what the kernels run, compiled here for the host and run on the host
//    FPU in its default IEEE mode, as the GPU runs them) give the CPU
//    Reduce's bits, for every dtype and kind, on special values;
//  - the kernels' layouts (the source index functions of cuda_kernels.h),
//    emulated on the host, give CpuExecutor's bytes;
//  - without a GPU, the executor is unviable and says why.
// GPU (label `gpu`, suite CudaGpu*): CudaExecutor against CpuExecutor, byte
// for byte, for every op and dtype; skipped with the reason without a GPU
// (a failure with COLLECTIVED_REQUIRE_GPU=1, tests/harness/require_gpu.h).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/fast_queue.h"
#include "plan/wire_plan.h"
#include "exec/cpu_executor.h"
#include "exec/cuda/cuda_executor.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/reduce.h"
#include "exec/reduce_ops.h"
#include "tests/harness/require_gpu.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace collectived {
namespace {

constexpr DType kAllDTypes[] = {DType::kF32,      DType::kF64,     DType::kF16, DType::kBF16,
                                DType::kI8,       DType::kU8,      DType::kI32, DType::kU32,
                                DType::kI64,      DType::kU64,     DType::kBool,
                                DType::kF8E4M3FN, DType::kF8E5M2};
constexpr ReduceKind kAllKinds[] = {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin,
                                    ReduceKind::kMean};

std::string Name(ReduceKind kind, DType dt, int n) {
  const char* k = kind == ReduceKind::kSum   ? "sum"
                  : kind == ReduceKind::kMax ? "max"
                  : kind == ReduceKind::kMin ? "min"
                                             : "mean";
  return std::string(k) + " " + std::string(DTypeName(dt)) + " n=" + std::to_string(n);
}

// Bit patterns worth combining, per element size / float format.
std::vector<uint64_t> Specials(DType dt) {
  switch (dt) {
    case DType::kF32:
      return {0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x807fffff,
              0x00800000, 0x80800000, 0x00800001, 0x80c00000, 0x00c00000, 0x01000000,
              0x3f800000, 0xbf800000, 0x3eaaaaab, 0x4b000001, 0x33800000, 0x7f7fffff,
              0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
              0xff800002, 0x7fc00123, 0xffa00005, 0x7f7ffffe};
    case DType::kF64:
      return {0x0000000000000000, 0x8000000000000000, 0x0000000000000001, 0x800fffffffffffff,
              0x0010000000000000, 0x8010000000000000, 0x0018000000000000, 0x0010000000000001,
              0x3ff0000000000000, 0xbff0000000000000, 0x3fd5555555555555, 0x7fefffffffffffff,
              0xffefffffffffffff, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000,
              0xfff8000000000000, 0x7ff0000000000001, 0xfff0000000000002, 0x7ff8000000000123,
              0x4330000000000001};
    case DType::kF16:
      return {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x3c00, 0xbc00,
              0x3555, 0x7bff, 0xfbff, 0x7bfe, 0x7800, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01,
              0xfd23, 0x6400, 0x1400};
    case DType::kBF16:
      return {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x8080, 0x00c0, 0x3f80,
              0xbf80, 0x3eab, 0x4b00, 0x3b80, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc0,
              0x7f81, 0xffa3, 0x0081};
    case DType::kF8E4M3FN:
      // +-0, subnormals, the smallest normal, 1, 448 (largest), 256, NaN.
      return {0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0x08, 0x88, 0x38, 0xb8,
              0x39, 0x7e, 0xfe, 0x7d, 0x78, 0x7f, 0xff, 0x18, 0x30};
    case DType::kF8E5M2:
      // +-0, subnormals, the smallest normal, 1, 57344 (largest), inf, NaNs.
      return {0x00, 0x80, 0x01, 0x81, 0x03, 0x83, 0x04, 0x84, 0x3c, 0xbc,
              0x3d, 0x7b, 0xfb, 0x7a, 0x7c, 0xfc, 0x7d, 0xfe, 0x7f, 0x2c};
    case DType::kBool:
      return {0, 1, 2, 255};
    default: {
      const size_t es = DTypeSize(dt);
      const uint64_t top = uint64_t{1} << (8 * es - 1);
      const uint64_t mask = es == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * es)) - 1;
      return {0, 1, mask, top, top - 1, top + 1, mask - 1, 2, 0x55 & mask};
    }
  }
}

void Store(DType dt, uint8_t* p, uint64_t bits) { std::memcpy(p, &bits, DTypeSize(dt)); }

// n members' inputs of `count` elements: every pair of specials for the
// first two members, then specials and random bits mixed.
std::vector<std::vector<uint8_t>> Inputs(DType dt, int n, size_t* count, uint32_t seed) {
  const std::vector<uint64_t> sp = Specials(dt);
  const size_t es = DTypeSize(dt);
  const size_t pairs = sp.size() * sp.size();
  *count = pairs + 2000;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(*count * es));
  for (size_t e = 0; e < *count; ++e) {
    for (int k = 0; k < n; ++k) {
      uint64_t bits;
      if (e < pairs && k < 2) {
        bits = sp[k == 0 ? e / sp.size() : e % sp.size()];
      } else if (rng() % 2 == 0) {
        bits = sp[rng() % sp.size()];
      } else {
        bits = rng();
      }
      Store(dt, in[k].data() + e * es, bits);
    }
  }
  return in;
}

// The device recipe, evaluated on the host.
std::vector<uint8_t> DeviceRecipeOnHost(ReduceKind kind, DType dt,
                                        const std::vector<std::vector<uint8_t>>& in,
                                        size_t count) {
  const int n = static_cast<int>(in.size());
  std::vector<uint8_t> out(count * DTypeSize(ReduceResultDType(kind, dt)));
  const bool known = reduce_ops::VisitReduce<reduce_ops::SoftwareEnv>(
      kind, dt, n, [&](auto codec, auto op) {
        using Codec = decltype(codec);
        using In = typename Codec::In;
        using Out = typename Codec::Out;
        for (size_t q = 0; q < count; ++q) {
          const Out r = reduce_ops::ReduceElement(codec, op, n, [&](int k) {
            In x;
            std::memcpy(&x, in[k].data() + q * sizeof(In), sizeof(In));
            return x;
          });
          std::memcpy(out.data() + q * sizeof(Out), &r, sizeof(Out));
        }
      });
  EXPECT_TRUE(known);
  return out;
}

std::vector<uint8_t> CpuReduce(ReduceKind kind, DType dt,
                               const std::vector<std::vector<uint8_t>>& in, size_t count) {
  std::vector<const void*> ptrs;
  for (const auto& v : in) ptrs.push_back(v.data());
  std::vector<uint8_t> out(count * DTypeSize(ReduceResultDType(kind, dt)));
  Reduce(kind, dt, ptrs.data(), static_cast<int>(ptrs.size()), out.data(), count);
  return out;
}

// The first differing element, for the failure message.
std::string FirstDifference(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                            size_t es, const std::vector<std::vector<uint8_t>>* in = nullptr,
                            size_t in_es = 0) {
  if (want.size() != got.size()) return "sizes differ";
  for (size_t i = 0; i < want.size(); i += es) {
    if (std::memcmp(want.data() + i, got.data() + i, es) != 0) {
      uint64_t w = 0, g = 0;
      std::memcpy(&w, want.data() + i, es);
      std::memcpy(&g, got.data() + i, es);
      char buf[128];
      std::snprintf(buf, sizeof(buf), "element %zu: want 0x%llx got 0x%llx", i / es,
                    static_cast<unsigned long long>(w), static_cast<unsigned long long>(g));
      std::string s = buf;
      if (in != nullptr) {
        s += " inputs";
        for (const auto& v : *in) {
          uint64_t x = 0;
          std::memcpy(&x, v.data() + i / es * in_es, in_es);
          std::snprintf(buf, sizeof(buf), " 0x%llx", static_cast<unsigned long long>(x));
          s += buf;
        }
      }
      return s;
    }
  }
  return "";
}

class DefaultFpMode : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__SSE__)
    // The host FPU in IEEE mode (gradual underflow), as the GPU runs: the
    // flushing must come from SoftwareEnv, not from the mode.
    ASSERT_EQ(_mm_getcsr() & 0x8040u, 0u) << "FTZ/DAZ set on the test thread";
#endif
  }
};

using CudaArithTest = DefaultFpMode;

TEST_F(CudaArithTest, DeviceRecipeMatchesCpuReduceOnSpecialValues) {
  uint32_t seed = 1;
  for (DType dt : kAllDTypes) {
    for (ReduceKind kind : kAllKinds) {
      for (int n : {1, 2, 3, 4, 5, 8, 13}) {
        size_t count = 0;
        const auto in = Inputs(dt, n, &count, seed++);
        const auto want = CpuReduce(kind, dt, in, count);
        const auto got = DeviceRecipeOnHost(kind, dt, in, count);
        EXPECT_EQ(want, got) << Name(kind, dt, n) << ": "
                             << FirstDifference(want, got,
                                                DTypeSize(ReduceResultDType(kind, dt)), &in,
                                                DTypeSize(dt));
      }
    }
  }
}

// The named cases of reduce.h, spelled out.
TEST_F(CudaArithTest, DocumentedCases) {
  using reduce_ops::BitCast;
  auto f32 = [](std::vector<uint32_t> members, ReduceKind kind) {
    std::vector<std::vector<uint8_t>> in;
    for (uint32_t b : members) {
      in.emplace_back(4);
      std::memcpy(in.back().data(), &b, 4);
    }
    const auto got = DeviceRecipeOnHost(kind, DType::kF32, in, 1);
    EXPECT_EQ(got, CpuReduce(kind, DType::kF32, in, 1));
    uint32_t r;
    std::memcpy(&r, got.data(), 4);
    return r;
  };
  EXPECT_EQ(f32({0x7f800000, 0xff800000}, ReduceKind::kSum), 0xffc00000u);  // inf + -inf
  EXPECT_EQ(f32({0x7f800001}, ReduceKind::kSum), 0x7fc00001u);             // quieted
  EXPECT_EQ(f32({0x7fc00001, 0xffc00002}, ReduceKind::kSum), 0xffc00002u);  // last NaN
  EXPECT_EQ(f32({0x7f800000, 0xff800000, 0x7fc00005}, ReduceKind::kSum), 0x7fc00005u);
  EXPECT_EQ(f32({0x80000000, 0x80000000}, ReduceKind::kSum), 0x00000000u);  // +0
  EXPECT_EQ(f32({0x00800000, 0x80c00000}, ReduceKind::kSum), 0x80000000u);  // FTZ, -0
  EXPECT_EQ(f32({1, 1, 1, 1, 1, 1}, ReduceKind::kSum), 0u);                 // DAZ
  EXPECT_EQ(f32({0x80000000, 1}, ReduceKind::kMax), 0x80000000u);
  EXPECT_EQ(f32({0x7fc00000, 0x7fc00000}, ReduceKind::kMax), 0xff800000u);  // -inf
  // The mean of a product just below the smallest normal: 3 * 2^-126 *
  // (1 - 2^-24) * f32(1/3) rounds (unbounded) below 2^-126 but to 2^-126 in
  // the subnormal grid: flushed.
  const float s = 3.0f * 0x1p-126f;
  const uint32_t below = BitCast<uint32_t>(s) - 1;
  EXPECT_EQ(f32({below, 0, 0}, ReduceKind::kMean),
            f32({below, 0, 0}, ReduceKind::kMean));  // (both checked against the CPU)

  // float16: inf + -inf is x86's default NaN, encoded with its sign.
  std::vector<std::vector<uint8_t>> h = {{0x00, 0x7c}, {0x00, 0xfc}};
  EXPECT_EQ(DeviceRecipeOnHost(ReduceKind::kSum, DType::kF16, h, 1),
            (std::vector<uint8_t>{0x00, 0xfe}));
  // float16 overflow per addition: 65504 + 65504 - 65504 = inf.
  h = {{0xff, 0x7b}, {0xff, 0x7b}, {0xff, 0xfb}};
  EXPECT_EQ(DeviceRecipeOnHost(ReduceKind::kSum, DType::kF16, h, 1),
            CpuReduce(ReduceKind::kSum, DType::kF16, h, 1));
  EXPECT_EQ(DeviceRecipeOnHost(ReduceKind::kSum, DType::kF16, h, 1),
            (std::vector<uint8_t>{0x00, 0x7c}));
  // float8 is reduced in float16: 448 + 448 - 448 = 448 in float8_e4m3fn
  // (896 is a float16 value), and every float8_e5m2 NaN result is 0x7f.
  std::vector<std::vector<uint8_t>> f8 = {{0x7e}, {0x7e}, {0xfe}};
  EXPECT_EQ(DeviceRecipeOnHost(ReduceKind::kSum, DType::kF8E4M3FN, f8, 1),
            (std::vector<uint8_t>{0x7e}));
  f8 = {{0xfd}, {0x3c}};
  EXPECT_EQ(DeviceRecipeOnHost(ReduceKind::kSum, DType::kF8E5M2, f8, 1),
            (std::vector<uint8_t>{0x7f}));
  f8 = {{0x7f}, {0x7f}};  // all NaN: max gives -inf, float8_e4m3fn's NaN 0xff
  EXPECT_EQ(DeviceRecipeOnHost(ReduceKind::kMax, DType::kF8E4M3FN, f8, 1),
            (std::vector<uint8_t>{0xff}));
  // uint8 mean: 218 * f32(1/3) = 0x42915556.
  std::vector<std::vector<uint8_t>> u = {{200}, {10}, {8}};
  const auto mean = DeviceRecipeOnHost(ReduceKind::kMean, DType::kU8, u, 1);
  uint32_t m;
  std::memcpy(&m, mean.data(), 4);
  EXPECT_EQ(m, 0x42915556u);
}

// The mean's flush-to-zero, where the product lies at the smallest normal:
// sums around n * 2^-126 times 1/n, for many n.
TEST_F(CudaArithTest, MeanProductAtTheSmallestNormal) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
    for (int n : {2, 3, 5, 6, 7, 9, 10, 11, 25, 100, 1000}) {
      std::vector<std::vector<uint8_t>> in(n);
      const size_t es = DTypeSize(dt);
      size_t count = 0;
      for (int ulps = -64; ulps <= 64; ++ulps) {
        for (int sign = 0; sign < 2; ++sign) {
          uint64_t bits = 0;
          if (dt == DType::kF32) {
            bits = reduce_ops::BitCast<uint32_t>(static_cast<float>(n) * 0x1p-126f) + ulps;
            bits |= sign ? 0x80000000u : 0;
          } else if (dt == DType::kF64) {
            bits = reduce_ops::BitCast<uint64_t>(static_cast<double>(n) * 0x1p-1022) + ulps;
            bits |= sign ? uint64_t{1} << 63 : 0;
          } else {
            bits = (reduce_ops::BitCast<uint32_t>(static_cast<float>(n) * 0x1p-126f) >> 16) +
                   ulps;
            bits |= sign ? 0x8000u : 0;
          }
          for (int k = 0; k < n; ++k) {
            in[k].resize((count + 1) * es);
            Store(dt, in[k].data() + count * es, k == n - 1 ? bits : 0);
          }
          ++count;
        }
      }
      const auto want = CpuReduce(ReduceKind::kMean, dt, in, count);
      const auto got = DeviceRecipeOnHost(ReduceKind::kMean, dt, in, count);
      EXPECT_EQ(want, got) << Name(ReduceKind::kMean, dt, n) << ": "
                           << FirstDifference(want, got, es);
    }
  }
}

// Random float32/float64 means over the whole range of tiny sums.
TEST_F(CudaArithTest, MeanOfTinySums) {
  std::mt19937_64 rng(7);
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int n : {2, 3, 7, 10}) {
      const size_t count = 20000, es = DTypeSize(dt);
      std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * es));
      for (size_t e = 0; e < count; ++e) {
        for (int k = 0; k < n; ++k) {
          // Exponents around the smallest normal's, random mantissas.
          const uint64_t r = rng();
          uint64_t bits;
          if (dt == DType::kF32) {
            bits = ((1 + r % 8) << 23) | (r >> 40 & 0x7fffff) | (r >> 63 << 31);
          } else {
            bits = ((1 + r % 8) << 52) | (rng() & 0xfffffffffffff) | (r >> 63 << 63);
          }
          Store(dt, in[k].data() + e * es, bits);
        }
      }
      const auto want = CpuReduce(ReduceKind::kMean, dt, in, count);
      const auto got = DeviceRecipeOnHost(ReduceKind::kMean, dt, in, count);
      EXPECT_EQ(want, got) << Name(ReduceKind::kMean, dt, n) << ": "
                           << FirstDifference(want, got, es, &in, es);
    }
  }
}

// ---------------------------------------------------------------------------
// Plans and members, shared by the layout and GPU tests.

struct Case {
  std::string name;
  v1::OpSpec op;
  MeshShape mesh;
};

v1::OpSpec Spec(v1::OpKind kind, DType dt, std::vector<int64_t> shape,
                std::vector<std::string> axes) {
  v1::OpSpec op;
  op.set_kind(kind);
  op.set_dtype(ToProto(dt));
  for (auto d : shape) op.add_shape(d);
  for (auto& a : axes) op.add_axes(a);
  return op;
}

// Every op kind on `dt` over n members along one axis (and, for n == 8, a
// 2 x 4 mesh reduced along its minor axis: two groups).
std::vector<Case> Cases(DType dt, int n) {
  std::vector<Case> cases;
  const MeshShape line{{"i"}, {n}};
  auto add = [&](std::string name, v1::OpSpec op, MeshShape mesh) {
    cases.push_back({std::move(name), std::move(op), std::move(mesh)});
  };
  for (auto k : {v1::PSUM, v1::PMEAN, v1::PMAX, v1::PMIN}) {
    add("reduce", Spec(k, dt, {1031}, {"i"}), line);
    add("reduce 2d", Spec(k, dt, {7, 5}, {"i"}), line);
    if (n == 8) {
      add("reduce 2x4", Spec(k, dt, {301}, {"y"}), MeshShape{{"x", "y"}, {2, 4}});
      // Groups of one in a bigger mesh: reduced (from the identity).
      add("reduce groups of one", Spec(k, dt, {65}, {"y"}), MeshShape{{"x", "y"}, {8, 1}});
    }
    if (n == 2) {
      // Over no axes: no collective at all (as a mesh of one).
      auto op = Spec(k, dt, {33}, {});
      op.set_no_axes(true);
      add("reduce no axes", op, line);
    }
  }
  for (int axis : {0, 1}) {
    for (bool tiled : {false, true}) {
      auto op = Spec(v1::ALL_GATHER, dt, {3, 7}, {"i"});
      op.mutable_all_gather()->set_axis(axis);
      op.mutable_all_gather()->set_tiled(tiled);
      add("all_gather", op, line);
    }
  }
  if (n == 8) {
    auto op = Spec(v1::ALL_GATHER, dt, {5, 3}, {"y"});
    op.mutable_all_gather()->set_axis(1);
    add("all_gather 2x4", op, MeshShape{{"x", "y"}, {2, 4}});
  }
  if (dt != DType::kBool) {
    for (int dim : {0, 1}) {
      auto op = Spec(v1::PSUM_SCATTER, dt, dim == 0 ? std::vector<int64_t>{2 * n, 9}
                                                    : std::vector<int64_t>{3, 2 * n, 5},
                     {"i"});
      op.mutable_psum_scatter()->set_scatter_dimension(dim);
      op.mutable_psum_scatter()->set_tiled(true);
      add("psum_scatter tiled", op, line);
      auto untiled = Spec(v1::PSUM_SCATTER, dt, dim == 0 ? std::vector<int64_t>{n, 11}
                                                         : std::vector<int64_t>{4, n, 3},
                          {"i"});
      untiled.mutable_psum_scatter()->set_scatter_dimension(dim);
      add("psum_scatter", untiled, line);
    }
  }
  for (auto [split, concat] : {std::pair{0, 0}, {0, 1}, {1, 0}, {1, 2}, {2, 1}}) {
    for (bool tiled : {false, true}) {
      std::vector<int64_t> shape = {3, 2, 5};
      shape[split] = tiled ? 2 * n : n;
      auto op = Spec(v1::ALL_TO_ALL, dt, shape, {"i"});
      op.mutable_all_to_all()->set_split_axis(split);
      op.mutable_all_to_all()->set_concat_axis(concat);
      op.mutable_all_to_all()->set_tiled(tiled);
      add("all_to_all", op, line);
    }
  }
  {
    auto op = Spec(v1::PPERMUTE, dt, {37}, {"i"});
    for (int s = 0; s + 1 < n; ++s) {  // a ring without its last pair
      auto* p = op.mutable_ppermute()->add_perm();
      p->set_source(s);
      p->set_dest(s + 1);
    }
    add("ppermute", op, line);
  }
  {
    auto op = Spec(v1::BROADCAST, dt, {2, 19}, {"i"});
    op.mutable_broadcast()->set_root(n > 1 ? 1 : 0);
    add("broadcast", op, line);
  }
  return cases;
}

// More members than MemberTable carries inline.
std::vector<Case> ManyMemberCases() {
  std::vector<Case> cases;
  const int n = 72;
  for (auto kind : {v1::PSUM, v1::ALL_GATHER, v1::ALL_TO_ALL}) {
    cases.push_back({"many members",
                     Spec(kind, DType::kF32, {kind == v1::ALL_TO_ALL ? int64_t{n} : 33}, {"i"}),
                     MeshShape{{"i"}, {n}}});
  }
  return cases;
}

struct HostMembers {
  std::vector<std::vector<uint8_t>> in, out;
};

HostMembers MakeMembers(const OpPlan& plan, uint32_t seed) {
  HostMembers h;
  const std::vector<uint64_t> sp = Specials(plan.dtype);
  const size_t es = DTypeSize(plan.dtype);
  std::mt19937_64 rng(seed);
  for (uint64_t m = 0; m < plan.members(); ++m) {
    std::vector<uint8_t> in(plan.in_bytes);
    for (size_t e = 0; e < plan.in_bytes / es; ++e) {
      Store(plan.dtype, in.data() + e * es, rng() % 2 ? sp[rng() % sp.size()] : rng());
    }
    h.in.push_back(in);
    h.out.emplace_back(plan.out_bytes, 0xa5);
  }
  return h;
}

// Runs `ex` on host copies (CPU) and returns every member's result bytes
// (the input region when in place).
std::vector<std::vector<uint8_t>> RunOnCpu(const OpPlan& plan, HostMembers h, bool in_place) {
  CpuExecutor cpu({.threads = 2, .chunk_bytes = 256, .serial_bytes = 0});
  std::vector<MemberIo> io(h.in.size());
  for (size_t m = 0; m < io.size(); ++m) {
    io[m].in = h.in[m].data();
    io[m].out = in_place ? h.in[m].data() : h.out[m].data();
  }
  EXPECT_TRUE(cpu.Run(plan, io).ok());
  return in_place ? h.in : h.out;
}

// ---------------------------------------------------------------------------
// The kernels' layouts, emulated on the host.

using CudaLayoutTest = DefaultFpMode;

// What the data-movement kernels produce, by their source index functions.
std::vector<std::vector<uint8_t>> EmulateMovement(const OpPlan& plan, const HostMembers& h) {
  const size_t es = DTypeSize(plan.dtype);
  const int n = plan.group_size;
  std::vector<std::vector<uint8_t>> out = h.out;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    for (int dst = 0; dst < n; ++dst) {
      std::vector<uint8_t>& o = out[plan.groups[g][dst]];
      if (plan.kind == OpKind::kAllGather) {
        int64_t outer = 1;
        for (int d = 0; d < plan.axis; ++d) outer *= plan.in_shape[d];
        const uint64_t inner = plan.in_bytes / outer;  // bytes: unit 1
        for (uint64_t q = 0; q < plan.out_bytes; ++q) {
          int64_t from;
          uint64_t src;
          cuda_kernels::AllGatherSource(n, inner, q, &from, &src);
          o[q] = h.in[plan.groups[g][from]][src];
        }
      } else if (plan.kind == OpKind::kAllToAll) {
        const auto d = cuda_kernels::CollapseAllToAll(
            plan.a2a_shape.data(), static_cast<int>(plan.a2a_shape.size()), plan.split_axis,
            plan.concat_axis, n);
        for (uint64_t q = 0; q < plan.out_bytes / es; ++q) {
          int64_t from, src;
          cuda_kernels::AllToAllSource(d, dst, q, &from, &src);
          std::memcpy(o.data() + q * es, h.in[plan.groups[g][from]].data() + src * es, es);
        }
      }
    }
  }
  return out;
}

// Every case the GPU test runs plans, and runs on the CPU in and out of
// place (so the GPU test fails only on the GPU's results).
TEST_F(CudaLayoutTest, EveryGpuTestCasePlansAndRunsOnTheCpu) {
  int planned = 0;
  for (int n : {1, 2, 3, 8}) {
    for (DType dt : kAllDTypes) {
      for (const Case& c : Cases(dt, n)) {
        auto plan = PlanOp(c.op, c.mesh);
        ASSERT_TRUE(plan.ok()) << c.name << " n=" << n << ": " << plan.status();
        const HostMembers h = MakeMembers(*plan, 3);
        RunOnCpu(*plan, h, false);
        if (plan->in_bytes == plan->out_bytes) RunOnCpu(*plan, h, true);
        ++planned;
      }
    }
  }
  for (const Case& c : ManyMemberCases()) {
    auto plan = PlanOp(c.op, c.mesh);
    ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
    RunOnCpu(*plan, MakeMembers(*plan, 4), false);
  }
  EXPECT_GT(planned, 500);
}

TEST_F(CudaLayoutTest, AllGatherAndAllToAllSourcesMatchCpuExecutor) {
  for (int n : {1, 2, 3, 8}) {
    for (DType dt : {DType::kF32, DType::kI8, DType::kF16, DType::kF64}) {
      for (const Case& c : Cases(dt, n)) {
        if (c.op.kind() != v1::ALL_GATHER && c.op.kind() != v1::ALL_TO_ALL) continue;
        auto plan = PlanOp(c.op, c.mesh);
        ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
        const HostMembers h = MakeMembers(*plan, 11);
        EXPECT_EQ(EmulateMovement(*plan, h), RunOnCpu(*plan, h, false))
            << c.name << " " << plan->signature;
      }
    }
  }
}

TEST_F(CudaLayoutTest, ReduceScatterSourcesMatchCpuExecutor) {
  for (int n : {1, 2, 3, 8}) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kI32, DType::kF16, DType::kF8E5M2}) {
      for (const Case& c : Cases(dt, n)) {
        if (c.op.kind() != v1::PSUM_SCATTER) continue;
        auto plan = PlanOp(c.op, c.mesh);
        ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
        const HostMembers h = MakeMembers(*plan, 12);
        int64_t outer = 1;
        for (int d = 0; d < plan->axis; ++d) outer *= plan->in_shape[d];
        const size_t es = DTypeSize(dt);
        const uint64_t inner = plan->in_bytes / es / outer / n;
        std::vector<std::vector<uint8_t>> got = h.out;
        reduce_ops::VisitReduce<reduce_ops::SoftwareEnv>(
            ReduceKind::kSum, dt, n, [&](auto codec, auto op) {
              using In = typename decltype(codec)::In;
              using Out = typename decltype(codec)::Out;
              if constexpr (sizeof(In) == sizeof(Out)) {
                for (const auto& group : plan->groups) {
                  for (int j = 0; j < n; ++j) {
                    for (uint64_t q = 0; q < plan->out_bytes / es; ++q) {
                      const uint64_t src = cuda_kernels::ReduceScatterSource(n, inner, j, q);
                      const Out r = reduce_ops::ReduceElement(codec, op, n, [&](int k) {
                        In x;
                        std::memcpy(&x, h.in[group[k]].data() + src * es, es);
                        return x;
                      });
                      std::memcpy(got[group[j]].data() + q * es, &r, es);
                    }
                  }
                }
              }
            });
        EXPECT_EQ(got, RunOnCpu(*plan, h, false)) << c.name << " " << plan->signature;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Without a GPU.

TEST(CudaExecutorNoGpuTest, UnviableWithAReasonAndRunFailsCleanly) {
  CudaExecutor ex;
  EXPECT_EQ(ex.name(), "cuda");
  EXPECT_EQ(ex.buffer_kind(), "cuda");
  if (ex.IsViable()) GTEST_SKIP() << "a GPU is present (" << ex.device_count() << " devices)";
  const std::string why = ex.WhyNotViable();
  EXPECT_NE(why.find("cudaGetDeviceCount"), std::string::npos) << why;
  EXPECT_EQ(ex.device_count(), 0);
  auto plan = PlanOp(Spec(v1::PSUM, DType::kF32, {4}, {"i"}), MeshShape{{"i"}, {2}});
  ASSERT_TRUE(plan.ok());
  std::vector<MemberIo> io(2);
  const absl::Status st = ex.Run(*plan, io);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_EQ(MakeCudaExecutor()->IsViable(), false);
}

// ---------------------------------------------------------------------------
// On a GPU: CudaExecutor against CpuExecutor.

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ex_ = std::make_unique<CudaExecutor>();
    if (!ex_->IsViable()) COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU(ex_->WhyNotViable());
  }

  // Runs `plan` on the GPU with the members' inputs from `h`; returns each
  // member's result bytes.
  // `in_offset`, `out_offset`: each input (output) region starts that many
  // bytes into its allocation (the kernels' paths for addresses that are not
  // 16-byte aligned); in place, the input's.
  std::vector<std::vector<uint8_t>> RunOnGpu(const OpPlan& plan, const HostMembers& h,
                                             bool in_place, Traffic* traffic,
                                             uint64_t in_offset = 0, uint64_t out_offset = 0,
                                             DeviceTiming* timing = nullptr) {
    std::vector<MemberIo> io(h.in.size());
    std::vector<void*> allocations;
    for (size_t m = 0; m < io.size(); ++m) {
      void* in = nullptr;
      void* out = nullptr;
      EXPECT_EQ(cudaMalloc(&in, std::max<uint64_t>(plan.in_bytes + in_offset, 1)), cudaSuccess);
      allocations.push_back(in);
      in = static_cast<uint8_t*>(in) + in_offset;
      EXPECT_EQ(cudaMemcpy(in, h.in[m].data(), plan.in_bytes, cudaMemcpyHostToDevice),
                cudaSuccess);
      if (!in_place) {
        EXPECT_EQ(cudaMalloc(&out, std::max<uint64_t>(plan.out_bytes + out_offset, 1)),
                  cudaSuccess);
        allocations.push_back(out);
        out = static_cast<uint8_t*>(out) + out_offset;
        EXPECT_EQ(cudaMemcpy(out, h.out[m].data(), plan.out_bytes, cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      io[m].in = static_cast<const uint8_t*>(in);
      io[m].out = static_cast<uint8_t*>(in_place ? in : out);
      io[m].device = 0;
    }
    // The copies above are from pageable memory: they may return before
    // their bytes land, and the executor's stream does not wait for them.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const absl::Status st = ex_->RunTimed(plan, io, traffic, timing);
    EXPECT_TRUE(st.ok()) << st;
    std::vector<std::vector<uint8_t>> result(io.size(), std::vector<uint8_t>(plan.out_bytes));
    for (size_t m = 0; m < io.size(); ++m) {
      EXPECT_EQ(cudaMemcpy(result[m].data(), io[m].out, plan.out_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    for (void* p : allocations) cudaFree(p);
    return result;
  }

  std::unique_ptr<CudaExecutor> ex_;
};

TEST_F(CudaGpuTest, EveryOpAndDtypeMatchesCpuExecutor) {
  uint32_t seed = 100;
  for (int n : {1, 2, 3, 8}) {
    for (DType dt : kAllDTypes) {
      for (const Case& c : Cases(dt, n)) {
        auto plan = PlanOp(c.op, c.mesh);
        ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
        const HostMembers h = MakeMembers(*plan, seed++);
        for (bool in_place : {false, true}) {
          if (in_place && plan->in_bytes != plan->out_bytes) continue;  // the engine's rule
          const auto want = RunOnCpu(*plan, h, in_place);
          Traffic traffic;
          const auto got = RunOnGpu(*plan, h, in_place, &traffic);
          ASSERT_EQ(want.size(), got.size());
          for (size_t m = 0; m < want.size(); ++m) {
            EXPECT_EQ(want[m], got[m])
                << plan->signature << (in_place ? " in place" : "") << " member " << m << ": "
                << FirstDifference(want[m], got[m], DTypeSize(plan->out_dtype));
          }
          EXPECT_GE(traffic.read + traffic.written, traffic.required) << plan->signature;
        }
      }
    }
  }
}

// Regions whose addresses are not 16-byte aligned take the kernels'
// element-at-a-time path: the same bits, whether the inputs, the outputs or
// both are off.
TEST_F(CudaGpuTest, UnalignedRegionsMatchCpuExecutor) {
  uint32_t seed = 7000;
  for (int n : {2, 3}) {
    for (DType dt : kAllDTypes) {
      for (const Case& c : Cases(dt, n)) {
        const v1::OpKind kind = c.op.kind();
        if (kind != v1::PSUM && kind != v1::PMEAN && kind != v1::PMAX && kind != v1::PMIN) {
          continue;
        }
        auto plan = PlanOp(c.op, c.mesh);
        ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
        const HostMembers h = MakeMembers(*plan, seed++);
        for (bool in_place : {false, true}) {
          if (in_place && plan->in_bytes != plan->out_bytes) continue;
          const auto want = RunOnCpu(*plan, h, in_place);
          // Aligned for the input's and the result's elements (pmean of
          // integers gives floats), not for 16 bytes.
          const uint64_t off = std::max(DTypeSize(dt), DTypeSize(plan->out_dtype));
          const std::pair<uint64_t, uint64_t> offsets[] = {{off, off}, {0, off}, {off, 0}};
          for (const auto& [in_off, out_off] : offsets) {
            if (in_place && in_off != out_off) continue;
            const auto got = RunOnGpu(*plan, h, in_place, nullptr, in_off, out_off);
            for (size_t m = 0; m < want.size(); ++m) {
              EXPECT_EQ(want[m], got[m])
                  << plan->signature << (in_place ? " in place" : "") << " input at +" << in_off
                  << ", output at +" << out_off << ", member " << m << ": "
                  << FirstDifference(want[m], got[m], DTypeSize(plan->out_dtype));
            }
          }
        }
      }
    }
  }
}

// More members than the kernel parameters carry (device pointer tables).
TEST_F(CudaGpuTest, ManyMembersUseDeviceTables) {
  for (const Case& c : ManyMemberCases()) {
    auto plan = PlanOp(c.op, c.mesh);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const HostMembers h = MakeMembers(*plan, 5);
    const auto want = RunOnCpu(*plan, h, false);
    const auto got = RunOnGpu(*plan, h, false, nullptr);
    EXPECT_EQ(want, got) << plan->signature;
  }
}

// Run from several threads at once (ops on the same device serialize).
TEST_F(CudaGpuTest, ConcurrentRuns) {
  auto plan = PlanOp(Spec(v1::PSUM, DType::kF32, {4099}, {"i"}), MeshShape{{"i"}, {3}});
  ASSERT_TRUE(plan.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 10; ++iter) {
        const HostMembers h = MakeMembers(*plan, 1000 * t + iter);
        EXPECT_EQ(RunOnGpu(*plan, h, iter % 2 == 1, nullptr), RunOnCpu(*plan, h, iter % 2 == 1));
      }
    });
  }
  for (auto& th : threads) th.join();
}

// RunTimed: when the launches were done (while the call ran) and the op's
// time on the GPU (within the call's); the same bits as Run.
TEST_F(CudaGpuTest, RunTimedReportsTheLaunchesAndTheDeviceTime) {
  auto plan = PlanOp(Spec(v1::PSUM, DType::kF32, {4 << 20}, {"i"}), MeshShape{{"i"}, {2}});
  ASSERT_TRUE(plan.ok());
  const HostMembers h = MakeMembers(*plan, 31);
  for (int round = 0; round < 3; ++round) {  // the events are made once, then reused
    DeviceTiming timing;
    const int64_t before = fastq::MonotonicNs();
    const auto got = RunOnGpu(*plan, h, round == 1, nullptr, 0, 0, &timing);
    const int64_t after = fastq::MonotonicNs();
    EXPECT_EQ(got, RunOnCpu(*plan, h, round == 1)) << "round " << round;
    EXPECT_GT(timing.launched_ns, before) << "round " << round;
    EXPECT_LT(timing.launched_ns, after) << "round " << round;
    EXPECT_GT(timing.device_ns, 0) << "round " << round << ": 16 MiB of psum took no GPU time";
    EXPECT_LT(timing.device_ns, after - before) << "round " << round;
  }
  // Without `timing`, nothing is recorded (and Run is RunTimed without it).
  EXPECT_EQ(RunOnGpu(*plan, h, false, nullptr), RunOnCpu(*plan, h, false));
}

TEST_F(CudaGpuTest, AMemberOnAGpuThatDoesNotExistIsRefused) {
  auto plan = PlanOp(Spec(v1::PSUM, DType::kF32, {4}, {"i"}), MeshShape{{"i"}, {2}});
  ASSERT_TRUE(plan.ok());
  std::vector<MemberIo> io(2);
  uint8_t dummy[16];
  for (auto& m : io) m.in = m.out = dummy;
  io[0].device = 0;
  io[1].device = ex_->device_count();
  const absl::Status st = ex_->Run(*plan, io);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("out of range"), std::string::npos) << st;
}

}  // namespace
}  // namespace collectived
