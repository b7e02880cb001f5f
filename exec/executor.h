// The executor seam: runs a planned op over the members' mapped regions.
//
// The engine matches members' submissions, validates buffers, and then hands
// one op at a time per mesh to an Executor. Implementations: CpuExecutor
// (host memory); a CUDA/NCCL executor reports itself unviable without a GPU.
#ifndef COLLECTIVED_EXEC_EXECUTOR_H_
#define COLLECTIVED_EXEC_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "plan/op_plan.h"

namespace collectived {

// One member's regions for one op, indexed by member index. `in` holds
// plan.in_bytes, `out` plan.out_bytes. `out == in` means in place; otherwise
// the two do not overlap (the engine rejects partial overlap). Regions of
// different members never overlap (they live in different sessions' buffers).
// For a CUDA executor, `in` and `out` are device addresses in the daemon
// (its mapping of the members' VMM buffers) on GPU `device` (the ordinal in
// the daemon); for the CPU executor they are host addresses and `device` is
// -1 (RunSpanning's tests give host memory partition numbers).
//
// `out == nullptr` (with `in` set): a member whose result another partition
// writes (spanning.h): its input is read if the op needs it, its output is
// not written. The engine never submits such members; RunSpanning does.
struct MemberIo {
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  int device = -1;
};

// The memory an op moved, over all members: bytes of the members' regions
// (and of staging copies) read and written, each counted once per pass over
// memory (a block re-read while it sits in L1 is not counted again), and the
// least an op can move: every input byte it needs read once, every output
// byte written once. Stores that go through the cache also read each output
// line first (read-for-ownership) unless it is cached; streaming stores do
// not.
struct Traffic {
  uint64_t read = 0;
  uint64_t written = 0;
  uint64_t required = 0;
};

// Where a GPU op's time went on the device side (CudaExecutor::RunTimed).
struct DeviceTiming {
  // CLOCK_MONOTONIC ns when every kernel and copy of the op was enqueued on
  // its stream (0: not a GPU op, or it failed before).
  int64_t launched_ns = 0;
  // A duration: from an event recorded on the stream just before the op's
  // first kernel or copy was enqueued to one recorded after its last (0
  // when unknown). The stream is idle then (ops on a device are serialized
  // and each ends synchronized), so this spans the host's launching too: it
  // ends when the GPU finished the op.
  int64_t device_ns = 0;
};

// The Traffic of an op that reads every input it needs once (ppermute and
// broadcast: a source once per destination) and writes every output once,
// plus `extra_read` / `extra_written` bytes of staging. What every executor
// reports, so that their figures compare. `outputs`: the outputs written,
// when fewer than one per member (members sharing one output, written once:
// then a one-group op whose result is the same for all).
inline Traffic AccountTraffic(const OpPlan& plan, uint64_t extra_read, uint64_t extra_written,
                              int64_t outputs = -1) {
  Traffic t;
  if (plan.kind == OpKind::kBarrier) return t;
  const uint64_t members = plan.members();
  if (outputs >= 0 && static_cast<uint64_t>(outputs) < members) {
    // A shared result: every input it needs read once, the result written
    // `outputs` times (broadcast: the root's input read once per output).
    const uint64_t needed = plan.kind == OpKind::kBroadcast ? 1 : members;
    const uint64_t out = static_cast<uint64_t>(outputs);
    t.required = needed * plan.in_bytes + out * plan.out_bytes;
    t.read = (plan.kind == OpKind::kBroadcast ? out : needed) * plan.in_bytes + extra_read;
    t.written = out * plan.out_bytes + extra_written;
    return t;
  }
  // Inputs an op needs: all of them, except that a broadcast reads only its
  // root's and a ppermute only its sources'.
  uint64_t needed_inputs = members;
  if (plan.kind == OpKind::kBroadcast) {
    needed_inputs = plan.groups.size();
  } else if (plan.kind == OpKind::kPpermute) {
    uint64_t sources = 0;
    for (int s : plan.perm_source) sources += s >= 0 ? 1 : 0;
    needed_inputs = sources * plan.groups.size();
  }
  t.required = needed_inputs * plan.in_bytes + members * plan.out_bytes;
  uint64_t reads = needed_inputs * plan.in_bytes;
  if (plan.kind == OpKind::kPpermute || plan.kind == OpKind::kBroadcast) {
    uint64_t receivers = 0;
    for (int d = 0; d < plan.group_size; ++d) {
      const int s = plan.kind == OpKind::kBroadcast ? plan.root : plan.perm_source[d];
      receivers += s >= 0 ? 1 : 0;
    }
    reads = receivers * plan.groups.size() * plan.in_bytes;
  }
  t.read = reads + extra_read;
  t.written = members * plan.out_bytes + extra_written;
  return t;
}

struct SpanningOptions;  // spanning.h

// An executor's own connection between the hosts of a cluster mesh, for
// memory the cross-host mesh cannot move itself (GPU memory: Gloo moves host
// memory only). One rank per host, in the mesh's host order; on each host
// every member of the mesh has its buffers on the link's device. Made by
// Executor::ConnectHosts on every host with the id one host's
// Executor::NewHostLinkId gave. The cross-host mesh checks beforehand that
// every host runs the same op (its header exchange), so the link only moves
// bytes, on the schedule of RunSpanning (spanning.h).
class HostLink {
 public:
  // Closes the connection (aborting whatever it still runs).
  virtual ~HostLink() = default;
  // Runs this host's share of `plan` across the hosts: RunSpanning with one
  // partition per host (MemberIo::device is the member's host rank; this
  // host's members have their regions on the link's device, the others'
  // are `placeholder`, never touched). Returns once this host's outputs are
  // written, or fails: at `deadline` with DEADLINE_EXCEEDED, when `abort`
  // becomes true with ABORTED, on a transport error with ABORTED. After any
  // failure the link is broken: the caller drops it.
  virtual absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                           const SpanningOptions& options, uint8_t* placeholder,
                           absl::Time deadline, const std::atomic<bool>& abort,
                           Traffic* traffic) = 0;
  // The device the link is on.
  virtual int device() const = 0;
};

