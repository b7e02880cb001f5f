#include "tests/integration/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

namespace collectived::integration {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// ---------------------------------------------------------------------------
// IEEE arithmetic with explicit NaN rules, so the result does not depend on
// how the compiler orders the operands. XLA:CPU's sums keep the NaN of the
// last NaN member (float16: of the first NaN in the accumulator), so AddF32
// and AddF64 take the NaN of `b` (the member) first:
//   b NaN -> b (quieted); else a NaN -> a (quieted); else an invalid
//   operation (inf - inf, 0 * inf) -> the default NaN, which has the sign bit
//   set (0xffc00000 / 0xfff8000000000000).
// And XLA:CPU's subnormal handling (this process runs with gradual
// underflow, so it is modelled): float32/float64/bfloat16 inputs read a
// subnormal as a zero of its sign (Daz); a result below the smallest normal
// after rounding with an unbounded exponent is a zero of its sign.

template <typename T>
T Daz(T x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(T{0}, x) : x;
}

float QuietF32(float a) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(a) | 0x00400000u);
}
double QuietF64(double a) {
  return std::bit_cast<double>(std::bit_cast<uint64_t>(a) | 0x0008000000000000ull);
}

// A tiny sum of normal numbers is exact: flushing the gradual sum is
// flushing the unbounded one.
template <typename T>
T FlushTiny(T r) {
  return std::fabs(r) < std::numeric_limits<T>::min() ? std::copysign(T{0}, r) : r;
}

float AddF32(float a, float b) {
  if (std::isnan(b)) return QuietF32(b);
  if (std::isnan(a)) return QuietF32(a);
  float r = a + b;
  if (std::isnan(r)) return std::bit_cast<float>(0xffc00000u);
  return FlushTiny(r);
}

double AddF64(double a, double b) {
  if (std::isnan(b)) return QuietF64(b);
  if (std::isnan(a)) return QuietF64(a);
  double r = a + b;
  if (std::isnan(r)) return std::bit_cast<double>(0xfff8000000000000ull);
  return FlushTiny(r);
}

// a * b for a pmean: b = 1/n, positive, normal and <= 1, so a tiny product
// needs |a| < 1; it is computed scaled up by 2^k, where it rounds with the
// type's full precision, and flushed if below the (scaled) smallest normal.
template <typename T>
T MulFlushed(T a, T b) {
  if (!(std::fabs(a) < T{1})) return a * b;
  constexpr int k = sizeof(T) == 4 ? 64 : 512;
  const T q = std::ldexp(a, k) * b;
  if (std::fabs(q) < std::ldexp(std::numeric_limits<T>::min(), k)) return std::copysign(T{0}, q);
  return std::ldexp(q, -k);
}

float MulF32(float a, float b) {
  if (std::isnan(a)) return QuietF32(a);
  if (std::isnan(b)) return QuietF32(b);
  float r = a * b;
  if (std::isnan(r)) return std::bit_cast<float>(0xffc00000u);
  return MulFlushed(a, b);
}

double MulF64(double a, double b) {
  if (std::isnan(a)) return QuietF64(a);
  if (std::isnan(b)) return QuietF64(b);
  double r = a * b;
  if (std::isnan(r)) return std::bit_cast<double>(0xfff8000000000000ull);
  return MulFlushed(a, b);
}

// ---------------------------------------------------------------------------
// Reductions of one element over the group (xs[j] points at member j's
// element), writing the result element at `out`.

template <typename T>
void SumInt(const std::vector<const uint8_t*>& xs, uint8_t* out) {
  using U = std::make_unsigned_t<T>;
  U acc = 0;
  for (const uint8_t* x : xs) acc = static_cast<U>(acc + static_cast<U>(Load<T>(x)));
  Store<T>(out, static_cast<T>(acc));
}

