#include "exec/reduce.h"

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "exec/reduce_ops.h"
#include "collectived/dtype.h"
#include "gtest/gtest.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace collectived {
namespace {

constexpr DType kAllDTypes[] = {
    DType::kF32, DType::kF64, DType::kF16,  DType::kBF16,
    DType::kI8,  DType::kU8,  DType::kI32,  DType::kU32,
    DType::kI64, DType::kU64, DType::kBool, DType::kF8E4M3FN, DType::kF8E5M2,
};
constexpr DType kFloatDTypes[] = {DType::kF32, DType::kF64, DType::kF16,
                                  DType::kBF16};
constexpr ReduceKind kAllKinds[] = {ReduceKind::kSum, ReduceKind::kMax,
                                    ReduceKind::kMin, ReduceKind::kMean};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string KindName(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum:
      return "Sum";
    case ReduceKind::kMax:
      return "Max";
    case ReduceKind::kMin:
      return "Min";
    case ReduceKind::kMean:
      return "Mean";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Byte-level helpers for the float dtypes: values in and out as doubles.

std::vector<uint8_t> EncodeFloats(DType dt, const std::vector<double>& values) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dt));
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = out.data() + i * DTypeSize(dt);
    const float f = static_cast<float>(values[i]);
    uint16_t h = 0;
    switch (dt) {
      case DType::kF32:
        std::memcpy(p, &f, 4);
        break;
      case DType::kF64:
        std::memcpy(p, &values[i], 8);
        break;
      case DType::kF16:
        h = FloatToHalf(f);
        std::memcpy(p, &h, 2);
        break;
      case DType::kBF16:
        h = FloatToBF16(f);
        std::memcpy(p, &h, 2);
        break;
      case DType::kF8E4M3FN:
        *p = FloatToF8E4M3FN(f);
        break;
      case DType::kF8E5M2:
        *p = FloatToF8E5M2(f);
        break;
      default:
        ADD_FAILURE() << "not a float dtype";
    }
  }
  return out;
}

double DecodeFloat(DType dt, const uint8_t* buf, size_t i) {
  const uint8_t* p = buf + i * DTypeSize(dt);
  float f;
  double d;
  uint16_t h;
  switch (dt) {
    case DType::kF32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::kF64:
      std::memcpy(&d, p, 8);
      return d;
    case DType::kF16:
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return BF16ToFloat(h);
    case DType::kF8E4M3FN:
      return F8E4M3FNToFloat(*p);
    case DType::kF8E5M2:
      return F8E5M2ToFloat(*p);
    default:
      ADD_FAILURE() << "not a float dtype";
      return 0;
  }
}

// Reduces float-dtype inputs given as doubles; returns the outputs as doubles.
std::vector<double> ReduceFloats(ReduceKind kind, DType dt,
                                 const std::vector<std::vector<double>>& in) {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<const void*> ptrs;
  for (const auto& v : in) bufs.push_back(EncodeFloats(dt, v));
  for (const auto& b : bufs) ptrs.push_back(b.data());
  const size_t count = in[0].size();
  std::vector<uint8_t> out(count * DTypeSize(dt));
  Reduce(kind, dt, ptrs.data(), static_cast<int>(ptrs.size()), out.data(),
         count);
  std::vector<double> result;
  for (size_t i = 0; i < count; ++i) {
    result.push_back(DecodeFloat(dt, out.data(), i));
  }
  return result;
}

// Reduces typed inputs into typed outputs.
template <typename Out, typename In>
std::vector<Out> ReduceTyped(ReduceKind kind, DType dt,
                             const std::vector<std::vector<In>>& in) {
  EXPECT_EQ(DTypeSize(dt), sizeof(In));
  EXPECT_EQ(DTypeSize(ReduceResultDType(kind, dt)), sizeof(Out));
  std::vector<const void*> ptrs;
  for (const auto& v : in) ptrs.push_back(v.data());
  std::vector<Out> out(in[0].size());
  Reduce(kind, dt, ptrs.data(), static_cast<int>(ptrs.size()), out.data(),
         out.size());
  return out;
}

// ---------------------------------------------------------------------------
// Scalar reference implementation, written independently of the kernels,
// straight from the rules in reduce.h: start from the identity, take the
// members in order; pmax/pmin take a member only when it compares
// greater/less; pmean multiplies by the reciprocal 1/n. The floating-point
// environment of XLA on CPU is modelled in software (this thread runs with
// gradual underflow):
//  - float32/float64/bfloat16 inputs: a subnormal reads as a zero of its sign
//    (denormals-are-zero); float16 is computed in float32, where its
//    subnormals are normal numbers;
//  - results of + and *: rounded as if the exponent range were unbounded; a
//    result below the smallest normal is a zero of its sign (flush-to-zero,
//    x86's tininess after rounding);
//  - NaNs: a sum's NaN is the last NaN member's (float16: the first's),
//    quieted; an invalid operation (inf - inf) gives the default NaN, sign
//    set; float16/bfloat16 NaN results are canonical (sign | quiet bit).

template <typename T>
T Elem(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
using UintOf = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

template <typename T>
T RefDaz(T x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(T{0}, x) : x;
}

template <typename T>
T RefQuiet(T x) {
  constexpr UintOf<T> kQuiet = UintOf<T>{1} << (std::numeric_limits<T>::digits - 2);
  return std::bit_cast<T>(static_cast<UintOf<T>>(std::bit_cast<UintOf<T>>(x) | kQuiet));
}

template <typename T>
T RefDefaultNaN() {
  return std::copysign(std::numeric_limits<T>::quiet_NaN(), T{-1});
}

template <typename T>
T RefFlushTiny(T r) {
  return std::fabs(r) < std::numeric_limits<T>::min() ? std::copysign(T{0}, r) : r;
}

// acc + x, x already read with denormals-are-zero: the NaN of the last NaN
// operand wins. A tiny sum of normal numbers is exact, so flushing the
// (gradual) sum is flushing the unbounded one.
template <typename T>
T RefAdd(T acc, T x) {
  if (std::isnan(x)) return RefQuiet(x);
  if (std::isnan(acc)) return acc;
  if (std::isinf(acc) && std::isinf(x) && std::signbit(acc) != std::signbit(x)) {
    return RefDefaultNaN<T>();
  }
  return RefFlushTiny(acc + x);
}

// s * scale (scale = 1/n, a positive normal number <= 1), rounded with an
// unbounded exponent, then flushed if tiny. Tiny products need |s| < 1;
// those are computed scaled up by 2^k, away from the subnormal range.
template <typename T>
T RefMul(T s, T scale) {
  if (std::isnan(s)) return RefQuiet(s);
  if (!(std::fabs(s) < T{1})) return s * scale;
  constexpr int k = sizeof(T) == 4 ? 64 : 512;
  const T q = std::ldexp(s, k) * scale;
  if (std::fabs(q) < std::ldexp(std::numeric_limits<T>::min(), k)) {
    return std::copysign(T{0}, q);
  }
  return std::ldexp(q, -k);
}

uint16_t RefHalfOut(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xfe00 : 0x7e00;
  return FloatToHalf(f);
}

uint16_t RefBF16Out(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xffc0 : 0x7fc0;
  return FloatToBF16(f);
}

template <typename T>
std::vector<uint8_t> RefFloat(ReduceKind kind,
                              const std::vector<const void*>& in,
                              size_t count) {
  const int n = static_cast<int>(in.size());
  std::vector<T> out(count);
  for (size_t i = 0; i < count; ++i) {
    T acc = 0;
    if (kind == ReduceKind::kMax) acc = -std::numeric_limits<T>::infinity();
    if (kind == ReduceKind::kMin) acc = std::numeric_limits<T>::infinity();
    for (int k = 0; k < n; ++k) {
      const T x = RefDaz(Elem<T>(in[k], i));
      switch (kind) {
        case ReduceKind::kSum:
        case ReduceKind::kMean:
          acc = RefAdd(acc, x);
          break;
        case ReduceKind::kMax:
          if (x > acc) acc = x;
          break;
        case ReduceKind::kMin:
          if (x < acc) acc = x;
          break;
      }
    }
    // float32: 1.0f / n; float64: 1.0 / n.
    out[i] = kind == ReduceKind::kMean ? RefMul(acc, T{1} / static_cast<T>(n)) : acc;
  }
  return ToBytes(out);
}

// float16 / bfloat16. The sum: float16 rounds after every addition, bfloat16
// accumulates in float32 and rounds once. max/min compare as float32 and keep
// the winning input's bits (a bfloat16 subnormal wins as a zero), or the
// identity's +-inf. The mean: the rounded sum times the reciprocal
// (float16(1/n) for float16, float32 1/n for bfloat16) in float32, rounded.
std::vector<uint8_t> RefWidened(ReduceKind kind, DType dt,
                                const std::vector<const void*>& in,
                                size_t count) {
  const bool half = dt == DType::kF16;
  const auto decode = [half](uint16_t b) {
    return half ? HalfToFloat(b) : RefDaz(BF16ToFloat(b));
  };
  const auto encode = half ? RefHalfOut : RefBF16Out;
  const int n = static_cast<int>(in.size());
  std::vector<uint16_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    if (kind == ReduceKind::kMax || kind == ReduceKind::kMin) {
      const bool is_max = kind == ReduceKind::kMax;
      const float inf = std::numeric_limits<float>::infinity();
      float acc = is_max ? -inf : inf;
      for (int k = 0; k < n; ++k) {
        const float x = decode(Elem<uint16_t>(in[k], i));
        if (is_max ? x > acc : x < acc) acc = x;
      }
      out[i] = encode(acc);
      continue;
    }
    float acc = 0.0f;  // +0
    for (int k = 0; k < n; ++k) {
      const float x = decode(Elem<uint16_t>(in[k], i));
      if (!half) {
        acc = RefAdd(acc, x);
      } else if (std::isnan(acc)) {
        // float16 keeps the first NaN.
      } else if (std::isnan(x)) {
        acc = RefQuiet(x);
      } else if (std::isinf(acc) && std::isinf(x) && acc != x) {
        acc = RefDefaultNaN<float>();
      } else {
        acc = HalfToFloat(FloatToHalf(acc + x));  // sums of halves are not tiny
      }
    }
    const uint16_t sum = encode(acc);
    if (kind == ReduceKind::kMean) {
      const float recip = 1.0f / static_cast<float>(n);
      const float scale = half ? HalfToFloat(FloatToHalf(recip)) : recip;
      out[i] = encode(RefMul(decode(sum), scale));
    } else {
      out[i] = sum;
    }
  }
  return ToBytes(out);
}

