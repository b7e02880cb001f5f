// Device-side test patterns: kernels that write and check GPU memory, so the
// GPU tests touch buffers from the device itself (not only copy engines).
#ifndef COLLECTIVED_TESTS_CUDA_PATTERN_H_
#define COLLECTIVED_TESTS_CUDA_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace collectived::testing {

// The 32-bit word `i` of pattern `seed`.
inline uint32_t PatternWord(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 29;
  return static_cast<uint32_t>(x * 0xBF58476D1CE4E5B9ull >> 32);
}

// Writes words [0, bytes/4) of pattern `seed` at device address `ptr` on the
// current device and waits for it. Empty string on success, else the error.
std::string FillPattern(void* ptr, size_t bytes, uint32_t seed);

// Counts the words at `ptr` that differ from pattern `seed` (on the device);
// -1 and `error` set when the kernel could not run.
long long CountMismatches(const void* ptr, size_t bytes, uint32_t seed, std::string* error);

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_CUDA_PATTERN_H_
