// EtcdClient (daemon/cluster/etcd_client.h) against real etcd processes
// (tests/harness/etcd.h): keys, transactions, leases, watches, a 3-node
// cluster losing its leader and then every node, authentication, TLS with
// client certificates, and endpoints that are not etcd. Tests that need etcd
// skip, saying why, where it is not installed.
#include "daemon/cluster/etcd_client.h"

#include <arpa/inet.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/harness/etcd.h"

namespace collectived {
namespace {

using testing::EtcdServers;
using testing::EtcdServersOptions;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

#define SKIP_WITHOUT_ETCD()                                          \
  do {                                                               \
    if (std::string why = testing::EtcdSkipReason(); !why.empty()) { \
      GTEST_SKIP() << why;                                           \
    }                                                                \
  } while (0)

std::unique_ptr<EtcdClient> MustCreate(EtcdOptions options) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Create(std::move(options));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// A key prefix of its own for each test.
std::string TestPrefix() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat("/t/", info->test_suite_name(), ".", info->name(), "/");
}

// Collects watch events until `done` says so or `timeout` passes.
std::vector<EtcdEvent> Collect(EtcdWatch& watch, absl::Duration timeout,
                               const std::function<bool(const std::vector<EtcdEvent>&)>& done) {
  std::vector<EtcdEvent> all;
  const absl::Time deadline = In(timeout);
  while (!done(all)) {
    absl::StatusOr<std::vector<EtcdEvent>> batch = watch.Next(deadline);
    if (!batch.ok()) {
      ADD_FAILURE() << "watch: " << batch.status() << " after " << all.size() << " events";
      break;
    }
    EXPECT_FALSE(batch->empty());
    for (EtcdEvent& e : *batch) all.push_back(std::move(e));
  }
  return all;
}

// ---------------------------------------------------------------------------
// Options and arguments (no etcd needed).

TEST(EtcdClientOptionsTest, RejectsBadOptionsNamingTheField) {
  const auto create = [](std::vector<std::string> endpoints) {
    EtcdOptions o;
    o.endpoints = std::move(endpoints);
    return EtcdClient::Create(std::move(o)).status();
  };
  absl::Status st = create({});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "no endpoint")) << st;
  for (const std::string bad :
       {"", "127.0.0.1", "http://127.0.0.1:2379", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:x",
        ":2379", "::1:2379", "a b:2379"}) {
    st = create({"127.0.0.1:2379", bad});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(st.message(), "etcd endpoint")) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "host:port")) << st;
  }
  st = create({"127.0.0.1:2379", "127.0.0.1:2379"});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "twice")) << st;
  EXPECT_TRUE(create({"127.0.0.1:2379", "[::1]:2379", "localhost:2380"}).ok());

  EtcdOptions o;
  o.endpoints = {"127.0.0.1:2379"};
  o.rpc_timeout = absl::ZeroDuration();
  st = EtcdClient::Create(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "rpc_timeout")) << st;
  o.rpc_timeout = absl::Seconds(1);
  o.password = "pw";
  st = EtcdClient::Create(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "username")) << st;
}

TEST(EtcdClientOptionsTest, RejectsBadArgumentsWithoutCallingEtcd) {
  std::unique_ptr<EtcdClient> c = MustCreate({.endpoints = {"127.0.0.1:1"}});
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  EXPECT_EQ(c->Get("", false, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Put("", "v", 0, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Delete("", false, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Txn({EtcdCompare::Absent("")}, {}, {}, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Txn({}, {EtcdOp::Put("", "v")}, {}, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->GrantLease(absl::ZeroDuration(), In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Watch("k", false, -1, In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->MemberStatus("127.0.0.1:2", In(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
}

// ---------------------------------------------------------------------------
// Endpoints that do not answer, or are not etcd (no etcd needed).

TEST(EtcdClientUnreachableTest, RefusedEndpointsFailUnavailableAtTheDeadline) {
  const int a = testing::UnusedFixedPort(), b = testing::UnusedFixedPort();
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  std::unique_ptr<EtcdClient> c =
      MustCreate({.endpoints = {absl::StrCat("127.0.0.1:", a), absl::StrCat("127.0.0.1:", b)}});
  ASSERT_NE(c, nullptr);
  for (int round = 0; round < 2; ++round) {
    const absl::Time start = absl::Now();
    absl::StatusOr<EtcdRange> r = c->Get("k", false, start + absl::Seconds(1));
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd 127.0.0.1:")) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "cannot reach etcd")) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat("127.0.0.1:", a)) &&
                absl::StrContains(r.status().message(), absl::StrCat("127.0.0.1:", b)))
        << "names both endpoints tried: " << r.status();
    EXPECT_GE(took, absl::Milliseconds(900)) << r.status();
    EXPECT_LE(took, absl::Milliseconds(1100)) << r.status();
  }
  absl::StatusOr<std::unique_ptr<EtcdWatch>> w = c->Watch("k", false, 0, In(absl::Seconds(1)));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
  EXPECT_TRUE(absl::StrContains(w.status().message(), "etcd 127.0.0.1:")) << w.status();
}

// A TCP listener that accepts and closes every connection at once.
class ClosingListener {
 public:
  ClosingListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0) continue;
        const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) close(c);
      }
    });
  }
  ~ClosingListener() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(EtcdClientUnreachableTest, PlainTcpListenerThatClosesGivesAClearError) {
  ClosingListener listener;
  ASSERT_GT(listener.port(), 0);
  const std::string endpoint = absl::StrCat("127.0.0.1:", listener.port());
  std::unique_ptr<EtcdClient> c = MustCreate({.endpoints = {endpoint}});
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> r = c->Put("k", "v", 0, start + absl::Milliseconds(800));
  ASSERT_FALSE(r.ok());
  EXPECT_LE(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd " + endpoint + ": put of key \"k\""))
      << r.status();
}

// A gRPC server that answers every call UNIMPLEMENTED with an empty message.
class UnimplementedEverything : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "")); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
};