// float8 (reduce.h): XLA computes it in float16. Each input is converted to
// float16 (exact), reduced by the float16 rules (RefWidened's), and the
// float16 result converted to float8 (nearest even; float8_e4m3fn: NaN and
// overflow give sign | 0x7f; float8_e5m2: a NaN gives 0x7f, sign dropped).
// The mean converts the float16 sum to float8 and back, multiplies by
// float16(1/n) and rounds to float16, then to float8.
std::vector<uint8_t> RefFloat8(ReduceKind kind, DType dt, const std::vector<const void*>& in,
                               size_t count) {
  const bool e4m3 = dt == DType::kF8E4M3FN;
  const auto decode = [e4m3](uint8_t b) { return e4m3 ? F8E4M3FNToFloat(b) : F8E5M2ToFloat(b); };
  const auto encode = [e4m3](float f) -> uint8_t {
    if (std::isnan(f) && !e4m3) return 0x7f;
    return e4m3 ? FloatToF8E4M3FN(f) : FloatToF8E5M2(f);
  };
  const int n = static_cast<int>(in.size());
  std::vector<std::vector<uint16_t>> halves(n, std::vector<uint16_t>(count));
  std::vector<const void*> half_ptrs;
  for (int k = 0; k < n; ++k) {
    for (size_t i = 0; i < count; ++i) {
      halves[k][i] = FloatToHalf(decode(Elem<uint8_t>(in[k], i)));
    }
    half_ptrs.push_back(halves[k].data());
  }
  const ReduceKind half_kind = kind == ReduceKind::kMean ? ReduceKind::kSum : kind;
  const std::vector<uint8_t> h = RefWidened(half_kind, DType::kF16, half_ptrs, count);
  const float scale = HalfToFloat(FloatToHalf(1.0f / static_cast<float>(n)));
  std::vector<uint8_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    float v = HalfToFloat(Elem<uint16_t>(h.data(), i));
    if (kind == ReduceKind::kMean) {
      v = HalfToFloat(RefHalfOut(decode(encode(v)) * scale));  // exact product
    }
    out[i] = encode(v);
  }
  return out;
}

// Integers: the sum wraps modulo 2^bits (computed here in uint64 and then
// truncated); mean converts the wrapped sum to R and multiplies it by 1/n
// computed in R.
template <typename T, typename R>
std::vector<uint8_t> RefInt(ReduceKind kind, const std::vector<const void*>& in,
                            size_t count) {
  const int n = static_cast<int>(in.size());
  std::vector<T> out(count);
  std::vector<R> mean(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t sum = 0;
    T mx = Elem<T>(in[0], i);
    T mn = mx;
    for (int k = 0; k < n; ++k) {
      const T x = Elem<T>(in[k], i);
      sum += static_cast<uint64_t>(x);
      mx = std::max(mx, x);
      mn = std::min(mn, x);
    }
    const T wrapped = static_cast<T>(sum);  // modular since C++20
    switch (kind) {
      case ReduceKind::kSum:
        out[i] = wrapped;
        break;
      case ReduceKind::kMax:
        out[i] = mx;
        break;
      case ReduceKind::kMin:
        out[i] = mn;
        break;
      case ReduceKind::kMean:
        mean[i] = static_cast<R>(wrapped) * (R{1} / static_cast<R>(n));
        break;
    }
  }
  return kind == ReduceKind::kMean ? ToBytes(mean) : ToBytes(out);
}

std::vector<uint8_t> RefBool(ReduceKind kind,
                             const std::vector<const void*>& in, size_t count) {
  const int n = static_cast<int>(in.size());
  std::vector<int32_t> counts(count);
  std::vector<uint8_t> bits(count);
  std::vector<float> mean(count);
  for (size_t i = 0; i < count; ++i) {
    int32_t c = 0;
    for (int k = 0; k < n; ++k) c += Elem<uint8_t>(in[k], i) != 0 ? 1 : 0;
    counts[i] = c;
    bits[i] = kind == ReduceKind::kMax ? (c > 0) : (c == n);
    mean[i] = static_cast<float>(c) * (1.0f / static_cast<float>(n));
  }
  switch (kind) {
    case ReduceKind::kSum:
      return ToBytes(counts);
    case ReduceKind::kMean:
      return ToBytes(mean);
    default:
      return bits;
  }
}

std::vector<uint8_t> ReferenceReduce(ReduceKind kind, DType dt,
                                     const std::vector<const void*>& in,
                                     size_t count) {
  switch (dt) {
    case DType::kF32:
      return RefFloat<float>(kind, in, count);
    case DType::kF64:
      return RefFloat<double>(kind, in, count);
    case DType::kF16:
    case DType::kBF16:
      return RefWidened(kind, dt, in, count);
    case DType::kF8E4M3FN:
    case DType::kF8E5M2:
      return RefFloat8(kind, dt, in, count);
    case DType::kI8:
      return RefInt<int8_t, float>(kind, in, count);
    case DType::kU8:
      return RefInt<uint8_t, float>(kind, in, count);
    case DType::kI32:
      return RefInt<int32_t, float>(kind, in, count);
    case DType::kU32:
      return RefInt<uint32_t, float>(kind, in, count);
    case DType::kI64:
      return RefInt<int64_t, double>(kind, in, count);
    case DType::kU64:
      return RefInt<uint64_t, double>(kind, in, count);
    case DType::kBool:
      return RefBool(kind, in, count);
    case DType::kInvalid:
      break;
  }
  ADD_FAILURE() << "bad dtype";
  return {};
}

// Compares outputs element by element, bit for bit (NaN payloads and signs
// included).
void ExpectSameOutput(DType out_dt, const uint8_t* got,
                      const std::vector<uint8_t>& want, size_t count) {
  const size_t size = DTypeSize(out_dt);
  int failures = 0;
  for (size_t i = 0; i < count && failures < 5; ++i) {
    if (std::memcmp(got + i * size, want.data() + i * size, size) == 0) {
      continue;
    }
    ++failures;
    uint64_t got_bits = 0, want_bits = 0;
    std::memcpy(&got_bits, got + i * size, size);
    std::memcpy(&want_bits, want.data() + i * size, size);
    std::string detail;
    if (IsFloat(out_dt)) {
      detail = " (" + std::to_string(DecodeFloat(out_dt, got, i)) + " vs " +
               std::to_string(DecodeFloat(out_dt, want.data(), i)) + ")";
    }
    ADD_FAILURE() << "element " << i << " of " << count << " differs: got 0x"
                  << std::hex << got_bits << " want 0x" << want_bits << std::dec
                  << detail;
  }
}

// ---------------------------------------------------------------------------
// Random inputs.

// A buffer of `count` elements that starts one element past the allocation's
// start when `misalign` (so it is not vector-aligned), plus guard bytes after.
class Buffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xa5;

  Buffer(size_t elem_size, size_t count, bool misalign)
      : offset_(misalign ? elem_size : 0),
        size_(elem_size * count),
        bytes_(offset_ + size_ + kGuard, kGuardByte) {}

  uint8_t* data() { return bytes_.data() + offset_; }
  const uint8_t* data() const { return bytes_.data() + offset_; }
  size_t size() const { return size_; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if ((i < offset_ || i >= offset_ + size_) && bytes_[i] != kGuardByte) {
        return false;
      }
    }
    return true;
  }

 private:
  size_t offset_;
  size_t size_;
  std::vector<uint8_t> bytes_;
};

template <typename T>
void Put(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

template <typename T>
T RandomInt(std::mt19937_64& rng) {
  // Mostly full-range bits (sums overflow), sometimes the extremes.
  switch (rng() % 8) {
    case 0:
      return std::numeric_limits<T>::max();
    case 1:
      return std::numeric_limits<T>::min();
    default:
      return static_cast<T>(rng());
  }
}

// Floats: mostly ordinary values, some specials (signed zeros, infinities,
// NaNs, huge, subnormals, and normals near the smallest one, whose sums and
// means underflow), and small integers so equal values happen.
double RandomFloatValue(std::mt19937_64& rng, double big, double tiny,
                        double subnormal) {
  const uint64_t r = rng() % 100;
  if (r < 60) {
    return std::uniform_real_distribution<double>(-1000, 1000)(rng);
  }
  if (r < 75) return static_cast<double>(static_cast<int>(rng() % 5) - 2);
  const double specials[] = {0.0,        -0.0,        kInf,       -kInf,
                             kNaN,       -kNaN,       big,        -big,
                             subnormal,  -subnormal,  tiny,       -tiny,
                             1.5 * tiny, -1.5 * tiny, 3.0 * tiny, -2.0 * tiny};
  return specials[rng() % std::size(specials)];
}

void FillRandom(DType dt, uint8_t* p, size_t count, std::mt19937_64& rng) {
  for (size_t i = 0; i < count; ++i) {
    switch (dt) {
      case DType::kF32:
        // Some arbitrary bit patterns (NaN payloads, signaling NaNs).
        if (rng() % 16 == 0) {
          Put(p, i, static_cast<uint32_t>(rng()));
        } else {
          Put(p, i, static_cast<float>(RandomFloatValue(rng, 3e38, 0x1p-126,
                                                        1e-40)));
        }
        break;
      case DType::kF64:
        if (rng() % 16 == 0) {
          Put(p, i, static_cast<uint64_t>(rng()));
        } else {
          Put(p, i, RandomFloatValue(rng, 1.7e308, 0x1p-1022, 1e-310));
        }
        break;
      case DType::kF16:
      case DType::kBF16:
        // Half of them arbitrary bit patterns (every class of value).
        if (rng() % 2 == 0) {
          Put(p, i, static_cast<uint16_t>(rng()));
        } else {
          const float f = static_cast<float>(RandomFloatValue(
              rng, dt == DType::kF16 ? 60000.0 : 3e38,
              dt == DType::kF16 ? 0x1p-14 : 0x1p-126,
              dt == DType::kF16 ? 0x1p-20 : 1e-40));
          Put(p, i, dt == DType::kF16 ? FloatToHalf(f) : FloatToBF16(f));
        }
        break;
      case DType::kF8E4M3FN:
      case DType::kF8E5M2: {
        // Half of them arbitrary bytes (every class of value).
        const bool e4m3 = dt == DType::kF8E4M3FN;
        const uint64_t r = rng() % 4;
        if (r < 2) {
          Put(p, i, static_cast<uint8_t>(rng()));
        } else if (r == 2) {
          // Ordinary values in range, so that sums stay finite.
          const float f = static_cast<float>(std::uniform_real_distribution<double>(-8, 8)(rng));
          Put(p, i, e4m3 ? FloatToF8E4M3FN(f) : FloatToF8E5M2(f));
        } else {
          const float f = static_cast<float>(RandomFloatValue(
              rng, e4m3 ? 400.0 : 50000.0, e4m3 ? 0x1p-6 : 0x1p-14, e4m3 ? 0x1p-8 : 0x1p-15));
          Put(p, i, e4m3 ? FloatToF8E4M3FN(f) : FloatToF8E5M2(f));
        }
        break;
      }
      case DType::kI8:
        Put(p, i, RandomInt<int8_t>(rng));
        break;
      case DType::kU8:
        Put(p, i, RandomInt<uint8_t>(rng));
        break;
      case DType::kI32:
        Put(p, i, RandomInt<int32_t>(rng));
        break;
      case DType::kU32:
        Put(p, i, RandomInt<uint32_t>(rng));
        break;
      case DType::kI64:
        Put(p, i, RandomInt<int64_t>(rng));
        break;
      case DType::kU64:
        Put(p, i, RandomInt<uint64_t>(rng));
        break;
      case DType::kBool: {
        // Any nonzero byte is true.
        const uint8_t choices[] = {0, 0, 0, 1, 1, 2, 0x80, 0xff};
        Put(p, i, choices[rng() % std::size(choices)]);
        break;
      }
      case DType::kInvalid:
        break;
    }
  }
}

// ---------------------------------------------------------------------------
// Every (kind, dtype) against the reference: n = 1, 2, 3, 8 inputs, several
// counts, out of place and in place.

class ReduceAllTest
    : public ::testing::TestWithParam<std::tuple<ReduceKind, DType>> {};

TEST_P(ReduceAllTest, MatchesReference) {
  const auto [kind, dt] = GetParam();
  const DType out_dt = ReduceResultDType(kind, dt);
  const size_t in_size = DTypeSize(dt);
  const size_t out_size = DTypeSize(out_dt);
  std::mt19937_64 rng(static_cast<uint64_t>(dt) * 131 +
                      static_cast<uint64_t>(kind));
  for (int n : {1, 2, 3, 8}) {
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
      SCOPED_TRACE("n=" + std::to_string(n) +
                   " count=" + std::to_string(count));
      std::vector<Buffer> inputs;
      std::vector<const void*> ptrs;
      for (int k = 0; k < n; ++k) {
        inputs.emplace_back(in_size, count, /*misalign=*/k % 2 == 1);
        FillRandom(dt, inputs.back().data(), count, rng);
      }
      for (auto& b : inputs) ptrs.push_back(b.data());
      const std::vector<uint8_t> want = ReferenceReduce(kind, dt, ptrs, count);
      ASSERT_EQ(want.size(), count * out_size);

      // Out of place; the inputs stay untouched.
      std::vector<std::vector<uint8_t>> before;
      for (auto& b : inputs) before.emplace_back(b.data(), b.data() + b.size());
      Buffer out(out_size, count, /*misalign=*/false);
      Reduce(kind, dt, ptrs.data(), n, out.data(), count);
      ExpectSameOutput(out_dt, out.data(), want, count);
      EXPECT_TRUE(out.GuardsIntact());
      for (int k = 0; k < n; ++k) {
        EXPECT_TRUE(
            std::equal(before[k].begin(), before[k].end(), inputs[k].data()))
            << "input " << k << " modified";
        EXPECT_TRUE(inputs[k].GuardsIntact());
      }

      // In place, into the first and into the last input. Where the result
      // elements are wider (bool sum, integer mean), that input's buffer is
      // made big enough to hold the result.
      for (int target : {0, n - 1}) {
        SCOPED_TRACE("in place into input " + std::to_string(target));
        std::vector<Buffer> copies;
        std::vector<const void*> copy_ptrs;
        for (int k = 0; k < n; ++k) {
          const size_t elem_size = k == target ? out_size : in_size;
          copies.emplace_back(elem_size, count, k % 2 == 1);
          if (count > 0) {
            std::memcpy(copies.back().data(), before[k].data(),
                        count * in_size);
          }
        }
        for (auto& b : copies) copy_ptrs.push_back(b.data());
        Reduce(kind, dt, copy_ptrs.data(), n, copies[target].data(), count);
        ExpectSameOutput(out_dt, copies[target].data(), want, count);
        EXPECT_TRUE(copies[target].GuardsIntact());
      }
    }
  }
}

