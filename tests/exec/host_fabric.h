// A Fabric (exec/spanning.h) over host memory, for testing the
// spanning schedules on any machine: partitions are numbers given to host
// allocations, RunLocal is a CpuExecutor, transfers and copies are memcpy.
//
// It checks what a GPU fabric could not survive: every region RunLocal,
// Copy or a transfer touches must lie in memory of the partition the call
// names (allocations are registered with their partition: Allocate here,
// Scratch). A violation makes the call fail with INTERNAL naming it.
//
// Thread-safety: the registry is process-wide and locked; a HostFabric is
// used by one op at a time.
#ifndef COLLECTIVED_TESTS_EXEC_HOST_FABRIC_H_
#define COLLECTIVED_TESTS_EXEC_HOST_FABRIC_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "exec/cpu_executor.h"
#include "exec/spanning.h"

namespace collectived::host_fabric {

// Host allocations and their partitions.
class Registry {
 public:
  static Registry& Get() {
    static Registry* r = new Registry;
    return *r;
  }
  // 64-byte aligned, at least one byte.
  void* Allocate(uint64_t bytes, int part) {
    const uint64_t size = (bytes + 63) / 64 * 64 + 64;
    void* p = std::aligned_alloc(64, size);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{size, part};
    return p;
  }
  void Free(void* p) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      regions_.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }
  // OK when [p, p + bytes) lies in one allocation of partition `part`.
  absl::Status Check(const void* p, uint64_t bytes, int part, const char* what) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return Violation(what, part, -1);
    --it;
    if (a + bytes > it->first + it->second.size) return Violation(what, part, -1);
    if (it->second.part != part) return Violation(what, part, it->second.part);
    return absl::OkStatus();
  }

 private:
  struct Region {
    uint64_t size;
    int part;
  };
  static absl::Status Violation(const char* what, int part, int actual) {
    return absl::InternalError(absl::StrCat(what, " on partition ", part, " touches ",
                                            actual < 0 ? "unregistered memory"
                                                       : absl::StrCat("partition ", actual)));
  }
  std::mutex mu_;
  std::map<uintptr_t, Region> regions_;
};

class HostFabric final : public Fabric {
 public:
  explicit HostFabric(Executor* local) : local_(local) {}
  ~HostFabric() override { Release(); }

  absl::StatusOr<uint8_t*> Scratch(int part, uint64_t bytes) override {
    void* p = Registry::Get().Allocate(bytes, part);
    if (p == nullptr) return absl::ResourceExhaustedError("host fabric: aligned_alloc");
    // Garbage, as device scratch would be.
    std::memset(p, 0x5C, bytes);
    scratch_.push_back(p);
    return static_cast<uint8_t*>(p);
  }
  absl::Status Exchange(const std::vector<Transfer>& transfers) override {
    ++exchanges_;
    for (const Transfer& t : transfers) {
      if (auto st = Registry::Get().Check(t.src, t.bytes, t.src_part, "transfer source");
          !st.ok()) {
        return st;
      }
      if (auto st = Registry::Get().Check(t.dst, t.bytes, t.dst_part, "transfer destination");
          !st.ok()) {
        return st;
      }
    }
    for (const Transfer& t : transfers) {
      if (t.bytes > 0) std::memmove(t.dst, t.src, t.bytes);
    }
    return absl::OkStatus();
  }
  absl::Status RunLocal(int part, const OpPlan& plan, const std::vector<MemberIo>& io) override {
    ++local_runs_;
    for (const MemberIo& m : io) {
      if (m.device != part) return absl::InternalError("local run: a member of another partition");
      if (plan.in_bytes > 0) {
        if (auto st = Registry::Get().Check(m.in, plan.in_bytes, part, "local run input");
            !st.ok()) {
          return st;
        }
      }
      if (m.out != nullptr && plan.out_bytes > 0) {
        if (auto st = Registry::Get().Check(m.out, plan.out_bytes, part, "local run output");
            !st.ok()) {
          return st;
        }
      }
    }
    return local_->Run(plan, io);
  }
  absl::Status Copy(int part, uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    if (auto st = Registry::Get().Check(src, bytes, part, "copy source"); !st.ok()) return st;
    if (auto st = Registry::Get().Check(dst, bytes, part, "copy destination"); !st.ok()) return st;
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    Release();
    return absl::OkStatus();
  }

  int exchanges() const { return exchanges_; }
  int local_runs() const { return local_runs_; }

 private:
  void Release() {
    for (void* p : scratch_) Registry::Get().Free(p);
    scratch_.clear();
  }

  Executor* const local_;
  std::vector<void*> scratch_;
  int exchanges_ = 0;
  int local_runs_ = 0;
};

// An Executor that runs ops within one partition on a CpuExecutor and ops
// across partitions through RunSpanning over a HostFabric, with `options`.
class SpanningHostExecutor final : public Executor {
 public:
  explicit SpanningHostExecutor(SpanningOptions options = {})
      : options_(options),
        cpu_(CpuExecutorOptions{.threads = 2, .chunk_bytes = 64, .serial_bytes = 0}) {}
  absl::string_view name() const override { return "spanning-host"; }
  absl::string_view buffer_kind() const override { return "memfd"; }
  bool IsViable() const override { return true; }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!SpansPartitions(io)) return cpu_.Run(plan, io, traffic);
    HostFabric fabric(&cpu_);
    SpanningTraffic moved;
    absl::Status st = RunSpanning(plan, io, &fabric, &moved, options_);
    if (traffic != nullptr) *traffic = AccountTraffic(plan, moved.exchanged, moved.exchanged);
    return st;
  }
  int threads() const override { return 2; }

 private:
  const SpanningOptions options_;
  std::mutex mu_;
  CpuExecutor cpu_;
};

}  // namespace collectived::host_fabric

#endif  // COLLECTIVED_TESTS_EXEC_HOST_FABRIC_H_
