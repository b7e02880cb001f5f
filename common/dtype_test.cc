#include "collectived/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace collectived {
namespace {

constexpr DType kAllDTypes[] = {
    DType::kF32, DType::kF64, DType::kF16,  DType::kBF16,
    DType::kI8,  DType::kU8,  DType::kI32,  DType::kU32,
    DType::kI64, DType::kU64, DType::kBool, DType::kF8E4M3FN, DType::kF8E5M2,
};

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool IsBF16NaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

// ---------------------------------------------------------------------------
// Metadata.

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kInvalid), 0u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI8), 1u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kU32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3FN), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E5M2), 1u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(14)), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(200)), 0u);
}

TEST(DTypeTest, Names) {
  EXPECT_EQ(DTypeName(DType::kInvalid), "invalid");
  EXPECT_EQ(DTypeName(DType::kF32), "float32");
  EXPECT_EQ(DTypeName(DType::kF64), "float64");
  EXPECT_EQ(DTypeName(DType::kF16), "float16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kI8), "int8");
  EXPECT_EQ(DTypeName(DType::kU8), "uint8");
  EXPECT_EQ(DTypeName(DType::kI32), "int32");
  EXPECT_EQ(DTypeName(DType::kU32), "uint32");
  EXPECT_EQ(DTypeName(DType::kI64), "int64");
  EXPECT_EQ(DTypeName(DType::kU64), "uint64");
  EXPECT_EQ(DTypeName(DType::kBool), "bool");
  EXPECT_EQ(DTypeName(DType::kF8E4M3FN), "float8_e4m3fn");
  EXPECT_EQ(DTypeName(DType::kF8E5M2), "float8_e5m2");
  EXPECT_EQ(DTypeName(static_cast<DType>(14)), "invalid");
  // The enum values are the wire (proto) numbers.
  EXPECT_EQ(static_cast<int>(DType::kF8E4M3FN), 12);
  EXPECT_EQ(static_cast<int>(DType::kF8E5M2), 13);
}

TEST(DTypeTest, ShortNames) {
  EXPECT_EQ(DTypeShortName(DType::kF32), "f32");
  EXPECT_EQ(DTypeShortName(DType::kF64), "f64");
  EXPECT_EQ(DTypeShortName(DType::kF16), "f16");
  EXPECT_EQ(DTypeShortName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeShortName(DType::kI8), "i8");
  EXPECT_EQ(DTypeShortName(DType::kU8), "u8");
  EXPECT_EQ(DTypeShortName(DType::kI32), "i32");
  EXPECT_EQ(DTypeShortName(DType::kU32), "u32");
  EXPECT_EQ(DTypeShortName(DType::kI64), "i64");
  EXPECT_EQ(DTypeShortName(DType::kU64), "u64");
  EXPECT_EQ(DTypeShortName(DType::kBool), "bool");
  EXPECT_EQ(DTypeShortName(DType::kF8E4M3FN), "f8e4m3fn");
  EXPECT_EQ(DTypeShortName(DType::kF8E5M2), "f8e5m2");
}

TEST(DTypeTest, FromNameInvertsName) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    std::optional<DType> back = DTypeFromName(DTypeName(dt));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, dt);
  }
}

TEST(DTypeTest, FromNameRejectsUnknown) {
  EXPECT_FALSE(DTypeFromName("invalid").has_value());
  EXPECT_FALSE(DTypeFromName("").has_value());
  EXPECT_FALSE(DTypeFromName("f32").has_value());  // short names are not names
  EXPECT_FALSE(DTypeFromName("Float32").has_value());
  EXPECT_FALSE(DTypeFromName("float32 ").has_value());
  EXPECT_FALSE(DTypeFromName("int16").has_value());
  EXPECT_FALSE(DTypeFromName("complex64").has_value());
}

TEST(DTypeTest, Classification) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kF8E4M3FN,
                   DType::kF8E5M2}) {
    EXPECT_TRUE(IsFloat(dt)) << DTypeName(dt);
    EXPECT_FALSE(IsInteger(dt)) << DTypeName(dt);
  }
  for (DType dt : {DType::kI8, DType::kU8, DType::kI32, DType::kU32,
                   DType::kI64, DType::kU64}) {
    EXPECT_FALSE(IsFloat(dt)) << DTypeName(dt);
    EXPECT_TRUE(IsInteger(dt)) << DTypeName(dt);
  }
  for (DType dt : {DType::kBool, DType::kInvalid}) {
    EXPECT_FALSE(IsFloat(dt)) << DTypeName(dt);
    EXPECT_FALSE(IsInteger(dt)) << DTypeName(dt);
  }
}

