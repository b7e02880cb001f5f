// HostMesh's internals shared by its two files: host_mesh.cc (the worker,
// the header exchange, ops over the host transport) and host_mesh_link.cc
// (ops over the executor's HostLink, GPU memory). Not a public interface:
// only those two files include it. See host_mesh.h for the design.

#ifndef COLLECTIVED_DAEMON_CLUSTER_HOST_MESH_INTERNAL_H_
#define COLLECTIVED_DAEMON_CLUSTER_HOST_MESH_INTERNAL_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/cluster/host_mesh.h"
#include "daemon/cluster/host_op_header.h"
#include "daemon/cluster/host_scratch.h"
#include "daemon/cluster/host_transport.h"

namespace collectived {
namespace host_mesh_internal {

inline constexpr int kSlotShift = 24;
// The header exchange's slot: the same for every op (data slots are
// (sequence << kSlotShift) | n), so that hosts at different op counts still
// meet there and learn that they differ. Ops of a mesh run one at a time and
// the transport matches a pair's messages of one slot in order.
inline constexpr uint64_t kHeaderSlot = uint64_t{1} << 63;
// The connections of a pair of hosts (HostMesh::LaneOf).
inline constexpr int kLanes = 2;
// Transfers of at least this many bytes go over the lane of their
// direction, smaller ones (and headers) over the first (LaneOf): a small
// transfer's time is its wakeups, and two I/O threads a host are more of
// them (over Gloo, 2-host psums of 1-16 KiB took a median of 260-300 us
// with every transfer directed against 130-270 us). Every host of a mesh
// runs the same build (the wire version), so both ends of a transfer pick
// the same lane.
inline constexpr uint64_t kDirectedMinBytes = 256 * 1024;
// How long before an op's deadline the hosts whose header has not come are
// asked what their members are doing (at most a quarter of the op's time),
// and how long past the deadline their answers are awaited when they have
// not come by then.
inline constexpr absl::Duration kQueryLead = absl::Milliseconds(150);
inline constexpr absl::Duration kAnswerGrace = absl::Milliseconds(50);

// The chain's chunk for an op of `bytes`: the configured one, but small
// enough for four chunks down to 1 MiB, since an op of one chunk crosses
// each link one way at a time (every host computes the same from the same
// configuration, which the header exchange checks).
inline uint64_t ChainChunkBytes(uint64_t configured, uint64_t bytes) {
  constexpr uint64_t kSmallest = uint64_t{1} << 20;
  return std::min(configured, std::max(std::min(configured, kSmallest), bytes / 4));
}

class HostMesh;

// One posted send or receive of an op.
struct Posted {
  std::unique_ptr<HostTransfer> transfer;
  int rank = 0;
  bool send = false;
};

// What the transport reports before the engine's observer is installed is
// kept for it (the transport is connected before the mesh exists).
class ObserverRelay {
 public:
  void Broken(const absl::Status& why) {
    std::function<void(const absl::Status&)> cb;
    {
      MutexLock lock(&mu_);
      if (!broken_.ok()) return;
      broken_ = why;
      cb = observer_.on_broken;
    }
    if (cb) cb(why);
  }
  // Nothing while no observer is installed: the asking host then says this
  // host did not answer.
  std::optional<std::string> Query(int64_t sequence) {
    std::function<std::string(int64_t)> cb;
    {
      MutexLock lock(&mu_);
      cb = observer_.on_query;
    }
    if (!cb) return std::nullopt;
    return cb(sequence);
  }
  void Install(CrossHostObserver observer) {
    absl::Status earlier;
    std::function<void(const absl::Status&)> cb;
    {
      MutexLock lock(&mu_);
      observer_ = std::move(observer);
      earlier = broken_;
      cb = observer_.on_broken;
    }
    if (!earlier.ok() && cb) cb(earlier);
  }
  // The engine's mesh is going: nothing more reaches it.
  void Detach() {
    MutexLock lock(&mu_);
    observer_ = CrossHostObserver{};
  }

 private:
  Mutex mu_;
  CrossHostObserver observer_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

class HostMesh final : public CrossHostMesh {
 public:
  HostMesh(MeshTopology topology, std::unique_ptr<HostTransport> transport,
           std::shared_ptr<ObserverRelay> relay, const HostMeshOptions& options)
      : topology_(std::move(topology)), options_(options), transport_(std::move(transport)),
        relay_(std::move(relay)) {
    worker_ = std::thread([this] { Loop(); });
  }

