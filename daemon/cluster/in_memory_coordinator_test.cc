// InMemoryCoordinator: leases, the key-value store and its blocking waits,
// the mesh registry, and the refusal of bad input. Real timers with short ttls; every wait
// polls against a deadline.
#include "daemon/cluster/in_memory_coordinator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sync.h"
#include "daemon/util/log.h"
#include "tests/harness/eventually.h"
#include "tests/harness/full_stderr.h"

namespace collectived {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(10);

using testing::Eventually;  // within 10 s, looking every 5 ms

std::vector<std::string> HostIds(InMemoryCoordinator& c) {
  std::vector<std::string> ids;
  for (const HostRecord& h : c.ListHosts()) ids.push_back(h.host_id);
  return ids;
}

// The result of one Get, filled by its callback.
struct GetResult {
  Notification done;
  absl::StatusOr<std::vector<KeyValue>> result = absl::UnknownError("not called");
  Coordinator::GetCallback Callback() {
    return [this](absl::StatusOr<std::vector<KeyValue>> r) {
      result = std::move(r);
      done.Notify();
    };
  }
};

TEST(InMemoryCoordinatorTest, JoinListsHostsInOrderWithTheirAddresses) {
  InMemoryCoordinator c;
  auto b = c.Join("host-b", "10.0.0.2:7000");
  ASSERT_TRUE(b.ok()) << b.status();
  auto a = c.Join("host-a", "10.0.0.1:7000");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(a->lease_id, b->lease_id);
  EXPECT_EQ(a->ttl, absl::Seconds(10));
  ASSERT_EQ(a->hosts.size(), 2u);
  EXPECT_EQ(a->hosts[0].host_id, "host-a");
  EXPECT_EQ(a->hosts[0].address, "10.0.0.1:7000");
  EXPECT_EQ(a->hosts[1].host_id, "host-b");
  EXPECT_EQ(HostIds(c), (std::vector<std::string>{"host-a", "host-b"}));
}

TEST(InMemoryCoordinatorTest, LeaseExpiresWithoutHeartbeatsAndTakesItsOwnedKeys) {
  InMemoryCoordinator c({.lease_ttl = absl::Milliseconds(150)});
  const absl::Time before_join = absl::Now();
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c.Set("a/owned", "1", {.lease_id = a->lease_id}).ok());
  ASSERT_TRUE(c.Set("shared", "2", {}).ok());
  ASSERT_TRUE(Eventually([&] { return c.ListHosts().empty(); }));
  // Never before the ttl.
  EXPECT_GE(absl::Now() - before_join, absl::Milliseconds(150));
  EXPECT_EQ(c.Heartbeat(a->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.key_count(), 1);  // "shared" stays, "a/owned" went with the lease
  GetResult g;
  c.Get({"shared"}, absl::ZeroDuration(), g.Callback());
  ASSERT_TRUE(g.result.ok()) << g.result.status();
}

TEST(InMemoryCoordinatorTest, HeartbeatsKeepTheLease) {
  InMemoryCoordinator c({.lease_ttl = absl::Milliseconds(500)});
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  // Four ttls long, renewed every tenth of the ttl (a stall of 450 ms would
  // be needed to lose it).
  const absl::Time end = absl::Now() + absl::Milliseconds(2000);
  while (absl::Now() < end) {
    ASSERT_TRUE(c.Heartbeat(a->lease_id).ok());
    ASSERT_EQ(HostIds(c), std::vector<std::string>{"a"});
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::vector<HostRecord> hosts = c.ListHosts();
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_GT(hosts[0].last_heartbeat, hosts[0].joined_at);
}

TEST(InMemoryCoordinatorTest, RejoinAfterExpiryGetsANewLease) {
  InMemoryCoordinator c({.lease_ttl = absl::Milliseconds(100)});
  auto first = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(Eventually([&] { return c.ListHosts().empty(); }));
  auto second = c.Join("a", "127.0.0.1:2");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(first->lease_id, second->lease_id);
  EXPECT_TRUE(c.Heartbeat(second->lease_id).ok());
  EXPECT_EQ(c.Heartbeat(first->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.ListHosts().at(0).address, "127.0.0.1:2");
}

TEST(InMemoryCoordinatorTest, ASecondDaemonClaimingALiveHostIdIsRefusedNamingTheLiveOne) {
  InMemoryCoordinator c;
  auto first = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(c.Set("k", "v", {.lease_id = first->lease_id}).ok());
  for (const std::string previous : {"", "l-someone-elses-lease"}) {
    auto second = c.Join("a", "127.0.0.1:2", previous);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
    EXPECT_NE(second.status().message().find(
                  "host id 'a' is held by a live daemon at 127.0.0.1:1"),
              std::string::npos)
        << second.status();
  }
  // Nothing changed: the live daemon keeps its lease and its keys.
  EXPECT_TRUE(c.Heartbeat(first->lease_id).ok());
  EXPECT_EQ(c.ListHosts().at(0).address, "127.0.0.1:1");
  EXPECT_EQ(c.key_count(), 1);
}

TEST(InMemoryCoordinatorTest, ARestartedDaemonWithItsPreviousLeaseReplacesItAtOnce) {
  InMemoryCoordinator c;
  auto first = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(c.Set("k", "v", {.lease_id = first->lease_id}).ok());
  auto second = c.Join("a", "127.0.0.1:2", first->lease_id);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(c.Heartbeat(first->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.ListHosts().size(), 1u);
  EXPECT_EQ(c.ListHosts().at(0).address, "127.0.0.1:2");
  EXPECT_EQ(c.key_count(), 0);
  // A lease that ended lets anyone in.
  ASSERT_TRUE(c.Leave(second->lease_id).ok());
  EXPECT_TRUE(c.Join("a", "127.0.0.1:3").ok());
}

TEST(InMemoryCoordinatorTest, ARejoinOrLeaveStopsTheEndedLeasesTimer) {
  // An hour-long ttl: no timer fires during the test, so each one still
  // pending is a lease's that was never cancelled.
  InMemoryCoordinator c({.lease_ttl = absl::Hours(1)});
  std::string lease;
  for (int i = 0; i < 1000; ++i) {
    auto g = c.Join("h", "127.0.0.1:1", lease);
    ASSERT_TRUE(g.ok()) << g.status();
    lease = g->lease_id;
  }
  auto other = c.Join("other", "127.0.0.1:2");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(c.timer_count(), 2);  // one per live lease
  ASSERT_TRUE(c.Leave(lease).ok());
  EXPECT_EQ(c.timer_count(), 1);
  ASSERT_TRUE(c.Leave(other->lease_id).ok());
  EXPECT_EQ(c.timer_count(), 0);
}

TEST(InMemoryCoordinatorTest, LeaveRemovesTheHostAtOnce) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c.Leave(a->lease_id).ok());
  EXPECT_TRUE(c.ListHosts().empty());
  EXPECT_EQ(c.Leave(a->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.Heartbeat(a->lease_id).code(), absl::StatusCode::kNotFound);
}

TEST(InMemoryCoordinatorTest, SetRefusesToOverwriteUnlessAsked) {
  InMemoryCoordinator c;
  ASSERT_TRUE(c.Set("k", "one", {}).ok());
  absl::Status st = c.Set("k", "two", {});
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  EXPECT_NE(st.message().find("'k'"), std::string::npos) << st;
  GetResult g1;
  c.Get({"k"}, absl::ZeroDuration(), g1.Callback());
  ASSERT_TRUE(g1.result.ok());
  EXPECT_EQ(g1.result->at(0).value, "one");
  ASSERT_TRUE(c.Set("k", "three", {.overwrite = true}).ok());
  GetResult g2;
  c.Get({"k"}, absl::ZeroDuration(), g2.Callback());
  ASSERT_TRUE(g2.result.ok());
  EXPECT_EQ(g2.result->at(0).value, "three");
}

TEST(InMemoryCoordinatorTest, BlockingGetIsWokenBySetWithValuesInOrder) {
  InMemoryCoordinator c;
  GetResult g;
  c.Get({"b", "a"}, absl::Seconds(30), g.Callback());
  EXPECT_FALSE(g.done.HasBeenNotified());
  ASSERT_TRUE(c.Set("a", "A", {}).ok());
  EXPECT_FALSE(g.done.HasBeenNotified());  // "b" is still missing
  ASSERT_TRUE(c.Set("b", std::string("B\0b", 3), {}).ok());
  ASSERT_TRUE(g.done.WaitForNotificationWithTimeout(kPatience));
  ASSERT_TRUE(g.result.ok()) << g.result.status();
  ASSERT_EQ(g.result->size(), 2u);
  EXPECT_EQ((*g.result)[0].key, "b");
  EXPECT_EQ((*g.result)[0].value, std::string("B\0b", 3));
  EXPECT_EQ((*g.result)[1].value, "A");
}

TEST(InMemoryCoordinatorTest, GetTimeoutNamesTheMissingKeys) {
  InMemoryCoordinator c;
  ASSERT_TRUE(c.Set("here", "1", {}).ok());
  GetResult g;
  const absl::Time start = absl::Now();
  c.Get({"here", "rank/1", "rank/2"}, absl::Milliseconds(100), g.Callback());
  ASSERT_TRUE(g.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
  EXPECT_EQ(g.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(g.result.status().message(), "keys not set before the deadline: rank/1, rank/2");
  // Zero timeout: no wait at all.
  GetResult now;
  c.Get({"rank/1"}, absl::ZeroDuration(), now.Callback());
  ASSERT_TRUE(now.done.HasBeenNotified());
  EXPECT_EQ(now.result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(now.result.status().message().find("rank/1"), std::string::npos);
}

TEST(InMemoryCoordinatorTest, ShutdownReleasesWaitersAndRefusesLaterCalls) {
  InMemoryCoordinator c;
  GetResult g;
  c.Get({"never"}, absl::Minutes(4), g.Callback());
  c.Shutdown();
  ASSERT_TRUE(g.done.HasBeenNotified());
  EXPECT_EQ(g.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.Join("a", "x:1").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.Set("k", "v", {}).code(), absl::StatusCode::kUnavailable);
}

TEST(InMemoryCoordinatorTest, DeleteByKeyAndPrefix) {
  InMemoryCoordinator c;
  for (const char* k : {"job/1/a", "job/1/b", "job/10", "job/2/a", "other"}) {
    ASSERT_TRUE(c.Set(k, "v", {}).ok());
  }
  auto n = c.Delete({"other", "missing"}, "job/1/");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3);
  EXPECT_EQ(c.key_count(), 2);  // job/10 and job/2/a
  // Set after delete: the key is free again.
  EXPECT_TRUE(c.Set("other", "w", {}).ok());
}

TEST(InMemoryCoordinatorTest, BadInputIsRefusedAndChangesNothing) {
  InMemoryCoordinator c({.max_hosts = 2, .max_keys = 3});
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c.Set("k", "v", {}).ok());
  const auto invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(c.Join("", "x:1").status().code(), invalid);
  EXPECT_EQ(c.Join(std::string(65, 'h'), "x:1").status().code(), invalid);
  auto bad_char = c.Join("host/one", "x:1");
  EXPECT_EQ(bad_char.status().code(), invalid);
  EXPECT_EQ(bad_char.status().message(),
            "host_id has '/' at 4; only [A-Za-z0-9._-] are allowed")
      << bad_char.status();
  EXPECT_EQ(c.Join("host one", "x:1").status().message(),
            "host_id has byte 0x20 at 4; only [A-Za-z0-9._-] are allowed");
  EXPECT_EQ(c.Join("b", "").status().code(), invalid);
  EXPECT_EQ(c.Join("b", "with space:1").status().code(), invalid);
  EXPECT_EQ(c.Join("b", std::string(257, 'x')).status().code(), invalid);
  EXPECT_EQ(c.Heartbeat("").code(), invalid);
  EXPECT_EQ(c.Set("", "v", {}).code(), invalid);
  EXPECT_EQ(c.Set("k\n", "v", {}).code(), invalid);
  EXPECT_EQ(c.Set(std::string(257, 'k'), "v", {}).code(), invalid);
  absl::Status big = c.Set("big", std::string(kMaxValueBytes + 1, 'x'), {});
  EXPECT_EQ(big.code(), invalid);
  EXPECT_NE(big.message().find("at most 524288"), std::string::npos) << big;
  EXPECT_TRUE(c.Set("max", std::string(kMaxValueBytes, 'x'), {}).ok());
  EXPECT_EQ(c.Set("owned", "v", {.lease_id = "l-unknown"}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c.Delete({}, "").status().code(), invalid);
  EXPECT_EQ(c.Delete({"ok", "bad key"}, "").status().code(), invalid);
  EXPECT_EQ(c.Delete({}, "bad prefix").status().code(), invalid);
  GetResult empty, bad_key, negative, too_many;
  c.Get({}, absl::Seconds(1), empty.Callback());
  c.Get({"k", "bad key"}, absl::Seconds(1), bad_key.Callback());
  c.Get({"k"}, absl::Milliseconds(-1), negative.Callback());
  c.Get(std::vector<std::string>(kMaxKeysPerRequest + 1, "k"), absl::Seconds(1),
        too_many.Callback());
  for (GetResult* g : {&empty, &bad_key, &negative, &too_many}) {
    ASSERT_TRUE(g->done.HasBeenNotified());
    EXPECT_EQ(g->result.status().code(), invalid) << g->result.status();
  }
  // Caps: hosts and keys.
  ASSERT_TRUE(c.Join("b", "127.0.0.1:2").ok());
  EXPECT_EQ(c.Join("c", "127.0.0.1:3").status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(c.Set("third", "v", {}).ok());
  EXPECT_EQ(c.Set("fourth", "v", {}).code(), absl::StatusCode::kResourceExhausted);
  // Nothing above changed the state, except the successful calls.
  EXPECT_EQ(HostIds(c), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.key_count(), 3);  // k, max, third
  GetResult k;
  c.Get({"k"}, absl::ZeroDuration(), k.Callback());
  ASSERT_TRUE(k.result.ok());
  EXPECT_EQ(k.result->at(0).value, "v");
}

TEST(InMemoryCoordinatorTest, AGetNamesEachKeyOnceAndAnswersAtMostAMebibyte) {
  InMemoryCoordinator c;
  const std::string half(kMaxValueBytes, 'x');
  ASSERT_TRUE(c.Set("a", half, {}).ok());
  ASSERT_TRUE(c.Set("b", half, {}).ok());
  ASSERT_TRUE(c.Set("c", "1", {}).ok());
  // One 512 KiB value named 128 times would be a 64 MiB answer (copied for
  // every waiter) to a request of a few hundred bytes.
  GetResult repeated, full, over;
  c.Get({"a", "c", "a"}, absl::ZeroDuration(), repeated.Callback());
  EXPECT_EQ(repeated.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(repeated.result.status().message(), "keys[2] repeats keys[0] ('a')");
  c.Get({"a", "b"}, absl::ZeroDuration(), full.Callback());
  ASSERT_TRUE(full.result.ok()) << full.result.status();
  EXPECT_EQ(full.result->size(), 2u);
  c.Get({"a", "b", "c"}, absl::ZeroDuration(), over.Callback());
  EXPECT_EQ(over.result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.result.status().message(),
            "the values of these 3 keys are 1048577 bytes; one get answers at most 1048576");
  // A waiter whose answer grows past the cap gets the same error when its
  // last key is set, and its slot is free again.
  InMemoryCoordinator small({.max_waiters = 1});
  ASSERT_TRUE(small.Set("a", half, {}).ok());
  ASSERT_TRUE(small.Set("b", half, {}).ok());
  GetResult waiting, next;
  small.Get({"a", "b", "late"}, absl::Seconds(30), waiting.Callback());
  EXPECT_FALSE(waiting.done.HasBeenNotified());
  ASSERT_TRUE(small.Set("late", "v", {}).ok());
  ASSERT_TRUE(waiting.done.HasBeenNotified());
  EXPECT_EQ(waiting.result.status().code(), absl::StatusCode::kResourceExhausted)
      << waiting.result.status();
  small.Get({"other"}, absl::Milliseconds(1), next.Callback());
  ASSERT_TRUE(next.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_EQ(next.result.status().code(), absl::StatusCode::kDeadlineExceeded)
      << next.result.status();
}

TEST(InMemoryCoordinatorTest, OneSetCopiesAtMost64MiBOfAnswersForItsWaiters) {
  // 70 waiters of 1 MiB answers each, all released by one Set: the copies
  // are made under the coordinator's lock, so the Set stops at 64 MiB and
  // the rest are told to get again.
  InMemoryCoordinator c;
  const std::string half(kMaxValueBytes, 'x');
  ASSERT_TRUE(c.Set("a", half, {}).ok());
  ASSERT_TRUE(c.Set("b", half, {}).ok());
  std::vector<GetResult> gets(70);
  for (GetResult& g : gets) c.Get({"a", "b", "c"}, absl::Seconds(30), g.Callback());
  EXPECT_EQ(c.waiter_count(), 70);
  ASSERT_TRUE(c.Set("c", "", {}).ok());
  int answered = 0, refused = 0;
  for (GetResult& g : gets) {
    ASSERT_TRUE(g.done.HasBeenNotified());
    if (g.result.ok()) {
      ++answered;
    } else {
      EXPECT_EQ(g.result.status().code(), absl::StatusCode::kResourceExhausted) << g.result.status();
      EXPECT_NE(g.result.status().message().find("released more than 67108864 bytes"),
                std::string::npos)
          << g.result.status();
      ++refused;
    }
  }
  EXPECT_EQ(answered, 64);
  EXPECT_EQ(refused, 6);
  EXPECT_EQ(c.waiter_count(), 0);
}

TEST(InMemoryCoordinatorTest, ErrorsNameAtMostSixteenKeys) {
  InMemoryCoordinator c;
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(absl::StrCat("key-", i));
  GetResult now, later;
  c.Get(keys, absl::ZeroDuration(), now.Callback());
  EXPECT_EQ(now.result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::EndsWith(now.result.status().message(), "key-14, key-15 and 24 more"))
      << now.result.status();
  c.Get(keys, absl::Milliseconds(1), later.Callback());
  ASSERT_TRUE(later.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_EQ(later.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::EndsWith(later.result.status().message(), "key-15 and 24 more"))
      << later.result.status();
}

TEST(InMemoryCoordinatorTest, AnHourLongWaitIsAcceptedAndWokenBySet) {
  InMemoryCoordinator c;
  GetResult g;
  // An hour is capped at kMaxKeyWait (not refused); Set wakes the waiter.
  c.Get({"k"}, absl::Hours(1), g.Callback());
  ASSERT_TRUE(c.Set("k", "v", {}).ok());
  ASSERT_TRUE(g.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_TRUE(g.result.ok());
}

// ---- The mesh registry ----

// The result of one MeshWait, filled by its callback.
struct MeshWaitResult {
  Notification done;
  absl::StatusOr<MeshMembership> result = absl::UnknownError("not called");
  Coordinator::MeshWaitCallback Callback() {
    return [this](absl::StatusOr<MeshMembership> r) {
      result = std::move(r);
      done.Notify();
    };
  }
};

MeshRegistration Reg(const std::string& key, const std::string& host, const std::string& lease,
                     std::vector<int32_t> indices, int64_t members = 2,
                     const std::string& axes = "data=2", const std::string& token = "tok",
                     int64_t op_timeout_ms = 0) {
  MeshRegistration r;
  r.key = key;
  r.host_id = host;
  r.lease_id = lease;
  r.axes = axes;
  r.members = members;
  r.token = token;
  r.op_timeout_ms = op_timeout_ms;
  r.indices = std::move(indices);
  return r;
}

// Answered at once (zero timeout) for generation `generation` of `key`.
absl::StatusOr<MeshMembership> WaitNow(InMemoryCoordinator& c, const std::string& key,
                                       int64_t generation) {
  MeshWaitResult w;
  c.MeshWait(key, generation, absl::ZeroDuration(), w.Callback());
  EXPECT_TRUE(w.done.HasBeenNotified());
  return w.result;
}

// `s` has `code` and `message`.
::testing::AssertionResult HasStatus(const absl::Status& s, absl::StatusCode code,
                                     absl::string_view message) {
  if (s.code() == code && s.message() == message) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << s << "; want " << absl::StatusCodeToString(code) << ": " << message;
}

// The registration succeeded, as generation `want`.
::testing::AssertionResult IsGeneration(const absl::StatusOr<int64_t>& g, int64_t want) {
  if (!g.ok()) return ::testing::AssertionFailure() << g.status();
  if (*g != want) return ::testing::AssertionFailure() << "generation " << *g << ", want " << want;
  return ::testing::AssertionSuccess();
}

// The answer `w` got, waiting kPatience at most for it.
absl::Status AnswerOf(MeshWaitResult& w) {
  if (!w.done.WaitForNotificationWithTimeout(kPatience)) {
    return absl::InternalError("no answer within the test's patience");
  }
  return w.result.status();
}

TEST(InMemoryCoordinatorMeshTest, ACancelledWaitAnswersCancelledOnceAndFreesItsSlot) {
  InMemoryCoordinator c({.max_waiters = 1});
  GetResult first, refused, second;
  const WaitId id = c.Get({"k"}, absl::Seconds(30), first.Callback());
  ASSERT_NE(id, 0u);
  c.Get({"other"}, absl::Seconds(30), refused.Callback());
  EXPECT_EQ(refused.result.status().code(), absl::StatusCode::kResourceExhausted);
  c.CancelWait(id);
  ASSERT_TRUE(first.done.HasBeenNotified());
  EXPECT_EQ(first.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.waiter_count(), 0);
  // Again, or after the answer: nothing (a second answer would notify twice).
  c.CancelWait(id);
  c.CancelWait(0);
  EXPECT_EQ(c.Get({"k"}, absl::ZeroDuration(), second.Callback()), 0u);
  ASSERT_TRUE(c.Set("k", "v", {}).ok());

  // A mesh wait likewise; the generation still forms afterwards.
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "a", a->lease_id, {0})).ok());
  MeshWaitResult w;
  const WaitId mesh_id = c.MeshWait("K", 1, absl::Seconds(30), w.Callback());
  ASSERT_NE(mesh_id, 0u);
  c.CancelWait(mesh_id);
  ASSERT_TRUE(w.done.HasBeenNotified());
  EXPECT_EQ(w.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.waiter_count(), 0);
  ASSERT_TRUE(c.MeshRegister(Reg("K", "b", b->lease_id, {1})).ok());
  EXPECT_TRUE(WaitNow(c, "K", 1).ok());
}

TEST(InMemoryCoordinatorMeshTest, TwoHostsFormAGenerationAndEveryWaiterGetsItsMembership) {
  InMemoryCoordinator c;
  auto a = c.Join("host-a", "10.0.0.1:7000");
  auto b = c.Join("host-b", "10.0.0.2:7000");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(IsGeneration(
      c.MeshRegister(Reg("job/mesh", "host-b", b->lease_id, {1}, 2, "data=2", "tok", 3000)), 1));
  MeshWaitResult wb;
  c.MeshWait("job/mesh", 1, absl::Seconds(30), wb.Callback());
  EXPECT_FALSE(wb.done.HasBeenNotified());
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("job/mesh", "host-a", a->lease_id, {0})), 1));
  ASSERT_TRUE(wb.done.WaitForNotificationWithTimeout(kPatience));
  ASSERT_TRUE(wb.result.ok()) << wb.result.status();
  // Asked after it filled: answered at once, the same membership.
  auto wa = WaitNow(c, "job/mesh", 1);
  ASSERT_TRUE(wa.ok()) << wa.status();
  for (const MeshMembership* m : {&*wb.result, &*wa}) {
    EXPECT_EQ(m->generation, 1);
    EXPECT_EQ(m->member_host, (std::vector<std::string>{"host-a", "host-b"}));
    EXPECT_EQ(m->op_timeout_ms, 3000);
    ASSERT_EQ(m->hosts.size(), 2u);
    EXPECT_EQ(m->hosts[0].host_id, "host-a");
    EXPECT_EQ(m->hosts[0].address, "10.0.0.1:7000");
    EXPECT_EQ(m->hosts[1].host_id, "host-b");
    EXPECT_EQ(m->hosts[1].address, "10.0.0.2:7000");
    EXPECT_EQ(m->hosts[1].joined_at, c.ListHosts().at(1).joined_at);
  }
  // A third registration on the full generation is refused.
  auto cc = c.Join("host-c", "10.0.0.3:7000");
  ASSERT_TRUE(cc.ok());
  EXPECT_TRUE(HasStatus(c.MeshRegister(Reg("job/mesh", "host-c", cc->lease_id, {0})).status(),
                        absl::StatusCode::kFailedPrecondition,
                        "mesh 'job/mesh' generation 1 is already full (2 members)"));
}

TEST(InMemoryCoordinatorMeshTest, MismatchesAreRefusedNamingWhatDiffersAndChangeNothing) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0}, 4, "data=4", "tok", 5000)), 1);
  EXPECT_TRUE(
      HasStatus(c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 4, "data=2", "tok")).status(),
                absl::StatusCode::kFailedPrecondition,
                "mesh 'K' generation 1 is forming with axes (data=4) and 4 members (first "
                "registered by host a); host b asks for (data=2)"));
  EXPECT_TRUE(
      HasStatus(c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 8, "data=4", "tok")).status(),
                absl::StatusCode::kFailedPrecondition,
                "mesh 'K' generation 1 is forming with axes (data=4) and 4 members (first "
                "registered by host a); host b asks for 8 members"));
  EXPECT_TRUE(
      HasStatus(c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 4, "data=4", "other")).status(),
                absl::StatusCode::kPermissionDenied,
                "mesh 'K' needs the join token its first member set (host a)"));
  EXPECT_TRUE(
      HasStatus(c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 4, "data=4", "tok", 7000)).status(),
                absl::StatusCode::kFailedPrecondition,
                "mesh 'K' generation 1 has op timeout 5000 ms (asked by host a); host b asks for "
                "7000 ms"));
  // Index 0 is a's; index 1 in the same request is not taken by the refusal.
  EXPECT_TRUE(
      HasStatus(c.MeshRegister(Reg("K", "b", b->lease_id, {1, 0}, 4, "data=4", "tok")).status(),
                absl::StatusCode::kAlreadyExists,
                "member 0 of mesh 'K' generation 1 is already registered by host a"));
  MeshWaitResult early;
  c.MeshWait("K", 1, absl::ZeroDuration(), early.Callback());
  EXPECT_EQ(early.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.result.status().message().find("1 of 4 members registered; missing 1, 2, 3;"),
            std::string::npos)
      << early.result.status();
  // Every refusal above left the generation as it was: b's valid
  // registration (op timeout 0 matches any) fills it.
  ASSERT_TRUE(IsGeneration(
      c.MeshRegister(Reg("K", "b", b->lease_id, {1, 2, 3}, 4, "data=4", "tok", 0)), 1));
  auto m = WaitNow(c, "K", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->member_host, (std::vector<std::string>{"a", "b", "b", "b"}));
  EXPECT_EQ(m->op_timeout_ms, 5000);
  // A ready generation refuses other axes the same way.
  auto late = c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 4, "data=2", "tok"));
  EXPECT_NE(late.status().message().find("is ready with axes (data=4)"), std::string::npos)
      << late.status();
}

