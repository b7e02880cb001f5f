// The fast path: a per-session op queue in shared memory with futex doorbells.
//
// A client that opens the fast path (side-socket request "QUEUE") gets a
// memfd holding one Queue: a header, a submission ring (SQ) and a completion
// ring (CQ), each of kSlots fixed-size slots. The client writes a serialized
// v1::OpSpec into the next SQ slot and publishes it by advancing sq_tail; a
// daemon thread dedicated to the session takes entries in order, submits each
// to the engine exactly as the gRPC Execute stream does, and advances sq_head.
// When an op completes, the daemon writes its outcome into the next CQ slot
// and advances cq_tail; the client consumes it and advances cq_head.
//
// Ownership of the words: sq_tail, cq_head, daemon_bell (increments) are
// written by the client; sq_head, cq_tail, client_bell, closed by the daemon.
// The daemon treats everything in the region as untrusted: it keeps its own
// copies of the counters it owns, copies an SQ entry out before parsing it,
// and stops serving a queue whose counters are impossible.
//
// Credit: the daemon takes an SQ entry only while fewer than kSlots
// completions are outstanding (taken and not yet consumed by the client), so
// every completion has a CQ slot and the daemon never waits on the client.
//
// Doorbells (no lost wake-ups): a side that has nothing to do spins for a
// while, then sets its `*_sleeping` word, re-checks its condition and sleeps
// on its `*_bell` futex. The other side publishes its counter, then reads
// `*_sleeping` and, if set, increments the bell and wakes it. Both sides use
// sequentially consistent stores and loads for the counters, `closed` and
// `*_sleeping` (on x86 the stores are xchg, a full barrier), so at least one
// side sees the other's store: either the publisher sees the sleeper, or the
// sleeper sees the new counter before it sleeps. The futexes are shared (not
// FUTEX_PRIVATE): two processes map them.
#ifndef COLLECTIVED_COMMON_FAST_QUEUE_H_
#define COLLECTIVED_COMMON_FAST_QUEUE_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include <sched.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace collectived::fastq {

inline constexpr uint32_t kMagic = 0x31514643;  // "CFQ1"
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kSlots = 64;           // per ring; a power of two
inline constexpr uint32_t kSqSlotBytes = 4096;   // one serialized OpSpec per slot
inline constexpr uint32_t kCqSlotBytes = 1024;
inline constexpr int kMaxRank = 16;              // out_shape dimensions in a CQ entry

// Waiters poll (see SpinThenSleep) only for ops whose input is at most this
// big: for a bigger op a futex wake-up (tens of microseconds) is a small part
// of its time, and polling would take CPU from the threads executing it.
// (On a 2-core VM, polling up to 4 MiB rather than 256 KiB took 2-member
// psum and all_gather of 1 MiB from about 350 to 190 us, and changed nothing
// at 4 MiB.)
inline constexpr uint64_t kSpinOpBytes = 4 * 1024 * 1024;

// Whether a waiter polls for an op whose input has `shape` (any range of
// int64 dimensions) and elements of `element_bytes`: the input is at most
// kSpinOpBytes. Negative or overflowing shapes count as big.
template <typename Dims>
bool PollsFor(uint64_t element_bytes, const Dims& shape) {
  uint64_t bytes = element_bytes;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return false;
  }
  return bytes <= kSpinOpBytes;
}

// One counter per cache line, so the two sides do not share lines they write.
struct alignas(64) Word {
  std::atomic<uint32_t> v{0};
};

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t sq_slot_bytes;
  uint32_t cq_slot_bytes;
  alignas(64) Word sq_tail;          // client: entries published
  Word sq_head;                      // daemon: entries taken (submitted to the engine)
  Word cq_tail;                      // daemon: completions published
  Word cq_head;                      // client: completions consumed
  Word daemon_bell;                  // futex the daemon's queue thread sleeps on
  Word daemon_sleeping;              // nonzero while it sleeps (or is about to)
  Word client_bell;                  // futex a waiting client thread sleeps on
  Word client_sleeping;
  Word closed;                       // nonzero once the daemon stopped serving
};

// Times are CLOCK_MONOTONIC nanoseconds (one clock for every process of the
// host), kept so that a client can tell where an op's time went.
struct SqEntry {
  uint64_t tag;   // chosen by the client, echoed in the completion
  uint32_t len;   // bytes of the serialized OpSpec in data
  uint32_t reserved;
  int64_t submit_ns;  // when the client published the entry
  uint8_t data[kSqSlotBytes - 24];
};
inline constexpr size_t kMaxOpBytes = sizeof(SqEntry::data);

