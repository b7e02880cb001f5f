#include "daemon/server/fast_path.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cpu_mask.h"
#include "common/fast_queue.h"
#include "daemon/memory/shared_buffer.h"
#include "daemon/server/wire.h"
#include "daemon/util/log.h"

namespace collectived {

using fastq::CqEntry;
using fastq::kSlots;
using fastq::QueueView;
using fastq::SqEntry;

class FastPath::Queue : public std::enable_shared_from_this<FastPath::Queue> {
 public:
  Queue(Engine* engine, std::string session_id, std::shared_ptr<SharedBuffer> memory,
        absl::Duration spin, SpinBudget* budget)
      : engine_(engine),
        session_id_(std::move(session_id)),
        memory_(std::move(memory)),
        q_(QueueView::Of(memory_->data())),
        spin_(spin),
        budget_(budget) {
    fastq::InitHeader(q_.header);
  }

  int fd() const { return memory_->fd(); }
  void* base() const { return memory_->data(); }

  void Start() { thread_ = std::thread([this] { Loop(); }); }

  // Stops the thread and tells the client the queue is closed.
  void Stop() {
    stop_.store(true);
    q_.header->daemon_bell.v.fetch_add(1);
    fastq::FutexWake(&q_.header->daemon_bell.v);
    if (thread_.joinable()) thread_.join();
    MarkClosed();
  }

  void MarkClosed() {
    q_.header->closed.v.store(1, std::memory_order_seq_cst);
    q_.header->client_bell.v.fetch_add(1);
    fastq::FutexWake(&q_.header->client_bell.v);
  }

  // Publishes op `tag`'s outcome. Every taken entry holds a CQ slot (see the
  // credit rule), so this never waits for the client.
  void Complete(uint64_t tag, int64_t taken_ns, const OpOutcome& outcome) {
    {
      MutexLock lock(&cq_mu_);
      CqEntry& c = q_.cq[cq_tail_ % kSlots];
      c.tag = tag;
      c.sequence = outcome.sequence;
      c.code = static_cast<int32_t>(outcome.status.code());
      c.out_dtype = static_cast<int32_t>(ToProto(outcome.out_dtype));
      const size_t rank = std::min<size_t>(outcome.out_shape.size(), fastq::kMaxRank);
      c.rank = static_cast<int32_t>(rank);
      for (size_t i = 0; i < rank; ++i) c.out_shape[i] = outcome.out_shape[i];
      const size_t len = std::min(outcome.status.message().size(), sizeof(c.msg));
      if (len > 0) std::memcpy(c.msg, outcome.status.message().data(), len);
      c.msg_len = static_cast<uint32_t>(len);
      c.taken_ns = taken_ns;
      const OpStamps& st = outcome.stamps;
      c.started_ns = st.started_ns;
      c.matched_ns = st.matched_ns;
      c.ready_ns = st.ready_ns;
      c.launched_ns = st.device.launched_ns;
      c.executed_ns = st.executed_ns;
      c.device_ns = st.device.device_ns;
      c.done_ns = fastq::MonotonicNs();
      c.bytes_read = static_cast<int64_t>(outcome.traffic.read);
      c.bytes_written = static_cast<int64_t>(outcome.traffic.written);
      c.bytes_required = static_cast<int64_t>(outcome.traffic.required);
      ++cq_tail_;
      q_.header->cq_tail.v.store(cq_tail_, std::memory_order_seq_cst);
    }
    fastq::Ring(q_.header->client_bell, q_.header->client_sleeping);
  }

 private:
  // Whether an entry can be taken now; sets corrupt_ when the client's
  // counters are impossible.
  bool HasWork() {
    const uint32_t tail = q_.header->sq_tail.v.load(std::memory_order_seq_cst);
    const uint32_t consumed = q_.header->cq_head.v.load(std::memory_order_seq_cst);
    if (tail - head_ > kSlots || taken_ - consumed > kSlots) {
      corrupt_ = true;
      return false;
    }
    return tail != head_ && taken_ - consumed < kSlots;
  }

  // Polls (after a small op, while the budget has a CPU for it), then
  // sleeps on the bell, until there is work, the queue stops, or 1 s passed.
  void WaitForWork() {
    const bool spin = last_small_ && spin_ > absl::ZeroDuration() && budget_->TryStartSpin();
    fastq::SpinThenSleep(
        q_.header->daemon_bell, q_.header->daemon_sleeping,
        [this] { return stop_.load(std::memory_order_relaxed) || HasWork() || corrupt_; },
        [] { return true; }, spin ? spin_ : absl::ZeroDuration(), absl::Seconds(1),
        absl::Now() + absl::Seconds(1));
    if (spin) budget_->EndSpin();
  }

