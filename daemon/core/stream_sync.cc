#include "daemon/core/stream_sync.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace collectived {
namespace {

absl::StatusOr<std::pair<std::shared_ptr<SharedBuffer>, uint64_t*>> Word(
    const v1::BufferRef& ref, const char* what,
    const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
        const std::string& id, const char* what)>& find) {
  auto buf = find(ref.buffer_id(), what);
  if (!buf.ok()) return buf.status();
  const std::shared_ptr<SharedBuffer>& b = *buf;
  if (b->kind() != "memfd") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " buffer '", ref.buffer_id(), "' is ", b->kind(), " memory on ", b->device(),
        "; stream_sync words must be in a host (cpu) buffer"));
  }
  if (ref.has_size_bytes() && ref.size_bytes() != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " size_bytes is ", ref.size_bytes(), "; a stream_sync word is 8 bytes"));
  }
  const int64_t off = ref.offset();
  if (off < 0 || static_cast<uint64_t>(off) > b->size() || b->size() - off < 8) {
    return absl::OutOfRangeError(absl::StrCat(what, " word at offset ", off,
                                              " is not inside buffer '", ref.buffer_id(),
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
    const v1::StreamSync& sync,
    const std::function<absl::StatusOr<std::shared_ptr<SharedBuffer>>(
        const std::string& id, const char* what)>& find) {
  if (sync.value() == 0) {
    return absl::InvalidArgumentError("stream_sync value must be > 0");
  }
  auto ready = Word(sync.ready(), "stream_sync ready", find);
  if (!ready.ok()) return ready.status();
  auto done = Word(sync.done(), "stream_sync done", find);
  if (!done.ok()) return done.status();
  if (ready->second == done->second) {
    return absl::InvalidArgumentError("stream_sync ready and done are the same word");
  }
  SyncWords w;
  w.ready_buf_ = std::move(ready->first);
  w.ready_ = ready->second;
  w.done_buf_ = std::move(done->first);
  w.done_ = done->second;
  w.value_ = sync.value();
  return w;
}

uint64_t SyncWords::ReadyValue() const {
  return std::atomic_ref<uint64_t>(*ready_).load(std::memory_order_acquire);
}

bool SyncWords::Ready() const { return ReadyValue() >= value_; }

void SyncWords::Release() const {
  std::atomic_ref<uint64_t> done(*done_);
  uint64_t cur = done.load(std::memory_order_relaxed);
  while (cur < value_ &&
         !done.compare_exchange_weak(cur, value_, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
}

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

absl::Status AwaitStreams(const std::vector<MemberSync>& members, absl::Time deadline,
                          const OpCancel* cancel, const std::string& what) {
  const absl::Time start = absl::Now();
  absl::Duration nap = absl::Microseconds(20);
  for (;;) {
    bool all = true;
    for (const MemberSync& m : members) all = all && m.words.Ready();
    if (all) return absl::OkStatus();
    if (cancel != nullptr && cancel->cancelled()) return cancel->status();
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    if (now - start < absl::Microseconds(200)) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(std::min(nap, deadline - now));
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }
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

}  // namespace collectived
