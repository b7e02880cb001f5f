// Type-erased element-wise reduction kernels of the CPU executor.
//
// The reduction order is fixed: out = ((in[0] op in[1]) op in[2]) ... so every
// run and every member sees the same bits. The kernels are single-threaded;
// callers split large arrays into chunks and run chunks on several threads.
//
// Thread-safety: pure functions; safe to call concurrently on disjoint outputs.
#ifndef COLLECTIVED_DAEMON_EXEC_REDUCE_H_
#define COLLECTIVED_DAEMON_EXEC_REDUCE_H_

#include <cstddef>

#include "daemon/exec/dtype.h"

namespace collectived {

enum class ReduceKind { kSum, kMax, kMin, kMean };

// The dtype of the result of reducing `dt` with `kind`, as jax.lax defines it:
//  - kSum/kMax/kMin keep the dtype, except kSum of bool which is int32 (psum
//    counts the true values);
//  - kMean of a float type keeps it; of bool, int8/16/32 and uint8/16/32 it is
//    float32; of int64/uint64 it is float64.
DType ReduceResultDType(ReduceKind kind, DType dt);

// Reduces `count` elements of the `n` (>= 1) arrays `inputs[0..n)`, each of
// dtype `dt`, into `out`, of dtype ReduceResultDType(kind, dt).
//  - kSum: floats add in order; float16/bfloat16 accumulate in float32 and are
//    rounded once at the end; integers wrap (two's complement); bool counts.
//  - kMax/kMin: floats propagate NaN and order -0 < +0; bool is or/and.
//  - kMean: the kSum result (in the input dtype, wrapping for integers,
//    rounded for f16/bf16) converted to the result dtype and divided by n
//    in that dtype — what jax.lax.pmean computes.
// `out` may be exactly one of the inputs (same pointer, in place); it must not
// otherwise overlap them.
void Reduce(ReduceKind kind, DType dt, const void* const* inputs, int n,
            void* out, size_t count);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_EXEC_REDUCE_H_
