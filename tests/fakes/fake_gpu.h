// A stand-in for GPU memory in tests: host memory (memfd) that calls itself
// "cuda", on a GPU of ordinal N ("cuda:GPU-<N as uuid>"), with an executor
// of kind "cuda" that runs the CPU kernels and records the devices it was
// given. Lets the engine's and the SDK's handling of GPU buffers be checked
// on hosts without a GPU.
#ifndef COLLECTIVED_TESTS_FAKES_FAKE_GPU_H_
#define COLLECTIVED_TESTS_FAKES_FAKE_GPU_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sync.h"
#include "exec/cpu_executor.h"
#include "daemon/core/backends.h"
#include "daemon/memory/buffer_allocator.h"

namespace collectived {

class FakeGpuBuffer final : public SharedBuffer {
 public:
  FakeGpuBuffer(std::shared_ptr<SharedBuffer> host, int ordinal)
      : host_(std::move(host)), ordinal_(ordinal) {}
  void* data() const override { return host_->data(); }
  size_t size() const override { return host_->size(); }
  int fd() const override { return host_->fd(); }
  absl::string_view kind() const override { return "cuda"; }
  std::string device() const override { return FakeDevice(ordinal_); }
  int device_ordinal() const override { return ordinal_; }
  static std::string FakeDevice(int ordinal) {
    return absl::StrCat("cuda:GPU-00000000-0000-0000-0000-00000000000", ordinal);
  }

 private:
  std::shared_ptr<SharedBuffer> host_;
  int ordinal_;
};

// Two fake GPUs, ordinals 0 and 1.
class FakeGpuAllocator final : public BufferAllocator {
 public:
  absl::string_view kind() const override { return "cuda"; }
  absl::Status Viable() const override { return absl::OkStatus(); }
  absl::StatusOr<std::shared_ptr<SharedBuffer>> Allocate(size_t bytes,
                                                         const DeviceSpec& device) override {
    if (device.kind != DeviceSpec::Kind::kCuda) return absl::InvalidArgumentError("not cuda");
    const int ordinal = device.ordinal;
    if (ordinal < 0 || ordinal > 1) {
      return absl::NotFoundError(absl::StrCat("no GPU ", device.ToString(), "; there are cuda:0, cuda:1"));
    }
    auto host = CreateMemfdBuffer(bytes);
    if (!host.ok()) return host.status();
    return std::shared_ptr<SharedBuffer>(new FakeGpuBuffer(*std::move(host), ordinal));
  }
};

class FakeGpuExecutor final : public Executor {
 public:
  absl::string_view name() const override { return "fake-gpu"; }
  absl::string_view buffer_kind() const override { return "cuda"; }
  bool IsViable() const override { return true; }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic) override {
    {
      MutexLock lock(&mu_);
      ++runs_;
      devices_.clear();
      for (const auto& m : io) devices_.push_back(m.device);
    }
    return cpu_.Run(plan, io, traffic);
  }
  int threads() const override { return 1; }
  int runs() {
    MutexLock lock(&mu_);
    return runs_;
  }
  std::vector<int> devices() {
    MutexLock lock(&mu_);
    return devices_;
  }

 private:
  CpuExecutor cpu_{CpuExecutorOptions{.threads = 1}};
  Mutex mu_;
  int runs_ = 0;
  std::vector<int> devices_;
};

// Host memory and the fake GPU; `gpu_executor` receives the fake executor
// (owned by the backends) unless null, when there is none.
inline Backends HostAndFakeGpu(FakeGpuExecutor** gpu_executor) {
  Backends b;
  b.allocators.push_back(MakeMemfdAllocator());
  b.allocators.push_back(std::make_unique<FakeGpuAllocator>());
  b.executors.push_back(std::make_unique<CpuExecutor>(CpuExecutorOptions{.threads = 1}));
  if (gpu_executor != nullptr) {
    auto e = std::make_unique<FakeGpuExecutor>();
    *gpu_executor = e.get();
    b.executors.push_back(std::move(e));
  } else {
    b.unusable_executors["cuda"] = "no CUDA driver: libcuda.so.1 not found";
  }
  return b;
}

}  // namespace collectived

#endif  // COLLECTIVED_TESTS_FAKES_FAKE_GPU_H_
