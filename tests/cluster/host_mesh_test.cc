// HostMesh (daemon/cluster/host_mesh.h) with 2 and 3 "hosts" as threads of
// this process, connected over loopback through an in-process address book:
// the executor suite (executor_suite.h) with the members spread over the
// hosts, so every op, dtype and group choice crosses hosts and must give the
// one-host bits; and the failures: hosts that submit different ops, a host's
// refusal, a host that never takes part (named by what its engine answers),
// Abort (its reason reaches the other hosts).
#include <gtest/gtest.h>

#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/cluster/host_mesh.h"
#include "daemon/cluster/peer_auth.h"
#include "tests/harness/memory_book.h"
#include "exec/cpu_executor.h"
#include "tests/exec/executor_suite.h"

namespace collectived::executor_suite {
namespace {

// A host whose connections an Abort closed can still be writing to them:
// like the daemon (main.cc), this process takes the write's EPIPE, not the
// SIGPIPE that would end it.
const bool kSigpipeIgnored = [] { return std::signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();

std::string HostId(int h) { return absl::StrCat("h", h); }

using ::collectived::testing::MemoryBook;

// The connections' key of mesh generation `generation` (as the daemon makes
// it from the token, the mesh and the registry's secret).
TransportSecurity Security(int generation) {
  TransportSecurity s;
  s.key = peer_auth::MeshKey("test-token", "test-mesh", generation, "secret");
  s.tag = peer_auth::MeshTag("test-mesh", generation);
  s.description = absl::StrCat("test mesh generation ", generation);
  return s;
}

// What one host's done reported.
struct Outcome {
  absl::Status status;
  bool broken = false;
  Traffic traffic;
  absl::Duration took;
};

// One op's dones on the hosts that started it. Shared with the callbacks,
// so that a test that gives up waiting leaves nothing dangling.
class Dones : public std::enable_shared_from_this<Dones> {
 public:
  static std::shared_ptr<Dones> Make(int hosts) { return std::make_shared<Dones>(hosts); }
  explicit Dones(int hosts) : outcomes_(hosts), called_(hosts, 0) {}
  CrossHostMesh::Done For(int host) {
    const absl::Time start = absl::Now();
    return [self = shared_from_this(), host, start](absl::Status status, bool broken,
                                                    Traffic traffic) {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->outcomes_[host] = Outcome{std::move(status), broken, traffic, absl::Now() - start};
      ++self->called_[host];
      self->cv_.notify_all();
    };
  }
  // Waits (at most `limit`) until every host of `hosts` called back; false on
  // timeout.
  bool Wait(const std::vector<int>& hosts, absl::Duration limit = absl::Seconds(60)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(limit), [&] {
      for (int h : hosts) {
        if (called_[h] == 0) return false;
      }
      return true;
    });
  }
  Outcome Get(int host) {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_[host];
  }
  int calls(int host) {
    std::lock_guard<std::mutex> lock(mu_);
    return called_[host];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Outcome> outcomes_;
  std::vector<int> called_;
};

// H hosts of one mesh: member m on host host_of[m], one HostMesh and
// one CPU executor per host.
class Cluster {
 public:
  // Host h connects with options[h] (or options[0] when there are fewer).
  static absl::StatusOr<std::unique_ptr<Cluster>> Connect(
      int hosts, std::vector<int> host_of, const std::vector<HostMeshOptions>& options = {{}}) {
    static int generation = 0;
    auto c = std::unique_ptr<Cluster>(new Cluster);
    c->host_of_ = host_of;
    const std::string prefix = absl::StrCat("mesh/", ++generation);
    std::vector<absl::StatusOr<std::unique_ptr<CrossHostMesh>>> meshes;
    for (int h = 0; h < hosts; ++h) meshes.emplace_back(absl::UnknownError("not connected"));
    std::vector<std::thread> threads;
    for (int h = 0; h < hosts; ++h) {
      threads.emplace_back([&, h] {
        MeshTopology t;
        t.generation = generation;
        for (int m : host_of) t.member_host.push_back(HostId(m));
        for (int r = 0; r < hosts; ++r) {
          t.hosts.push_back(HostId(r));
          t.addresses.push_back("127.0.0.1");
        }
        t.self = h;
        meshes[h] = ConnectHostMesh(c->book_, prefix, t, "127.0.0.1", Security(generation),
                                    absl::Now() + absl::Seconds(30),
                                    options[static_cast<size_t>(h) < options.size() ? h : 0]);
      });
    }
    for (auto& t : threads) t.join();
    for (int h = 0; h < hosts; ++h) {
      if (!meshes[h].ok()) return meshes[h].status();
      c->meshes_.push_back(std::move(*meshes[h]));
      c->cpus_.push_back(std::make_unique<CpuExecutor>(
          CpuExecutorOptions{.threads = 2, .chunk_bytes = 64, .serial_bytes = 0}));
    }
    return c;
  }

  int hosts() const { return static_cast<int>(meshes_.size()); }
  CrossHostMesh& mesh(int h) { return *meshes_[h]; }
  int64_t NextSequence() { return ++sequence_; }
  // Host h's view of `io`: its members' regions, the others' null.
  std::vector<MemberIo> IoOf(int h, const std::vector<MemberIo>& io) const {
    std::vector<MemberIo> local(io.size());
    for (size_t m = 0; m < io.size(); ++m) {
      if (host_of_[m] == h) local[m] = MemberIo{io[m].in, io[m].out, -1};
    }
    return local;
  }
  void Start(int h, std::shared_ptr<const OpPlan> plan, int64_t sequence,
             const std::vector<MemberIo>& io, absl::Status verdict, absl::Time deadline,
             CrossHostMesh::Done done) {
    meshes_[h]->Start(std::move(plan), sequence, IoOf(h, io), cpus_[h].get(), std::move(verdict),
                      deadline, std::move(done));
  }
  // Runs `plan` on every host and waits for every done.
  std::vector<Outcome> RunAll(const OpPlan& plan, const std::vector<MemberIo>& io,
                              absl::Duration timeout = absl::Seconds(60)) {
    auto shared = std::make_shared<const OpPlan>(plan);
    const int64_t seq = NextSequence();
    auto dones = Dones::Make(hosts());
    std::vector<int> all;
    for (int h = 0; h < hosts(); ++h) {
      all.push_back(h);
      Start(h, shared, seq, io, absl::OkStatus(), absl::Now() + timeout, dones->For(h));
    }
    std::vector<Outcome> out(hosts());
    if (!dones->Wait(all, timeout + absl::Seconds(30))) {
      ADD_FAILURE() << "a done was not called";
      for (auto& o : out) o.status = absl::InternalError("no done");
      return out;
    }
    for (int h = 0; h < hosts(); ++h) out[h] = dones->Get(h);
    return out;
  }

 private:
  Cluster() = default;
  MemoryBook book_;
  std::vector<int> host_of_;
  std::vector<std::unique_ptr<CpuExecutor>> cpus_;
  int64_t sequence_ = 0;
  // Last: closed first (their threads call into nothing else here).
  std::vector<std::unique_ptr<CrossHostMesh>> meshes_;
};

std::vector<int> Layout(int members, int hosts, bool blocked) {
  std::vector<int> host_of(members);
  for (int m = 0; m < members; ++m) host_of[m] = blocked ? m / 2 % hosts : m % hosts;
  return host_of;
}

// The executor suite's Executor: every op over H hosts, member m on host
// m % H (or in blocks of two). One cluster per member count, connected on
// first use and again after an op broke it.
template <int kHosts, bool kBlocked, uint64_t kReplicateBelow>
class HostMeshSuiteExecutor final : public Executor {
 public:
  absl::string_view name() const override { return "host-mesh"; }
  absl::string_view buffer_kind() const override { return "memfd"; }
  bool IsViable() const override { return true; }
  int threads() const override { return 2; }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int members = static_cast<int>(io.size());
    auto it = clusters_.find(members);
    if (it == clusters_.end()) {
      auto c = Cluster::Connect(kHosts, Layout(members, kHosts, kBlocked),
                                {HostMeshOptions{.replicate_below_bytes = kReplicateBelow}});
      if (!c.ok()) return c.status();
      it = clusters_.emplace(members, std::move(*c)).first;
    }
    std::vector<Outcome> out = it->second->RunAll(plan, io);
    absl::Status first;
    bool broken = false;
    Traffic sum;
    for (const Outcome& o : out) {
      if (first.ok() && !o.status.ok()) first = o.status;
      broken |= o.broken;
      sum.read += o.traffic.read;
      sum.written += o.traffic.written;
      sum.required += o.traffic.required;
    }
    if (broken) clusters_.erase(it);
    if (traffic != nullptr) *traffic = sum;
    return first;
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<Cluster>> clusters_;
};

// kReplicateBelow 0: the reductions take the lanes or the chain at every
// size (the suite's arrays are small); 1 GiB: every reduction is replicated.
template <int kHosts, bool kBlocked, uint64_t kReplicateBelow = 0>
struct HostMeshBackend : HostMemoryBackend {
  static constexpr const char* kName = "host mesh";
  static std::unique_ptr<Executor> MakeExecutor() {
    return std::make_unique<HostMeshSuiteExecutor<kHosts, kBlocked, kReplicateBelow>>();
  }
};

using TwoHostsRoundRobin = HostMeshBackend<2, false>;
using ThreeHostsRoundRobin = HostMeshBackend<3, false>;
using TwoHostsBlocked = HostMeshBackend<2, true>;
using ThreeHostsReplicated = HostMeshBackend<3, true, uint64_t{1} << 30>;

INSTANTIATE_TYPED_TEST_SUITE_P(TwoHostsRoundRobin, ExecutorSuite, TwoHostsRoundRobin);
INSTANTIATE_TYPED_TEST_SUITE_P(ThreeHostsRoundRobin, ExecutorSuite, ThreeHostsRoundRobin);
INSTANTIATE_TYPED_TEST_SUITE_P(TwoHostsBlocked, ExecutorSuite, TwoHostsBlocked);
INSTANTIATE_TYPED_TEST_SUITE_P(ThreeHostsReplicated, ExecutorSuite, ThreeHostsReplicated);

// --- Direct checks ---

OpPlan Plan(v1::OpKind kind, v1::DType dt, std::vector<int64_t> shape, int members) {
  v1::OpSpec spec = Typed(kind, dt, std::move(shape));
  spec.add_axes("x");
  auto plan = PlanOp(spec, MeshShape{{"x"}, {members}});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : OpPlan{};
}

// Members' host memory for one op.
struct Regions {
  Regions(int members, const OpPlan& plan) {
    for (int m = 0; m < members; ++m) {
      in.emplace_back(plan.in_bytes);
      out.emplace_back(plan.out_bytes, 0xA5);
      for (uint64_t b = 0; b < plan.in_bytes; b += sizeof(float)) {
        // Floats whose sum depends on the order.
        const float v = (m % 2 == 0 ? 1.0f : 1e-7f) * static_cast<float>(b + 1) + 0.1f * m;
        std::memcpy(in[m].data() + b, &v, std::min<uint64_t>(sizeof(v), plan.in_bytes - b));
      }
      io.push_back(MemberIo{in[m].data(), out[m].data(), -1});
    }
  }
  std::vector<std::vector<uint8_t>> in, out;
  std::vector<MemberIo> io;
};

// `plan` over the `members` members of `cluster` gives the one-host bits.
void ExpectOneHostBitsOn(Cluster& cluster, const OpPlan& plan, int members) {
  Regions expected(members, plan), got(members, plan);
  CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
  ASSERT_TRUE(cpu.Run(plan, expected.io).ok());
  for (const Outcome& o : cluster.RunAll(plan, got.io)) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_FALSE(o.broken);
  }
  for (int m = 0; m < members; ++m) EXPECT_EQ(got.out[m], expected.out[m]) << "member " << m;
}

// `plan` over `members` members, member m on host host_of[m] of `hosts`,
// gives the one-host bits.
void ExpectOneHostBits(int hosts, const std::vector<int>& host_of, const OpPlan& plan,
                       const HostMeshOptions& options = {}) {
  SCOPED_TRACE(absl::StrCat(plan.signature, " on hosts ", absl::StrJoin(host_of, ",")));
  auto cluster = Cluster::Connect(hosts, host_of, {options});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectOneHostBitsOn(**cluster, plan, static_cast<int>(host_of.size()));
}

TEST(HostMeshTest, PsumLanesGiveTheOneHostBits) {
  const HostMeshOptions lanes{.replicate_below_bytes = 0};
  for (int hosts : {2, 3}) {
    for (bool blocked : {false, true}) {
      ExpectOneHostBits(hosts, Layout(6, hosts, blocked), Plan(v1::PSUM, v1::FLOAT32, {1001}, 6),
                        lanes);
      ExpectOneHostBits(hosts, Layout(5, hosts, blocked), Plan(v1::PSUM, v1::BFLOAT16, {999}, 5),
                        lanes);
      ExpectOneHostBits(hosts, Layout(4, hosts, blocked), Plan(v1::PMAX, v1::INT32, {7}, 4),
                        lanes);
    }
  }
}

TEST(HostMeshTest, LargeAndSmallOpsInTurnOnOneMeshGiveTheOneHostBits) {
  // Transfers of 256 KiB and more go over the lane of their direction,
  // smaller ones and the headers over the first (host_mesh.cc): both ends
  // must pick the same one, op after op on one mesh (a mismatch waits out
  // the deadline). Round robin: the lanes; blocked: the chain.
  for (int hosts : {2, 3}) {
    for (bool blocked : {false, true}) {
      const int members = 6;
      auto cluster = Cluster::Connect(hosts, Layout(members, hosts, blocked));
      ASSERT_TRUE(cluster.ok()) << cluster.status();
      for (const OpPlan& plan : {Plan(v1::PSUM, v1::FLOAT32, {300000}, members),
                                 Plan(v1::PSUM, v1::FLOAT32, {16}, members),
                                 Plan(v1::ALL_GATHER, v1::FLOAT32, {70000}, members),
                                 Plan(v1::PMAX, v1::INT32, {100000}, members),
                                 Plan(v1::ALL_GATHER, v1::FLOAT32, {3}, members),
                                 Plan(v1::PSUM, v1::FLOAT32, {300000}, members)}) {
        SCOPED_TRACE(absl::StrCat(plan.signature, ", ", hosts, " hosts",
                                  blocked ? ", blocked" : ", round robin"));
        ExpectOneHostBitsOn(**cluster, plan, members);
        // A failed op breaks the mesh: the later ones would only repeat it.
        ASSERT_FALSE(::testing::Test::HasFailure());
      }
    }
  }
}

TEST(HostMeshTest, OpsStartedBackToBackGiveTheOneHostBits) {
  // Every host queues six ops at once (host 0 late): a host that finished
  // op s sends op s + 1's header at once, into the receive posted ahead,
  // while the others may still move op s's data.
  for (int hosts : {2, 3}) {
    const int members = 2 * hosts;
    auto cluster = Cluster::Connect(hosts, Layout(members, hosts, false));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::vector<std::shared_ptr<const OpPlan>> plans;
    for (const OpPlan& plan : {Plan(v1::PSUM, v1::FLOAT32, {200000}, members),
                               Plan(v1::PSUM, v1::INT32, {5}, members),
                               Plan(v1::ALL_GATHER, v1::FLOAT32, {70000}, members),
                               Plan(v1::PMIN, v1::INT32, {64}, members),
                               Plan(v1::PSUM, v1::FLOAT32, {300000}, members),
                               Plan(v1::ALL_GATHER, v1::INT32, {7}, members)}) {
      plans.push_back(std::make_shared<const OpPlan>(plan));
    }
    const int ops = static_cast<int>(plans.size());
    std::vector<std::unique_ptr<Regions>> expected, got;
    std::vector<int64_t> seqs;
    for (const auto& plan : plans) {
      expected.push_back(std::make_unique<Regions>(members, *plan));
      got.push_back(std::make_unique<Regions>(members, *plan));
      CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
      ASSERT_TRUE(cpu.Run(*plan, expected.back()->io).ok());
      seqs.push_back((*cluster)->NextSequence());
    }
    auto dones = Dones::Make(hosts * ops);
    std::vector<int> all;
    for (int h = hosts - 1; h >= 0; --h) {
      if (h == 0) absl::SleepFor(absl::Milliseconds(50));
      for (int i = 0; i < ops; ++i) {
        all.push_back(h * ops + i);
        (*cluster)->Start(h, plans[i], seqs[i], got[i]->io, absl::OkStatus(),
                          absl::Now() + absl::Seconds(60), dones->For(h * ops + i));
      }
    }
    ASSERT_TRUE(dones->Wait(all, absl::Seconds(90)));
    for (int i = 0; i < ops; ++i) {
      SCOPED_TRACE(absl::StrCat(plans[i]->signature, ", ", hosts, " hosts"));
      for (int h = 0; h < hosts; ++h) EXPECT_TRUE(dones->Get(h * ops + i).status.ok());
      for (int m = 0; m < members; ++m) {
        EXPECT_EQ(got[i]->out[m], expected[i]->out[m]) << "member " << m;
      }
    }
  }
}

TEST(HostMeshTest, SmallReductionsAreReplicatedInOneExchangeAndGiveTheOneHostBits) {
  // Below replicate_below_bytes (64 KiB by default) every host gets the
  // inputs it lacks and reduces them all; above, the lanes: what each host
  // sends tells them apart (3 hosts, one member each, S bytes: 2S
  // replicated, 2 * 2/3 S in lanes).
  for (int64_t elems : {1000, 20000}) {
    SCOPED_TRACE(absl::StrCat(elems, " float32"));
    const OpPlan plan = Plan(v1::PSUM, v1::FLOAT32, {elems}, 3);
    auto cluster = Cluster::Connect(3, Layout(3, 3, false));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    Regions expected(3, plan), got(3, plan);
    CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
    ASSERT_TRUE(cpu.Run(plan, expected.io).ok());
    const std::vector<Outcome> out = (*cluster)->RunAll(plan, got.io);
    for (const Outcome& o : out) EXPECT_TRUE(o.status.ok()) << o.status;
    for (int m = 0; m < 3; ++m) EXPECT_EQ(got.out[m], expected.out[m]) << "member " << m;
    // Bytes each host wrote: received, plus what its executor wrote (it
    // counts each of the 3 folds' writes of the result). Replicated: the 2
    // inputs it lacks and 3 folds of S (5S); in lanes: 2 lanes of inputs, 3
    // folds of its lane and 2 lanes of results (4/3 S + S).
    const double s = static_cast<double>(plan.in_bytes);
    for (size_t h = 0; h < out.size(); ++h) {
      const double written = static_cast<double>(out[h].traffic.written);
      if (elems == 1000) {
        EXPECT_NEAR(written, 5 * s, s / 100) << "host " << h;
      } else {
        EXPECT_NEAR(written, 7 * s / 3, s / 100) << "host " << h;
      }
    }
  }
}

TEST(HostMeshTest, TheChainInChunksGivesTheOneHostBits) {
  // Each host a contiguous run of members (m * H / 7): the reductions take
  // the chain, here in chunks of 4 KiB (20000 bytes of float32: 5 chunks,
  // the last shorter), pipelined over the hosts.
  const HostMeshOptions small_chunks{.chunk_bytes = 4096, .replicate_below_bytes = 0};
  for (int hosts : {2, 3}) {
    std::vector<int> runs(7);
    for (int m = 0; m < 7; ++m) runs[m] = m * hosts / 7;
    ExpectOneHostBits(hosts, runs, Plan(v1::PSUM, v1::FLOAT32, {5000}, 7), small_chunks);
    ExpectOneHostBits(hosts, runs, Plan(v1::PMEAN, v1::FLOAT16, {3000}, 7), small_chunks);
    ExpectOneHostBits(hosts, runs, Plan(v1::PMAX, v1::BFLOAT16, {3000}, 7), small_chunks);
    ExpectOneHostBits(hosts, runs, Plan(v1::PSUM, v1::INT64, {1500}, 7), small_chunks);
    // Not the chain (bfloat16 sums accumulate in float32): the lanes.
    ExpectOneHostBits(hosts, runs, Plan(v1::PSUM, v1::BFLOAT16, {3000}, 7), small_chunks);
  }
}

// Hosts 0..H-1 connected, every member on host m % H.
std::unique_ptr<Cluster> ConnectOrDie(int hosts, int members) {
  auto c = Cluster::Connect(hosts, Layout(members, hosts, false));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(HostMeshTest, DifferentOpsFailOnEveryHostAndTheMeshStaysUsable) {
  for (int hosts : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(hosts, " hosts"));
    const int members = 4;
    auto c = ConnectOrDie(hosts, members);
    ASSERT_NE(c, nullptr);
    auto psum = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {4}, members));
    auto gather = std::make_shared<const OpPlan>(Plan(v1::ALL_GATHER, v1::FLOAT32, {4}, members));
    auto wider = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {8}, members));
    for (const auto& other : {gather, wider}) {
      Regions r(members, *psum), r_other(members, *other);
      const int64_t seq = c->NextSequence();
      auto dones = Dones::Make(hosts);
      std::vector<int> all;
      for (int h = 0; h < hosts; ++h) {
        all.push_back(h);
        c->Start(h, h == 1 ? other : psum, seq, h == 1 ? r_other.io : r.io, absl::OkStatus(),
                 absl::Now() + absl::Seconds(30), dones->For(h));
      }
      ASSERT_TRUE(dones->Wait(all));
      for (int h = 0; h < hosts; ++h) {
        const Outcome o = dones->Get(h);
        EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
        EXPECT_FALSE(o.broken) << "host " << h;
        EXPECT_NE(o.status.message().find(absl::StrCat("host h1 submitted ", other->signature,
                                                       " where host h0 submitted ",
                                                       psum->signature)),
                  std::string::npos)
            << o.status;
      }
      // The outputs were not written.
      for (int m = 0; m < members; ++m) {
        EXPECT_EQ(r.out[m], std::vector<uint8_t>(psum->out_bytes, 0xA5)) << "member " << m;
      }
    }
    // The next op, the same everywhere, runs on the same meshes.
    Regions expected(members, *psum), got(members, *psum);
    CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
    ASSERT_TRUE(cpu.Run(*psum, expected.io).ok());
    for (const Outcome& o : c->RunAll(*psum, got.io)) EXPECT_TRUE(o.status.ok()) << o.status;
    for (int m = 0; m < members; ++m) EXPECT_EQ(got.out[m], expected.out[m]) << "member " << m;
  }
}

