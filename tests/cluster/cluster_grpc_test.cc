// The Cluster service and the cluster client over real gRPC on loopback: the
// token, membership (join, heartbeats, re-join after a lost lease or a
// coordinator restart), the store, the mesh registry, and Gloo contexts that
// rendezvous through the store and run a real gloo::allreduce.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "collectived/v1/cluster.grpc.pb.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/cluster_rendezvous.h"
#include "daemon/cluster/coordinator_service.h"
#include "daemon/cluster/in_memory_coordinator.h"
#include "tests/harness/eventually.h"


namespace collectived {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(20);
constexpr char kToken[] = "cluster-secret-1";

// A coordinator served over gRPC on 127.0.0.1, as a daemon with
// --coordinator serves it.
class TestCoordinator {
 public:
  // port 0: any free port.
  static std::unique_ptr<TestCoordinator> Start(int port, const std::string& token,
                                                absl::Duration ttl,
                                                int64_t answer_budget = int64_t{1} << 30) {
    auto t = std::unique_ptr<TestCoordinator>(new TestCoordinator());
    t->coordinator = std::make_unique<InMemoryCoordinator>(
        InMemoryCoordinatorOptions{.lease_ttl = ttl});
    t->service = std::make_unique<CoordinatorService>(t->coordinator.get(), token, answer_budget);
    grpc::ServerBuilder b;
    b.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                       &t->port);
    b.SetMaxReceiveMessageSize(1 << 20);
    b.RegisterService(t->service.get());
    t->server = b.BuildAndStart();
    if (!t->server || t->port == 0) return nullptr;
    return t;
  }
  ~TestCoordinator() { Stop(); }
  void Stop() {
    if (!server) return;
    coordinator->Shutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  std::unique_ptr<InMemoryCoordinator> coordinator;
  std::unique_ptr<CoordinatorService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

 private:
  TestCoordinator() = default;
};

std::unique_ptr<ClusterClient> MakeClient(const std::string& coordinator, const std::string& host,
                                          const std::string& token = kToken) {
  ClusterClientOptions o;
  o.coordinators = {coordinator};
  o.host_id = host;
  o.address = absl::StrCat(host, ":7000");
  o.token = token;
  o.rpc_timeout = absl::Seconds(2);
  o.retry_interval = absl::Milliseconds(50);
  auto c = ClusterClient::Create(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Starts `c` and waits until it has joined.
::testing::AssertionResult StartAndJoin(ClusterClient& c) {
  c.Start();
  if (c.WaitForState(ClusterState::kJoined, kPatience)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.last_error();
}

MeshRegistration MeshReg(const std::string& key, const std::string& axes, int64_t members,
                         std::vector<int32_t> indices) {
  MeshRegistration r;
  r.key = key;
  r.axes = axes;
  r.members = members;
  r.indices = std::move(indices);
  return r;
}

// A 5 s deadline and, unless empty, `token` as the cluster token.
void PrepareCall(grpc::ClientContext& ctx, const std::string& token) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) ctx.AddMetadata(kClusterTokenMetadataKey, token);
}

// Host h1's registration of member 0 of the one-member mesh "m".
v1::MeshRegisterRequest WireRegistration(const std::string& lease_id) {
  v1::MeshRegisterRequest req;
  req.set_key("m");
  req.set_lease_id(lease_id);
  req.set_host_id("h1");
  req.set_axes("data=1");
  req.set_members(1);
  req.add_indices(0);
  return req;
}

template <typename Cond>
bool Eventually(Cond cond) {
  return testing::Eventually(cond, kPatience, absl::Milliseconds(10));
}

std::vector<std::string> Hosts(InMemoryCoordinator& c) {
  std::vector<std::string> ids;
  for (const HostRecord& h : c.ListHosts()) ids.push_back(h.host_id);
  return ids;
}

TEST(ClusterServiceTest, RefusesAMissingOrWrongTokenAndChangesNothing) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10));
  ASSERT_NE(coord, nullptr);
  auto stub = v1::Cluster::NewStub(
      grpc::CreateChannel(coord->address(), grpc::InsecureChannelCredentials()));
  for (const char* token : {"", "cluster-secret-2", "cluster-secret-1x", "c"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (*token != '\0') ctx.AddMetadata(kClusterTokenMetadataKey, token);
    v1::KeySetRequest req;
    req.set_key("k");
    req.set_value("v");
    v1::KeySetResponse resp;
    grpc::Status st = stub->KeySet(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::JoinClusterRequest req;
    req.set_host_id("intruder");
    req.set_address("10.0.0.9:1");
    v1::JoinClusterResponse resp;
    grpc::Status st = stub->JoinCluster(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_NE(st.error_message().find(kClusterTokenMetadataKey), std::string::npos)
        << st.error_message();
  }
  // The cluster client with a wrong token reports itself unavailable, with why.
  auto client = MakeClient(coord->address(), "h1", "wrong-token");
  client->Start();
  ASSERT_TRUE(client->WaitForState(ClusterState::kUnavailable, kPatience));
  EXPECT_EQ(client->last_error().code(), absl::StatusCode::kUnauthenticated)
      << client->last_error();
  client->Stop(/*leave=*/true);
  EXPECT_EQ(coord->coordinator->key_count(), 0);
  EXPECT_TRUE(coord->coordinator->ListHosts().empty());
}

TEST(ClusterServiceTest, RefusesBadRequestsWithInvalidArgument) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10));
  ASSERT_NE(coord, nullptr);
  auto client = MakeClient(coord->address(), "h1");
  // Not started: store calls work without membership.
  EXPECT_EQ(client->Set("bad key", "v", false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Set("k", std::string(kMaxValueBytes + 1, 'x'), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Get({}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Get({"k"}, absl::Milliseconds(-5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Delete({}, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Set("k", "v", false, /*owned=*/true).code(),
            absl::StatusCode::kFailedPrecondition);
  // Negative timeout on the wire too.
  auto stub = v1::Cluster::NewStub(
      grpc::CreateChannel(coord->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kClusterTokenMetadataKey, kToken);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::KeyGetRequest req;
  req.add_keys("k");
  req.set_timeout_ms(-1);
  v1::KeyGetResponse resp;
  EXPECT_EQ(stub->KeyGet(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(coord->coordinator->key_count(), 0);
  // Bad options never reach the wire.
  ClusterClientOptions bad;
  bad.coordinators = {coord->address()};
  bad.host_id = "has space";
  bad.address = "h:1";
  EXPECT_EQ(ClusterClient::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.host_id = "ok";
  bad.coordinators = {};
  EXPECT_EQ(ClusterClient::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterServiceTest, AWaitWhoseCallerWentAwayFreesItsSlotAtOnce) {
  // A KeyGet or MeshWait asks for a long wait; its client gives up after
  // 200 ms (deadline) or hangs up. The waiter must go then, not when its own
  // 60 s are over: waiter slots are shared by the whole cluster.
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10));
  ASSERT_NE(coord, nullptr);
  auto lease = coord->coordinator->Join("h1", "h1:7000");
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(coord->coordinator->MeshRegister(MeshRegistration{
      .key = "m", .host_id = "h1", .lease_id = lease->lease_id, .axes = "data=2",
      .members = 2, .token = "t", .indices = {0}}).ok());
  auto stub = v1::Cluster::NewStub(
      grpc::CreateChannel(coord->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kClusterTokenMetadataKey, kToken);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::KeyGetRequest req;
    req.add_keys("never");
    req.set_timeout_ms(60000);
    v1::KeyGetResponse resp;
    EXPECT_EQ(stub->KeyGet(&ctx, req, &resp).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_TRUE(testing::Eventually([&] { return coord->coordinator->waiter_count() == 0; },
                         absl::Seconds(10)))
      << coord->coordinator->waiter_count() << " waiters left";
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kClusterTokenMetadataKey, kToken);
    v1::MeshWaitRequest req;
    req.set_key("m");
    req.set_generation(1);
    req.set_timeout_ms(60000);
    v1::MeshWaitResponse resp;
    std::thread cancel([&] {
      EXPECT_TRUE(testing::Eventually([&] { return coord->coordinator->waiter_count() == 1; }));
      ctx.TryCancel();
    });
    EXPECT_EQ(stub->MeshWait(&ctx, req, &resp).error_code(), grpc::StatusCode::CANCELLED);
    cancel.join();
  }
  EXPECT_TRUE(testing::Eventually([&] { return coord->coordinator->waiter_count() == 0; },
                         absl::Seconds(10)))
      << coord->coordinator->waiter_count() << " waiters left";
  // The generation still forms, and waits still work.
  auto lease2 = coord->coordinator->Join("h2", "h2:7000");
  ASSERT_TRUE(lease2.ok());
  ASSERT_TRUE(coord->coordinator->MeshRegister(MeshRegistration{
      .key = "m", .host_id = "h2", .lease_id = lease2->lease_id, .axes = "data=2",
      .members = 2, .token = "t", .indices = {1}}).ok());
  grpc::ClientContext ctx;
  PrepareCall(ctx, kToken);
  v1::MeshWaitRequest req;
  req.set_key("m");
  req.set_generation(1);
  req.set_timeout_ms(1000);
  v1::MeshWaitResponse resp;
  grpc::Status st = stub->MeshWait(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.member_host_size(), 2);
}

TEST(ClusterServiceTest, AnswersNotYetSentStayWithinTheBudget) {
  // 300 KB values and a 500 KB budget of answers not yet sent: an answer of
  // one value fits, one of both (600 KB, under the 1 MiB cap of one answer)
  // does not; every answer gives its bytes back once sent.
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10), 500 * 1000);
  ASSERT_NE(coord, nullptr);
  ASSERT_TRUE(coord->coordinator->Set("a", std::string(300 * 1000, 'a'), {}).ok());
  ASSERT_TRUE(coord->coordinator->Set("b", std::string(300 * 1000, 'b'), {}).ok());
  auto stub = v1::Cluster::NewStub(
      grpc::CreateChannel(coord->address(), grpc::InsecureChannelCredentials()));
  auto get = [&](std::vector<std::string> keys, v1::KeyGetResponse* resp) {
    grpc::ClientContext ctx;
    PrepareCall(ctx, kToken);
    v1::KeyGetRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    return stub->KeyGet(&ctx, req, resp);
  };
  v1::KeyGetResponse resp;
  grpc::Status one = get({"a"}, &resp);
  ASSERT_TRUE(one.ok()) << one.error_message();
  EXPECT_EQ(resp.entries(0).value().size(), 300u * 1000);
  grpc::Status both = get({"a", "b"}, &resp);
  EXPECT_EQ(both.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(both.error_message().find("past 500000 bytes of answers not yet read"),
            std::string::npos)
      << both.error_message();
  EXPECT_TRUE(testing::Eventually([&] { return coord->service->answer_bytes_in_flight() == 0; }));
  // Answers one after another each fit (the server gives a call's bytes back
  // when the call is done, a moment after the client has its answer).
  for (int i = 0; i < 3; ++i) {
    grpc::Status again = get({i % 2 == 0 ? "a" : "b"}, &resp);
    ASSERT_TRUE(again.ok()) << again.error_message();
    ASSERT_TRUE(
        testing::Eventually([&] { return coord->service->answer_bytes_in_flight() == 0; }));
  }
  EXPECT_TRUE(testing::Eventually([&] { return coord->service->answer_bytes_in_flight() == 0; }));
}

TEST(ClusterClientTest, JoinsHeartbeatsAndUsesTheStore) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Milliseconds(900));
  ASSERT_NE(coord, nullptr);
  auto a = MakeClient(coord->address(), "host-a");
  auto b = MakeClient(coord->address(), "host-b");
  ASSERT_TRUE(StartAndJoin(*a));
  ASSERT_TRUE(StartAndJoin(*b));
  const std::string lease = a->lease_id();
  // Three ttls: the heartbeats (every ttl/3) keep both leases.
  absl::SleepFor(absl::Milliseconds(2700));
  EXPECT_EQ(a->lease_id(), lease);
  EXPECT_EQ(Hosts(*coord->coordinator), (std::vector<std::string>{"host-a", "host-b"}));
  auto hosts = a->ListHosts();
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 2u);
  EXPECT_EQ((*hosts)[1].address, "host-b:7000");

  // A blocking get on one host is woken by a set on the other.
  absl::StatusOr<std::vector<std::string>> got = absl::UnknownError("not run");
  std::thread waiter([&] { got = a->Get({"rank/0", "rank/1"}, absl::Seconds(10)); });
  ASSERT_TRUE(b->Set("rank/1", "one", false).ok());
  ASSERT_TRUE(b->Set("rank/0", std::string("z\0ro", 4), false).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{std::string("z\0ro", 4), "one"}));
  EXPECT_EQ(b->Set("rank/1", "again", false).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(b->Set("rank/1", "again", true).ok());

  // A get that times out names the missing key, within its deadline.
  const absl::Time start = absl::Now();
  auto missing = a->Get({"rank/0", "rank/7"}, absl::Milliseconds(200));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("rank/7"), std::string::npos) << missing.status();
  EXPECT_EQ(missing.status().message().find("rank/0"), std::string::npos) << missing.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Owned keys go when their host leaves.
  ASSERT_TRUE(b->Set("b/addr", "x", false, /*owned=*/true).ok());
  auto deleted = a->Delete({}, "rank/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 2);
  b->Stop(/*leave=*/true);
  EXPECT_EQ(Hosts(*coord->coordinator), std::vector<std::string>{"host-a"});
  EXPECT_EQ(coord->coordinator->key_count(), 0);
  EXPECT_EQ(b->state(), ClusterState::kStopped);
}

TEST(ClusterClientTest, JoinsAgainWhenItsLeaseEnds) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Milliseconds(300));
  ASSERT_NE(coord, nullptr);
  auto a = MakeClient(coord->address(), "host-a");
  a->Start();
  ASSERT_TRUE(a->WaitForState(ClusterState::kJoined, kPatience));
  const std::string first = a->lease_id();
  // The coordinator ends the lease (as when it expired): the next heartbeat
  // gets NOT_FOUND and the client joins again with a new lease.
  ASSERT_TRUE(coord->coordinator->Leave(first).ok());
  ASSERT_TRUE(Eventually([&] { return !a->lease_id().empty() && a->lease_id() != first; }));
  EXPECT_EQ(Hosts(*coord->coordinator), std::vector<std::string>{"host-a"});
  EXPECT_EQ(a->state(), ClusterState::kJoined);
}

TEST(ClusterClientTest, ReportsUnavailableWhileTheCoordinatorIsDownAndRejoinsItsSuccessor) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Milliseconds(600));
  ASSERT_NE(coord, nullptr);
  const int port = coord->port;
  auto a = MakeClient(coord->address(), "host-a");
  a->Start();
  ASSERT_TRUE(a->WaitForState(ClusterState::kJoined, kPatience));
  coord->Stop();
  ASSERT_TRUE(a->WaitForState(ClusterState::kUnavailable, kPatience));
  EXPECT_EQ(a->last_error().code(), absl::StatusCode::kUnavailable) << a->last_error();
  // Store calls fail promptly, within their deadline.
  const absl::Time start = absl::Now();
  EXPECT_EQ(a->Set("k", "v", false).code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // A new coordinator on the same port knows no lease: the client joins it.
  auto successor = TestCoordinator::Start(port, kToken, absl::Milliseconds(600));
  ASSERT_NE(successor, nullptr);
  ASSERT_TRUE(a->WaitForState(ClusterState::kJoined, kPatience)) << a->last_error();
  EXPECT_EQ(Hosts(*successor->coordinator), std::vector<std::string>{"host-a"});
  EXPECT_TRUE(a->Set("k", "v", false).ok());
}

TEST(ClusterClientTest, StartsUnavailableWhenNoCoordinatorAnswers) {
  // A port that was free a moment ago: nobody listens there.
  int port;
  {
    auto t = TestCoordinator::Start(0, kToken, absl::Seconds(1));
    ASSERT_NE(t, nullptr);
    port = t->port;
  }
  auto a = MakeClient(absl::StrCat("127.0.0.1:", port), "host-a");
  a->Start();
  ASSERT_TRUE(a->WaitForState(ClusterState::kUnavailable, kPatience));
  EXPECT_TRUE(a->lease_id().empty());
  const absl::Time start = absl::Now();
  a->Stop(/*leave=*/true);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// A coordinator that takes calls and never answers a join (a hung one):
// the call ends only when its client cancels it or at its deadline.
class HungCoordinator final : public v1::Cluster::Service {
 public:
  grpc::Status JoinCluster(grpc::ServerContext* ctx, const v1::JoinClusterRequest*,
                           v1::JoinClusterResponse*) override {
    joins_.fetch_add(1);
    while (!ctx->IsCancelled() && absl::Now() < absl::FromChrono(ctx->deadline())) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "hung");
  }
  int joins() const { return joins_.load(); }

 private:
  std::atomic<int> joins_{0};
};

TEST(ClusterClientTest, StopCancelsAJoinThatTheCoordinatorDoesNotAnswer) {
  HungCoordinator hung;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&hung);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ClusterClientOptions o;
  o.coordinators = {absl::StrCat("127.0.0.1:", port)};
  o.host_id = "host-a";
  o.address = "host-a:7000";
  o.token = kToken;
  o.rpc_timeout = absl::Seconds(20);
  o.retry_interval = absl::Milliseconds(50);
  auto a = ClusterClient::Create(std::move(o));
  ASSERT_TRUE(a.ok()) << a.status();
  (*a)->Start();
  ASSERT_TRUE(Eventually([&] { return hung.joins() == 1; }));  // the join is in flight
  EXPECT_EQ((*a)->state(), ClusterState::kStarting) << (*a)->last_error();
  const absl::Time start = absl::Now();
  (*a)->Stop(/*leave=*/true);
  // At once, not at the join's 20 s deadline; and no join after Stop.
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ((*a)->state(), ClusterState::kStopped);
  EXPECT_EQ(hung.joins(), 1);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

TEST(ClusterMeshTest, TwoClientsFormAMeshAndWaitForTheSameMembership) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10));
  ASSERT_NE(coord, nullptr);
  auto a = MakeClient(coord->address(), "host-a");
  auto b = MakeClient(coord->address(), "host-b");
  ASSERT_TRUE(StartAndJoin(*a));
  ASSERT_TRUE(StartAndJoin(*b));
  std::vector<absl::StatusOr<MeshMembership>> got(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    ClusterClient* c = i == 0 ? a.get() : b.get();
    threads.emplace_back([&got, c, i] {
      MeshRegistration r = MeshReg("job/7/mesh", "data=4", 4, {2 * i, 2 * i + 1});
      r.token = "mesh-token";
      r.op_timeout_ms = i == 0 ? 30000 : 0;
      auto generation = c->MeshRegister(r);
      if (!generation.ok()) {
        got[i] = generation.status();
        return;
      }
      got[i] = c->MeshWait(r.key, *generation, absl::Seconds(15));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(got[i]->generation, 1);
    EXPECT_EQ(got[i]->member_host,
              (std::vector<std::string>{"host-a", "host-a", "host-b", "host-b"}));
    EXPECT_EQ(got[i]->op_timeout_ms, 30000);
    ASSERT_EQ(got[i]->hosts.size(), 2u);
    EXPECT_EQ(got[i]->hosts[0].host_id, "host-a");
    EXPECT_EQ(got[i]->hosts[0].address, "host-a:7000");
    EXPECT_EQ(got[i]->hosts[1].host_id, "host-b");
    EXPECT_EQ(got[i]->hosts[1].address, "host-b:7000");
    EXPECT_GT(got[i]->hosts[1].joined_at, absl::UnixEpoch());
  }
  EXPECT_EQ(got[0]->hosts[1].joined_at, got[1]->hosts[1].joined_at);

  // b breaks the mesh: a's wait on it answers ABORTED with b's reason, and
  // the next registration starts generation 2.
  ASSERT_TRUE(b->MeshLeave("job/7/mesh", 1, {2, 3}, /*broken=*/true, "peer lost").ok());
  auto ended = a->MeshWait("job/7/mesh", 1, absl::Seconds(5));
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(ended.status().message().find("ended: host host-b: peer lost"), std::string::npos)
      << ended.status();
  auto next = a->MeshRegister(MeshReg("job/7/mesh", "data=4", 4, {0}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 2);
  // A wait that times out names the missing members.
  auto late = a->MeshWait("job/7/mesh", 2, absl::Milliseconds(100));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("missing 1, 2, 3;"), std::string::npos)
      << late.status();
  EXPECT_EQ(a->MeshWait("job/7/mesh", 3, absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  // a leaves the cluster: the generation it formed ends with its lease.
  a->Stop(/*leave=*/true);
  auto gone = b->MeshWait("job/7/mesh", 2, absl::Seconds(5));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(gone.status().message().find("host host-a's lease ended (left)"), std::string::npos)
      << gone.status();
  b->Stop(/*leave=*/true);
}

// Host a's rendezvous forms mesh "m2" (member 0 on a, member 1 on b) and
// starts connecting its hosts; b registered but never connects. `stop`
// interrupts the connect (Stop, or the engine's cancel): what Form answers,
// and how long after the interruption.
std::pair<absl::Status, absl::Duration> InterruptAConnect(bool stop) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10));
  EXPECT_NE(coord, nullptr);
  if (coord == nullptr) return {absl::UnknownError("no coordinator"), absl::ZeroDuration()};
  auto a = MakeClient(coord->address(), "host-a");
  auto b = MakeClient(coord->address(), "host-b");
  EXPECT_TRUE(StartAndJoin(*a));
  EXPECT_TRUE(StartAndJoin(*b));
  ClusterRendezvousOptions o;
  o.host_id = "host-a";
  o.cluster_token = kToken;
  ClusterRendezvous r(o);
  r.Attach(a.get(), "127.0.0.1");
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::promise<absl::StatusOr<int64_t>> registered;
  r.Register(MeshJoinInfo{"m2", "data=2", 2, "", 0}, 0, deadline,
             [&registered](absl::StatusOr<int64_t> g) { registered.set_value(std::move(g)); });
  const absl::StatusOr<int64_t> g = registered.get_future().get();
  EXPECT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(b->MeshRegister(MeshReg("m2", "data=2", 2, {1})).ok());
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::promise<absl::Status> formed;
  r.Form("m2", g.value_or(0), deadline, cancel,
         [&formed](absl::StatusOr<FormedMesh> f) { formed.set_value(f.status()); });
  // Host a (rank 0) is connecting once its address is in the store.
  EXPECT_TRUE(a->Get({absl::StrCat(MeshStorePrefix("m2", g.value_or(0)), "/addr/0")},
                     absl::Seconds(10))
                  .ok());
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  std::future<absl::Status> answer = formed.get_future();
  if (stop) {
    r.Stop();
  } else {
    cancel->store(true);
  }
  const absl::Status st = answer.get();
  const absl::Duration took = absl::Now() - start;
  r.Stop();
  a->Stop(/*leave=*/true);
  b->Stop(/*leave=*/true);
  return {st, took};
}

