#include "collectived/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace collectived {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
  std::string_view short_name;
};

// Indexed by the enum value.
constexpr DTypeInfo kDTypes[] = {
    {DType::kInvalid, 0, "invalid", "invalid"},
    {DType::kF32, 4, "float32", "f32"},
    {DType::kF64, 8, "float64", "f64"},
    {DType::kF16, 2, "float16", "f16"},
    {DType::kBF16, 2, "bfloat16", "bf16"},
    {DType::kI8, 1, "int8", "i8"},
    {DType::kU8, 1, "uint8", "u8"},
    {DType::kI32, 4, "int32", "i32"},
    {DType::kU32, 4, "uint32", "u32"},
    {DType::kI64, 8, "int64", "i64"},
    {DType::kU64, 8, "uint64", "u64"},
    {DType::kBool, 1, "bool", "bool"},
    {DType::kF8E4M3FN, 1, "float8_e4m3fn", "f8e4m3fn"},
    {DType::kF8E5M2, 1, "float8_e5m2", "f8e5m2"},
};
constexpr size_t kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);

// dtype.h's inline DTypeSize agrees with this table, entry by entry.
constexpr bool SizesAgree() {
  for (size_t i = 0; i < kNumDTypes; ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i ||
        DTypeSize(kDTypes[i].dtype) != kDTypes[i].size) {
      return false;
    }
  }
  return DTypeSize(static_cast<DType>(kNumDTypes)) == 0;
}
static_assert(SizesAgree(), "DTypeSize (dtype.h) and kDTypes disagree");

// Out-of-range enum values (e.g. cast from an unchecked wire byte) map to the
// kInvalid entry.
const DTypeInfo& Info(DType dt) {
  const size_t i = static_cast<size_t>(dt);
  return i < kNumDTypes ? kDTypes[i] : kDTypes[0];
}

}  // namespace

std::string_view DTypeName(DType dt) { return Info(dt).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (size_t i = 1; i < kNumDTypes; ++i) {
    if (kDTypes[i].name == name) return kDTypes[i].dtype;
  }
  return std::nullopt;
}

std::string_view DTypeShortName(DType dt) { return Info(dt).short_name; }

bool IsFloat(DType dt) {
  switch (dt) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3FN:
    case DType::kF8E5M2:
      return true;
    default:
      return false;
  }
}

bool IsInteger(DType dt) {
  switch (dt) {
    case DType::kI8:
    case DType::kU8:
    case DType::kI32:
    case DType::kU32:
    case DType::kI64:
    case DType::kU64:
      return true;
    default:
      return false;
  }
}

// These are the readable reference conversions. reduce.cc carries branch-free
// copies that the compiler can vectorize; the tests check both agree.

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    // Inf, or NaN: keep the payload and make it quiet (as hardware does).
    bits = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0);
  } else if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    bits = sign | std::bit_cast<uint32_t>(magnitude);
  } else {
    // Normal: rebias the exponent from 15 to 127.
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;  // |f|
  uint32_t h;
  if (a > 0x7f800000u) {
    // NaN: quiet it and keep the top of the payload.
    h = 0x7e00u | ((a >> 13) & 0x3ffu);
  } else if (a >= 0x477ff000u) {
    // >= 65520 (halfway from 65504, the largest half, to 2^16) rounds to
    // inf; so does inf itself.
    h = 0x7c00u;
  } else if (a >= 0x38800000u) {
    // Normal half (>= 2^-14): rebias, then round the 13 dropped bits to
    // nearest even. A mantissa carry correctly bumps the exponent.
    const uint32_t r = a - ((127u - 15u) << 23);
    h = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  } else {
    // Subnormal half or zero: the result counts units of 2^-24. With
    // m = significand (implicit bit included) and |f| = m * 2^(e - 150),
    // the count is m >> (126 - e), rounded to nearest even.
    const uint32_t e = a >> 23;
    const uint32_t m = e == 0 ? a : ((a & 0x7fffffu) | 0x800000u);
    // Float subnormals have an effective exponent of 1. Past a shift of 25
    // the value is below half a unit (m < 2^24) and rounds to zero anyway.
    const uint32_t shift = std::min(126u - std::max(e, 1u), 25u);
    h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u) != 0)) ++h;
  }
  return static_cast<uint16_t>(sign | h);
}