// Two hosts whose options differ in `flag`'s setting, members on host
// host_of[m]: `plan` fails on both alike naming the flag, the connections
// stay usable and no output is written.
void ExpectDisagreeingHostsFailAlike(const std::vector<int>& host_of,
                                     const std::vector<HostMeshOptions>& options,
                                     const OpPlan& plan, const std::string& flag) {
  auto c = Cluster::Connect(2, host_of, options);
  ASSERT_TRUE(c.ok()) << c.status();
  const int members = static_cast<int>(host_of.size());
  Regions r(members, plan);
  for (const Outcome& o : (*c)->RunAll(plan, r.io)) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
    EXPECT_NE(o.status.message().find(flag), std::string::npos) << o.status;
    EXPECT_FALSE(o.broken);
  }
  for (int m = 0; m < members; ++m) {
    EXPECT_EQ(r.out[m], std::vector<uint8_t>(plan.out_bytes, 0xA5)) << "member " << m;
  }
}

TEST(HostMeshTest, HostsWithDifferentChunkSizesFailTheOpAlikeAndMoveNothing) {
  // The chunk sets the chain's transfer sizes: hosts that disagree on it
  // must not start the data phase (a slot whose ends disagree on its size
  // is a protocol error that breaks the mesh).
  ExpectDisagreeingHostsFailAlike(
      {0, 0, 1, 1}, {HostMeshOptions{.chunk_bytes = 4096}, HostMeshOptions{.chunk_bytes = 8192}},
      Plan(v1::PSUM, v1::FLOAT32, {5000}, 4), "--cluster-chunk-bytes");
}