// Inside a ReductionModeScope ReduceTo leaves the mode to the scope, which
// must then be the kernels' own: every kind and dtype against the reference
// on a thread in another mode (rounding toward zero, gradual underflow, a
// status flag raised), whose mode comes back after each scope.
TEST_P(ReduceAllTest, MatchesReferenceInAModeScopeOnAThreadInAnotherMode) {
  const auto [kind, dt] = GetParam();
  const DType out_dt = ReduceResultDType(kind, dt);
  std::mt19937_64 rng(static_cast<uint64_t>(dt) * 977 + static_cast<uint64_t>(kind));
  struct Case {
    int n;
    size_t count;
    std::vector<Buffer> inputs;
    std::vector<const void*> ptrs;
    std::vector<uint8_t> want;  // computed here, in this thread's default mode
  };
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 8}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
      Case& c = cases.emplace_back(Case{n, count, {}, {}, {}});
      for (int k = 0; k < n; ++k) {
        c.inputs.emplace_back(DTypeSize(dt), count, /*misalign=*/false);
        FillRandom(dt, c.inputs.back().data(), count, rng);
      }
      for (auto& b : c.inputs) c.ptrs.push_back(b.data());
      c.want = ReferenceReduce(kind, dt, c.ptrs, count);
    }
  }
  std::thread t([&] {
#if defined(__SSE__)
    const unsigned int mode = 0x7f80u | 0x20u;  // toward zero, inexact raised
    _mm_setcsr(mode);
#else
    std::fesetround(FE_TOWARDZERO);
#endif
    for (Case& c : cases) {
      SCOPED_TRACE("n=" + std::to_string(c.n) + " count=" + std::to_string(c.count));
      Buffer out(DTypeSize(out_dt), c.count, /*misalign=*/false);
      {
        const ReductionModeScope scope;
        Reduce(kind, dt, c.ptrs.data(), c.n, out.data(), c.count);
      }
      ExpectSameOutput(out_dt, out.data(), c.want, c.count);
#if defined(__SSE__)
      EXPECT_EQ(_mm_getcsr(), mode);
#else
      EXPECT_EQ(std::fegetround(), FE_TOWARDZERO);
#endif
    }
  });
  t.join();
}

INSTANTIATE_TEST_SUITE_P(
    AllKindsAllDTypes, ReduceAllTest,
    ::testing::Combine(::testing::ValuesIn(kAllKinds),
                       ::testing::ValuesIn(kAllDTypes)),
    [](const ::testing::TestParamInfo<ReduceAllTest::ParamType>& info) {
      return KindName(std::get<0>(info.param)) +
             std::string(DTypeShortName(std::get<1>(info.param)));
    });

// The kernels carry their own (vectorizable) float16/bfloat16 conversions.
// Run every 16-bit value through them: n = 1 (decode and encode), and with
// zeros or random partners so that the sums and the mean feed the encoder
// values that need rounding (ties among the subnormals included: an odd
// subnormal times 1/2).
TEST(ReduceTest, WidenedConversionsCoverEveryValue) {
  constexpr size_t kCount = 1 << 16;
  std::vector<uint16_t> all(kCount), zeros(kCount, 0), random(kCount);
  std::mt19937_64 rng(99);
  for (size_t i = 0; i < kCount; ++i) {
    all[i] = static_cast<uint16_t>(i);
    random[i] = static_cast<uint16_t>(rng());
  }
  const std::vector<std::vector<const void*>> cases = {
      {all.data()},
      {all.data(), zeros.data()},
      {all.data(), zeros.data(), zeros.data()},
      {zeros.data(), all.data(), zeros.data(), zeros.data(), zeros.data(),
       zeros.data(), zeros.data()},
      {all.data(), random.data()},
      {random.data(), all.data(), random.data()},
  };
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (ReduceKind kind : kAllKinds) {
      for (const auto& in : cases) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + " " + KindName(kind) +
                     " n=" + std::to_string(in.size()));
        std::vector<uint16_t> out(kCount);
        Reduce(kind, dt, in.data(), static_cast<int>(in.size()), out.data(),
               kCount);
        const std::vector<uint8_t> want = ReferenceReduce(kind, dt, in, kCount);
        ExpectSameOutput(dt, reinterpret_cast<const uint8_t*>(out.data()), want,
                         kCount);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// float8.

// The kernels' branch-free float8 conversions (reduce_ops.h) against the
// readable ones of dtype.cc (which dtype_test checks against ml_dtypes):
// every code, and every float32 bit pattern on a dense stride plus every
// pattern near the float8 rounding boundaries.
TEST(ReduceTest, Float8CodecsMatchDTypeConversions) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint8_t code = static_cast<uint8_t>(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(reduce_ops::DecodeF8E4M3FN(code)),
              std::bit_cast<uint32_t>(F8E4M3FNToFloat(code)))
        << std::hex << b;
    ASSERT_EQ(std::bit_cast<uint32_t>(reduce_ops::DecodeF8E5M2(code)),
              std::bit_cast<uint32_t>(F8E5M2ToFloat(code)))
        << std::hex << b;
  }
  std::vector<uint32_t> probe;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) probe.push_back(static_cast<uint32_t>(u));
  for (uint32_t b = 0; b < 256; ++b) {
    // Every float8 value and the float32 patterns around it and around the
    // midpoints to its neighbours.
    for (float v : {F8E4M3FNToFloat(static_cast<uint8_t>(b)), F8E5M2ToFloat(static_cast<uint8_t>(b))}) {
      if (std::isnan(v)) continue;
      const uint32_t u = std::bit_cast<uint32_t>(v);
      for (uint32_t mid_bit : {0u, 1u << 19, 1u << 20}) {
        for (int d = -3; d <= 3; ++d) probe.push_back(u + mid_bit + static_cast<uint32_t>(d));
      }
    }
  }
  for (uint32_t u : probe) {
    const float f = std::bit_cast<float>(u);
    ASSERT_EQ(reduce_ops::EncodeF8E4M3FN(f), FloatToF8E4M3FN(f)) << std::hex << u;
    ASSERT_EQ(reduce_ops::EncodeF8E5M2(f), FloatToF8E5M2(f)) << std::hex << u;
    ASSERT_EQ(reduce_ops::EncodeF8E5M2FromHalf(f), std::isnan(f) ? 0x7f : FloatToF8E5M2(f))
        << std::hex << u;
  }
}

// Every pair (and some triples) of float8 values through every kind, against
// the reference.
TEST(ReduceTest, Float8EveryPairOfValues) {
  constexpr size_t kCount = 1 << 16;
  std::vector<uint8_t> a(kCount), b(kCount), c(kCount);
  std::mt19937_64 rng(8);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<uint8_t>(i & 0xff);
    b[i] = static_cast<uint8_t>(i >> 8);
    c[i] = static_cast<uint8_t>(rng());
  }
  const std::vector<std::vector<const void*>> cases = {
      {a.data()}, {a.data(), b.data()}, {a.data(), b.data(), c.data()},
      {c.data(), a.data(), b.data(), c.data(), a.data()}};
  for (DType dt : {DType::kF8E4M3FN, DType::kF8E5M2}) {
    for (ReduceKind kind : kAllKinds) {
      for (const auto& in : cases) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + " " + KindName(kind) +
                     " n=" + std::to_string(in.size()));
        std::vector<uint8_t> out(kCount);
        Reduce(kind, dt, in.data(), static_cast<int>(in.size()), out.data(), kCount);
        ExpectSameOutput(dt, out.data(), ReferenceReduce(kind, dt, in, kCount), kCount);
      }
    }
  }
}

std::vector<uint8_t> ReduceBytes(ReduceKind kind, DType dt,
                                 const std::vector<std::vector<uint8_t>>& in) {
  return ReduceTyped<uint8_t, uint8_t>(kind, dt, in);
}