TEST(EtcdClientUnreachableTest, GrpcServerWithoutEtcdAsksIfItIsEtcd) {
  int port = 0;
  UnimplementedEverything service;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&service);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  const std::string endpoint = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<EtcdClient> c = MustCreate({.endpoints = {endpoint}});
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<EtcdRange> r = c->Get("k", false, In(absl::Seconds(5)));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "not retried: " << r.status();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd " + endpoint + ": get of key"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "is this an etcd v3 server")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "UNIMPLEMENTED with no message"))
      << r.status();
  absl::StatusOr<std::unique_ptr<EtcdWatch>> w = c->Watch("k", false, 0, In(absl::Seconds(5)));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented) << w.status();
  EXPECT_TRUE(absl::StrContains(w.status().message(), "is this an etcd v3 server")) << w.status();
  server->Shutdown(absl::ToChronoTime(In(absl::Seconds(1))));
}

// ---------------------------------------------------------------------------
// One etcd node, shared by the tests of the suite.

class EtcdSingleNodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::EtcdSkipReason().empty()) return;
    absl::StatusOr<std::unique_ptr<EtcdServers>> c = EtcdServers::Start();
    if (c.ok()) {
      cluster_ = c->release();
    } else {
      start_error_ = new absl::Status(c.status());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    ASSERT_NE(cluster_, nullptr) << *start_error_;
    client_ = MustCreate({.endpoints = cluster_->endpoints()});
    ASSERT_NE(client_, nullptr);
    prefix_ = TestPrefix();
  }

  static EtcdServers* cluster_;
  static absl::Status* start_error_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};
EtcdServers* EtcdSingleNodeTest::cluster_ = nullptr;
absl::Status* EtcdSingleNodeTest::start_error_ = nullptr;

TEST_F(EtcdSingleNodeTest, PutGetDeleteAndPrefixes) {
  const absl::Time deadline = In(absl::Seconds(10));
  absl::StatusOr<int64_t> r1 = client_->Put(prefix_ + "a/1", "one", 0, deadline);
  ASSERT_TRUE(r1.ok()) << r1.status();
  absl::StatusOr<int64_t> r2 = client_->Put(prefix_ + "a/2", "two", 0, deadline);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_GT(*r2, *r1);
  ASSERT_TRUE(client_->Put(prefix_ + "b", "bee", 0, deadline).ok());
  // The prefix "a/" must not take "a0" (the next byte after '/').
  ASSERT_TRUE(client_->Put(prefix_ + "a0", "not in a/", 0, deadline).ok());

  absl::StatusOr<EtcdRange> one = client_->Get(prefix_ + "a/1", false, deadline);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].key, prefix_ + "a/1");
  EXPECT_EQ(one->kvs[0].value, "one");
  EXPECT_EQ(one->kvs[0].mod_revision, *r1);
  EXPECT_EQ(one->kvs[0].create_revision, *r1);
  EXPECT_EQ(one->kvs[0].version, 1);
  EXPECT_EQ(one->kvs[0].lease, 0);
  EXPECT_GE(one->revision, *r2);

  absl::StatusOr<EtcdRange> a = client_->Get(prefix_ + "a/", true, deadline);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->kvs.size(), 2u);
  EXPECT_EQ(a->kvs[0].value, "one");
  EXPECT_EQ(a->kvs[1].value, "two");
  EXPECT_EQ(a->count, 2);
  EXPECT_FALSE(a->more);

  absl::StatusOr<EtcdRange> limited = client_->Get(prefix_, true, deadline, /*limit=*/1);
  ASSERT_TRUE(limited.ok()) << limited.status();
  ASSERT_EQ(limited->kvs.size(), 1u);
  EXPECT_EQ(limited->count, 4);
  EXPECT_TRUE(limited->more);

  absl::StatusOr<EtcdRange> missing = client_->Get(prefix_ + "missing", false, deadline);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE(missing->kvs.empty());

  // Overwrite: version 2, same create revision.
  absl::StatusOr<int64_t> r3 = client_->Put(prefix_ + "a/1", "uno", 0, deadline);
  ASSERT_TRUE(r3.ok());
  one = client_->Get(prefix_ + "a/1", false, deadline);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->kvs[0].value, "uno");
  EXPECT_EQ(one->kvs[0].version, 2);
  EXPECT_EQ(one->kvs[0].create_revision, *r1);
  EXPECT_EQ(one->kvs[0].mod_revision, *r3);

  absl::StatusOr<int64_t> deleted = client_->Delete(prefix_ + "a/", true, deadline);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);
  deleted = client_->Delete(prefix_ + "a/", true, deadline);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 0);
  deleted = client_->Delete(prefix_ + "b", false, deadline);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  absl::StatusOr<EtcdRange> rest = client_->Get(prefix_, true, deadline);
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->kvs.size(), 1u);
  EXPECT_EQ(rest->kvs[0].key, prefix_ + "a0");
  EXPECT_EQ(client_->endpoint(), cluster_->endpoint(0));
}