// The members of `io` whose output is written (out != nullptr).
inline int64_t OutputsWritten(const std::vector<MemberIo>& io) {
  int64_t n = 0;
  for (const MemberIo& m : io) n += m.out != nullptr ? 1 : 0;
  return n;
}

class Executor {
 public:
  virtual ~Executor() = default;
  virtual absl::string_view name() const = 0;
  // The kind of buffer whose memory it runs on (SharedBuffer::kind():
  // "memfd" for the CPU executor, "cuda" for the CUDA executor). The engine
  // picks the executor of an op by the kind of its members' buffers.
  virtual absl::string_view buffer_kind() const = 0;
  // Whether this executor can run here (a GPU executor without a GPU: false).
  virtual bool IsViable() const = 0;
  // Why not, when !IsViable() (logged once at start); empty otherwise.
  virtual std::string WhyNotViable() const { return ""; }
  // Runs `plan` and returns when every output is written. `io` has one entry
  // per mesh member. Safe to call concurrently for different ops. With
  // `traffic`, reports what the op moved.
  virtual absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                           Traffic* traffic = nullptr) = 0;
  // Run, and where the executor can tell, when the op's work was all
  // enqueued and how long its device took for it (`timing`; an executor
  // that runs the op on the calling thread leaves it zero). The engine runs
  // its ops through this.
  virtual absl::Status RunTimed(const OpPlan& plan, const std::vector<MemberIo>& io,
                                Traffic* traffic, DeviceTiming* timing) {
    (void)timing;
    return Run(plan, io, traffic);
  }
  // Worker threads used for data-parallel work.
  virtual int threads() const = 0;

  // Ops of meshes across hosts on this executor's memory. The CPU executor's
  // memory is moved between hosts by the cross-host mesh itself (Gloo);
  // an executor whose memory it cannot reach (GPU memory) connects the hosts
  // itself through a HostLink (spanning.h), and says so here.
  virtual bool ConnectsHosts() const { return false; }
  // A fresh id for a link between hosts: made on one host (rank 0), sent to
  // the others, given to ConnectHosts on every host.
  virtual absl::StatusOr<std::string> NewHostLinkId() {
    return absl::UnimplementedError(absl::StrCat(name(), " executor: no links between hosts"));
  }
  // Connects this host as rank `rank` of `ranks` through `id`, on device
  // `device`: returns once every host connected, or fails at `deadline`
  // (DEADLINE_EXCEEDED) or once `abort` is true (ABORTED).
  virtual absl::StatusOr<std::unique_ptr<HostLink>> ConnectHosts(const std::string& id, int rank,
                                                                 int ranks, int device,
                                                                 absl::Time deadline,
                                                                 const std::atomic<bool>& abort) {
    (void)id, (void)rank, (void)ranks, (void)device, (void)deadline, (void)abort;
    return absl::UnimplementedError(absl::StrCat(name(), " executor: no links between hosts"));
  }
};

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_EXECUTOR_H_
