// InMemoryCoordinator: leases, the key-value store and its blocking waits,
// and the refusal of bad input. Real timers with short ttls; every wait
// polls against a deadline.
#include "daemon/cluster/in_memory_coordinator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/sync.h"
#include "tests/harness/eventually.h"

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

TEST(InMemoryCoordinatorTest, JoinAgainReplacesTheLiveLease) {
  InMemoryCoordinator c;
  auto first = c.Join("a", "127.0.0.1:1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(c.Set("k", "v", {.lease_id = first->lease_id}).ok());
  auto second = c.Join("a", "127.0.0.1:2");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(c.Heartbeat(first->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.ListHosts().size(), 1u);
  EXPECT_EQ(c.key_count(), 0);
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

TEST(InMemoryCoordinatorTest, AnHourLongWaitIsAcceptedAndWokenBySet) {
  InMemoryCoordinator c;
  GetResult g;
  // An hour is capped at kMaxKeyWait (not refused); Set wakes the waiter.
  c.Get({"k"}, absl::Hours(1), g.Callback());
  ASSERT_TRUE(c.Set("k", "v", {}).ok());
  ASSERT_TRUE(g.done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_TRUE(g.result.ok());
}

}  // namespace
}  // namespace collectived
