// HostMesh's ops over the executor's HostLink (GPU memory across hosts,
// NCCL): the link connected on the mesh's first such op, and the fences
// that let a lost host stop the link's waits at once.

#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/sync.h"
#include "daemon/cluster/host_mesh_internal.h"
#include "exec/spanning.h"

namespace collectived {
namespace host_mesh_internal {

using host_header::CopyText;
using host_header::Text;

absl::Status HostMesh::LinkDevice(const Op& op, const std::vector<int>& rank_of,
                                           int* device) const {
  const std::string where = absl::StrCat("op ", op.sequence, " of the mesh runs on ",
                                         op.executor->buffer_kind(), " memory");
  if (!op.executor->ConnectsHosts()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ", which the ", op.executor->name(), " executor cannot move between hosts"));
  }
  std::set<int> devices;
  for (size_t m = 0; m < op.io.size(); ++m) {
    if (rank_of[m] == topology_.self && op.io[m].in != nullptr) devices.insert(op.io[m].device);
  }
  if (devices.empty()) return absl::InternalError(absl::StrCat(where, " without local members"));
  if (devices.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ", and this host's members have their buffers on devices ",
        absl::StrJoin(devices, ", "),
        ": across hosts, every member on a host must have its buffers on one device"));
  }
  *device = *devices.begin();
  if (link_ != nullptr && link_->device() != *device) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " on device ", *device, " of this host, but the mesh's link between hosts is on ",
        "device ", link_->device(), " (its first op's): across hosts, a mesh's buffers must stay on ",
        "one device per host"));
  }
  return absl::OkStatus();
}

absl::Status HostMesh::ConnectLink(const Op& op, int device,
                                            const std::atomic<bool>& abort) {
  // What rank 0 sends every other host: the link's id, or why it has none.
  struct LinkId {
    int32_t ok;
    uint32_t size;
    char id[512];
    char error[200];
  };
  static_assert(std::is_trivially_copyable_v<LinkId>);
  LinkId msg;
  std::memset(&msg, 0, sizeof(msg));
  const int size = static_cast<int>(topology_.hosts.size());
  const uint64_t slot =
      (static_cast<uint64_t>(op.sequence) << kSlotShift) | ((uint64_t{1} << kSlotShift) - 1);
  std::vector<Posted> posted;
  absl::Status status;
  if (topology_.self == 0) {
    absl::StatusOr<std::string> id = op.executor->NewHostLinkId();
    if (id.ok() && id->size() > sizeof(msg.id)) {
      id = absl::InternalError(absl::StrCat("a link id of ", id->size(), " bytes"));
    }
    if (id.ok()) {
      msg.ok = 1;
      msg.size = static_cast<uint32_t>(id->size());
      std::memcpy(msg.id, id->data(), id->size());
    } else {
      CopyText(msg.error, sizeof(msg.error), id.status().message());
    }
    for (int rank = 1; rank < size && status.ok(); ++rank) {
      status = Post(posted, /*send=*/true, rank, reinterpret_cast<uint8_t*>(&msg), sizeof(msg),
                    slot);
    }
  } else {
    status = Post(posted, /*send=*/false, 0, reinterpret_cast<uint8_t*>(&msg), sizeof(msg), slot);
  }
  status = status.ok() ? WaitAll(posted, op.deadline) : Forget(posted, status);
  if (!status.ok()) return status;
  if (msg.ok == 0 || msg.size > sizeof(msg.id)) {
    return absl::AbortedError(absl::StrCat("host ", topology_.hosts[0],
                                           " could not make the link between hosts: ",
                                           Text(msg.error, sizeof(msg.error))));
  }
  absl::StatusOr<std::unique_ptr<HostLink>> link = op.executor->ConnectHosts(
      std::string(msg.id, msg.size), topology_.self, size, device, op.deadline, abort);
  if (!link.ok()) return link.status();
  link_ = *std::move(link);
  return absl::OkStatus();
}

// While an op runs over the executor's link (NCCL), nothing of it is posted
// on the transport, and NCCL itself notices a host that went away late or
// never (a connect in progress waits for it): the op would wait for its
// deadline. So each host posts a receive of every other host's fence for
// the op, a thread waits for them, and a failure of the transport (another
// host gone, or its BREAK) stops the link's waits at once. A host sends its
// fence when its part of the op is done; every host then waits for the
// others' fences, so every posted receive is matched before the op ends.
class LinkWatch {
 public:
  LinkWatch(HostMesh* mesh, int64_t sequence, absl::Time deadline)
      : mesh_(mesh),
        slot_((static_cast<uint64_t>(sequence) << kSlotShift) | ((uint64_t{1} << kSlotShift) - 2)),
        deadline_(deadline) {
    absl::Status status;
    for (int rank = 0; rank < mesh_->size() && status.ok(); ++rank) {
      if (rank == mesh_->self()) continue;
      status = mesh_->Post(recvs_, /*send=*/false, rank, mesh_->fence_in(rank), 1, slot_);
    }
    if (!status.ok()) {
      StopFor(std::move(status));
      return;
    }
    try {
      thread_ = std::thread([this] { Watch(); });
    } catch (const std::system_error& e) {
      StopFor(absl::ResourceExhaustedError(
          absl::StrCat("cannot start a thread to watch the connections between the hosts: ",
                       e.what())));
    }
  }
  ~LinkWatch() { Stop(); }
  LinkWatch(const LinkWatch&) = delete;
  LinkWatch& operator=(const LinkWatch&) = delete;

  // True once a connection is lost, the mesh is aborted, or the deadline
  // passed: what the link's waits watch.
  const std::atomic<bool>& stop() const { return stop_; }