// The sum is rounded to float16 after every addition and to float8 once, at
// the end (XLA runs float8 collectives in float16): not to float8 per step.
TEST(ReduceTest, Float8SumRoundsToFloat16PerAdditionAndToFloat8Once) {
  const uint8_t one = 0x38, sixteenth = 0x18;  // e4m3fn 1.0, 0.0625
  // 1 + 1/16 + 1/16 = 1.125 (0x39); rounded to float8 per addition, 1 + 1/16
  // would tie to 1.0 and stay there.
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, {{one}, {sixteenth}, {sixteenth}}),
            std::vector<uint8_t>{0x39});
  // 448 + 448 - 448: 896 is a float16 value; the result is finite (448).
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, {{0x7e}, {0x7e}, {0xfe}}),
            std::vector<uint8_t>{0x7e});
  // 448 + 448 alone overflows float8_e4m3fn: NaN, not an infinity.
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, {{0x7e}, {0x7e}}),
            std::vector<uint8_t>{0x7f});
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, {{0xfe}, {0xfe}}),
            std::vector<uint8_t>{0xff});
  // float8_e5m2: 57344 * 2 overflows float16 already (inf stays inf).
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E5M2, {{0x7b}, {0x7b}, {0xfb}}),
            std::vector<uint8_t>{0x7c});
  // Subnormals are not flushed: 2^-9 + 2^-9 = 2^-8.
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, {{0x01}, {0x01}}),
            std::vector<uint8_t>{0x02});
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E5M2, {{0x01}, {0x81}, {0x01}}),
            std::vector<uint8_t>{0x01});
  // A sum of -0.0s is +0.0.
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E5M2, {{0x80}, {0x80}}),
            std::vector<uint8_t>{0x00});
}

// Values JAX 0.10.2 returned on CPU (lax.psum/pmean over 3 members).
TEST(ReduceTest, Float8MatchesJaxOnOrdinaryValues) {
  // Members (1, 2, 448, -3), (0.125, 3, 448, 5), (1, 0.0625, 1, -2).
  const std::vector<std::vector<uint8_t>> e4m3 = {
      {0x38, 0x40, 0x7e, 0xc4}, {0x20, 0x44, 0x7e, 0x4a}, {0x38, 0x18, 0x38, 0xc0}};
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, e4m3),
            (std::vector<uint8_t>{64, 74, 127, 0}));
  EXPECT_EQ(ReduceBytes(ReduceKind::kMean, DType::kF8E4M3FN, e4m3),
            (std::vector<uint8_t>{51, 61, 127, 0}));
  EXPECT_EQ(ReduceBytes(ReduceKind::kMax, DType::kF8E4M3FN, e4m3),
            (std::vector<uint8_t>{56, 68, 126, 74}));
  EXPECT_EQ(ReduceBytes(ReduceKind::kMin, DType::kF8E4M3FN, e4m3),
            (std::vector<uint8_t>{32, 24, 56, 196}));
  const std::vector<std::vector<uint8_t>> e5m2 = {
      {0x3c, 0x40, 0x5f, 0xc2}, {0x30, 0x42, 0x5f, 0x45}, {0x3c, 0x2c, 0x3c, 0xc0}};
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E5M2, e5m2),
            (std::vector<uint8_t>{64, 69, 99, 0}));
  EXPECT_EQ(ReduceBytes(ReduceKind::kMean, DType::kF8E5M2, e5m2),
            (std::vector<uint8_t>{57, 63, 93, 0}));
  EXPECT_EQ(ReduceBytes(ReduceKind::kMax, DType::kF8E5M2, e5m2),
            (std::vector<uint8_t>{60, 66, 95, 69}));
  EXPECT_EQ(ReduceBytes(ReduceKind::kMin, DType::kF8E5M2, e5m2),
            (std::vector<uint8_t>{48, 44, 60, 194}));
}

TEST(ReduceTest, Float8NaNs) {
  // float8_e4m3fn: NaN results keep the sign of the first NaN (float16 rule).
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E4M3FN, {{0x38}, {0xff}, {0x7f}}),
            std::vector<uint8_t>{0xff});
  // float8_e5m2: every NaN result is 0x7f (XLA's float16 -> e5m2
  // conversion), whatever the sign or payload of the inputs.
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E5M2, {{0xfd}, {0x3c}}),
            std::vector<uint8_t>{0x7f});
  EXPECT_EQ(ReduceBytes(ReduceKind::kMean, DType::kF8E5M2, {{0x3c}, {0xfe}}),
            std::vector<uint8_t>{0x7f});
  // inf + -inf: NaN.
  EXPECT_EQ(ReduceBytes(ReduceKind::kSum, DType::kF8E5M2, {{0x7c}, {0xfc}}),
            std::vector<uint8_t>{0x7f});
  // max/min skip NaNs; all NaN gives the identity, -inf/+inf, which
  // float8_e4m3fn encodes as its NaN of that sign.
  EXPECT_EQ(ReduceBytes(ReduceKind::kMax, DType::kF8E4M3FN, {{0x7f}, {0x38}}),
            std::vector<uint8_t>{0x38});
  EXPECT_EQ(ReduceBytes(ReduceKind::kMax, DType::kF8E4M3FN, {{0x7f}, {0x7f}}),
            std::vector<uint8_t>{0xff});
  EXPECT_EQ(ReduceBytes(ReduceKind::kMin, DType::kF8E4M3FN, {{0xff}}),
            std::vector<uint8_t>{0x7f});
  EXPECT_EQ(ReduceBytes(ReduceKind::kMax, DType::kF8E5M2, {{0x7d}, {0xfe}}),
            std::vector<uint8_t>{0xfc});
}

TEST(ReduceMeshOfOneTest, Float8E4M3FNKeepsEveryBitE5M2NaNsBecome0x7f) {
  std::vector<uint8_t> all(256);
  for (size_t i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  for (ReduceKind kind : kAllKinds) {
    std::vector<uint8_t> out(256);
    ReduceMeshOfOne(kind, DType::kF8E4M3FN, all.data(), out.data(), all.size());
    EXPECT_EQ(out, all);
    ReduceMeshOfOne(kind, DType::kF8E5M2, all.data(), out.data(), all.size());
    for (size_t i = 0; i < 256; ++i) {
      const bool nan = (i & 0x7f) > 0x7c;
      EXPECT_EQ(out[i], nan ? 0x7f : i) << std::hex << i;
    }
  }
}

// ---------------------------------------------------------------------------
// Result dtypes.

TEST(ReduceResultDTypeTest, SumMaxMinKeepDTypeExceptBoolSum) {
  for (DType dt : kAllDTypes) {
    EXPECT_EQ(ReduceResultDType(ReduceKind::kMax, dt), dt);
    EXPECT_EQ(ReduceResultDType(ReduceKind::kMin, dt), dt);
    if (dt != DType::kBool) {
      EXPECT_EQ(ReduceResultDType(ReduceKind::kSum, dt), dt);
    }
  }
  EXPECT_EQ(ReduceResultDType(ReduceKind::kSum, DType::kBool), DType::kI32);
}

TEST(ReduceResultDTypeTest, Mean) {
  const auto mean = [](DType dt) {
    return ReduceResultDType(ReduceKind::kMean, dt);
  };
  EXPECT_EQ(mean(DType::kF32), DType::kF32);
  EXPECT_EQ(mean(DType::kF64), DType::kF64);
  EXPECT_EQ(mean(DType::kF16), DType::kF16);
  EXPECT_EQ(mean(DType::kBF16), DType::kBF16);
  EXPECT_EQ(mean(DType::kF8E4M3FN), DType::kF8E4M3FN);
  EXPECT_EQ(mean(DType::kF8E5M2), DType::kF8E5M2);
  EXPECT_EQ(mean(DType::kBool), DType::kF32);
  EXPECT_EQ(mean(DType::kI8), DType::kF32);
  EXPECT_EQ(mean(DType::kU8), DType::kF32);
  EXPECT_EQ(mean(DType::kI32), DType::kF32);
  EXPECT_EQ(mean(DType::kU32), DType::kF32);
  EXPECT_EQ(mean(DType::kI64), DType::kF64);
  EXPECT_EQ(mean(DType::kU64), DType::kF64);
}

// ---------------------------------------------------------------------------
// Edge cases with hand-written expected values.

TEST(ReduceTest, InvalidDTypeTouchesNothing) {
  // Null everywhere: any access would crash.
  Reduce(ReduceKind::kSum, DType::kInvalid, nullptr, 3, nullptr, 100);
  const void* ptrs[2] = {nullptr, nullptr};
  for (ReduceKind kind : kAllKinds) {
    Reduce(kind, DType::kInvalid, ptrs, 2, nullptr, 100);
  }
}

TEST(ReduceTest, ZeroCountTouchesNothing) {
  for (DType dt : kAllDTypes) {
    for (ReduceKind kind : kAllKinds) {
      Reduce(kind, dt, nullptr, 2, nullptr, 0);
    }
  }
}

// The bits of a float-dtype value (for exact comparisons: sign of zero,
// which infinity).
uint64_t Bits(DType dt, double v) {
  const std::vector<uint8_t> b = EncodeFloats(dt, {v});
  uint64_t u = 0;
  std::memcpy(&u, b.data(), b.size());
  return u;
}

// Reduces float-dtype inputs given as doubles; returns the output bits.
std::vector<uint64_t> ReduceFloatBits(
    ReduceKind kind, DType dt, const std::vector<std::vector<double>>& in) {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<const void*> ptrs;
  for (const auto& v : in) bufs.push_back(EncodeFloats(dt, v));
  for (const auto& b : bufs) ptrs.push_back(b.data());
  const size_t count = in[0].size();
  const size_t size = DTypeSize(dt);
  std::vector<uint8_t> out(count * size);
  Reduce(kind, dt, ptrs.data(), static_cast<int>(ptrs.size()), out.data(),
         count);
  std::vector<uint64_t> bits(count);
  for (size_t i = 0; i < count; ++i) {
    std::memcpy(&bits[i], out.data() + i * size, size);
  }
  return bits;
}

std::vector<uint64_t> ExpectedBits(DType dt, const std::vector<double>& v) {
  std::vector<uint64_t> bits;
  for (double x : v) bits.push_back(Bits(dt, x));
  return bits;
}

TEST(ReduceTest, FloatSumAndMeanPropagateNaN) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    // The NaN is in a different input for each element, and meets finite
    // values, infinities, zeros and another NaN.
    const std::vector<std::vector<double>> in = {
        {kNaN, 1, 1, kNaN, kInf, -kInf, 0.0, -kNaN},
        {1, kNaN, 1, kNaN, kNaN, 5, -0.0, 2},
        {1, 1, kNaN, 1, -kInf, kNaN, kNaN, kInf},
    };
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
      SCOPED_TRACE(KindName(kind));
      const std::vector<double> out = ReduceFloats(kind, dt, in);
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_TRUE(std::isnan(out[i])) << "element " << i << ": " << out[i];
      }
    }
    // A lone NaN keeps its sign through the additions (x86 addition returns
    // the NaN operand, quieted).
    const std::vector<double> neg =
        ReduceFloats(ReduceKind::kSum, dt, {{1.0}, {-kNaN}, {2.0}});
    EXPECT_TRUE(std::isnan(neg[0]));
    EXPECT_TRUE(std::signbit(neg[0]));
  }
}

