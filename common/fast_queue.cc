#include "common/fast_queue.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace collectived::fastq {

namespace {

int64_t ClockNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace

int64_t MonotonicNs() { return ClockNs(CLOCK_MONOTONIC); }

int64_t CoarseMonotonicNs() { return ClockNs(CLOCK_MONOTONIC_COARSE); }

void InitHeader(Header* h) {
  h->magic = kMagic;
  h->version = kVersion;
  h->slots = kSlots;
  h->sq_slot_bytes = kSqSlotBytes;
  h->cq_slot_bytes = kCqSlotBytes;
}

bool HeaderValid(const Header* h) {
  return h->magic == kMagic && h->version == kVersion && h->slots == kSlots &&
         h->sq_slot_bytes == kSqSlotBytes && h->cq_slot_bytes == kCqSlotBytes;
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  timespec ts = absl::ToTimespec(timeout);
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace collectived::fastq
