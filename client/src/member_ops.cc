#include "client/src/member_ops.h"

#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "collectived/member_ops_code.h"
#include "common/cpu_mask.h"
#include "common/fast_queue.h"
#include "exec/reduce.h"
#include "plan/wire_plan.h"

namespace collectived::internal {

using member_ops::Entry;
using member_ops::Key;

namespace {

// Waiting: poll without yielding for up to kBusyPoll when every member can
// have a CPU of its own and none it waits for last ran on this CPU (the
// peers' entries then arrive within a cache-line transfer, and a
// sched_yield between looks would cost more than that), then poll
// (yielding) for kSpin, then sleep on the member's bell in
// slices of this length; between slices the waiter checks that the daemon
// is alive (a killed daemon cannot mark the segment broken).
constexpr int64_t kBusyPollNs = 20'000;
constexpr absl::Duration kSpin = absl::Microseconds(200);
constexpr absl::Duration kSlice = absl::Milliseconds(10);
// Compute runs ops over groups of up to this many members without building
// the executor's arguments.
constexpr size_t kDirectGroup = 16;
// A member moves off a CPU it shares with more members than its share
// (SpreadOverCpus) at most this often.
constexpr int64_t kMoveEveryNs = 200'000;

// A spin-wait hint to the CPU (lets a sibling hyperthread run, saves power).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Looks at `ready` without yielding the CPU, for at most kBusyPollNs and
// while `yield` is false (looked at now and then); whether `ready` became
// true.
template <typename Ready, typename Yield>
bool BusyPoll(Ready ready, Yield yield) {
  int64_t end = 0;
  for (int i = 1; !ready(); ++i) {
    CpuRelax();
    if ((i & 255) == 0) {
      if (yield()) return false;
      const int64_t now = fastq::MonotonicNs();
      if (end == 0) {
        end = now + kBusyPollNs;
      } else if (now >= end) {
        return false;
      }
    }
  }
  return true;
}

bool KindRunsHere(OpKind kind) {
  switch (kind) {
    case OpKind::kPsum:
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
    case OpKind::kAllGather:
    case OpKind::kBarrier:
      return true;
    default:
      return false;
  }
}

// Whether the daemon would accept the op's regions (its CheckRange, the
// in-place and overlap rules): only then can the op run here.
bool RegionsFit(const OpPlan& plan, const MemberIoRegion& io) {
  if (io.in == nullptr || plan.in_bytes > io.in_avail || !ElementAligned(io.in_offset, plan.dtype)) {
    return false;
  }
  if (io.in_place) return plan.out_bytes == plan.in_bytes;
  if (io.out == nullptr || plan.out_bytes > io.out_avail ||
      !ElementAligned(io.out_offset, plan.out_dtype)) {
    return false;
  }
  return !io.same_buffer ||
         SameOrDisjoint(io.in_offset, plan.in_bytes, io.out_offset, plan.out_bytes);
}

// The daemon's floating-point environment while this thread does an op's
// work, whatever the thread's own: for a psum, pmean, pmax or pmin of a float
// dtype the reductions' mode (ReductionModeScope: flush-to-zero too, so the
// kernels do not switch again), for anything else DefaultFpScope (and the
// kernels switch to flush-to-zero themselves where they need it).
class OpFpMode {
 public:
  explicit OpFpMode(const OpPlan& plan) {
    if (IsReduction(plan.kind) && IsFloat(plan.dtype)) {
      reduction_.emplace();
    } else {
      other_.emplace();
    }
  }