TEST(ReduceTest, FloatMaxMinSkipNaN) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    // Same inputs as above: max/min take a member only when it compares
    // greater/less than the accumulator (from -inf/+inf), so NaN never wins.
    const std::vector<std::vector<double>> in = {
        {kNaN, 1, 1, kNaN, kInf, -kInf, 0.0, -kNaN},
        {1, kNaN, 1, kNaN, kNaN, 5, -0.0, 2},
        {1, 1, kNaN, 1, -kInf, kNaN, kNaN, kInf},
    };
    // Element 6: +0 then -0 (then NaN): the earlier zero stays, for both.
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMax, dt, in),
              ExpectedBits(dt, {1, 1, 1, 1, kInf, 5, 0.0, kInf}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMin, dt, in),
              ExpectedBits(dt, {1, 1, 1, 1, -kInf, -kInf, 0.0, 2}));
    // All NaN: nothing beats the identity, so max is -inf and min +inf. NaNs
    // with an infinity first or last; a single member.
    const std::vector<std::vector<double>> nans = {
        {kNaN, -kNaN, kNaN, kInf, kNaN},
        {kNaN, kNaN, kNaN, kNaN, -kNaN},
        {-kNaN, kNaN, -kInf, kNaN, -kInf},
    };
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMax, dt, nans),
              ExpectedBits(dt, {-kInf, -kInf, -kInf, kInf, -kInf}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMin, dt, nans),
              ExpectedBits(dt, {kInf, kInf, -kInf, kInf, -kInf}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMax, dt, {{kNaN, -kNaN, 3}}),
              ExpectedBits(dt, {-kInf, -kInf, 3}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMin, dt, {{kNaN, -kNaN, 3}}),
              ExpectedBits(dt, {kInf, kInf, 3}));
  }
  // The exact identity bits for the 16-bit formats.
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kMax, DType::kF16,
                                             {{0x7e00}, {0xfe01}})),
            (std::vector<uint16_t>{0xfc00}));
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kMin, DType::kBF16,
                                             {{0x7fc0}, {0xffc1}})),
            (std::vector<uint16_t>{0x7f80}));
}

TEST(ReduceTest, SignedZeros) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    const double p = 0.0, m = -0.0;
    const std::vector<std::vector<double>> in = {
        {m, p, m, p},
        {p, m, m, p},
    };
    // max/min: -0 == +0, so the earlier member's zero stays.
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMax, dt, in),
              ExpectedBits(dt, {m, p, m, p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMin, dt, in),
              ExpectedBits(dt, {m, p, m, p}));
    // The sum starts from +0: +0 + -0 = +0, so even all -0 gives +0.
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kSum, dt, in),
              ExpectedBits(dt, {p, p, p, p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMean, dt, in),
              ExpectedBits(dt, {p, p, p, p}));
    // Three inputs and one input.
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMax, dt, {{m, p}, {p, m}, {m, p}}),
              ExpectedBits(dt, {m, p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMin, dt, {{p, m}, {m, p}, {p, m}}),
              ExpectedBits(dt, {p, m}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kSum, dt, {{m}, {m}, {m}}),
              ExpectedBits(dt, {p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kSum, dt, {{m, p}}),
              ExpectedBits(dt, {p, p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMean, dt, {{m}}),
              ExpectedBits(dt, {p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMax, dt, {{m, p}}),
              ExpectedBits(dt, {m, p}));
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kMin, dt, {{m, p}}),
              ExpectedBits(dt, {m, p}));
    // A -0 sum with other values: -1 + 1 = +0 either way, -0 + -0 = +0 only
    // because of the +0 start.
    EXPECT_EQ(ReduceFloatBits(ReduceKind::kSum, dt, {{-1.0, m}, {1.0, m}}),
              ExpectedBits(dt, {p, p}));
  }
}

TEST(ReduceTest, Infinities) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    const std::vector<std::vector<double>> in = {
        {kInf, -kInf, kInf, 1, -kInf},
        {-kInf, -kInf, 1, -kInf, 3},
    };
    const std::vector<double> sum = ReduceFloats(ReduceKind::kSum, dt, in);
    EXPECT_TRUE(std::isnan(sum[0]));  // inf - inf
    EXPECT_EQ(sum[1], -kInf);
    EXPECT_EQ(sum[2], kInf);
    EXPECT_EQ(sum[3], -kInf);
    EXPECT_EQ(sum[4], -kInf);
    EXPECT_EQ(ReduceFloats(ReduceKind::kMax, dt, in),
              (std::vector<double>{kInf, -kInf, kInf, 1, 3}));
    EXPECT_EQ(ReduceFloats(ReduceKind::kMin, dt, in),
              (std::vector<double>{-kInf, -kInf, 1, -kInf, -kInf}));
    const std::vector<double> mean = ReduceFloats(ReduceKind::kMean, dt, in);
    EXPECT_TRUE(std::isnan(mean[0]));
    EXPECT_EQ(mean[2], kInf);
  }
}

TEST(ReduceTest, OrdinaryValues) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(DTypeName(dt)));
    const std::vector<std::vector<double>> in = {
        {1, -1, 3, 2}, {2, -3, 3, -8}, {-6, -2, 0.75, 3}};
    EXPECT_EQ(ReduceFloats(ReduceKind::kMax, dt, in),
              (std::vector<double>{2, -1, 3, 3}));
    EXPECT_EQ(ReduceFloats(ReduceKind::kMin, dt, in),
              (std::vector<double>{-6, -3, 0.75, -8}));
    EXPECT_EQ(ReduceFloats(ReduceKind::kSum, dt, in),
              (std::vector<double>{-3, -6, 6.75, -3}));
    EXPECT_EQ(ReduceFloats(ReduceKind::kMean, dt, in),
              (std::vector<double>{-1, -2, 2.25, -1}));
  }
}

TEST(ReduceTest, IntegerSumWraps) {
  EXPECT_EQ((ReduceTyped<int8_t, int8_t>(ReduceKind::kSum, DType::kI8,
                                         {{127, -128, 100}, {1, -1, 100}})),
            (std::vector<int8_t>{-128, 127, -56}));
  EXPECT_EQ((ReduceTyped<uint8_t, uint8_t>(ReduceKind::kSum, DType::kU8,
                                           {{255, 0, 200}, {1, 0, 100}})),
            (std::vector<uint8_t>{0, 0, 44}));
  constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
  constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
  EXPECT_EQ((ReduceTyped<int32_t, int32_t>(
                ReduceKind::kSum, DType::kI32,
                {{kI32Max, kI32Min, kI32Max}, {1, -1, kI32Max}, {0, 0, 2}})),
            (std::vector<int32_t>{kI32Min, kI32Max, 0}));
  EXPECT_EQ((ReduceTyped<uint32_t, uint32_t>(ReduceKind::kSum, DType::kU32,
                                             {{0xffffffffu}, {2u}})),
            (std::vector<uint32_t>{1u}));
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  EXPECT_EQ((ReduceTyped<int64_t, int64_t>(ReduceKind::kSum, DType::kI64,
                                           {{kI64Max, kI64Min}, {1, -1}})),
            (std::vector<int64_t>{kI64Min, kI64Max}));
  constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ((ReduceTyped<uint64_t, uint64_t>(
                ReduceKind::kSum, DType::kU64,
                {{kU64Max, kU64Max}, {2, kU64Max}, {0, kU64Max}})),
            (std::vector<uint64_t>{1, kU64Max - 2}));
}

TEST(ReduceTest, IntegerMaxMinAreSigned) {
  EXPECT_EQ((ReduceTyped<int8_t, int8_t>(ReduceKind::kMax, DType::kI8,
                                         {{-128, -1, 5}, {127, -2, -5}})),
            (std::vector<int8_t>{127, -1, 5}));
  EXPECT_EQ((ReduceTyped<uint8_t, uint8_t>(ReduceKind::kMin, DType::kU8,
                                           {{255, 0, 128}, {1, 200, 127}})),
            (std::vector<uint8_t>{1, 0, 127}));
  EXPECT_EQ((ReduceTyped<int64_t, int64_t>(
                ReduceKind::kMin, DType::kI64,
                {{std::numeric_limits<int64_t>::min(), 3}, {0, -3}})),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -3}));
  EXPECT_EQ((ReduceTyped<uint64_t, uint64_t>(
                ReduceKind::kMax, DType::kU64,
                {{std::numeric_limits<uint64_t>::max(), 3}, {0, 4}})),
            (std::vector<uint64_t>{std::numeric_limits<uint64_t>::max(), 4}));
}

TEST(ReduceTest, HalfSumRoundsAfterEveryAddition) {
  // 1 + 2^-11 + 2^-11: rounding after each add gives 1 + 2^-11 -> 1 (a tie,
  // to even) twice; one rounding of the float32 sum would give 1 + 2^-10.
  const uint16_t one = 0x3c00, tiny = 0x1000;  // 1.0, 2^-11
  ASSERT_EQ(HalfToFloat(tiny), 0x1p-11f);
  ASSERT_EQ(FloatToHalf(HalfToFloat(one) + 2 * HalfToFloat(tiny)), 0x3c01);
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kSum, DType::kF16,
                                             {{one}, {tiny}, {tiny}})),
            (std::vector<uint16_t>{0x3c00}));
  // The order matters: the two tiny ones first add up exactly (2^-10), and
  // 1 + 2^-10 is a float16.
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kSum, DType::kF16,
                                             {{tiny}, {tiny}, {one}})),
            (std::vector<uint16_t>{0x3c01}));
  // An intermediate sum past the float16 range overflows to inf, and stays
  // there (65504 + 65504 - 65504: float32 accumulation would give 65504).
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kSum, DType::kF16,
                                             {{0x7bff}, {0x7bff}, {0xfbff}})),
            (std::vector<uint16_t>{0x7c00}));
}

TEST(ReduceTest, BF16SumRoundsOnce) {
  // Same with bfloat16: 1 + 2^-8 + 2^-8.
  const uint16_t one = 0x3f80, tiny = 0x3b80;  // 1.0, 2^-8
  ASSERT_EQ(BF16ToFloat(tiny), 0x1p-8f);
  const uint16_t stepwise = FloatToBF16(
      BF16ToFloat(FloatToBF16(BF16ToFloat(one) + BF16ToFloat(tiny))) +
      BF16ToFloat(tiny));
  ASSERT_EQ(stepwise, 0x3f80);
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kSum, DType::kBF16,
                                             {{one}, {tiny}, {tiny}})),
            (std::vector<uint16_t>{0x3f81}));
}

TEST(ReduceTest, Float32SumIsLeftToRight) {
  // Element 0: (1e8 + -1e8) + 1 = 1, but 1e8 + (-1e8 + 1) = 0.
  // Element 1: (1 + 1e8) + -1e8 = 0, but 1 + (1e8 + -1e8) = 1.
  volatile float big = 1e8f;  // volatile: keep the compiler from folding
  const float a0 = big, b0 = -big, c0 = 1.0f;
  ASSERT_NE((a0 + b0) + c0, a0 + (b0 + c0));
  const std::vector<float> out =
      ReduceTyped<float, float>(ReduceKind::kSum, DType::kF32,
                                {{1e8f, 1.0f}, {-1e8f, 1e8f}, {1.0f, -1e8f}});
  EXPECT_EQ(out, (std::vector<float>{1.0f, 0.0f}));
  // Same for the mean: the sum is the left-to-right one, times f32(1/3).
  const std::vector<float> mean =
      ReduceTyped<float, float>(ReduceKind::kMean, DType::kF32,
                                {{1e8f, 1.0f}, {-1e8f, 1e8f}, {1.0f, -1e8f}});
  EXPECT_EQ(std::bit_cast<uint32_t>(mean[0]), 0x3eaaaaabu);  // f32(1/3)
  EXPECT_EQ(std::bit_cast<uint32_t>(mean[1]), 0u);
}

