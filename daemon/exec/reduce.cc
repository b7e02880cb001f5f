#include "daemon/exec/reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "daemon/plan/dtype.h"
#include "daemon/exec/stream_copy.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

// How the kernels are built: an "element codec" says how an input element
// becomes an accumulator value (Load) and how the accumulator becomes an
// output element (Store); a "combiner" is the binary op on accumulators,
// op(acc, x), plus First(x) = op(identity, x) for the first member. The
// array is walked in blocks of kBlock elements with the accumulators in a
// local array:
//   acc = op(First(Load(in[0])), Load(in[1])); acc = op(acc, Load(in[k])) ...;
//   out = Store(acc)
// Starting from the identity is what XLA does, and it is visible: +0.0 + x
// turns a -0.0 into +0.0 (and quiets a signaling NaN); -inf/+inf as the start
// of max/min turns a NaN first member into -inf/+inf.
// Every input block is read before the output block is written, so `out` may
// be one of the inputs (see Run for outputs wider than the inputs). All loops
// are branch-free so GCC vectorizes them.
//
// Subnormals: XLA on CPU runs with flush-to-zero and denormals-are-zero set,
// and so do the kernels (FlushDenormalsScope, around every call of ReduceTo,
// whatever the thread): the hardware flushes the operands and results of
// every float addition, multiplication and comparison. It does not flush
// bits that are only copied: max/min select one of their inputs (by a
// compare that reads a subnormal as zero), so their results are flushed
// once on the way out (the Picked and WidenedPicked stores), whether the
// compiler picked maxps or a compare and a blend.
//
// NaNs: which NaN a sum keeps is XLA's rule, not the compiler's operand
// order: a block whose sum has a NaN is summed again with AddLastNaN (Run).
//
// The float NaN handling relies on IEEE semantics and the float16 encoder on
// the default round-to-nearest mode: do not build this file with -ffast-math
// or -ffinite-math-only.

namespace collectived {
namespace {

// 1024 accumulators are at most 8 KiB: they stay in L1 while the inputs
// stream past.
constexpr size_t kBlock = 1024;

// ---------------------------------------------------------------------------
// The floating-point environment: flush-to-zero (a result below the smallest
// normal, after rounding with an unbounded exponent, becomes a zero of its
// sign) and denormals-are-zero (a subnormal operand reads as a zero of its
// sign), as XLA sets them on CPU. Set for the duration of one ReduceTo call
// and restored after, on whatever thread runs it (gRPC, fast-path queue,
// timer or executor threads): a few cycles per call.
#if defined(__SSE__)
constexpr bool kHardwareFlush = true;
class FlushDenormalsScope {
 public:
  FlushDenormalsScope() : saved_(_mm_getcsr()) {
    constexpr unsigned int kFtzDaz = 0x8000u | 0x0040u;
    if ((saved_ & kFtzDaz) != kFtzDaz) _mm_setcsr(saved_ | kFtzDaz);
  }
  ~FlushDenormalsScope() {
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
  }
  FlushDenormalsScope(const FlushDenormalsScope&) = delete;
  FlushDenormalsScope& operator=(const FlushDenormalsScope&) = delete;

 private:
  const unsigned int saved_;
};
#elif defined(__aarch64__)
// FPCR.FZ flushes both subnormal operands and tiny results (FZ16, for
// half-precision arithmetic, is left alone: float16 is computed in float32).
constexpr bool kHardwareFlush = true;
class FlushDenormalsScope {
 public:
  FlushDenormalsScope() {
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    if ((saved_ & kFz) == 0) asm volatile("msr fpcr, %0" : : "r"(saved_ | kFz));
  }
  ~FlushDenormalsScope() {
    if ((saved_ & kFz) == 0) asm volatile("msr fpcr, %0" : : "r"(saved_));
  }
  FlushDenormalsScope(const FlushDenormalsScope&) = delete;
  FlushDenormalsScope& operator=(const FlushDenormalsScope&) = delete;

