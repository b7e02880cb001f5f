// Unit tests of the fast-path queue layout and of its doorbell protocol
// (common/fast_queue.h). Threads and std::atomic only (no processes), so that
// they also run under ThreadSanitizer. Every wait has a deadline: a lost
// wake-up fails the test instead of hanging it.
#include "common/fast_queue.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace collectived::fastq {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kUnderTsan = true;
#else
constexpr bool kUnderTsan = false;
#endif
#else
constexpr bool kUnderTsan = false;
#endif

// Byte offset of `member` inside `base`.
template <typename T, typename M>
size_t OffsetOf(const T& base, const M& member) {
  return static_cast<size_t>(reinterpret_cast<const char*>(&member) -
                             reinterpret_cast<const char*>(&base));
}

// ---------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------

TEST(FastQueueLayoutTest, SizesAndOffsetsAreTheDocumentedOnes) {
  // The two processes map the same bytes: every number here is wire format.
  EXPECT_EQ(kMagic, 0x31514643u);
  EXPECT_EQ(kVersion, 3u);
  EXPECT_EQ(kSlots, 64u);
  EXPECT_EQ(kSlots & (kSlots - 1), 0u) << "kSlots must be a power of two";
  EXPECT_EQ(kSqSlotBytes, 4096u);
  EXPECT_EQ(kCqSlotBytes, 1024u);

  EXPECT_EQ(sizeof(Word), 64u);
  EXPECT_EQ(alignof(Word), 64u);
  EXPECT_EQ(alignof(Header), 64u);
  EXPECT_EQ(sizeof(Header), 640u);  // one line of config + nine counter lines

  EXPECT_EQ(sizeof(SqEntry), 4096u);
  EXPECT_EQ(sizeof(CqEntry), 1024u);
  EXPECT_EQ(kMaxOpBytes, 4096u - 24u);
  EXPECT_EQ(offsetof(SqEntry, tag), 0u);
  EXPECT_EQ(offsetof(SqEntry, len), 8u);
  EXPECT_EQ(offsetof(SqEntry, submit_ns), 16u);
  EXPECT_EQ(offsetof(SqEntry, data), 24u);
  EXPECT_EQ(offsetof(CqEntry, tag), 0u);
  EXPECT_EQ(offsetof(CqEntry, sequence), 8u);
  EXPECT_EQ(offsetof(CqEntry, code), 16u);
  EXPECT_EQ(offsetof(CqEntry, out_dtype), 20u);
  EXPECT_EQ(offsetof(CqEntry, rank), 24u);
  EXPECT_EQ(offsetof(CqEntry, msg_len), 28u);
  EXPECT_EQ(offsetof(CqEntry, taken_ns), 32u);
  EXPECT_EQ(offsetof(CqEntry, started_ns), 40u);
  EXPECT_EQ(offsetof(CqEntry, done_ns), 48u);
  EXPECT_EQ(offsetof(CqEntry, bytes_read), 56u);
  EXPECT_EQ(offsetof(CqEntry, bytes_written), 64u);
  EXPECT_EQ(offsetof(CqEntry, bytes_required), 72u);
  EXPECT_EQ(offsetof(CqEntry, matched_ns), 80u);
  EXPECT_EQ(offsetof(CqEntry, ready_ns), 88u);
  EXPECT_EQ(offsetof(CqEntry, launched_ns), 96u);
  EXPECT_EQ(offsetof(CqEntry, executed_ns), 104u);
  EXPECT_EQ(offsetof(CqEntry, device_ns), 112u);
  EXPECT_EQ(offsetof(CqEntry, out_shape), 120u);
  EXPECT_EQ(offsetof(CqEntry, msg), 120u + 8u * kMaxRank);
  EXPECT_EQ(sizeof(CqEntry::msg), 1024u - 120u - 8u * kMaxRank);
  EXPECT_EQ(sizeof(CqEntry::msg), 776u);
  EXPECT_EQ(kMaxRank, 16);

  EXPECT_EQ(kSqOffset, 4096u);
  EXPECT_EQ(kCqOffset, 4096u + 64u * 4096u);
  EXPECT_EQ(kQueueBytes, 4096u + 64u * 4096u + 64u * 1024u);
  EXPECT_EQ(kQueueBytes, 331776u);
  EXPECT_EQ(kQueueBytes % 4096, 0u);  // a whole number of pages (mmap)
}