// psum of one element; the result has the psum dtype (bool -> int32).
void SumElem(DType dt, const std::vector<const uint8_t*>& xs, uint8_t* out) {
  switch (dt) {
    case DType::kF32: {
      float acc = 0.0f;
      for (const uint8_t* x : xs) acc = AddF32(acc, Daz(Load<float>(x)));
      Store(out, acc);
      return;
    }
    case DType::kF64: {
      double acc = 0.0;
      for (const uint8_t* x : xs) acc = AddF64(acc, Daz(Load<double>(x)));
      Store(out, acc);
      return;
    }
    case DType::kF16: {
      // Rounded to float16 after every addition. float16 subnormals are
      // normal float32 numbers: nothing is flushed. The first NaN stays
      // (F32ToF16 makes it canonical).
      uint16_t acc = 0;
      for (const uint8_t* x : xs) {
        const float a = F16ToF32(acc);
        acc = F32ToF16(std::isnan(a) ? a : AddF32(a, F16ToF32(Load<uint16_t>(x))));
      }
      Store(out, acc);
      return;
    }
    case DType::kBF16: {
      // Accumulated in float32 (every addition flushed), rounded once.
      float acc = 0.0f;
      for (const uint8_t* x : xs) acc = AddF32(acc, Daz(BF16ToF32(Load<uint16_t>(x))));
      Store(out, F32ToBF16(acc));
      return;
    }
    case DType::kF8E4M3FN:
    case DType::kF8E5M2: {
      // In float16, as kF16 above (each member converted to float16
      // exactly), then converted to float8 once.
      const bool e4m3fn = dt == DType::kF8E4M3FN;
      uint16_t acc = 0;
      for (const uint8_t* x : xs) {
        const float a = F16ToF32(acc);
        acc = F32ToF16(std::isnan(a) ? a : AddF32(a, F8ToF32(e4m3fn, *x)));
      }
      *out = F32ToF8(e4m3fn, F16ToF32(acc));
      return;
    }
    case DType::kI8: return SumInt<int8_t>(xs, out);
    case DType::kU8: return SumInt<uint8_t>(xs, out);
    case DType::kI32: return SumInt<int32_t>(xs, out);
    case DType::kU32: return SumInt<uint32_t>(xs, out);
    case DType::kI64: return SumInt<int64_t>(xs, out);
    case DType::kU64: return SumInt<uint64_t>(xs, out);
    case DType::kBool: {
      int32_t count = 0;
      for (const uint8_t* x : xs) count += (*x != 0) ? 1 : 0;
      Store(out, count);
      return;
    }
    default: std::abort();
  }
}

DType MeanDType(DType dt) {
  switch (dt) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3FN:
    case DType::kF8E5M2: return dt;
    case DType::kI64:
    case DType::kU64: return DType::kF64;
    default: return DType::kF32;
  }
}

DType SumDType(DType dt) { return dt == DType::kBool ? DType::kI32 : dt; }

void MeanElem(DType dt, const std::vector<const uint8_t*>& xs, uint8_t* out) {
  uint8_t sum[8];
  SumElem(dt, xs, sum);
  const int n = static_cast<int>(xs.size());
  const double recip = 1.0 / n;
  switch (dt) {
    case DType::kF32: Store(out, MulF32(Load<float>(sum), static_cast<float>(recip))); return;
    case DType::kF64: Store(out, MulF64(Load<double>(sum), recip)); return;
    case DType::kF16:
      // The reciprocal is rounded to float16; the product is computed in
      // float32 (exact for two float16 values) and rounded to float16.
      Store(out, F32ToF16(MulF32(F16ToF32(Load<uint16_t>(sum)), F16ToF32(F64ToF16(recip)))));
      return;
    case DType::kBF16:
      Store(out, F32ToBF16(MulF32(BF16ToF32(Load<uint16_t>(sum)), static_cast<float>(recip))));
      return;
    case DType::kF8E4M3FN:
    case DType::kF8E5M2: {
      // The float8 sum back in float16, times float16(1/n) (exact in
      // float32), rounded to float16, then to float8.
      const bool e4m3fn = dt == DType::kF8E4M3FN;
      const float product = MulF32(F8ToF32(e4m3fn, sum[0]), F16ToF32(F64ToF16(recip)));
      *out = F32ToF8(e4m3fn, F16ToF32(F32ToF16(product)));
      return;
    }
    case DType::kI8: Store(out, MulF32(static_cast<float>(Load<int8_t>(sum)), static_cast<float>(recip))); return;
    case DType::kU8: Store(out, MulF32(static_cast<float>(Load<uint8_t>(sum)), static_cast<float>(recip))); return;
    case DType::kI32:
    case DType::kBool:
      Store(out, MulF32(static_cast<float>(Load<int32_t>(sum)), static_cast<float>(recip)));
      return;
    case DType::kU32: Store(out, MulF32(static_cast<float>(Load<uint32_t>(sum)), static_cast<float>(recip))); return;
    case DType::kI64: Store(out, MulF64(static_cast<double>(Load<int64_t>(sum)), recip)); return;
    case DType::kU64: Store(out, MulF64(static_cast<double>(Load<uint64_t>(sum)), recip)); return;
    default: std::abort();
  }
}

