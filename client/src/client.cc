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

namespace collectived {

namespace {

// Added to every deadline the daemon enforces, so that the daemon's precise
// error arrives before the SDK's own fallback deadline.
constexpr absl::Duration kGrace = absl::Seconds(10);

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

v1::BufferRef ToRef(const Array& a) {
  v1::BufferRef ref;
  ref.set_buffer_id(a.buffer != nullptr ? a.buffer->id() : "");
  ref.set_offset(static_cast<int64_t>(a.offset));
  return ref;
}

}  // namespace

class OpState;

// What an op's waiter drives: the fast-path queue or the gRPC stream the op
// went out on. Wait returns true once `state` completed, false at
// `deadline` (InfinitePast: only what is there now, without blocking).
class OpWaiter {
 public:
  virtual ~OpWaiter() = default;
  virtual bool Wait(OpState* state, absl::Time deadline) = 0;
};

// Shared state of one op: written once (by the stream reader or the thread
// reaping the fast-path queue), read by futures.
class OpState {
 public:
  // `queue`: the fast-path queue or the gRPC stream the op was submitted
  // on (null: completed before it was sent). A waiter on it drives it.
  // `small`: a waiter may poll for it (fastq::kSpinOpBytes).
  OpState(absl::Duration default_wait, std::shared_ptr<OpWaiter> queue = nullptr,
          bool small = true)
      : default_wait_(default_wait), queue_(std::move(queue)), small_(small) {}
  bool small() const { return small_; }
  void Complete(absl::Status status, int64_t sequence, std::vector<int64_t> out_shape,
                DType out_dtype) {
    std::function<void()> on_failure;
    {
      MutexLock lock(&mu_);
      if (done_) return;
      done_ = true;
      on_failure = std::move(on_failure_);  // dropped, not run, on success
      if (status.ok()) on_failure = nullptr;
      status_ = std::move(status);
      sequence_ = sequence;
      out_shape_ = std::move(out_shape);
      out_dtype_ = out_dtype;
      done_flag_.store(true, std::memory_order_release);
    }
    if (on_failure) on_failure();
  }
  // Runs `f` once if the op fails (at once if it already has); never after
  // a success. `f` must not block.
  void OnFailure(std::function<void()> f) {
    {
      MutexLock lock(&mu_);
      if (!done_) {
        on_failure_ = std::move(f);
        return;
      }
      if (status_.ok()) return;
    }
    f();
  }
  absl::Status Wait(std::optional<absl::Duration> timeout);
  bool Ready() const { return done_flag_.load(std::memory_order_acquire); }
  // Ready(), after reaping the fast path's completions that arrived (nobody
  // reaps them unless a thread waits).
  bool Poll();
  absl::Duration default_wait() const { return default_wait_; }
  absl::Status status() {
    MutexLock lock(&mu_);
    return status_;
  }
  // Set by the fast path: before publishing (submitted_ns), and before
  // Complete (the rest).
  void SetTiming(const OpTiming& t) {
    MutexLock lock(&mu_);
    timing_ = t;
  }
  OpTiming timing() {
    MutexLock lock(&mu_);
    return timing_;
  }
  void SetTraffic(const OpTraffic& t) {
    MutexLock lock(&mu_);
    traffic_ = t;
  }
  OpTraffic traffic() {
    MutexLock lock(&mu_);
    return traffic_;
  }
  int64_t sequence() {
    MutexLock lock(&mu_);
    return sequence_;
  }
  std::vector<int64_t> out_shape() {
    MutexLock lock(&mu_);
    return out_shape_;
  }
  DType out_dtype() {
    MutexLock lock(&mu_);
    return out_dtype_;
  }

 private:
  const absl::Duration default_wait_;
  const std::shared_ptr<OpWaiter> queue_;
  const bool small_;
  std::atomic<bool> done_flag_{false};
  Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> out_shape_ ABSL_GUARDED_BY(mu_);
  DType out_dtype_ ABSL_GUARDED_BY(mu_) = DType::kInvalid;
  OpTiming timing_ ABSL_GUARDED_BY(mu_);
  OpTraffic traffic_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_failure_ ABSL_GUARDED_BY(mu_);
};

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

// The session's gRPC Execute stream, on the asynchronous API with one
// completion queue and no thread of its own: the threads that wait drive it.
// One at a time takes the driver role (driving_), sleeps in the completion
// queue until its own deadline and handles whatever arrives: a result
// completes its op (whoever waits for it), a finished write sends the next
// queued one, a failed read ends the stream (every pending op fails). So a
// result wakes the thread that waits for it directly, with no reader thread
// in between; the others wait on mu_ for their op or for the role.
//
// Writes go out one at a time (the API allows one in flight): Submit first
// drives the stream until the stream has started and the previous write has
// been handed to the transport (as a blocking Write would), then starts its
// own; so every op is on its way when Submit returns, whether or not anyone
// waits.
class GrpcStream final : public OpWaiter, public std::enable_shared_from_this<GrpcStream> {
 public:
  // Opens the stream (its start completes on the queue).
  GrpcStream(v1::Collective::Stub* stub, const std::string& session_id, absl::Duration spin)
      : spin_(spin) {
    ctx_.AddMetadata(kSessionMetadataKey, session_id);
    MutexLock lock(&mu_);
    stream_ = stub->PrepareAsyncExecute(&ctx_, &cq_);
    stream_->StartCall(TagOf(kStart));
    ++outstanding_;
  }
  ~GrpcStream() { Close(); }
  GrpcStream(const GrpcStream&) = delete;
  GrpcStream& operator=(const GrpcStream&) = delete;

  // Sends `op` for `state` (which completes with the daemon's result or the
  // stream's failure, or at `deadline` with DEADLINE_EXCEEDED when the
  // stream could not take it by then).
  void Submit(const v1::OpSpec& op, const std::shared_ptr<OpState>& state, absl::Time deadline) {
    MutexLock lock(&mu_);
    const bool ready = DriveUntil(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !failure_.ok() || finishing_ || (started_ && !writing_ && writes_.empty());
        },
        deadline);
    if (!failure_.ok()) {
      state->Complete(failure_, -1, {}, DType::kInvalid);
      return;
    }
    if (finishing_) {  // the stream ended; its status is on the way
      state->Complete(absl::UnavailableError("connection to the daemon lost: stream ended"), -1,
                      {}, DType::kInvalid);
      return;
    }
    if (!ready) {
      state->Complete(absl::DeadlineExceededError(
                          "the gRPC stream to the daemon took no op in time (earlier writes "
                          "did not go out)"),
                      -1, {}, DType::kInvalid);
      return;
    }
    const int64_t tag = next_tag_++;
    pending_[tag] = Pending{state, op.mesh_id()};
    ++meshes_[op.mesh_id()];
    v1::OpRequest& req = writes_.emplace_back();
    req.set_tag(tag);
    *req.mutable_op() = op;
    WriteNextLocked();
  }

  // Polls first (spin_) only for small ops, as the fast path does.
  bool Wait(OpState* state, absl::Time deadline) override {
    MutexLock lock(&mu_);
    return DriveUntil([state] { return state->Ready(); }, deadline,
                      state->small() ? spin_ : absl::ZeroDuration());
  }