template <typename T>
uint64_t FloatBitsOf(T v) {
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<uint32_t>(v);
  } else {
    return std::bit_cast<uint64_t>(v);
  }
}

TEST(ReduceTest, MeanMultipliesByTheReciprocal) {
  // 218 / 3 = 72.666...; 218 * f32(1/3) rounds one ulp higher than the
  // correctly rounded quotient. XLA multiplies.
  volatile float three = 3.0f;  // volatile: keep the compiler from folding
  ASSERT_EQ(std::bit_cast<uint32_t>(218.0f / three), 0x42915555u);
  ASSERT_EQ(std::bit_cast<uint32_t>(218.0f * (1.0f / three)), 0x42915556u);
  // uint8 (float32 result): 100 + 100 + 18 = 218.
  const std::vector<float> u8 = ReduceTyped<float, uint8_t>(
      ReduceKind::kMean, DType::kU8, {{100, 7}, {100, 0}, {18, 0}});
  EXPECT_EQ(std::bit_cast<uint32_t>(u8[0]), 0x42915556u);
  EXPECT_EQ(std::bit_cast<uint32_t>(u8[1]), 0x40155556u);  // 7 * f32(1/3)
  ASSERT_NE(7.0f / three, 7.0f * (1.0f / three));
  // float32.
  const std::vector<float> f32 = ReduceTyped<float, float>(
      ReduceKind::kMean, DType::kF32, {{100.0f}, {100.0f}, {18.0f}});
  EXPECT_EQ(std::bit_cast<uint32_t>(f32[0]), 0x42915556u);
  // int8, int32, uint32, bool: float32 results the same way.
  EXPECT_EQ(std::bit_cast<uint32_t>(
                ReduceTyped<float, int8_t>(ReduceKind::kMean, DType::kI8,
                                           {{3}, {2}, {2}})[0]),
            0x40155556u);  // 7 * f32(1/3)
  EXPECT_EQ(std::bit_cast<uint32_t>(
                ReduceTyped<float, int32_t>(ReduceKind::kMean, DType::kI32,
                                            {{-100}, {-100}, {-18}})[0]),
            0xc2915556u);
  EXPECT_EQ(std::bit_cast<uint32_t>(
                ReduceTyped<float, uint32_t>(ReduceKind::kMean, DType::kU32,
                                             {{200u}, {0u}, {18u}})[0]),
            0x42915556u);
  // float64, int64, uint64: the reciprocal 1.0 / 3 in double; 5 / 3 and
  // 5 * (1.0 / 3) differ in the last bit.
  volatile double three_d = 3.0;
  const double five_thirds = 5.0 * (1.0 / three_d);
  ASSERT_NE(5.0 / three_d, five_thirds);
  EXPECT_EQ(FloatBitsOf(ReduceTyped<double, double>(ReduceKind::kMean,
                                                    DType::kF64,
                                                    {{2.0}, {1.0}, {2.0}})[0]),
            FloatBitsOf(five_thirds));
  EXPECT_EQ(FloatBitsOf(ReduceTyped<double, int64_t>(
                ReduceKind::kMean, DType::kI64, {{2}, {1}, {2}})[0]),
            FloatBitsOf(five_thirds));
  EXPECT_EQ(FloatBitsOf(ReduceTyped<double, uint64_t>(
                ReduceKind::kMean, DType::kU64, {{2}, {1}, {2}})[0]),
            FloatBitsOf(five_thirds));
  EXPECT_EQ(FloatBitsOf(five_thirds), 0x3ffaaaaaaaaaaaaaull);  // not ...ab
}

TEST(ReduceTest, MeanOfIntegersWrapsBeforeScaling) {
  constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
  // int32 max + 1 wraps to int32 min before the scaling.
  EXPECT_EQ((ReduceTyped<float, int32_t>(ReduceKind::kMean, DType::kI32,
                                         {{kI32Max, 1, 1}, {1, 1, 2}})),
            (std::vector<float>{-1073741824.0f, 1.0f, 1.5f}));
  // 4 * f32(1/3) = 1.3333334f, which here is also 4.0f / 3.0f.
  EXPECT_EQ((ReduceTyped<float, int32_t>(ReduceKind::kMean, DType::kI32,
                                         {{1}, {1}, {2}})),
            (std::vector<float>{4.0f * (1.0f / 3.0f)}));
  // int8 mean is float32: 100 + 100 wraps to -56.
  EXPECT_EQ((ReduceTyped<float, int8_t>(ReduceKind::kMean, DType::kI8,
                                        {{100, -7, 3}, {100, 0, 4}})),
            (std::vector<float>{-28.0f, -3.5f, 3.5f}));
  EXPECT_EQ((ReduceTyped<float, uint8_t>(ReduceKind::kMean, DType::kU8,
                                         {{200, 255}, {100, 255}})),
            (std::vector<float>{22.0f, 127.0f}));  // 300 -> 44; 510 -> 254
  EXPECT_EQ((ReduceTyped<float, uint32_t>(ReduceKind::kMean, DType::kU32,
                                          {{0xffffffffu, 7u}, {3u, 0u}})),
            (std::vector<float>{1.0f, 3.5f}));
  // int64 mean is float64.
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ((ReduceTyped<double, int64_t>(ReduceKind::kMean, DType::kI64,
                                          {{kI64Max, -3}, {1, 0}})),
            (std::vector<double>{-0x1p62, -1.5}));
  // 2^53 + 1 is not a double: the conversion rounds (to even).
  EXPECT_EQ((ReduceTyped<double, int64_t>(ReduceKind::kMean, DType::kI64,
                                          {{(int64_t{1} << 53) + 1}})),
            (std::vector<double>{0x1p53}));
  EXPECT_EQ((ReduceTyped<double, uint64_t>(
                ReduceKind::kMean, DType::kU64,
                {{std::numeric_limits<uint64_t>::max(), 5}, {2, 0}})),
            (std::vector<double>{0.5, 2.5}));
}

TEST(ReduceTest, MeanOfHalfUsesTheHalfReciprocal) {
  // float16(1/3) = 0x3555 = 0.333251953125 (below 1/3).
  ASSERT_EQ(FloatToHalf(1.0f / 3.0f), 0x3555);
  const uint16_t one = 0x3c00;
  const uint16_t three_units = FloatToHalf(0x3p-12f);
  ASSERT_EQ(HalfToFloat(three_units), 0x3p-12f);
  // 1 + 3 * 2^-12 (+ 0) rounds to 1 + 2^-10 (0x3c01) in float16; times
  // f16(1/3) that is 1366.33 units of 2^-12, so 1366 (0x3556). The float32
  // reciprocal, or a division, would give 1366.67 -> 1367 (0x3557).
  const std::vector<uint16_t> out = ReduceTyped<uint16_t, uint16_t>(
      ReduceKind::kMean, DType::kF16, {{one}, {three_units}, {0}});
  EXPECT_EQ(out, (std::vector<uint16_t>{0x3556}));
  ASSERT_EQ(FloatToHalf(HalfToFloat(0x3c01) * (1.0f / 3.0f)), 0x3557);
  ASSERT_EQ(FloatToHalf(HalfToFloat(0x3c01) / 3.0f), 0x3557);
  // The mean's sum is the per-addition rounded one: 1 + 2^-11 + 2^-11 sums to
  // 1 (not 1 + 2^-10), and 1 * f16(1/3) is f16(1/3).
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kMean, DType::kF16,
                                             {{one}, {0x1000}, {0x1000}})),
            (std::vector<uint16_t>{0x3555}));
  // Past the float16 range the sum is inf, and so is the mean.
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kMean, DType::kF16,
                                             {{0x7bff}, {0x7bff}, {0xfbff}})),
            (std::vector<uint16_t>{0x7c00}));
}

TEST(ReduceTest, MeanOfBF16RoundsTheSumOnceThenScales) {
  // 1 + 17 * 2^-12 (+ 0) is exact in float32 and rounds once to 1 + 2^-7
  // (0x3f81) in bfloat16; times f32(1/3) that rounds to 0x3eac. Scaling the
  // unrounded float32 sum would give 0x3eab.
  const uint16_t one = 0x3f80;
  const uint16_t x = FloatToBF16(0x11p-12f);
  ASSERT_EQ(BF16ToFloat(x), 0x11p-12f);
  const float recip = 1.0f / 3.0f;
  ASSERT_EQ(FloatToBF16(1.0f + 0x11p-12f), 0x3f81);
  ASSERT_EQ(FloatToBF16(BF16ToFloat(0x3f81) * recip), 0x3eac);
  ASSERT_EQ(FloatToBF16((1.0f + 0x11p-12f) * recip), 0x3eab);
  EXPECT_EQ((ReduceTyped<uint16_t, uint16_t>(ReduceKind::kMean, DType::kBF16,
                                             {{one}, {x}, {0}})),
            (std::vector<uint16_t>{0x3eac}));
}

TEST(ReduceTest, Bool) {
  // Any nonzero byte is true.
  const std::vector<std::vector<uint8_t>> in = {
      {1, 0, 2, 0, 0xff},
      {1, 0, 0, 0, 0x80},
      {0xff, 0, 1, 1, 0x01},
  };
  EXPECT_EQ((ReduceTyped<int32_t, uint8_t>(ReduceKind::kSum, DType::kBool, in)),
            (std::vector<int32_t>{3, 0, 2, 1, 3}));
  EXPECT_EQ((ReduceTyped<uint8_t, uint8_t>(ReduceKind::kMax, DType::kBool, in)),
            (std::vector<uint8_t>{1, 0, 1, 1, 1}));
  EXPECT_EQ((ReduceTyped<uint8_t, uint8_t>(ReduceKind::kMin, DType::kBool, in)),
            (std::vector<uint8_t>{1, 0, 0, 0, 1}));
  // count * f32(1/3): 3 * f32(1/3) rounds to exactly 1.
  const float third = 1.0f / 3.0f;
  EXPECT_EQ((ReduceTyped<float, uint8_t>(ReduceKind::kMean, DType::kBool, in)),
            (std::vector<float>{1.0f, 0.0f, 2.0f * third, third, 1.0f}));
  // n = 1 normalizes to 0/1 too.
  EXPECT_EQ((ReduceTyped<uint8_t, uint8_t>(ReduceKind::kMax, DType::kBool,
                                           {{0, 7, 0x80}})),
            (std::vector<uint8_t>{0, 1, 1}));
}

// ---------------------------------------------------------------------------
// Subnormals and NaNs: the expected bits below are what jax.lax (0.10.2, XLA
// on x86-64 CPU) returns for the same inputs.