TEST(HostMeshTest, HostsWithDifferentReplicationThresholdsFailTheOpAlike) {
  // One host would replicate the op, the other cut it into lanes.
  ExpectDisagreeingHostsFailAlike({0, 1},
                                  {HostMeshOptions{.replicate_below_bytes = 0},
                                   HostMeshOptions{.replicate_below_bytes = 1 << 20}},
                                  Plan(v1::PSUM, v1::FLOAT32, {1000}, 2),
                                  "--cluster-replicate-bytes");
}

TEST(HostMeshTest, HostsAtDifferentOpCountsFailAtOnceAndBreakTheMesh) {
  // Their headers meet on the header slot whatever the sequences, so the
  // hosts learn at once that they disagree (instead of waiting out the op
  // timeout on slots the other never posts); no later op could agree, so
  // the mesh breaks.
  const int hosts = 2, members = 2;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {4}, members));
  Regions r(members, *plan);
  auto dones = Dones::Make(hosts);
  // Host 0 also refuses the op: the diverged op counts are still what it
  // fails with (a refusal alone would leave the mesh usable).
  for (int h = 0; h < hosts; ++h) {
    c->Start(h, plan, /*sequence=*/7 + h, r.io,
             h == 0 ? absl::InvalidArgumentError("a bad buffer") : absl::OkStatus(),
             absl::Now() + absl::Seconds(60), dones->For(h));
  }
  ASSERT_TRUE(dones->Wait({0, 1}, absl::Seconds(30)));
  for (int h = 0; h < hosts; ++h) {
    const Outcome o = dones->Get(h);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
    EXPECT_TRUE(o.broken) << "host " << h;
    EXPECT_LT(o.took, absl::Seconds(20)) << "waited for the deadline";
    EXPECT_NE(o.status.message().find("(op 8 where op 7)"), std::string::npos) << o.status;
    EXPECT_NE(o.status.message().find("op counts or wire formats differ"), std::string::npos)
        << o.status;
  }
  for (int m = 0; m < members; ++m) {
    EXPECT_EQ(r.out[m], std::vector<uint8_t>(plan->out_bytes, 0xA5)) << "member " << m;
  }
}