  // Waits (driving the stream) until every op sent for `mesh_id` completed:
  // false at the deadline.
  bool Idle(const std::string& mesh_id, absl::Time deadline) {
    MutexLock lock(&mu_);
    return DriveUntil(
        [this, &mesh_id]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return meshes_.count(mesh_id) == 0; },
        deadline);
  }

  // Cancels the stream, waits (driving it, at most kCloseDrain) until every
  // operation in the queue came back, and fails what is pending with
  // `status`. Idempotent.
  void Close(const absl::Status& status = absl::CancelledError("client closed")) {
    MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    ctx_.TryCancel();
    // Cancelled locally, every operation comes back at once.
    DriveUntil([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return outstanding_ == 0; },
               absl::Now() + kCloseDrain);
    FailLocked(status);
    if (outstanding_ == 0) {
      cq_.Shutdown();
      void* tag;
      bool ok;
      while (cq_.Next(&tag, &ok)) {
      }
    }
    // Else the queue still holds operations on ctx_ and stream_: the stream
    // is leaked rather than destroyed under them (only if gRPC never
    // answered a local cancellation).
    if (outstanding_ != 0) {
      if (std::shared_ptr<GrpcStream> self = weak_from_this().lock()) {
        new std::shared_ptr<GrpcStream>(std::move(self));
      }
    }
  }

 private:
  enum Op : intptr_t { kStart = 1, kRead, kWrite, kFinish };
  static void* TagOf(Op op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op)); }
  static constexpr absl::Duration kCloseDrain = absl::Seconds(5);
  struct Pending {
    std::shared_ptr<OpState> state;
    std::string mesh_id;
  };

  // Drives the stream until `done()` or `deadline` (InfinitePast: handles
  // what is queued without blocking); returns done(). For the first `spin`
  // the driver polls the queue (Next) before sleeping in it. mu_ is held on
  // entry and exit, released while sleeping in the queue or waiting for the
  // role.
  template <typename Done>
  bool DriveUntil(Done done, absl::Time deadline, absl::Duration spin = absl::ZeroDuration())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto spin_end = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
    for (;;) {
      if (done()) return true;
      if (outstanding_ == 0) return done();  // nothing can come any more
      if (driving_) {
        if (absl::Now() >= deadline) return done();
        mu_.AwaitWithDeadline(
            [this, &done]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done() || !driving_; },
            deadline);
        continue;
      }
      driving_ = true;
      void* tag = nullptr;
      bool ok = false;
      mu_.Unlock();
      grpc::CompletionQueue::NextStatus r = Next(&tag, &ok, deadline, spin_end);
      mu_.Lock();
      driving_ = false;
      if (r == grpc::CompletionQueue::GOT_EVENT) {
        --outstanding_;
        HandleLocked(static_cast<Op>(reinterpret_cast<intptr_t>(tag)), ok);
        continue;
      }
      return done();  // the deadline, or the queue shut down
    }
  }

  // The queue's next event: polls it (yielding the CPU between looks) until
  // `spin_end` or `deadline`, then sleeps in it until `deadline`
  // (InfinitePast: one look).
  grpc::CompletionQueue::NextStatus Next(void** tag, bool* ok, absl::Time deadline,
                                         std::chrono::steady_clock::time_point spin_end) {
    grpc::CompletionQueue::NextStatus r =
        cq_.AsyncNext(tag, ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
    if (r != grpc::CompletionQueue::TIMEOUT || deadline == absl::InfinitePast()) return r;
    while (r == grpc::CompletionQueue::TIMEOUT && std::chrono::steady_clock::now() < spin_end &&
           absl::Now() < deadline) {
      sched_yield();
      r = cq_.AsyncNext(tag, ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
    }
    if (r != grpc::CompletionQueue::TIMEOUT) return r;
    return cq_.AsyncNext(tag, ok, absl::ToChronoTime(deadline));
  }

  void HandleLocked(Op op, bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (op) {
      case kStart:
        if (!ok) {
          EndLocked();
          return;
        }
        started_ = true;
        ReadLocked();
        return;
      case kRead:
        if (!ok) {  // the stream ended: its status comes with Finish
          EndLocked();
          return;
        }
        CompleteLocked(result_);
        ReadLocked();
        return;
      case kWrite:
        // A failed write: the stream is broken, and the read fails too
        // (its op fails with the stream).
        writing_ = false;
        writes_.pop_front();
        return;
      case kFinish:
        FailLocked(closed_ ? absl::CancelledError("client closed")
                           : absl::UnavailableError(absl::StrCat(
                                 "connection to the daemon lost: ",
                                 finish_status_.ok() ? "stream ended"
                                                     : finish_status_.error_message())));
        return;
    }
  }

  void ReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stream_->Read(&result_, TagOf(kRead));
    ++outstanding_;
  }
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    stream_->Write(writes_.front(), TagOf(kWrite));
    ++outstanding_;
  }
  // The read side ended: ask for the stream's status (once).
  void EndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    stream_->Finish(&finish_status_, TagOf(kFinish));
    ++outstanding_;
  }

  void CompleteLocked(const v1::OpResult& result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = pending_.find(result.tag());
    if (it == pending_.end()) return;
    std::shared_ptr<OpState> state = std::move(it->second.state);
    ErasePendingLocked(it);
    state->Complete(absl::Status(static_cast<absl::StatusCode>(result.code()), result.message()),
                    result.sequence(),
                    std::vector<int64_t>(result.out_shape().begin(), result.out_shape().end()),
                    static_cast<DType>(result.out_dtype()));
  }

  void ErasePendingLocked(std::map<int64_t, Pending>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto m = meshes_.find(it->second.mesh_id);
    if (m != meshes_.end() && --m->second == 0) meshes_.erase(m);
    pending_.erase(it);
  }

  // Fails every pending and later op with `status` (the first failure stays).
  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (failure_.ok()) failure_ = status;
    std::map<int64_t, Pending> orphans;
    orphans.swap(pending_);
    meshes_.clear();
    for (auto& [tag, p] : orphans) p.state->Complete(failure_, -1, {}, DType::kInvalid);
  }

  const absl::Duration spin_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext ctx_;
  Mutex mu_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::OpRequest, v1::OpResult>> stream_
      ABSL_GUARDED_BY(mu_);
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // operations in the queue
  std::deque<v1::OpRequest> writes_ ABSL_GUARDED_BY(mu_);  // front: in flight
  v1::OpResult result_ ABSL_GUARDED_BY(mu_);               // the read in flight
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  int64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> meshes_ ABSL_GUARDED_BY(mu_);  // mesh id -> ops pending
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

bool OpState::Poll() {
  if (Ready()) return true;
  return queue_ != nullptr && queue_->Wait(this, absl::InfinitePast());
}

absl::Status OpState::Wait(std::optional<absl::Duration> timeout) {
  const absl::Duration t = timeout.value_or(default_wait_);
  bool done;
  if (queue_) {
    done = queue_->Wait(this, absl::Now() + t);
  } else {
    MutexLock lock(&mu_);
    done = mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; }, t);
  }
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer from the daemon for this op within ", absl::FormatDuration(t)));
  }
  return status();
}

absl::Status OpFuture::Wait(std::optional<absl::Duration> timeout) const {
  if (!state_) return absl::FailedPreconditionError("empty OpFuture");
  return state_->Wait(timeout);
}
bool OpFuture::Ready() const { return state_ && state_->Poll(); }
absl::Duration OpFuture::default_timeout() const {
  return state_ ? state_->default_wait() : absl::ZeroDuration();
}
int64_t OpFuture::sequence() const { return state_ ? state_->sequence() : -1; }
std::vector<int64_t> OpFuture::out_shape() const {
  return state_ ? state_->out_shape() : std::vector<int64_t>{};
}
DType OpFuture::out_dtype() const { return state_ ? state_->out_dtype() : DType::kInvalid; }
OpTiming OpFuture::timing() const { return state_ ? state_->timing() : OpTiming{}; }
OpTraffic OpFuture::traffic() const { return state_ ? state_->traffic() : OpTraffic{}; }

// Member-side small ops of one Mesh: the mapped segment, and this member's
// ops in flight on the daemon path (a member runs an op member-side only
// with none: then its count of daemon-path ops is the daemon's, and the op
// cannot overtake one of them).
struct Mesh::MemberSide {
  Mutex mu;
  std::unique_ptr<internal::MemberOps> ops ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<OpState>> in_flight ABSL_GUARDED_BY(mu);

  // Drops the ops that completed; whether none is left.
  bool Idle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::erase_if(in_flight, [](const std::shared_ptr<OpState>& op) { return op->Poll(); });
    return in_flight.empty();
  }
  // Keeps `f` (an op sent to the daemon, stream-ordered ones too) until it
  // completed; drops those known to have (a program that never runs a
  // synchronous op does not collect them all).
  void Track(const OpFuture& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::erase_if(in_flight, [](const std::shared_ptr<OpState>& op) { return op->Ready(); });
    if (f.state_ != nullptr) in_flight.push_back(f.state_);
  }
};