struct CqEntry {
  uint64_t tag;
  int64_t sequence;
  int32_t code;       // absl::StatusCode
  int32_t out_dtype;  // v1::DType number
  int32_t rank;       // dimensions in out_shape (<= kMaxRank)
  uint32_t msg_len;   // bytes of msg (truncated to fit)
  int64_t taken_ns;    // the daemon's queue thread took the entry
  int64_t started_ns;  // the op began executing (0 if it never did)
  int64_t done_ns;     // the daemon published this completion
  int64_t bytes_read;      // memory the executor moved for the op, all members
  int64_t bytes_written;
  int64_t bytes_required;  // the least the op needs
  // Stages between taken and done (the daemon's OpStamps; 0: not reached,
  // or not known): its turn came, its inputs were ready, a GPU op's
  // launches were done, the executor returned; device_ns is a duration
  // (a GPU op's time on its stream, between two events).
  int64_t matched_ns;
  int64_t ready_ns;
  int64_t launched_ns;
  int64_t executed_ns;
  int64_t device_ns;
  int64_t out_shape[kMaxRank];
  char msg[kCqSlotBytes - 120 - 8 * kMaxRank];
};

static_assert(sizeof(Header) <= 4096);
static_assert(sizeof(SqEntry) == kSqSlotBytes);
static_assert(sizeof(CqEntry) == kCqSlotBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

inline constexpr size_t kSqOffset = 4096;
inline constexpr size_t kCqOffset = kSqOffset + size_t{kSlots} * kSqSlotBytes;
inline constexpr size_t kQueueBytes = kCqOffset + size_t{kSlots} * kCqSlotBytes;

// Views of a mapped queue region of kQueueBytes.
struct QueueView {
  Header* header = nullptr;
  SqEntry* sq = nullptr;
  CqEntry* cq = nullptr;

  static QueueView Of(void* base) {
    auto* b = static_cast<uint8_t*>(base);
    return QueueView{reinterpret_cast<Header*>(b), reinterpret_cast<SqEntry*>(b + kSqOffset),
                     reinterpret_cast<CqEntry*>(b + kCqOffset)};
  }
};

// CLOCK_MONOTONIC in nanoseconds.
int64_t MonotonicNs();
// The same clock as of the last timer tick (CLOCK_MONOTONIC_COARSE: up to a
// tick, a few milliseconds, behind MonotonicNs, never ahead), for a fifth of
// the cost: for stamps that only diagnostics and millisecond checks read.
int64_t CoarseMonotonicNs();

// Writes a fresh header into a zeroed region.
void InitHeader(Header* h);
// Whether `h` describes a queue this code can use.
bool HeaderValid(const Header* h);

// Wakes every thread sleeping on `word` (any process).
void FutexWake(std::atomic<uint32_t>* word);
// Sleeps while *word == expected, at most `timeout`; spurious returns happen.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

// The publishing side's half of the doorbell: call after publishing a
// counter with a seq_cst store. One load when nobody sleeps.
inline void Ring(Word& bell, Word& sleeping) {
  if (sleeping.v.load(std::memory_order_seq_cst) != 0) {
    bell.v.fetch_add(1, std::memory_order_seq_cst);
    FutexWake(&bell.v);
  }
}

// The waiting side's half: polls ready() for up to `spin`, then sleeps on
// `bell` in slices of at most `slice` until ready() or `deadline`. Returns
// ready() (false at the deadline). `idle()` runs between sleeps (e.g. to
// check that the peer is alive) and stops the wait when it returns false.
//
// The poll loop yields the CPU on every turn. An op needs a client, the
// daemon's queue thread and the other members to run in turn; with fewer
// cores than those threads (2 members and the daemon on 2 cores already), a
// pure busy-wait would hold the core the next thread in line needs, while
// sleeping costs a futex wake-up per hand-off (tens of microseconds when the
// woken CPU was idle, in a VM). Yielding keeps every core busy, so a hand-off
// is a run-queue switch, and gives the core to whoever has work.
template <typename Ready, typename Idle>
bool SpinThenSleep(Word& bell, Word& sleeping, Ready ready, Idle idle, absl::Duration spin,
                   absl::Duration slice, absl::Time deadline) {
  if (ready()) return true;
  if (spin > absl::ZeroDuration()) {
    const absl::Time spin_end = std::min(absl::Now() + spin, deadline);
    for (int i = 1;; ++i) {
      sched_yield();
      if (ready()) return true;
      if ((i & 63) == 0 && absl::Now() >= spin_end) break;
    }
  }
  for (;;) {
    sleeping.v.store(1, std::memory_order_seq_cst);
    const uint32_t b = bell.v.load(std::memory_order_seq_cst);
    if (ready()) {
      sleeping.v.store(0, std::memory_order_relaxed);
      return true;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      sleeping.v.store(0, std::memory_order_relaxed);
      return false;
    }
    FutexWait(&bell.v, b, std::min(slice, deadline - now));
    sleeping.v.store(0, std::memory_order_relaxed);
    if (ready()) return true;
    if (!idle()) return ready();
  }
}

}  // namespace collectived::fastq

#endif  // COLLECTIVED_COMMON_FAST_QUEUE_H_