// Stopping the daemon, or its mesh going away, ends a connect of the mesh's
// hosts at once, not at its deadline (up to connect_timeout, 30 s).
TEST(ClusterRendezvousTest, StopOrAMeshThatWentAwayEndsAConnectInProgressAtOnce) {
  auto [stopped, took_stop] = InterruptAConnect(/*stop=*/true);
  EXPECT_EQ(stopped.code(), absl::StatusCode::kUnavailable) << stopped;
  EXPECT_NE(stopped.message().find("leaving the cluster"), std::string::npos) << stopped;
  EXPECT_LT(took_stop, absl::Seconds(3));
  auto [cancelled, took_cancel] = InterruptAConnect(/*stop=*/false);
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled) << cancelled;
  EXPECT_LT(took_cancel, absl::Seconds(3));
}

TEST(ClusterMeshTest, RefusesMeshCallsBeforeJoiningOrWithoutTheToken) {
  auto coord = TestCoordinator::Start(0, kToken, absl::Seconds(10));
  ASSERT_NE(coord, nullptr);
  auto client = MakeClient(coord->address(), "h1");  // not started: no lease
  auto st = client->MeshRegister(MeshReg("m", "data=1", 1, {0}));
  EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.status().message(), "not joined to the cluster");
  // Bad requests on the wire: INVALID_ARGUMENT.
  EXPECT_EQ(client->MeshWait("m", 0, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->MeshWait("m", 1, absl::Milliseconds(-1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A leave speaks for this host's lease, which it has not.
  EXPECT_EQ(client->MeshLeave("m", 1, {0}, true, "reason").code(),
            absl::StatusCode::kFailedPrecondition);

  // A valid registration with a wrong or missing cluster token is refused
  // before it reaches the registry.
  auto lease = coord->coordinator->Join("h1", "h1:7000");
  ASSERT_TRUE(lease.ok());
  auto stub = v1::Cluster::NewStub(
      grpc::CreateChannel(coord->address(), grpc::InsecureChannelCredentials()));
  for (const char* token : {"", "cluster-secret-2"}) {
    grpc::ClientContext ctx;
    PrepareCall(ctx, token);
    const v1::MeshRegisterRequest req = WireRegistration(lease->lease_id);
    v1::MeshRegisterResponse resp;
    EXPECT_EQ(stub->MeshRegister(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << token;
  }
  {
    grpc::ClientContext ctx;
    PrepareCall(ctx, "wrong");
    v1::MeshWaitRequest req;
    req.set_key("m");
    req.set_generation(1);
    v1::MeshWaitResponse resp;
    EXPECT_EQ(stub->MeshWait(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // Bad requests on the wire: INVALID_ARGUMENT; a lease that is not the
    // named host's: NOT_FOUND.
    v1::MeshLeaveRequest req;
    req.set_key("m");
    req.set_generation(1);
    req.set_host_id("h1");
    req.set_lease_id(lease->lease_id);
    req.set_reason(std::string(kMaxMeshReasonBytes + 1, 'r'));
    grpc::ClientContext ctx;
    PrepareCall(ctx, kToken);
    v1::MeshLeaveResponse resp;
    EXPECT_EQ(stub->MeshLeave(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    req.set_reason("forged");
    req.set_host_id("h2");
    grpc::ClientContext ctx2;
    PrepareCall(ctx2, kToken);
    EXPECT_EQ(stub->MeshLeave(&ctx2, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(coord->coordinator->mesh_key_count(), 0);
  // The same request with the token registers generation 1.
  grpc::ClientContext ctx;
  PrepareCall(ctx, kToken);
  const v1::MeshRegisterRequest req = WireRegistration(lease->lease_id);
  v1::MeshRegisterResponse resp;
  grpc::Status ok = stub->MeshRegister(&ctx, req, &resp);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(resp.generation(), 1);
  EXPECT_EQ(coord->coordinator->mesh_key_count(), 1);
}


}  // namespace
}  // namespace collectived