TEST_F(EtcdSingleNodeTest, TxnCreateIfAbsentHasExactlyOneWinner) {
  std::unique_ptr<EtcdClient> other = MustCreate({.endpoints = cluster_->endpoints()});
  ASSERT_NE(other, nullptr);
  for (int round = 0; round < 20; ++round) {
    const std::string key = absl::StrCat(prefix_, "lock/", round);
    absl::StatusOr<EtcdTxnResult> results[2];
    std::atomic<int> ready{0};
    const auto race = [&](int who, EtcdClient* c) {
      ++ready;
      while (ready < 2) {
      }
      results[who] =
          c->Txn({EtcdCompare::Absent(key)}, {EtcdOp::Put(key, absl::StrCat("racer", who))},
                 {EtcdOp::Get(key)}, In(absl::Seconds(10)));
    };
    std::thread t0(race, 0, client_.get());
    std::thread t1(race, 1, other.get());
    t0.join();
    t1.join();
    ASSERT_TRUE(results[0].ok()) << results[0].status();
    ASSERT_TRUE(results[1].ok()) << results[1].status();
    ASSERT_NE(results[0]->succeeded, results[1]->succeeded) << "round " << round;
    const int winner = results[0]->succeeded ? 0 : 1;
    const EtcdTxnResult& loser = *results[1 - winner];
    EXPECT_TRUE(results[winner]->ranges.empty());
    ASSERT_EQ(loser.ranges.size(), 1u);
    ASSERT_EQ(loser.ranges[0].kvs.size(), 1u);
    EXPECT_EQ(loser.ranges[0].kvs[0].value, absl::StrCat("racer", winner));
    EXPECT_EQ(loser.ranges[0].kvs[0].mod_revision, results[winner]->revision);
  }
}

TEST_F(EtcdSingleNodeTest, TxnComparesEveryTargetAndReturnsTheGetsOfItsBranch) {
  const absl::Time deadline = In(absl::Seconds(10));
  const std::string k = prefix_ + "k";
  absl::StatusOr<EtcdLease> lease = client_->GrantLease(absl::Seconds(60), deadline);
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<int64_t> rev = client_->Put(k, "v", lease->id, deadline);
  ASSERT_TRUE(rev.ok()) << rev.status();
  using R = EtcdCompare::Result;
  const auto holds = [&](EtcdCompare c) {
    absl::StatusOr<EtcdTxnResult> t = client_->Txn({c}, {}, {}, deadline);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() && t->succeeded;
  };
  EXPECT_TRUE(holds(EtcdCompare::Value(k, R::kEqual, "v")));
  EXPECT_FALSE(holds(EtcdCompare::Value(k, R::kNotEqual, "v")));
  EXPECT_TRUE(holds(EtcdCompare::Value(k, R::kGreater, "u")));
  EXPECT_TRUE(holds(EtcdCompare::Value(k, R::kLess, "w")));
  EXPECT_TRUE(holds(EtcdCompare::Version(k, R::kEqual, 1)));
  EXPECT_FALSE(holds(EtcdCompare::Version(k, R::kGreater, 1)));
  EXPECT_TRUE(holds(EtcdCompare::CreateRevision(k, R::kEqual, *rev)));
  EXPECT_FALSE(holds(EtcdCompare::Absent(k)));
  EXPECT_TRUE(holds(EtcdCompare::ModRevision(k, R::kLess, *rev + 1)));
  EXPECT_TRUE(holds(EtcdCompare::ModRevision(k, R::kEqual, *rev)));
  EXPECT_TRUE(holds(EtcdCompare::Lease(k, R::kEqual, lease->id)));
  EXPECT_TRUE(holds(EtcdCompare::Lease(k, R::kNotEqual, 0)));
  EXPECT_TRUE(holds(EtcdCompare::Absent(prefix_ + "nothing")));

  // Several comparisons all hold; the branch's gets come back in order,
  // a delete between them.
  ASSERT_TRUE(client_->Put(prefix_ + "x/1", "x1", 0, deadline).ok());
  ASSERT_TRUE(client_->Put(prefix_ + "x/2", "x2", 0, deadline).ok());
  absl::StatusOr<EtcdTxnResult> t =
      client_->Txn({EtcdCompare::Value(k, R::kEqual, "v"), EtcdCompare::Version(k, R::kEqual, 1)},
                   {EtcdOp::Get(k), EtcdOp::Delete(prefix_ + "x/1"),
                    EtcdOp::Get(prefix_ + "x/", true), EtcdOp::Put(prefix_ + "y", "why")},
                   {EtcdOp::Get(prefix_ + "never")}, deadline);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->succeeded);
  ASSERT_EQ(t->ranges.size(), 2u);
  ASSERT_EQ(t->ranges[0].kvs.size(), 1u);
  EXPECT_EQ(t->ranges[0].kvs[0].value, "v");
  ASSERT_EQ(t->ranges[1].kvs.size(), 1u);
  EXPECT_EQ(t->ranges[1].kvs[0].value, "x2");
  absl::StatusOr<EtcdRange> y = client_->Get(prefix_ + "y", false, deadline);
  ASSERT_TRUE(y.ok());
  ASSERT_EQ(y->kvs.size(), 1u);
  EXPECT_EQ(y->kvs[0].mod_revision, t->revision);

  // etcd refuses a transaction that writes a key twice: returned at once.
  t = client_->Txn({}, {EtcdOp::Put(k, "1"), EtcdOp::Put(k, "2")}, {}, deadline);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_TRUE(absl::StrContains(t.status().message(), "duplicate key")) << t.status();
  EXPECT_TRUE(client_->RevokeLease(lease->id, deadline).ok());
}