// A version's layout is frozen: a layout change needs a new kVersion (a
// client of another version then stays on gRPC). Version 2 added the traffic
// counters to CqEntry, version 3 the stages between taken and done.
TEST(FastQueueLayoutTest, VersionThreeLayout) {
  ASSERT_EQ(kVersion, 3u) << "a new version: pin its layout here";
  EXPECT_EQ(offsetof(CqEntry, taken_ns), 32u);
  EXPECT_EQ(offsetof(CqEntry, bytes_read), 56u);
  EXPECT_EQ(offsetof(CqEntry, matched_ns), 80u);
  EXPECT_EQ(offsetof(CqEntry, device_ns), 112u);
  EXPECT_EQ(offsetof(CqEntry, out_shape), 120u);
  EXPECT_EQ(sizeof(CqEntry::msg), 776u);
  EXPECT_EQ(offsetof(SqEntry, submit_ns), 16u);
  EXPECT_EQ(offsetof(SqEntry, data), 24u);
}

TEST(FastQueueLayoutTest, EachCounterHasItsOwnCacheLine) {
  auto h = std::make_unique<Header>();
  const Header& r = *h;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h.get()) % 64, 0u);
  EXPECT_EQ(OffsetOf(r, r.magic), 0u);
  EXPECT_EQ(OffsetOf(r, r.version), 4u);
  EXPECT_EQ(OffsetOf(r, r.slots), 8u);
  EXPECT_EQ(OffsetOf(r, r.sq_slot_bytes), 12u);
  EXPECT_EQ(OffsetOf(r, r.cq_slot_bytes), 16u);
  const std::vector<std::pair<const char*, const Word*>> words = {
      {"sq_tail", &r.sq_tail},         {"sq_head", &r.sq_head},
      {"cq_tail", &r.cq_tail},         {"cq_head", &r.cq_head},
      {"daemon_bell", &r.daemon_bell}, {"daemon_sleeping", &r.daemon_sleeping},
      {"client_bell", &r.client_bell}, {"client_sleeping", &r.client_sleeping},
      {"closed", &r.closed}};
  for (size_t i = 0; i < words.size(); ++i) {
    EXPECT_EQ(OffsetOf(r, *words[i].second), 64u * (i + 1)) << words[i].first;
    EXPECT_EQ(OffsetOf(r, words[i].second->v), 64u * (i + 1)) << words[i].first;
  }
}

TEST(FastQueueLayoutTest, QueueViewPointsAtTheRings) {
  void* base = std::aligned_alloc(4096, kQueueBytes);
  ASSERT_NE(base, nullptr);
  std::memset(base, 0, kQueueBytes);
  QueueView q = QueueView::Of(base);
  auto* b = static_cast<char*>(base);
  EXPECT_EQ(reinterpret_cast<char*>(q.header), b);
  EXPECT_EQ(reinterpret_cast<char*>(q.sq), b + 4096);
  EXPECT_EQ(reinterpret_cast<char*>(&q.sq[1]), b + 4096 + 4096);
  EXPECT_EQ(reinterpret_cast<char*>(&q.sq[kSlots]), b + kCqOffset);
  EXPECT_EQ(reinterpret_cast<char*>(q.cq), b + kCqOffset);
  EXPECT_EQ(reinterpret_cast<char*>(&q.cq[1]), b + kCqOffset + 1024);
  EXPECT_EQ(reinterpret_cast<char*>(&q.cq[kSlots]), b + kQueueBytes);
  // The header fits before the first SQ slot.
  EXPECT_LE(sizeof(Header), kSqOffset);
  std::free(base);
}