 private:
  static constexpr uint64_t kFz = uint64_t{1} << 24;
  uint64_t saved_ = 0;
};
#else
// No known control register: the kernels flush every arithmetic result in
// software instead (FlushResult). Sums come out the same (a tiny sum of
// normal numbers is exact); a pmean product within half an ulp below the
// smallest normal rounds up to it here, where hardware flushes it.
constexpr bool kHardwareFlush = false;
class FlushDenormalsScope {
 public:
  FlushDenormalsScope() {}
};
#endif

// x with a subnormal replaced by a zero of its sign. (Written as a float
// compare and select, which GCC vectorizes for double too; a test of the
// exponent bits needs 64-bit integer compares, which SSE2 lacks. Under DAZ
// the compare reads a subnormal as zero, which is as good.)
template <typename F>
inline F FlushSubnormal(F x) {
  return std::fabs(x) < std::numeric_limits<F>::min() ? std::copysign(F{0}, x) : x;
}

// An operand / an arithmetic result, flushed where the hardware does not do
// it.
template <typename F>
inline F FlushInput(F x) {
  if constexpr (kHardwareFlush) {
    return x;
  } else {
    return FlushSubnormal(x);
  }
}

template <typename F>
inline F FlushResult(F x) {
  return FlushInput(x);
}

// Where Run writes each result block: `count` outputs, through the cache or
// with streaming stores.
struct Outs {
  void* const* ptrs;
  int count;
  bool stream;
};

// ---------------------------------------------------------------------------
// Branch-free (vectorizable) versions of the conversions in dtype.cc. They
// give the same bits, except for NaNs: DecodeHalf leaves a signaling NaN
// signaling (a NaN only reaches a kernel result through an addition and an
// encoder; max/min never keep a NaN), and the encoders give the canonical
// NaN (sign | quiet bit) where dtype.cc keeps the payload.

// c ? a : b as bit masks. The half conversions compute a float value on one
// path only; written as a plain ?: GCC moves that float op into a branch and
// then (under the default -ftrapping-math) will not if-convert it back, which
// blocks vectorization. Masks leave no branch to move it into.
inline uint32_t SelectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

inline float DecodeHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int32_t em = h & 0x7fff;  // exponent and mantissa bits
  // Normal: rebias the exponent from 15 to 127. Inf/NaN (exponent 31) need
  // 255, i.e. the same amount added once more.
  const uint32_t normal = (static_cast<uint32_t>(em) << 13) + 0x38000000u +
                          SelectBits(em >= 0x7c00, 0x38000000u, 0u);
  // Subnormals (and zero) are em * 2^-24, exact in float.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(static_cast<float>(em) * 0x1p-24f);
  return std::bit_cast<float>(sign | SelectBits(em < 0x400, subnormal, normal));
}

inline uint16_t EncodeHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t ua = u & 0x7fffffffu;
  const int32_t a = static_cast<int32_t>(ua);  // signed compares vectorize
  // Normal: rebias and round the 13 dropped bits to nearest even. Clamping
  // |f| to 2^16 first makes everything from 65520 up (inf and NaN included)
  // come out as exactly 0x7c00.
  const uint32_t clamped = static_cast<uint32_t>(std::min(a, 0x47800000));
  const uint32_t normal =
      (clamped - ((127u - 15u) << 23) + 0xfffu + ((clamped >> 13) & 1u)) >> 13;
  // Subnormal: in 0.5f + |f| the float ulp is 2^-24, the half subnormal
  // unit, so the (round-to-nearest-even) FPU addition does the rounding.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(ua) + 0.5f) - 0x3f000000u;
  // NaN: 0x7c00 from the clamp, plus the quiet bit: the canonical NaN (sign
  // kept, payload dropped), as XLA's (Eigen's) conversion gives.
  const uint32_t nan_bits = SelectBits(a > 0x7f800000, 0x0200u, 0u);
  return static_cast<uint16_t>(sign | nan_bits |
                               SelectBits(a < 0x38800000, subnormal, normal));
}