TEST_F(EtcdSingleNodeTest, RevokedLeaseTakesItsKeysAndIsNotFoundAfter) {
  const absl::Time deadline = In(absl::Seconds(10));
  absl::StatusOr<EtcdLease> lease = client_->GrantLease(absl::Seconds(60), deadline);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl, absl::Seconds(60));
  ASSERT_TRUE(client_->Put(prefix_ + "owned", "v", lease->id, deadline).ok());
  ASSERT_TRUE(client_->Put(prefix_ + "kept", "v", 0, deadline).ok());
  absl::StatusOr<EtcdLeaseInfo> info = client_->LeaseTimeToLive(lease->id, true, deadline);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->granted_ttl, absl::Seconds(60));
  EXPECT_GT(info->ttl, absl::Seconds(50));
  EXPECT_EQ(info->keys, std::vector<std::string>{prefix_ + "owned"});
  absl::StatusOr<absl::Duration> renewed = client_->KeepAlive(lease->id, deadline);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, absl::Seconds(60));

  ASSERT_TRUE(client_->RevokeLease(lease->id, deadline).ok());
  absl::StatusOr<EtcdRange> r = client_->Get(prefix_, true, deadline);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, prefix_ + "kept");

  absl::Status st = client_->RevokeLease(lease->id, deadline);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "lease has ended")) << st;
  renewed = client_->KeepAlive(lease->id, deadline);
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kNotFound) << renewed.status();
  EXPECT_TRUE(
      absl::StrContains(renewed.status().message(),
                        absl::StrCat("etcd ", cluster_->endpoint(0), ": keep-alive of lease ")))
      << renewed.status();
  EXPECT_EQ(client_->LeaseTimeToLive(lease->id, false, deadline).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<int64_t> put = client_->Put(prefix_ + "late", "v", lease->id, deadline);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kNotFound) << put.status();
}

TEST_F(EtcdSingleNodeTest, LeaseExpiresWithoutKeepAliveOnlyThen) {
  const absl::Time deadline = In(absl::Seconds(20));
  absl::StatusOr<EtcdLease> dropped = client_->GrantLease(absl::Seconds(1), deadline);
  absl::StatusOr<EtcdLease> kept = client_->GrantLease(absl::Seconds(1), deadline);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(client_->Put(prefix_ + "dropped", "v", dropped->id, deadline).ok());
  ASSERT_TRUE(client_->Put(prefix_ + "kept", "v", kept->id, deadline).ok());
  // Keep one alive every 250 ms until the other's key is gone.
  const absl::Time start = absl::Now();
  bool gone = false;
  while (!gone && absl::Now() - start < absl::Seconds(8)) {
    absl::StatusOr<absl::Duration> ttl = client_->KeepAlive(kept->id, deadline);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    absl::StatusOr<EtcdRange> r = client_->Get(prefix_ + "dropped", false, deadline);
    ASSERT_TRUE(r.ok());
    gone = r->kvs.empty();
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_TRUE(gone) << "the key of a lease not kept alive is still there after 8 s";
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(700));
  absl::StatusOr<EtcdRange> r = client_->Get(prefix_ + "kept", false, deadline);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kvs.size(), 1u) << "the key of the lease kept alive vanished";
  absl::StatusOr<absl::Duration> ttl = client_->KeepAlive(dropped->id, deadline);
  EXPECT_EQ(ttl.status().code(), absl::StatusCode::kNotFound) << ttl.status();
  EXPECT_TRUE(client_->RevokeLease(kept->id, deadline).ok());
}