TEST(InMemoryCoordinatorMeshTest, RegistrationNeedsTheHostsOwnLease) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(c.Join("b", "127.0.0.1:2").ok());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(c.MeshRegister(Reg("K", "b", a->lease_id, {0})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c.MeshRegister(Reg("K", "a", "l-unknown", {0})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c.mesh_key_count(), 0);
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 1));
}

TEST(InMemoryCoordinatorMeshTest, OnlyAMemberHostWithItsOwnLeaseCanEndOrLeaveAGeneration) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  auto outsider = c.Join("c", "127.0.0.1:3");
  ASSERT_TRUE(a.ok() && b.ok() && outsider.ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "a", a->lease_id, {0})).ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "b", b->lease_id, {1})).ok());
  ASSERT_TRUE(WaitNow(c, "K", 1).ok());
  // A host that names another, or holds no lease, is refused.
  EXPECT_EQ(c.MeshLeave("K", 1, "a", b->lease_id, {0}, true, "forged").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c.MeshLeave("K", 1, "nobody", "l-unknown", {}, true, "forged").code(),
            absl::StatusCode::kNotFound);
  // A host with no member in the generation changes nothing.
  EXPECT_TRUE(c.MeshLeave("K", 1, "c", outsider->lease_id, {0, 1}, true, "not mine").ok());
  EXPECT_TRUE(WaitNow(c, "K", 1).ok()) << "the generation ended";
  // Its own members' host ends it.
  ASSERT_TRUE(c.MeshLeave("K", 1, "b", b->lease_id, {1}, true, "link down").ok());
  auto ended = WaitNow(c, "K", 1);
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(ended.status().message().find("host b: link down"), std::string::npos)
      << ended.status();
}