// ---------------------------------------------------------------------------
// ClientImpl
// ---------------------------------------------------------------------------

class ClientImpl : public std::enable_shared_from_this<ClientImpl> {
 public:
  explicit ClientImpl(ClientOptions options) : options_(std::move(options)) {}
  ~ClientImpl() { Close(); }

  absl::Status Connect() {
    options_.socket_path = ResolveSocketPath(options_.socket_path);
    channel_ = grpc::CreateChannel("unix:" + options_.socket_path,
                                   grpc::InsecureChannelCredentials());
    if (!channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + options_.connect_timeout))) {
      return absl::UnavailableError(absl::StrCat(
          "no collectived daemon answers on ", options_.socket_path, " within ",
          absl::FormatDuration(options_.connect_timeout),
          " (start one with `collectived --socket=", options_.socket_path, "`)"));
    }
    stub_ = v1::Collective::NewStub(channel_);
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::CreateSessionRequest req;
    req.set_client_name(options_.client_name);
    v1::CreateSessionResponse resp;
    if (auto st = FromGrpc(stub_->CreateSession(&ctx, req, &resp)); !st.ok()) return st;
    session_id_ = resp.session_id();

    if (absl::Status st = Attach(resp.attach_token()); !st.ok()) return st;
    const char* env = getenv("COLLECTIVED_FAST_PATH");
    if (env != nullptr && std::string(env) == "0") options_.fast_path = false;
    if (options_.fast_path) return OpenQueue();
    return absl::OkStatus();
  }

  // Opens the side socket and attaches the session. The daemon refuses
  // connections past its per-uid cap of connections waiting to attach
  // (RESOURCE_EXHAUSTED, or a reset when it closes before reading): a burst
  // of clients starting at once retries until rpc_timeout.
  absl::Status Attach(const std::string& token) {
    const absl::Time deadline = absl::Now() + options_.rpc_timeout;
    absl::Duration backoff = absl::Milliseconds(1);
    for (;;) {
      auto side = ConnectSeqPacket(SideSocketPath(options_.socket_path));
      if (!side.ok()) return side.status();
      {
        MutexLock lock(&side_mu_);
        side_fd_ = *side;
      }
      auto reply = SideRequest(absl::StrCat(side::kAttach, " ", session_id_, " ", token));
      if (reply.ok()) return absl::OkStatus();
      const bool refused =
          absl::IsResourceExhausted(reply.status()) || absl::IsUnavailable(reply.status());
      {
        MutexLock lock(&side_mu_);
        if (side_fd_ >= 0) {
      // shutdown: the daemon sees the hang-up although duplicates of the
      // socket (the fast path's and member-side ops' watchers) stay open.
      shutdown(side_fd_, SHUT_RDWR);
      close(side_fd_);
    }
        side_fd_ = -1;
      }
      if (!refused || absl::Now() + backoff > deadline) return reply.status();
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(50));
    }
  }

  // Maps the session's fast-path queue. A daemon without one (or with
  // another queue version) leaves the client on the gRPC path.
  absl::Status OpenQueue() {
    auto reply = SideRequest(std::string(side::kQueue));
    if (!reply.ok()) return absl::IsUnimplemented(reply.status()) ? absl::OkStatus() : reply.status();
    if (!reply->fd.valid()) return absl::InternalError("daemon sent no descriptor for the queue");
    std::vector<std::string> words = absl::StrSplit(reply->data, ' ');
    if (words.size() != 3 || words[1] != absl::StrCat(fastq::kQueueBytes) ||
        words[2] != absl::StrCat(fastq::kVersion)) {
      return absl::OkStatus();
    }
    void* base = mmap(nullptr, fastq::kQueueBytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
    const int err = errno;
    if (base == MAP_FAILED) return ErrnoStatus(err, "mapping the fast-path queue");
    if (!fastq::HeaderValid(static_cast<fastq::Header*>(base))) {
      munmap(base, fastq::kQueueBytes);
      return absl::OkStatus();
    }
    int live_fd;
    {
      MutexLock lock(&side_mu_);
      live_fd = side_fd_ >= 0 ? fcntl(side_fd_, F_DUPFD_CLOEXEC, 0) : -1;
    }
    if (live_fd < 0) {
      munmap(base, fastq::kQueueBytes);
      return ErrnoStatus(errno, "duplicating the side socket");
    }
    auto fast = FastQueue::Create(base, live_fd, options_.fast_path_spin);
    if (!fast.ok()) return fast.status();
    fast_ = *std::move(fast);
    return absl::OkStatus();
  }

  bool fast_path() const { return fast_ != nullptr; }

  // Ends the session. Waits for the daemon at most options_.close_timeout,
  // and not at all after a teardown call went unanswered (TeardownContext).
  // Giving up is safe: the daemon closes the session, breaking its meshes
  // and freeing its buffers, when the side socket closes below. Everything
  // else returns promptly: the Execute stream is cancelled locally (its
  // operations come back whatever the daemon does; GrpcStream::Close waits
  // for them at most kCloseDrain), the fast-path monitor stops when told;
  // no lock taken here is held across a wait for the daemon. Callers must
  // not use the client concurrently (see ~Client).
  void Close() {
    if (closed_.exchange(true)) return;
    if (stub_ && !session_id_.empty()) {
      v1::CloseSessionRequest req;
      req.set_session_id(session_id_);
      v1::CloseSessionResponse resp;
      if (auto ctx = TeardownContext()) {
        // Best effort: the side socket closes below anyway.
        NoteTeardownAnswer(stub_->CloseSession(ctx.get(), req, &resp)).IgnoreError();
      }
    }
    if (std::shared_ptr<GrpcStream> stream = Stream(/*open=*/false)) stream->Close();
    if (fast_) fast_->Shutdown(absl::CancelledError("client closed"));
    MutexLock lock(&side_mu_);
    if (side_fd_ >= 0) {
      // shutdown: the daemon sees the hang-up although duplicates of the
      // socket (the fast path's and member-side ops' watchers) stay open.
      shutdown(side_fd_, SHUT_RDWR);
      close(side_fd_);
    }
    side_fd_ = -1;
  }

  // The context of a teardown RPC (LeaveMesh, CloseSession): its deadline is
  // options_.close_timeout. Null when an earlier teardown RPC went
  // unanswered and the daemon has answered nothing since: then the RPC is
  // not sent, so that tearing down a client and all its meshes waits for a
  // hung daemon once, not once per step.
  std::unique_ptr<grpc::ClientContext> TeardownContext() {
    if (teardown_unanswered_.load()) return nullptr;
    auto ctx = std::make_unique<grpc::ClientContext>();
    SetDeadline(*ctx, options_.close_timeout);
    return ctx;
  }
  // Records the outcome of a teardown RPC; returns it as a Status.
  absl::Status NoteTeardownAnswer(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) teardown_unanswered_.store(true);
    return FromGrpc(s);
  }
  // The status of an RPC that is not part of teardown: an answer shows the
  // daemon responsive again, so teardown RPCs are sent again.
  absl::Status Answered(const grpc::Status& s) {
    if (s.ok()) teardown_unanswered_.store(false);
    return FromGrpc(s);
  }

  // One request/reply on the side socket. After a failed exchange the socket
  // is closed: a late reply must never be taken for the next request's.
  absl::StatusOr<Packet> SideRequest(const std::string& request) {
    MutexLock lock(&side_mu_);
    if (side_fd_ < 0) return absl::UnavailableError("the side socket to the daemon is closed");
    absl::Status sent = SendPacket(side_fd_, request);
    absl::StatusOr<Packet> reply =
        sent.ok() ? ReceivePacket(side_fd_, options_.rpc_timeout) : absl::StatusOr<Packet>(sent);
    if (!reply.ok()) {
      shutdown(side_fd_, SHUT_RDWR);  // see Close
      close(side_fd_);
      side_fd_ = -1;
      return reply.status();
    }
    if (absl::Status st = side::ReplyStatus(reply->data); !st.ok()) return st;
    return reply;
  }

  // `mesh_id` set: the mesh's shared buffer (Mesh::AllocateShared).
  absl::StatusOr<Buffer> Allocate(size_t bytes, std::string_view device,
                                  const std::string& mesh_id = "") {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::AllocateBufferRequest req;
    req.set_session_id(session_id_);
    req.set_size_bytes(static_cast<int64_t>(bytes));
    req.set_device(std::string(device));
    req.set_mesh_id(mesh_id);
    v1::AllocateBufferResponse resp;
    if (auto st = Answered(stub_->AllocateBuffer(&ctx, req, &resp)); !st.ok()) return st;
    const v1::BufferInfo& info = resp.buffer();
    const std::string& id = info.buffer_id();
    // Daemons from before devices send no device: their buffers are host memory.
    const std::string placed = info.device().empty() ? "cpu" : info.device();
#ifdef COLLECTIVED_HAVE_CUDA
    if (info.kind() == "cuda") return ImportGpuBuffer(info, placed);
#endif
    if (!info.kind().empty() && info.kind() != "memfd") {
      // Only host memory maps with mmap; importing GPU memory needs CUDA.
      // Free it in the daemon now rather than hold it unused until the
      // session ends; no descriptor was fetched, so nothing is open here.
      absl::Status freed = FreeUnmapped(id, placed);
      std::string message =
          info.kind() == "cuda"
              ? absl::StrCat("mapping CUDA buffers needs the SDK built with CUDA (device ", placed,
                             ")")
              : absl::StrCat("this SDK cannot map buffers of kind '", info.kind(), "' (device ",
                             placed, ")");
      if (!freed.ok()) {
        absl::StrAppend(&message, "; freeing the buffer in the daemon failed (", freed.ToString(),
                        "): the daemon frees it when this session closes");
      }
      return absl::UnimplementedError(message);
    }
    auto mapped = MapBuffer(id, static_cast<size_t>(info.size_bytes()));
    if (!mapped.ok()) {
      // Not usable here: release it in the daemon too (best effort).
      FreeUnmapped(id, placed).IgnoreError();
      return mapped.status();
    }
    Buffer buffer(id, *mapped, static_cast<size_t>(info.size_bytes()), placed);
    buffer.owner_ = this;
    return buffer;
  }