TEST_F(EtcdSingleNodeTest, WatchDeliversPutsAndDeletesInOrderFromItsStartRevision) {
  const absl::Time deadline = In(absl::Seconds(10));
  absl::StatusOr<int64_t> first = client_->Put(prefix_ + "w/a", "a1", 0, deadline);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "w/b", "b1", 0, deadline).ok());
  ASSERT_TRUE(client_->Delete(prefix_ + "w/a", false, deadline).ok());
  ASSERT_TRUE(client_->Put(prefix_ + "other", "not watched", 0, deadline).ok());
  // Created after three of the changes, from the first one's revision.
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client_->Watch(prefix_ + "w/", true, *first, deadline, /*prev_kv=*/true);
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client_->Put(prefix_ + "w/b", "b2", 0, deadline).ok());
  // A transaction's changes share one revision and come in one batch.
  absl::StatusOr<EtcdTxnResult> t = client_->Txn(
      {}, {EtcdOp::Put(prefix_ + "w/c", "c1"), EtcdOp::Delete(prefix_ + "w/b")}, {}, deadline);
  ASSERT_TRUE(t.ok());

  std::vector<EtcdEvent> events =
      Collect(**watch, absl::Seconds(10), [](const auto& all) { return all.size() >= 6; });
  ASSERT_EQ(events.size(), 6u);
  const struct {
    EtcdEvent::Type type;
    const char* key;
    const char* value;
    const char* prev;
  } want[] = {
      {EtcdEvent::Type::kPut, "w/a", "a1", nullptr}, {EtcdEvent::Type::kPut, "w/b", "b1", nullptr},
      {EtcdEvent::Type::kDelete, "w/a", "", "a1"},   {EtcdEvent::Type::kPut, "w/b", "b2", "b1"},
      {EtcdEvent::Type::kPut, "w/c", "c1", nullptr}, {EtcdEvent::Type::kDelete, "w/b", "", "b2"}};
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("event ", i));
    EXPECT_EQ(events[i].type, want[i].type);
    EXPECT_EQ(events[i].kv.key, prefix_ + want[i].key);
    EXPECT_EQ(events[i].kv.value, want[i].value);
    EXPECT_EQ(events[i].prev_kv.has_value(), want[i].prev != nullptr);
    if (want[i].prev != nullptr && events[i].prev_kv) {
      EXPECT_EQ(events[i].prev_kv->value, want[i].prev);
    }
    if (i > 0 && i != 5) {
      EXPECT_GT(events[i].kv.mod_revision, events[i - 1].kv.mod_revision);
    }
  }
  EXPECT_EQ(events[0].kv.mod_revision, *first);
  EXPECT_EQ(events[4].kv.mod_revision, t->revision);
  EXPECT_EQ(events[5].kv.mod_revision, t->revision);
  EXPECT_EQ((*watch)->next_revision(), t->revision + 1);
  // Nothing more.
  absl::StatusOr<std::vector<EtcdEvent>> more = (*watch)->Next(In(absl::Milliseconds(200)));
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDeadlineExceeded) << more.status().ToString();
}

TEST_F(EtcdSingleNodeTest, WatchFromNowSeesOnlyLaterChangesAndStopsAtOnce) {
  const absl::Time deadline = In(absl::Seconds(10));
  ASSERT_TRUE(client_->Put(prefix_ + "k", "before", 0, deadline).ok());
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client_->Watch(prefix_ + "k", false, 0, deadline);
  ASSERT_TRUE(watch.ok()) << watch.status();
  const int64_t from = (*watch)->next_revision();
  EXPECT_GT(from, 0);
  absl::Time start = absl::Now();
  absl::StatusOr<std::vector<EtcdEvent>> none = (*watch)->Next(In(absl::Milliseconds(100)));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "no event")) << none.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200));
  absl::StatusOr<int64_t> rev = client_->Put(prefix_ + "k", "after", 0, deadline);
  ASSERT_TRUE(rev.ok());
  EXPECT_EQ(*rev, from);
  absl::StatusOr<std::vector<EtcdEvent>> batch = (*watch)->Next(deadline);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 1u);
  EXPECT_EQ((*batch)[0].kv.value, "after");
  start = absl::Now();
  watch->reset();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100)) << "the watch's destructor blocked";
}

TEST_F(EtcdSingleNodeTest, WatchFromACompactedRevisionIsOutOfRange) {
  const absl::Time deadline = In(absl::Seconds(10));
  absl::StatusOr<int64_t> old = client_->Put(prefix_ + "k", "1", 0, deadline);
  ASSERT_TRUE(old.ok());
  absl::StatusOr<int64_t> now = client_->Put(prefix_ + "k", "2", 0, deadline);
  ASSERT_TRUE(now.ok());
  absl::StatusOr<std::string> out = cluster_->Etcdctl(0, absl::StrCat("compact ", *now));
  ASSERT_TRUE(out.ok()) << out.status();
  absl::Status st;
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client_->Watch(prefix_ + "k", false, *old, deadline);
  if (!watch.ok()) {
    st = watch.status();
  } else {
    st = (*watch)->Next(deadline).status();
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_TRUE(
      absl::StrContains(st.message(), absl::StrCat("compacted the revisions before ", *now)))
      << st;
}

TEST_F(EtcdSingleNodeTest, MemberStatusNamesItsLeader) {
  absl::StatusOr<EtcdMemberStatus> s =
      client_->MemberStatus(cluster_->endpoint(0), In(absl::Seconds(5)));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->member_id, cluster_->member_id(0));
  EXPECT_EQ(s->leader, s->member_id);
  EXPECT_TRUE(absl::StartsWith(s->version, "3.")) << s->version;
}