TEST(HostMeshTest, AnOpWithNoDeadlineWaitsForALateHost) {
  // An op timeout of "forever" (INT64_MAX ms, an infinite deadline) must
  // overflow no wait (over Gloo it timed out at once and broke the mesh).
  const int hosts = 2, members = 2;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {4}, members));
  Regions expected(members, *plan), got(members, *plan);
  CpuExecutor cpu(CpuExecutorOptions{.threads = 1});
  ASSERT_TRUE(cpu.Run(*plan, expected.io).ok());
  const int64_t seq = c->NextSequence();
  auto dones = Dones::Make(hosts);
  c->Start(0, plan, seq, got.io, absl::OkStatus(), absl::InfiniteFuture(), dones->For(0));
  absl::SleepFor(absl::Milliseconds(300));
  c->Start(1, plan, seq, got.io, absl::OkStatus(), absl::InfiniteFuture(), dones->For(1));
  ASSERT_TRUE(dones->Wait({0, 1}, absl::Seconds(30)));
  for (int h = 0; h < hosts; ++h) EXPECT_TRUE(dones->Get(h).status.ok()) << dones->Get(h).status;
  for (int m = 0; m < members; ++m) EXPECT_EQ(got.out[m], expected.out[m]) << "member " << m;
}

TEST(HostMeshTest, AHeaderOfAnotherBuildIsNamedAndBreaksTheMesh) {
  // Host 1 is a bare transport peer that answers host 0's header with one
  // of another size, as a daemon of another build would: longer and
  // shorter. The op fails on host 0 naming the wire format, and the mesh
  // breaks.
  for (const size_t bytes : {size_t{600}, size_t{100}}) {
    SCOPED_TRACE(absl::StrCat(bytes, " bytes"));
    MemoryBook book;
    absl::StatusOr<std::unique_ptr<CrossHostMesh>> mesh = absl::UnknownError("not connected");
    MeshTopology t;
    t.generation = 1;
    t.member_host = {HostId(0), HostId(1)};
    t.hosts = {HostId(0), HostId(1)};
    t.addresses = {"127.0.0.1", "127.0.0.1"};
    t.self = 0;
    std::thread host0([&] {
      mesh = ConnectHostMesh(book, "odd-peer", t, "127.0.0.1", Security(1),
                             absl::Now() + absl::Seconds(30));
    });
    // A mesh's connections (host_mesh.cc): two lanes; headers go over the
    // first.
    TransportOptions two;
    two.lanes = 2;
    auto peer = HostTransport::Connect(book, "odd-peer", t.hosts, 1, "127.0.0.1", Security(1),
                                       absl::Now() + absl::Seconds(30), two);
    host0.join();
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ASSERT_TRUE(peer.ok()) << peer.status();

    auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {4}, 2));
    Regions r(2, *plan);
    CpuExecutor cpu(CpuExecutorOptions{.threads = 1});
    auto dones = Dones::Make(1);
    (*mesh)->Start(plan, 1, {r.io[0], MemberIo{}}, &cpu, absl::OkStatus(),
                   absl::Now() + absl::Seconds(30), dones->For(0));
    // The header slot (host_mesh.cc): host 0's header in, the odd one out.
    constexpr uint64_t kHeaderSlot = uint64_t{1} << 63;
    std::vector<uint8_t> theirs(4096), odd(bytes, 0x5A);
    auto in = (*peer)->Recv(0, 0, kHeaderSlot, theirs.data(), theirs.size());
    auto out = (*peer)->Send(0, 0, kHeaderSlot, odd.data(), odd.size());
    ASSERT_TRUE(in.ok() && out.ok());
    EXPECT_TRUE((*in)->Wait(absl::Now() + absl::Seconds(30)).ok());
    EXPECT_TRUE((*out)->Wait(absl::Now() + absl::Seconds(30)).ok());
    ASSERT_TRUE(dones->Wait({0}, absl::Seconds(30)));
    const Outcome o = dones->Get(0);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
    EXPECT_TRUE(o.broken);
    EXPECT_NE(o.status.message().find(absl::StrCat("host h1 submitted an op in another wire "
                                                   "format (version 1515870810, 1515870810 "
                                                   "bytes; this build's: version ")),
              std::string::npos)
        << o.status;
    EXPECT_NE(o.status.message().find(") (wire version differ); the hosts' op counts or wire "
                                      "formats differ"),
              std::string::npos)
        << o.status;
    EXPECT_EQ(r.out[0], std::vector<uint8_t>(plan->out_bytes, 0xA5));
    // The peer is told why host 0 broke the mesh.
    auto more = (*peer)->Recv(0, 0, kHeaderSlot, theirs.data(), theirs.size());
    absl::Status told = more.ok() ? (*more)->Wait(absl::Now() + absl::Seconds(10)) : more.status();
    EXPECT_EQ(told.code(), absl::StatusCode::kFailedPrecondition) << told;
    EXPECT_NE(told.message().find("wire version differ"), std::string::npos) << told;
    in->reset();
    out->reset();
    more = absl::CancelledError("done");
    mesh->reset();
  }
}