TEST(InMemoryCoordinatorMeshTest, WaitDeadlineNamesTheMissingIndicesAndWhoRegistered) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "a", a->lease_id, {0, 1}, 40, "data=40")).ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "b", b->lease_id, {5}, 40, "data=40")).ok());
  MeshWaitResult w;
  const absl::Time start = absl::Now();
  c.MeshWait("K", 1, absl::Milliseconds(100), w.Callback());
  ASSERT_TRUE(w.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
  EXPECT_EQ(w.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(w.result.status().message(),
            "mesh 'K' generation 1 did not fill before the deadline: 3 of 40 members "
            "registered; missing 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18 and "
            "21 more; registered by a (2), b (1)");
  // The generation is still forming: the timeout changed nothing.
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("K", "b", b->lease_id, {2}, 40, "data=40")), 1));
}

TEST(InMemoryCoordinatorMeshTest, TheWaitDeadlineNamesAtMostSixteenHosts) {
  // The text travels in the answer's trailers, which clients cap at a few
  // KiB: with hundreds of hosts it must not list them all.
  InMemoryCoordinator c;
  for (int h = 0; h < 40; ++h) {
    const std::string id = absl::StrCat("host-with-a-long-name-", 100 + h);
    auto lease = c.Join(id, absl::StrCat("127.0.0.1:", 1000 + h));
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(c.MeshRegister(Reg("K", id, lease->lease_id, {h}, 1000, "data=1000")).ok());
  }
  MeshWaitResult w;
  c.MeshWait("K", 1, absl::Milliseconds(1), w.Callback());
  ASSERT_TRUE(w.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_EQ(w.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string text(w.result.status().message());
  EXPECT_NE(text.find("40 of 1000 members registered; missing 40, 41, "), std::string::npos)
      << text;
  EXPECT_NE(text.find("55 and 944 more; registered by host-with-a-long-name-100 (1), "),
            std::string::npos)
      << text;
  EXPECT_TRUE(absl::EndsWith(text, "host-with-a-long-name-115 (1) and 24 more")) << text;
  EXPECT_LT(text.size(), 2048u);
}

TEST(InMemoryCoordinatorMeshTest, LeavingWhileFormingFreesOnlyTheLeaversIndices) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0, 1}, 3, "data=3")), 1);
  // b cannot free a's index; a frees 1 (2 it never held is ignored).
  ASSERT_TRUE(c.MeshLeave("K", 1, "b", b->lease_id, {0}, false, "").ok());
  ASSERT_TRUE(c.MeshLeave("K", 1, "a", a->lease_id, {1, 2}, false, "").ok());
  auto taken = c.MeshRegister(Reg("K", "b", b->lease_id, {0}, 3, "data=3"));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 3, "data=3")), 1));
  MeshWaitResult w;
  c.MeshWait("K", 1, absl::Seconds(30), w.Callback());
  // Every member leaves: the generation ends, the waiter learns why.
  ASSERT_TRUE(c.MeshLeave("K", 1, "a", a->lease_id, {0}, false, "").ok());
  EXPECT_FALSE(w.done.HasBeenNotified());
  ASSERT_TRUE(c.MeshLeave("K", 1, "b", b->lease_id, {1}, false, "").ok());
  EXPECT_TRUE(HasStatus(AnswerOf(w), absl::StatusCode::kAborted,
                        "mesh 'K' generation 1 ended: every member left"));
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("K", "b", b->lease_id, {0}, 3, "data=3")), 2));
}