 private:
  std::optional<ReductionModeScope> reduction_;
  std::optional<DefaultFpScope> other_;
};

// How many times `used` (1 + CPU, 0: unknown) names each CPU of `mask` it
// names (the CPUs of the mask it does not name: 0).
std::vector<std::pair<int, uint32_t>> TimesNamed(const std::vector<uint32_t>& used,
                                                 const CpuMask& mask) {
  std::vector<std::pair<int, uint32_t>> times;
  for (uint32_t c : used) {
    if (c == 0 || c > CpuMask::kMaxCpus || !mask.Has(static_cast<int>(c - 1))) continue;
    const int cpu = static_cast<int>(c - 1);
    auto it = std::find_if(times.begin(), times.end(),
                           [cpu](const auto& t) { return t.first == cpu; });
    if (it == times.end()) {
      times.emplace_back(cpu, 1);
    } else {
      ++it->second;
    }
  }
  return times;
}

}  // namespace

uint32_t MoveToLeastUsedCpu(const std::vector<uint32_t>& used, uint32_t below) {
  CpuMask mask, least;
  if (!mask.ReadThisThread() || !least.ReadThisThread()) return 0;
  const std::vector<std::pair<int, uint32_t>> times = TimesNamed(used, mask);
  // A CPU of the mask that `used` does not name has 0.
  uint32_t fewest = 0;
  if (times.size() == static_cast<size_t>(mask.Count())) {
    fewest = std::numeric_limits<uint32_t>::max();
    for (const auto& [cpu, t] : times) fewest = std::min(fewest, t);
  }
  if (fewest >= below) return 0;
  for (const auto& [cpu, t] : times) {
    if (t > fewest) least.Remove(cpu);
  }
  if (least.Count() == 0 || !least.ApplyToThisThread()) return 0;
  const int now_on = sched_getcpu();
  // Best effort: should the mask not come back, the thread keeps a subset
  // of it (still CPUs it was allowed).
  (void)mask.ApplyToThisThread();
  return now_on >= 0 ? static_cast<uint32_t>(now_on + 1) : 0;
}

absl::StatusOr<std::unique_ptr<MemberOps>> MemberOps::Map(int fd, uint64_t bytes, MeshShape shape,
                                                          int index, absl::Duration op_timeout,
                                                          int live_fd, ExpiredFn expired,
                                                          PeerFdFn peer_fd) {
  const int members = shape.num_members();
  if (bytes < sizeof(member_ops::Header) || bytes > member_ops::kMaxSegmentBytes ||
      index < 0 || index >= members) {
    close(fd);
    close(live_fd);
    return absl::InternalError(absl::StrCat("the daemon's member-side segment (", bytes,
                                            " bytes) does not fit a mesh of ", members,
                                            " members"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    close(live_fd);
    return absl::InternalError(absl::StrCat("mapping the member-side segment: ", strerror(err)));
  }
  const member_ops::Layout layout =
      member_ops::ValidLayout(base, bytes, static_cast<uint32_t>(members));
  if (layout.total_bytes == 0) {
    munmap(base, bytes);
    close(live_fd);
    return absl::InternalError("the daemon's member-side segment has an unknown layout");
  }
  // The daemon computes with other code than this SDK (another version, or
  // another build): the members must not compute its ops themselves.
  char code_copy[member_ops::kCodeBytes];
  const std::string_view code = member_ops::CodeOf(base, bytes, code_copy);
  if (code != COLLECTIVED_MEMBER_OPS_CODE) {
    munmap(base, bytes);
    close(live_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon's member-side code is '",
        absl::CHexEscape(absl::string_view(code.data(), code.size())), "' and this SDK's is '",
        COLLECTIVED_MEMBER_OPS_CODE,
        "' (different versions or builds): every op of this member goes through the daemon"));
  }
  return std::unique_ptr<MemberOps>(new MemberOps(base, bytes, layout, std::move(shape), index,
                                                  op_timeout, live_fd, std::move(expired),
                                                  std::move(peer_fd)));
}

MemberOps::MemberOps(void* base, uint64_t bytes, member_ops::Layout layout, MeshShape shape,
                     int index, absl::Duration op_timeout, int live_fd, ExpiredFn expired,
                     PeerFdFn peer_fd)
    : base_(base),
      bytes_(bytes),
      view_{static_cast<uint8_t*>(base), layout},
      shape_(std::move(shape)),
      index_(static_cast<uint32_t>(index)),
      op_timeout_(op_timeout),
      live_fd_(live_fd),
      expired_(std::move(expired)),
      members_per_cpu_(MembersPerCpu(static_cast<uint32_t>(shape_.num_members()), UsableCpus())),
      busy_poll_(members_per_cpu_ == 1),
      // One thread (this one), and every op serial: they are small.
      executor_(CpuExecutorOptions{.threads = 1,
                                   .serial_bytes = std::numeric_limits<size_t>::max()}),
      peer_fd_(std::move(peer_fd)),
      peer_maps_(layout.members),
      compared_(size_t{layout.members} * 2) {}

MemberOps::~MemberOps() {
  for (const std::vector<PeerMapping>& maps : peer_maps_) {
    for (const PeerMapping& p : maps) munmap(const_cast<uint8_t*>(p.base), p.size);
  }
  munmap(base_, bytes_);
  close(live_fd_);
}

bool MemberOps::DaemonAlive() const {
  pollfd p{live_fd_, POLLRDHUP, 0};
  const int r = poll(&p, 1, 0);
  return r == 0 || (r < 0 && errno == EINTR);
}

absl::Status MemberOps::DaemonLost() {
  return absl::UnavailableError(
      "connection to the daemon lost (side socket closed) during a member-side op");
}

absl::Status MemberOps::Abandon(absl::Status status) {
  // This member's entry at its place goes first, then the mark: a member
  // that then looks finds the entry gone and the mesh broken, and fails.
  // One that found every entry of a place after reads before that had
  // finished its own reads when it published there: its result stands.
  Entry* mine = view_.entry(index_, s_);
  if (unused_key_ != 0 && mine->key.load(std::memory_order_relaxed) == unused_key_) {
    mine->key.store(0, std::memory_order_seq_cst);
  }
  MarkBroken(absl::StrCat("a member gave up on a member-side op: ", status.message()));
  return status;
}

void MemberOps::MarkBroken(absl::string_view reason) {
  member_ops::MarkBroken(view_, static_cast<uint32_t>(absl::StatusCode::kAborted), reason.data(),
                         reason.size());
}

absl::Status MemberOps::Broken() const {
  const member_ops::Header* h = view_.header();
  uint32_t code = h->broken.v.load(std::memory_order_seq_cst);
  if (code == 0) return absl::OkStatus();
  // The reason is being written: a few microseconds.
  for (int i = 0; i < 1000 && code == member_ops::kBrokenWriting; ++i) {
    sched_yield();
    code = h->broken.v.load(std::memory_order_seq_cst);
  }
  const size_t len = std::min<size_t>(h->reason_len, member_ops::kMaxReason);
  std::string reason(h->reason, len);
  // The daemon writes a status code; anything else is a corrupt segment.
  const auto status_code =
      code <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kInternal;
  return absl::Status(status_code,
                      reason.empty() || code == member_ops::kBrokenWriting ? "mesh broken" : reason);
}

bool MemberOps::HasPlanFor(const MemberOpKey& key) const {
  const CachedKey& c = cached_key_;
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
  };
  return cached_plan_.has_value() && c.kind == key.kind && c.dtype == key.dtype &&
         c.no_axes == key.no_axes && c.gather_axis == key.gather_axis &&
         c.gather_tiled == key.gather_tiled && same(c.shape, key.shape) && same(c.axes, key.axes);
}

bool MemberOps::AskInterrupted(absl::string_view signature) {
  try {
    return (*interrupted_)();
  } catch (...) {
    // Its entry is published: the others must not wait for it, nor run
    // this place without it.
    Abandon(absl::CancelledError(absl::StrCat("member ", index_, "'s interrupted() check threw "
                                              "while it waited in member-side ", signature)))
        .IgnoreError();  // the exception says what happened
    throw;
  }
}

bool MemberOps::PeerOnThisCpu() const {
  if (last_cpu_ == 0) return false;  // unknown
  for (uint32_t m = 0; m < view_.layout.members; ++m) {
    if (m != index_ && view_.slot(m)->cpu.v.load(std::memory_order_relaxed) == last_cpu_) {
      return true;
    }
  }
  return false;
}

void MemberOps::SpreadOverCpus() {
  const uint32_t members = view_.layout.members;
  const uint32_t most = members_per_cpu_;
  auto cpu_of = [this](uint32_t m) { return view_.slot(m)->cpu.v.load(std::memory_order_relaxed); };
  if (!OverCpuShare(index_, last_cpu_, most, cpu_of)) return;
  const int64_t now = fastq::MonotonicNs();
  if (now - last_move_ns_ < kMoveEveryNs) return;
  last_move_ns_ = now;
  std::vector<uint32_t> used(members);
  for (uint32_t m = 0; m < members; ++m) used[m] = cpu_of(m);
  if (const uint32_t moved = MoveToLeastUsedCpu(used, most); moved != 0) {
    last_cpu_ = moved;
    view_.slot(index_)->cpu.v.store(moved, std::memory_order_relaxed);
  }
}

absl::Status MemberOps::SleepUntil(absl::FunctionRef<bool()> ready, absl::string_view signature,
                                   uint32_t d, uint64_t s, absl::Duration timeout) {
  // (With more members than CPUs they cannot all be apart: yield then.)
  const absl::Duration spin = busy_poll_ && PeerOnThisCpu() ? absl::ZeroDuration() : kSpin;
  absl::Time deadline = absl::Now() + timeout;
  // The daemon answers for missing members; past this even its answers
  // ("nobody is missing", from a segment a member corrupted) stop the wait.
  const absl::Duration limit = 2 * timeout + absl::Seconds(10);
  const absl::Time give_up = absl::Now() + limit;
  member_ops::Slot& slot = *view_.slot(index_);
  for (;;) {
    // Between sleeps: is the daemon still there (it cannot mark the
    // segment if it was killed)? Does the caller want to stop waiting?
    bool alive = true, interrupted = false;
    auto idle = [&] {
      if (interrupted_ != nullptr && AskInterrupted(signature)) {
        interrupted = true;
        return false;
      }
      return alive = DaemonAlive();
    };
    if (fastq::SpinThenSleep(slot.bell, slot.sleeping, ready, idle, spin, kSlice, deadline)) {
      return absl::OkStatus();
    }
    // A dead daemon: every waiter finds out by itself (no mark, which
    // would turn the others' UNAVAILABLE into ABORTED).
    if (!alive) return DaemonLost();
    if (interrupted) {
      // This member's entry is published: the others must not wait for
      // it, nor run this place without it.
      return Abandon(absl::CancelledError(absl::StrCat(
          "member ", index_, " was interrupted while it waited in member-side ", signature)));
    }
    if (absl::Now() >= give_up) {
      return Abandon(absl::DeadlineExceededError(absl::StrCat(
          "member-side ", signature, ": the members' entries never agreed within ",
          absl::FormatDuration(limit),
          " although the daemon saw nobody missing (a corrupt segment?)")));
    }
    // Past the deadline: the daemon names the missing members and breaks
    // the mesh, or says nobody is missing (then look again, briefly).
    absl::StatusOr<bool> broke = expired_(d, static_cast<uint32_t>(s & 0xffffff));
    if (!broke.ok()) {
      if (!DaemonAlive()) return DaemonLost();
      return Abandon(absl::Status(
          broke.status().code(), absl::StrCat("member-side op: asking the daemon about members "
                                              "that did not arrive in time: ",
                                              broke.status().message())));
    }
    deadline = absl::Now() + (*broke ? absl::Seconds(5) : kSlice);
  }
}

void MemberOps::WriteSignature(Entry& mine, uint64_t s, Signature signature) {
  // The signature is written only when it changed: a loop's ops then leave
  // its cache lines alone (and its generation, which tells the others that
  // compared it that it is the same). A numbered signature, once written in
  // this entry, is not even compared.
  uint64_t& written = signature_written_[s & 1];
  if (signature.number != 0 && written == signature.number) return;
  const absl::string_view text = signature.text;
  if (mine.sig_len != text.size() || std::memcmp(mine.signature, text.data(), text.size()) != 0) {
    mine.sig_len = static_cast<uint32_t>(text.size());
    std::memcpy(mine.signature, text.data(), text.size());
    mine.sig_gen = mine.sig_gen + 1;  // only this member writes it
  }
  written = signature.number;
}

bool MemberOps::SameSignature(uint32_t m, uint64_t s, const Entry& theirs, const Entry& mine,
                              uint64_t number) {
  // Both texts are as they were when found equal: member m's generation is
  // the same, and so is this member's number (numbers are never reused).
  Compared& last = compared_[size_t{m} * 2 + (s & 1)];
  const uint64_t gen = theirs.sig_gen;
  if (number != 0 && last.number == number && last.gen == gen) return true;
  if (theirs.sig_len != mine.sig_len ||
      std::memcmp(theirs.signature, mine.signature, mine.sig_len) != 0) {
    return false;
  }
  last = Compared{gen, number};
  return true;
}

std::optional<absl::Status> MemberOps::Meet(Signature signature, const uint8_t* payload,
                                            uint64_t payload_bytes, int64_t now,
                                            absl::Duration timeout) {
  // Publish this member's entry at (D, S).
  const uint32_t d = view_.slot(index_)->daemon_ops.v.load(std::memory_order_seq_cst);
  const uint64_t s = s_;
  const uint64_t key = Key(d, s);
  // This member already published at this place and the op did not run
  // member-side (the members went to the daemon, and this member's op
  // there was refused before the daemon took it): the others are on the
  // daemon path at this place, so this op goes there too.
  if (key == unused_key_) return std::nullopt;
  unused_key_ = key;  // until the op runs here
  Entry* mine = view_.entry(index_, s);
  WriteSignature(*mine, s, signature);
  mine->in_bytes = static_cast<uint32_t>(payload_bytes);
  if (payload_bytes > 0) std::memcpy(view_.input(index_, s, payload_bytes), payload, payload_bytes);
  mine->published_ns = now;
  // Where this member runs, for the others' choice to spin (0: unknown);
  // stored when it changed only, so the line stays in the others' caches.
  if (const uint32_t cpu = static_cast<uint32_t>(sched_getcpu() + 1); cpu != last_cpu_) {
    view_.slot(index_)->cpu.v.store(cpu, std::memory_order_relaxed);
    last_cpu_ = cpu;
  }
  // Asked at every op, not only when this member waits (see
  // SpreadOverCpus), and before publishing: a member asleep on this CPU is
  // then woken from the other one and stays where it is.
  SpreadOverCpus();
  mine->key.store(key, std::memory_order_seq_cst);
  member_ops::RingAll(view_, index_);

  // Wait until every member is here or took the daemon path.
  const uint32_t members = view_.layout.members;
  bool daemon_path = false;
  // Whether every member's entry is here; sets daemon_path when a member
  // took the daemon path at this place instead.
  auto AllHere = [&] {
    for (uint32_t m = 0; m < members; ++m) {
      if (m == index_) continue;
      const member_ops::Presence p = member_ops::PresenceAt(view_, m, d, s, key);
      if (p == member_ops::Presence::kHere) continue;
      if (p == member_ops::Presence::kDaemonPath) daemon_path = true;
      return false;
    }
    return true;
  };
  bool all_here = false;
  // Entries before the broken word: an op whose members all arrived
  // completes even if one of them is gone by now (as on the daemon path,
  // where it would have run).
  auto ready = [&] {
    all_here = AllHere();
    return all_here || daemon_path ||
           view_.header()->broken.v.load(std::memory_order_seq_cst) != 0;
  };
  bool here = ready();
  // A member on this CPU cannot come while this one polls.
  if (!here && busy_poll_ && !PeerOnThisCpu()) {
    here = BusyPoll(ready, [this] { return PeerOnThisCpu(); });
  }
  // The peers are usually here within a microsecond: the deadlines are
  // computed only when they are not.
  if (!here) {
    if (absl::Status st = SleepUntil(ready, signature.text, d, s, timeout); !st.ok()) return st;
  }
  if (!all_here) {
    if (daemon_path) return std::nullopt;  // the daemon path says the rest
    return Broken();
  }
  for (uint32_t m = 0; m < members; ++m) {
    if (m == index_) continue;
    const Entry* e = view_.entry(m, s);
    if (e->in_bytes != mine->in_bytes || !SameSignature(m, s, *e, *mine, signature.number)) {
      return std::nullopt;  // the daemon reports who submitted what
    }
  }
  return absl::OkStatus();
}

std::optional<absl::Status> MemberOps::TryRun(const MemberOpKey& op,
                                              absl::FunctionRef<v1::OpSpec()> spec,
                                              const MemberIoRegion& io,
                                              const std::function<bool()>* interrupted) {
  interrupted_ = interrupted != nullptr && *interrupted ? interrupted : nullptr;
  absl::Cleanup forget = [this] { interrupted_ = nullptr; };
  // A broken mesh or a daemon that is gone: the daemon path says so, with
  // its usual errors. The daemon is looked at (one poll()) once a
  // millisecond has passed on the coarse clock, at most once per timer tick
  // (1-10 ms): ops complete member-side for at most about that long after
  // it died, as ops it completed just before dying would.
  if (absl::Status b = Broken(); !b.ok()) return std::nullopt;
  const int64_t now = fastq::CoarseMonotonicNs();
  if (now - alive_checked_ns_ > 1'000'000) {
    if (!DaemonAlive()) return std::nullopt;
    alive_checked_ns_ = now;
  }
  if (!KindRunsHere(static_cast<OpKind>(op.kind))) return std::nullopt;
  if (!HasPlanFor(op)) {
    cached_plan_.reset();
    absl::StatusOr<OpPlan> planned = PlanOp(spec(), shape_);
    // Refused here exactly as the daemon refuses it, without taking a place
    // in the op order (the daemon would not give it one either).
    if (!planned.ok()) return planned.status();
    cached_plan_ = *std::move(planned);
    ++plan_number_;
    cached_key_ = CachedKey{op.kind,
                            op.dtype,
                            {op.shape.begin(), op.shape.end()},
                            {op.axes.begin(), op.axes.end()},
                            op.no_axes,
                            op.gather_axis,
                            op.gather_tiled};
  }
  const OpPlan& plan = *cached_plan_;
  if (io.shared_out != nullptr) return RunIntoShared(plan, io, now);
  uint8_t* out = io.in_place ? const_cast<uint8_t*>(io.in) : io.out;
  if (std::optional<absl::Status> by_reads; RanByReads(plan, io, out, now, &by_reads)) {
    return by_reads;
  }
  if (plan.in_bytes > view_.layout.payload_bytes ||
      plan.signature.size() > member_ops::kMaxSignature) {
    return std::nullopt;
  }
  const bool moves_data = plan.kind != OpKind::kBarrier && (plan.in_bytes > 0 || plan.out_bytes > 0);
  if (moves_data && !RegionsFit(plan, io)) return std::nullopt;  // the daemon says what is wrong

  if (std::optional<absl::Status> met =
          Meet({plan.signature, PlaceNumber(Place::kOp)}, io.in, moves_data ? plan.in_bytes : 0,
               now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  // Every member agrees: run this member's share with the daemon's code.
  if (moves_data) {
    if (absl::Status st = Compute(plan, out); !st.ok()) return Abandon(st);
  }
  Advance();
  Completed(Path::kSegment);
  return absl::OkStatus();
}

bool MemberOps::RanByReads(const OpPlan& plan, const MemberIoRegion& io, uint8_t* out,
                           int64_t now, std::optional<absl::Status>* result) {
  if (!ReadsFit(plan, io)) return false;
  if (reads_.load(std::memory_order_relaxed) == Reads::kUnknown) {
    if (std::optional<absl::Status> probed = ProbeReads(plan, now); !probed || !probed->ok()) {
      *result = std::move(probed);
      return true;
    }
    // Asked again now that the probe decided (a reduction may not read).
    if (!ReadsFit(plan, io)) return false;
  }
  if (reads_.load(std::memory_order_relaxed) != Reads::kYes) return false;
  now = fastq::CoarseMonotonicNs();
  *result = plan.kind == OpKind::kAllGather ? GatherByReads(plan, io, now)
             : SplitsByReads(plan)             ? ReduceBySplitReads(plan, io, out, now)
                                               : ReduceByReads(plan, io, out, now);
  return true;
}

bool MemberOps::OwnCpus() const {
  // Before the probe, as if they had (every member must take the same path:
  // the probe runs, and the bounds are asked again after it).
  return reads_.load(std::memory_order_relaxed) == Reads::kUnknown || own_cpus_;
}

bool MemberOps::ReductionReads(const OpPlan& plan) const {
  return IsReduction(plan.kind) && plan.group_size > 1 &&
         plan.in_bytes >=
             (OwnCpus() ? member_reads::kMinReduceBytes : member_reads::kMinSharedCpuBytes) &&
         plan.in_bytes * static_cast<uint64_t>(plan.group_size) <=
             member_reads::kMaxSplitReadBytes;
}

bool MemberOps::SplitsByReads(const OpPlan& plan) const {
  const uint64_t whole = OwnCpus() ? member_reads::kMaxReduceReadBytes
                                   : member_reads::kMaxSharedCpuReduceReadBytes;
  return IsReduction(plan.kind) && plan.in_bytes * static_cast<uint64_t>(plan.group_size) > whole;
}

bool MemberOps::ReadsFit(const OpPlan& plan, const MemberIoRegion& io) const {
  const bool gather =
      plan.kind == OpKind::kAllGather && plan.axis == 0 &&
      plan.in_bytes >= (OwnCpus() ? member_reads::kMinBytes : member_reads::kMinSharedCpuBytes) &&
      plan.out_bytes <= member_reads::kMaxOutBytes && !io.in_place;
  if (!(gather || ReductionReads(plan)) || reads_.load(std::memory_order_relaxed) == Reads::kNo ||
      io.in_id == nullptr || plan.signature.size() > member_reads::kMaxPlanSignature ||
      !RegionsFit(plan, io)) {
    return false;
  }
  // The buffers' ids fit the entry's payload: the input's, and a split
  // reduction's output's after it.
  const std::string* out_id = ResultWhere(io).first;
  const bool split = SplitsByReads(plan);
  if (split && out_id == nullptr) return false;
  const uint64_t out_id_bytes = split ? out_id->size() : 0;
  return io.in_id->size() <= member_reads::kMaxIdBytes &&
         out_id_bytes <= member_reads::kMaxIdBytes &&
         io.in_id->size() + out_id_bytes <= view_.layout.payload_bytes;
}

absl::Status MemberOps::Compute(const OpPlan& plan, uint8_t* out) {
  const uint32_t members = view_.layout.members;
  // A reduction or all_gather over the whole mesh: straight from the
  // payloads.
  if ((IsReduction(plan.kind) || plan.kind == OpKind::kAllGather) && plan.groups.size() == 1 &&
      plan.groups[0].size() <= kDirectGroup) {
    const std::vector<int>& group = plan.groups[0];
    const void* inputs[kDirectGroup];
    for (size_t i = 0; i < group.size(); ++i) {
      inputs[i] = view_.input(static_cast<uint32_t>(group[i]), s_, plan.in_bytes);
    }
    const OpFpMode daemon_env(plan);
    if (executor_.RunSmallGroup(plan, inputs, out)) return absl::OkStatus();
  }
  // ios_[m].in is m's payload; only this member's out is set.
  std::vector<MemberIo>& ios = ios_;
  ios.assign(members, MemberIo{});
  for (uint32_t m = 0; m < members; ++m) ios[m].in = view_.input(m, s_, plan.in_bytes);
  ios[index_].out = out;
  return RunShare(plan, /*all_inputs=*/true);
}

absl::Status MemberOps::RunShare(const OpPlan& plan, bool all_inputs) {
  const OpFpMode daemon_env(plan);
  // A small reduction or all_gather directly (Run's bytes, none of its layers).
  if (executor_.RunOneMember(plan, ios_, static_cast<int>(index_))) return absl::OkStatus();
  if (!all_inputs) {
    return absl::InternalError(absl::StrCat("member-side ", plan.signature, ": member ", index_,
                                            " has no group of its own to compute"));
  }
  return executor_.Run(plan, ios_);
}

absl::Status MemberOps::ReduceShare(const OpPlan& plan, size_t begin, size_t len, bool stream) {
  const OpFpMode daemon_env(plan);
  if (executor_.ReduceShare(plan, ios_, static_cast<int>(index_), begin, len, stream)) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("member-side ", plan.signature, ": member ", index_,
                                          " has no share of elements [", begin, ", ", begin + len,
                                          ") to reduce"));
}

void MemberOps::Advance() {
  ++s_;
  unused_key_ = 0;
}

void MemberOps::Completed(Path path) {
  ++ops_;
  std::atomic<uint64_t>& n = path_ops_[static_cast<int>(path)];
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  view_.slot(index_)->member_ops.v.store(static_cast<uint32_t>(ops_), std::memory_order_relaxed);
}

std::optional<absl::Status> MemberOps::RunIntoShared(const OpPlan& plan, const MemberIoRegion& io,
                                                     int64_t now) {
  // Written once means by one member for a reduction (the first of the
  // group, from the inputs in the segment: a small op), and by each member
  // its own block for an all_gather along the first dimension (its block is
  // then one contiguous run, at its index in the group; any size, nothing
  // goes through the segment). Over every member (one group), as the daemon
  // requires of a shared output too. Anything else, or a region the daemon
  // would refuse, goes to the daemon.
  const bool reduction = IsReduction(plan.kind);
  const bool gather = plan.kind == OpKind::kAllGather && plan.axis == 0;
  if (!(gather || (reduction && plan.in_bytes <= view_.layout.payload_bytes)) ||
      plan.groups.size() != 1 || !RegionsFit(plan, io) || io.in_place) {
    return std::nullopt;
  }
  // The members agree on the region by its buffer and offset: a member
  // naming another region makes the signatures differ, and the daemon then
  // reports who writes elsewhere, before anything is written.
  // signature_ is the second place's signature: the first place's with
  // this prefix.
  const absl::string_view kWritten(member_ops::kWrittenPlace);
  signature_.clear();
  signature_number_ = 0;  // the region is in the text
  absl::StrAppend(&signature_, kWritten, plan.signature, " into shared buffer ",
                  *io.shared_out, " at ", io.out_offset);
  if (signature_.size() > member_ops::kMaxSignature) return std::nullopt;
  const absl::string_view agree = absl::string_view(signature_).substr(kWritten.size());
  if (std::optional<absl::Status> met =
          Meet({agree}, io.in, reduction ? plan.in_bytes : 0, now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  if (gather) {
    const uint64_t block = plan.in_bytes;
    if (block > 0) {
      std::memcpy(io.out + static_cast<uint64_t>(plan.index_in_group[index_]) * block, io.in,
                  block);
    }
  } else if (plan.index_in_group[index_] == 0) {
    // The inputs stay in the segment until every member is past the next
    // place, which waits for this member.
    if (absl::Status st = Compute(plan, io.out); !st.ok()) return Abandon(st);
  }
  // This place ran member-side.
  Advance();
  // The next place: the result is written once every member is there.
  return FinishAtNextPlace(plan, "the result written into a shared buffer", Path::kShared);
}

absl::Status MemberOps::MeetAfterWork(const OpPlan& plan, Signature signature,
                                      absl::string_view what) {
  // The others are still working meanwhile: on the daemon path the op would
  // be running, which no op timeout bounds. Here the wait is bounded all the
  // same, by the op timeout plus a second per 64 MiB of the result (a floor
  // of 64 MiB/s), before the daemon is asked who is missing.
  const absl::Duration work_time =
      absl::Seconds(static_cast<double>(plan.out_bytes) / static_cast<double>(64 << 20));
  std::optional<absl::Status> done =
      Meet(signature, nullptr, 0, fastq::CoarseMonotonicNs(), op_timeout_ + work_time);
  if (!done) {
    // Only a member that does not follow the protocol (or a corrupt
    // segment) takes another path at this place.
    return Abandon(absl::InternalError(absl::StrCat(
        "member-side ", plan.signature, ": a member did not confirm ", what,
        " at the place after the op's (a corrupt segment?)")));
  }
  // Every member came: each had finished its reads when it published here,
  // so none of them reads this member's buffers any more, nor was a buffer
  // this member read changed meanwhile (a member that gives up takes its
  // entry back first: see Abandon). A member that left or broke the mesh
  // since does not change this op's outcome (as on the daemon path, where
  // an op every member submitted completes).
  return *done;
}

std::optional<absl::Status> MemberOps::FinishAtNextPlace(const OpPlan& plan,
                                                         absl::string_view what, Path path) {
  if (absl::Status done = MeetAfterWork(plan, {signature_, signature_number_}, what);
      !done.ok()) {
    return done;
  }
  Advance();
  Completed(path);
  return absl::OkStatus();
}

}  // namespace collectived::internal