TEST(HostMeshTest, AHostsRefusalFailsTheOpOnEveryHost) {
  const int hosts = 3, members = 3;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::INT32, {16}, members));
  Regions r(members, *plan);
  const int64_t seq = c->NextSequence();
  auto dones = Dones::Make(hosts);
  for (int h = 0; h < hosts; ++h) {
    c->Start(h, plan, seq, r.io,
             h == 2 ? absl::FailedPreconditionError("member 2 submitted pmax") : absl::OkStatus(),
             absl::Now() + absl::Seconds(30), dones->For(h));
  }
  ASSERT_TRUE(dones->Wait({0, 1, 2}));
  for (int h = 0; h < hosts; ++h) {
    const Outcome o = dones->Get(h);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
    EXPECT_FALSE(o.broken);
    EXPECT_NE(o.status.message().find("host h2 refused it: member 2 submitted pmax"),
              std::string::npos)
        << o.status;
    EXPECT_EQ(o.status.message().find("host h0"), std::string::npos) << o.status;
  }
  // Still usable.
  for (const Outcome& o : c->RunAll(*plan, r.io)) EXPECT_TRUE(o.status.ok()) << o.status;
}

// An executor of another kind of memory (host memory underneath, run by a
// CpuExecutor), for the cross-host mesh's handling of memory the transport cannot
// move: whether it connects hosts, and what its link's id and connection
// give. Its links never connect (a real one needs a GPU: the CUDA
// executor's NCCL link is tested end to end on a GPU machine).
class OtherMemoryExecutor final : public Executor {
 public:
  OtherMemoryExecutor(bool connects, absl::StatusOr<std::string> id, absl::Status connect)
      : connects_(connects), id_(std::move(id)), connect_(std::move(connect)) {}
  absl::string_view name() const override { return "other"; }
  absl::string_view buffer_kind() const override { return "other"; }
  bool IsViable() const override { return true; }
  int threads() const override { return 1; }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic) override {
    return cpu_.Run(plan, io, traffic);
  }
  bool ConnectsHosts() const override { return connects_; }
  absl::StatusOr<std::string> NewHostLinkId() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++ids_made_;
    return id_;
  }
  absl::StatusOr<std::unique_ptr<HostLink>> ConnectHosts(const std::string& id, int rank,
                                                         int ranks, int device, absl::Time,
                                                         const std::atomic<bool>&) override {
    std::lock_guard<std::mutex> lock(mu_);
    connected_with_ = absl::StrCat(id, " rank ", rank, " of ", ranks, " on device ", device);
    return connect_;
  }
  int ids_made() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_made_;
  }
  std::string connected_with() {
    std::lock_guard<std::mutex> lock(mu_);
    return connected_with_;
  }

 private:
  CpuExecutor cpu_{CpuExecutorOptions{.threads = 1}};
  const bool connects_;
  const absl::StatusOr<std::string> id_;
  const absl::Status connect_;
  std::mutex mu_;
  int ids_made_ = 0;
  std::string connected_with_;
};

// Runs `plan` on every host of `c`, host h on executors[h] with its
// members' regions on `device(h, m)`; the outcomes.
std::vector<Outcome> RunOn(Cluster& c, const std::vector<Executor*>& executors,
                           const OpPlan& plan, const std::vector<MemberIo>& io,
                           const std::function<int(int, size_t)>& device = nullptr) {
  auto shared = std::make_shared<const OpPlan>(plan);
  const int64_t seq = c.NextSequence();
  auto dones = Dones::Make(c.hosts());
  std::vector<int> all;
  for (int h = 0; h < c.hosts(); ++h) {
    all.push_back(h);
    std::vector<MemberIo> local = c.IoOf(h, io);
    for (size_t m = 0; m < local.size(); ++m) {
      if (local[m].in != nullptr) local[m].device = device ? device(h, m) : 0;
    }
    c.mesh(h).Start(shared, seq, std::move(local), executors[h], absl::OkStatus(),
                    absl::Now() + absl::Seconds(30), dones->For(h));
  }
  std::vector<Outcome> out(c.hosts());
  EXPECT_TRUE(dones->Wait(all));
  for (int h = 0; h < c.hosts(); ++h) out[h] = dones->Get(h);
  return out;
}

// Every host's outcome has `code`, each of `texts` in its message, and
// `broken`.
void ExpectEveryHost(const std::vector<Outcome>& outcomes, absl::StatusCode code,
                     const std::vector<std::string>& texts, bool broken) {
  for (size_t h = 0; h < outcomes.size(); ++h) {
    const Outcome& o = outcomes[h];
    EXPECT_EQ(o.status.code(), code) << "host " << h << ": " << o.status;
    for (const std::string& text : texts) {
      EXPECT_NE(o.status.message().find(text), std::string::npos)
          << "host " << h << ": " << o.status << " (expected \"" << text << "\")";
    }
    EXPECT_EQ(o.broken, broken) << "host " << h;
  }
}

TEST(HostMeshTest, MemoryNoTransportCanMoveFailsTheOpOnEveryHostAndTheMeshGoesOn) {
  const int hosts = 2, members = 4;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  OtherMemoryExecutor a(false, "id", absl::OkStatus()), b(false, "id", absl::OkStatus());
  const OpPlan plan = Plan(v1::PSUM, v1::FLOAT32, {8}, members);
  Regions r(members, plan);
  ExpectEveryHost(RunOn(*c, {&a, &b}, plan, r.io), absl::StatusCode::kFailedPrecondition,
                  {"runs on other memory, which the other executor cannot move between hosts"},
                  /*broken=*/false);
  EXPECT_EQ(a.ids_made() + b.ids_made(), 0);
  for (const Outcome& o : c->RunAll(plan, r.io)) EXPECT_TRUE(o.status.ok()) << o.status;
}

TEST(HostMeshTest, HostsOnDifferentKindsOfMemoryFailTheOpAlike) {
  const int hosts = 2, members = 4;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  CpuExecutor cpu(CpuExecutorOptions{.threads = 1});
  OtherMemoryExecutor other(true, "id", absl::OkStatus());
  const OpPlan plan = Plan(v1::PSUM, v1::INT32, {8}, members);
  Regions r(members, plan);
  ExpectEveryHost(RunOn(*c, {&cpu, &other}, plan, r.io), absl::StatusCode::kFailedPrecondition,
                  {"kind of memory (other and memfd)"}, /*broken=*/false);
  EXPECT_EQ(other.ids_made(), 0);
  for (const Outcome& o : c->RunAll(plan, r.io)) EXPECT_TRUE(o.status.ok()) << o.status;
}

TEST(HostMeshTest, AHostsMembersOnTwoDevicesAreRefusedOnEveryHost) {
  const int hosts = 2, members = 4;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  OtherMemoryExecutor a(true, "id", absl::OkStatus()), b(true, "id", absl::OkStatus());
  const OpPlan plan = Plan(v1::PMAX, v1::FLOAT32, {8}, members);
  Regions r(members, plan);
  // Host h0 holds members 0 and 2 (round robin): on devices 0 and 2.
  ExpectEveryHost(RunOn(*c, {&a, &b}, plan, r.io,
                        [](int h, size_t m) { return h == 0 ? static_cast<int>(m) : 1; }),
                  absl::StatusCode::kFailedPrecondition,
                  {"host h0 refused it", "on devices 0, 2"}, /*broken=*/false);
  EXPECT_EQ(a.ids_made() + b.ids_made(), 0);
}