#ifdef COLLECTIVED_HAVE_CUDA
  // Fetches a GPU buffer's descriptor and imports it (cuda_import.h); on any
  // failure the buffer is freed in the daemon again.
  absl::StatusOr<Buffer> ImportGpuBuffer(const v1::BufferInfo& info, const std::string& placed) {
    const std::string& id = info.buffer_id();
    absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> imported =
        absl::InternalError("daemon sent no descriptor for the buffer");
    auto reply = SideRequest(absl::StrCat(side::kFd, " ", id));
    if (!reply.ok()) {
      imported = reply.status();
    } else if (reply->fd.valid()) {
      imported = ImportCudaBuffer(reply->fd.release(), static_cast<size_t>(info.size_bytes()),
                                  placed);
    }
    if (!imported.ok()) {
      FreeUnmapped(id, placed).IgnoreError();
      return imported.status();
    }
    Buffer buffer(id, (*imported)->device_ptr(), static_cast<size_t>(info.size_bytes()), placed);
    buffer.device_ordinal_ = (*imported)->device_ordinal();
    buffer.gpu_mapping_ = std::shared_ptr<ImportedCudaBuffer>(std::move(*imported));
    return buffer;
  }
#endif

  // Frees buffer `id` in the daemon when this process did not map it.
  absl::Status FreeUnmapped(const std::string& id, const std::string& device) {
    Buffer unmapped(id, nullptr, 0, device);
    return Free(unmapped);
  }

  // Fetches buffer `id`'s descriptor on the side socket and maps it.
  absl::StatusOr<void*> MapBuffer(const std::string& id, size_t size) {
    auto reply = SideRequest(absl::StrCat(side::kFd, " ", id));
    if (!reply.ok()) return reply.status();
    if (!reply->fd.valid()) return absl::InternalError("daemon sent no descriptor for the buffer");
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
    int err = errno;
    if (data == MAP_FAILED) return ErrnoStatus(err, "mapping the shared buffer");
    return data;
  }

  absl::Status Free(Buffer& buffer) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options_.rpc_timeout);
    v1::FreeBufferRequest req;
    req.set_session_id(session_id_);
    req.set_buffer_id(buffer.id());
    v1::FreeBufferResponse resp;
    absl::Status st = Answered(stub_->FreeBuffer(&ctx, req, &resp));
    if (st.ok()) buffer.Reset();
    return st;
  }

  absl::StatusOr<std::unique_ptr<Mesh>> JoinMesh(const MeshOptions& options) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, options.join_timeout + kGrace);
    v1::JoinMeshRequest req;
    req.set_session_id(session_id_);
    req.set_mesh_name(options.name);
    for (const auto& [name, size] : options.axes) {
      auto* a = req.add_axes();
      a->set_name(name);
      a->set_size(size);
    }
    for (int c : options.coordinate) req.add_coordinate(c);
    req.set_timeout_ms(absl::ToInt64Milliseconds(options.join_timeout));
    req.set_op_timeout_ms(absl::ToInt64Milliseconds(options.op_timeout));
    req.set_scope(options.scope);
    req.set_join_token(options.join_token);
    v1::JoinMeshResponse resp;
    if (auto st = Answered(stub_->JoinMesh(&ctx, req, &resp)); !st.ok()) return st;
    std::unique_ptr<Mesh> mesh(new Mesh());
    mesh->client_ = shared_from_this();
    mesh->id_ = resp.mesh().mesh_id();
    mesh->name_ = resp.mesh().name();
    mesh->generation_ = resp.mesh().generation();
    mesh->index_ = resp.self().index();
    mesh->members_ = 1;
    for (const auto& a : resp.mesh().axes()) {
      mesh->axes_.emplace_back(a.name(), a.size());
      mesh->members_ *= a.size();
    }
    mesh->coordinate_.assign(resp.self().coordinate().begin(), resp.self().coordinate().end());
    mesh->op_deadline_ = absl::Milliseconds(resp.mesh().op_timeout_ms()) + kGrace;
    if (resp.mesh().member_op_bytes() == 0) {
      mesh->member_side_status_ = absl::UnavailableError(
          "the daemon offers no member-side segment for this mesh (a mesh across hosts, a "
          "daemon run with --member_op_bytes=0, or one whose segments were at "
          "--member_segment_total_bytes): every op goes through the daemon");
    } else {
      auto member_ops = MapMemberSegment(resp.mesh(), mesh->index_);
      if (!member_ops.ok()) {
        // This member takes the daemon path for every op; the others see
        // its daemon-path ops counted in the segment and follow it there.
        mesh->member_side_status_ = member_ops.status();
        // Code that differs is a deployment to fix (an SDK and a daemon
        // of different versions): said once per process, not only here.
        static std::atomic<bool> said{false};
        if (absl::IsFailedPrecondition(member_ops.status()) && !said.exchange(true)) {
          std::fprintf(stderr, "collectived: mesh '%s': %s\n", mesh->name_.c_str(),
                       std::string(member_ops.status().message()).c_str());
        }
        return mesh;
      }
      mesh->member_side_ = std::make_unique<Mesh::MemberSide>();
      mesh->member_side_->ops = *std::move(member_ops);
    }
    return mesh;
  }

  // The member-side segment of `mesh` (common/member_ops.h), mapped.
  absl::StatusOr<std::unique_ptr<internal::MemberOps>> MapMemberSegment(const v1::MeshInfo& mesh,
                                                                        int index) {
    auto reply = SideRequest(absl::StrCat(side::kSegment, " ", mesh.mesh_id()));
    if (!reply.ok()) return reply.status();
    uint64_t bytes = 0;
    std::vector<std::string> words = absl::StrSplit(reply->data, ' ');
    if (!reply->fd.valid() || words.size() != 2 || !absl::SimpleAtoi(words[1], &bytes)) {
      return absl::InternalError(absl::StrCat("malformed SEGMENT reply '", reply->data, "'"));
    }
    MeshShape shape;
    for (const auto& a : mesh.axes()) {
      shape.names.push_back(a.name());
      shape.sizes.push_back(a.size());
    }
    std::weak_ptr<ClientImpl> self = weak_from_this();
    const std::string mesh_id = mesh.mesh_id();
    int live_fd = -1;  // a duplicate of the side socket, to watch the daemon
    {
      MutexLock lock(&side_mu_);
      if (side_fd_ < 0) return absl::UnavailableError("the side socket to the daemon is closed");
      live_fd = fcntl(side_fd_, F_DUPFD_CLOEXEC, 0);
      if (live_fd < 0) return ErrnoStatus(errno, "duplicating the side socket");
    }
    return internal::MemberOps::Map(
        reply->fd.release(), bytes, std::move(shape), index,
        absl::Milliseconds(mesh.op_timeout_ms()), live_fd,
        [self, mesh_id](uint32_t d, uint32_t s) -> absl::StatusOr<bool> {
          std::shared_ptr<ClientImpl> client = self.lock();
          if (client == nullptr) return absl::CancelledError("client closed");
          auto answer = client->SideRequest(absl::StrCat(side::kExpired, " ", mesh_id, " ", d, " ", s));
          if (!answer.ok()) return answer.status();
          return answer->data == absl::StrCat(side::kOk, " 1");
        });
  }

  // Waits at most options_.close_timeout (see TeardownContext). A leave
  // given up on is safe: the mesh breaks when the session ends.
  absl::Status LeaveMesh(const std::string& mesh_id) {
    // Closing the session left every mesh already.
    if (closed_.load()) return absl::OkStatus();
    v1::LeaveMeshRequest req;
    req.set_session_id(session_id_);
    req.set_mesh_id(mesh_id);
    v1::LeaveMeshResponse resp;
    auto ctx = TeardownContext();
    if (!ctx) {
      return absl::DeadlineExceededError(absl::StrCat(
          "leave of mesh '", mesh_id, "' not sent: the daemon left an earlier leave or close "
          "unanswered for ", absl::FormatDuration(options_.close_timeout),
          " (the mesh breaks for its other members when this client's session ends)"));
    }
    return NoteTeardownAnswer(stub_->LeaveMesh(ctx.get(), req, &resp));
  }

  // Submits `op` on the fast path, else on the Execute stream (opened on
  // first use). The daemon orders a session's ops by arrival, so a switch
  // between the two paths first waits until the other path's ops arrived:
  // fast-path entries taken by the daemon, stream ops completed.
  OpFuture Submit(const v1::OpSpec& op, absl::Duration wait) {
    const absl::Time deadline = absl::Now() + wait;
    if (fast_ && !closed_.load()) {
      if (FastQueue::Fits(op)) {
        auto state = std::make_shared<OpState>(
            wait, fast_, fastq::PollsFor(DTypeSize(static_cast<DType>(op.dtype())), op.shape()));
        if (!StreamIdle(op.mesh_id(), deadline)) {
          state->Complete(absl::DeadlineExceededError(
                              "earlier ops sent over gRPC did not complete in time"),
                          -1, {}, DType::kInvalid);
        } else {
          fast_->Submit(op, state, deadline);
        }
        return OpFuture(state);
      }
      if (!fast_->WaitTaken(deadline)) {
        auto state = std::make_shared<OpState>(wait);
        state->Complete(absl::UnavailableError(
                            "earlier fast-path ops were not taken by the daemon in time"),
                        -1, {}, DType::kInvalid);
        return OpFuture(state);
      }
    }
    return SubmitStream(op, wait);
  }

  // Whether every op sent on the stream for `mesh_id` has completed (waits
  // until then). Only the order within a mesh matters.
  bool StreamIdle(const std::string& mesh_id, absl::Time deadline) {
    std::shared_ptr<GrpcStream> stream = Stream(/*open=*/false);
    return stream == nullptr || stream->Idle(mesh_id, deadline);
  }

  OpFuture SubmitStream(const v1::OpSpec& op, absl::Duration wait) {
    std::shared_ptr<GrpcStream> stream = closed_.load() ? nullptr : Stream(/*open=*/true);
    auto state = std::make_shared<OpState>(
        wait, stream, fastq::PollsFor(DTypeSize(static_cast<DType>(op.dtype())), op.shape()));
    if (stream == nullptr) {
      state->Complete(absl::FailedPreconditionError("client is closed"), -1, {}, DType::kInvalid);
    } else {
      stream->Submit(op, state, absl::Now() + wait);
    }
    return OpFuture(state);
  }

  const std::string& session_id() const { return session_id_; }
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  // The Execute stream; opened on first use when `open` (null once the
  // client is closed, or not opened yet).
  std::shared_ptr<GrpcStream> Stream(bool open) {
    MutexLock lock(&stream_mu_);
    if (stream_ == nullptr && open && !closed_.load()) {
      stream_ = std::make_shared<GrpcStream>(stub_.get(), session_id_, options_.grpc_spin);
    }
    return stream_;
  }

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Collective::Stub> stub_;
  std::string session_id_;
  std::atomic<bool> closed_{false};
  // A teardown RPC went unanswered (see TeardownContext).
  std::atomic<bool> teardown_unanswered_{false};

  Mutex side_mu_;
  int side_fd_ ABSL_GUARDED_BY(side_mu_) = -1;
  std::shared_ptr<FastQueue> fast_;  // set by Connect, then constant

  Mutex stream_mu_;
  std::shared_ptr<GrpcStream> stream_ ABSL_GUARDED_BY(stream_mu_);
};