TEST(InMemoryCoordinatorMeshTest, ABrokenGenerationAbortsItsWaitersAndTheNextOneFollows) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a.ok() && b.ok());
  // Forming: 2 of 3 members registered, on hosts a and b.
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0}, 3, "data=3")), 1);
  ASSERT_EQ(*c.MeshRegister(Reg("K", "b", b->lease_id, {1}, 3, "data=3")), 1);
  MeshWaitResult w;
  c.MeshWait("K", 1, absl::Seconds(30), w.Callback());
  ASSERT_TRUE(c.MeshLeave("K", 1, "b", b->lease_id, {}, true, "link to a is down").ok());
  EXPECT_TRUE(HasStatus(AnswerOf(w), absl::StatusCode::kAborted,
                        "mesh 'K' generation 1 ended: host b: link to a is down"));
  // A late waiter gets the same reason; leaving again changes nothing.
  EXPECT_EQ(WaitNow(c, "K", 1).status().message(), w.result.status().message());
  EXPECT_TRUE(c.MeshLeave("K", 1, "a", a->lease_id, {0}, true, "again").ok());
  EXPECT_EQ(WaitNow(c, "K", 1).status().message(), w.result.status().message());
  // The next registration starts generation 2, which forms afresh.
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 2);
  ASSERT_EQ(*c.MeshRegister(Reg("K", "b", b->lease_id, {1})), 2);
  ASSERT_TRUE(WaitNow(c, "K", 2).ok());
  // A member leaving the formed mesh breaks it too.
  ASSERT_TRUE(c.MeshLeave("K", 2, "a", a->lease_id, {0}, false, "").ok());
  auto ended = WaitNow(c, "K", 2);
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ended.status().message(), "mesh 'K' generation 2 ended: host a: left the formed mesh");
  // Never issued.
  EXPECT_EQ(WaitNow(c, "K", 3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WaitNow(c, "other", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.MeshLeave("K", 3, "a", a->lease_id, {0}, true, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.MeshLeave("other", 1, "a", a->lease_id, {0}, false, "").code(), absl::StatusCode::kNotFound);
}

TEST(InMemoryCoordinatorMeshTest, AnEndedGenerationsStoreKeysAreDeleted) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 1);
  // What the hosts of generation 1 connect through, and keys that are not
  // theirs: generation 2's, another mesh's (whose key K extends) and one
  // without a mesh.
  const std::string mine = MeshStorePrefix("K", 1) + "/0";
  // Mesh keys may hold '/': "K/g1/y" is another mesh whose keys must not
  // look like generation 1 of "K"'s.
  for (const std::string& k :
       {mine, MeshStorePrefix("K", 1) + "/1", MeshStorePrefix("K", 2) + "/0",
        MeshStorePrefix("KK", 1) + "/0", MeshStorePrefix("K/g1/y", 1) + "/0", std::string("other")}) {
    ASSERT_TRUE(c.Set(k, "v", {}).ok()) << k;
  }
  ASSERT_EQ(c.key_count(), 6);
  ASSERT_TRUE(c.MeshLeave("K", 1, "a", a->lease_id, {}, true, "done").ok());
  EXPECT_EQ(c.key_count(), 4);
  GetResult gone, kept;
  c.Get({mine}, absl::ZeroDuration(), gone.Callback());
  EXPECT_EQ(gone.result.status().code(), absl::StatusCode::kNotFound) << gone.result.status();
  c.Get({MeshStorePrefix("K", 2) + "/0", MeshStorePrefix("KK", 1) + "/0",
         MeshStorePrefix("K/g1/y", 1) + "/0", "other"},
        absl::ZeroDuration(), kept.Callback());
  EXPECT_TRUE(kept.result.ok()) << kept.result.status();
}