// Reduces columns given as raw bits: cols[e][k] is member k's element e (all
// columns have the same number of members). Each column is repeated over
// 2 * 64 + 5 elements, so it goes through the vector loops and the scalar
// rest; every copy must give the same bits. Returns one result per column.
template <typename U>
std::vector<U> ReduceColumns(ReduceKind kind, DType dt,
                             const std::vector<std::vector<U>>& cols) {
  EXPECT_EQ(DTypeSize(dt), sizeof(U));
  EXPECT_EQ(ReduceResultDType(kind, dt), dt);
  constexpr size_t kCopies = 2 * 64 + 5;
  const size_t n = cols[0].size();
  const size_t count = cols.size() * kCopies;
  std::vector<std::vector<U>> in(n, std::vector<U>(count));
  for (size_t e = 0; e < count; ++e) {
    for (size_t k = 0; k < n; ++k) in[k][e] = cols[e % cols.size()][k];
  }
  const std::vector<U> out = ReduceTyped<U, U>(kind, dt, in);
  std::vector<U> result(out.begin(), out.begin() + cols.size());
  for (size_t e = 0; e < count; ++e) {
    EXPECT_EQ(out[e], result[e % cols.size()])
        << "column " << e % cols.size() << " copy " << e / cols.size();
  }
  return result;
}

// The example of the issue: six members each holding the smallest subnormal
// sum to +0, not 6 * 2^-149.
TEST(ReduceTest, SubnormalInputsReadAsZero) {
  const std::vector<std::vector<uint32_t>> f32 = {
      {0x1, 0x1, 0x1, 0x1, 0x1, 0x1},
      {0x80000003, 0x80000003, 0x80000003, 0x80000003, 0x80000003, 0x80000003},
  };
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF32, f32),
            (std::vector<uint32_t>{0x0, 0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kF32, f32),
            (std::vector<uint32_t>{0x0, 0x0}));
  // max/min take the member's value as a zero of its sign.
  EXPECT_EQ(ReduceColumns(ReduceKind::kMax, DType::kF32, f32),
            (std::vector<uint32_t>{0x0, 0x80000000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMin, DType::kF32, f32),
            (std::vector<uint32_t>{0x0, 0x80000000}));
  const std::vector<std::vector<uint64_t>> f64 = {
      {0x1, 0x1, 0x1, 0x1, 0x1, 0x1},
      {0x8000000000000003, 0x8000000000000003, 0x8000000000000003,
       0x8000000000000003, 0x8000000000000003, 0x8000000000000003},
  };
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF64, f64),
            (std::vector<uint64_t>{0x0, 0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kF64, f64),
            (std::vector<uint64_t>{0x0, 0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMax, DType::kF64, f64),
            (std::vector<uint64_t>{0x0, 0x8000000000000000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMin, DType::kF64, f64),
            (std::vector<uint64_t>{0x0, 0x8000000000000000}));
  const std::vector<std::vector<uint16_t>> bf16 = {
      {0x1, 0x1, 0x1, 0x1, 0x1, 0x1},
      {0x8003, 0x8003, 0x8003, 0x8003, 0x8003, 0x8003},
  };
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kBF16, bf16),
            (std::vector<uint16_t>{0x0, 0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kBF16, bf16),
            (std::vector<uint16_t>{0x0, 0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMax, DType::kBF16, bf16),
            (std::vector<uint16_t>{0x0, 0x8000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMin, DType::kBF16, bf16),
            (std::vector<uint16_t>{0x0, 0x8000}));
  // float16 is computed in float32, where its subnormals are normal numbers:
  // nothing is flushed.
  const std::vector<std::vector<uint16_t>> f16 = {
      {0x1, 0x1, 0x1, 0x1, 0x1, 0x1},
      {0x8003, 0x8003, 0x8003, 0x8003, 0x8003, 0x8003},
  };
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF16, f16),
            (std::vector<uint16_t>{0x6, 0x8012}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kF16, f16),
            (std::vector<uint16_t>{0x1, 0x8003}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMax, DType::kF16, f16),
            (std::vector<uint16_t>{0x1, 0x8003}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMin, DType::kF16, f16),
            (std::vector<uint16_t>{0x1, 0x8003}));
}

TEST(ReduceTest, SubnormalsCompareAndSumAsZeros) {
  // Two members. mn: the smallest normal 2^-126.
  const std::vector<std::vector<uint32_t>> in = {
      {0x80000000, 0x1},         // -0, +sub: equal, the earlier -0 stays
      {0x1, 0x80000000},         // +sub, -0
      {0x1, 0x80000001},         // +sub, -sub
      {0x80000001, 0x1},         // -sub, +sub
      {0x00800000, 0x80c00000},  // mn + -1.5 mn = -2^-127: flushed to -0
      {0x80c00000, 0x00800000},
      {0x1, 0x80800000},         // +sub, -mn: the sum is -mn
      {0x1, 0x7fc00000},         // +sub, NaN
      {0x01000000, 0x80800000},  // 2 mn - mn = mn; the mean mn / 2 flushes
  };
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF32, in),
            (std::vector<uint32_t>{0x0, 0x0, 0x0, 0x0, 0x80000000, 0x80000000,
                                   0x80800000, 0x7fc00000, 0x00800000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kF32, in),
            (std::vector<uint32_t>{0x0, 0x0, 0x0, 0x0, 0x80000000, 0x80000000,
                                   0x80000000, 0x7fc00000, 0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMax, DType::kF32, in),
            (std::vector<uint32_t>{0x80000000, 0x0, 0x0, 0x80000000,
                                   0x00800000, 0x00800000, 0x0, 0x0,
                                   0x01000000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMin, DType::kF32, in),
            (std::vector<uint32_t>{0x80000000, 0x0, 0x0, 0x80000000,
                                   0x80c00000, 0x80c00000, 0x80800000, 0x0,
                                   0x80800000}));
  const std::vector<std::vector<uint64_t>> f64 = {
      {0x8000000000000001, 0x1},
      {0x0010000000000000, 0x8018000000000000},
  };
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF64, f64),
            (std::vector<uint64_t>{0x0, 0x8000000000000000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMax, DType::kF64, f64),
            (std::vector<uint64_t>{0x8000000000000000, 0x0010000000000000}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMin, DType::kF64, f64),
            (std::vector<uint64_t>{0x8000000000000000, 0x8018000000000000}));
  // bfloat16 accumulates in float32 and every float32 addition flushes:
  // mn - 1.5 mn gives -0, and + mn gives mn (not the once-flushed 0).
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kBF16,
                          std::vector<std::vector<uint16_t>>{
                              {0x0080, 0x80c0, 0x0080}}),
            (std::vector<uint16_t>{0x0080}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kBF16,
                          std::vector<std::vector<uint16_t>>{
                              {0x0080, 0x80c0, 0x0080}}),
            (std::vector<uint16_t>{0x0}));
  EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF32,
                          std::vector<std::vector<uint32_t>>{
                              {0x00800000, 0x80c00000, 0x00800000}}),
            (std::vector<uint32_t>{0x00800000}));
}

// pmean's product is flushed when it is below the smallest normal after
// rounding to the type's precision with an unbounded exponent (x86's
// flush-to-zero), not after rounding to a subnormal.
TEST(ReduceTest, MeanFlushesTinyProductsAfterRounding) {
  // 0x013fffff * f32(1/3) is just below 2^-126 - 2^-150: it rounds to
  // 2^-126 - 2^-150 (tiny: flushed). Rounded to a subnormal first it would
  // give 2^-126.
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kF32,
                          std::vector<std::vector<uint32_t>>{
                              {0x013fffff, 0x0, 0x0},
                              {0x813fffff, 0x0, 0x0}}),
            (std::vector<uint32_t>{0x0, 0x80000000}));
  // 0x01dfffff * f32(1/7) is within half an ulp below 2^-126: it rounds to
  // 2^-126, which is not tiny.
  EXPECT_EQ(ReduceColumns(ReduceKind::kMean, DType::kF32,
                          std::vector<std::vector<uint32_t>>{
                              {0x01dfffff, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0}}),
            (std::vector<uint32_t>{0x00800000}));
}

TEST(ReduceTest, SumNaNIsTheLastNaNMembers) {
  // qa, qb: quiet NaNs with different payloads and signs; sa: signaling.
  const uint32_t qa = 0x7fc00001, qb = 0xffc00002, sa = 0x7f800001;
  const uint32_t one = 0x3f800000, inf = 0x7f800000, ninf = 0xff800000;
  const std::vector<std::vector<uint32_t>> two = {
      {sa, one}, {one, sa}, {qa, qb}, {qb, qa}, {inf, ninf},
      {qa | 0x80000000u, qb}, {qb, qa | 0x80000000u}, {sa | 0x80000000u, one},
  };
  const std::vector<uint32_t> two_want = {0x7fc00001, 0x7fc00001, 0xffc00002,
                                          0x7fc00001, 0xffc00000, 0xffc00002,
                                          0xffc00001, 0xffc00001};
  const std::vector<std::vector<uint32_t>> three = {
      {qa, one, qb}, {qa, qb, one}, {one, qa, qb}, {inf, ninf, qa},
      {qa, inf, ninf},
  };
  const std::vector<uint32_t> three_want = {qb, qb, qb, qa, qa};
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
    SCOPED_TRACE(KindName(kind));
    EXPECT_EQ(ReduceColumns(kind, DType::kF32, two), two_want);
    EXPECT_EQ(ReduceColumns(kind, DType::kF32, three), three_want);
  }
  const uint64_t dqa = 0x7ff8000000000001, dqb = 0xfff8000000000002;
  const uint64_t dsa = 0x7ff0000000000001, done = 0x3ff0000000000000;
  const uint64_t dinf = 0x7ff0000000000000, dninf = 0xfff0000000000000;
  const std::vector<std::vector<uint64_t>> f64 = {
      {dsa, done}, {dqa, dqb}, {dqb, dqa}, {dinf, dninf},
  };
  const std::vector<std::vector<uint64_t>> f64_three = {{dqa, dinf, dqb},
                                                        {done, dninf, dqa}};
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
    SCOPED_TRACE(KindName(kind));
    EXPECT_EQ(ReduceColumns(kind, DType::kF64, f64),
              (std::vector<uint64_t>{0x7ff8000000000001, dqb, dqa,
                                     0xfff8000000000000}));
    EXPECT_EQ(ReduceColumns(kind, DType::kF64, f64_three),
              (std::vector<uint64_t>{dqb, dqa}));
  }
}

// float16 and bfloat16 NaN results are canonical: the sign and the quiet bit
// only. Which sign: float16 keeps the first NaN member's, bfloat16 (summed in
// float32) the last's.
TEST(ReduceTest, HalfAndBF16NaNResultsAreCanonical) {
  {
    const uint16_t qa = 0x7e01, qb = 0xfe02, sa = 0x7c01, one = 0x3c00;
    const uint16_t inf = 0x7c00, ninf = 0xfc00;
    const std::vector<std::vector<uint16_t>> two = {
        {sa, one}, {one, sa}, {qa, qb}, {qb, qa}, {inf, ninf},
        {0xfe01, qb}, {qb, 0xfe01}, {0xfc01, one},
    };
    const std::vector<std::vector<uint16_t>> three = {
        {qa, one, qb}, {qa, qb, one}, {one, qa, qb}, {inf, ninf, qa},
        {qa, inf, ninf},
    };
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
      SCOPED_TRACE(KindName(kind));
      EXPECT_EQ(ReduceColumns(kind, DType::kF16, two),
                (std::vector<uint16_t>{0x7e00, 0x7e00, 0x7e00, 0xfe00, 0xfe00,
                                       0xfe00, 0xfe00, 0xfe00}));
      EXPECT_EQ(ReduceColumns(kind, DType::kF16, three),
                (std::vector<uint16_t>{0x7e00, 0x7e00, 0x7e00, 0xfe00,
                                       0x7e00}));
    }
  }
  {
    const uint16_t qa = 0x7fc1, qb = 0xffc2, sa = 0x7f81, one = 0x3f80;
    const uint16_t inf = 0x7f80, ninf = 0xff80;
    const std::vector<std::vector<uint16_t>> two = {
        {sa, one}, {one, sa}, {qa, qb}, {qb, qa}, {inf, ninf},
        {0xffc1, qb}, {qb, 0xffc1}, {0xff81, one},
    };
    const std::vector<std::vector<uint16_t>> three = {
        {qa, one, qb}, {qa, qb, one}, {one, qa, qb}, {inf, ninf, qa},
        {qa, inf, ninf},
    };
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
      SCOPED_TRACE(KindName(kind));
      EXPECT_EQ(ReduceColumns(kind, DType::kBF16, two),
                (std::vector<uint16_t>{0x7fc0, 0x7fc0, 0xffc0, 0x7fc0, 0xffc0,
                                       0xffc0, 0xffc0, 0xffc0}));
      EXPECT_EQ(ReduceColumns(kind, DType::kBF16, three),
                (std::vector<uint16_t>{0xffc0, 0xffc0, 0xffc0, 0x7fc0,
                                       0x7fc0}));
    }
  }
}