  // Stops the link's waits, for `why` (the first reason stands).
  void StopFor(absl::Status why) {
    {
      MutexLock lock(&mu_);
      if (why_.ok()) why_ = std::move(why);
    }
    stop_.store(true, std::memory_order_release);
  }

  // Ends the watch: after this host's part of the op ended with `status`.
  // OK: sends the fence to every other host and waits for theirs (until the
  // deadline), and returns why the watch stopped, if it did. Not OK: why the
  // watch had stopped the link before it returned, if it had (a lost
  // connection names its host; the link's error then only says it was
  // stopped), else the link's own error.
  absl::Status Finish(absl::Status status) {
    const bool stopped_first = stop_.load(std::memory_order_acquire);
    if (status.ok() && !stopped_first) {
      // Static, so that a send withdrawn after a failure never reads freed
      // memory.
      static uint8_t fence = 1;
      std::vector<Posted> sends;
      for (int rank = 0; rank < mesh_->size() && status.ok(); ++rank) {
        if (rank == mesh_->self()) continue;
        status = mesh_->Post(sends, /*send=*/true, rank, &fence, 1, slot_);
      }
      status = status.ok() ? mesh_->WaitAll(sends, deadline_) : mesh_->Forget(sends, status);
      // Every fence came (or the watch stopped): the thread is done.
      if (status.ok() && thread_.joinable()) thread_.join();
    }
    Stop();
    MutexLock lock(&mu_);
    if (why_.ok()) return status;
    // The link failed on its own before the watch stopped it: its error.
    if (!status.ok() && !stopped_first && !absl::IsAborted(status)) return status;
    return why_;
  }

 private:
  // Waits for every other host's fence (all at once: any one failing stops
  // the link), in slices so that Stop is seen.
  void Watch() {
    for (;;) {
      if (stopping_.load(std::memory_order_acquire)) return;
      Posted* pending = nullptr;
      std::vector<std::string> late;
      for (Posted& x : recvs_) {
        if (!x.transfer->done()) {
          if (pending == nullptr) pending = &x;
          late.push_back(mesh_->host(x.rank));
          continue;
        }
        // Done: its outcome is there at once.
        const absl::Status st = mesh_->WaitOne(x, absl::InfinitePast());
        if (!st.ok()) {
          StopFor(st);
          return;
        }
      }
      if (pending == nullptr) return;
      if (absl::Now() >= deadline_) {
        StopFor(absl::DeadlineExceededError(absl::StrCat(
            late.size() == 1 ? "host " : "hosts ", absl::StrJoin(late, ", "),
            late.size() == 1 ? " did not finish its part" : " did not finish their parts",
            " within the op timeout")));
        return;
      }
      // Any transfer's completion wakes this wait.
      (void)pending->transfer->Wait(std::min(deadline_, absl::Now() + absl::Milliseconds(20)));
    }
  }

  // Stops the thread and forgets the receives.
  void Stop() {
    stopping_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    mesh_->Forget(recvs_, absl::OkStatus()).IgnoreError();
  }

  HostMesh* const mesh_;
  const uint64_t slot_;
  const absl::Time deadline_;
  std::vector<Posted> recvs_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stopping_{false};  // Stop() is ending the thread
  Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);  // why the watch stopped
};

HostMesh::Result HostMesh::RunOverLink(const Op& op,
                                                         const std::vector<MemberIo>& io,
                                                         int device) {
  Result r;
  LinkWatch watch(this, op.sequence, op.deadline);
  {
    MutexLock lock(&mu_);
    if (aborted_) watch.StopFor(abort_status_);
    stop_link_ = [&watch](const absl::Status& why) { watch.StopFor(why); };
  }
  absl::Status status;
  if (watch.stop().load(std::memory_order_acquire)) {
    status = absl::AbortedError("the link's op was stopped before it started");
  }
  if (status.ok() && link_ == nullptr) status = ConnectLink(op, device, watch.stop());
  if (status.ok()) {
    // Lanes and replication: the CUDA kernels do not continue a fold from a
    // partial result, which the chain needs.
    SpanningOptions options;
    options.chain = false;
    status = link_->Run(*op.plan, io, options, placeholder_base_, op.deadline, watch.stop(),
                        &r.traffic);
  }
  status = watch.Finish(std::move(status));
  {
    MutexLock lock(&mu_);
    stop_link_ = nullptr;
  }
  if (status.ok()) return r;
  // The hosts may be at different points of the schedule: the link and the
  // connections cannot be trusted any more.
  link_.reset();
  r.broken = true;
  std::vector<std::string> others;
  for (int rank = 0; rank < static_cast<int>(topology_.hosts.size()); ++rank) {
    if (rank != topology_.self) others.push_back(topology_.hosts[rank]);
  }
  const std::string with = absl::StrCat(others.size() == 1 ? "host " : "hosts ",
                                        absl::StrJoin(others, ", "));
  {
    MutexLock lock(&mu_);
    if (aborted_) {
      r.status = abort_status_;
      return r;
    }
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    r.status = absl::DeadlineExceededError(
        absl::StrCat("op ", op.sequence, " of the mesh: the exchange with ", with, " over the ",
                     op.executor->name(), " executor's link did not finish within the op timeout (",
                     status.message(), ")"));
  } else if (status.code() == absl::StatusCode::kAborted ||
             status.code() == absl::StatusCode::kInternal ||
             status.code() == absl::StatusCode::kUnavailable) {
    r.status = absl::AbortedError(absl::StrCat("op ", op.sequence, " of the mesh: the exchange with ",
                                               with, " over the ", op.executor->name(),
                                               " executor's link failed (", status.message(), ")"));
  } else {
    r.status = status;
  }
  return r;
}

}  // namespace host_mesh_internal
}  // namespace collectived