// ---------------------------------------------------------------------------
// float16, hand-written values (run with every compiler).

TEST(HalfTest, HalfToFloatKnownValues) {
  EXPECT_EQ(Bits(HalfToFloat(0x0000)), Bits(0.0f));
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), Bits(-0.0f));
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0x1.554p-2f);  // 0.333251953125
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);     // largest finite
  EXPECT_EQ(HalfToFloat(0x0400), 0x1p-14f);     // smallest normal
  EXPECT_EQ(HalfToFloat(0x03ff), 0x3ffp-24f);   // largest subnormal
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x8001), -0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  // NaNs stay NaN, keep sign and payload, and come out quiet.
  EXPECT_EQ(Bits(HalfToFloat(0x7e00)), 0x7fc00000u);
  EXPECT_EQ(Bits(HalfToFloat(0xfe00)), 0xffc00000u);
  EXPECT_EQ(Bits(HalfToFloat(0x7c01)), 0x7fc02000u);  // signaling in
  EXPECT_EQ(Bits(HalfToFloat(0x7d55)), 0x7feaa000u);
}

TEST(HalfTest, FloatToHalfKnownValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  // Overflow: 65520 is halfway from 65504 to 2^16 and rounds (to even) up.
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  // Ties to even around 1 (half ulp there is 2^-10).
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);  // tie, 0x3c00 is even
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
  EXPECT_EQ(FloatToHalf(1.0f + 0x3p-11f), 0x3c02);  // tie, 0x3c02 is even
  EXPECT_EQ(FloatToHalf(1.0f + 0x3p-11f - 0x1p-23f), 0x3c01);
  // Rounding carries into the exponent.
  EXPECT_EQ(FloatToHalf(2.0f - 0x1p-12f), 0x4000);
  // Subnormals: the unit is 2^-24.
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);             // tie to even (0)
  EXPECT_EQ(FloatToHalf(0x1p-25f + 0x1p-40f), 0x0001);  // just above the tie
  EXPECT_EQ(FloatToHalf(0x3p-25f), 0x0002);             // 1.5 units: tie to 2
  EXPECT_EQ(FloatToHalf(0x5p-25f), 0x0002);             // 2.5 units: tie to 2
  EXPECT_EQ(FloatToHalf(-0x3p-25f), 0x8002);
  EXPECT_EQ(FloatToHalf(0x3ffp-24f), 0x03ff);
  EXPECT_EQ(FloatToHalf(0x7ffp-25f), 0x0400);  // rounds up to the normal min
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);
  EXPECT_EQ(FloatToHalf(0x1p-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000);
  // NaN stays a quiet NaN with its sign, even when the payload bits that a
  // plain shift would keep are all zero.
  EXPECT_EQ(FloatToHalf(FromBits(0x7fc00000u)), 0x7e00);
  EXPECT_EQ(FloatToHalf(FromBits(0xffc00000u)), 0xfe00);
  EXPECT_EQ(FloatToHalf(FromBits(0x7f800001u)), 0x7e00);
  EXPECT_EQ(FloatToHalf(FromBits(0xff800001u)), 0xfe00);
  EXPECT_TRUE(IsHalfNaN(FloatToHalf(std::nanf(""))));
}

TEST(HalfTest, RoundTripsEveryHalf) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = FloatToHalf(HalfToFloat(h));
    if (IsHalfNaN(h)) {
      // Quieted, same sign and payload.
      ASSERT_EQ(back, h | 0x0200) << std::hex << i;
    } else {
      ASSERT_EQ(back, h) << std::hex << i;
    }
  }
}

