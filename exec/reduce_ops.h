// The element-wise arithmetic of the reductions, shared by the CPU kernels
// (reduce.cc) and the CUDA kernels (exec/cuda): one definition of every
// per-element rule of reduce.h (identity, accumulate step, NaN handling,
// flush-to-zero, float16/bfloat16/float8 rounding, the mean's reciprocal),
// compiled for the host and, under nvcc, for the device.
//
// The rules depend on the floating-point environment they run in, which is a
// template parameter (`Env`) of every float combiner and codec:
//  - HardwareEnv: the CPU inside FlushDenormalsScope (reduce.cc): the FPU
//    flushes subnormal operands and results (FTZ|DAZ) and applies x86's NaN
//    rules (an operation with one NaN operand gives it quieted, sign and
//    payload kept; with two, the first operand's; inf + -inf and 0 * inf give
//    the default NaN 0xffc00000 / 0xfff8000000000000, sign set). The
//    functions are plain `+` and `*`, so the compiler vectorizes them. (On
//    AArch64 the FPU's own NaN rules apply: its default NaN, for inf + -inf,
//    has the sign clear.)
//  - SoftwareEnv: any IEEE 754 binary32/binary64 arithmetic that rounds to
//    nearest even with gradual underflow, whatever its NaN results (a CUDA
//    GPU without -ftz and -fmad, which gives the canonical NaN 0x7fffffff for
//    every NaN result; the host FPU in its default mode). Everything the
//    hardware environment does beyond IEEE is done in software, giving the
//    same bits as HardwareEnv on x86:
//      - denormals-are-zero: every float operand is passed through
//        FlushSubnormal first;
//      - flush-to-zero of a sum: the rounded IEEE sum, if below the smallest
//        normal, becomes a zero of its sign. Exact: a sum of two normal
//        numbers (or zeros) that is below the smallest normal is exact, so
//        it is tiny before rounding iff after;
//      - flush-to-zero of a product (the mean's s * (1/n)): x86 flushes when
//        the product rounded to the type's precision with an UNBOUNDED
//        exponent is below the smallest normal. The IEEE product r (rounded
//        with gradual underflow) decides every case but one: |r| < min
//        normal flushes, |r| > min normal does not; |r| == min normal (a
//        product just below it may have rounded up in the coarser subnormal
//        grid) is decided by recomputing it with the smaller operand scaled
//        by 2^64 (2^128 for float64), exactly, in the normal range;
//      - NaNs: a NaN operand is returned quieted (sign and payload kept; the
//        first operand's when both are NaN, as x86's SSE), and a NaN result
//        from non-NaN operands (inf + -inf, 0 * inf) is x86's default NaN,
//        sign set (0xffc00000, 0xfff8000000000000).
//    (bfloat16/float16 conversions and max/min are integer operations and
//    compares, the same in both environments.)
// The CPU uses HardwareEnv where it can set the mode (x86, AArch64) and
// SoftwareEnv elsewhere; the CUDA kernels always use SoftwareEnv. Compile
// device code with IEEE float semantics: no --use_fast_math, --ftz=false,
// --prec-div=true, --fmad=false (a contracted a * b + c would round once).
//
// Pure functions; thread-safe.
#ifndef COLLECTIVED_EXEC_REDUCE_OPS_H_
#define COLLECTIVED_EXEC_REDUCE_OPS_H_

#include <cstdint>
#include <type_traits>

#if !defined(__CUDA_ARCH__)
#include <algorithm>
#include <cmath>
#include <limits>
#endif

#include "plan/op_plan.h"

#if defined(__CUDACC__)
#define COLLECTIVED_HD __host__ __device__
#else
#define COLLECTIVED_HD
#endif