// The value of an element for ordering (pmax/pmin): floats exactly as double.
template <typename T>
void MaxMinTyped(bool is_max, const std::vector<const uint8_t*>& xs, uint8_t* out) {
  T acc = is_max ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max();
  for (const uint8_t* x : xs) {
    T v = Load<T>(x);
    if (is_max ? (v > acc) : (v < acc)) acc = v;
  }
  Store(out, acc);
}

double FloatValue(DType dt, const uint8_t* p) {
  switch (dt) {
    case DType::kF32: return Load<float>(p);
    case DType::kF64: return Load<double>(p);
    case DType::kF16: return F16ToF32(Load<uint16_t>(p));
    case DType::kBF16: return BF16ToF32(Load<uint16_t>(p));
    case DType::kF8E4M3FN: return F8ToF32(true, *p);
    case DType::kF8E5M2: return F8ToF32(false, *p);
    default: std::abort();
  }
}

void MaxMinElem(bool is_max, DType dt, const std::vector<const uint8_t*>& xs, uint8_t* out) {
  switch (dt) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3FN:
    case DType::kF8E5M2: {
      // acc = -inf (+inf); if (x > acc) acc = x: NaN never wins, and on ties
      // the earlier member's value (bits) stays. The result keeps the bits of
      // the winning input, except that a float32/float64/bfloat16 subnormal
      // competes, and wins, as a zero of its sign.
      const size_t es = ElemSize(dt);
      uint8_t acc[8];
      double acc_value = is_max ? -INFINITY : INFINITY;
      switch (dt) {
        case DType::kF32: Store(acc, static_cast<float>(acc_value)); break;
        case DType::kF64: Store(acc, acc_value); break;
        case DType::kF16: Store<uint16_t>(acc, is_max ? 0xfc00 : 0x7c00); break;
        case DType::kF8E4M3FN:
        case DType::kF8E5M2:
          // float8_e4m3fn has no infinity: -inf/+inf become its NaN.
          *acc = F32ToF8(dt == DType::kF8E4M3FN, static_cast<float>(acc_value));
          break;
        default: Store<uint16_t>(acc, is_max ? 0xff80 : 0x7f80); break;
      }
      for (const uint8_t* x : xs) {
        uint8_t bits[8];
        std::memcpy(bits, x, es);
        switch (dt) {
          case DType::kF32: Store(bits, Daz(Load<float>(x))); break;
          case DType::kF64: Store(bits, Daz(Load<double>(x))); break;
          case DType::kBF16:
            if ((Load<uint16_t>(x) & 0x7f80) == 0) Store<uint16_t>(bits, Load<uint16_t>(x) & 0x8000);
            break;
          default: break;
        }
        double v = FloatValue(dt, bits);
        if (is_max ? (v > acc_value) : (v < acc_value)) {
          acc_value = v;
          std::memcpy(acc, bits, es);
        }
      }
      std::memcpy(out, acc, es);
      return;
    }
    case DType::kI8: return MaxMinTyped<int8_t>(is_max, xs, out);
    case DType::kU8: return MaxMinTyped<uint8_t>(is_max, xs, out);
    case DType::kI32: return MaxMinTyped<int32_t>(is_max, xs, out);
    case DType::kU32: return MaxMinTyped<uint32_t>(is_max, xs, out);
    case DType::kI64: return MaxMinTyped<int64_t>(is_max, xs, out);
    case DType::kU64: return MaxMinTyped<uint64_t>(is_max, xs, out);
    case DType::kBool: {
      bool acc = !is_max;
      for (const uint8_t* x : xs) acc = is_max ? (acc || *x != 0) : (acc && *x != 0);
      *out = acc ? 1 : 0;
      return;
    }
    default: std::abort();
  }
}

Shape Unravel(int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  return idx;
}

int64_t Ravel(const Shape& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + idx[i];
  return flat;
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kPsum: return "psum";
    case Op::kPmean: return "pmean";
    case Op::kPmax: return "pmax";
    case Op::kPmin: return "pmin";
    case Op::kAllGather: return "all_gather";
    case Op::kPpermute: return "ppermute";
    case Op::kPsumScatter: return "psum_scatter";
    case Op::kAllToAll: return "all_to_all";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

size_t ElemSize(DType dt) {
  switch (dt) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64: return 8;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3FN:
    case DType::kF8E5M2: return 1;
    default: return 0;
  }
}