inline float DecodeBF16(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// A NaN becomes the canonical one, sign | 0x7fc0 (as XLA's, Eigen's,
// conversion gives).
inline uint16_t EncodeBF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  const bool is_nan = static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

struct HalfFormat {
  static float Decode(uint16_t h) { return DecodeHalf(h); }
  static uint16_t Encode(float f) { return EncodeHalf(f); }
};

// bfloat16 subnormals are float32 subnormals, flushed like them (see
// WidenedPicked). float16 subnormals are normal float32 numbers, and XLA
// does not flush them.
struct BF16Format {
  static float Decode(uint16_t b) { return DecodeBF16(b); }
  static uint16_t Encode(float f) { return EncodeBF16(f); }
};

// ---------------------------------------------------------------------------
// Combiners: operator()(acc, x) is one step; First(x) is the step from the
// identity. A float addition with one NaN operand gives that NaN quieted
// (sign and payload kept). When both are NaNs, the hardware returns one of
// them depending on the operand order, which the compiler picks (and may
// pick differently for the vector loops and the scalar rest): Add leaves
// that open, AddLastNaN and HalfAdd settle it.

// acc + x. From +0: for floats +0.0 + x is not x (-0.0 becomes +0.0); for
// the unsigned integer accumulators it is.
struct Add {
  template <typename T>
  T operator()(T acc, T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      return FlushResult(acc + FlushInput(x));
    } else {
      return static_cast<T>(acc + x);  // unsigned for integers: wraps
    }
  }
  template <typename T>
  T First(T x) const {
    return (*this)(T{0}, x);
  }
};

// The float sum with XLA's NaN rule: the last NaN member's NaN survives
// (quieted). A NaN x replaces acc before the addition, and x + x is x
// quieted. Slower than Add; Run uses it only for blocks with a NaN.
struct AddLastNaN {
  float operator()(float acc, float x) const {
    x = FlushInput(x);
    // As bit masks: a ?: would let GCC move the addition into the branches
    // (see SelectBits).
    const float a = std::bit_cast<float>(SelectBits(
        x != x, std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(acc)));
    return FlushResult(a + x);
  }
  double operator()(double acc, double x) const {
    x = FlushInput(x);
    // SSE2 cannot vectorize 64-bit masks made from a compare; this ?: is
    // vectorized as long as acc is not computed only for it (see
    // kFuseFirstTwo).
    const double a = x != x ? x : acc;
    return FlushResult(a + x);
  }
  // From +0.0 there is at most one NaN operand.
  template <typename T>
  T First(T x) const {
    return Add{}.First(x);
  }
};

// float16 sum: each addition is done in float32 (both operands are float16
// values) and rounded to float16 right away, so the accumulator always holds
// a float16 value (as a float). The float32 rounding before the float16 one
// changes nothing (24 >= 2 * 11 + 2 bits): this is the correctly rounded
// float16 addition, what XLA computes.
// NaNs: the first NaN member's survives (as XLA on CPU), i.e. a NaN acc
// replaces x before the addition; the encoder makes it canonical.
struct HalfAdd {
  float operator()(float acc, float x) const {
    const float b = std::bit_cast<float>(SelectBits(
        acc != acc, std::bit_cast<uint32_t>(acc), std::bit_cast<uint32_t>(x)));
    return DecodeHalf(EncodeHalf(acc + b));
  }
  float First(float x) const { return DecodeHalf(EncodeHalf(0.0f + x)); }
};

// The identity of integer max/min is the type's min/max, which no value
// beats: First is the value itself.
struct IntMax {
  template <typename T>
  T operator()(T acc, T x) const {
    return acc < x ? x : acc;
  }
  template <typename T>
  T First(T x) const {
    return x;
  }
};

struct IntMin {
  template <typename T>
  T operator()(T acc, T x) const {
    return x < acc ? x : acc;
  }
  template <typename T>
  T First(T x) const {
    return x;
  }
};

// XLA CPU's float max: acc starts at -inf and takes x only when x > acc. A
// NaN never compares greater, so it never wins (all NaN gives -inf); for
// equal values (-0.0 and +0.0) the earlier member is kept. The select is
// exactly maxps(x, acc): compare and blend, no branch.
struct FloatMax {
  template <typename F>
  F operator()(F acc, F x) const {
    x = FlushInput(x);
    return x > acc ? x : acc;
  }
  template <typename F>
  F First(F x) const {
    return (*this)(-std::numeric_limits<F>::infinity(), x);
  }
};