  ~HostMesh() override {
    relay_->Detach();
    Abort(absl::AbortedError(
        absl::StrCat("the mesh was closed on host ", topology_.hosts[topology_.self])));
    {
      MutexLock lock(&mu_);  // the worker's Await sees it at the unlock
      stop_ = true;
    }
    worker_.join();
    // Transfers go before their transport.
    header_recvs_.clear();
    transport_.reset();
  }

  void Start(std::shared_ptr<const OpPlan> plan, int64_t sequence, std::vector<MemberIo> io,
             Executor* executor, absl::Status verdict, absl::Time deadline, Done done,
             absl::Duration timeout) override {
    {
      MutexLock lock(&mu_);
      queue_.push_back(Op{std::move(plan), sequence, std::move(io), executor, std::move(verdict),
                          deadline, timeout, std::move(done)});
    }  // the worker's Await sees it at the unlock
  }

  void Abort(const absl::Status& why_in) override {
    const absl::Status why = why_in.ok() ? absl::AbortedError("the mesh was aborted") : why_in;
    {
      MutexLock lock(&mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_status_ = why;
      // An op on the link waits on the link's flag, not on the transport
      // (its watch may have received every fence already).
      if (stop_link_) stop_link_(why);
    }
    // Every transfer in flight fails with `why`, and the other hosts are
    // told.
    transport_->Break(why);
  }

  void Observe(CrossHostObserver observer) override { relay_->Install(std::move(observer)); }

  // --- Used by the op in flight (the worker thread) ---

  int self() const { return topology_.self; }
  int size() const { return static_cast<int>(topology_.hosts.size()); }
  const std::string& host(int rank) const { return topology_.hosts[rank]; }

  // Posts a send of [p, p + bytes) to `rank` (or a receive into it from
  // `rank`) on `slot`, over the lane LaneOf picks.
  absl::Status Post(std::vector<Posted>& posted, bool send, int rank, uint8_t* p, uint64_t bytes,
                    uint64_t slot, bool directed = false) {
    const int lane = LaneOf(send ? self() : rank, send ? rank : self(), directed);
    auto t = send ? transport_->Send(rank, lane, slot, p, bytes)
                  : transport_->Recv(rank, lane, slot, p, bytes);
    if (!t.ok()) return Failure(t.status());
    posted.push_back(Posted{*std::move(t), rank, send});
    return absl::OkStatus();
  }

  // Waits for every posted transfer (receives first, in order, then sends)
  // until `deadline`, and forgets them: the first error.
  absl::Status WaitAll(std::vector<Posted>& posted, absl::Time deadline) {
    absl::Status status;
    for (bool sends : {false, true}) {
      for (Posted& x : posted) {
        if (!status.ok()) break;
        if (x.send == sends) status = WaitOne(x, deadline);
      }
    }
    return Forget(posted, status);
  }

  // Waits for one posted transfer until `deadline`.
  absl::Status WaitOne(Posted& x, absl::Time deadline) {
    absl::Status st = x.transfer->Wait(deadline);
    if (st.ok()) return st;
    if (absl::IsDeadlineExceeded(st) && transport_->broken().ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("op ", sequence_, " of the mesh: host ", host(x.rank),
                       " did not take part within the op timeout"));
    }
    return Failure(st);
  }

  // Forgets the posted transfers (without waiting for them); returns `status`.
  absl::Status Forget(std::vector<Posted>& posted, absl::Status status) {
    posted.clear();
    return status;
  }

  uint8_t* placeholder() const { return placeholder_base_; }
  ScratchPool& scratch() { return scratch_; }
  // Where the fence of an op on the link from `rank` lands (the mesh's, not
  // the op's).
  uint8_t* fence_in(int rank) { return &fence_in_[static_cast<size_t>(rank)]; }

 private:
  struct Op {
    std::shared_ptr<const OpPlan> plan;
    int64_t sequence = 0;
    std::vector<MemberIo> io;
    Executor* executor = nullptr;
    absl::Status verdict;
    absl::Time deadline;
    absl::Duration timeout;
    Done done;
  };
  struct Result {
    absl::Status status;
    bool broken = false;
    Traffic traffic;
  };