  void Loop() {
    std::string scratch;
    v1::OpSpec op;
    OpRequest request;  // every op converted into it (wire.h), reusing its memory
    while (!stop_.load(std::memory_order_relaxed)) {
      if (!HasWork()) {
        if (corrupt_) break;
        WaitForWork();
        continue;
      }
      // Copy the entry out before looking at it: the client can change it.
      const SqEntry& e = q_.sq[head_ % kSlots];
      const uint64_t tag = e.tag;
      const int64_t taken_ns = fastq::MonotonicNs();
      const uint32_t len = e.len;
      absl::Status bad;
      if (len > fastq::kMaxOpBytes) {
        bad = absl::InvalidArgumentError(absl::StrCat("fast-path entry claims ", len,
                                                      " bytes; a slot holds at most ",
                                                      fastq::kMaxOpBytes));
      } else {
        scratch.assign(reinterpret_cast<const char*>(e.data), len);
        if (!op.ParseFromString(scratch)) {
          bad = absl::InvalidArgumentError("fast-path entry is not a serialized OpSpec");
        }
      }
      ++taken_;
      engine_->CountSubmission(Engine::SubmitPath::kFastPath);
      last_small_ = !bad.ok() || fastq::PollsFor(DTypeSize(static_cast<DType>(op.dtype())),
                                                  op.shape());
      if (bad.ok()) {
        FromProto(op, request);
        auto accepted = engine_->Submit(
            session_id_, request, /*retain=*/false,
            [self = shared_from_this(), tag, taken_ns](const OpOutcome& o) {
              self->Complete(tag, taken_ns, o);
            });
        if (!accepted.ok()) bad = accepted.status();
      }
      if (!bad.ok()) Complete(tag, taken_ns, OpOutcome(bad, -1));
      // Published after Submit: sq_head == sq_tail means every entry so far
      // has its sequence number (the SDK relies on it before using gRPC).
      ++head_;
      q_.header->sq_head.v.store(head_, std::memory_order_seq_cst);
    }
    if (corrupt_) {
      LogEvent(LogLevel::kWarn, "fast_path_corrupt", {{"session", DisplayId(session_id_)}});
      engine_
          ->CloseSession(session_id_,
                         "the client corrupted its fast-path queue (impossible counters)")
          .IgnoreError();
      // Not served any more: tell a waiting client at once (after the
      // session's ops failed, so their completions are in the ring).
      MarkClosed();
    }
  }

  Engine* const engine_;
  const std::string session_id_;
  const std::shared_ptr<SharedBuffer> memory_;
  const QueueView q_;
  const absl::Duration spin_;
  SpinBudget* const budget_;  // the FastPath's, which outlives its queues' threads
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // Queue thread only.
  uint32_t head_ = 0;
  uint32_t taken_ = 0;
  bool corrupt_ = false;
  bool last_small_ = true;  // whether to poll for the next entry (kSpinOpBytes)

  Mutex cq_mu_;
  uint32_t cq_tail_ ABSL_GUARDED_BY(cq_mu_) = 0;
};

bool SpinBudget::TryStartSpin() {
  const int busy = polling_members_();
  int spinning = spinning_.load();
  do {
    if (busy + spinning >= cpus_) return false;
  } while (!spinning_.compare_exchange_weak(spinning, spinning + 1));
  return true;
}

FastPath::FastPath(Engine* engine, FastPathOptions options, int cpus)
    : engine_(engine),
      options_(options),
      budget_(cpus > 0 ? cpus : UsableCpus(), [engine] { return engine->member_side_sessions(); }) {}

absl::StatusOr<int> FastPath::Open(const std::string& session_id) {
  MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the daemon is stopping");
  if (queues_.count(session_id) > 0) {
    return absl::FailedPreconditionError("this session already has a fast-path queue");
  }
  auto memory = CreateMemfdBuffer(fastq::kQueueBytes);
  if (!memory.ok()) return memory.status();
  auto queue = std::make_shared<Queue>(engine_, session_id, *std::move(memory), options_.spin,
                                       &budget_);
  queue->Start();
  const int fd = queue->fd();
  queues_[session_id] = std::move(queue);
  return fd;
}

void* FastPath::MappedQueue(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto it = queues_.find(session_id);
  return it == queues_.end() ? nullptr : it->second->base();
}

void FastPath::Close(const std::string& session_id) {
  std::shared_ptr<Queue> queue;
  {
    MutexLock lock(&mu_);
    auto it = queues_.find(session_id);
    if (it == queues_.end()) return;
    queue = std::move(it->second);
    queues_.erase(it);
  }
  queue->Stop();
}

void FastPath::Stop() {
  std::map<std::string, std::shared_ptr<Queue>> queues;
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    queues.swap(queues_);
  }
  for (auto& [id, queue] : queues) queue->Stop();
}

}  // namespace collectived