TEST(InMemoryCoordinatorMeshTest, LateWaitersGetTheReasonsOfTheLastEightEndings) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  for (int i = 1; i <= 10; ++i) {
    ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0})), i);
    ASSERT_TRUE(c.MeshLeave("K", i, "a", a->lease_id, {0}, true, absl::StrCat("failure ", i)).ok());
  }
  // Generations 3..10 keep their reasons; 2 is too old.
  EXPECT_EQ(WaitNow(c, "K", 3).status().message(),
            "mesh 'K' generation 3 ended: host a: failure 3");
  EXPECT_EQ(WaitNow(c, "K", 10).status().message(),
            "mesh 'K' generation 10 ended: host a: failure 10");
  EXPECT_EQ(WaitNow(c, "K", 2).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(WaitNow(c, "K", 2).status().message(),
            "mesh 'K' generation 2 ended (the mesh is at generation 10 now)");
}

TEST(InMemoryCoordinatorMeshTest, AnEndingLeaseEndsTheGenerationsOfItsHost) {
  InMemoryCoordinator c({.lease_ttl = absl::Milliseconds(200)});
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 1);
  MeshWaitResult w;
  c.MeshWait("K", 1, absl::Seconds(30), w.Callback());
  // No heartbeat: the lease expires and the generation ends with it.
  EXPECT_TRUE(HasStatus(AnswerOf(w), absl::StatusCode::kAborted,
                        "mesh 'K' generation 1 ended: host a's lease ended (expired)"));
}

