#include "exec/reduce.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "exec/reduce_ops.h"
#include "exec/stream_copy.h"
#include "collectived/dtype.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

// The codecs and combiners (the per-element rules) live in reduce_ops.h,
// shared with the CUDA kernels; this file has the CPU's block loops, its
// dispatch and the floating-point mode they run in (CpuEnv).
//
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
// No known control register: the kernels flush (and apply x86's NaN rules)
// in software instead, with the same bits (reduce_ops.h: SoftwareEnv).
constexpr bool kHardwareFlush = false;
class FlushDenormalsScope {
 public:
  FlushDenormalsScope() {}
};
#endif

// Whether this thread is inside a ReductionModeScope (x86 only: elsewhere
// the scope leaves flush-to-zero to ReduceTo).
#if defined(__SSE__)
thread_local bool t_in_reduction_mode = false;
constexpr unsigned int kReductionMxcsr = 0x1f80u | 0x8000u | 0x0040u;
bool InReductionMode() { return t_in_reduction_mode; }
#else
bool InReductionMode() { return false; }
#endif

// The element-wise rules (reduce_ops.h) in the environment this sets up.
using namespace reduce_ops;  // NOLINT: the codecs and combiners
static_assert(kHardwareFlush == !CpuEnv::kSoftware,
              "reduce_ops.h's CpuEnv must match the flush mode set here");