namespace collectived {
namespace reduce_ops {

// ---------------------------------------------------------------------------
// Bits.

template <typename To, typename From>
COLLECTIVED_HD inline constexpr To BitCast(From x) {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, x);
}

// c ? a : b as bit masks. The half conversions compute a float value on one
// path only; written as a plain ?: GCC moves that float op into a branch and
// then (under the default -ftrapping-math) will not if-convert it back, which
// blocks vectorization. Masks leave no branch to move it into.
COLLECTIVED_HD inline uint32_t SelectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// Constants of float and double.
template <typename F>
struct FloatTraits;

template <>
struct FloatTraits<float> {
  using Bits = uint32_t;
  COLLECTIVED_HD static constexpr float MinNormal() { return 0x1p-126f; }
  COLLECTIVED_HD static constexpr float Inf() { return BitCast<float>(0x7f800000u); }
  // x86's default NaN (the "real indefinite"): sign set.
  COLLECTIVED_HD static constexpr float DefaultNaN() { return BitCast<float>(0xffc00000u); }
  static constexpr Bits kQuietBit = 0x00400000u;
  // Scales a product near MinNormal() into the normal range, exactly.
  COLLECTIVED_HD static constexpr float Scale() { return 0x1p64f; }
};

template <>
struct FloatTraits<double> {
  using Bits = uint64_t;
  COLLECTIVED_HD static constexpr double MinNormal() { return 0x1p-1022; }
  COLLECTIVED_HD static constexpr double Inf() {
    return BitCast<double>(uint64_t{0x7ff0000000000000u});
  }
  COLLECTIVED_HD static constexpr double DefaultNaN() {
    return BitCast<double>(uint64_t{0xfff8000000000000u});
  }
  static constexpr Bits kQuietBit = uint64_t{0x0008000000000000u};
  COLLECTIVED_HD static constexpr double Scale() { return 0x1p128; }
};

template <typename F>
COLLECTIVED_HD inline bool IsNaN(F x) {
  return x != x;
}

// A NaN with its quiet bit set (sign and payload kept), as x86 returns a NaN
// operand.
template <typename F>
COLLECTIVED_HD inline F Quiet(F x) {
  using Bits = typename FloatTraits<F>::Bits;
  return BitCast<F>(static_cast<Bits>(BitCast<Bits>(x) | FloatTraits<F>::kQuietBit));
}

template <typename F>
COLLECTIVED_HD inline F Abs(F x) {
#if defined(__CUDA_ARCH__)
  return fabs(x);
#else
  return std::fabs(x);
#endif
}

// A zero of x's sign.
template <typename F>
COLLECTIVED_HD inline F SignedZero(F x) {
#if defined(__CUDA_ARCH__)
  return copysign(F{0}, x);
#else
  return std::copysign(F{0}, x);
#endif
}

// x with a subnormal replaced by a zero of its sign. (Written as a float
// compare and select, which GCC vectorizes for double too; a test of the
// exponent bits needs 64-bit integer compares, which SSE2 lacks. Under DAZ
// the compare reads a subnormal as zero, which is as good.)
template <typename F>
COLLECTIVED_HD inline F FlushSubnormal(F x) {
#if defined(__CUDA_ARCH__)
  return fabs(x) < FloatTraits<F>::MinNormal() ? copysign(F{0}, x) : x;
#else
  return std::fabs(x) < std::numeric_limits<F>::min() ? std::copysign(F{0}, x) : x;
#endif
}

// ---------------------------------------------------------------------------
// Floating-point environments (see the top of the file).

struct HardwareEnv {
  static constexpr bool kSoftware = false;
  // An operand, as the arithmetic reads it.
  template <typename F>
  COLLECTIVED_HD static F In(F x) {
    return x;
  }
  template <typename F>
  COLLECTIVED_HD static F Add(F a, F b) {
    return a + b;
  }
  template <typename F>
  COLLECTIVED_HD static F Mul(F a, F b) {
    return a * b;
  }
};

struct SoftwareEnv {
  static constexpr bool kSoftware = true;
  template <typename F>
  COLLECTIVED_HD static F In(F x) {
    return FlushSubnormal(x);
  }
  // a + b as x86's addss/addsd under FTZ|DAZ, `a` the first operand.
  template <typename F>
  COLLECTIVED_HD static F Add(F a, F b) {
    a = FlushSubnormal(a);
    b = FlushSubnormal(b);
    if (IsNaN(a)) return Quiet(a);
    if (IsNaN(b)) return Quiet(b);
    const F r = a + b;
    if (IsNaN(r)) return FloatTraits<F>::DefaultNaN();  // inf + -inf
    return FlushSubnormal(r);  // exact (see the top of the file)
  }
  // a * b as x86's mulss/mulsd under FTZ|DAZ.
  template <typename F>
  COLLECTIVED_HD static F Mul(F a, F b) {
    a = FlushSubnormal(a);
    b = FlushSubnormal(b);
    if (IsNaN(a)) return Quiet(a);
    if (IsNaN(b)) return Quiet(b);
    const F r = a * b;
    if (IsNaN(r)) return FloatTraits<F>::DefaultNaN();  // 0 * inf
    const F m = Abs(r);
    const F zero = SignedZero(r);
    if (m < FloatTraits<F>::MinNormal()) return zero;
    if (m == FloatTraits<F>::MinNormal()) {
      // Rounded with an unbounded exponent, is the product below the
      // smallest normal? One operand is below 2^-63 (2^-511) in magnitude,
      // so scaling it by 2^64 (2^128) is exact and overflows nothing, and
      // the scaled product is normal: rounded like the unbounded one.
      const F s = FloatTraits<F>::Scale();
      const F t = Abs(a) < Abs(b) ? (a * s) * b : a * (b * s);
      if (Abs(t) < FloatTraits<F>::MinNormal() * s) return zero;
    }
    return r;
  }
};

// The CPU's environment: set by FlushDenormalsScope in reduce.cc where the
// architecture has the mode bits.
#if defined(__SSE__) || defined(__aarch64__)
using CpuEnv = HardwareEnv;
#else
using CpuEnv = SoftwareEnv;
#endif

// ---------------------------------------------------------------------------
// float16 and bfloat16. Branch-free (vectorizable) versions of the
// conversions in dtype.cc. They give the same bits, except for NaNs:
// DecodeHalf leaves a signaling NaN signaling (a NaN only reaches a kernel
// result through an addition and an encoder; max/min never keep a NaN), and
// the encoders give the canonical NaN (sign | quiet bit) where dtype.cc keeps
// the payload. Integer operations and exact float operations only (the
// float16 encoder's one addition, 0.5f + |f|, rounds the same with or without
// DAZ: a subnormal |f| is below half an ulp of 0.5f).

COLLECTIVED_HD inline float DecodeHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int32_t em = h & 0x7fff;  // exponent and mantissa bits
  // Normal: rebias the exponent from 15 to 127. Inf/NaN (exponent 31) need
  // 255, i.e. the same amount added once more.
  const uint32_t normal = (static_cast<uint32_t>(em) << 13) + 0x38000000u +
                          SelectBits(em >= 0x7c00, 0x38000000u, 0u);
  // Subnormals (and zero) are em * 2^-24, exact in float.
  const uint32_t subnormal = BitCast<uint32_t>(static_cast<float>(em) * 0x1p-24f);
  return BitCast<float>(sign | SelectBits(em < 0x400, subnormal, normal));
}