const char* ShortName(DType dt) {
  switch (dt) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
    case DType::kU32: return "u32";
    case DType::kI64: return "i64";
    case DType::kU64: return "u64";
    case DType::kBool: return "bool";
    case DType::kF8E4M3FN: return "f8e4m3fn";
    case DType::kF8E5M2: return "f8e5m2";
    default: return "invalid";
  }
}

bool IsFloatType(DType dt) {
  return dt == DType::kF32 || dt == DType::kF64 || dt == DType::kF16 || dt == DType::kBF16 ||
         dt == DType::kF8E4M3FN || dt == DType::kF8E5M2;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeStr(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const uint32_t e = (h >> 10) & 0x1f;
  const uint32_t m = h & 0x3ff;
  if (e == 0) {
    float v = std::ldexp(static_cast<float>(m), -24);  // exact
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e - 15 + 127) << 23) | (m << 13));
}

uint16_t F64ToF16(double d) {
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  if (std::isnan(d)) return sign | 0x7e00;
  const double a = std::fabs(d);
  // 65520 is the midpoint between the largest half (65504) and 2^16; it and
  // everything above round to infinity.
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) {
    // Subnormal: a multiple of 2^-24; nearbyint rounds to nearest even.
    const double q = std::nearbyint(std::ldexp(a, 24));  // 0..1024 (1024: smallest normal)
    return sign | static_cast<uint16_t>(q);
  }
  int k;
  std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1)
  int exp = k - 1;     // a in [2^exp, 2^(exp+1))
  double q = std::nearbyint(std::ldexp(a, 10 - exp));  // 1024..2048
  if (q == 2048.0) {
    q = 1024.0;
    ++exp;
  }
  if (exp > 15) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(((exp + 15) << 10) | (static_cast<int>(q) - 1024));
}

float BF16ToF32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t F32ToBF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  // Round to nearest even on the 16 dropped bits (overflow gives inf).
  const uint32_t upper = u >> 16;
  const uint32_t lower = u & 0xffffu;
  uint32_t r = upper;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++r;
  return static_cast<uint16_t>(r);
}

// float8, written independently of the daemon's bit manipulations: decoding
// from the format's definition, encoding by searching the format's values.
float F8ToF32(bool e4m3fn, uint8_t b) {
  const int mant_bits = e4m3fn ? 3 : 2;
  const int bias = e4m3fn ? 7 : 15;
  const int e = (b & 0x7f) >> mant_bits;
  const int m = b & ((1 << mant_bits) - 1);
  float v;
  if (e4m3fn && (b & 0x7f) == 0x7f) {
    v = NAN;
  } else if (!e4m3fn && e == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(static_cast<float>(m + (1 << mant_bits)), e - bias - mant_bits);
  }
  return (b & 0x80) ? -v : v;
}

uint8_t F32ToF8(bool e4m3fn, float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return e4m3fn ? (sign | 0x7f) : 0x7f;
  // The codes 0 .. top in order of value, top being one past the largest
  // finite code and standing for 480 (e4m3fn: its NaN) or 2^16 (e5m2: inf).
  const int top = e4m3fn ? 0x7f : 0x7c;
  const double a = std::fabs(static_cast<double>(f));
  const auto value = [&](int c) {
    return c == top ? (e4m3fn ? 480.0 : 65536.0) : static_cast<double>(F8ToF32(e4m3fn, static_cast<uint8_t>(c)));
  };
  if (a >= value(top)) return sign | top;
  int lo = 0;  // the largest code whose value is <= a
  while (lo + 1 <= top && value(lo + 1) <= a) ++lo;
  if (value(lo) == a) return sign | lo;
  const double below = a - value(lo), above = value(lo + 1) - a;
  const int c = below < above ? lo : above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return static_cast<uint8_t>(sign | c);
}