TEST(HostMeshTest, TheLinkIdGoesFromHostZeroToEveryHostAndAFailedLinkBreaksTheMesh) {
  const int hosts = 3, members = 3;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  std::vector<std::unique_ptr<OtherMemoryExecutor>> execs;
  std::vector<Executor*> ptrs;
  for (int h = 0; h < hosts; ++h) {
    execs.push_back(std::make_unique<OtherMemoryExecutor>(
        true, absl::StrCat("id-of-h", h), absl::UnavailableError(absl::StrCat("no link on h", h))));
    ptrs.push_back(execs.back().get());
  }
  const OpPlan plan = Plan(v1::PSUM, v1::FLOAT32, {8}, members);
  Regions r(members, plan);
  const auto outcomes = RunOn(*c, ptrs, plan, r.io, [](int h, size_t) { return h; });
  // The first host whose link fails breaks the mesh with its reason; a host
  // that the BREAK reaches before its own attempt fails with that reason
  // and never connects. At least one host fails on its own link.
  int own_failures = 0;
  for (int h = 0; h < hosts; ++h) {
    const Outcome& o = outcomes[h];
    EXPECT_EQ(o.status.code(), absl::StatusCode::kAborted) << o.status;
    EXPECT_NE(o.status.message().find("over the other executor's link failed (no link on h"),
              std::string::npos)
        << o.status;
    EXPECT_TRUE(o.broken);
    // Host h0 made the id; every host that tried connected with it.
    EXPECT_EQ(execs[h]->ids_made(), h == 0 ? 1 : 0);
    if (execs[h]->connected_with().empty()) continue;
    EXPECT_EQ(execs[h]->connected_with(),
              absl::StrCat("id-of-h0 rank ", h, " of ", hosts, " on device ", h));
    if (o.status.message().find(absl::StrCat("(no link on h", h, ")")) != std::string::npos) {
      ++own_failures;
    }
  }
  EXPECT_GE(own_failures, 1);
  // The mesh is broken: the next op fails at once, naming why.
  for (const Outcome& o : c->RunAll(plan, r.io)) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kAborted) << o.status;
    EXPECT_NE(o.status.message().find("broke in an earlier op"), std::string::npos) << o.status;
  }
}

TEST(HostMeshTest, HostZeroWithoutALinkIdFailsTheOpOnEveryHost) {
  const int hosts = 2, members = 2;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  OtherMemoryExecutor a(true, absl::ResourceExhaustedError("no ids left"), absl::OkStatus());
  OtherMemoryExecutor b(true, "unused", absl::OkStatus());
  const OpPlan plan = Plan(v1::PSUM, v1::FLOAT32, {8}, members);
  Regions r(members, plan);
  ExpectEveryHost(RunOn(*c, {&a, &b}, plan, r.io), absl::StatusCode::kAborted,
                  {"host h0 could not make the link between hosts: no ids left"},
                  /*broken=*/true);
  EXPECT_EQ(b.connected_with(), "");
}

TEST(HostMeshTest, BarrierAndEmptyOpsExchangeHeaders) {
  const int hosts = 2, members = 4;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  v1::OpSpec barrier;
  barrier.set_kind(v1::BARRIER);
  barrier.add_axes("x");
  auto plan = PlanOp(barrier, MeshShape{{"x"}, {members}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<MemberIo> io(members);
  for (const Outcome& o : c->RunAll(*plan, io)) EXPECT_TRUE(o.status.ok()) << o.status;
  OpPlan empty = Plan(v1::PSUM, v1::FLOAT32, {0}, members);
  Regions r(members, empty);
  for (const Outcome& o : c->RunAll(empty, r.io)) EXPECT_TRUE(o.status.ok()) << o.status;
  // A barrier a host does not join is not passed.
  auto shared = std::make_shared<const OpPlan>(*plan);
  const int64_t seq = c->NextSequence();
  auto dones = Dones::Make(hosts);
  c->Start(0, shared, seq, io, absl::OkStatus(), absl::Now() + absl::Milliseconds(300),
           dones->For(0));
  ASSERT_TRUE(dones->Wait({0}));
  EXPECT_EQ(dones->Get(0).status.code(), absl::StatusCode::kDeadlineExceeded) << dones->Get(0).status;
}

TEST(HostMeshTest, HostsThatNeverStartTheOpAreNamedAtTheDeadline) {
  const int hosts = 3, members = 3;
  struct Case {
    std::vector<int> started;
    std::string named;  // in every started host's message
    std::string not_named;
  };
  for (const Case& k : {Case{{0, 1}, "host h2 did not take part", "h1"},
                        Case{{0, 2}, "host h1 did not take part", "h2"},
                        Case{{2}, "hosts h0, h1 did not take part", "h2"}}) {
    SCOPED_TRACE(k.named);
    auto c = ConnectOrDie(hosts, members);
    ASSERT_NE(c, nullptr);
    auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {64}, members));
    Regions r(members, *plan);
    const int64_t seq = c->NextSequence();
    auto dones = Dones::Make(hosts);
    for (int h : k.started) {
      c->Start(h, plan, seq, r.io, absl::OkStatus(), absl::Now() + absl::Milliseconds(300),
               dones->For(h));
    }
    ASSERT_TRUE(dones->Wait(k.started, absl::Seconds(30)));
    for (int h : k.started) {
      const Outcome o = dones->Get(h);
      EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
      EXPECT_TRUE(o.broken);
      EXPECT_NE(o.status.message().find(k.named), std::string::npos) << o.status;
      const std::string message(o.status.message());
      EXPECT_EQ(message.substr(0, message.find(" did not")).find(k.not_named), std::string::npos)
          << o.status;
      EXPECT_LT(o.took, absl::Seconds(10));
    }
    // The broken mesh fails later ops at once.
    auto later = Dones::Make(hosts);
    const int h = k.started[0];
    c->Start(h, plan, c->NextSequence(), r.io, absl::OkStatus(), absl::Now() + absl::Seconds(30),
             later->For(h));
    ASSERT_TRUE(later->Wait({h}, absl::Seconds(10)));
    EXPECT_EQ(later->Get(h).status.code(), absl::StatusCode::kAborted) << later->Get(h).status;
    EXPECT_TRUE(later->Get(h).broken);
  }
}

// With the engines' observers installed (as the daemon does), a host whose
// header is late is asked shortly before the deadline what its members are
// doing, and the op fails at the deadline naming them in the words of the
// one-host daemon, on every host that waited.
TEST(HostMeshTest, ALateHostsMissingMembersAreNamedByItsOwnAnswerAtTheDeadline) {
  const int hosts = 3, members = 3;
  struct Case {
    std::string answer;  // host h2's
    std::string named;
  };
  for (const Case& k :
       {Case{"2 (2) pid 42 host h2 'late'", "missing: 2 (2) pid 42 host h2 'late'"},
        Case{"", "host h2 had every member's op but did not start it in time"}}) {
    SCOPED_TRACE(k.named);
    auto c = ConnectOrDie(hosts, members);
    ASSERT_NE(c, nullptr);
    std::atomic<int> asked{0};
    for (int h = 0; h < hosts; ++h) {
      CrossHostObserver o;
      o.on_query = [&, h](int64_t) {
        asked.fetch_add(1);
        return h == 2 ? k.answer : std::string();
      };
      c->mesh(h).Observe(std::move(o));
    }
    auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {64}, members));
    Regions r(members, *plan);
    const int64_t seq = c->NextSequence();
    auto dones = Dones::Make(hosts);
    const absl::Time deadline = absl::Now() + absl::Milliseconds(600);
    for (int h : {0, 1}) {
      c->mesh(h).Start(plan, seq, c->IoOf(h, r.io), nullptr, absl::OkStatus(), deadline,
                       dones->For(h), absl::Milliseconds(600));
    }
    ASSERT_TRUE(dones->Wait({0, 1}, absl::Seconds(30)));
    for (int h : {0, 1}) {
      const Outcome o = dones->Get(h);
      EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
      EXPECT_TRUE(o.broken);
      EXPECT_NE(o.status.message().find(absl::StrCat("op ", seq, " timed out after 600 ms: ",
                                                     "members 0,1 are waiting in ")),
                std::string::npos)
          << o.status;
      EXPECT_NE(o.status.message().find(k.named), std::string::npos) << o.status;
      // The deadline holds.
      EXPECT_LT(o.took, absl::Milliseconds(600) + absl::Milliseconds(150)) << "host " << h;
    }
    EXPECT_GE(asked.load(), 1);
  }
}