TEST(InMemoryCoordinatorMeshTest, LeaveAndRejoinEndTheGenerationsOfTheHost) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  auto b = c.Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a.ok() && b.ok());
  // a holds members of K (ready) and L (forming); b of M only.
  ASSERT_TRUE(c.MeshRegister(Reg("K", "a", a->lease_id, {0})).ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "b", b->lease_id, {1})).ok());
  ASSERT_TRUE(c.MeshRegister(Reg("L", "a", a->lease_id, {0})).ok());
  ASSERT_TRUE(c.MeshRegister(Reg("M", "b", b->lease_id, {0})).ok());
  MeshWaitResult w;
  c.MeshWait("L", 1, absl::Seconds(30), w.Callback());
  auto again = c.Join("a", "127.0.0.1:3", a->lease_id);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(w.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_EQ(w.result.status().message(),
            "mesh 'L' generation 1 ended: host a's lease ended (replaced by its own daemon, "
            "which joined again)");
  EXPECT_EQ(WaitNow(c, "K", 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(WaitNow(c, "M", 1).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(c.Leave(b->lease_id).ok());
  EXPECT_EQ(WaitNow(c, "M", 1).status().message(),
            "mesh 'M' generation 1 ended: host b's lease ended (left)");
}

TEST(InMemoryCoordinatorMeshTest, ShutdownReleasesMeshWaitersAndRefusesLaterCalls) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "a", a->lease_id, {0})).ok());
  MeshWaitResult w;
  c.MeshWait("K", 1, absl::Minutes(4), w.Callback());
  c.Shutdown();
  ASSERT_TRUE(w.done.HasBeenNotified());
  EXPECT_EQ(w.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.MeshRegister(Reg("K", "a", a->lease_id, {1})).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(WaitNow(c, "K", 1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.MeshLeave("K", 1, "a", a->lease_id, {0}, true, "x").code(), absl::StatusCode::kUnavailable);
}

TEST(InMemoryCoordinatorMeshTest, MeshWaitsCountAgainstTheWaiterCap) {
  InMemoryCoordinator c({.max_waiters = 1});
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c.MeshRegister(Reg("K", "a", a->lease_id, {0})).ok());
  GetResult g;
  c.Get({"never"}, absl::Seconds(30), g.Callback());
  MeshWaitResult w;
  c.MeshWait("K", 1, absl::Seconds(30), w.Callback());
  ASSERT_TRUE(w.done.HasBeenNotified());
  EXPECT_EQ(w.result.status().code(), absl::StatusCode::kResourceExhausted);
  // The waiting get ends here, while `g` is still alive.
  c.Shutdown();
  ASSERT_TRUE(g.done.HasBeenNotified());
  EXPECT_EQ(g.result.status().code(), absl::StatusCode::kUnavailable);
}

