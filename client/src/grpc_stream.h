// The session's gRPC Execute stream, driven by the threads that wait.
#ifndef COLLECTIVED_CLIENT_SRC_GRPC_STREAM_H_
#define COLLECTIVED_CLIENT_SRC_GRPC_STREAM_H_

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

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_SRC_GRPC_STREAM_H_
