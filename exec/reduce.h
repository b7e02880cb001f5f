// Type-erased element-wise reduction kernels of the CPU executor.
//
// They compute what jax.lax computes on CPU (XLA CPU), bit for bit. The
// reduction order is fixed: each element starts from the op's identity and
// takes the members in order, acc = op(acc, in[0]); acc = op(acc, in[1]); ...
// so every run and every member sees the same bits. The kernels are
// single-threaded; callers split large arrays into chunks and run chunks on
// several threads.
//
// Thread-safety: pure functions; safe to call concurrently on disjoint outputs.
#ifndef COLLECTIVED_EXEC_REDUCE_H_
#define COLLECTIVED_EXEC_REDUCE_H_

#include <cfenv>
#include <cstddef>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "plan/op_plan.h"

namespace collectived {

// Reduces `count` elements of the `n` (>= 1) arrays `inputs[0..n)`, each of
// dtype `dt`, into `out`, of dtype ReduceResultDType(kind, dt). Per element:
//  - kSum (psum):
//    - float32/float64: acc = +0.0; acc = acc + x_k for k = 0..n-1, in the
//      type. So a sum of -0.0s is +0.0.
//    - float16: acc = +0; per member acc = f16(f32(acc) + f32(x_k)), rounded
//      to nearest even after EVERY addition (so an intermediate sum past
//      65504 overflows to inf).
//    - bfloat16: acc = +0.0f in float32; acc = acc + f32(x_k) per member; one
//      rounding to bfloat16 (nearest even) at the end.
//    - NaN results (as XLA on CPU): float32/float64/bfloat16 keep the NaN of
//      the LAST member holding one, quieted (float32/float64: sign and
//      payload kept, 0x7f800001 gives 0x7fc00001; 0x7fc00001 then 0xffc00002
//      gives 0xffc00002); float16 keeps the FIRST NaN of the accumulator.
//      With no NaN member, inf + -inf gives x86's default NaN, sign set
//      (0xffc00000, 0xfff8000000000000), which a later NaN member replaces
//      (float16: which stays). float16 and bfloat16 NaN results are
//      canonical: sign | 0x7e00, sign | 0x7fc0 (payload dropped).
//    - integers wrap (two's complement); bool counts the nonzero bytes, as
//      int32.
//  - kMax/kMin (pmax/pmin), floats: acc = -inf (max) / +inf (min); per member
//    in order, if (x_k > acc) acc = x_k (max) / if (x_k < acc) acc = x_k
//    (min). So a NaN never wins (an all-NaN element gives -inf / +inf), and
//    between -0.0 and +0.0 the EARLIER member's zero is kept (max(-0, +0) =
//    -0, max(+0, -0) = +0; min likewise). float16/bfloat16 compare as float32
//    (exact) and give the winning input's bits, or the +-inf bits when no
//    member beat the identity. Integers: max/min; bool: or/and (any nonzero
//    byte is true; the result is 0 or 1).
//  - kMean (pmean): s = the kSum result in the input dtype (integers wrapped,
//    float16 rounded per addition, bfloat16 rounded once; NaNs as kSum's),
//    converted to the result dtype and MULTIPLIED by the reciprocal of n
//    (XLA rewrites x / n as x * (1/n)); it is not divided by n:
//    - float32: s * (1.0f / n), the reciprocal rounded to float32;
//    - float64: s * (1.0 / n);
//    - float16: f16(f32(s) * f32(f16(1/n))), the reciprocal rounded to
//      float16 first;
//    - bfloat16: bf16(f32(s) * (1.0f / n)), the reciprocal in float32;
//    - bool, int8, uint8, int32, uint32: float32(s) * (1.0f / n); int64,
//      uint64: float64(s) * (1.0 / n) (s the wrapped integer sum; the bool
//      count as int32).
//    E.g. uint8 values summing to 218 over n = 3 give 218 * f32(1/3) =
//    0x42915556, not 218 / 3 = 0x42915555.
// float8_e4m3fn / float8_e5m2: XLA on CPU runs float8 collectives in
// float16 (each operand converted to float16, exactly; the float16 result
// converted back, rounded to nearest even), so every kind follows the
// float16 rules above and rounds to float8 at the end:
//  - kSum: f8(the float16 sum, rounded to float16 after EVERY addition); so
//    an intermediate sum may exceed the float8 range and come back (e4m3fn:
//    448 + 448 - 448 = 448), and the result is not the per-step float8 sum;
//  - kMean: f8(f16(f16(f8(s)) * f16(1/n))), s the float16 sum (the product
//    rounded to float16, then to float8);
//  - kMax/kMin: the float16 rule, exact; an all-NaN element gives -inf/+inf,
//    which float8_e4m3fn encodes as its NaN (0xff / 0x7f);
//  - never flushed (float8 values are normal float32 numbers);
//  - NaN results: the float16 NaN of the sum (first NaN of the accumulator,
//    or the default NaN, sign set, for inf + -inf) converted: float8_e4m3fn
//    sign | 0x7f; float8_e5m2 0x7f whatever the sign (XLA's conversion);
//  - float8_e4m3fn overflow (a result rounding above 448) is NaN, sign kept;
//    float8_e5m2 overflow (from 61440) is +-inf.
// Subnormals, float32/float64/bfloat16 (XLA on CPU runs with flush-to-zero
// and denormals-are-zero, and so do the kernels):
//  - a subnormal input reads as a zero of its sign, for every kind: so
//    max(-0.0, 2^-149) is the earlier member's -0.0, and a subnormal that
//    wins max/min comes out as that zero;
//  - an arithmetic result (each addition of a sum, bfloat16's float32
//    additions included; the mean's product) that is below the smallest
//    normal after rounding to the type's precision with an unbounded
//    exponent is a zero of its sign: 2^-126 + -1.5 * 2^-126 = -0.0.
//  So six members each holding 2^-149 (0x00000001) sum to +0.0. float16 is
//  computed in float32, where its subnormals are normal numbers: nothing is
//  flushed (six times 0x0001 sum to 0x0006).
//  Reduce/ReduceTo set the mode on the calling thread for the duration of
//  the call and restore the caller's before returning (MXCSR FTZ|DAZ on x86,
//  FPCR.FZ on AArch64), whichever thread runs them. Elsewhere the kernels
//  flush in software, with the same bits (reduce_ops.h, which also holds the
//  per-element rules above, shared with the CUDA kernels).
// `out` may be exactly one of the inputs (same pointer, in place); it must not
// otherwise overlap them.
void Reduce(ReduceKind kind, DType dt, const void* const* inputs, int n,
            void* out, size_t count);

// Reduce, writing the result to each of `outs[0..num_outs)` (each may be
// exactly one of the inputs, as `out` above; they must not otherwise overlap
// each other or the inputs). The inputs are read once: the result is
// computed a block at a time in L1 and copied out. With `stream`, outputs are
// written with non-temporal stores (see stream_copy.h). `part` makes it one
// part of a longer fold (below).
struct FoldPart {
  // inputs[0] is the accumulator of the members before (a partial result
  // of this kind and dtype), taken as it is: float32/float64 sums and means
  // do not add it to +0.0 first (which would turn a -0.0, a negative sum
  // flushed to zero, into +0.0). Every other kind and dtype continues
  // exactly from its partial anyway (max/min keep bits; float16 sums cannot
  // give -0.0; integers wrap).
  bool continues = false;
  // kMean: the n of the reciprocal the sum is multiplied by (0: n).
  int mean_n = 0;
};
void ReduceTo(ReduceKind kind, DType dt, const void* const* inputs, int n,
              void* const* outs, int num_outs, size_t count, bool stream, FoldPart part = {});

// Round to nearest, every floating-point exception masked (the daemon's
// threads run so), set on the calling thread for the scope's life and
// restored after. Usually the thread's already: on x86 MXCSR is then only
// read (a write to it costs more than the read).
class DefaultFpScope {
 public:
#if defined(__SSE__)
  DefaultFpScope() : saved_(_mm_getcsr()) {
    if (saved_ != kDefaultMxcsr) _mm_setcsr(kDefaultMxcsr);
  }
  ~DefaultFpScope() {
    if (saved_ != kDefaultMxcsr) _mm_setcsr(saved_);
  }
#else
  DefaultFpScope() : saved_(std::fegetenv(&env_) == 0) { std::fesetenv(FE_DFL_ENV); }
  ~DefaultFpScope() {
    if (saved_) std::fesetenv(&env_);
  }
#endif
  DefaultFpScope(const DefaultFpScope&) = delete;
  DefaultFpScope& operator=(const DefaultFpScope&) = delete;