// ---------------------------------------------------------------------------
// Buffer, Array
// ---------------------------------------------------------------------------

Buffer::~Buffer() { Reset(); }

Buffer::Buffer(Buffer&& other) noexcept
    : id_(std::move(other.id_)), data_(other.data_), size_(other.size_),
      device_(std::move(other.device_)), device_ordinal_(other.device_ordinal_),
      shared_mesh_(std::move(other.shared_mesh_)), owner_(other.owner_),
      gpu_mapping_(std::move(other.gpu_mapping_)) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.device_ordinal_ = -1;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    id_ = std::move(other.id_);
    data_ = other.data_;
    size_ = other.size_;
    device_ = std::move(other.device_);
    device_ordinal_ = other.device_ordinal_;
    shared_mesh_ = std::move(other.shared_mesh_);
    owner_ = other.owner_;
    gpu_mapping_ = std::move(other.gpu_mapping_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.device_ordinal_ = -1;
  }
  return *this;
}

void Buffer::Reset() {
  if (gpu_mapping_ != nullptr) {
    gpu_mapping_.reset();  // unmaps the GPU memory
  } else if (data_ != nullptr) {
    munmap(data_, size_);
  }
  data_ = nullptr;
  size_ = 0;
  device_ordinal_ = -1;
}

int64_t Array::num_elements() const {
  int64_t n = 1;  // the product of the non-zero dimensions
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(n, d, &n)) {
      return -1;
    }
  }
  return empty ? 0 : n;
}

