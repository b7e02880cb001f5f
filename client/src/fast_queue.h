// The client's half of a session's fast-path queue.
#ifndef COLLECTIVED_CLIENT_SRC_FAST_QUEUE_H_
#define COLLECTIVED_CLIENT_SRC_FAST_QUEUE_H_

#include "collectived/client.h"

#include <poll.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <deque>
#include <cstdlib>
#include <limits>
#include <map>
#include <thread>

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fast_queue.h"
#include "common/sync.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "common/raise_word.h"
#include "common/side_protocol.h"
#include "common/socket_path.h"
#include "common/status_util.h"
#include "common/unix_socket.h"
#include "client/src/member_ops.h"
#ifdef COLLECTIVED_HAVE_CUDA
#include <cuda.h>

#include "client/src/cuda_import.h"
#include "client/src/cuda_stream_sync.h"
#include "common/cuda/driver.h"
#endif
#include "client/src/op_state.h"
#include "client/src/rpc_util.h"

namespace collectived {

// The client's half of a session's fast-path queue (common/fast_queue.h).
//
// Submissions are serialized by mu_. Completions are reaped by the threads
// that wait: one at a time takes the reaper role (reaping_), polls or sleeps
// on the CQ doorbell, and completes whatever arrived, for every waiter; the
// others wait on mu_ for their op or for the role to become free.
//
// One thread of the SDK's own, the monitor, sleeps in poll() on a duplicate
// of the side socket until it hangs up (the daemon died or closed the
// session), then fails every pending op and rings the client doorbell, so a
// waiter asleep on the futex learns of it at once and a future nobody waits
// on turns ready. It polls only for the hang-up, never for input, so the
// side socket's replies stay for SideRequest; it costs nothing while the
// daemon lives and adds nothing to the op path.
class FastQueue final : public OpWaiter {
 public:
  // Takes ownership of the mapping of `base` and of `live_fd`, a descriptor
  // of the side socket, and starts the monitor.
  static absl::StatusOr<std::shared_ptr<FastQueue>> Create(void* base, int live_fd,
                                                            absl::Duration spin) {
    const int stop_fd = eventfd(0, EFD_CLOEXEC);
    if (stop_fd < 0) {
      const int err = errno;
      munmap(base, fastq::kQueueBytes);
      close(live_fd);
      return ErrnoStatus(err, "eventfd for the fast-path monitor");
    }
    return std::shared_ptr<FastQueue>(new FastQueue(base, live_fd, stop_fd, spin));
  }
  ~FastQueue() {
    Shutdown(absl::CancelledError("client closed"));
    munmap(base_, fastq::kQueueBytes);
  }
  FastQueue(const FastQueue&) = delete;
  FastQueue& operator=(const FastQueue&) = delete;

  // Whether `op` fits in a queue slot.
  static bool Fits(const v1::OpSpec& op) { return op.ByteSizeLong() <= fastq::kMaxOpBytes; }

  // Publishes `op` (which must fit); `state` completes when the daemon
  // answers, or with the queue's failure.
  void Submit(const v1::OpSpec& op, const std::shared_ptr<OpState>& state, absl::Time deadline) {
    {
      MutexLock lock(&mu_);
      // At most kSlots ops in flight: that keeps an SQ slot free and matches
      // the daemon's credit rule, so the daemon never waits for this process.
      const bool room = WaitLocked(
          [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return tail_ - cq_head_ < fastq::kSlots; },
          deadline, spin_);
      if (!failure_.ok() || !room) {
        state->Complete(!failure_.ok() ? failure_
                                       : absl::DeadlineExceededError(
                                             "the fast-path queue stayed full (ops in flight "
                                             "did not complete)"),
                        -1, {}, DType::kInvalid);
        return;
      }
      fastq::SqEntry& e = q_.sq[tail_ % fastq::kSlots];
      const uint64_t tag = next_tag_++;
      e.tag = tag;
      e.len = static_cast<uint32_t>(op.ByteSizeLong());
      e.submit_ns = fastq::MonotonicNs();
      state->SetTiming(OpTiming{.submitted_ns = e.submit_ns});
      op.SerializeWithCachedSizesToArray(e.data);
      pending_[tag] = state;
      ++tail_;
      q_.header->sq_tail.v.store(tail_, std::memory_order_seq_cst);
    }
    fastq::Ring(q_.header->daemon_bell, q_.header->daemon_sleeping);
  }

