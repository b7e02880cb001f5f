#include "daemon/server/backends.h"

#include <gtest/gtest.h>

namespace collectived {
namespace {

class UnviableAllocator final : public BufferAllocator {
 public:
  absl::string_view kind() const override { return "cuda"; }
  absl::Status Viable() const override {
    return absl::FailedPreconditionError("no CUDA driver: libcuda.so.1 not found");
  }
  absl::StatusOr<std::shared_ptr<SharedBuffer>> Allocate(size_t, const DeviceSpec&) override {
    return absl::InternalError("unviable allocator used");
  }
};

class UnviableExecutor final : public Executor {
 public:
  explicit UnviableExecutor(std::string why) : why_(std::move(why)) {}
  absl::string_view name() const override { return "gpu"; }
  absl::string_view buffer_kind() const override { return "cuda"; }
  bool IsViable() const override { return false; }
  std::string WhyNotViable() const override { return why_; }
  absl::Status Run(const OpPlan&, const std::vector<MemberIo>&, Traffic*) override {
    return absl::InternalError("unviable executor used");
  }
  int threads() const override { return 0; }

 private:
  std::string why_;
};

TEST(BackendsTest, SelectViableKeepsTheViableFirstOfEachKindAndRecordsWhyTheOthersWentAway) {
  Backends candidates;
  AddCpuBackends(candidates, CpuExecutorOptions{.threads = 1});
  AddCpuBackends(candidates, CpuExecutorOptions{.threads = 1});  // second of its kind
  candidates.allocators.push_back(std::make_unique<UnviableAllocator>());
  candidates.executors.push_back(std::make_unique<UnviableExecutor>("no GPU"));
  candidates.executors.push_back(std::make_unique<UnviableExecutor>(""));
  Executor* first_cpu = candidates.executors[0].get();
  Backends chosen = SelectViable(std::move(candidates));
  ASSERT_EQ(chosen.allocators.size(), 1u);
  EXPECT_EQ(chosen.allocators[0]->kind(), "memfd");
  ASSERT_EQ(chosen.executors.size(), 1u);
  EXPECT_EQ(chosen.executors[0].get(), first_cpu);
  EXPECT_EQ(chosen.unusable_allocators,
            (std::map<std::string, std::string>{
                {"cuda", "no CUDA driver: libcuda.so.1 not found"}}));
  // The first reason of a kind is kept.
  EXPECT_EQ(chosen.unusable_executors,
            (std::map<std::string, std::string>{{"cuda", "no GPU"}}));
}

TEST(BackendsTest, TheCudaHookAddsTheCudaBackendsOrSaysWhyNot) {
  Backends candidates;
  AddCpuBackends(candidates, CpuExecutorOptions{.threads = 1});
  AddCudaBackends(candidates);
#ifndef COLLECTIVED_HAVE_CUDA
  EXPECT_EQ(candidates.allocators.size(), 1u);
  EXPECT_EQ(candidates.executors.size(), 1u);
  Backends chosen = SelectViable(std::move(candidates));
  EXPECT_EQ(chosen.unusable_allocators.at("cuda"), "built without CUDA");
  EXPECT_EQ(chosen.unusable_executors.at("cuda"), "built without CUDA");
#else
  // The CUDA variant adds its allocator and executor; without a usable GPU
  // (this test does not need one) each is dropped with its own reason.
  EXPECT_EQ(candidates.allocators.size(), 2u);
  EXPECT_EQ(candidates.executors.size(), 2u);
  const bool have_gpu = candidates.executors[1]->IsViable();
  Backends chosen = SelectViable(std::move(candidates));
  if (have_gpu) {
    EXPECT_EQ(chosen.executors.size(), 2u);
    EXPECT_EQ(chosen.unusable_executors.count("cuda"), 0u);
  } else {
    EXPECT_EQ(chosen.executors.size(), 1u);
    EXPECT_EQ(chosen.allocators.size(), 1u);
    EXPECT_NE(chosen.unusable_executors.at("cuda"), "");
    EXPECT_NE(chosen.unusable_executors.at("cuda"), "built without CUDA");
    EXPECT_NE(chosen.unusable_allocators.at("cuda").find("CUDA"), std::string::npos)
        << chosen.unusable_allocators.at("cuda");
  }
#endif
}

}  // namespace
}  // namespace collectived
