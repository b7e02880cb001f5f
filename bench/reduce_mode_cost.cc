// reduce_mode_cost: what the floating-point mode switch adds to one small
// reduction on this CPU (the kernels run with flush-to-zero, and the SDK runs
// member-side reductions on its caller's thread, whose mode is its own).
//
//   reduce_mode_cost [--iters=N] [--reps=N]
//
// For float32 sums of two inputs of 4 to 4096 elements, the time of one call,
// the best of `reps` loops of `iters` calls, three ways:
//   switch:  ReduceTo alone, setting and restoring the mode itself (as on the
//            daemon's threads);
//   sdk-old: a read of the mode first and then ReduceTo (the SDK before
//            ReductionModeScope: DefaultFpScope, then the kernels' own switch);
//   scope:   ReduceTo inside a ReductionModeScope (the SDK now).
// Per call, in ns; the ratio is sdk-old over scope.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/int_flag.h"
#include "exec/reduce.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace {

using collectived::bench::IntFlag;

using collectived::DType;
using collectived::ReduceKind;
using collectived::ReduceTo;
using collectived::ReductionModeScope;


enum class Way { kSwitch, kSdkOld, kScope };

// Two inputs and an output, the same for every way (where they lie
// changes the time of the larger sums by more than the switch costs).
struct Arrays {
  explicit Arrays(size_t count) : a(count, 1.5f), b(count, 2.25f), out(count) {}
  std::vector<float> a, b, out;
};

// The best of `reps` loops of `iters` calls, ns per call.
double Time(Way way, Arrays& arrays, long iters, long reps) {
  const size_t count = arrays.out.size();
  std::vector<float>& out = arrays.out;
  const void* in[2] = {arrays.a.data(), arrays.b.data()};
  void* outs[1] = {out.data()};
  double best = 1e300;
  for (long r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; ++i) {
      switch (way) {
        case Way::kSwitch:
          ReduceTo(ReduceKind::kSum, DType::kF32, in, 2, outs, 1, count, false);
          break;
        case Way::kSdkOld: {
#if defined(__SSE__)
          volatile unsigned int mode = _mm_getcsr();
          (void)mode;
#endif
          ReduceTo(ReduceKind::kSum, DType::kF32, in, 2, outs, 1, count, false);
          break;
        }
        case Way::kScope: {
          const ReductionModeScope scope;
          ReduceTo(ReduceKind::kSum, DType::kF32, in, 2, outs, 1, count, false);
          break;
        }
      }
      asm volatile("" : : "r"(out.data()) : "memory");
    }
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() /
                              static_cast<double>(iters));
  }
  if (out[0] != 3.75f) {
    std::fprintf(stderr, "reduce_mode_cost: wrong sum %g\n", static_cast<double>(out[0]));
    std::exit(1);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  long iters = 200000, reps = 5;
  for (int i = 1; i < argc; ++i) {
    long v;
    if ((v = IntFlag(argv[i], "--iters", 1, 100000000)) > 0) {
      iters = v;
    } else if ((v = IntFlag(argv[i], "--reps", 1, 1000)) > 0) {
      reps = v;
    } else {
      std::fprintf(stderr,
                   "reduce_mode_cost: bad argument %s\n"
                   "usage: reduce_mode_cost [--iters=N (1..100000000, default 200000)] "
                   "[--reps=N (1..1000, default 5)]\n",
                   argv[i]);
      return 2;
    }
  }
  std::printf("# float32 sum of 2 inputs, ns per call, best of %ld loops of %ld calls\n", reps,
              iters);
  std::printf("%8s %10s %10s %10s %14s\n", "count", "switch", "sdk-old", "scope",
              "sdk-old/scope");
  for (size_t count : {4, 16, 64, 256, 1024, 4096}) {
    Arrays arrays(count);
    const double sw = Time(Way::kSwitch, arrays, iters, reps);
    const double old = Time(Way::kSdkOld, arrays, iters, reps);
    const double scope = Time(Way::kScope, arrays, iters, reps);
    std::printf("%8zu %10.1f %10.1f %10.1f %14.2f\n", count, sw, old, scope, old / scope);
  }
  return 0;
}
