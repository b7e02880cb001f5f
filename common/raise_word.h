// Raising a 64-bit word that another process shares (stream-ordered
// submission's done words, v1::StreamSync): to a value, never lower.
//
// Thread-safety: atomic; the word may be read and written concurrently by
// any thread or process that maps it.
#ifndef COLLECTIVED_COMMON_RAISE_WORD_H_
#define COLLECTIVED_COMMON_RAISE_WORD_H_

#include <atomic>
#include <cstdint>

namespace collectived {

// *word = max(*word, value), with release order for the raise. `word` is
// 8-aligned.
inline void RaiseWord(uint64_t* word, uint64_t value) {
  std::atomic_ref<uint64_t> w(*word);
  uint64_t cur = w.load(std::memory_order_relaxed);
  while (cur < value &&
         !w.compare_exchange_weak(cur, value, std::memory_order_release,
                                  std::memory_order_relaxed)) {
  }
}

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_RAISE_WORD_H_
