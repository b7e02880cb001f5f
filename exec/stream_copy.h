// Copies for results that are written once and not read again soon.
//
// StreamCopy writes with non-temporal (streaming) stores: the destination's
// cache lines are not read first (no read-for-ownership), which halves the
// memory traffic of writing a large result, and the result does not evict the
// inputs still to be read. Used for outputs of at least
// CpuExecutorOptions::stream_bytes; small results go through the cache, where
// the client will read them.
//
// Thread-safety: pure functions. Each call ends with a store fence, so the
// data is visible to whoever the calling thread signals afterwards.
#ifndef COLLECTIVED_EXEC_STREAM_COPY_H_
#define COLLECTIVED_EXEC_STREAM_COPY_H_

#include <emmintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace collectived {

inline void StreamCopy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  // Head up to 16-byte alignment of the destination, by plain stores.
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t body = bytes / 64 * 64;
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + body, s + body, bytes - body);
  _mm_sfence();
}

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_STREAM_COPY_H_