// A restarted etcd is found again by the same client (its channel
// reconnects although only fail-fast calls are made while it is down), and a
// watch resumes on it from where it was.
TEST(EtcdRestartTest, SameClientAndWatchGoOnAfterARestart) {
  SKIP_WITHOUT_ETCD();
  absl::StatusOr<std::unique_ptr<EtcdServers>> cluster = EtcdServers::Start();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::unique_ptr<EtcdClient> client = MustCreate({.endpoints = (*cluster)->endpoints()});
  ASSERT_NE(client, nullptr);
  absl::StatusOr<int64_t> before = client->Put("/r/k", "1", 0, In(absl::Seconds(10)));
  ASSERT_TRUE(before.ok()) << before.status();
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client->Watch("/r/", true, 0, In(absl::Seconds(10)));
  ASSERT_TRUE(watch.ok()) << watch.status();

  (*cluster)->Kill(0);
  absl::StatusOr<int64_t> down = client->Put("/r/k", "2", 0, In(absl::Seconds(1)));
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
  EXPECT_TRUE(absl::StrContains(down.status().message(), "Connection refused")) << down.status();
  // Down longer than the channel's longest reconnect backoff (1 s).
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_TRUE((*cluster)->Restart(0).ok());

  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> after = client->Put("/r/k", "3", 0, start + absl::Seconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
  absl::StatusOr<std::vector<EtcdEvent>> batch = (*watch)->Next(In(absl::Seconds(10)));
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 1u);
  EXPECT_EQ((*batch)[0].kv.value, "3");
  EXPECT_EQ((*batch)[0].kv.mod_revision, *after);
}

// ---------------------------------------------------------------------------
// Three nodes: failover.

class EtcdThreeNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    absl::StatusOr<std::unique_ptr<EtcdServers>> c = EtcdServers::Start({.nodes = 3});
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    prefix_ = TestPrefix();
  }
  std::unique_ptr<EtcdServers> cluster_;
  std::string prefix_;
};

