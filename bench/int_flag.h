// The integer flags of the small standalone benchmarks (cache_line_pingpong,
// reduce_mode_cost), without a flags library.
#ifndef COLLECTIVED_BENCH_INT_FLAG_H_
#define COLLECTIVED_BENCH_INT_FLAG_H_

#include <cstdlib>
#include <cstring>

namespace collectived::bench {

// The value of --name=V in `arg` as an integer in [lo, hi], or -1.
inline long IntFlag(const char* arg, const char* name, long lo, long hi) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return -1;
  char* end = nullptr;
  const long v = std::strtol(arg + n + 1, &end, 10);
  return end != arg + n + 1 && *end == '\0' && v >= lo && v <= hi ? v : -1;
}

}  // namespace collectived::bench

#endif  // COLLECTIVED_BENCH_INT_FLAG_H_