TEST(FastQueueLayoutTest, InitHeaderWritesAValidHeaderAndLeavesCountersAtZero) {
  auto h = std::make_unique<Header>();  // value-initialized: all zero
  EXPECT_FALSE(HeaderValid(h.get())) << "an all-zero header must be invalid";
  InitHeader(h.get());
  EXPECT_TRUE(HeaderValid(h.get()));
  EXPECT_EQ(h->magic, kMagic);
  EXPECT_EQ(h->version, kVersion);
  EXPECT_EQ(h->slots, kSlots);
  EXPECT_EQ(h->sq_slot_bytes, kSqSlotBytes);
  EXPECT_EQ(h->cq_slot_bytes, kCqSlotBytes);
  for (const Word* w : {&h->sq_tail, &h->sq_head, &h->cq_tail, &h->cq_head, &h->daemon_bell,
                        &h->daemon_sleeping, &h->client_bell, &h->client_sleeping, &h->closed}) {
    EXPECT_EQ(w->v.load(), 0u);
  }
  // The counters are not part of validity.
  h->sq_tail.v.store(12345);
  h->closed.v.store(1);
  EXPECT_TRUE(HeaderValid(h.get()));
}

TEST(FastQueueLayoutTest, AnyWrongConfigurationFieldMakesTheHeaderInvalid) {
  struct Case {
    const char* name;
    void (*mutate)(Header*);
  };
  const Case cases[] = {
      {"magic", [](Header* h) { h->magic = 0x31514644; }},
      {"magic byte-swapped", [](Header* h) { h->magic = 0x43465131; }},
      {"version 0", [](Header* h) { h->version = 0; }},
      {"version 2", [](Header* h) { h->version = kVersion + 1; }},
      {"slots 32", [](Header* h) { h->slots = 32; }},
      {"slots 128", [](Header* h) { h->slots = 128; }},
      {"sq_slot_bytes", [](Header* h) { h->sq_slot_bytes = 2048; }},
      {"cq_slot_bytes", [](Header* h) { h->cq_slot_bytes = 512; }},
  };
  for (const Case& c : cases) {
    auto h = std::make_unique<Header>();
    InitHeader(h.get());
    ASSERT_TRUE(HeaderValid(h.get()));
    c.mutate(h.get());
    EXPECT_FALSE(HeaderValid(h.get())) << c.name;
  }
}

// ---------------------------------------------------------------------------
// Clock and futex primitives
// ---------------------------------------------------------------------------

TEST(FastQueueClockTest, MonotonicNsIsClockMonotonicAndNeverGoesBack) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t before = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  int64_t prev = MonotonicNs();
  EXPECT_GE(prev, before);
  for (int i = 0; i < 100000; ++i) {
    const int64_t now = MonotonicNs();
    ASSERT_GE(now, prev) << "at iteration " << i;
    prev = now;
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t after = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  EXPECT_LE(prev, after);
}

TEST(FastQueueFutexTest, WaitReturnsAtOnceWhenTheWordDiffersOrTheTimeoutIsZero) {
  std::atomic<uint32_t> word{7};
  absl::Time start = absl::Now();
  FutexWait(&word, 8, absl::Seconds(10));  // EAGAIN: the word is not 8
  FutexWait(&word, 7, absl::ZeroDuration());
  FutexWait(&word, 7, absl::Seconds(-1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  start = absl::Now();
  FutexWait(&word, 7, absl::Milliseconds(50));  // sleeps until the timeout
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(40));
}

TEST(FastQueueFutexTest, WakeEndsAWait) {
  std::atomic<uint32_t> word{0};
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (word.load() == 0 && absl::Now() < deadline) FutexWait(&word, 0, absl::Seconds(20));
    woke.store(word.load() != 0);
  });
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time start = absl::Now();
  word.store(1);
  FutexWake(&word);
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(FastQueueRingTest, RingsOnlyWhenTheOtherSideSleeps) {
  auto h = std::make_unique<Header>();
  Ring(h->daemon_bell, h->daemon_sleeping);
  Ring(h->daemon_bell, h->daemon_sleeping);
  EXPECT_EQ(h->daemon_bell.v.load(), 0u) << "nobody sleeps: the bell must not change";
  h->daemon_sleeping.v.store(1);
  Ring(h->daemon_bell, h->daemon_sleeping);
  EXPECT_EQ(h->daemon_bell.v.load(), 1u);
  Ring(h->daemon_bell, h->daemon_sleeping);
  EXPECT_EQ(h->daemon_bell.v.load(), 2u);
  // The other pair is independent.
  EXPECT_EQ(h->client_bell.v.load(), 0u);
  Ring(h->client_bell, h->client_sleeping);
  EXPECT_EQ(h->client_bell.v.load(), 0u);
  EXPECT_EQ(h->daemon_sleeping.v.load(), 1u) << "Ring must not clear the sleeper's flag";
}