TEST_F(EtcdThreeNodeTest, LeaderKilledReadsCasWritesAndWatchGoOn) {
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  // The leader's endpoint first: the client is on it when it dies.
  std::vector<std::string> endpoints = {cluster_->endpoint(*leader)};
  for (int i = 0; i < 3; ++i) {
    if (i != *leader) endpoints.push_back(cluster_->endpoint(i));
  }
  std::unique_ptr<EtcdClient> client =
      MustCreate({.endpoints = endpoints, .rpc_timeout = absl::Seconds(2)});
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client->Watch(prefix_, true, 0, In(absl::Seconds(10)));
  ASSERT_TRUE(watch.ok()) << watch.status();

  // Another thread reads and keeps a lease alive meanwhile, through the
  // same client.
  absl::StatusOr<EtcdLease> lease = client->GrantLease(absl::Seconds(10), In(absl::Seconds(10)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::atomic<bool> stop{false};
  absl::Status reader_error;
  absl::Duration reader_slowest;
  int reads = 0;
  std::thread reader([&] {
    while (!stop) {
      const absl::Time start = absl::Now();
      absl::Status st = client->Get(prefix_, true, start + absl::Seconds(10), 1).status();
      if (st.ok() && reads % 5 == 0) {
        st = client->KeepAlive(lease->id, start + absl::Seconds(10)).status();
      }
      if (!st.ok()) {
        reader_error = st;
        return;
      }
      reader_slowest = std::max(reader_slowest, absl::Now() - start);
      ++reads;
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  absl::Cleanup join_reader = [&] {
    stop = true;
    reader.join();
  };

  constexpr int kKeys = 60;
  constexpr int kKillAt = 15;
  std::map<std::string, int64_t> revisions;  // key -> revision of its creation
  absl::Duration slowest;
  int slowest_at = -1;
  for (int i = 0; i < kKeys; ++i) {
    if (i == kKillAt) cluster_->Kill(*leader);
    const std::string key = absl::StrCat(prefix_, "k", 1000 + i);
    const std::string value = absl::StrCat("v", i);
    const absl::Time start = absl::Now();
    // Create-if-absent, recognizable: a retry after an attempt whose outcome
    // was unknown may find the key its earlier attempt wrote.
    absl::StatusOr<EtcdTxnResult> t =
        client->Txn({EtcdCompare::Absent(key)}, {EtcdOp::Put(key, value)}, {EtcdOp::Get(key)},
                    start + absl::Seconds(10));
    ASSERT_TRUE(t.ok()) << "key " << i << ": " << t.status();
    if (t->succeeded) {
      revisions[key] = t->revision;
    } else {
      ASSERT_EQ(t->ranges.size(), 1u);
      ASSERT_EQ(t->ranges[0].kvs.size(), 1u);
      ASSERT_EQ(t->ranges[0].kvs[0].value, value) << "key " << i << " taken by someone else";
      revisions[key] = t->ranges[0].kvs[0].create_revision;
    }
    absl::StatusOr<EtcdRange> r = client->Get(key, false, start + absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << "key " << i << ": " << r.status();
    ASSERT_EQ(r->kvs.size(), 1u);
    EXPECT_EQ(r->kvs[0].value, value);
    const absl::Duration took = absl::Now() - start;
    if (took > slowest) {
      slowest = took;
      slowest_at = i;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::cerr << "slowest txn+get: " << slowest << " at key " << slowest_at
            << " (leader killed before key " << kKillAt << ")\n";
  EXPECT_LT(slowest, absl::Seconds(5));
  EXPECT_NE(client->endpoint(), cluster_->endpoint(*leader));
  std::move(join_reader).Invoke();
  EXPECT_TRUE(reader_error.ok()) << reader_error;
  std::cerr << "reader: " << reads << " reads, slowest " << reader_slowest << "\n";
  EXPECT_LT(reader_slowest, absl::Seconds(5));
  EXPECT_GT(reads, 20);

  // The watch delivered every creation once, in revision order.
  std::vector<EtcdEvent> events = Collect(
      **watch, absl::Seconds(15), [&](const auto& all) { return all.size() >= revisions.size(); });
  ASSERT_EQ(events.size(), revisions.size());
  std::set<std::string> seen;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].type, EtcdEvent::Type::kPut);
    EXPECT_TRUE(seen.insert(events[i].kv.key).second) << "twice: " << events[i].kv.key;
    EXPECT_EQ(events[i].kv.mod_revision, revisions[events[i].kv.key]) << events[i].kv.key;
    if (i > 0) {
      EXPECT_GT(events[i].kv.mod_revision, events[i - 1].kv.mod_revision);
    }
  }
  absl::StatusOr<std::vector<EtcdEvent>> more = (*watch)->Next(In(absl::Milliseconds(300)));
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDeadlineExceeded) << more.status().ToString();

  // The killed node comes back from its data dir and catches up.
  ASSERT_TRUE(cluster_->Restart(*leader).ok());
  std::unique_ptr<EtcdClient> back = MustCreate({.endpoints = {cluster_->endpoint(*leader)}});
  ASSERT_NE(back, nullptr);
  absl::StatusOr<EtcdRange> r = back->Get(prefix_, true, In(absl::Seconds(10)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kvs.size(), static_cast<size_t>(kKeys));
}

TEST_F(EtcdThreeNodeTest, AllNodesDownFailsUnavailableAtTheDeadline) {
  EtcdOptions options{.endpoints = cluster_->endpoints(),
                      .rpc_timeout = absl::Seconds(2),
                      .watch_resume_timeout = absl::Seconds(1)};
  std::unique_ptr<EtcdClient> client = MustCreate(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put(prefix_ + "k", "v", 0, In(absl::Seconds(10))).ok());
  absl::StatusOr<EtcdLease> lease = client->GrantLease(absl::Seconds(30), In(absl::Seconds(10)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      client->Watch(prefix_, true, 0, In(absl::Seconds(10)));
  ASSERT_TRUE(watch.ok()) << watch.status();
  const int64_t watch_from = (*watch)->next_revision();
  cluster_->KillAll();

  const auto check = [&](const absl::Status& st, absl::Time start, absl::string_view what) {
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << what << ": " << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "etcd 127.0.0.1:")) << what << ": " << st;
    EXPECT_GE(took, absl::Milliseconds(900)) << what << ": " << st;
    EXPECT_LE(took, absl::Milliseconds(1100)) << what << ": " << st;
  };
  absl::Time start = absl::Now();
  check(client->Get(prefix_ + "k", false, start + absl::Seconds(1)).status(), start, "get");
  start = absl::Now();
  check(client->Put(prefix_ + "k", "v2", 0, start + absl::Seconds(1)).status(), start, "put");
  start = absl::Now();
  check(client
            ->Txn({EtcdCompare::Absent(prefix_ + "n")}, {EtcdOp::Put(prefix_ + "n", "v")}, {},
                  start + absl::Seconds(1))
            .status(),
        start, "txn");
  start = absl::Now();
  check(client->KeepAlive(lease->id, start + absl::Seconds(1)).status(), start, "keep-alive");
  start = absl::Now();
  check(client->Watch(prefix_, true, 0, start + absl::Seconds(1)).status(), start, "watch");

  // The watch that was running ends once it could not resume for 1 s, and
  // says from where to watch again.
  absl::StatusOr<std::vector<EtcdEvent>> next = (*watch)->Next(In(absl::Seconds(5)));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable) << next.status();
  EXPECT_TRUE(absl::StrContains(next.status().message(),
                                absl::StrCat("watch again from revision ", watch_from)))
      << next.status();
}

TEST_F(EtcdThreeNodeTest, MemberStatusAgreesOnTheLeader) {
  std::unique_ptr<EtcdClient> client = MustCreate({.endpoints = cluster_->endpoints()});
  ASSERT_NE(client, nullptr);
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<EtcdMemberStatus> s =
        client->MemberStatus(cluster_->endpoint(i), In(absl::Seconds(5)));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->member_id, cluster_->member_id(i));
    EXPECT_EQ(s->leader, cluster_->member_id(*leader));
  }
}

// ---------------------------------------------------------------------------
// Authentication.

TEST(EtcdAuthTest, RightPasswordWorksWrongPasswordIsUnauthenticated) {
  SKIP_WITHOUT_ETCD();
  absl::StatusOr<std::unique_ptr<EtcdServers>> cluster =
      EtcdServers::Start({.root_password = "s3cret", .auth_token_ttl_s = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::string> endpoints = (*cluster)->endpoints();

  std::unique_ptr<EtcdClient> good =
      MustCreate({.endpoints = endpoints, .username = "root", .password = "s3cret"});
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Put("/auth/k", "v", 0, In(absl::Seconds(10))).ok());
  // The simple token lives 1 s unused (etcd checks every second): the next
  // call finds it expired and authenticates again.
  absl::SleepFor(absl::Milliseconds(2500));
  absl::StatusOr<EtcdRange> r = good->Get("/auth/k", false, In(absl::Seconds(10)));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_TRUE(absl::StrContains((*cluster)->LogTail(0, 1 << 20), "deleted a simple token"))
      << "the token did not expire: the test proves nothing";

  // A password change (to the same password) invalidates the user's tokens;
  // a restart breaks the watch's stream: the watch resumes with a new token,
  // and so do calls.
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch =
      good->Watch("/auth/", true, 0, In(absl::Seconds(10)));
  ASSERT_TRUE(watch.ok()) << watch.status();
  const std::string password_file = (*cluster)->dir() + "/password";
  std::ofstream(password_file) << "s3cret\n";
  absl::StatusOr<std::string> changed =
      (*cluster)->Etcdctl(0, "user passwd root --interactive=false < '" + password_file + "'");
  ASSERT_TRUE(changed.ok()) << changed.status();
  (*cluster)->Kill(0);
  ASSERT_TRUE((*cluster)->Restart(0).ok());
  // The watch resumes first (it retries every 250 ms at most), finding the
  // old token refused.
  absl::SleepFor(absl::Seconds(1));
  absl::StatusOr<int64_t> put = good->Put("/auth/k", "v2", 0, In(absl::Seconds(10)));
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<std::vector<EtcdEvent>> batch = (*watch)->Next(In(absl::Seconds(10)));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->back().kv.value, "v2");

  std::unique_ptr<EtcdClient> bad =
      MustCreate({.endpoints = endpoints, .username = "root", .password = "wrong"});
  ASSERT_NE(bad, nullptr);
  const absl::Time start = absl::Now();
  r = bad->Get("/auth/k", false, In(absl::Seconds(10)));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "not retried: " << r.status();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "etcd " + endpoints[0] + ": authentication as user \"root\""))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "wrong user name or password")) << r.status();

  std::unique_ptr<EtcdClient> anonymous = MustCreate({.endpoints = endpoints});
  ASSERT_NE(anonymous, nullptr);
  r = anonymous->Get("/auth/k", false, In(absl::Seconds(10)));
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(r.status().message().empty());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd " + endpoints[0])) << r.status();
  std::cerr << "without credentials: " << r.status() << "\n";
}

