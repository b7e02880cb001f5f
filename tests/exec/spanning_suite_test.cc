// The spanning schedules (exec/spanning.h) on host memory split into
// partitions: the executor suite (executor_suite.h) with members spread over
// 2 and 3 partitions in two layouts, so every op, dtype and group choice
// crosses partitions and must give the one-partition bits; and checks of what
// the schedules move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "plan/wire_plan.h"
#include "tests/exec/executor_suite.h"
#include "tests/exec/host_fabric.h"

namespace collectived::executor_suite {
namespace {

using host_fabric::HostFabric;
using host_fabric::Registry;
using host_fabric::SpanningHostExecutor;

enum class Layout {
  kRoundRobin,  // member m on partition m % kParts
  kBlocked,     // members 0,1 on 0, members 2,3 on 1, ..., wrapping around
  kRuns,        // members 0,1 on 0, 2,3 on 1, ..., the rest on the last
};

template <int kParts, Layout kLayout, bool kChain = false>
struct SpanningBackend : HostMemoryBackend {
  static constexpr const char* kName = "spanning host";
  static std::unique_ptr<Executor> MakeExecutor() {
    // Chunks of 24 bytes: the suite's small arrays take several chunks
    // (and a last, shorter one) through the chain.
    return std::make_unique<SpanningHostExecutor>(
        SpanningOptions{.chain = kChain, .chain_chunk_bytes = 24});
  }
  static absl::StatusOr<void*> Allocate(size_t bytes, int member) {
    void* p = Registry::Get().Allocate(bytes, Device(member));
    if (p == nullptr) return absl::ResourceExhaustedError("aligned_alloc");
    return p;
  }
  static void Free(void* p) { Registry::Get().Free(p); }
  // Blocks of two are how GPUs of a host would hold ranks; runs are how
  // hosts of a cluster mesh usually hold them (the chain's layout).
  static int Device(int member) {
    switch (kLayout) {
      case Layout::kRoundRobin:
        return member % kParts;
      case Layout::kBlocked:
        return member / 2 % kParts;
      case Layout::kRuns:
        return std::min(member / 2, kParts - 1);
    }
    return 0;
  }
};

using SpanningTwoRoundRobin = SpanningBackend<2, Layout::kRoundRobin>;
using SpanningThreeRoundRobin = SpanningBackend<3, Layout::kRoundRobin>;
using SpanningTwoBlocked = SpanningBackend<2, Layout::kBlocked>;
// The chain where the layout allows it (runs), the lanes where it does not
// (round robin), as the cluster mesh runs them.
using ChainThreeRuns = SpanningBackend<3, Layout::kRuns, true>;
using ChainTwoRoundRobin = SpanningBackend<2, Layout::kRoundRobin, true>;

INSTANTIATE_TYPED_TEST_SUITE_P(SpanningTwoRoundRobin, ExecutorSuite, SpanningTwoRoundRobin);
INSTANTIATE_TYPED_TEST_SUITE_P(SpanningThreeRoundRobin, ExecutorSuite, SpanningThreeRoundRobin);
INSTANTIATE_TYPED_TEST_SUITE_P(SpanningTwoBlocked, ExecutorSuite, SpanningTwoBlocked);
INSTANTIATE_TYPED_TEST_SUITE_P(ChainThreeRuns, ExecutorSuite, ChainThreeRuns);
INSTANTIATE_TYPED_TEST_SUITE_P(ChainTwoRoundRobin, ExecutorSuite, ChainTwoRoundRobin);

// What a spanning run did.
struct PsumRun {
  SpanningTraffic traffic;
  int exchanges = 0;
  int local_runs = 0;
};

// `plan` over members whose inputs are `in` (raw bytes), member m on
// partition part_of(m) (outputs in place or apart), through a HostFabric
// with `options`; checks every output against the one-partition CPU result
// and returns what the run did.
PsumRun RunAgainstOnePartition(const OpPlan& plan, const std::vector<std::vector<uint8_t>>& in,
                               const std::function<int(int)>& part_of, bool in_place,
                               const SpanningOptions& options) {
  const int members = static_cast<int>(in.size());
  std::vector<std::vector<uint8_t>> expected(members, std::vector<uint8_t>(plan.out_bytes));
  std::vector<MemberIo> ref(members);
  for (int m = 0; m < members; ++m) ref[m] = MemberIo{in[m].data(), expected[m].data(), -1};
  CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
  EXPECT_TRUE(cpu.Run(plan, ref).ok());

  std::vector<void*> ins(members), outs(members);
  std::vector<MemberIo> io(members);
  for (int m = 0; m < members; ++m) {
    ins[m] = Registry::Get().Allocate(plan.in_bytes, part_of(m));
    std::memcpy(ins[m], in[m].data(), plan.in_bytes);
    outs[m] = in_place ? ins[m] : Registry::Get().Allocate(plan.out_bytes, part_of(m));
    io[m] = MemberIo{static_cast<const uint8_t*>(ins[m]), static_cast<uint8_t*>(outs[m]),
                     part_of(m)};
  }
  PsumRun result;
  CpuExecutor local(CpuExecutorOptions{.threads = 2});
  HostFabric fabric(&local);
  absl::Status st = RunSpanning(plan, io, &fabric, &result.traffic, options);
  EXPECT_TRUE(st.ok()) << st;
  result.exchanges = fabric.exchanges();
  result.local_runs = fabric.local_runs();
  for (int m = 0; m < members; ++m) {
    EXPECT_EQ(std::memcmp(outs[m], expected[m].data(), plan.out_bytes), 0)
        << plan.signature << ", member " << m;
    Registry::Get().Free(ins[m]);
    if (!in_place) Registry::Get().Free(outs[m]);
  }
  return result;
}

// A `kind` (psum by default) of `members` float32 vectors of `elems` whose
// float sum depends on the order, through RunAgainstOnePartition.
PsumRun SpanningPsum(int members, int64_t elems, const std::function<int(int)>& part_of,
                     bool in_place, const SpanningOptions& options = {},
                     v1::OpKind kind = v1::PSUM) {
  v1::OpSpec spec;
  spec.set_kind(kind);
  spec.set_dtype(v1::FLOAT32);
  spec.add_shape(elems);
  auto plan = PlanOp(spec, MeshShape{{"x"}, {members}});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return PsumRun{};
  std::vector<std::vector<uint8_t>> data(members, std::vector<uint8_t>(plan->in_bytes));
  for (int m = 0; m < members; ++m) {
    for (int64_t e = 0; e < elems; ++e) {
      const float v = (m % 2 == 0 ? 1.0f : 1e-7f) * static_cast<float>(e + 1) + 0.1f * m;
      std::memcpy(data[m].data() + e * sizeof(float), &v, sizeof(v));
    }
  }
  return RunAgainstOnePartition(*plan, data, part_of, in_place, options);
}

TEST(SpanningTest, OneMemberPerPartitionMovesWhatARingAllReduceMoves) {
  // P partitions, one member each, S bytes: each sends (P-1)/P*S of its
  // input and (P-1)/P*S of results; P*2(P-1)/P*S in all.
  for (int parts : {2, 3, 4}) {
    const int64_t elems = 1200;  // divisible by 2, 3, 4
    const uint64_t s = elems * sizeof(float);
    for (bool in_place : {false, true}) {
      PsumRun r = SpanningPsum(parts, elems, [](int m) { return m; }, in_place);
      EXPECT_EQ(r.traffic.exchanged, 2 * (parts - 1) * s) << parts << " partitions";
      EXPECT_EQ(r.traffic.copied, 0u);
      EXPECT_EQ(r.exchanges, 2);
      EXPECT_EQ(r.local_runs, parts);
    }
  }
}

TEST(SpanningTest, SeveralMembersPerPartitionKeepTheGroupOrder) {
  // Members 0,2,4 on partition 0 and 1,3,5 on partition 1: a local
  // pre-reduction would change the float order; the lanes do not.
  PsumRun r = SpanningPsum(6, 1001, [](int m) { return m % 2; }, /*in_place=*/true);
  // Lanes of 500 and 501 elements: 3 remote inputs per lane owner, then one
  // result lane each way; 2 local copies per partition.
  const uint64_t es = sizeof(float);
  EXPECT_EQ(r.traffic.exchanged, (3 * 500 + 3 * 501 + 500 + 501) * es);
  EXPECT_EQ(r.traffic.copied, 4 * 1001 * es);
}

TEST(SpanningTest, MoreLanesThanElements) {
  // 2 elements over 3 partitions: one lane is empty.
  SpanningPsum(3, 2, [](int m) { return m; }, /*in_place=*/false);
  SpanningPsum(4, 1, [](int m) { return 3 - m; }, /*in_place=*/true);
}

SpanningOptions Chain(uint64_t chunk_bytes) {
  return SpanningOptions{.chain = true, .chain_chunk_bytes = chunk_bytes};
}

TEST(SpanningTest, TheChainSendsOneRunningResultPerLinkWhateverTheMembersPerPartition) {
  // 4 members on each of 2 partitions, in runs: partition 0 sends its
  // running result (S), partition 1 the result (S); each copies it to its
  // 3 other members (partition 1 writes them in its fold).
  const int64_t elems = 1000;
  const uint64_t s = elems * sizeof(float);
  for (bool in_place : {false, true}) {
    PsumRun r = SpanningPsum(8, elems, [](int m) { return m / 4; }, in_place, Chain(1024));
    EXPECT_EQ(r.traffic.exchanged, 2 * s);
    EXPECT_EQ(r.traffic.copied, 3 * s);
    // 4 chunks (1024 bytes = 256 elements: 256, 256, 256, 232): 5 steps,
    // each one exchange; partition 0 folds 4 chunks, partition 1 4.
    EXPECT_EQ(r.exchanges, 5);
    EXPECT_EQ(r.local_runs, 8);
  }
  // The lanes move each member's lane instead: 4 * S/2 + S/2 each way.
  PsumRun lanes = SpanningPsum(8, elems, [](int m) { return m / 4; }, false);
  EXPECT_EQ(lanes.traffic.exchanged, 5 * s);
}

TEST(SpanningTest, TheChainOverManyPartitionsAndChunks) {
  // 1 to 3 members per partition, 2 to 4 partitions, chunks of one element
  // up to the whole array: every result has the one-partition bits
  // (SpanningPsum checks them; the values' float sum depends on the order).
  const std::vector<std::vector<int>> layouts = {
      {0, 1, 1},       {0, 0, 1},       {0, 1, 1, 1},       {0, 1, 2, 2},
      {0, 0, 1, 2, 2}, {0, 1, 1, 2, 3}, {3, 3, 0, 1, 1, 2}, {1, 1, 0}};
  for (const std::vector<int>& parts : layouts) {
    const int members = static_cast<int>(parts.size());
    auto part_of = [&](int m) { return parts[m]; };
    for (uint64_t chunk : {4ull, 12ull, 4096ull}) {
      for (v1::OpKind kind : {v1::PSUM, v1::PMEAN, v1::PMAX, v1::PMIN}) {
        SCOPED_TRACE(::testing::Message() << members << " members, chunk " << chunk << ", kind "
                                        << kind);
        PsumRun r = SpanningPsum(members, 37, part_of, kind == v1::PMAX, Chain(chunk), kind);
        // Every partition but the last sends 37 elements on; the result
        // goes back over every link once.
        const int links = *std::max_element(parts.begin(), parts.end());
        EXPECT_EQ(r.traffic.exchanged, 2 * links * 37 * sizeof(float));
      }
    }
  }
}

// `kind` of `dt` (elements of `es` bytes) over members whose inputs are
// `in` (raw bytes), member m on partition part_of[m], through the chain:
// every output must have the one-partition bits.
void ExpectChainBits(v1::OpKind kind, v1::DType dt, size_t es,
                     const std::vector<std::vector<uint8_t>>& in, const std::vector<int>& part_of) {
  v1::OpSpec spec;
  spec.set_kind(kind);
  spec.set_dtype(dt);
  spec.add_shape(static_cast<int64_t>(in[0].size() / es));
  auto plan = PlanOp(spec, MeshShape{{"x"}, {static_cast<int>(in.size())}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const PsumRun r = RunAgainstOnePartition(
      *plan, in, [&](int m) { return part_of[m]; }, /*in_place=*/false, Chain(4096));
  const int links = *std::max_element(part_of.begin(), part_of.end());
  EXPECT_EQ(r.traffic.exchanged, 2 * links * plan->in_bytes) << "not the chain";
}

template <typename T>
std::vector<uint8_t> Bytes(std::initializer_list<T> values) {
  std::vector<uint8_t> b(values.size() * sizeof(T));
  std::memcpy(b.data(), values.begin(), b.size());
  return b;
}

TEST(SpanningTest, TheChainCarriesANegativeZeroRunningSum) {
  // 2^-126 + -1.5 * 2^-126 flushes to -0.0 on partition 0; -0.0 + -0.0 on
  // partition 1 stays -0.0 (a fold restarted from +0.0 would give +0.0).
  // Likewise a NaN, an infinity and ordinary values in the other elements.
  const std::vector<int> parts = {0, 0, 1};
  ExpectChainBits(v1::PSUM, v1::FLOAT32, 4,
                  {Bytes<uint32_t>({0x00800000u, 0x7fc00001u, 0x7f800000u, 0x3f800000u}),
                   Bytes<uint32_t>({0x80c00000u, 0x3f800000u, 0x3f800000u, 0x80000001u}),
                   Bytes<uint32_t>({0x80000000u, 0x40000000u, 0xff800000u, 0x80000000u})},
                  parts);
  ExpectChainBits(v1::PMEAN, v1::FLOAT32, 4,
                  {Bytes<uint32_t>({0x00800000u, 0x00000000u}),
                   Bytes<uint32_t>({0x80c00000u, 0x80000000u}),
                   Bytes<uint32_t>({0x80000001u, 0x80000000u})},
                  parts);
  ExpectChainBits(v1::PSUM, v1::FLOAT64, 8,
                  {Bytes<uint64_t>({0x0010000000000000ull}),
                   Bytes<uint64_t>({0x8018000000000000ull}),
                   Bytes<uint64_t>({0x8000000000000000ull})},
                  parts);
  // A first partition of one member sends its raw input: a -0.0, a
  // subnormal and a signaling NaN there are the whole fold's first input
  // (0 + -0.0 is +0.0, the subnormal flushes, the NaN is quieted).
  ExpectChainBits(v1::PSUM, v1::FLOAT32, 4,
                  {Bytes<uint32_t>({0x80000000u, 0x00000001u, 0x7f800001u}),
                   Bytes<uint32_t>({0x80000000u, 0x80000000u, 0x3f800000u}),
                   Bytes<uint32_t>({0x80000000u, 0x80000000u, 0x00000000u})},
                  {0, 1, 1});
  // Four partitions, a -0.0 running sum over several hops.
  ExpectChainBits(v1::PSUM, v1::FLOAT32, 4,
                  {Bytes<uint32_t>({0x00800000u}), Bytes<uint32_t>({0x80c00000u}),
                   Bytes<uint32_t>({0x80000000u}), Bytes<uint32_t>({0x80000001u}),
                   Bytes<uint32_t>({0x80000000u})},
                  {0, 0, 1, 2, 3});
}

TEST(SpanningTest, TheChainLeavesOneMemberPerPartitionToTheLanes) {
  // Lanes of 50 elements: each partition receives its lane of the other's
  // input and sends its reduced lane back, both in one exchange each.
  PsumRun r = SpanningPsum(2, 100, [](int m) { return m; }, false, Chain(64));
  EXPECT_EQ(r.exchanges, 2);
  EXPECT_EQ(r.traffic.exchanged, (50 + 50 + 50 + 50) * sizeof(float));
}

TEST(SpanningTest, TheChainLeavesInterleavedMembersToTheLanes) {
  // Partition 0 holds members 0 and 2: no contiguous runs, so the lanes
  // (which also keep the order) run.
  PsumRun r = SpanningPsum(3, 100, [](int m) { return m == 1 ? 1 : 0; }, false, Chain(64));
  EXPECT_EQ(r.exchanges, 2);
  EXPECT_EQ(r.traffic.exchanged, (50 + 100 + 50 + 50) * sizeof(float));
}

TEST(SpanningTest, ALocalRunThatTouchesAnotherPartitionIsCaught) {
  // The fabric's own check, so that the suites above can trust it.
  void* a = Registry::Get().Allocate(64, 0);
  void* b = Registry::Get().Allocate(64, 1);
  CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
  HostFabric fabric(&cpu);
  v1::OpSpec spec;
  spec.set_kind(v1::PSUM);
  spec.set_dtype(v1::FLOAT32);
  spec.add_shape(4);
  auto plan = PlanOp(spec, MeshShape{{"x"}, {1}});
  ASSERT_TRUE(plan.ok());
  std::vector<MemberIo> io{MemberIo{static_cast<const uint8_t*>(a), static_cast<uint8_t*>(b), 0}};
  absl::Status st = fabric.RunLocal(0, *plan, io);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("partition 1"), std::string::npos) << st;
  EXPECT_EQ(fabric.Copy(1, static_cast<uint8_t*>(b), static_cast<const uint8_t*>(a), 8).code(),
            absl::StatusCode::kInternal);
  Registry::Get().Free(a);
  Registry::Get().Free(b);
}

}  // namespace
}  // namespace collectived::executor_suite