// min likewise: from +inf, x taken only when x < acc (minps(x, acc)).
struct FloatMin {
  template <typename F>
  F operator()(F acc, F x) const {
    x = FlushInput(x);
    return x < acc ? x : acc;
  }
  template <typename F>
  F First(F x) const {
    return (*this)(std::numeric_limits<F>::infinity(), x);
  }
};

// Bool max/min on 0/1 bytes; the identities (false/true) leave x as is.
struct Or {
  uint8_t operator()(uint8_t acc, uint8_t x) const {
    return static_cast<uint8_t>(acc | x);
  }
  uint8_t First(uint8_t x) const { return x; }
};

struct And {
  uint8_t operator()(uint8_t acc, uint8_t x) const {
    return static_cast<uint8_t>(acc & x);
  }
  uint8_t First(uint8_t x) const { return x; }
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
  Acc Load(In x) const { return static_cast<Acc>(x); }
  Out Store(Acc a) const { return static_cast<Out>(a); }  // modular
};

// float32/float64 max/min: the winner is one of the inputs, which may be a
// subnormal (it won as a zero): flushed on the way out.
template <typename T>
struct Picked {
  using In = T;
  using Acc = T;
  using Out = T;
  Acc Load(In x) const { return x; }
  Out Store(Acc a) const { return FlushSubnormal(a); }
};

// float16/bfloat16 computed in float32 and encoded on the way out. For the
// bfloat16 sum that is its one rounding; the float16 sum (HalfAdd) holds
// float16 values in float already, which encode back to exactly their bits.
template <typename Format>
struct Widened {
  using In = uint16_t;
  using Acc = float;
  using Out = uint16_t;
  Acc Load(In x) const { return Format::Decode(x); }
  Out Store(Acc a) const { return Format::Encode(a); }
};

// float16/bfloat16 max/min keep one of the inputs (or +-inf), which encodes
// back to exactly its bits; a bfloat16 subnormal winner (it won as a zero)
// is flushed on the way out.
template <typename Format>
struct WidenedPicked {
  using In = uint16_t;
  using Acc = float;
  using Out = uint16_t;
  Acc Load(In x) const { return Format::Decode(x); }
  Out Store(Acc a) const {
    if constexpr (std::is_same_v<Format, BF16Format>) {
      return Format::Encode(FlushSubnormal(a));
    } else {
      return Format::Encode(a);
    }
  }
};

// The means multiply the sum by the reciprocal `scale` = 1/n, as XLA does
// (it rewrites x / n as x * (1/n)); the caller computes scale (see the
// dispatch below for which rounding of 1/n each type uses).

// Mean of float32/float64: the sum times scale in that type.
template <typename T>
struct FloatMean {
  using In = T;
  using Acc = T;
  using Out = T;
  T scale;
  Acc Load(In x) const { return x; }
  Out Store(Acc a) const { return FlushResult(a * scale); }
};

// Mean of float16/bfloat16: the sum rounded to the format (already so for
// float16, whose sum is rounded per addition), times scale in float32 (exact
// for float16 operands), rounded again.
template <typename Format>
struct WidenedMean {
  using In = uint16_t;
  using Acc = float;
  using Out = uint16_t;
  float scale;
  Acc Load(In x) const { return Format::Decode(x); }
  Out Store(Acc a) const {
    return Format::Encode(FlushResult(Format::Decode(Format::Encode(a)) * scale));
  }
};

// Mean of an integer type: the wrapped sum in T, converted to R (float or
// double), times scale = R(1) / R(n).
template <typename T, typename R>
struct IntMean {
  using In = T;
  using Acc = std::make_unsigned_t<T>;
  using Out = R;
  R scale;
  Acc Load(In x) const { return static_cast<Acc>(x); }
  Out Store(Acc a) const { return static_cast<R>(static_cast<T>(a)) * scale; }
};

// Bool sum: counts of the nonzero bytes, as int32.
struct BoolCount {
  using In = uint8_t;
  using Acc = uint32_t;
  using Out = int32_t;
  Acc Load(In x) const { return x != 0 ? 1u : 0u; }
  Out Store(Acc a) const { return static_cast<Out>(a); }
};

// Bool max/min: bytes normalized to 0/1, combined with or/and.
struct BoolBits {
  using In = uint8_t;
  using Acc = uint8_t;
  using Out = uint8_t;
  Acc Load(In x) const { return x != 0 ? 1 : 0; }
  Out Store(Acc a) const { return a; }
};