// An idle mesh learns at once that another host broke it, and why: what
// the engine then breaks its own members' mesh with.
TEST(HostMeshTest, AnotherHostsBreakReachesTheObserverOfAnIdleMesh) {
  auto c = ConnectOrDie(3, 3);
  ASSERT_NE(c, nullptr);
  struct Seen {
    std::mutex mu;
    std::vector<absl::Status> breaks;
  };
  std::vector<std::shared_ptr<Seen>> seen;
  for (int h = 0; h < 3; ++h) {
    seen.push_back(std::make_shared<Seen>());
    CrossHostObserver o;
    o.on_broken = [s = seen.back()](const absl::Status& why) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->breaks.push_back(why);
    };
    if (h != 1) c->mesh(h).Observe(std::move(o));
  }
  const absl::Status why =
      absl::AbortedError("member 2 (2) pid 42 host h2 'w' is gone: its process ended");
  c->mesh(2).Abort(why);
  auto wait_for = [&](int h) {
    for (int i = 0; i < 5000; ++i) {
      {
        std::lock_guard<std::mutex> lock(seen[h]->mu);
        if (!seen[h]->breaks.empty()) return true;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return false;
  };
  ASSERT_TRUE(wait_for(0));
  // Host 1 installs its observer late: the break that came is reported at
  // once.
  absl::SleepFor(absl::Milliseconds(100));
  CrossHostObserver late;
  late.on_broken = [s = seen[1]](const absl::Status& w) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->breaks.push_back(w);
  };
  c->mesh(1).Observe(std::move(late));
  ASSERT_TRUE(wait_for(1));
  for (int h : {0, 1}) {
    std::lock_guard<std::mutex> lock(seen[h]->mu);
    ASSERT_EQ(seen[h]->breaks.size(), 1u) << "host " << h;
    EXPECT_EQ(seen[h]->breaks[0], why) << "host " << h;
  }
  // The host that broke the mesh is not told its own reason.
  std::lock_guard<std::mutex> lock(seen[2]->mu);
  EXPECT_TRUE(seen[2]->breaks.empty());
}

// An op that failed with ABORTED containing `text`, broke the mesh, and was
// told well before its 30 s deadline.
void ExpectAbortedWith(const Outcome& o, const std::string& text) {
  EXPECT_EQ(o.status.code(), absl::StatusCode::kAborted) << o.status;
  EXPECT_NE(o.status.message().find(text), std::string::npos) << o.status;
  EXPECT_TRUE(o.broken);
  EXPECT_LT(o.took, absl::Seconds(10));
}

// An executor whose link between hosts behaves as NCCL's can, for the
// cross-host mesh's watch of the connections while an op is on the link
// (the data path is the CUDA executor's, tested on a GPU machine):
//   kConnectWaits  the connect waits for its peers until it is stopped
//   kRunsOk        the link connects at once; its runs succeed, moving nothing
//   kRunWaits      its runs wait until they are stopped (a peer's data never comes)
//   kRunFails      its runs fail on their own ("the device broke")
class LinkExecutor final : public Executor {
 public:
  enum class Mode { kConnectWaits, kRunsOk, kRunWaits, kRunFails };
  explicit LinkExecutor(Mode mode) : mode_(mode) {}
  absl::string_view name() const override { return "linked"; }
  absl::string_view buffer_kind() const override { return "linked"; }
  bool IsViable() const override { return true; }
  int threads() const override { return 1; }
  absl::Status Run(const OpPlan&, const std::vector<MemberIo>&, Traffic*) override {
    return absl::UnimplementedError("only across hosts");
  }
  bool ConnectsHosts() const override { return true; }
  absl::StatusOr<std::string> NewHostLinkId() override { return std::string("id"); }
  absl::StatusOr<std::unique_ptr<HostLink>> ConnectHosts(const std::string&, int, int, int device,
                                                         absl::Time deadline,
                                                         const std::atomic<bool>& abort) override {
    connects_.fetch_add(1);
    if (mode_ == Mode::kConnectWaits) return WaitForStop(deadline, abort);
    return std::unique_ptr<HostLink>(new Link(this, device));
  }
  int connects() const { return connects_.load(); }
  int runs() const { return runs_.load(); }

 private:
  class Link final : public HostLink {
   public:
    Link(LinkExecutor* owner, int device) : owner_(owner), device_(device) {}
    absl::Status Run(const OpPlan&, const std::vector<MemberIo>&, const SpanningOptions&, uint8_t*,
                     absl::Time deadline, const std::atomic<bool>& abort, Traffic*) override {
      owner_->runs_.fetch_add(1);
      switch (owner_->mode_) {
        case Mode::kRunWaits:
          return WaitForStop(deadline, abort);
        case Mode::kRunFails:
          return absl::InternalError("the device broke");
        default:
          return absl::OkStatus();
      }
    }
    int device() const override { return device_; }

   private:
    LinkExecutor* const owner_;
    const int device_;
  };
  static absl::Status WaitForStop(absl::Time deadline, const std::atomic<bool>& abort) {
    while (!abort.load()) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("the peers never came");
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::AbortedError("stopped");
  }
  const Mode mode_;
  std::atomic<int> connects_{0};
  std::atomic<int> runs_{0};
};

TEST(HostMeshTest, OpsOverALinkEndTogetherAndTheLinkIsKept) {
  const int hosts = 3, members = 3;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  std::vector<std::unique_ptr<LinkExecutor>> execs;
  std::vector<Executor*> ptrs;
  for (int h = 0; h < hosts; ++h) {
    execs.push_back(std::make_unique<LinkExecutor>(LinkExecutor::Mode::kRunsOk));
    ptrs.push_back(execs.back().get());
  }
  const OpPlan plan = Plan(v1::PSUM, v1::FLOAT32, {8}, members);
  Regions r(members, plan);
  for (int op = 0; op < 3; ++op) {
    for (const Outcome& o : RunOn(*c, ptrs, plan, r.io)) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      EXPECT_FALSE(o.broken);
    }
  }
  for (int h = 0; h < hosts; ++h) {
    EXPECT_EQ(execs[h]->connects(), 1) << "host " << h;
    EXPECT_EQ(execs[h]->runs(), 3) << "host " << h;
  }
}