// ---------------------------------------------------------------------------
// TLS with client certificates.

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EtcdTlsTest, ClientCertificateIsRequired) {
  SKIP_WITHOUT_ETCD();
  absl::StatusOr<std::unique_ptr<EtcdServers>> cluster = EtcdServers::Start({.tls = true});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::string> endpoints = (*cluster)->endpoints();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile((*cluster)->ca_file());
  ssl.pem_cert_chain = ReadFile((*cluster)->client_cert_file());
  ssl.pem_private_key = ReadFile((*cluster)->client_key_file());
  std::unique_ptr<EtcdClient> good =
      MustCreate({.endpoints = endpoints, .credentials = grpc::SslCredentials(ssl)});
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Put("/tls/k", "v", 0, In(absl::Seconds(10))).ok());
  absl::StatusOr<EtcdRange> r = good->Get("/tls/k", false, In(absl::Seconds(10)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kvs.size(), 1u);

  // The CA but no client certificate: the handshake fails.
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ssl.pem_root_certs;
  std::unique_ptr<EtcdClient> anonymous =
      MustCreate({.endpoints = endpoints, .credentials = grpc::SslCredentials(no_cert)});
  ASSERT_NE(anonymous, nullptr);
  r = anonymous->Get("/tls/k", false, In(absl::Seconds(1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd " + endpoints[0])) << r.status();
  std::cerr << "without a client certificate: " << r.status() << "\n";

  // Plaintext to a TLS port.
  std::unique_ptr<EtcdClient> plain = MustCreate({.endpoints = endpoints});
  ASSERT_NE(plain, nullptr);
  r = plain->Get("/tls/k", false, In(absl::Seconds(1)));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "etcd " + endpoints[0])) << r.status();
  std::cerr << "plaintext to TLS: " << r.status() << "\n";
}

}  // namespace
}  // namespace collectived