std::string ElemString(DType dt, const uint8_t* p) {
  char buf[96];
  switch (dt) {
    case DType::kF32: {
      float v = Load<float>(p);
      std::snprintf(buf, sizeof(buf), "%.9g(0x%08x)", v, std::bit_cast<uint32_t>(v));
      break;
    }
    case DType::kF64: {
      double v = Load<double>(p);
      std::snprintf(buf, sizeof(buf), "%.17g(0x%016llx)", v,
                    static_cast<unsigned long long>(std::bit_cast<uint64_t>(v)));
      break;
    }
    case DType::kF16:
      std::snprintf(buf, sizeof(buf), "%.6g(0x%04x)", F16ToF32(Load<uint16_t>(p)), Load<uint16_t>(p));
      break;
    case DType::kBF16:
      std::snprintf(buf, sizeof(buf), "%.4g(0x%04x)", BF16ToF32(Load<uint16_t>(p)), Load<uint16_t>(p));
      break;
    case DType::kF8E4M3FN:
    case DType::kF8E5M2:
      std::snprintf(buf, sizeof(buf), "%.4g(0x%02x)", F8ToF32(dt == DType::kF8E4M3FN, *p), *p);
      break;
    case DType::kI8: std::snprintf(buf, sizeof(buf), "%d", Load<int8_t>(p)); break;
    case DType::kU8: std::snprintf(buf, sizeof(buf), "%u", Load<uint8_t>(p)); break;
    case DType::kBool: std::snprintf(buf, sizeof(buf), "bool(0x%02x)", Load<uint8_t>(p)); break;
    case DType::kI32: std::snprintf(buf, sizeof(buf), "%d", Load<int32_t>(p)); break;
    case DType::kU32: std::snprintf(buf, sizeof(buf), "%u", Load<uint32_t>(p)); break;
    case DType::kI64: std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(Load<int64_t>(p))); break;
    case DType::kU64:
      std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(Load<uint64_t>(p)));
      break;
    default: std::snprintf(buf, sizeof(buf), "?"); break;
  }
  return buf;
}

OpParams NonNegativeAxes(Op op, size_t rank, const OpParams& p) {
  OpParams q = p;
  const int r = static_cast<int>(rank);
  if (op == Op::kAllGather && q.axis < 0) q.axis += q.tiled ? r : r + 1;
  if ((op == Op::kPsumScatter || op == Op::kAllToAll) && q.axis < 0) q.axis += r;
  if (op == Op::kAllToAll && q.concat_axis < 0) q.concat_axis += r;
  return q;
}

bool ResultType(Op op, DType dt, const Shape& shape, int n, const OpParams& given, DType* out_dt,
                Shape* out_shape, std::string* why) {
  const OpParams p = NonNegativeAxes(op, shape.size(), given);
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  const int rank = static_cast<int>(shape.size());
  *out_dt = dt;
  *out_shape = shape;
  switch (op) {
    case Op::kPsum: *out_dt = SumDType(dt); return true;
    case Op::kPmean: *out_dt = MeanDType(dt); return true;
    case Op::kPmax:
    case Op::kPmin:
    case Op::kBroadcast:
    case Op::kBarrier: return true;
    case Op::kPpermute: {
      std::vector<bool> src(n, false), dst(n, false);
      for (auto [s, d] : p.perm) {
        if (s < 0 || s >= n || d < 0 || d >= n) return fail("perm pair out of range");
        if (src[s] || dst[d]) return fail("perm repeats a source or dest");
        src[s] = dst[d] = true;
      }
      return true;
    }
    case Op::kAllGather:
      if (p.tiled) {
        if (p.axis < 0 || p.axis >= rank) return fail("tiled all_gather axis out of range");
        (*out_shape)[p.axis] *= n;
      } else {
        if (p.axis < 0 || p.axis > rank) return fail("all_gather axis out of range");
        out_shape->insert(out_shape->begin() + p.axis, n);
      }
      return true;
    case Op::kPsumScatter:
      if (dt == DType::kBool) return fail("psum_scatter of bool");
      if (p.axis < 0 || p.axis >= rank) return fail("scatter_dimension out of range");
      if (p.tiled) {
        if (shape[p.axis] % n != 0) return fail("not divisible");
        (*out_shape)[p.axis] /= n;
      } else {
        if (shape[p.axis] != n) return fail("dimension != group size");
        out_shape->erase(out_shape->begin() + p.axis);
      }
      return true;
    case Op::kAllToAll: {
      const int s = p.axis, c = p.concat_axis;
      if (s < 0 || s >= rank || c < 0 || c >= rank) return fail("axes out of range");
      if (p.tiled) {
        if (shape[s] % n != 0) return fail("not divisible");
        (*out_shape)[s] /= n;
        (*out_shape)[c] *= n;
      } else {
        if (shape[s] != n) return fail("split dimension != group size");
        out_shape->erase(out_shape->begin() + s);
        out_shape->insert(out_shape->begin() + c, n);
      }
      return true;
    }
  }
  return fail("unknown op");
}