  // Waits until `state` completes or `deadline` passes; false at the deadline.
  // Polls first only for small ops (fastq::kSpinOpBytes).
  bool Wait(OpState* state, absl::Time deadline) override {
    MutexLock lock(&mu_);
    return WaitLocked([state] { return state->Ready(); }, deadline,
                      state->small() ? spin_ : absl::ZeroDuration());
  }

  // Waits until the daemon has taken every entry published so far (so each
  // has its place in the op order). False at the deadline or on failure.
  bool WaitTaken(absl::Time deadline) {
    uint32_t tail;
    {
      MutexLock lock(&mu_);
      tail = tail_;
    }
    while (q_.header->sq_head.v.load(std::memory_order_acquire) != tail) {
      if (absl::Now() >= deadline || failed_.load()) return false;
      absl::SleepFor(absl::Microseconds(100));
    }
    return true;
  }

  // Fails every pending and later op with `status` (unless the queue failed
  // already), stops the monitor and closes this queue's descriptor of the
  // side socket. Idempotent; returns at once (the monitor only sleeps in
  // poll(), which the stop event ends).
  void Shutdown(const absl::Status& status) {
    {
      MutexLock lock(&mu_);
      FailLocked(status);
      if (stopped_) return;
      stopped_ = true;
    }
    const uint64_t one = 1;
    while (write(stop_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    monitor_.join();
    close(stop_fd_);
    close(live_fd_);
  }

 private:
  FastQueue(void* base, int live_fd, int stop_fd, absl::Duration spin)
      : base_(base), q_(fastq::QueueView::Of(base)), live_fd_(live_fd), stop_fd_(stop_fd),
        spin_(spin) {
    monitor_ = std::thread([this] { Monitor(); });
  }

  // The monitor thread: sleeps until the side socket hangs up or Shutdown
  // writes stop_fd_. The wait has no deadline of its own: its owner ends it
  // (Shutdown, also run by the destructor, before anything it uses goes).
  void Monitor() {
    pollfd p[2] = {{live_fd_, POLLRDHUP, 0}, {stop_fd_, POLLIN, 0}};
    absl::Status lost =
        absl::UnavailableError("connection to the daemon lost (side socket closed)");
    for (;;) {
      const int r = poll(p, 2, -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        // Cannot watch the daemon any more: fail rather than risk waiters
        // that would never learn of its death.
        lost = ErrnoStatus(errno, "watching the side socket to the daemon");
        break;
      }
      if (p[1].revents != 0) return;  // Shutdown
      if (p[0].revents != 0) break;   // POLLRDHUP, POLLHUP, POLLERR: the peer is gone
    }
    {
      MutexLock lock(&mu_);
      DrainLocked();  // completes what the daemon answered before it went
      FailLocked(lost);
      dead_.store(true, std::memory_order_seq_cst);
    }
    // Wakes a reaper asleep on the futex. dead_ was stored before this
    // increment, so a reaper that read the bell before it sees dead_ in its
    // ready() check, or finds the bell changed and does not sleep.
    q_.header->client_bell.v.fetch_add(1, std::memory_order_seq_cst);
    fastq::FutexWake(&q_.header->client_bell.v);
  }

  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failure_.ok()) failure_ = status;
    failed_.store(true);
    for (auto& [tag, state] : pending_) state->Complete(failure_, -1, {}, DType::kInvalid);
    pending_.clear();
  }