// Every half value h and the float values at and next to the midpoints
// between h and its neighbours; these are where rounding goes wrong.
std::vector<float> HalfBoundaryFloats() {
  std::vector<float> out;
  for (uint32_t i = 0; i < 0x7c00; ++i) {
    const float lo = HalfToFloat(static_cast<uint16_t>(i));
    const float hi = i + 1 == 0x7c00
                         ? 65536.0f  // where the next would be
                         : HalfToFloat(static_cast<uint16_t>(i + 1));
    const float mid = (lo + hi) / 2;  // exact: at most 12 significant bits
    for (float f :
         {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      out.push_back(f);
      out.push_back(-f);
    }
  }
  return out;
}

#ifdef __FLT16_MAX__

// The compiler's _Float16 conversions are the reference.
uint16_t ReferenceFloatToHalf(float f) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}

float ReferenceHalfToFloat(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}

TEST(HalfTest, HalfToFloatMatchesFloat16Exhaustively) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float got = HalfToFloat(h);
    const float want = ReferenceHalfToFloat(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << i;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << i;
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << std::hex << i;
    }
  }
}

void ExpectFloatToHalfMatchesReference(float f) {
  const uint16_t got = FloatToHalf(f);
  const uint16_t want = ReferenceFloatToHalf(f);
  if (IsHalfNaN(want)) {
    ASSERT_TRUE(IsHalfNaN(got)) << std::hex << Bits(f);
    ASSERT_EQ(got & 0x8000, want & 0x8000) << std::hex << Bits(f);
  } else {
    ASSERT_EQ(got, want) << std::hex << "float bits 0x" << Bits(f);
  }
}

TEST(HalfTest, FloatToHalfMatchesFloat16AtBoundaries) {
  for (float f : HalfBoundaryFloats()) {
    ExpectFloatToHalfMatchesReference(f);
    if (HasFatalFailure()) return;
  }
}

TEST(HalfTest, FloatToHalfMatchesFloat16OnRandomBits) {
  constexpr int kSamples = 4 << 20;  // ~0.3 s, with sanitizers ~0.4 s
  std::mt19937 rng(12345);
  for (int i = 0; i < kSamples; ++i) {
    uint32_t u = rng();
    // Half of the samples land in the finite-half exponent range, where the
    // rounding logic is; the rest cover everything (NaN, inf, tiny, huge).
    if (i & 1) u = (u & 0x807fffffu) | ((102u + (u >> 23) % 42u) << 23);
    ExpectFloatToHalfMatchesReference(FromBits(u));
    if (HasFatalFailure()) return;
  }
}

#endif  // __FLT16_MAX__