// A host whose mesh breaks while the others wait for the link to connect
// (a member killed there): they are told at once, naming it, not at the
// deadline.
TEST(HostMeshTest, AHostLeavingWhileTheLinkConnectsFailsTheOthersAtOnce) {
  const int hosts = 3, members = 3;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  std::vector<std::unique_ptr<LinkExecutor>> execs;
  for (int h = 0; h < hosts; ++h) {
    execs.push_back(std::make_unique<LinkExecutor>(LinkExecutor::Mode::kConnectWaits));
  }
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {8}, members));
  Regions r(members, *plan);
  auto dones = Dones::Make(hosts);
  const int64_t seq = c->NextSequence();
  const absl::Time start = absl::Now();
  for (int h = 0; h < hosts; ++h) {
    c->mesh(h).Start(plan, seq, c->IoOf(h, r.io), execs[h].get(), absl::OkStatus(),
                     absl::Now() + absl::Seconds(60), dones->For(h));
  }
  // Every host is in the connect.
  for (int h = 0; h < hosts; ++h) {
    for (int i = 0; i < 5000 && execs[h]->connects() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(execs[h]->connects(), 1) << "host " << h;
  }
  c->mesh(2).Abort(absl::AbortedError("member 2 (2) pid 7 host h2 is gone"));
  ASSERT_TRUE(dones->Wait({0, 1, 2}, absl::Seconds(20)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // Every host names the member, in the same words.
  for (int h : {0, 1, 2}) ExpectAbortedWith(dones->Get(h), "member 2 (2) pid 7 host h2 is gone");
}

// Starts `plan` on both hosts of `c`, host 0 on e0 and host 1 on e1; waits
// until both links run it.
std::shared_ptr<Dones> StartOnLinks(Cluster& c, std::shared_ptr<const OpPlan> plan,
                                    const std::vector<MemberIo>& io, LinkExecutor& e0,
                                    LinkExecutor& e1) {
  auto dones = Dones::Make(2);
  const int64_t seq = c.NextSequence();
  LinkExecutor* execs[] = {&e0, &e1};
  for (int h = 0; h < 2; ++h) {
    c.mesh(h).Start(plan, seq, c.IoOf(h, io), execs[h], absl::OkStatus(),
                    absl::Now() + absl::Seconds(60), dones->For(h));
  }
  for (int i = 0; i < 5000 && (e0.runs() == 0 || e1.runs() == 0); ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return dones;
}

// An Abort stops an op on the link even after the other host finished its
// part (its fence has arrived: no receive of the op is left to fail).
TEST(HostMeshTest, AbortStopsALinkRunAfterTheOtherHostFinished) {
  auto c = ConnectOrDie(2, 2);
  ASSERT_NE(c, nullptr);
  LinkExecutor waits(LinkExecutor::Mode::kRunWaits), ok(LinkExecutor::Mode::kRunsOk);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {8}, 2));
  Regions r(2, *plan);
  const absl::Time start = absl::Now();
  auto dones = StartOnLinks(*c, plan, r.io, waits, ok);
  ASSERT_EQ(waits.runs(), 1);
  ASSERT_EQ(ok.runs(), 1);
  absl::SleepFor(absl::Milliseconds(300));  // host 1's fence reaches host 0
  c->mesh(0).Abort(absl::AbortedError("closing"));
  ASSERT_TRUE(dones->Wait({0, 1}, absl::Seconds(20)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ExpectAbortedWith(dones->Get(0), "closing");
  ExpectAbortedWith(dones->Get(1), "closing");
}

// A link that fails on its own reports its own error; the other host, whose
// run waits for it, is stopped at once and told that error (the mesh breaks
// its connections when an op breaks it, telling the other hosts why).
TEST(HostMeshTest, ALinkThatFailsOnItsOwnSaysWhyAndStopsTheOtherHost) {
  auto c = ConnectOrDie(2, 2);
  ASSERT_NE(c, nullptr);
  LinkExecutor fails(LinkExecutor::Mode::kRunFails), waits(LinkExecutor::Mode::kRunWaits);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {8}, 2));
  Regions r(2, *plan);
  auto dones = StartOnLinks(*c, plan, r.io, fails, waits);
  ASSERT_TRUE(dones->Wait({0}, absl::Seconds(20)));
  ExpectAbortedWith(dones->Get(0), "the device broke");
  ASSERT_TRUE(dones->Wait({1}, absl::Seconds(20)));
  ExpectAbortedWith(dones->Get(1), "the device broke");
}

TEST(HostMeshTest, AbortFailsTheOpInFlightWithTheReasonAndThePeersAreToldIt) {
  const int hosts = 2, members = 2;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {64}, members));
  Regions r(members, *plan);
  // Host 0 waits in the op (host 1 has not started it); host 0 is aborted.
  auto dones = Dones::Make(hosts);
  const int64_t seq = c->NextSequence();
  c->Start(0, plan, seq, r.io, absl::OkStatus(), absl::Now() + absl::Seconds(30), dones->For(0));
  absl::SleepFor(absl::Milliseconds(200));
  c->mesh(0).Abort(absl::AbortedError("operator stop"));
  ASSERT_TRUE(dones->Wait({0}, absl::Seconds(20)));
  EXPECT_EQ(dones->Get(0).status.message(), "operator stop");
  ExpectAbortedWith(dones->Get(0), "operator stop");
  // Host 1 now starts the op: host 0 told it why it broke the mesh, so it
  // fails at once, with that reason.
  c->Start(1, plan, seq, r.io, absl::OkStatus(), absl::Now() + absl::Seconds(30), dones->For(1));
  ASSERT_TRUE(dones->Wait({1}, absl::Seconds(20)));
  ExpectAbortedWith(dones->Get(1), "operator stop");
}

TEST(HostMeshTest, AbortOfAPeerFailsTheOpsWaitingOnIt) {
  const int hosts = 3, members = 3;
  auto c = ConnectOrDie(hosts, members);
  ASSERT_NE(c, nullptr);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {64}, members));
  Regions r(members, *plan);
  // One op first: every host then has the next headers' receives posted,
  // which hold its connections until an Abort drops them.
  for (const Outcome& o : c->RunAll(*plan, r.io)) ASSERT_TRUE(o.status.ok()) << o.status;
  auto dones = Dones::Make(hosts);
  const int64_t seq = c->NextSequence();
  for (int h : {0, 1}) {
    c->Start(h, plan, seq, r.io, absl::OkStatus(), absl::Now() + absl::Seconds(30), dones->For(h));
  }
  absl::SleepFor(absl::Milliseconds(200));
  c->mesh(2).Abort(absl::AbortedError("host 2 leaves"));  // idle
  ASSERT_TRUE(dones->Wait({0, 1}, absl::Seconds(20)));
  for (int h : {0, 1}) ExpectAbortedWith(dones->Get(h), "host 2 leaves");
}

TEST(HostMeshTest, StartAfterAbortFailsAtOnce) {
  auto c = ConnectOrDie(2, 2);
  ASSERT_NE(c, nullptr);
  c->mesh(1).Abort(absl::AbortedError("gone"));
  c->mesh(1).Abort(absl::AbortedError("twice"));  // idempotent: the first reason stays
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {4}, 2));
  Regions r(2, *plan);
  auto dones = Dones::Make(2);
  c->Start(1, plan, c->NextSequence(), r.io, absl::OkStatus(), absl::Now() + absl::Seconds(30),
           dones->For(1));
  ASSERT_TRUE(dones->Wait({1}, absl::Seconds(10)));
  const Outcome o = dones->Get(1);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kAborted) << o.status;
  EXPECT_EQ(o.status.message(), "gone");
  EXPECT_TRUE(o.broken);
  EXPECT_EQ(dones->calls(1), 1);
}

TEST(HostMeshTest, DestructorCallsEveryQueuedDoneOnce) {
  auto c = ConnectOrDie(2, 2);
  ASSERT_NE(c, nullptr);
  auto plan = std::make_shared<const OpPlan>(Plan(v1::PSUM, v1::FLOAT32, {4}, 2));
  Regions r(2, *plan);
  auto dones = Dones::Make(3);
  for (int k = 0; k < 3; ++k) {
    c->Start(0, plan, c->NextSequence(), r.io, absl::OkStatus(), absl::Now() + absl::Seconds(30),
             dones->For(k));
  }
  c.reset();
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(dones->calls(k), 1) << "op " << k;
    EXPECT_FALSE(dones->Get(k).status.ok());
    EXPECT_TRUE(dones->Get(k).broken);
  }
}

TEST(HostMeshTest, ConnectWithoutThePeersFailsWithinTheTimeout) {
  MemoryBook book;
  MeshTopology t;
  t.member_host = {"h0", "h1"};
  t.hosts = {"h0", "h1"};
  for (int self : {0, 1}) {
    t.self = self;
    const absl::Time start = absl::Now();
    auto mesh = ConnectHostMesh(book, absl::StrCat("lonely", self), t, "127.0.0.1", Security(1),
                                start + absl::Milliseconds(300));
    EXPECT_EQ(mesh.status().code(), absl::StatusCode::kDeadlineExceeded) << mesh.status();
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(400)) << "host " << self;
  }
}

TEST(HostMeshTest, ConnectRejectsABadRank) {
  MemoryBook book;
  MeshTopology t;
  t.hosts = {"h0", "h1"};
  t.self = 2;
  EXPECT_EQ(ConnectHostMesh(book, "x", t, "127.0.0.1", Security(1), absl::Now() + absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace collectived::executor_suite