COLLECTIVED_HD inline uint16_t EncodeHalf(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t ua = u & 0x7fffffffu;
  const int32_t a = static_cast<int32_t>(ua);  // signed compares vectorize
  // Normal: rebias and round the 13 dropped bits to nearest even. Clamping
  // |f| to 2^16 first makes everything from 65520 up (inf and NaN included)
  // come out as exactly 0x7c00.
#if defined(__CUDA_ARCH__)
  const uint32_t clamped = static_cast<uint32_t>(min(a, 0x47800000));
#else
  const uint32_t clamped = static_cast<uint32_t>(std::min(a, 0x47800000));
#endif
  const uint32_t normal =
      (clamped - ((127u - 15u) << 23) + 0xfffu + ((clamped >> 13) & 1u)) >> 13;
  // Subnormal: in 0.5f + |f| the float ulp is 2^-24, the half subnormal
  // unit, so the (round-to-nearest-even) FPU addition does the rounding.
  const uint32_t subnormal = BitCast<uint32_t>(BitCast<float>(ua) + 0.5f) - 0x3f000000u;
  // NaN: 0x7c00 from the clamp, plus the quiet bit: the canonical NaN (sign
  // kept, payload dropped), as XLA's (Eigen's) conversion gives.
  const uint32_t nan_bits = SelectBits(a > 0x7f800000, 0x0200u, 0u);
  return static_cast<uint16_t>(sign | nan_bits |
                               SelectBits(a < 0x38800000, subnormal, normal));
}

COLLECTIVED_HD inline float DecodeBF16(uint16_t b) {
  return BitCast<float>(static_cast<uint32_t>(b) << 16);
}