// Where Run writes each result block: `count` outputs, through the cache or
// with streaming stores.
struct Outs {
  void* const* ptrs;
  int count;
  bool stream;
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

// A fold that continues from a partial result (FoldPart::continues):
// inputs[0] is the accumulator of the members before, taken as it is. Add's
// First would add it to +0.0, which turns a -0.0 (a flushed negative sum)
// into +0.0.
template <typename Op>
struct Continued : Op {
  template <typename T>
  COLLECTIVED_HD T First(T x) const {
    return x;
  }
};

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
    !((std::is_same_v<Combiner, AddLastNaN<CpuEnv>> ||
       std::is_same_v<Combiner, Continued<AddLastNaN<CpuEnv>>>) &&
      std::is_same_v<Acc, double>);

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
    if constexpr (std::is_same_v<Combiner, Add<CpuEnv>> &&
                  std::is_floating_point_v<Acc>) {
      // A NaN (or an infinity) anywhere in the block: sum it again with
      // XLA's NaN rule (which gives the same bits as Add wherever the sum is
      // not NaN).
      if (AnyNaNOrInf(acc, len)) {
        CombineBlock(codec, AddLastNaN<CpuEnv>{}, inputs, n, base, len, acc);
      }
    } else if constexpr (std::is_same_v<Combiner, Continued<Add<CpuEnv>>> &&
                         std::is_floating_point_v<Acc>) {
      if (AnyNaNOrInf(acc, len)) {
        CombineBlock(codec, Continued<AddLastNaN<CpuEnv>>{}, inputs, n, base, len, acc);
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
               size_t count, int m) {
  using U = std::make_unsigned_t<T>;
  using R = std::conditional_t<sizeof(T) == 8, double, float>;
  switch (kind) {
    case ReduceKind::kSum:
      return Run(Plain<T, U>{}, Add<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(Plain<T, T>{}, IntMax{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(Plain<T, T>{}, IntMin{}, inputs, n, out, count);
    case ReduceKind::kMean:
      return Run(IntMean<T, R>{R{1} / static_cast<R>(m)}, Add<CpuEnv>{}, inputs, n,
                 out, count);
  }
}

template <typename T>
void ReduceFloat(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
                 size_t count, int m, bool continues) {
  if (continues && (kind == ReduceKind::kSum || kind == ReduceKind::kMean)) {
    if (kind == ReduceKind::kSum) {
      return Run(Plain<T, T>{}, Continued<Add<CpuEnv>>{}, inputs, n, out, count);
    }
    return Run(FloatMean<T, CpuEnv>{T{1} / static_cast<T>(m)}, Continued<Add<CpuEnv>>{}, inputs,
               n, out, count);
  }
  switch (kind) {
    case ReduceKind::kSum:
      return Run(Plain<T, T>{}, Add<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(Picked<T>{}, FloatMax<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(Picked<T>{}, FloatMin<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMean:
      // float32: 1.0f / m in float32; float64: 1.0 / m.
      return Run(FloatMean<T, CpuEnv>{T{1} / static_cast<T>(m)}, Add<CpuEnv>{}, inputs, n, out,
                 count);
  }
}

// float16, bfloat16 and float8. SumOp is how the sum adds: HalfAdd (rounded
// per addition to float16) for float16 and float8, Add (float32, rounded
// once) for bfloat16. `mean` is the mean's codec (WidenedMean, F8Mean) with
// the reciprocal 1/n it multiplies by.
template <typename Format, typename SumOp, typename MeanCodec>
void ReduceWidened(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
                   size_t count, MeanCodec mean) {
  switch (kind) {
    case ReduceKind::kSum:
      return Run(Widened<Format>{}, SumOp{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(WidenedPicked<Format>{}, FloatMax<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(WidenedPicked<Format>{}, FloatMin<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMean:
      return Run(mean, SumOp{}, inputs, n, out, count);
  }
}

void ReduceBool(ReduceKind kind, const void* const* inputs, int n, const Outs& out,
                size_t count, int m) {
  switch (kind) {
    case ReduceKind::kSum:
      return Run(BoolCount{}, Add<CpuEnv>{}, inputs, n, out, count);
    case ReduceKind::kMax:
      return Run(BoolBits{}, Or{}, inputs, n, out, count);
    case ReduceKind::kMin:
      return Run(BoolBits{}, And{}, inputs, n, out, count);
    case ReduceKind::kMean:
      return Run(BoolMean{MeanScaleF32(m)}, Add<CpuEnv>{}, inputs, n, out,
                 count);
  }
}

// The kernels proper; a separate (not inlined) function so that no float
// operation of theirs moves across the mode switches in ReduceTo.
// `m` is the n of the mean's reciprocal; `continues`: FoldPart::continues.
[[gnu::noinline]] void ReduceToInMode(ReduceKind kind, DType dt,
                                      const void* const* inputs, int n,
                                      const Outs& out, size_t count, int m, bool continues) {
  switch (dt) {
    case DType::kF32:
      return ReduceFloat<float>(kind, inputs, n, out, count, m, continues);
    case DType::kF64:
      return ReduceFloat<double>(kind, inputs, n, out, count, m, continues);
    case DType::kF16:
      // The mean's reciprocal is float16(1/n) (rounding 1/n to float32 first
      // gives the same float16: 24 >= 2 * 11 + 2 bits).
      return ReduceWidened<HalfFormat, HalfAdd<CpuEnv>>(
          kind, inputs, n, out, count, WidenedMean<HalfFormat, CpuEnv>{MeanScaleF16(m)});
    case DType::kBF16:
      // bfloat16's mean multiplies in float32 by float32(1/n).
      return ReduceWidened<BF16Format, Add<CpuEnv>>(
          kind, inputs, n, out, count, WidenedMean<BF16Format, CpuEnv>{MeanScaleF32(m)});
    case DType::kF8E4M3FN:
      // float8 is reduced as float16 (reduce_ops.h: F8E4M3FNFormat).
      return ReduceWidened<F8E4M3FNFormat, HalfAdd<CpuEnv>>(
          kind, inputs, n, out, count, F8Mean<F8E4M3FNFormat, CpuEnv>{MeanScaleF16(m)});
    case DType::kF8E5M2:
      return ReduceWidened<F8E5M2Format, HalfAdd<CpuEnv>>(
          kind, inputs, n, out, count, F8Mean<F8E5M2Format, CpuEnv>{MeanScaleF16(m)});
    case DType::kI8:
      return ReduceInt<int8_t>(kind, inputs, n, out, count, m);
    case DType::kU8:
      return ReduceInt<uint8_t>(kind, inputs, n, out, count, m);
    case DType::kI32:
      return ReduceInt<int32_t>(kind, inputs, n, out, count, m);
    case DType::kU32:
      return ReduceInt<uint32_t>(kind, inputs, n, out, count, m);
    case DType::kI64:
      return ReduceInt<int64_t>(kind, inputs, n, out, count, m);
    case DType::kU64:
      return ReduceInt<uint64_t>(kind, inputs, n, out, count, m);
    case DType::kBool:
      return ReduceBool(kind, inputs, n, out, count, m);
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
              void* const* outs, int num_outs, size_t count, bool stream, FoldPart part) {
  const int m = part.mean_n > 0 ? part.mean_n : n;
  const bool continues = part.continues;
  if (n < 1 || num_outs < 1 || count == 0) return;
  const Outs out{outs, num_outs, stream};
  if (IsFloat(dt) && !InReductionMode()) {
    const FlushDenormalsScope flush;
    ReduceToInMode(kind, dt, inputs, n, out, count, m, continues);
  } else {
    ReduceToInMode(kind, dt, inputs, n, out, count, m, continues);
  }
}

#if defined(__SSE__)
ReductionModeScope::ReductionModeScope()
    : saved_(_mm_getcsr()), outer_(!t_in_reduction_mode) {
  if (saved_ != kReductionMxcsr) _mm_setcsr(kReductionMxcsr);
  t_in_reduction_mode = true;
}

ReductionModeScope::~ReductionModeScope() {
  t_in_reduction_mode = !outer_;
  if (saved_ != kReductionMxcsr || _mm_getcsr() != saved_) _mm_setcsr(saved_);
}
#else
ReductionModeScope::ReductionModeScope() = default;
ReductionModeScope::~ReductionModeScope() = default;
#endif

void ReduceMeshOfOne(ReduceKind kind, DType dt, const void* in, void* out,
                     size_t count) {
  switch (dt) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kF8E4M3FN:
      if (out != in && count > 0) std::memmove(out, in, count * DTypeSize(dt));
      return;
    case DType::kF8E5M2: {
      // XLA's round trip through float16 makes every NaN 0x7f.
      const auto* src = static_cast<const uint8_t*>(in);
      auto* dst = static_cast<uint8_t*>(out);
      ForEachIndex(count, [&](size_t i) { dst[i] = CanonicalizeF8E5M2NaN(src[i]); });
      return;
    }
    case DType::kBF16: {
      const auto* src = static_cast<const uint16_t*>(in);
      auto* dst = static_cast<uint16_t*>(out);
      ForEachIndex(count, [&](size_t i) { dst[i] = CanonicalizeBF16NaN(src[i]); });
      return;
    }
    default:
      // Integers and bool: the one-member reduction is exact (x + 0, x, and
      // for the mean x * 1) and converts the dtype as required.
      return Reduce(kind, dt, &in, 1, out, count);
  }
}

}  // namespace collectived