float BF16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t FloatToBF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could drop every payload bit (and give inf); force the
    // quiet bit instead.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even; a carry out of the mantissa bumps the exponent,
  // and past the largest finite value that gives inf.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// float8. Both formats are decoded and encoded by one pair of routines,
// parameterized by the number of mantissa bits and the exponent bias; what
// differs is the top of the range (e4m3fn: no infinity, S.1111.111 is NaN;
// e5m2: IEEE-like, exponent 31 is inf/NaN).
namespace {

struct F8Format {
  int mantissa_bits;  // 3 (e4m3fn), 2 (e5m2)
  int bias;           // 7, 15
  bool has_inf;       // false (e4m3fn), true (e5m2)
};
constexpr F8Format kE4M3FN{3, 7, false};
constexpr F8Format kE5M2{2, 15, true};

float F8ToFloat(uint8_t b, const F8Format& f) {
  const bool negative = (b & 0x80u) != 0;
  const int em = b & 0x7f;  // exponent and mantissa bits
  const int exp = em >> f.mantissa_bits;
  const int mant = em & ((1 << f.mantissa_bits) - 1);
  const int max_exp = (0x7f >> f.mantissa_bits);  // all exponent bits set
  float magnitude;
  if (f.has_inf ? exp == max_exp : em == 0x7f) {
    magnitude = (f.has_inf && mant == 0) ? std::numeric_limits<float>::infinity()
                                         : std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    // Subnormal: mant units of 2^(1 - bias - mantissa_bits).
    magnitude = std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>(mant + (1 << f.mantissa_bits)),
                           exp - f.bias - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;  // -NaN: the sign bit set
}

uint8_t FloatToF8(float value, const F8Format& f) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;  // |value|
  // The largest finite code, and what a magnitude past it becomes.
  const uint32_t max_finite = f.has_inf ? (0x7cu - 1) : 0x7eu;
  const uint32_t overflow = f.has_inf ? 0x7cu : 0x7fu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | (f.has_inf ? 0x7eu : 0x7fu));
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | overflow);
  const uint32_t drop = 23 - f.mantissa_bits;  // float mantissa bits dropped
  const uint32_t min_normal_exp = static_cast<uint32_t>(127 + 1 - f.bias);
  uint32_t code;
  if ((a >> 23) >= min_normal_exp) {
    // Normal: rebias, then round the dropped bits to nearest even; a carry
    // out of the mantissa correctly bumps the exponent.
    const uint32_t r = a - (static_cast<uint32_t>(127 - f.bias) << 23);
    const uint32_t half = 1u << (drop - 1);
    const uint32_t rem = r & ((1u << drop) - 1);
    code = r >> drop;
    if (rem > half || (rem == half && (code & 1u) != 0)) ++code;
    if (code > max_finite) code = overflow;
  } else {
    // Subnormal or zero: count units of 2^(1 - bias - mantissa_bits). With m
    // the significand (implicit bit included) and |value| = m * 2^(e - 150),
    // the count is m >> (151 - bias - mantissa_bits - e), rounded to nearest
    // even. Past a shift of 25 the value is below half a unit: zero.
    const uint32_t e = a >> 23;
    const uint32_t m = e == 0 ? a : ((a & 0x7fffffu) | 0x800000u);
    const uint32_t shift = std::min<uint32_t>(
        static_cast<uint32_t>(151 - f.bias - f.mantissa_bits) - std::max(e, 1u), 25u);
    code = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u) != 0)) ++code;
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace

float F8E4M3FNToFloat(uint8_t b) { return F8ToFloat(b, kE4M3FN); }
uint8_t FloatToF8E4M3FN(float f) { return FloatToF8(f, kE4M3FN); }
float F8E5M2ToFloat(uint8_t b) { return F8ToFloat(b, kE5M2); }
uint8_t FloatToF8E5M2(float f) { return FloatToF8(f, kE5M2); }

}  // namespace collectived