  // A transfer's failure: once the mesh is aborted here, its reason (the
  // transport fails every transfer with it); else what the transport says
  // (it names the cause).
  absl::Status Failure(const absl::Status& st) {
    MutexLock lock(&mu_);
    return aborted_ ? abort_status_ : st;
  }

  void Loop() {
    for (;;) {
      Op op;
      bool aborted;
      absl::Status abort_status, broken;
      {
        MutexLock lock(&mu_);
        // Await evaluates the condition with mu_ held.
        mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_
        op = std::move(queue_.front());
        queue_.pop_front();
        aborted = aborted_;
        abort_status = abort_status_;
        broken = broken_;
      }
      Result r;
      if (aborted) {
        r.status = abort_status;
        r.broken = true;
      } else if (!broken.ok()) {
        r.status = absl::AbortedError(
            absl::StrCat("the mesh broke in an earlier op: ", broken.message()));
        r.broken = true;
      } else {
        r = Run(op);
        if (r.broken) {
          {
            MutexLock relock(&mu_);
            broken_ = r.status;
          }
          // The other hosts learn why at once (they may be waiting on this
          // host), before the connections shut down; when the transport
          // broke first, it told them its cause already.
          transport_->Break(r.status);
        }
      }
      // An op of a mesh that broke: the header receives go now, before the
      // transport (their owner is this thread).
      if (r.broken) header_recvs_.clear();
      op.done(std::move(r.status), r.broken, r.traffic);
    }
  }

  Result Run(Op& op);
  Result ExchangeHeaders(const Op& op, absl::Status verdict);
  // The header exchange's wait: the headers of every other host, asking the
  // late ones what their members are doing shortly before the deadline.
  absl::Status WaitHeaders(const Op& op, std::vector<Posted>& sends);
  // The op's data phase over the executor's HostLink (memory the transport
  // cannot move), connecting it first if this is the mesh's first such op.
  Result RunOverLink(const Op& op, const std::vector<MemberIo>& io, int device);
  // Connects link_: rank 0 makes the id and sends it to the other hosts
  // over the transport; every host then connects on `device` (until the
  // deadline, or `abort`).
  absl::Status ConnectLink(const Op& op, int device, const std::atomic<bool>& abort);
  // The device of this host's members of `op` (on the link), or why the op
  // cannot run over the link.
  absl::Status LinkDevice(const Op& op, const std::vector<int>& rank_of, int* device) const;

  // The lane of a message from rank `from` to rank `to`: the first, or
  // when `directed`, the first for messages to a higher rank and the second
  // for those to a lower one, so that a host's large send to a peer and its
  // receive from that peer move at once, on an I/O thread each. Both ends
  // of a message pick the same lane, and the messages of one slot between
  // two hosts all go over one lane, which keeps them in order.
  static int LaneOf(int from, int to, bool directed) { return directed && from > to ? 1 : 0; }

  const MeshTopology topology_;
  const HostMeshOptions options_;
  std::unique_ptr<HostTransport> transport_;
  const std::shared_ptr<ObserverRelay> relay_;
  int64_t sequence_ = 0;  // of the op in flight
  Placeholder placeholder_;
  uint8_t* placeholder_base_ = nullptr;
  ScratchPool scratch_{options_.scratch_keep_bytes};  // the host ops' scratch
  std::vector<uint8_t> fence_in_ = std::vector<uint8_t>(topology_.hosts.size());
  // Set (under mu_) while an op runs over the link: stops its waits.
  std::function<void(const absl::Status&)> stop_link_ ABSL_GUARDED_BY(mu_);
  // The executor's link between the hosts (GPU ops), made by the first op
  // that needs it; only the worker uses it. Dropped when an op over it
  // fails.
  std::unique_ptr<HostLink> link_;

  Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  // Why an earlier op broke the connections (OK while they are fine).
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // The receive of each other host's next header, posted as soon as the
  // last one came (so that a host's header goes out the moment it starts
  // the op). Only the worker uses them; header_in_ holds what they receive.
  std::vector<std::array<uint8_t, host_header::kHeaderCapacity>> header_in_;  // per rank
  std::vector<Posted> header_recvs_;
  // Why posting them again failed (the next op fails with it, broken).
  absl::Status next_headers_;
  std::thread worker_;
};

}  // namespace host_mesh_internal
}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_HOST_MESH_INTERNAL_H_