// A NaN becomes the canonical one, sign | 0x7fc0 (as XLA's, Eigen's,
// conversion gives).
COLLECTIVED_HD inline uint16_t EncodeBF16(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  const bool is_nan = static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// bfloat16 NaN -> sign | 0x7fc0, every other value kept (ReduceMeshOfOne).
COLLECTIVED_HD inline uint16_t CanonicalizeBF16NaN(uint16_t b) {
  const bool is_nan = (b & 0x7fffu) > 0x7f80u;
  return is_nan ? static_cast<uint16_t>((b & 0x8000u) | 0x7fc0u) : b;
}

struct HalfFormat {
  using Bits = uint16_t;
  COLLECTIVED_HD static float Decode(uint16_t h) { return DecodeHalf(h); }
  COLLECTIVED_HD static uint16_t Encode(float f) { return EncodeHalf(f); }
};

// bfloat16 subnormals are float32 subnormals, flushed like them (see
// WidenedPicked). float16 subnormals are normal float32 numbers, and XLA
// does not flush them.
struct BF16Format {
  using Bits = uint16_t;
  COLLECTIVED_HD static float Decode(uint16_t b) { return DecodeBF16(b); }
  COLLECTIVED_HD static uint16_t Encode(float f) { return EncodeBF16(f); }
};

// ---------------------------------------------------------------------------
// float8_e4m3fn and float8_e5m2. Branch-free versions of the conversions in
// dtype.cc, with the same bits (ml_dtypes'), NaNs included: decoding is exact
// and gives a NaN as the quiet NaN of its sign (payload dropped); encoding
// rounds to nearest even and keeps subnormals. Integer operations and exact
// float operations only (the subnormal path's one addition, 2^14 + |f| or
// 2^7 + |f|, rounds the same with or without DAZ: a float32 subnormal |f| is
// far below half a float8 unit).

// float8_e4m3fn (bias 7, 3 mantissa bits, no inf; S.1111.111 is NaN).
COLLECTIVED_HD inline float DecodeF8E4M3FN(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const int32_t em = b & 0x7f;  // exponent and mantissa bits
  // Normal: rebias the exponent from 7 to 127.
  const uint32_t normal = (static_cast<uint32_t>(em) << 20) + (120u << 23);
  // Subnormals (and zero) are em * 2^-9, exact in float.
  const uint32_t subnormal = BitCast<uint32_t>(static_cast<float>(em) * 0x1p-9f);
  const uint32_t finite = SelectBits(em < 0x08, subnormal, normal);
  return BitCast<float>(sign | SelectBits(em == 0x7f, 0x7fc00000u, finite));
}

// |f| rounding above 448 (from just above 464; 464 ties to 448), +-inf and
// NaN all give the NaN of f's sign, sign | 0x7f.
COLLECTIVED_HD inline uint8_t EncodeF8E4M3FN(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t ua = u & 0x7fffffffu;
  const int32_t a = static_cast<int32_t>(ua);  // signed compares vectorize
  // Normal (|f| >= 2^-6): rebias and round the 20 dropped bits to nearest
  // even. Clamping |f| to 480 first makes everything that rounds to 480 or
  // beyond (inf and NaN included) come out as exactly 0x7f, the NaN.
#if defined(__CUDA_ARCH__)
  const uint32_t clamped = static_cast<uint32_t>(min(a, 0x43f00000));
#else
  const uint32_t clamped = static_cast<uint32_t>(std::min(a, 0x43f00000));
#endif
  const uint32_t normal =
      (clamped - ((127u - 7u) << 23) + 0x7ffffu + ((clamped >> 20) & 1u)) >> 20;
  // Subnormal: in 2^14 + |f| the float ulp is 2^-9, the float8 subnormal
  // unit, so the (round-to-nearest-even) FPU addition does the rounding; a
  // carry to 2^-6 gives 0x08, the smallest normal.
  const uint32_t subnormal = BitCast<uint32_t>(BitCast<float>(ua) + 0x1p14f) - 0x46800000u;
  return static_cast<uint8_t>(sign | SelectBits(a < 0x3c800000, subnormal, normal));
}

// float8_e5m2 (bias 15, 2 mantissa bits; the top byte of a float16).
COLLECTIVED_HD inline float DecodeF8E5M2(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t bits = BitCast<uint32_t>(DecodeHalf(static_cast<uint16_t>((b & 0x7fu) << 8)));
  return BitCast<float>(sign | SelectBits((b & 0x7f) > 0x7c, 0x7fc00000u, bits));
}

// |f| from 61440 (halfway from 57344 to 2^16) up gives the infinity of f's
// sign; NaN gives sign | 0x7e.
COLLECTIVED_HD inline uint8_t EncodeF8E5M2(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t ua = u & 0x7fffffffu;
  const int32_t a = static_cast<int32_t>(ua);
  // Normal (|f| >= 2^-14): as EncodeHalf, 21 dropped bits. Clamping |f| to
  // 2^16 makes everything from 61440 up (inf and NaN included) 0x7c.
#if defined(__CUDA_ARCH__)
  const uint32_t clamped = static_cast<uint32_t>(min(a, 0x47800000));
#else
  const uint32_t clamped = static_cast<uint32_t>(std::min(a, 0x47800000));
#endif
  const uint32_t normal =
      (clamped - ((127u - 15u) << 23) + 0xfffffu + ((clamped >> 21) & 1u)) >> 21;
  // Subnormal: units of 2^-16, the float ulp of 2^7 + |f|.
  const uint32_t subnormal = BitCast<uint32_t>(BitCast<float>(ua) + 0x1p7f) - 0x43000000u;
  const uint32_t nan_bits = SelectBits(a > 0x7f800000, 0x02u, 0u);  // 0x7c | 0x02
  return static_cast<uint8_t>(sign | nan_bits | SelectBits(a < 0x38800000, subnormal, normal));
}

// XLA's float16 -> float8_e5m2 conversion, which ends every float8_e5m2
// collective on CPU (see F8E5M2Format): as EncodeF8E5M2, except that every
// NaN becomes 0x7f, sign dropped. (The float16 -> float8_e4m3fn conversion
// is EncodeF8E4M3FN's, NaNs included.)
COLLECTIVED_HD inline uint8_t EncodeF8E5M2FromHalf(float f) {
  const bool is_nan = static_cast<int32_t>(BitCast<uint32_t>(f) & 0x7fffffffu) > 0x7f800000;
  return is_nan ? static_cast<uint8_t>(0x7fu) : EncodeF8E5M2(f);
}

// float8_e5m2 NaN -> 0x7f, every other value kept: XLA's round trip through
// float16 (ReduceMeshOfOne, and XLA's data movement).
COLLECTIVED_HD inline uint8_t CanonicalizeF8E5M2NaN(uint8_t b) {
  return (b & 0x7fu) > 0x7cu ? static_cast<uint8_t>(0x7fu) : b;
}

// XLA on CPU runs every float8 collective in float16 (its float
// normalization pass): each operand is converted to float16 (exact), the
// reduction runs under the float16 rules (HalfAdd: rounded to float16 after
// every addition, first NaN kept; max/min compare exactly; never flushed),
// and the float16 result is converted back (rounded to nearest even). So the
// float8 sum is NOT rounded to float8 per addition. Decode/Encode are those
// two conversions: Decode gives the float16 value as a float; Encode takes a
// float16 value (as a float) to float8 as XLA's convert does.
struct F8E4M3FNFormat {
  using Bits = uint8_t;
  COLLECTIVED_HD static float Decode(uint8_t b) { return DecodeF8E4M3FN(b); }
  COLLECTIVED_HD static uint8_t Encode(float f) { return EncodeF8E4M3FN(f); }
};

struct F8E5M2Format {
  using Bits = uint8_t;
  COLLECTIVED_HD static float Decode(uint8_t b) { return DecodeF8E5M2(b); }
  COLLECTIVED_HD static uint8_t Encode(float f) { return EncodeF8E5M2FromHalf(f); }
};

// ---------------------------------------------------------------------------
// The mean's reciprocal 1/n, as XLA rounds it (it rewrites x / n as
// x * (1/n)).

// float32, bfloat16, bool and the 8/32-bit integers: 1.0f / n in float32.
COLLECTIVED_HD inline float MeanScaleF32(int n) { return 1.0f / static_cast<float>(n); }
// float64 and the 64-bit integers: 1.0 / n.
COLLECTIVED_HD inline double MeanScaleF64(int n) { return 1.0 / static_cast<double>(n); }
// float16: float16(1/n) (rounding 1/n to float32 first gives the same
// float16: 24 >= 2 * 11 + 2 bits), as a float.
COLLECTIVED_HD inline float MeanScaleF16(int n) { return DecodeHalf(EncodeHalf(MeanScaleF32(n))); }

// ---------------------------------------------------------------------------
// Combiners: operator()(acc, x) is one step; First(x) is the step from the
// identity. A float addition with one NaN operand gives that NaN quieted
// (sign and payload kept). When both are NaNs, x86 returns the first
// operand, which the compiler picks (and may pick differently for the vector
// loops and the scalar rest): Add leaves that open, AddLastNaN and HalfAdd
// settle it.

// acc + x. From +0: for floats +0.0 + x is not x (-0.0 becomes +0.0); for
// the unsigned integer accumulators it is.
template <typename Env>
struct Add {
  template <typename T>
  COLLECTIVED_HD T operator()(T acc, T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      return Env::Add(acc, Env::In(x));
    } else {
      return static_cast<T>(acc + x);  // unsigned for integers: wraps
    }
  }
  template <typename T>
  COLLECTIVED_HD T First(T x) const {
    return (*this)(T{0}, x);
  }
};