std::vector<uint8_t> Reference(Op op, DType dt, const Shape& shape, const OpParams& given,
                               const std::vector<const uint8_t*>& inputs, int rank,
                               bool mesh_of_one) {
  const OpParams p = NonNegativeAxes(op, shape.size(), given);
  const int n = static_cast<int>(inputs.size());
  DType out_dt;
  Shape out_shape;
  if (!ResultType(op, dt, shape, n, p, &out_dt, &out_shape)) std::abort();
  const size_t es = ElemSize(dt);
  const size_t oes = ElemSize(out_dt);
  const int64_t count = NumElements(out_shape);
  std::vector<uint8_t> out(static_cast<size_t>(count) * oes);
  std::vector<const uint8_t*> xs(n);
  // Element `flat` of member j's input.
  auto in_at = [&](int j, int64_t flat) { return inputs[j] + static_cast<size_t>(flat) * es; };
  auto copy_elem = [&](int64_t o, int j, int64_t flat) {
    std::memcpy(out.data() + static_cast<size_t>(o) * oes, in_at(j, flat), es);
  };

  for (int64_t o = 0; o < count; ++o) {
    uint8_t* dst = out.data() + static_cast<size_t>(o) * oes;
    switch (op) {
      case Op::kPsum:
      case Op::kPmean:
      case Op::kPmax:
      case Op::kPmin:
        for (int j = 0; j < n; ++j) xs[j] = in_at(j, o);
        if (mesh_of_one && IsFloatType(dt)) {
          // Nothing is reduced: the input's bits (a bfloat16 NaN canonical,
          // a float8_e5m2 NaN 0x7f).
          copy_elem(o, 0, o);
          if (dt == DType::kBF16 && std::isnan(FloatValue(dt, dst))) {
            Store<uint16_t>(dst, F32ToBF16(FloatValue(dt, dst)));
          }
          if (dt == DType::kF8E5M2 && std::isnan(FloatValue(dt, dst))) *dst = 0x7f;
        } else if (op == Op::kPsum) {
          SumElem(dt, xs, dst);
        } else if (op == Op::kPmean) {
          MeanElem(dt, xs, dst);  // NaN * (1/n) keeps the sum's NaN
        } else {
          MaxMinElem(op == Op::kPmax, dt, xs, dst);
        }
        break;
      case Op::kBroadcast: copy_elem(o, p.root, o); break;
      case Op::kPpermute: {
        int source = -1;
        for (auto [s, d] : p.perm) {
          if (d == rank) source = s;
        }
        if (source < 0) {
          std::memset(dst, 0, oes);
        } else {
          copy_elem(o, source, o);
        }
        break;
      }
      case Op::kAllGather: {
        Shape idx = Unravel(o, out_shape);
        int j;
        if (p.tiled) {
          j = static_cast<int>(idx[p.axis] / shape[p.axis]);
          idx[p.axis] %= shape[p.axis];
        } else {
          j = static_cast<int>(idx[p.axis]);
          idx.erase(idx.begin() + p.axis);
        }
        copy_elem(o, j, Ravel(idx, shape));
        break;
      }
      case Op::kPsumScatter: {
        Shape idx = Unravel(o, out_shape);
        if (p.tiled) {
          idx[p.axis] += static_cast<int64_t>(rank) * (shape[p.axis] / n);
        } else {
          idx.insert(idx.begin() + p.axis, rank);
        }
        const int64_t flat = Ravel(idx, shape);
        for (int j = 0; j < n; ++j) xs[j] = in_at(j, flat);
        SumElem(dt, xs, dst);
        break;
      }
      case Op::kAllToAll: {
        const int s = p.axis, c = p.concat_axis;
        Shape idx = Unravel(o, out_shape);
        int j;
        if (p.tiled) {
          // Output block j along c holds member j's chunk `rank` along s.
          const int64_t chunk = shape[s] / n;  // chunk size along s
          if (s == c) {
            j = static_cast<int>(idx[s] / chunk);
            idx[s] = static_cast<int64_t>(rank) * chunk + idx[s] % chunk;
          } else {
            j = static_cast<int>(idx[c] / shape[c]);
            idx[c] %= shape[c];
            idx[s] += static_cast<int64_t>(rank) * chunk;
          }
        } else {
          // out = stack_j(take(x_j, rank, axis=s), axis=c)
          j = static_cast<int>(idx[c]);
          idx.erase(idx.begin() + c);
          idx.insert(idx.begin() + s, rank);
        }
        copy_elem(o, j, Ravel(idx, shape));
        break;
      }
      case Op::kBarrier: break;
    }
  }
  return out;
}

}  // namespace collectived::integration
