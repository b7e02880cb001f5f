// CudaExecutor: runs collectives on GPU memory, every member on one GPU.
//
// Results are bit-identical to CpuExecutor's (and so to JAX/XLA on CPU): the
// reductions compute each element from the identity with the members in
// group order, with the element-wise rules of reduce_ops.h in software
// (SoftwareEnv: flush-to-zero, x86's NaN results). Data movement lays data
// out as CpuExecutor does.
//
// Members on different GPUs of the host: RunSpanning (exec/spanning.h)
// over NCCL point-to-point transfers between the GPUs, with this executor's
// kernels inside each GPU, so the results are the same bits as on one GPU
// (a one-group reduction moves what a ring all-reduce moves with one member
// per GPU). The daemon is every rank: one NCCL communicator per GPU, all
// created together on the first op across GPUs (ncclCommInitRankConfig in
// one group, non-blocking, polled with ncclCommGetAsyncError within
// kNcclTimeout). An op across GPUs that does not finish within kNcclTimeout,
// or whose communicator reports an error, aborts every communicator
// (ncclCommAbort) and fails (DEADLINE_EXCEEDED / INTERNAL); the next op
// across GPUs creates new ones. The destructor aborts them too.
//
// Run enqueues the op on one stream per device and synchronizes before it
// returns (every output is written). In-place data movement (ppermute,
// broadcast, all_to_all with out == in) and in-place results wider than the
// input stage through device scratch memory (stream-ordered allocations).
// Every CUDA and NCCL error becomes an absl::Status naming the call.
//
// Without a driver or a device (cudart is linked statically: no libcuda at
// link time) IsViable() is false and WhyNotViable() says why.
//
// Thread-safety: Run may be called concurrently; ops on the same device are
// serialized by that device's mutex, so each GPU has one launch order (NCCL
// needs it); ops across GPUs also hold every device mutex they use (taken in
// ordinal order) and run one at a time.
#ifndef COLLECTIVED_EXEC_CUDA_CUDA_EXECUTOR_H_
#define COLLECTIVED_EXEC_CUDA_CUDA_EXECUTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/sync.h"
#include "exec/executor.h"

namespace collectived {

class CudaExecutor final : public Executor {
 public:
  // Probes the devices (cudaGetDeviceCount); creates nothing on them yet.
  CudaExecutor();
  ~CudaExecutor() override;
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  absl::string_view name() const override { return "cuda"; }
  absl::string_view buffer_kind() const override { return "cuda"; }
  bool IsViable() const override { return device_count_ > 0; }
  std::string WhyNotViable() const override { return why_not_; }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic = nullptr) override {
    return RunTimed(plan, io, traffic, nullptr);
  }
  // With `timing`, an op on one GPU records an event on its stream before
  // its first kernel or copy and one after its last (events of the device,
  // made once), and reports their distance and when the launches were done.
  // Ops across GPUs report no timing.
  absl::Status RunTimed(const OpPlan& plan, const std::vector<MemberIo>& io, Traffic* traffic,
                        DeviceTiming* timing) override;
  // The GPU does the data-parallel work; one host thread drives it.
  int threads() const override { return 1; }

  // Ops across hosts: one NCCL communicator per mesh, one rank per host
  // (NcclHostLink in the .cc), its id from ncclGetUniqueId.
  bool ConnectsHosts() const override { return true; }
  absl::StatusOr<std::string> NewHostLinkId() override;
  absl::StatusOr<std::unique_ptr<HostLink>> ConnectHosts(const std::string& id, int rank,
                                                         int ranks, int device,
                                                         absl::Time deadline,
                                                         const std::atomic<bool>& abort) override;

  // GPUs found (0 when not viable).
  int device_count() const { return device_count_; }

  // How long an op across GPUs (and the creation of the communicators) may
  // take before the communicators are aborted.
  static constexpr absl::Duration kNcclTimeout = absl::Seconds(120);

 private:
  struct Device;
  struct Nccl;

  absl::Status RunAcrossGpus(const OpPlan& plan, const std::vector<MemberIo>& io,
                             Traffic* traffic);
  // Every GPU's NCCL communicator, created together in one group into
  // nccl_ (RunAcrossGpus' first op); by `deadline`.
  absl::Status CreateComms(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(across_mu_);

  int device_count_ = 0;
  std::string why_not_;
  // One per GPU, created with the executor; each holds its stream (created on
  // first use) and the mutex that serializes ops on it.
  std::vector<std::unique_ptr<Device>> devices_;
  // Ops across GPUs, one at a time; the communicators.
  Mutex across_mu_;
  std::unique_ptr<Nccl> nccl_ ABSL_GUARDED_BY(across_mu_);
};

std::unique_ptr<Executor> MakeCudaExecutor();

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_CUDA_CUDA_EXECUTOR_H_
