// CpuExecutor: runs collectives on host memory with a pool of threads.
//
// Reductions run element-chunk by element-chunk: each chunk of every member's
// input is reduced in member order (fixed, so results are bitwise identical
// across members and runs) and written to every member's output. In a mesh of
// one member psum/pmean/pmax/pmin reduce nothing (ReduceMeshOfOne), as in a
// one-device JAX program. Data
// movement ops are split into independent copies. Ops that move data in place
// (ppermute, broadcast, all_to_all with out == in) stage the inputs first.
#ifndef COLLECTIVED_EXEC_CPU_EXECUTOR_H_
#define COLLECTIVED_EXEC_CPU_EXECUTOR_H_

#include <cstddef>
#include <memory>

#include "absl/functional/function_ref.h"
#include "exec/executor.h"
#include "exec/thread_pool.h"

namespace collectived {

struct CpuExecutorOptions {
  // Worker threads (0: one per online CPU).
  int threads = 0;
  // Bytes of one work item; small values reach the multi-chunk paths in tests.
  size_t chunk_bytes = 256 * 1024;
  // Ops touching at most this many bytes (all members' inputs and outputs)
  // run on the calling thread alone: waking helpers costs more than they save.
  size_t serial_bytes = 64 * 1024;
  // Ops touching at least this many bytes (all members' inputs and outputs)
  // write their results with streaming stores (stream_copy.h): they do not
  // fit in cache anyway, and skipping the read-for-ownership of every output
  // line saves a third of the memory traffic. Below it, results stay in
  // cache for the clients to read (measured on a 2-core VM: psum of 4 MiB
  // per member, 16 MiB touched, is 2x faster through the cache; from 32 MiB
  // touched streaming wins, by 2x at 64 MiB).
  size_t stream_bytes = 32 * 1024 * 1024;
};

class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(CpuExecutorOptions options);
  absl::string_view name() const override { return "cpu"; }
  absl::string_view buffer_kind() const override { return "memfd"; }
  bool IsViable() const override { return true; }
  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   Traffic* traffic = nullptr) override;
  int threads() const override { return pool_->size() + 1; }
  // A small psum, pmean, pmax, pmin or all_gather (one the pool would not
  // share out): writes the result of `member`'s group into the outputs `io`
  // gives for it (Run's bytes), on the calling thread and without Run's
  // dispatch and task loop, and returns true. Anything else: false, nothing
  // written.
  bool RunOneMember(const OpPlan& plan, const std::vector<MemberIo>& io, int member);
  // A small psum, pmean, pmax, pmin or all_gather of one group (one
  // RunOneMember runs) from that group's inputs (`inputs[i]`: its i-th
  // member's) into `out` (no input's memory): RunOneMember's bytes for any
  // member, without its layers (which cost a member-side op of a few
  // elements as much as its work). Anything else, or a reduction that
  // reduces nothing (a mesh of one, no axes): false, nothing written.
  bool RunSmallGroup(const OpPlan& plan, const void* const* inputs, void* out) const;
  // Elements [begin, begin + len) of the result of `member`'s group in the
  // reduction `plan` (psum, pmean, pmax, pmin), written at those elements
  // into the outputs `io` gives for the group, on the calling thread (of
  // any size: the caller shares the op out), with streaming stores if
  // `stream`, and returns true. Anything else, or a range past the input:
  // false, nothing written.
  bool ReduceShare(const OpPlan& plan, const std::vector<MemberIo>& io, int member, size_t begin,
                   size_t len, bool stream);
  // Whether `plan` writes its results with streaming stores.
  bool Streams(const OpPlan& plan) const;

 private:
  // Whether `plan` is a psum, pmean, pmax, pmin or all_gather small enough
  // for the calling thread alone (RunOneMember, RunSmallGroup).
  bool SmallReductionOrGather(const OpPlan& plan) const;
  // fn(0..n) for `plan`, on the pool unless the op is small (then with no
  // allocation: a small op's whole run is a few hundred nanoseconds).
  void ParallelFor(const OpPlan& plan, size_t n, absl::FunctionRef<void(size_t)> fn);
  void RunReduce(const OpPlan& plan, const std::vector<MemberIo>& io);
  void RunGather(const OpPlan& plan, const std::vector<MemberIo>& io);
  void RunReduceScatter(const OpPlan& plan, const std::vector<MemberIo>& io);
  // The data-movement ops return the bytes their in-place staging copied.
  uint64_t RunPermute(const OpPlan& plan, const std::vector<MemberIo>& io);
  uint64_t RunAllToAll(const OpPlan& plan, const std::vector<MemberIo>& io);

  const CpuExecutorOptions options_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_CPU_EXECUTOR_H_
