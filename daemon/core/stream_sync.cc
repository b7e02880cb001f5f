#include "daemon/core/stream_sync.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/raise_word.h"

namespace collectived {
namespace {

absl::StatusOr<std::pair<std::shared_ptr<SharedBuffer>, uint64_t*>> Word(
    const BufferRegion& ref, const char* what,
    const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
        const std::string& id, const char* what)>& find) {
  auto buf = find(ref.buffer_id, what);
  if (!buf.ok()) return buf.status();
  const std::shared_ptr<SharedBuffer>& b = *buf;
  if (b->kind() != "memfd") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " buffer '", ref.buffer_id, "' is ", b->kind(), " memory on ", b->device(),
        "; stream_sync words must be in a host (cpu) buffer"));
  }
  if (ref.size_bytes.has_value() && *ref.size_bytes != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " size_bytes is ", *ref.size_bytes, "; a stream_sync word is 8 bytes"));
  }
  const int64_t off = ref.offset;
  if (off < 0 || static_cast<uint64_t>(off) > b->size() || b->size() - off < 8) {
    return absl::OutOfRangeError(absl::StrCat(what, " word at offset ", off,
                                              " is not inside buffer '", ref.buffer_id,
                                              "' of ", b->size(), " bytes"));
  }
  if (off % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " offset ", off, " is not a multiple of 8"));
  }
  return std::make_pair(b, reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(b->data()) + off));
}

}  // namespace

absl::StatusOr<SyncWords> SyncWords::Resolve(
    const StreamOrder& sync,
    const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
        const std::string& id, const char* what)>& find) {
  if (sync.value == 0) {
    return absl::InvalidArgumentError("stream_sync value must be > 0");
  }
  auto ready = Word(sync.ready, "stream_sync ready", find);
  if (!ready.ok()) return ready.status();
  auto done = Word(sync.done, "stream_sync done", find);
  if (!done.ok()) return done.status();
  if (ready->second == done->second) {
    return absl::InvalidArgumentError("stream_sync ready and done are the same word");
  }
  SyncWords w;
  w.ready_buf_ = std::move(ready->first);
  w.ready_ = ready->second;
  w.done_buf_ = std::move(done->first);
  w.done_ = done->second;
  w.value_ = sync.value;
  return w;
}

void SyncWords::ReleaseDoneIfValid(
    const StreamOrder& sync,
    const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
        const std::string& id, const char* what)>& find) {
  if (sync.value == 0) return;
  if (sync.ready.buffer_id == sync.done.buffer_id && sync.ready.offset == sync.done.offset) {
    return;  // one word for both: raising it would fake the stream's arrival
  }
  auto done = Word(sync.done, "stream_sync done", find);
  if (!done.ok()) return;
  RaiseWord(done->second, sync.value);
}

uint64_t SyncWords::ReadyValue() const {
  return std::atomic_ref<uint64_t>(*ready_).load(std::memory_order_acquire);
}

bool SyncWords::Ready() const { return ReadyValue() >= value_; }

void SyncWords::Release() const { RaiseWord(done_, value_); }

void OpCancel::Cancel(absl::Status why) {
  MutexLock lock(&mu_);
  if (cancelled_.load(std::memory_order_relaxed)) return;
  why_ = std::move(why);
  cancelled_.store(true, std::memory_order_release);
}

absl::Status OpCancel::status() const {
  if (!cancelled()) return absl::OkStatus();
  MutexLock lock(&mu_);
  return why_;
}

bool StreamsReady(const std::vector<MemberSync>& members) {
  for (const MemberSync& m : members) {
    if (!m.words.Ready()) return false;
  }
  return true;
}

namespace {

absl::Status LateStreams(const std::vector<MemberSync>& members, const std::string& what) {
  std::vector<std::string> late;
  for (const MemberSync& m : members) {
    if (m.words.Ready()) continue;
    late.push_back(absl::StrCat(m.label, " (ready word ", m.words.ReadyValue(), ", awaited ",
                                m.words.value(), ")"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      what, ": the streams of these members did not reach the op before its deadline: ",
      absl::StrJoin(late, "; ")));
}

}  // namespace

StreamWaiter::StreamWaiter() : thread_([this] { Loop(); }) {}

StreamWaiter::~StreamWaiter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  // Ops still waiting fail: with their cancel status, else UNAVAILABLE.
  std::vector<Entry> left;
  {
    MutexLock lock(&mu_);
    left.swap(entries_);
  }
  for (Entry& e : left) {
    absl::Status st = e.cancel != nullptr && e.cancel->cancelled()
                          ? e.cancel->status()
                          : absl::UnavailableError(absl::StrCat(
                                e.what, ": the daemon stopped while the op waited for streams"));
    e.done(std::move(st));
  }
}

void StreamWaiter::Add(std::vector<MemberSync> members, absl::Time deadline,
                       std::shared_ptr<const OpCancel> cancel, std::string what,
                       std::function<void(absl::Status)> done) {
  {
    MutexLock lock(&mu_);
    entries_.push_back(Entry{std::move(members), deadline, std::move(cancel), std::move(what),
                             std::move(done)});
    last_add_ = absl::Now();
  }
  cv_.Signal();
}

void StreamWaiter::Loop() {
  absl::Duration nap = absl::Microseconds(20);
  for (;;) {
    std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> finished;
    {
      MutexLock lock(&mu_);
      while (entries_.empty() && !stop_) cv_.Wait(&mu_);
      if (stop_) return;
      const absl::Time now = absl::Now();
      for (auto it = entries_.begin(); it != entries_.end();) {
        absl::Status status;
        bool over = true;
        if (StreamsReady(it->members)) {
          status = absl::OkStatus();
        } else if (it->cancel != nullptr && it->cancel->cancelled()) {
          status = it->cancel->status();
        } else if (now >= it->deadline) {
          status = LateStreams(it->members, it->what);
        } else {
          over = false;
        }
        if (over) {
          finished.emplace_back(std::move(it->done), std::move(status));
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
      if (finished.empty() && !entries_.empty()) {
        // Nothing changed: look again soon. Continuously right after an op
        // arrived, then backing off to 1 ms (an Add wakes the wait).
        if (now - last_add_ < absl::Microseconds(200)) {
          nap = absl::Microseconds(20);
          mu_.Unlock();
          std::this_thread::yield();
          mu_.Lock();
        } else {
          cv_.WaitWithDeadline(&mu_, now + nap);
          nap = std::min(nap * 2, absl::Milliseconds(1));
        }
      }
    }
    for (auto& [done, status] : finished) done(std::move(status));
  }
}

}  // namespace collectived