 private:
#if defined(__SSE__)
  static constexpr unsigned int kDefaultMxcsr = 0x1f80;
  const unsigned int saved_;
#else
  std::fenv_t env_;
  const bool saved_;
#endif
};

// The floating-point mode the reductions run in (round to nearest, every
// exception masked, flush-to-zero and denormals-are-zero: XLA's on CPU), set
// on the calling thread for the scope's life and restored after, with the
// thread's status flags (those raised inside are dropped). ReduceTo of a
// float dtype, called on this thread inside it, runs in it without switching
// the mode itself. On x86 a scope on a thread in another mode reads MXCSR
// once and writes it twice, where each ReduceTo outside a scope reads it
// twice and writes it twice; on an AMD EPYC (Zen 4) a read costs about 6 ns,
// a read and two writes about 10. Elsewhere it is a DefaultFpScope, and
// ReduceTo still sets flush-to-zero itself. For a thread whose mode is not the
// project's own: the SDK runs member-side ops on its caller's thread.
class ReductionModeScope {
 public:
  ReductionModeScope();
  ~ReductionModeScope();
  ReductionModeScope(const ReductionModeScope&) = delete;
  ReductionModeScope& operator=(const ReductionModeScope&) = delete;

 private:
#if defined(__SSE__)
  const unsigned int saved_;
  const bool outer_;  // the thread was in no scope before
#else
  const DefaultFpScope default_;
#endif
};

// What psum/pmean/pmax/pmin (`kind`) return in a mesh of ONE member: JAX
// runs such a program on one device, where XLA drops the all-reduce, so no
// arithmetic happens at all. `out` (ReduceResultDType(kind, dt)) gets the
// input `in` converted:
//  - float32, float64, float16: every bit kept (-0.0 stays -0.0, signaling
//    NaNs stay signaling, subnormals stay; pmax of a NaN is that NaN);
//  - bfloat16: every bit kept except that a NaN becomes sign | 0x7fc0 (XLA
//    on CPU converts bfloat16 to float32 and back around the collective);
//  - float8_e4m3fn: every bit kept (its NaNs survive the round trip through
//    float16); float8_e5m2: every bit kept except that a NaN becomes 0x7f,
//    sign dropped (XLA's float16 -> float8_e5m2 conversion);
//  - integers: kept, and for kMean converted to float32 (int8, uint8, int32,
//    uint32) or float64 (int64, uint64), rounded to nearest even;
//  - bool (any nonzero byte is true): kSum gives int32 0/1, kMax/kMin 0/1,
//    kMean float32 0.0/1.0.
// This is NOT Reduce with n = 1, which is what a group of one member inside
// a bigger mesh gets (XLA runs that all-reduce: from the identity, flushing
// subnormals, quieting NaNs), and what psum_scatter always gets.
// `out` may be `in` (in place); otherwise they must not overlap.
void ReduceMeshOfOne(ReduceKind kind, DType dt, const void* in, void* out,
                     size_t count);

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_REDUCE_H_