// The flush-to-zero mode is the kernels' own: a fresh thread (default mode)
// gets it, and the caller's mode is as it was afterwards.
TEST(ReduceTest, FlushesOnAnyThreadAndLeavesTheCallersModeAlone) {
  std::vector<uint32_t> on_thread;
  std::thread t([&] {
    on_thread = ReduceColumns(ReduceKind::kSum, DType::kF32,
                              std::vector<std::vector<uint32_t>>{
                                  {0x1, 0x1, 0x1, 0x1, 0x1, 0x1}});
  });
  t.join();
  EXPECT_EQ(on_thread, (std::vector<uint32_t>{0x0}));
  // This thread still computes subnormals (volatile: no constant folding).
  volatile float min_normal = 0x1p-126f;
  volatile float half = 0.5f;
  ReduceColumns(ReduceKind::kMean, DType::kF32,
                std::vector<std::vector<uint32_t>>{{0x00800000, 0x0}});
  EXPECT_EQ(std::bit_cast<uint32_t>(min_normal * half), 0x00400000u);
#if defined(__SSE__)
  // A caller that flushes already keeps flushing.
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  ReduceColumns(ReduceKind::kSum, DType::kF32,
                std::vector<std::vector<uint32_t>>{{0x00800000, 0x0}});
  const unsigned int after = _mm_getcsr();
  const float flushed = min_normal * half;
  _mm_setcsr(saved);
  EXPECT_EQ(after, saved | 0x8040);
  EXPECT_EQ(std::bit_cast<uint32_t>(flushed), 0u);
#endif
}

#if defined(__SSE__)
// Scopes nest (the inner one's end leaves the outer one's mode), and the
// thread gets its own mode back without the status flags raised inside, also
// when its mode was the reductions' already.
TEST(ReductionModeScopeTest, NestsAndGivesTheThreadItsModeBack) {
  std::thread t([] {
    volatile float min_normal = 0x1p-126f;
    volatile float half = 0.5f;
    for (unsigned int mode : {0x1f80u, 0x9fc0u}) {
      SCOPED_TRACE(mode);
      _mm_setcsr(mode);
      {
        const ReductionModeScope outer;
        EXPECT_EQ(_mm_getcsr() & ~0x3fu, 0x9fc0u);
        { const ReductionModeScope inner; }
        EXPECT_EQ(_mm_getcsr() & ~0x3fu, 0x9fc0u);
        // Six of the smallest subnormals read as zeros; a tiny product
        // flushes (and raises underflow and inexact).
        EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF32,
                                std::vector<std::vector<uint32_t>>{{0x1, 0x1, 0x1, 0x1, 0x1, 0x1}}),
                  (std::vector<uint32_t>{0x0}));
        EXPECT_EQ(std::bit_cast<uint32_t>(min_normal * half), 0u);
      }
      EXPECT_EQ(_mm_getcsr(), mode);
    }
    // Outside every scope, gradual underflow again, and the kernels flush
    // by themselves again (the scope's mark on the thread is gone).
    _mm_setcsr(0x1f80u);
    EXPECT_EQ(std::bit_cast<uint32_t>(min_normal * half), 0x00400000u);
    EXPECT_EQ(ReduceColumns(ReduceKind::kSum, DType::kF32,
                            std::vector<std::vector<uint32_t>>{{0x1, 0x1, 0x1, 0x1, 0x1, 0x1}}),
              (std::vector<uint32_t>{0x0}));
  });
  t.join();
}
#endif

// A mesh of one member: what XLA's dropped all-reduce returns. Every 16-bit
// pattern, and random 32/64-bit patterns (NaN payloads, signaling NaNs,
// subnormals, -0.0 among them), out of place and in place.
TEST(ReduceMeshOfOneTest, FloatsKeepTheirBitsBF16NaNsBecomeCanonical) {
  std::mt19937_64 rng(5);
  for (DType dt : kFloatDTypes) {
    const size_t es = DTypeSize(dt);
    const size_t count = es == 2 ? size_t{1} << 16 : 4099;
    std::vector<uint8_t> in(count * es);
    for (size_t i = 0; i < count; ++i) {
      const uint64_t bits = es == 2 ? i : rng();
      std::memcpy(in.data() + i * es, &bits, es);
    }
    if (es == 4) {
      const uint32_t specials[] = {0x80000000, 0x7f800001, 0xffbfffff, 0x1, 0x807fffff};
      std::memcpy(in.data(), specials, sizeof(specials));
    }
    std::vector<uint8_t> want = in;
    if (dt == DType::kBF16) {
      for (size_t i = 0; i < count; ++i) {
        uint16_t b;
        std::memcpy(&b, in.data() + i * 2, 2);
        if (std::isnan(BF16ToFloat(b))) b = (b & 0x8000) | 0x7fc0;
        std::memcpy(want.data() + i * 2, &b, 2);
      }
    }
    for (ReduceKind kind : kAllKinds) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " " + KindName(kind));
      std::vector<uint8_t> out(in.size(), 0xa5);
      ReduceMeshOfOne(kind, dt, in.data(), out.data(), count);
      ExpectSameOutput(dt, out.data(), want, count);
      std::vector<uint8_t> in_place = in;
      ReduceMeshOfOne(kind, dt, in_place.data(), in_place.data(), count);
      ExpectSameOutput(dt, in_place.data(), want, count);
    }
  }
}

// Integers and bool: the input converted to the result dtype, which is what
// the one-member reduction computes (x + 0, x, x * 1).
TEST(ReduceMeshOfOneTest, IntegersAndBoolConvertTheDType) {
  std::mt19937_64 rng(6);
  for (DType dt : kAllDTypes) {
    if (IsFloat(dt)) continue;
    const size_t count = 1031;
    std::vector<uint8_t> in(count * DTypeSize(dt));
    FillRandom(dt, in.data(), count, rng);
    for (ReduceKind kind : kAllKinds) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " " + KindName(kind));
      const DType out_dt = ReduceResultDType(kind, dt);
      std::vector<uint8_t> out(count * DTypeSize(out_dt), 0xa5);
      ReduceMeshOfOne(kind, dt, in.data(), out.data(), count);
      const std::vector<uint8_t> want =
          ReferenceReduce(kind, dt, {in.data()}, count);
      ExpectSameOutput(out_dt, out.data(), want, count);
    }
  }
  // Spot checks of the conversions.
  const int32_t big = std::numeric_limits<int32_t>::max();
  float mean = 0;
  ReduceMeshOfOne(ReduceKind::kMean, DType::kI32, &big, &mean, 1);
  EXPECT_EQ(mean, 2147483648.0f);
  const uint8_t flags[3] = {0, 1, 0x80};
  int32_t counts[3] = {};
  ReduceMeshOfOne(ReduceKind::kSum, DType::kBool, flags, counts, 3);
  EXPECT_EQ(std::vector<int32_t>(counts, counts + 3), (std::vector<int32_t>{0, 1, 1}));
}

TEST(ReduceTest, LargeCountAcrossManyBlocks) {
  // Past several internal blocks, with a ragged end; values chosen so every
  // element is distinct and exactly representable.
  constexpr size_t kCount = 3 * 4096 + 37;
  std::vector<float> a(kCount), b(kCount), c(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 2.0f * static_cast<float>(i);
    c[i] = -0.5f;
  }
  const std::vector<float> out =
      ReduceTyped<float, float>(ReduceKind::kSum, DType::kF32, {a, b, c});
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(out[i], 3.0f * static_cast<float>(i) - 0.5f) << i;
  }
}

}  // namespace
}  // namespace collectived

namespace collectived {
namespace {

// ReduceTo (several outputs, cached or streaming stores, in place or not)
// gives every output exactly the bytes Reduce gives one, for every kind and
// dtype, on random bit patterns (NaNs, infinities and subnormals included).
TEST(ReduceToTest, EveryOutputMatchesReduceBitForBit) {
  std::mt19937 rng(7);
  const int n = 3;
  const size_t count = 2 * 1024 + 77;  // several blocks and a ragged tail
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kMean}) {
    for (DType dt : kAllDTypes) {
      const size_t in_es = DTypeSize(dt);
      const size_t out_es = DTypeSize(ReduceResultDType(kind, dt));
      std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * in_es));
      for (auto& v : in) {
        for (auto& b : v) b = static_cast<uint8_t>(rng());
      }
      std::vector<const void*> ins;
      for (auto& v : in) ins.push_back(v.data());
      std::vector<uint8_t> want(count * out_es);
      Reduce(kind, dt, ins.data(), n, want.data(), count);
      for (bool stream : {false, true}) {
        // Out of place: outputs one byte-aligned element past the start.
        std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>((count + 1) * out_es, 0xEE));
        std::vector<void*> outs;
        for (auto& v : out) outs.push_back(v.data() + out_es);
        ReduceTo(kind, dt, ins.data(), n, outs.data(), n, count, stream);
        for (int k = 0; k < n; ++k) {
          EXPECT_EQ(out[k][0], 0xEE);
          EXPECT_EQ(0, std::memcmp(out[k].data() + out_es, want.data(), want.size()))
              << "kind " << static_cast<int>(kind) << " dtype " << DTypeName(dt) << " output " << k
              << (stream ? " streaming" : " cached");
        }
        // In place (each output is its member's input), where the result
        // fits in the input's place.
        if (out_es != in_es) continue;
        auto copy = in;
        std::vector<const void*> cins;
        std::vector<void*> couts;
        for (auto& v : copy) {
          cins.push_back(v.data());
          couts.push_back(v.data());
        }
        ReduceTo(kind, dt, cins.data(), n, couts.data(), n, count, stream);
        for (int k = 0; k < n; ++k) {
          EXPECT_EQ(0, std::memcmp(copy[k].data(), want.data(), want.size()))
              << "in place: kind " << static_cast<int>(kind) << " dtype " << DTypeName(dt)
              << " member " << k << (stream ? " streaming" : " cached");
        }
      }
    }
  }
}

}  // namespace
}  // namespace collectived