// The float sum with XLA's NaN rule: the last NaN member's NaN survives
// (quieted). A NaN x replaces acc before the addition, and x + x is x
// quieted. (The CPU uses Add, and AddLastNaN only for blocks with a NaN; it
// gives the same bits as Add wherever the sum is not NaN.)
template <typename Env>
struct AddLastNaN {
  COLLECTIVED_HD float operator()(float acc, float x) const {
    x = Env::In(x);
    // As bit masks: a ?: would let GCC move the addition into the branches
    // (see SelectBits).
    const float a = BitCast<float>(
        SelectBits(x != x, BitCast<uint32_t>(x), BitCast<uint32_t>(acc)));
    return Env::Add(a, x);
  }
  COLLECTIVED_HD double operator()(double acc, double x) const {
    x = Env::In(x);
    // SSE2 cannot vectorize 64-bit masks made from a compare; this ?: is
    // vectorized as long as acc is not computed only for it (see
    // kFuseFirstTwo in reduce.cc).
    const double a = x != x ? x : acc;
    return Env::Add(a, x);
  }
  // From +0.0 there is at most one NaN operand.
  template <typename T>
  COLLECTIVED_HD T First(T x) const {
    return Add<Env>{}.First(x);
  }
};

// float16 sum: each addition is done in float32 (both operands are float16
// values) and rounded to float16 right away, so the accumulator always holds
// a float16 value (as a float). The float32 rounding before the float16 one
// changes nothing (24 >= 2 * 11 + 2 bits): this is the correctly rounded
// float16 addition, what XLA computes. (float16 values are normal float32
// numbers or zeros, and so are their sums: nothing to flush.)
// NaNs: the first NaN member's survives (as XLA on CPU), i.e. a NaN acc
// replaces x before the addition; the encoder makes it canonical (its sign
// kept: inf + -inf gives x86's default NaN, so 0xfe00).
template <typename Env>
struct HalfAdd {
  COLLECTIVED_HD float operator()(float acc, float x) const {
    const float b = BitCast<float>(
        SelectBits(acc != acc, BitCast<uint32_t>(acc), BitCast<uint32_t>(x)));
    return DecodeHalf(EncodeHalf(Env::Add(acc, b)));
  }
  COLLECTIVED_HD float First(float x) const {
    return DecodeHalf(EncodeHalf(Env::Add(0.0f, x)));
  }
};