// ---------------------------------------------------------------------------
// SpinThenSleep: deadline and idle()
// ---------------------------------------------------------------------------

TEST(FastQueueSpinThenSleepTest, ReturnsTrueAtOnceWhenReady) {
  auto h = std::make_unique<Header>();
  int ready_calls = 0, idle_calls = 0;
  const absl::Time start = absl::Now();
  EXPECT_TRUE(SpinThenSleep(
      h->daemon_bell, h->daemon_sleeping, [&] { return ++ready_calls > 0; },
      [&] { return ++idle_calls > 0; }, absl::Seconds(5), absl::Seconds(5),
      absl::Now() + absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(ready_calls, 1);
  EXPECT_EQ(idle_calls, 0);
  EXPECT_EQ(h->daemon_sleeping.v.load(), 0u) << "a waiter that never slept must not say it does";
}

class FastQueueDeadlineTest : public ::testing::TestWithParam<int> {};

// Nothing happens: false at the deadline (not before, not much later), and
// the sleeping flag is left clear.
TEST_P(FastQueueDeadlineTest, ReturnsFalseAtTheDeadline) {
  const absl::Duration spin = absl::Milliseconds(GetParam());
  auto h = std::make_unique<Header>();
  int idle_calls = 0;
  const absl::Duration wait = absl::Milliseconds(400);
  const absl::Time start = absl::Now();
  const bool ready = SpinThenSleep(
      h->client_bell, h->client_sleeping, [] { return false; },
      [&] {
        ++idle_calls;
        return true;
      },
      spin, absl::Milliseconds(40), start + wait);
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(ready);
  EXPECT_GE(took, wait);
  EXPECT_LT(took, wait + absl::Seconds(2));
  EXPECT_EQ(h->client_sleeping.v.load(), 0u);
  EXPECT_EQ(h->client_bell.v.load(), 0u);
  // 400 ms, of which at most 50 spinning, in slices of at most 40 ms:
  // idle() ran between the slices (at least once even when a loaded machine
  // stretches the spin and the sleeps: no count of slices is promised).
  EXPECT_GE(idle_calls, 1);
}

// Spin 0 (sleep at once) and spin shorter than the deadline.
INSTANTIATE_TEST_SUITE_P(Spins, FastQueueDeadlineTest, ::testing::Values(0, 1, 50));

TEST(FastQueueSpinThenSleepTest, ADeadlineInThePastReturnsFalseWithoutSleeping) {
  auto h = std::make_unique<Header>();
  const absl::Time start = absl::Now();
  EXPECT_FALSE(SpinThenSleep(
      h->client_bell, h->client_sleeping, [] { return false; }, [] { return true; },
      absl::ZeroDuration(), absl::Seconds(10), start - absl::Seconds(1)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(h->client_sleeping.v.load(), 0u);
}

// The spin phase ends at the deadline too: a wait with spin 2 s and a 100 ms
// deadline returns false at about 100 ms.
TEST(FastQueueSpinThenSleepTest, ASpinLongerThanTheWaitStillEndsAtTheDeadline) {
  auto h = std::make_unique<Header>();
  const absl::Time start = absl::Now();
  EXPECT_FALSE(SpinThenSleep(
      h->client_bell, h->client_sleeping, [] { return false; }, [] { return true; },
      absl::Seconds(2), absl::Milliseconds(10), start + absl::Milliseconds(100)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(FastQueueSpinThenSleepTest, IdleReturningFalseStopsTheWaitEarly) {
  auto h = std::make_unique<Header>();
  int idle_calls = 0;
  const absl::Time start = absl::Now();
  const bool ready = SpinThenSleep(
      h->client_bell, h->client_sleeping, [] { return false; },
      [&] {
        ++idle_calls;
        return false;  // e.g. the peer died
      },
      absl::ZeroDuration(), absl::Milliseconds(20), start + absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(ready);
  EXPECT_EQ(idle_calls, 1);
  EXPECT_GE(took, absl::Milliseconds(15));  // it slept one slice first
  EXPECT_LT(took, absl::Seconds(5)) << "idle() returned false but the wait went on";
  EXPECT_EQ(h->client_sleeping.v.load(), 0u);
}

TEST(FastQueueSpinThenSleepTest, IdleIsAskedAfterEverySliceUntilItSaysStop) {
  auto h = std::make_unique<Header>();
  int idle_calls = 0;
  const absl::Time start = absl::Now();
  const bool ready = SpinThenSleep(
      h->client_bell, h->client_sleeping, [] { return false; },
      [&] { return ++idle_calls < 3; }, absl::ZeroDuration(), absl::Milliseconds(20),
      start + absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(ready);
  EXPECT_EQ(idle_calls, 3);
  EXPECT_GE(took, absl::Milliseconds(45));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(FastQueueSpinThenSleepTest, WhenIdleStopsTheWaitTheResultIsReady) {
  // The condition became true while idle() ran: the wait reports it.
  auto h = std::make_unique<Header>();
  bool flag = false;
  const bool ready = SpinThenSleep(
      h->client_bell, h->client_sleeping, [&] { return flag; },
      [&] {
        flag = true;
        return false;
      },
      absl::ZeroDuration(), absl::Milliseconds(10), absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(ready);
}

TEST(FastQueueSpinThenSleepTest, ARingWakesASleeperLongBeforeItsSlice) {
  // Slice and deadline 20 s: only the doorbell can end the sleep in time.
  auto h = std::make_unique<Header>();
  std::atomic<bool> flag{false};
  std::atomic<bool> result{false};
  std::atomic<int64_t> took_ms{-1};
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    result.store(SpinThenSleep(
        h->daemon_bell, h->daemon_sleeping, [&] { return flag.load(std::memory_order_seq_cst); },
        [] { return true; }, absl::ZeroDuration(), absl::Seconds(20),
        start + absl::Seconds(20)));
    took_ms.store(absl::ToInt64Milliseconds(absl::Now() - start));
  });
  // Wait until it sleeps (bounded), then publish and ring.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (h->daemon_sleeping.v.load() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(h->daemon_sleeping.v.load(), 1u) << "the waiter never said it sleeps";
  absl::SleepFor(absl::Milliseconds(20));
  flag.store(true, std::memory_order_seq_cst);
  Ring(h->daemon_bell, h->daemon_sleeping);
  waiter.join();
  EXPECT_TRUE(result.load());
  EXPECT_GE(took_ms.load(), 0);
  EXPECT_LT(took_ms.load(), 10000) << "the ring did not wake the sleeper";
  EXPECT_EQ(h->daemon_bell.v.load(), 1u);
  EXPECT_EQ(h->daemon_sleeping.v.load(), 0u);
}

// ---------------------------------------------------------------------------
// Doorbell protocol: no lost wake-ups
// ---------------------------------------------------------------------------

struct ExchangeParams {
  int spin_us;      // SpinThenSleep's spin on both sides (0: always sleep)
  uint32_t window;  // messages in flight at most (1: strict ping-pong)
  uint32_t messages;
};

void PrintTo(const ExchangeParams& p, std::ostream* os) {
  *os << "spin " << p.spin_us << "us, window " << p.window << ", " << p.messages << " messages";
}

class FastQueueDoorbellTest : public ::testing::TestWithParam<ExchangeParams> {};

// A producer and a consumer pass messages through a ring exactly as the SDK
// and the daemon do: the producer publishes sq_tail and rings the daemon's
// bell; the consumer publishes cq_head (credit) and rings the client's bell.
// Each side waits with SpinThenSleep in one slice as long as its deadline
// (5 s), so only a ring can end a sleep early: a lost wake-up shows as a wait
// that lasted its whole slice, and fails the test (a hand-off takes
// microseconds; anything over 2 s is a lost wake-up).
TEST_P(FastQueueDoorbellTest, EveryMessageArrivesInOrder) {
  const ExchangeParams p = GetParam();
  // Under TSan every atomic access is slower: fewer messages, same protocol.
  const uint32_t kMessages = kUnderTsan ? p.messages / 4 : p.messages;
  const absl::Duration spin = absl::Microseconds(p.spin_us);
  const absl::Duration kSlice = absl::Seconds(5);
  const absl::Duration kLost = absl::Seconds(2);
  auto h = std::make_unique<Header>();
  InitHeader(h.get());
  constexpr uint32_t kRing = 64;
  ASSERT_LE(p.window, kRing);
  std::vector<uint64_t> slots(kRing, 0);  // published by sq_tail/cq_head (release/acquire)
  std::atomic<bool> failed{false};        // either side gave up: the other stops too

  auto payload = [](uint32_t i) { return uint64_t{i} * 0x9E3779B97F4A7C15ull + 1; };
  // One wait; "" or why it failed.
  auto wait = [&](Word& bell, Word& sleeping, const std::function<bool()>& ready,
                  const std::string& what) -> std::string {
    const absl::Time start = absl::Now();
    const bool ok = SpinThenSleep(
        bell, sleeping, [&] { return ready() || failed.load(); }, [] { return true; }, spin,
        kSlice, start + kSlice);
    const absl::Duration took = absl::Now() - start;
    if (failed.load()) return "stopped: the other side failed";
    if (!ok || took > kLost) {
      return absl::StrCat(what, ": the wait took ", absl::FormatDuration(took),
                          " (lost wake-up)");
    }
    return "";
  };

  std::string producer_error;  // written by the producer thread only, read after join
  std::thread producer([&] {
    uint32_t tail = 0;
    for (uint32_t i = 0; i < kMessages; ++i) {
      producer_error = wait(
          h->client_bell, h->client_sleeping,
          [&] { return tail - h->cq_head.v.load(std::memory_order_seq_cst) < p.window; },
          absl::StrCat("producer, credit for message ", i));
      if (!producer_error.empty()) {
        failed.store(true);
        Ring(h->daemon_bell, h->daemon_sleeping);
        return;
      }
      slots[tail % kRing] = payload(i);
      ++tail;
      h->sq_tail.v.store(tail, std::memory_order_seq_cst);
      Ring(h->daemon_bell, h->daemon_sleeping);
    }
  });

  std::string consumer_error;
  uint32_t received = 0;
  for (uint32_t head = 0; received < kMessages; ++received) {
    consumer_error =
        wait(h->daemon_bell, h->daemon_sleeping,
             [&] { return h->sq_tail.v.load(std::memory_order_seq_cst) != head; },
             absl::StrCat("consumer, message ", received));
    if (consumer_error.empty() && slots[head % kRing] != payload(received)) {
      consumer_error = absl::StrCat("message ", received, " out of order: got ",
                                    slots[head % kRing], ", expected ", payload(received));
    }
    if (!consumer_error.empty()) {
      failed.store(true);
      Ring(h->client_bell, h->client_sleeping);
      break;
    }
    ++head;
    h->cq_head.v.store(head, std::memory_order_seq_cst);
    Ring(h->client_bell, h->client_sleeping);
  }
  producer.join();
  // The side that failed first says why; the other just stopped.
  if (!failed.load()) {
    EXPECT_EQ(producer_error, "");
    EXPECT_EQ(consumer_error, "");
  } else {
    ADD_FAILURE() << "producer: " << producer_error << "; consumer: " << consumer_error;
  }
  EXPECT_EQ(received, kMessages);
  EXPECT_EQ(h->sq_tail.v.load(), kMessages);
  EXPECT_EQ(h->cq_head.v.load(), kMessages);
  EXPECT_EQ(h->daemon_sleeping.v.load(), 0u);
  EXPECT_EQ(h->client_sleeping.v.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Doorbells, FastQueueDoorbellTest,
    // Strict ping-pong that always sleeps costs two futex wake-ups per
    // message (20-100 us in a VM): fewer messages keep it to seconds.
    ::testing::Values(ExchangeParams{0, 1, 50000},    // always sleep, strict ping-pong
                      ExchangeParams{0, 64, 200000},  // always sleep, full ring
                      ExchangeParams{2, 1, 200000},   // short spin, ping-pong
                      ExchangeParams{20, 8, 200000}), // small spin, some slack
    [](const ::testing::TestParamInfo<ExchangeParams>& info) {
      return absl::StrCat("spin", info.param.spin_us, "us_window", info.param.window);
    });

}  // namespace
}  // namespace collectived::fastq