// Bool mean: the int32 count, as float32, times scale = 1.0f / n.
struct BoolMean {
  using In = uint8_t;
  using Acc = uint32_t;
  using Out = float;
  float scale;
  Acc Load(In x) const { return x != 0 ? 1u : 0u; }
  Out Store(Acc a) const {
    return static_cast<float>(static_cast<int32_t>(a)) * scale;
  }
};

// ---------------------------------------------------------------------------
// The block loops. Separate functions so the __restrict qualifiers hold for
// exactly one loop each; two read-only restrict pointers may alias.

// Calls body(i) for i in [0, len). Runs of 64 (more than any vector width)
// go through an inner loop of constant trip count: GCC's -O2 "very cheap"
// cost model only vectorizes loops that need no scalar epilogue, and this
// shape survives inlining (a variable trip count rounded down to a multiple
// of 64 does not). The short rest runs scalar.
template <typename Body>
inline void ForEachIndex(size_t len, Body body) {
  constexpr size_t kRun = 64;
  const size_t main_len = len / kRun * kRun;
  for (size_t base = 0; base < main_len; base += kRun) {
    for (size_t j = 0; j < kRun; ++j) body(base + j);
  }
  for (size_t i = main_len; i < len; ++i) body(i);
}

template <typename Codec, typename Combiner>
void LoadOne(Codec codec, Combiner op, const typename Codec::In* __restrict in,
             typename Codec::Acc* __restrict acc, size_t len) {
  ForEachIndex(len, [&](size_t i) { acc[i] = op.First(codec.Load(in[i])); });
}

template <typename Codec, typename Combiner>
void LoadTwo(Codec codec, Combiner op, const typename Codec::In* __restrict in0,
             const typename Codec::In* __restrict in1,
             typename Codec::Acc* __restrict acc, size_t len) {
  ForEachIndex(len, [&](size_t i) {
    acc[i] = op(op.First(codec.Load(in0[i])), codec.Load(in1[i]));
  });
}

template <typename Codec, typename Combiner>
void Accumulate(Codec codec, Combiner op,
                const typename Codec::In* __restrict in,
                typename Codec::Acc* __restrict acc, size_t len) {
  ForEachIndex(len, [&](size_t i) { acc[i] = op(acc[i], codec.Load(in[i])); });
}

template <typename Codec>
void StoreAll(Codec codec, const typename Codec::Acc* __restrict acc,
              typename Codec::Out* __restrict out, size_t len) {
  ForEachIndex(len, [&](size_t i) { out[i] = codec.Store(acc[i]); });
}

// Whether the first two members are combined in one pass (LoadTwo) rather
// than LoadOne and Accumulate: not for AddLastNaN on double, whose ?: GCC
// would turn into a branch there (acc would be computed for it alone).
template <typename Combiner, typename Acc>
constexpr bool kFuseFirstTwo =
    !(std::is_same_v<Combiner, AddLastNaN> && std::is_same_v<Acc, double>);

// acc[0..len) = the elements [base, base + len) of the n inputs combined.
template <typename Codec, typename Combiner>
void CombineBlock(Codec codec, Combiner op, const void* const* inputs, int n,
                  size_t base, size_t len, typename Codec::Acc* acc) {
  using In = typename Codec::In;
  const In* in0 = static_cast<const In*>(inputs[0]) + base;
  int k = 1;
  if (n == 1 || !kFuseFirstTwo<Combiner, typename Codec::Acc>) {
    LoadOne(codec, op, in0, acc, len);
  } else {
    LoadTwo(codec, op, in0, static_cast<const In*>(inputs[1]) + base, acc, len);
    k = 2;
  }
  for (; k < n; ++k) {
    Accumulate(codec, op, static_cast<const In*>(inputs[k]) + base, acc, len);
  }
}