size_t Array::num_bytes() const {
  const int64_t n = num_elements();
  size_t bytes;
  if (n < 0 || __builtin_mul_overflow(static_cast<uint64_t>(n), DTypeSize(dtype), &bytes)) {
    return std::numeric_limits<size_t>::max();
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// Mesh
// ---------------------------------------------------------------------------

struct Mesh::OpRequest {
  v1::OpSpec spec;
  // Not OK: the SDK refuses the op without sending it.
  absl::Status error;
};


OpFuture Mesh::submit(const Collective& op) {
  const Array& x = op.x;
  switch (op.kind) {
    case CollectiveKind::kPsum: return psum_async(x, op.axes, op.out);
    case CollectiveKind::kPmean: return pmean_async(x, op.axes, op.out);
    case CollectiveKind::kPmax: return pmax_async(x, op.axes, op.out);
    case CollectiveKind::kPmin: return pmin_async(x, op.axes, op.out);
    case CollectiveKind::kPpermute: return ppermute_async(x, op.axes, op.perm, op.out);
    case CollectiveKind::kAllToAll:
      return all_to_all_async(x, op.axes, {op.axis, op.concat_axis, op.tiled}, op.out);
    case CollectiveKind::kBroadcast: return broadcast_async(x, op.axes, op.axis, op.out);
    case CollectiveKind::kBarrier: return barrier_async(op.axes);
    case CollectiveKind::kAllGather:
    case CollectiveKind::kPsumScatter: {
      const bool gather = op.kind == CollectiveKind::kAllGather;
      if (!op.out) {
        return FailedOp(absl::InvalidArgumentError(
            absl::StrCat(gather ? "all_gather" : "psum_scatter", " needs an output array")));
      }
      return gather ? all_gather_async(x, op.axes, *op.out, {op.axis, op.tiled})
                    : psum_scatter_async(x, op.axes, *op.out, {op.axis, op.tiled});
    }
  }
  return FailedOp(absl::InvalidArgumentError(
      absl::StrCat("unknown collective kind ", static_cast<int>(op.kind))));
}

absl::StatusOr<Buffer> Mesh::AllocateShared(size_t bytes) {
  if (left_.load()) return absl::FailedPreconditionError("left the mesh");
  absl::StatusOr<Buffer> b = client_->Allocate(bytes, "", id_);
  if (b.ok()) b->shared_mesh_ = id_;
  return b;
}

absl::Status Mesh::Leave() {
  if (left_.exchange(true)) return absl::OkStatus();
  return client_->LeaveMesh(id_);
}

int Mesh::axis_index(const AxisNames& axes) const {
  if (axes.unset()) return -1;
  if (axes.all()) return index_;  // row-major over every axis in mesh order
  int index = 0;
  for (const std::string& name : axes.names()) {
    size_t i = 0;
    while (i < axes_.size() && axes_[i].first != name) ++i;
    if (i == axes_.size()) return -1;
    index = index * axes_[i].second + coordinate_[i];
  }
  return index;
}

int Mesh::axis_size(const AxisNames& axes) const {
  if (axes.unset()) return -1;
  if (axes.all()) return size();
  int size = 1;
  for (const std::string& name : axes.names()) {
    size_t i = 0;
    while (i < axes_.size() && axes_[i].first != name) ++i;
    if (i == axes_.size()) return -1;
    size *= axes_[i].second;
  }
  return size;
}

// The words of stream-ordered submission: a host buffer of kSlots ready
// words then kSlots done words; op v (1, 2, ...) uses slot v % kSlots. Kept
// (mapped and registered) while the Mesh or a failure hook of one of its ops
// holds it; the daemon frees the buffer itself when the session ends.
struct Mesh::StreamOrder {
  static constexpr uint64_t kSlots = 256;
  static constexpr size_t kBytes = 2 * kSlots * sizeof(uint64_t);  // 4 KiB
  Buffer words;
#ifdef COLLECTIVED_HAVE_CUDA
  std::unique_ptr<RegisteredHostWords> registered;  // destroyed before `words`
#endif
  // Serializes stream-ordered submissions (values must reach the daemon in
  // the order they are written on the streams).
  Mutex mu;
  void* stream ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t next ABSL_GUARDED_BY(mu) = 0;  // the last value used
  // Every stream that may wait on the words (~Mesh synchronizes them).
  std::vector<void*> used_streams ABSL_GUARDED_BY(mu);

  uint64_t* DoneWord(uint64_t slot) const {
    return &static_cast<uint64_t*>(words.data())[kSlots + slot];
  }
  // Raises the done word of op `value` (what the daemon does; the SDK does it
  // when the daemon cannot).
  void Release(uint64_t value) const {
    RaiseWord(DoneWord(value % kSlots), value);
  }
  // Waits until the streams have passed their waits on the words.
  void SyncStreams() {
#ifdef COLLECTIVED_HAVE_CUDA
    std::vector<void*> streams;
    {
      MutexLock lock(&mu);
      streams = used_streams;
    }
    if (auto api = cuda::Driver(); api.ok()) {
      for (void* st : streams) (*api)->cuStreamSynchronize(static_cast<CUstream>(st));
    }
#endif
  }
};

Mesh::~Mesh() {
  Leave().IgnoreError();  // fails this member's pending ops: their done words rise
  if (stream_order_ != nullptr) stream_order_->SyncStreams();
}

absl::Status Mesh::set_stream(void* stream) {
#ifdef COLLECTIVED_HAVE_CUDA
  if (stream == nullptr) {
    if (stream_order_ != nullptr) {
      MutexLock lock(&stream_order_->mu);
      stream_order_->stream = nullptr;
    }
    return absl::OkStatus();
  }
  if (stream_order_ == nullptr) {
    auto words = client_->Allocate(StreamOrder::kBytes, "");
    if (!words.ok()) return words.status();
    auto order = std::make_shared<StreamOrder>();
    order->words = *std::move(words);
    auto registered = RegisteredHostWords::Register(order->words.data(), StreamOrder::kBytes);
    if (!registered.ok()) {
      client_->Free(order->words).IgnoreError();  // best effort; the session end frees it too
      return registered.status();
    }
    order->registered = *std::move(registered);
    stream_order_ = std::move(order);
  }
  StreamOrder& so = *stream_order_;
  MutexLock lock(&so.mu);
  so.stream = stream;
  if (std::find(so.used_streams.begin(), so.used_streams.end(), stream) == so.used_streams.end()) {
    so.used_streams.push_back(stream);
  }
  return absl::OkStatus();
#else
  if (stream == nullptr) return absl::OkStatus();
  return absl::UnimplementedError("stream-ordered submission needs the SDK built with CUDA");
#endif
}

void* Mesh::stream() const {
  if (stream_order_ == nullptr) return nullptr;
  MutexLock lock(&stream_order_->mu);
  return stream_order_->stream;
}

OpFuture Mesh::FailedOp(absl::Status status) const {
  auto state = std::make_shared<OpState>(op_deadline_);
  state->Complete(std::move(status), -1, {}, DType::kInvalid);
  return OpFuture(state);
}

namespace {

// The member-side state whose op this thread waits in while the op's
// interrupted() check runs (Mesh::start): code that check runs (a signal
// handler) must not start an op of that mesh, which would wait for the lock
// this thread holds.
thread_local const void* t_waiting_in = nullptr;

absl::Status ReenteredFromInterruptCheck() {
  return absl::FailedPreconditionError(
      "an op of this mesh was started from its own interrupted() check (a signal handler?) "
      "while this thread waits in a member-side op of the mesh; it would wait for itself");
}

}  // namespace

OpFuture Mesh::Submit(const OpRequest& request) {
  if (!request.error.ok()) return FailedOp(request.error);
  if (member_side_ == nullptr) return Dispatch(request);
  if (t_waiting_in == member_side_.get()) return FailedOp(ReenteredFromInterruptCheck());
  MutexLock lock(&member_side_->mu);
  OpFuture f = Dispatch(request);
  member_side_->Track(f);
  return f;
}

OpFuture Mesh::Dispatch(const OpRequest& request) {
  if (stream() != nullptr) return SubmitOnStream(request);
  return client_->Submit(request.spec, op_deadline_);
}

OpFuture Mesh::SubmitOnStream(const OpRequest& request) {
#ifdef COLLECTIVED_HAVE_CUDA
  StreamOrder& so = *stream_order_;
  MutexLock lock(&so.mu);
  if (so.stream == nullptr) return client_->Submit(request.spec, op_deadline_);
  const uint64_t v = ++so.next;
  const uint64_t slot = v % StreamOrder::kSlots;
  // The slot's previous op must be over (its done word raised) before the
  // slot is reused.
  if (v > StreamOrder::kSlots) {
    const uint64_t previous = v - StreamOrder::kSlots;
    const absl::Time deadline = absl::Now() + op_deadline_ + absl::Seconds(5);
    while (std::atomic_ref<uint64_t>(*so.DoneWord(slot)).load(std::memory_order_acquire) <
           previous) {
      if (absl::Now() > deadline) {
        return FailedOp(absl::DeadlineExceededError(absl::StrCat(
            "stream-ordered op ", previous, " of this mesh is still outstanding; at most ",
            StreamOrder::kSlots, " may be")));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  const size_t ready_offset = slot * sizeof(uint64_t);
  const size_t done_offset = (StreamOrder::kSlots + slot) * sizeof(uint64_t);
  if (absl::Status st = so.registered->WriteOnStream(so.stream, ready_offset, v); !st.ok()) {
    so.Release(v);  // nothing waits on it, but keep the slot's words in step
    return FailedOp(st);
  }
  v1::OpSpec spec = request.spec;
  v1::StreamSync* sync = spec.mutable_stream_sync();
  sync->mutable_ready()->set_buffer_id(so.words.id());
  sync->mutable_ready()->set_offset(static_cast<int64_t>(ready_offset));
  sync->mutable_ready()->set_size_bytes(8);
  sync->mutable_done()->set_buffer_id(so.words.id());
  sync->mutable_done()->set_offset(static_cast<int64_t>(done_offset));
  sync->mutable_done()->set_size_bytes(8);
  sync->set_value(v);
  OpFuture f = client_->Submit(spec, op_deadline_);
  // The daemon raises the done word whatever the outcome; when it cannot (it
  // is gone, or the SDK failed the op before the daemon saw it), this does.
  f.state_->OnFailure([order = stream_order_, v] { order->Release(v); });
  if (absl::Status st = so.registered->WaitOnStream(so.stream, done_offset, v); !st.ok()) {
    // The stream cannot wait: wait here, so work enqueued after the call
    // still runs after the op.
    f.Wait().IgnoreError();
  }
  return f;
#else
  (void)request;
  return FailedOp(absl::UnimplementedError("stream-ordered submission needs the SDK built with CUDA"));
#endif
}

namespace {

v1::OpSpec MakeSpec(const std::string& mesh_id, v1::OpKind kind, const Array* x,
                    const AxisNames& axes, const std::optional<Array>& out) {
  v1::OpSpec spec;
  spec.set_mesh_id(mesh_id);
  spec.set_kind(kind);
  // All(): an empty list, which means every axis; the empty tuple: no_axes.
  for (const std::string& a : axes.names()) spec.add_axes(a);
  if (!axes.all() && axes.names().empty()) spec.set_no_axes(true);
  if (x != nullptr) {
    spec.set_dtype(static_cast<v1::DType>(x->dtype));
    for (int64_t d : x->shape) spec.add_shape(d);
    *spec.mutable_input() = ToRef(*x);
  }
  if (out) {
    *spec.mutable_output() = ToRef(*out);
    // The daemon refuses a result longer than the region declared here
    // (CheckOut has refused sizes that overflow).
    const size_t bytes = out->num_bytes();
    if (bytes <= static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
      spec.mutable_output()->set_size_bytes(static_cast<int64_t>(bytes));
    }
  }
  return spec;
}

// Why the SDK refuses `out` without asking the daemon: a shape that has no
// byte size (negative, or overflowing).
absl::Status CheckOut(const Array* out) {
  if (out == nullptr || out->num_bytes() <= static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return absl::OkStatus();
  }
  std::string shape;
  for (int64_t d : out->shape) absl::StrAppend(&shape, shape.empty() ? "" : ",", d);
  return absl::InvalidArgumentError(absl::StrCat(
      "out array of shape [", shape,
      "] has a negative dimension or a byte size that overflows int64"));
}

// Why the SDK refuses an op's axes without asking the daemon: a
// default-constructed AxisNames, whose meaning changed twice (CHANGELOG.md).
absl::Status CheckAxes(const AxisNames& axes) {
  if (!axes.unset()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "the op's axes name nothing (an empty AxisNames, as a bare {} gives): write "
      "AxisNames::All() for every axis of the mesh (what {} once meant) or "
      "AxisNames::None() for the empty tuple (JAX's axis_name=(): each member gets its "
      "own input back)");
}

// What the SDK checks before any op is sent: its axes, then its output.
absl::Status CheckArgs(const AxisNames& axes, const Array* out) {
  if (absl::Status st = CheckAxes(axes); !st.ok()) return st;
  return CheckOut(out);
}
absl::Status CheckArgs(const AxisNames& axes, const Array& out) { return CheckArgs(axes, &out); }
absl::Status CheckArgs(const AxisNames& axes, const std::optional<Array>& out) {
  return CheckArgs(axes, out ? &*out : nullptr);
}

}  // namespace

// A synchronous op's arguments. The OpSpec is built only when the op goes
// to the daemon or needs planning: a loop of small ops run member-side
// builds none.
struct Mesh::OpCall {
  v1::OpKind kind;
  const Array* x;  // null for a barrier
  const AxisNames& axes;
  const Array* out;  // null: in place
  std::optional<AllGatherOptions> gather = std::nullopt;

  v1::OpSpec Spec(const std::string& mesh_id) const {
    v1::OpSpec spec =
        MakeSpec(mesh_id, kind, x, axes, out ? std::optional<Array>(*out) : std::nullopt);
    if (gather) {
      spec.mutable_all_gather()->set_axis(gather->axis);
      spec.mutable_all_gather()->set_tiled(gather->tiled);
    }
    return spec;
  }
  // What the op's plan depends on, as the spec would say it.
  internal::MemberOpKey Key() const {
    internal::MemberOpKey key;
    key.kind = kind;
    if (x != nullptr) {
      key.dtype = static_cast<int>(static_cast<v1::DType>(x->dtype));
      key.shape = x->shape;
    }
    key.axes = axes.names();
    key.no_axes = !axes.all() && axes.names().empty();
    if (gather) {
      key.gather_axis = gather->axis;
      key.gather_tiled = gather->tiled;
    }
    return key;
  }
};

absl::Status Mesh::Run(const OpCall& call) {
  absl::Status status;
  OpFuture future;
  if (RunOrDispatch(call, nullptr, &status, &future)) return status;
  return future.Wait();
}

bool Mesh::RunOrDispatch(const OpCall& call, const std::function<bool()>* interrupted,
                         absl::Status* status, OpFuture* future) {
  const Array* x = call.x;
  const Array* out = call.out;
  if (absl::Status st = CheckArgs(call.axes, out); !st.ok()) {
    *status = std::move(st);
    return true;
  }
  if (member_side_ == nullptr) {
    *future = Dispatch(OpRequest{call.Spec(id_)});
    return false;
  }
  if (t_waiting_in == member_side_.get()) {
    *status = ReenteredFromInterruptCheck();
    return true;
  }
  internal::MemberIoRegion io;
  // Host memory of this client's session mapped in this process.
  auto MappedHost = [this](const Buffer* b) {
    return b != nullptr && b->valid() && b->owner_ == client_.get() && b->device_ordinal() < 0;
  };
  // The input: only this member's own buffer.
  if (x != nullptr && MappedHost(x->buffer) && !x->buffer->mesh_shared() &&
      x->offset <= x->buffer->size()) {
    io.in = static_cast<const uint8_t*>(x->buffer->data()) + x->offset;
    io.in_offset = x->offset;
    io.in_avail = x->buffer->size() - x->offset;
    io.in_place = out == nullptr;
    // The output: this member's own, or a buffer this mesh shares, which
    // the op writes once (MemberOps::RunIntoShared).
    const bool shared_out = out && MappedHost(out->buffer) && out->buffer->shared_mesh_ == id_;
    const bool own_out = out && MappedHost(out->buffer) && !out->buffer->mesh_shared();
    if ((own_out || shared_out) && out->offset <= out->buffer->size()) {
      io.out = static_cast<uint8_t*>(out->buffer->data()) + out->offset;
      io.out_offset = out->offset;
      io.out_avail = std::min(out->buffer->size() - out->offset, out->num_bytes());
      io.same_buffer = out->buffer == x->buffer;
      if (shared_out) io.shared_out = &out->buffer->id();
    }
  }
  // Held until the op is member-side or submitted to the daemon: another
  // thread's op must not take this place in between.
  MemberSide& side = *member_side_;
  MutexLock lock(&side.mu);
  if (stream() == nullptr && side.Idle()) {
    const void* const outer = t_waiting_in;
    if (interrupted != nullptr) t_waiting_in = &side;
    absl::Cleanup restore = [outer] { t_waiting_in = outer; };
    std::optional<absl::Status> st =
        side.ops->TryRun(call.Key(), [&] { return call.Spec(id_); }, io, interrupted);
    if (st) {
      *status = *std::move(st);
      return true;
    }
  }
  *future = Dispatch(OpRequest{call.Spec(id_)});
  side.Track(*future);
  return false;
}

std::optional<Mesh::OpCall> Mesh::SyncCall(const Collective& op) {
  const Array* x = &op.x;
  const Array* out = op.out ? &*op.out : nullptr;
  switch (op.kind) {
    case CollectiveKind::kPsum: return OpCall{v1::PSUM, x, op.axes, out};
    case CollectiveKind::kPmean: return OpCall{v1::PMEAN, x, op.axes, out};
    case CollectiveKind::kPmax: return OpCall{v1::PMAX, x, op.axes, out};
    case CollectiveKind::kPmin: return OpCall{v1::PMIN, x, op.axes, out};
    case CollectiveKind::kBarrier: return OpCall{v1::BARRIER, nullptr, op.axes, nullptr};
    case CollectiveKind::kAllGather:
      if (out != nullptr) {
        return OpCall{v1::ALL_GATHER, x, op.axes, out, AllGatherOptions{op.axis, op.tiled}};
      }
      break;
    default:
      break;
  }
  return std::nullopt;
}

absl::Status Mesh::run(const Collective& op) {
  if (std::optional<OpCall> call = SyncCall(op)) return Run(*call);
  return submit(op).Wait();
}

OpFuture Mesh::start(const Collective& op, const std::function<bool()>& interrupted) {
  std::optional<OpCall> call = SyncCall(op);
  if (!call) return submit(op);
  absl::Status status;
  OpFuture future;
  return RunOrDispatch(*call, &interrupted, &status, &future) ? FailedOp(std::move(status))
                                                               : future;
}

bool Mesh::give_up(const OpFuture& op, absl::string_view why) {
  if (op.state_ == nullptr || op.Ready()) return false;
  const std::string reason = absl::StrCat("member ", index_, " gave up an op in flight: ", why);
  if (member_side_ != nullptr) {
    member_side_->ops->MarkBroken(reason);  // atomic in the segment: no lock
    return true;
  }
  // No segment to mark: leaving breaks the mesh for the others.
  Leave().IgnoreError();
  return true;
}

#define COLLECTIVED_REDUCTION(name, KIND)                                                  \
  OpFuture Mesh::name##_async(const Array& x, const AxisNames& axes,                       \
                              std::optional<Array> out) {                                  \
    return Submit(OpRequest{MakeSpec(id_, v1::KIND, &x, axes, out), CheckArgs(axes, out)}); \
  }                                                                                        \
  absl::Status Mesh::name(const Array& x, const AxisNames& axes, std::optional<Array> out) { \
    return Run(OpCall{v1::KIND, &x, axes, out ? &*out : nullptr});                         \
  }
COLLECTIVED_REDUCTION(psum, PSUM)
COLLECTIVED_REDUCTION(pmean, PMEAN)
COLLECTIVED_REDUCTION(pmax, PMAX)
COLLECTIVED_REDUCTION(pmin, PMIN)
#undef COLLECTIVED_REDUCTION

namespace {

v1::OpSpec GatherSpec(const std::string& mesh_id, const Array& x, const AxisNames& axes,
                      const Array& out, AllGatherOptions options) {
  v1::OpSpec spec = MakeSpec(mesh_id, v1::ALL_GATHER, &x, axes, out);
  spec.mutable_all_gather()->set_axis(options.axis);
  spec.mutable_all_gather()->set_tiled(options.tiled);
  return spec;
}

}  // namespace



OpFuture Mesh::all_gather_async(const Array& x, const AxisNames& axes, const Array& out,
                                AllGatherOptions options) {
  return Submit(OpRequest{GatherSpec(id_, x, axes, out, options), CheckArgs(axes, out)});
}
absl::Status Mesh::all_gather(const Array& x, const AxisNames& axes, const Array& out,
                              AllGatherOptions options) {
  return Run(OpCall{v1::ALL_GATHER, &x, axes, &out, options});
}

OpFuture Mesh::ppermute_async(const Array& x, const AxisNames& axes,
                              const std::vector<std::pair<int, int>>& perm,
                              std::optional<Array> out) {
  OpRequest r{MakeSpec(id_, v1::PPERMUTE, &x, axes, out), CheckArgs(axes, out)};
  for (const auto& [s, d] : perm) {
    auto* p = r.spec.mutable_ppermute()->add_perm();
    p->set_source(s);
    p->set_dest(d);
  }
  if (perm.empty()) r.spec.mutable_ppermute();
  return Submit(r);
}
absl::Status Mesh::ppermute(const Array& x, const AxisNames& axes,
                            const std::vector<std::pair<int, int>>& perm,
                            std::optional<Array> out) {
  return ppermute_async(x, axes, perm, std::move(out)).Wait();
}

OpFuture Mesh::psum_scatter_async(const Array& x, const AxisNames& axes, const Array& out,
                                  PsumScatterOptions options) {
  OpRequest r{MakeSpec(id_, v1::PSUM_SCATTER, &x, axes, out), CheckArgs(axes, out)};
  r.spec.mutable_psum_scatter()->set_scatter_dimension(options.scatter_dimension);
  r.spec.mutable_psum_scatter()->set_tiled(options.tiled);
  return Submit(r);
}
absl::Status Mesh::psum_scatter(const Array& x, const AxisNames& axes, const Array& out,
                                PsumScatterOptions options) {
  return psum_scatter_async(x, axes, out, options).Wait();
}

OpFuture Mesh::all_to_all_async(const Array& x, const AxisNames& axes, AllToAllOptions options,
                                std::optional<Array> out) {
  OpRequest r{MakeSpec(id_, v1::ALL_TO_ALL, &x, axes, out), CheckArgs(axes, out)};
  r.spec.mutable_all_to_all()->set_split_axis(options.split_axis);
  r.spec.mutable_all_to_all()->set_concat_axis(options.concat_axis);
  r.spec.mutable_all_to_all()->set_tiled(options.tiled);
  return Submit(r);
}
absl::Status Mesh::all_to_all(const Array& x, const AxisNames& axes, AllToAllOptions options,
                              std::optional<Array> out) {
  return all_to_all_async(x, axes, options, std::move(out)).Wait();
}

OpFuture Mesh::broadcast_async(const Array& x, const AxisNames& axes, int root,
                               std::optional<Array> out) {
  OpRequest r{MakeSpec(id_, v1::BROADCAST, &x, axes, out), CheckArgs(axes, out)};
  r.spec.mutable_broadcast()->set_root(root);
  return Submit(r);
}
absl::Status Mesh::broadcast(const Array& x, const AxisNames& axes, int root,
                             std::optional<Array> out) {
  return broadcast_async(x, axes, root, std::move(out)).Wait();
}

OpFuture Mesh::barrier_async(const AxisNames& axes) {
  return Submit(OpRequest{MakeSpec(id_, v1::BARRIER, nullptr, axes, std::nullopt),
                          CheckAxes(axes)});
}
absl::Status Mesh::barrier(const AxisNames& axes) {
  return Run(OpCall{v1::BARRIER, nullptr, axes, nullptr});
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

Client::Client(std::shared_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
// Meshes may still hold the implementation: the session ends now all the
// same.
Client::~Client() { impl_->Close(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  auto impl = std::make_shared<ClientImpl>(std::move(options));
  if (absl::Status st = impl->Connect(); !st.ok()) return st;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Mesh>> Client::JoinMesh(const MeshOptions& options) {
  return impl_->JoinMesh(options);
}
absl::StatusOr<Buffer> Client::Allocate(size_t bytes) { return impl_->Allocate(bytes, ""); }
absl::StatusOr<Buffer> Client::Allocate(size_t bytes, std::string_view device) {
  return impl_->Allocate(bytes, device);
}
absl::Status Client::Free(Buffer& buffer) { return impl_->Free(buffer); }
const std::string& Client::session_id() const { return impl_->session_id(); }
const std::string& Client::socket_path() const { return impl_->socket_path(); }
bool Client::fast_path() const { return impl_->fast_path(); }

}  // namespace collectived