// Independent of _Float16: the result is the nearest half (ties to even).
TEST(HalfTest, FloatToHalfIsNearestAtBoundaries) {
  for (float f : HalfBoundaryFloats()) {
    const uint16_t h = FloatToHalf(f);
    const double a = std::fabs(static_cast<double>(f));
    const uint16_t mag = h & 0x7fff;
    ASSERT_EQ(h & 0x8000, std::signbit(f) ? 0x8000 : 0) << f;
    if (a >= 65520.0) {
      ASSERT_EQ(mag, 0x7c00) << f;
      continue;
    }
    ASSERT_LT(mag, 0x7c00) << f;
    const double got = HalfToFloat(mag);
    const double err = std::fabs(got - a);
    if (mag > 0) {
      const double below = HalfToFloat(static_cast<uint16_t>(mag - 1));
      ASSERT_LE(err, a - below) << f;
      if (err == a - below) {
        ASSERT_EQ(mag & 1, 0) << f;  // a tie goes to the even one
      }
    }
    if (mag < 0x7bff) {
      const double above = HalfToFloat(static_cast<uint16_t>(mag + 1));
      ASSERT_LE(err, above - a) << f;
      if (err == above - a) {
        ASSERT_EQ(mag & 1, 0) << f;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// bfloat16.

TEST(BF16Test, BF16ToFloatKnownValues) {
  EXPECT_EQ(Bits(BF16ToFloat(0x0000)), 0x00000000u);
  EXPECT_EQ(Bits(BF16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(BF16ToFloat(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_EQ(BF16ToFloat(0x7f7f), 0x1.fep127f);  // largest finite
  EXPECT_EQ(BF16ToFloat(0x0001), 0x1p-133f);    // smallest subnormal
  EXPECT_EQ(BF16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(BF16ToFloat(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BF16ToFloat(0x7fc0)));
  EXPECT_TRUE(std::isnan(BF16ToFloat(0x7f81)));
  EXPECT_TRUE(std::signbit(BF16ToFloat(0xffc0)));
}

TEST(BF16Test, FloatToBF16RoundsToNearestEven) {
  // Near 1 the bf16 ulp is 2^-7; the ties are at odd multiples of 2^-8.
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f), 0x3f80);  // tie, down to even
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f - 0x1p-23f), 0x3f80);
  EXPECT_EQ(FloatToBF16(1.0f + 0x3p-8f), 0x3f82);  // tie, up to even
  EXPECT_EQ(FloatToBF16(1.0f + 0x3p-8f - 0x1p-23f), 0x3f81);
  EXPECT_EQ(FloatToBF16(-(1.0f + 0x1p-8f)), 0xbf80);
  EXPECT_EQ(FloatToBF16(-(1.0f + 0x3p-8f)), 0xbf82);
  // Carry into the exponent.
  EXPECT_EQ(FloatToBF16(2.0f - 0x1p-9f), 0x4000);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
}

TEST(BF16Test, FloatToBF16InfAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBF16(inf), 0x7f80);
  EXPECT_EQ(FloatToBF16(-inf), 0xff80);
  // Largest float rounds past the largest bf16 (0x7f7f) to inf.
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::max()), 0xff80);
  // The tie between 0x7f7f and "0x7f80" goes to the even one: inf.
  EXPECT_EQ(FloatToBF16(FromBits(0x7f7f8000u)), 0x7f80);
  EXPECT_EQ(FloatToBF16(FromBits(0x7f7f7fffu)), 0x7f7f);
}

TEST(BF16Test, FloatToBF16Subnormals) {
  EXPECT_EQ(FloatToBF16(FromBits(0x00010000u)), 0x0001);
  EXPECT_EQ(FloatToBF16(FromBits(0x00008000u)), 0x0000);  // tie to even
  EXPECT_EQ(FloatToBF16(FromBits(0x00008001u)), 0x0001);
  EXPECT_EQ(FloatToBF16(FromBits(0x00018000u)), 0x0002);  // tie to even
  EXPECT_EQ(FloatToBF16(FromBits(0x80018000u)), 0x8002);
  EXPECT_EQ(FloatToBF16(FromBits(0x007fffffu)), 0x0080);  // up to normal min
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

TEST(BF16Test, FloatToBF16KeepsNaN) {
  EXPECT_EQ(FloatToBF16(FromBits(0x7fc00000u)), 0x7fc0);
  EXPECT_EQ(FloatToBF16(FromBits(0xffc00000u)), 0xffc0);
  // Payload only in the low 16 bits: truncation would give inf.
  EXPECT_EQ(FloatToBF16(FromBits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(FloatToBF16(FromBits(0xff80ffffu)), 0xffc0);
  // Rounding must not carry a NaN into the sign bit or to inf.
  EXPECT_EQ(FloatToBF16(FromBits(0x7fffffffu)), 0x7fff);
  EXPECT_EQ(FloatToBF16(FromBits(0x7f81ffffu)), 0x7fc1);
}

TEST(BF16Test, RoundTripsEveryBF16) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = BF16ToFloat(b);
    ASSERT_EQ(Bits(f), i << 16) << std::hex << i;
    const uint16_t back = FloatToBF16(f);
    if (IsBF16NaN(b)) {
      ASSERT_EQ(back, b | 0x0040) << std::hex << i;  // quieted
    } else {
      ASSERT_EQ(back, b) << std::hex << i;
    }
  }
}

// Reference: pick the nearer of the two bf16 values around f, in double
// arithmetic; on a tie, the even one.
uint16_t ReferenceFloatToBF16(float f) {
  const uint32_t u = Bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double x = f;
  const double dlo = std::fabs(x - static_cast<double>(BF16ToFloat(lo)));
  // The next value up from the largest finite magnitude is inf; its
  // "position" for rounding is 2^128.
  const double vhi = (hi & 0x7fff) == 0x7f80
                         ? std::copysign(0x1p128, x)
                         : static_cast<double>(BF16ToFloat(hi));
  const double dhi = std::fabs(x - vhi);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(BF16Test, FloatToBF16MatchesReferenceOnRandomBits) {
  std::mt19937 rng(777);
  for (int i = 0; i < (1 << 20); ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(FloatToBF16(f), ReferenceFloatToBF16(f))
        << std::hex << "float bits 0x" << Bits(f);
  }
}

// ---------------------------------------------------------------------------
// float8: against ml_dtypes' conversions, tabulated by
// gen_float8_reference.py (float8_reference.inc).

struct Float8Step {
  uint32_t first_bits;  // smallest non-negative float32 bit pattern ...
  uint8_t code;         // ... that encodes to this code
};
struct Float8Special {
  uint32_t bits;
  uint8_t code;
};

#include "common/float8_reference.inc"

struct Float8Case {
  const char* name;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  const uint32_t* decoded;  // [256]
  const Float8Step* steps;
  size_t num_steps;
  const Float8Special* specials;
  size_t num_specials;
};

const Float8Case kFloat8Cases[] = {
    {"float8_e4m3fn", F8E4M3FNToFloat, FloatToF8E4M3FN, kDecodeE4M3FN, kEncodeThresholdsE4M3FN,
     std::size(kEncodeThresholdsE4M3FN), kEncodeSpecialsE4M3FN, std::size(kEncodeSpecialsE4M3FN)},
    {"float8_e5m2", F8E5M2ToFloat, FloatToF8E5M2, kDecodeE5M2, kEncodeThresholdsE5M2,
     std::size(kEncodeThresholdsE5M2), kEncodeSpecialsE5M2, std::size(kEncodeSpecialsE5M2)},
};

TEST(Float8Test, DecodeMatchesMlDtypesForEveryCode) {
  for (const Float8Case& c : kFloat8Cases) {
    for (uint32_t b = 0; b < 256; ++b) {
      ASSERT_EQ(Bits(c.decode(static_cast<uint8_t>(b))), c.decoded[b])
          << c.name << std::hex << " code 0x" << b;
    }
  }
}

TEST(Float8Test, EveryCodeRoundTrips) {
  for (const Float8Case& c : kFloat8Cases) {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint8_t code = static_cast<uint8_t>(b);
      const float f = c.decode(code);
      if (std::isnan(f)) {
        // e4m3fn has one NaN per sign; e5m2's NaNs come back as sign | 0x7e.
        const uint8_t want = static_cast<uint8_t>(
            (b & 0x80u) | (std::string(c.name) == "float8_e4m3fn" ? 0x7fu : 0x7eu));
        ASSERT_EQ(c.encode(f), want) << c.name << std::hex << " code 0x" << b;
      } else {
        ASSERT_EQ(c.encode(f), code) << c.name << std::hex << " code 0x" << b;
      }
    }
  }
}

TEST(Float8Test, EncodeMatchesMlDtypesAroundEveryStepAndOnADenseSweep) {
  for (const Float8Case& c : kFloat8Cases) {
    SCOPED_TRACE(c.name);
    std::vector<uint32_t> probe;
    // Around every rounding boundary (ties and the values next to them,
    // the subnormal/normal boundary, the overflow point).
    for (size_t i = 0; i < c.num_steps; ++i) {
      const uint32_t s = c.steps[i].first_bits;
      for (uint32_t d = 0; d < 9; ++d) {
        if (s + d >= 4 && s + d - 4 <= 0x7f800000u) probe.push_back(s + d - 4);
      }
    }
    // A dense sweep of the whole non-negative range, +inf included.
    for (uint64_t b = 0; b <= 0x7f800000u; b += 4093) probe.push_back(static_cast<uint32_t>(b));
    probe.push_back(0x7f800000u);
    size_t step = 0;
    std::sort(probe.begin(), probe.end());
    for (uint32_t bits : probe) {
      while (step + 1 < c.num_steps && c.steps[step + 1].first_bits <= bits) ++step;
      const uint8_t want = c.steps[step].code;
      ASSERT_EQ(c.encode(FromBits(bits)), want) << std::hex << "float bits 0x" << bits;
      // The sign is kept, NaN and inf included.
      ASSERT_EQ(c.encode(FromBits(bits | 0x80000000u)), want | 0x80)
          << std::hex << "float bits 0x" << (bits | 0x80000000u);
    }
    EXPECT_EQ(c.steps[0].first_bits, 0u);
  }
}

TEST(Float8Test, EncodeMatchesMlDtypesOnSpecials) {
  for (const Float8Case& c : kFloat8Cases) {
    for (size_t i = 0; i < c.num_specials; ++i) {
      EXPECT_EQ(c.encode(FromBits(c.specials[i].bits)), c.specials[i].code)
          << c.name << std::hex << " float bits 0x" << c.specials[i].bits;
    }
  }
}

// Hand-written values (independent of the table).
TEST(Float8Test, KnownValues) {
  const float inf = std::numeric_limits<float>::infinity();
  // float8_e4m3fn.
  EXPECT_EQ(F8E4M3FNToFloat(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(F8E4M3FNToFloat(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(F8E4M3FNToFloat(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(F8E4M3FNToFloat(0x38), 1.0f);
  EXPECT_EQ(F8E4M3FNToFloat(0xc0), -2.0f);
  EXPECT_EQ(Bits(F8E4M3FNToFloat(0x7f)), 0x7fc00000u);
  EXPECT_EQ(Bits(F8E4M3FNToFloat(0xff)), 0xffc00000u);
  EXPECT_EQ(F8E4M3FNToFloat(0x78), 256.0f);  // exponent 15 is finite
  EXPECT_EQ(FloatToF8E4M3FN(448.0f), 0x7e);
  EXPECT_EQ(FloatToF8E4M3FN(464.0f), 0x7e);    // tie: to even (448)
  EXPECT_EQ(FloatToF8E4M3FN(464.001f), 0x7f);  // past the tie: NaN
  EXPECT_EQ(FloatToF8E4M3FN(-1e6f), 0xff);
  EXPECT_EQ(FloatToF8E4M3FN(inf), 0x7f);
  EXPECT_EQ(FloatToF8E4M3FN(-inf), 0xff);
  EXPECT_EQ(FloatToF8E4M3FN(0x1p-10f), 0x00);  // half the smallest subnormal: to even
  EXPECT_EQ(FloatToF8E4M3FN(0x3p-10f), 0x02);  // 1.5 units: to even
  EXPECT_EQ(FloatToF8E4M3FN(-0x1p-10f), 0x80);
  EXPECT_EQ(FloatToF8E4M3FN(1.0625f), 0x38);  // tie between 1 and 1.125
  EXPECT_EQ(FloatToF8E4M3FN(1.1875f), 0x3a);  // tie between 1.125 and 1.25
  EXPECT_EQ(FloatToF8E4M3FN(0xfp-10f), 0x08);  // 7.5 units: to the smallest normal
  EXPECT_EQ(FloatToF8E4M3FN(FromBits(0x7f800001u)), 0x7f);
  EXPECT_EQ(FloatToF8E4M3FN(FromBits(0xffc00000u)), 0xff);
  // float8_e5m2.
  EXPECT_EQ(F8E5M2ToFloat(0x7b), 57344.0f);
  EXPECT_EQ(F8E5M2ToFloat(0x04), 0x1p-14f);
  EXPECT_EQ(F8E5M2ToFloat(0x01), 0x1p-16f);
  EXPECT_EQ(F8E5M2ToFloat(0x7c), inf);
  EXPECT_EQ(F8E5M2ToFloat(0xfc), -inf);
  EXPECT_EQ(Bits(F8E5M2ToFloat(0x7d)), 0x7fc00000u);  // signaling in, quiet out
  EXPECT_EQ(Bits(F8E5M2ToFloat(0xff)), 0xffc00000u);
  EXPECT_EQ(FloatToF8E5M2(61439.996f), 0x7b);
  EXPECT_EQ(FloatToF8E5M2(61440.0f), 0x7c);  // tie: to even, which is inf
  EXPECT_EQ(FloatToF8E5M2(-1e30f), 0xfc);
  EXPECT_EQ(FloatToF8E5M2(FromBits(0x7fc12345u)), 0x7e);
  EXPECT_EQ(FloatToF8E5M2(FromBits(0xff800001u)), 0xfe);
  EXPECT_EQ(FloatToF8E5M2(0x1p-17f), 0x00);
  EXPECT_EQ(FloatToF8E5M2(0x1.000002p-17f), 0x01);
}

}  // namespace
}  // namespace collectived
