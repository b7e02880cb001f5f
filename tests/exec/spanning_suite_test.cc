// The spanning schedules (daemon/exec/spanning.h) on host memory split into
// partitions: the executor suite (executor_suite.h) with members spread over
// 2 and 3 partitions in two layouts, so every op, dtype and group choice
// crosses partitions and must give the one-partition bits; and checks of what
// the schedules move.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "daemon/core/op_plan.h"
#include "tests/exec/executor_suite.h"
#include "tests/exec/host_fabric.h"

namespace collectived::executor_suite {
namespace {

using host_fabric::HostFabric;
using host_fabric::Registry;
using host_fabric::SpanningHostExecutor;

template <int kParts, bool kBlocked>
struct SpanningBackend : HostMemoryBackend {
  static constexpr const char* kName = "spanning host";
  static std::unique_ptr<Executor> MakeExecutor() {
    return std::make_unique<SpanningHostExecutor>();
  }
  static absl::StatusOr<void*> Allocate(size_t bytes, int member) {
    void* p = Registry::Get().Allocate(bytes, Device(member));
    if (p == nullptr) return absl::ResourceExhaustedError("aligned_alloc");
    return p;
  }
  static void Free(void* p) { Registry::Get().Free(p); }
  // Round robin (member m on partition m % kParts), or in blocks of two
  // (members 0,1 on 0, members 2,3 on 1, ...), as GPUs of a host would
  // hold ranks.
  static int Device(int member) { return kBlocked ? member / 2 % kParts : member % kParts; }
};

using SpanningTwoRoundRobin = SpanningBackend<2, false>;
using SpanningThreeRoundRobin = SpanningBackend<3, false>;
using SpanningTwoBlocked = SpanningBackend<2, true>;

INSTANTIATE_TYPED_TEST_SUITE_P(SpanningTwoRoundRobin, ExecutorSuite, SpanningTwoRoundRobin);
INSTANTIATE_TYPED_TEST_SUITE_P(SpanningThreeRoundRobin, ExecutorSuite, SpanningThreeRoundRobin);
INSTANTIATE_TYPED_TEST_SUITE_P(SpanningTwoBlocked, ExecutorSuite, SpanningTwoBlocked);

// A psum of `members` float32 vectors of `elems`, member m on partition
// part_of(m), through a HostFabric; returns the traffic and checks every
// output against the one-partition CPU result.
struct PsumRun {
  SpanningTraffic traffic;
  int exchanges = 0;
  int local_runs = 0;
};

template <typename PartOf>
PsumRun SpanningPsum(int members, int64_t elems, PartOf part_of, bool in_place) {
  v1::OpSpec spec;
  spec.set_kind(v1::PSUM);
  spec.set_dtype(v1::FLOAT32);
  spec.add_shape(elems);
  MeshShape mesh{{"x"}, {members}};
  auto plan = PlanOp(spec, mesh);
  EXPECT_TRUE(plan.ok()) << plan.status();
  PsumRun result;
  if (!plan.ok()) return result;
  const uint64_t bytes = plan->in_bytes;
  std::vector<std::vector<float>> data(members, std::vector<float>(elems));
  for (int m = 0; m < members; ++m) {
    for (int64_t e = 0; e < elems; ++e) {
      // Values whose float sum depends on the order.
      data[m][e] = (m % 2 == 0 ? 1.0f : 1e-7f) * static_cast<float>(e + 1) + 0.1f * m;
    }
  }
  // The one-partition result.
  std::vector<std::vector<float>> expected(members, std::vector<float>(elems));
  std::vector<MemberIo> ref_io(members);
  for (int m = 0; m < members; ++m) {
    ref_io[m] = MemberIo{reinterpret_cast<const uint8_t*>(data[m].data()),
                         reinterpret_cast<uint8_t*>(expected[m].data()), -1};
  }
  CpuExecutor cpu(CpuExecutorOptions{.threads = 2});
  EXPECT_TRUE(cpu.Run(*plan, ref_io).ok());

  std::vector<void*> ins(members), outs(members);
  std::vector<MemberIo> io(members);
  for (int m = 0; m < members; ++m) {
    ins[m] = Registry::Get().Allocate(bytes, part_of(m));
    std::memcpy(ins[m], data[m].data(), bytes);
    outs[m] = in_place ? ins[m] : Registry::Get().Allocate(bytes, part_of(m));
    io[m] = MemberIo{static_cast<const uint8_t*>(ins[m]), static_cast<uint8_t*>(outs[m]),
                     part_of(m)};
  }
  CpuExecutor local(CpuExecutorOptions{.threads = 2});
  HostFabric fabric(&local);
  absl::Status st = RunSpanning(*plan, io, &fabric, &result.traffic);
  EXPECT_TRUE(st.ok()) << st;
  result.exchanges = fabric.exchanges();
  result.local_runs = fabric.local_runs();
  for (int m = 0; m < members; ++m) {
    EXPECT_EQ(std::memcmp(outs[m], expected[m].data(), bytes), 0) << "member " << m;
    Registry::Get().Free(ins[m]);
    if (!in_place) Registry::Get().Free(outs[m]);
  }
  return result;
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