  // Completes the ops whose answers are in the CQ and hands the slots back.
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint32_t tail = q_.header->cq_tail.v.load(std::memory_order_seq_cst);
    if (tail != cq_head_) {
      while (cq_head_ != tail) {
        const fastq::CqEntry& c = q_.cq[cq_head_ % fastq::kSlots];
        auto it = pending_.find(c.tag);
        if (it != pending_.end()) {
          const int rank = std::clamp<int>(c.rank, 0, fastq::kMaxRank);
          const size_t len = std::min<size_t>(c.msg_len, sizeof(c.msg));
          OpTiming t = it->second->timing();
          t.taken_ns = c.taken_ns;
          t.started_ns = c.started_ns;
          t.matched_ns = c.matched_ns;
          t.ready_ns = c.ready_ns;
          t.launched_ns = c.launched_ns;
          t.executed_ns = c.executed_ns;
          t.device_ns = c.device_ns;
          t.completed_ns = c.done_ns;
          t.reaped_ns = fastq::MonotonicNs();
          it->second->SetTiming(t);
          it->second->SetTraffic(OpTraffic{c.bytes_read, c.bytes_written, c.bytes_required});
          it->second->Complete(absl::Status(static_cast<absl::StatusCode>(c.code),
                                            absl::string_view(c.msg, len)),
                               c.sequence, std::vector<int64_t>(c.out_shape, c.out_shape + rank),
                               static_cast<DType>(c.out_dtype));
          pending_.erase(it);
        }
        ++cq_head_;
      }
      q_.header->cq_head.v.store(cq_head_, std::memory_order_seq_cst);
      // The daemon may be out of credit, waiting for these slots.
      fastq::Ring(q_.header->daemon_bell, q_.header->daemon_sleeping);
    }
    if (!failure_.ok()) return;
    if (q_.header->closed.v.load(std::memory_order_seq_cst) != 0) {
      FailLocked(absl::UnavailableError(
          "the daemon stopped serving this session's queue (it is stopping, or the session "
          "was closed)"));
    } else if (dead_.load()) {
      FailLocked(absl::UnavailableError("connection to the daemon lost (side socket closed)"));
    }
  }

  // Waits until pred() (evaluated under mu_), a failure, or `deadline`;
  // returns pred(). Reaps the CQ while it waits, for every waiter.
  template <typename Pred>
  bool WaitLocked(Pred pred, absl::Time deadline, absl::Duration spin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      if (pred()) return true;
      if (!failure_.ok()) return pred();
      if (absl::Now() >= deadline) {
        // A last look at completions nobody has reaped yet: a zero deadline
        // polls (OpFuture::Ready) instead of missing them.
        DrainLocked();
        return pred();
      }
      if (reaping_) {
        mu_.AwaitWithDeadline(
            [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return pred() || !reaping_ || !failure_.ok();
            },
            deadline);
        continue;
      }
      reaping_ = true;
      const uint32_t seen = cq_head_;
      mu_.Unlock();
      fastq::SpinThenSleep(
          q_.header->client_bell, q_.header->client_sleeping,
          [this, seen] {
            return q_.header->cq_tail.v.load(std::memory_order_seq_cst) != seen ||
                   q_.header->closed.v.load(std::memory_order_seq_cst) != 0 ||
                   dead_.load(std::memory_order_seq_cst);
          },
          // The monitor rings the bell when the daemon goes; the slices only
          // bound the cost of a wake-up that would go missing.
          [this] { return !dead_.load(std::memory_order_seq_cst); },
          spin, absl::Milliseconds(100), deadline);
      mu_.Lock();
      reaping_ = false;
      DrainLocked();
    }
  }

  void* const base_;
  const fastq::QueueView q_;
  const int live_fd_;  // read by the monitor only; closed by Shutdown
  const int stop_fd_;  // eventfd: Shutdown's stop signal to the monitor
  const absl::Duration spin_;
  std::thread monitor_;  // set by the constructor, joined by Shutdown
  Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown ran
  bool reaping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> dead_{false};    // the side socket hung up
  std::atomic<bool> failed_{false};  // failure_ is set (for WaitTaken)
  uint32_t tail_ ABSL_GUARDED_BY(mu_) = 0;     // SQ entries published
  uint32_t cq_head_ ABSL_GUARDED_BY(mu_) = 0;  // completions consumed
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<OpState>> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_FAST_QUEUE_H_