// The identity of integer max/min is the type's min/max, which no value
// beats: First is the value itself.
struct IntMax {
  template <typename T>
  COLLECTIVED_HD T operator()(T acc, T x) const {
    return acc < x ? x : acc;
  }
  template <typename T>
  COLLECTIVED_HD T First(T x) const {
    return x;
  }
};

struct IntMin {
  template <typename T>
  COLLECTIVED_HD T operator()(T acc, T x) const {
    return x < acc ? x : acc;
  }
  template <typename T>
  COLLECTIVED_HD T First(T x) const {
    return x;
  }
};

// XLA CPU's float max: acc starts at -inf and takes x only when x > acc. A
// NaN never compares greater, so it never wins (all NaN gives -inf); for
// equal values (-0.0 and +0.0) the earlier member is kept. The select is
// exactly maxps(x, acc): compare and blend, no branch.
template <typename Env>
struct FloatMax {
  template <typename F>
  COLLECTIVED_HD F operator()(F acc, F x) const {
    x = Env::In(x);
    return x > acc ? x : acc;
  }
  template <typename F>
  COLLECTIVED_HD F First(F x) const {
    return (*this)(-FloatTraits<F>::Inf(), x);
  }
};

// min likewise: from +inf, x taken only when x < acc (minps(x, acc)).
template <typename Env>
struct FloatMin {
  template <typename F>
  COLLECTIVED_HD F operator()(F acc, F x) const {
    x = Env::In(x);
    return x < acc ? x : acc;
  }
  template <typename F>
  COLLECTIVED_HD F First(F x) const {
    return (*this)(FloatTraits<F>::Inf(), x);
  }
};

// Bool max/min on 0/1 bytes; the identities (false/true) leave x as is.
struct Or {
  COLLECTIVED_HD uint8_t operator()(uint8_t acc, uint8_t x) const {
    return static_cast<uint8_t>(acc | x);
  }
  COLLECTIVED_HD uint8_t First(uint8_t x) const { return x; }
};

struct And {
  COLLECTIVED_HD uint8_t operator()(uint8_t acc, uint8_t x) const {
    return static_cast<uint8_t>(acc & x);
  }
  COLLECTIVED_HD uint8_t First(uint8_t x) const { return x; }
};

// ---------------------------------------------------------------------------
// Element codecs: In (input element), Acc (accumulator), Out (output
// element), Load(In) -> Acc and Store(Acc) -> Out.

// Same type in and out; Acc is T, or its unsigned twin for wrapping sums.
template <typename T, typename AccT>
struct Plain {
  using In = T;
  using Acc = AccT;
  using Out = T;
  COLLECTIVED_HD Acc Load(In x) const { return static_cast<Acc>(x); }
  COLLECTIVED_HD Out Store(Acc a) const { return static_cast<Out>(a); }  // modular
};

// float32/float64 max/min: the winner is one of the inputs, which may be a
// subnormal (it won as a zero): flushed on the way out. (No arithmetic: the
// hardware does not flush it.)
template <typename T>
struct Picked {
  using In = T;
  using Acc = T;
  using Out = T;
  COLLECTIVED_HD Acc Load(In x) const { return x; }
  COLLECTIVED_HD Out Store(Acc a) const { return FlushSubnormal(a); }
};

// float16/bfloat16/float8 computed in float32 and encoded on the way out.
// For the bfloat16 sum that is its one rounding; the float16 and float8 sums
// (HalfAdd) hold float16 values in float already, which encode back to
// exactly their bits (float16) or are rounded once to float8.
template <typename Format>
struct Widened {
  using In = typename Format::Bits;
  using Acc = float;
  using Out = typename Format::Bits;
  COLLECTIVED_HD Acc Load(In x) const { return Format::Decode(x); }
  COLLECTIVED_HD Out Store(Acc a) const { return Format::Encode(a); }
};