TEST(InMemoryCoordinatorMeshTest, AFullRegistryForgetsAnEndedMeshAndNeverRepeatsItsNumbers) {
  InMemoryCoordinator c({.max_meshes = 1});
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 1);
  // K is live: no room for L.
  EXPECT_EQ(c.MeshRegister(Reg("L", "a", a->lease_id, {0})).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(c.MeshLeave("K", 1, "a", a->lease_id, {0}, true, "done").ok());
  // K ended: it is forgotten to make room for L.
  ASSERT_EQ(*c.MeshRegister(Reg("L", "a", a->lease_id, {0})), 2);
  EXPECT_EQ(c.mesh_key_count(), 1);
  EXPECT_EQ(WaitNow(c, "K", 1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(c.MeshLeave("L", 2, "a", a->lease_id, {0}, true, "done").ok());
  // K again: above every number a forgotten key had, never 1 again.
  ASSERT_EQ(*c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 3);
  // The numbers below 3 are not this K's: not found, not "ended".
  EXPECT_EQ(WaitNow(c, "K", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WaitNow(c, "K", 2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.MeshLeave("K", 1, "a", a->lease_id, {0}, true, "late").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(WaitNow(c, "K", 4).status().code(), absl::StatusCode::kNotFound);
  // Its own ended generation is still named as ended.
  ASSERT_TRUE(c.MeshLeave("K", 3, "a", a->lease_id, {0}, true, "done").ok());
  EXPECT_EQ(WaitNow(c, "K", 3).status().code(), absl::StatusCode::kAborted);
}

TEST(InMemoryCoordinatorMeshTest, ALogLineStuckOnStderrDoesNotHoldUpTheCoordinator) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("K", "a", a->lease_id, {0})), 1));
  SetLogLevel(LogLevel::kInfo);  // the generation's end is logged at info
  // The line's writer waits for room as long as it takes (not LogEvent's
  // usual 100 ms), so a write under the coordinator's lock would hold it.
  SetLogStderrWait(absl::InfiniteDuration());
  absl::Cleanup usual_wait = [] { SetLogStderrWait(absl::Milliseconds(100)); };
  testing::FullStderr full;
  ASSERT_TRUE(full.ok());

  // Ends the generation, then logs it: its thread stays in the log's write.
  std::thread leaver([&] {
    EXPECT_TRUE(c.MeshLeave("K", 1, "a", a->lease_id, {0}, true, "stuck log").ok());
  });
  // Meanwhile another caller gets its answer (the end, once it happened).
  std::vector<std::future<absl::StatusCode>> probes;  // kept: a stuck one is joined below
  bool stuck = false, ended = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5);
       !ended && !stuck && absl::Now() < deadline;) {
    probes.push_back(std::async(std::launch::async,
                                [&c] { return WaitNow(c, "K", 1).status().code(); }));
    if (probes.back().wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      stuck = true;
    } else if (probes.back().get() == absl::StatusCode::kAborted) {
      ended = true;
    } else {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  // Unblock the writer whatever happened (no ASSERT from here on: the
  // threads must be joined).
  full.Restore();
  leaver.join();
  EXPECT_FALSE(stuck) << "a MeshWait waited for the coordinator lock while a log line was "
                         "stuck on stderr";
  EXPECT_TRUE(ended);
}

TEST(InMemoryCoordinatorMeshTest, BadMeshInputIsRefusedAndChangesNothing) {
  InMemoryCoordinator c;
  auto a = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a.ok());
  const std::string lease = a->lease_id;
  const auto invalid = absl::StatusCode::kInvalidArgument;
  std::vector<MeshRegistration> bad = {
      Reg("", "a", lease, {0}),
      Reg("bad key", "a", lease, {0}),
      Reg("K", "", lease, {0}),
      Reg("K", "a/b", lease, {0}),
      Reg("K", "a", "", {0}),
      Reg("K", "a", lease, {0}, 0),
      Reg("K", "a", lease, {0}, kMaxMeshMembers + 1),
      Reg("K", "a", lease, {}),
      Reg("K", "a", lease, {-1}),
      Reg("K", "a", lease, {2}),
      Reg("K", "a", lease, {1, 1}),
      Reg("K", "a", lease, {0}, 2, ""),
      Reg("K", "a", lease, {0}, 2, std::string(kMaxMeshAxesLength + 1, 'x')),
      Reg("K", "a", lease, {0}, 2, "data=2", std::string(kMaxMeshTokenBytes + 1, 't')),
      Reg("K", "a", lease, {0}, 2, "data=2", "tok", -1),
  };
  std::vector<int32_t> too_many(kMaxKeysPerRequest + 1);
  for (size_t i = 0; i < too_many.size(); ++i) too_many[i] = static_cast<int32_t>(i);
  bad.push_back(Reg("K", "a", lease, too_many, 1000));
  for (const MeshRegistration& r : bad) {
    auto g = c.MeshRegister(r);
    EXPECT_EQ(g.status().code(), invalid)
        << "key '" << r.key << "' host '" << r.host_id << "' members " << r.members << ": "
        << g.status();
  }
  EXPECT_EQ(c.MeshRegister(Reg("K", "a", lease, {2})).status().message(),
            "index 2 is out of range: the mesh has 2 members (0..1)");
  EXPECT_EQ(c.MeshRegister(Reg("K", "a", lease, {1, 1})).status().message(),
            "index 1 is repeated");
  MeshWaitResult zero, negative, bad_key;
  c.MeshWait("K", 0, absl::Seconds(1), zero.Callback());
  c.MeshWait("K", 1, absl::Milliseconds(-1), negative.Callback());
  c.MeshWait("bad key", 1, absl::Seconds(1), bad_key.Callback());
  for (MeshWaitResult* w : {&zero, &negative, &bad_key}) {
    ASSERT_TRUE(w->done.HasBeenNotified());
    EXPECT_EQ(w->result.status().code(), invalid) << w->result.status();
  }
  EXPECT_EQ(c.MeshLeave("K", 0, "a", a->lease_id, {0}, true, "").code(), invalid);
  EXPECT_EQ(c.MeshLeave("K", 1, "", a->lease_id, {0}, true, "").code(), invalid);
  EXPECT_EQ(c.MeshLeave("bad key", 1, "a", a->lease_id, {0}, true, "").code(), invalid);
  EXPECT_EQ(c.MeshLeave("K", 1, "a", a->lease_id, {0}, true, std::string(kMaxMeshReasonBytes + 1, 'r')).code(),
            invalid);
  EXPECT_EQ(c.MeshLeave("K", 1, "a", a->lease_id, too_many, false, "").code(), invalid);
  // Nothing was registered: the first valid registration gets generation 1
  // and both indices are free.
  EXPECT_EQ(c.mesh_key_count(), 0);
  ASSERT_TRUE(IsGeneration(c.MeshRegister(Reg("K", "a", lease, {1, 0})), 1));
  EXPECT_EQ(WaitNow(c, "K", 1)->member_host, (std::vector<std::string>{"a", "a"}));
}

}  // namespace
}  // namespace collectived