// Whether acc[0..len) holds a NaN, or an infinity. (Adding one to an
// all-ones exponent carries into the sign bit; 32-bit integer operations on
// the top word, which vectorize for double too.)
template <typename F>
bool AnyNaNOrInf(const F* __restrict acc, size_t len) {
  constexpr int kShift = sizeof(F) * 8 - 32;
  constexpr uint32_t kExp = sizeof(F) == 4 ? 0x7f800000u : 0x7ff00000u;
  constexpr uint32_t kOne = sizeof(F) == 4 ? 0x00800000u : 0x00100000u;
  using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
  uint32_t any = 0;
  ForEachIndex(len, [&](size_t i) {
    const auto top = static_cast<uint32_t>(std::bit_cast<U>(acc[i]) >> kShift);
    any |= (top & kExp) + kOne;
  });
  return (any & 0x80000000u) != 0;
}

template <typename Codec, typename Combiner>
void Run(Codec codec, Combiner op, const void* const* inputs, int n, const Outs& out,
         size_t count) {
  using In = typename Codec::In;
  using Acc = typename Codec::Acc;
  using Out = typename Codec::Out;
  // Where Out is wider than In (bool sum, integer and bool mean) an in-place
  // output block covers input beyond its own block. Walking the blocks from
  // the end, every input block it covers has been read already.
  constexpr bool kBackwards = sizeof(Out) > sizeof(In);
  const size_t num_blocks = (count + kBlock - 1) / kBlock;
  alignas(64) Acc acc[kBlock];
  for (size_t j = 0; j < num_blocks; ++j) {
    const size_t base = (kBackwards ? num_blocks - 1 - j : j) * kBlock;
    const size_t len = std::min(kBlock, count - base);
    CombineBlock(codec, op, inputs, n, base, len, acc);
    if constexpr (std::is_same_v<Combiner, Add> &&
                  std::is_floating_point_v<Acc>) {
      // A NaN (or an infinity) anywhere in the block: sum it again with
      // XLA's NaN rule (which gives the same bits as Add wherever the sum is
      // not NaN).
      if (AnyNaNOrInf(acc, len)) {
        CombineBlock(codec, AddLastNaN{}, inputs, n, base, len, acc);
      }
    }
    if (out.count == 1 && !out.stream) {
      StoreAll(codec, acc, static_cast<Out*>(out.ptrs[0]) + base, len);
      continue;
    }
    // Several outputs (or streaming stores): convert once into a block in
    // L1, then copy that to each output.
    alignas(64) Out result[kBlock];
    StoreAll(codec, acc, result, len);
    for (int k = 0; k < out.count; ++k) {
      Out* dst = static_cast<Out*>(out.ptrs[k]) + base;
      if (out.stream) {
        StreamCopy(dst, result, len * sizeof(Out));
      } else {
        std::memcpy(dst, result, len * sizeof(Out));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Dispatch on kind, per dtype family.

template <typename T>
void ReduceInt(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
               size_t count) {
  using U = std::make_unsigned_t<T>;
  using R = std::conditional_t<sizeof(T) == 8, double, float>;
  switch (kind) {
    case ReduceKind::kSum:
      return Run(Plain<T, U>{}, Add{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(Plain<T, T>{}, IntMax{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(Plain<T, T>{}, IntMin{}, inputs, n, out, count);
    case ReduceKind::kMean:
      return Run(IntMean<T, R>{R{1} / static_cast<R>(n)}, Add{}, inputs, n,
                 out, count);
  }
}

template <typename T>
void ReduceFloat(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
                 size_t count) {
  switch (kind) {
    case ReduceKind::kSum:
      return Run(Plain<T, T>{}, Add{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(Picked<T>{}, FloatMax{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(Picked<T>{}, FloatMin{}, inputs, n, out, count);
    case ReduceKind::kMean:
      // float32: 1.0f / n in float32; float64: 1.0 / n.
      return Run(FloatMean<T>{T{1} / static_cast<T>(n)}, Add{}, inputs, n, out,
                 count);
  }
}

// float16 and bfloat16. SumOp is how the sum adds: HalfAdd (rounded per
// addition) for float16, Add (float32, rounded once) for bfloat16.
// `mean_scale` is the reciprocal 1/n the mean multiplies by, as a float.
template <typename Format, typename SumOp>
void ReduceWidened(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
                   size_t count, float mean_scale) {
  switch (kind) {
    case ReduceKind::kSum:
      return Run(Widened<Format>{}, SumOp{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(WidenedPicked<Format>{}, FloatMax{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(WidenedPicked<Format>{}, FloatMin{}, inputs, n, out, count);
    case ReduceKind::kMean:
      return Run(WidenedMean<Format>{mean_scale}, SumOp{}, inputs, n, out,
                 count);
  }
}

void ReduceBool(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
                size_t count) {
  switch (kind) {
    case ReduceKind::kSum:
      return Run(BoolCount{}, Add{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(BoolBits{}, Or{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(BoolBits{}, And{}, inputs, n, out, count);
    case ReduceKind::kMean:
      return Run(BoolMean{1.0f / static_cast<float>(n)}, Add{}, inputs, n, out,
                 count);
  }
}

// The kernels proper; a separate (not inlined) function so that no float
// operation of theirs moves across the mode switches in ReduceTo.
[[gnu::noinline]] void ReduceToInMode(ReduceKind kind, DType dt,
                                      const void* const* inputs, int n,
                                      const Outs& out, size_t count) {
  switch (dt) {
    case DType::kF32:
      return ReduceFloat<float>(kind, inputs, n, out, count);
    case DType::kF64:
      return ReduceFloat<double>(kind, inputs, n, out, count);
    case DType::kF16:
      // The mean's reciprocal is float16(1/n) (rounding 1/n to float32 first
      // gives the same float16: 24 >= 2 * 11 + 2 bits).
      return ReduceWidened<HalfFormat, HalfAdd>(
          kind, inputs, n, out, count,
          DecodeHalf(EncodeHalf(1.0f / static_cast<float>(n))));
    case DType::kBF16:
      // bfloat16's mean multiplies in float32 by float32(1/n).
      return ReduceWidened<BF16Format, Add>(kind, inputs, n, out, count,
                                            1.0f / static_cast<float>(n));
    case DType::kI8:
      return ReduceInt<int8_t>(kind, inputs, n, out, count);
    case DType::kU8:
      return ReduceInt<uint8_t>(kind, inputs, n, out, count);
    case DType::kI32:
      return ReduceInt<int32_t>(kind, inputs, n, out, count);
    case DType::kU32:
      return ReduceInt<uint32_t>(kind, inputs, n, out, count);
    case DType::kI64:
      return ReduceInt<int64_t>(kind, inputs, n, out, count);
    case DType::kU64:
      return ReduceInt<uint64_t>(kind, inputs, n, out, count);
    case DType::kBool:
      return ReduceBool(kind, inputs, n, out, count);
    case DType::kInvalid:
      return;  // callers validate; touch nothing
  }
}

}  // namespace

void Reduce(ReduceKind kind, DType dt, const void* const* inputs, int n,
            void* out, size_t count) {
  ReduceTo(kind, dt, inputs, n, &out, 1, count, /*stream=*/false);
}

void ReduceTo(ReduceKind kind, DType dt, const void* const* inputs, int n,
              void* const* outs, int num_outs, size_t count, bool stream) {
  if (n < 1 || num_outs < 1 || count == 0) return;
  const Outs out{outs, num_outs, stream};
  if (IsFloat(dt)) {
    const FlushDenormalsScope flush;
    ReduceToInMode(kind, dt, inputs, n, out, count);
  } else {
    ReduceToInMode(kind, dt, inputs, n, out, count);
  }
}

void ReduceMeshOfOne(ReduceKind kind, DType dt, const void* in, void* out,
                     size_t count) {
  switch (dt) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
      if (out != in && count > 0) std::memmove(out, in, count * DTypeSize(dt));
      return;
    case DType::kBF16: {
      const auto* src = static_cast<const uint16_t*>(in);
      auto* dst = static_cast<uint16_t*>(out);
      ForEachIndex(count, [&](size_t i) {
        const uint16_t b = src[i];
        const bool is_nan = (b & 0x7fffu) > 0x7f80u;
        dst[i] = is_nan ? static_cast<uint16_t>((b & 0x8000u) | 0x7fc0u) : b;
      });
      return;
    }
    default:
      // Integers and bool: the one-member reduction is exact (x + 0, x, and
      // for the mean x * 1) and converts the dtype as required.
      return Reduce(kind, dt, &in, 1, out, count);
  }
}

}  // namespace collectived