// float16/bfloat16/float8 max/min keep one of the inputs (or +-inf), which
// encodes back to exactly its bits (float8_e4m3fn has no infinity: an
// identity that no member beat, i.e. all NaN, encodes to NaN, sign | 0x7f);
// a bfloat16 subnormal winner (it won as a zero) is flushed on the way out.
template <typename Format>
struct WidenedPicked {
  using In = typename Format::Bits;
  using Acc = float;
  using Out = typename Format::Bits;
  COLLECTIVED_HD Acc Load(In x) const { return Format::Decode(x); }
  COLLECTIVED_HD Out Store(Acc a) const {
    if constexpr (std::is_same_v<Format, BF16Format>) {
      return Format::Encode(FlushSubnormal(a));
    } else {
      return Format::Encode(a);
    }
  }
};

// The means multiply the sum by the reciprocal `scale` (MeanScale*).

// Mean of float32/float64: the sum times scale in that type.
template <typename T, typename Env>
struct FloatMean {
  using In = T;
  using Acc = T;
  using Out = T;
  T scale;
  COLLECTIVED_HD Acc Load(In x) const { return x; }
  COLLECTIVED_HD Out Store(Acc a) const { return Env::Mul(a, scale); }
};

// Mean of float16/bfloat16: the sum rounded to the format (already so for
// float16, whose sum is rounded per addition), times scale in float32 (exact
// for float16 operands), rounded again.
template <typename Format, typename Env>
struct WidenedMean {
  using In = uint16_t;
  using Acc = float;
  using Out = uint16_t;
  float scale;
  COLLECTIVED_HD Acc Load(In x) const { return Format::Decode(x); }
  COLLECTIVED_HD Out Store(Acc a) const {
    return Format::Encode(Env::Mul(Format::Decode(Format::Encode(a)), scale));
  }
};

// Mean of float8 (XLA computes it in float16, see F8E4M3FNFormat): the
// float16 sum converted to float8, back to float16, times scale = f16(1/n)
// (MeanScaleF16) rounded to float16 (the float32 product is exact), then
// converted to float8: f8(f16(f16(f8(s)) * f16(1/n))), two roundings.
template <typename Format, typename Env>
struct F8Mean {
  using In = typename Format::Bits;
  using Acc = float;
  using Out = typename Format::Bits;
  float scale;
  COLLECTIVED_HD Acc Load(In x) const { return Format::Decode(x); }
  COLLECTIVED_HD Out Store(Acc a) const {
    const float product = Env::Mul(Format::Decode(Format::Encode(a)), scale);
    return Format::Encode(DecodeHalf(EncodeHalf(product)));
  }
};

// Mean of an integer type: the wrapped sum in T, converted to R (float or
// double), times scale = R(1) / R(n). (Integer kernels run without the flush
// mode; the product of a nonzero integer and 1/n is far from subnormal and
// never NaN.)
template <typename T, typename R>
struct IntMean {
  using In = T;
  using Acc = std::make_unsigned_t<T>;
  using Out = R;
  R scale;
  COLLECTIVED_HD Acc Load(In x) const { return static_cast<Acc>(x); }
  COLLECTIVED_HD Out Store(Acc a) const { return static_cast<R>(static_cast<T>(a)) * scale; }
};

// Bool sum: counts of the nonzero bytes, as int32.
struct BoolCount {
  using In = uint8_t;
  using Acc = uint32_t;
  using Out = int32_t;
  COLLECTIVED_HD Acc Load(In x) const { return x != 0 ? 1u : 0u; }
  COLLECTIVED_HD Out Store(Acc a) const { return static_cast<Out>(a); }
};

// Bool max/min: bytes normalized to 0/1, combined with or/and.
struct BoolBits {
  using In = uint8_t;
  using Acc = uint8_t;
  using Out = uint8_t;
  COLLECTIVED_HD Acc Load(In x) const { return x != 0 ? 1 : 0; }
  COLLECTIVED_HD Out Store(Acc a) const { return a; }
};

// Bool mean: the int32 count, as float32, times scale = 1.0f / n.
struct BoolMean {
  using In = uint8_t;
  using Acc = uint32_t;
  using Out = float;
  float scale;
  COLLECTIVED_HD Acc Load(In x) const { return x != 0 ? 1u : 0u; }
  COLLECTIVED_HD Out Store(Acc a) const {
    return static_cast<float>(static_cast<int32_t>(a)) * scale;
  }
};

// ---------------------------------------------------------------------------
// One element of a reduction, the reference order: from the identity, the
// members in order. `load(k)` returns member k's input element.
template <typename Codec, typename Combiner, typename LoadFn>
COLLECTIVED_HD inline typename Codec::Out ReduceElement(const Codec& codec, const Combiner& op,
                                                        int n, const LoadFn& load) {
  typename Codec::Acc acc = op.First(codec.Load(load(0)));
  for (int k = 1; k < n; ++k) acc = op(acc, codec.Load(load(k)));
  return codec.Store(acc);
}

// Calls fn(codec, combiner) with the codec and combiner that compute
// Reduce(kind, dt, ..., n members) element by element in environment Env,
// with ReduceElement. This is the recipe of the CUDA kernels (Env =
// SoftwareEnv); the CPU kernels (reduce.cc) use the same codecs and
// combiners, except that their float sums run Add and fall back to
// AddLastNaN for blocks with a NaN or an infinity, which gives the same bits.
// Returns false (calling nothing) for kInvalid.
template <typename Env, typename Fn>
inline bool VisitReduce(ReduceKind kind, DType dt, int n, Fn&& fn) {
  auto integer = [&](auto zero) {
    using T = decltype(zero);
    using U = std::make_unsigned_t<T>;
    using R = std::conditional_t<sizeof(T) == 8, double, float>;
    switch (kind) {
      case ReduceKind::kSum:
        return fn(Plain<T, U>{}, Add<Env>{});
      case ReduceKind::kMax:
        return fn(Plain<T, T>{}, IntMax{});
      case ReduceKind::kMin:
        return fn(Plain<T, T>{}, IntMin{});
      case ReduceKind::kMean:
        return fn(IntMean<T, R>{static_cast<R>(sizeof(T) == 8 ? MeanScaleF64(n)
                                                               : MeanScaleF32(n))},
                  Add<Env>{});
    }
  };
  auto floating = [&](auto zero, auto scale) {
    using T = decltype(zero);
    switch (kind) {
      case ReduceKind::kSum:
        return fn(Plain<T, T>{}, AddLastNaN<Env>{});
      case ReduceKind::kMax:
        return fn(Picked<T>{}, FloatMax<Env>{});
      case ReduceKind::kMin:
        return fn(Picked<T>{}, FloatMin<Env>{});
      case ReduceKind::kMean:
        return fn(FloatMean<T, Env>{scale}, AddLastNaN<Env>{});
    }
  };
  auto widened = [&](auto format, auto sum, float scale) {
    using Format = decltype(format);
    switch (kind) {
      case ReduceKind::kSum:
        return fn(Widened<Format>{}, sum);
      case ReduceKind::kMax:
        return fn(WidenedPicked<Format>{}, FloatMax<Env>{});
      case ReduceKind::kMin:
        return fn(WidenedPicked<Format>{}, FloatMin<Env>{});
      case ReduceKind::kMean:
        return fn(WidenedMean<Format, Env>{scale}, sum);
    }
  };
  // float8: the float16 rules, see F8E4M3FNFormat.
  auto float8 = [&](auto format) {
    using Format = decltype(format);
    switch (kind) {
      case ReduceKind::kSum:
        return fn(Widened<Format>{}, HalfAdd<Env>{});
      case ReduceKind::kMax:
        return fn(WidenedPicked<Format>{}, FloatMax<Env>{});
      case ReduceKind::kMin:
        return fn(WidenedPicked<Format>{}, FloatMin<Env>{});
      case ReduceKind::kMean:
        return fn(F8Mean<Format, Env>{MeanScaleF16(n)}, HalfAdd<Env>{});
    }
  };
  switch (dt) {
    case DType::kF32:
      floating(float{0}, MeanScaleF32(n));
      return true;
    case DType::kF64:
      floating(double{0}, MeanScaleF64(n));
      return true;
    case DType::kF16:
      widened(HalfFormat{}, HalfAdd<Env>{}, MeanScaleF16(n));
      return true;
    case DType::kBF16:
      widened(BF16Format{}, AddLastNaN<Env>{}, MeanScaleF32(n));
      return true;
    case DType::kF8E4M3FN:
      float8(F8E4M3FNFormat{});
      return true;
    case DType::kF8E5M2:
      float8(F8E5M2Format{});
      return true;
    case DType::kI8:
      integer(int8_t{0});
      return true;
    case DType::kU8:
      integer(uint8_t{0});
      return true;
    case DType::kI32:
      integer(int32_t{0});
      return true;
    case DType::kU32:
      integer(uint32_t{0});
      return true;
    case DType::kI64:
      integer(int64_t{0});
      return true;
    case DType::kU64:
      integer(uint64_t{0});
      return true;
    case DType::kBool:
      switch (kind) {
        case ReduceKind::kSum:
          fn(BoolCount{}, Add<Env>{});
          break;
        case ReduceKind::kMax:
          fn(BoolBits{}, Or{});
          break;
        case ReduceKind::kMin:
          fn(BoolBits{}, And{});
          break;
        case ReduceKind::kMean:
          fn(BoolMean{MeanScaleF32(n)}, Add<Env>{});
          break;
      }
      return true;
    case DType::kInvalid:
      break;
  }
  return false;
}

}  // namespace reduce_ops
}  // namespace collectived

#endif  // COLLECTIVED_EXEC_REDUCE_OPS_H_
