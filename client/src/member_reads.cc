// All_gathers and reductions whose members read each other's inputs from
// the owners' buffers, which the reader maps read-only (the daemon hands out
// the descriptor, "PEERFD"): an all_gather copies them once, straight into
// the reader's output, and a reduction computes from them where they are,
// where the segment path copies every input in (and an all_gather's out
// again). See member_ops.h (GatherByReads, ReduceByReads, ProbeReads).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "client/src/member_ops.h"
#include "common/fast_queue.h"
#include "exec/stream_copy.h"

namespace collectived::internal {

using member_ops::Entry;

namespace member_reads {

int ShareStores::ClassOf(uint64_t group_bytes) {
  int c = 0;
  for (uint64_t top = kMaxReduceReadBytes * 2; c + 1 < kClasses && group_bytes > top; top *= 2) ++c;
  return c;
}

bool ShareStores::Next(int size_class) {
  Class& c = classes_[size_class];
  const uint32_t n = c.ops < kFirstOps ? c.ops++ : kFirstOps;
  if (n < kWarmUp) {
    c.role = Role::kUncounted;
    return n % 2 == 1;
  }
  if (n < kFirstOps) {  // a block streamed, then a block cached
    c.role = Role::kTrial;
    return n < kWarmUp + kBlock;
  }
  if (c.role == Role::kTrial) {  // the trial is over: the faster way, the first try ahead
    c.streamed = c.trial[1] != 0 && (c.trial[0] == 0 || c.trial[1] < c.trial[0]);
    c.in_use = c.trial[c.streamed ? 1 : 0];
    c.until_try = kExplore;
    c.wait = kExplore;
  } else if (c.role == Role::kTry && c.try_left == 0) {  // a try is over
    if (c.tried != 0 && (c.in_use == 0 || c.tried < c.in_use)) {
      c.streamed = !c.streamed;
      c.in_use = c.tried;
      c.wait = kExplore;
    } else {
      c.wait = std::min(2 * c.wait, kMaxExplore);
    }
    c.until_try = c.wait;
  }
  if (c.until_try == 0 && c.role != Role::kTry) {  // a try starts
    c.try_left = kBlock;
    c.tried = 0;
  }
  if (c.try_left > 0) {
    --c.try_left;
    c.role = Role::kTry;
    return !c.streamed;
  }
  --c.until_try;
  c.role = Role::kInUse;
  return c.streamed;
}

void ShareStores::Record(int size_class, bool streamed, int64_t ns, uint64_t bytes) {
  if (bytes == 0 || ns <= 0) return;
  Class& c = classes_[size_class];
  const double x = static_cast<double>(ns) / static_cast<double>(bytes);
  auto least = [x](double& v) { v = v == 0 ? x : std::min(v, x); };
  switch (c.role) {
    case Role::kUncounted:
      return;
    case Role::kTrial:
      least(c.trial[streamed ? 1 : 0]);  // an op is only ever slowed
      return;
    case Role::kTry:
      least(c.tried);
      return;
    case Role::kInUse:
      c.in_use = c.in_use == 0 ? x : 0.75 * c.in_use + 0.25 * x;
      return;
  }
}

absl::StatusOr<bool> AllowedByEnvironment() {
  const char* env = getenv("COLLECTIVED_MEMBER_READS");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "1") return true;
  if (std::string_view(env) == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "COLLECTIVED_MEMBER_READS='", env, "': expected 1 (members read each other's buffers, the "
      "default) or 0 (they do not)"));
}

}  // namespace member_reads

void MemberOps::PublishWhere(const std::string* id, uint64_t offset, const std::string* out_id,
                             uint64_t out_offset) {
  Entry* mine = view_.entry(index_, s_);
  uint8_t* payload = view_.payload(index_, s_);
  mine->in_id_len = id == nullptr ? 0 : static_cast<uint32_t>(id->size());
  if (id != nullptr) std::memcpy(payload, id->data(), id->size());
  mine->in_offset = offset;
  mine->out_id_len = out_id == nullptr ? 0 : static_cast<uint32_t>(out_id->size());
  if (out_id != nullptr) std::memcpy(payload + mine->in_id_len, out_id->data(), out_id->size());
  mine->out_offset = out_offset;
  mine->stream_shares = 0;
  mine->read_failed = 0;
}

absl::StatusOr<std::pair<const uint8_t*, uint64_t>> MemberOps::MappedPeer(uint32_t m,
                                                                         absl::string_view id) {
  std::vector<PeerMapping>& maps = peer_maps_[m];
  for (PeerMapping& p : maps) {
    if (p.id == id) {
      p.used = ++peer_reads_;
      return std::make_pair(p.base, p.size);
    }
  }
  absl::StatusOr<PeerFd> got = peer_fd_(m, std::string(id));
  if (!got.ok()) return got.status();
  void* base = got->size == 0 ? MAP_FAILED
                              : mmap(nullptr, got->size, PROT_READ, MAP_SHARED, got->fd, 0);
  const int err = errno;
  close(got->fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mapping member ", m, "'s buffer '", id, "' (",
                                            got->size, " bytes): ",
                                            got->size == 0 ? "empty" : strerror(err)));
  }
  if (maps.size() >= member_reads::kMappedPerMember) {
    // The least recently read goes (its pages are the owner's to free).
    auto oldest = std::min_element(maps.begin(), maps.end(), [](const auto& a, const auto& b) {
      return a.used < b.used;
    });
    munmap(const_cast<uint8_t*>(oldest->base), oldest->size);
    maps.erase(oldest);
  }
  maps.push_back(
      PeerMapping{std::string(id), static_cast<const uint8_t*>(base), got->size, ++peer_reads_});
  return std::make_pair(maps.back().base, got->size);
}

absl::StatusOr<const uint8_t*> MemberOps::MemberRegion(uint32_t m, const Entry& e, Side side,
                                                       uint64_t bytes, DType dtype) {
  // Each word once: the member (or a corrupt segment) may change them.
  const uint32_t in_id_len = e.in_id_len;
  const bool output = side == Side::kOutput;
  const uint32_t id_len = output ? e.out_id_len : in_id_len;
  const uint64_t id_at = output ? in_id_len : 0;
  const uint64_t offset = output ? e.out_offset : e.in_offset;
  const char* what = output ? "output" : "input";
  if (id_len == 0 || id_len > member_reads::kMaxIdBytes || id_at > member_reads::kMaxIdBytes ||
      id_at + id_len > view_.layout.payload_bytes) {
    return absl::InternalError(absl::StrCat("member ", m, "'s entry names no buffer for its ",
                                            what, " (", id_len, " bytes at ", id_at, ")"));
  }
  const absl::string_view id(reinterpret_cast<const char*>(view_.payload(m, s_)) + id_at, id_len);
  absl::StatusOr<std::pair<const uint8_t*, uint64_t>> mapped = MappedPeer(m, id);
  if (!mapped.ok()) return mapped.status();
  const auto [base, size] = *mapped;
  if (offset > size || bytes > size - offset) {
    return absl::InternalError(absl::StrCat("member ", m, "'s ", what, " (", bytes, " bytes at ",
                                            offset, ") is not within its buffer '", id, "' (",
                                            size, " bytes)"));
  }
  // The kernels load whole elements (the buffer's base is page-aligned).
  if (!ElementAligned(offset, dtype)) {
    return absl::InternalError(absl::StrCat("member ", m, "'s ", what, " offset ", offset,
                                            " is not a multiple of its element size ",
                                            DTypeSize(dtype)));
  }
  return base + offset;
}

MemberOps::Signature MemberOps::TwoPlaces(Place first, const OpPlan& plan) {
  const bool probe = first == Place::kProbe;
  const uint64_t done_number = PlaceNumber(probe ? Place::kProbeDone : Place::kReadDone);
  if (signature_number_ != done_number) {
    signature_.clear();
    absl::StrAppend(&signature_, member_ops::kDonePlace,
                    probe ? member_ops::kProbePlace : member_ops::kReadPlace, plan.signature);
    signature_number_ = done_number;
  }
  return {absl::string_view(signature_).substr(absl::string_view(member_ops::kDonePlace).size()),
          PlaceNumber(first)};
}

std::optional<absl::Status> MemberOps::MeetToRead(const OpPlan& plan, const MemberIoRegion& io,
                                                  int64_t now) {
  const Signature first = TwoPlaces(Place::kRead, plan);
  PublishWhere(io.in_id, io.in_offset, nullptr, 0);
  return Meet(first, nullptr, 0, now, op_timeout_);
}

absl::Status MemberOps::ReadFailed(const OpPlan& plan, uint32_t m, Side side,
                                   const absl::Status& why) {
  // The daemon refused a member's buffer (it left, or freed the buffer
  // while its op ran), or its entry is not what it published.
  return Abandon(absl::AbortedError(absl::StrCat(
      "member-side ", plan.signature, ": member ", index_, " cannot read member ", m, "'s ",
      side == Side::kOutput ? "output" : "input", ": ", why.message())));
}

absl::Status MemberOps::WhyNotRead() const {
  if (!member_reads::AllowedByEnvironment().value_or(true)) {
    return absl::FailedPreconditionError("COLLECTIVED_MEMBER_READS=0");
  }
  if (!peer_fd_) return absl::FailedPreconditionError("no way to ask the daemon for buffers");
  const uint32_t uid = view_.entry(index_, s_)->uid;
  for (uint32_t m = 0; m < view_.layout.members; ++m) {
    if (const uint32_t theirs = view_.entry(m, s_)->uid; theirs != uid) {
      // The daemon hands out another member's buffers to its own user only.
      return absl::FailedPreconditionError(absl::StrCat(
          "member ", m, " runs as uid ", theirs, ", member ", index_, " as ", uid));
    }
  }
  return absl::OkStatus();
}

std::optional<absl::Status> MemberOps::ProbeReads(const OpPlan& plan, int64_t now) {
  // The places name the op they come before (a member waiting at one is
  // waiting in that op).
  const Signature first = TwoPlaces(Place::kProbe, plan);
  // First place: every member says who it runs as.
  PublishWhere(nullptr, 0, nullptr, 0);
  view_.entry(index_, s_)->uid = static_cast<uint32_t>(getuid());
  if (std::optional<absl::Status> met = Meet(first, nullptr, 0, now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  const absl::Status why_not = WhyNotRead();
  Advance();
  // Second place: every member says whether it reads, and whether it has a
  // CPU of its own (the reads' bounds depend on whether every member has
  // one).
  view_.entry(index_, s_)->read_failed = (why_not.ok() ? 0 : member_ops::kNoReads) |
                                         (busy_poll_ ? 0 : member_ops::kNoCpuOfItsOwn);
  std::optional<absl::Status> probed =
      Meet({signature_, signature_number_}, nullptr, 0, fastq::CoarseMonotonicNs(), op_timeout_);
  if (!probed) {
    return Abandon(absl::InternalError(
        "member-side probe of reads: a member did not confirm it at the place after the "
        "probe's (a corrupt segment?)"));
  }
  if (!probed->ok()) return probed;
  // Every member sees the same words: all read, or none does.
  uint32_t said_no = 0;
  for (uint32_t m = 0; m < view_.layout.members; ++m) said_no |= view_.entry(m, s_)->read_failed;
  const bool all_read = (said_no & member_ops::kNoReads) == 0;
  own_cpus_ = all_read && (said_no & member_ops::kNoCpuOfItsOwn) == 0;
  Advance();
  if (!all_read) {
    reads_off_ = why_not.ok() ? "another member said no" : std::string(why_not.message());
  }
  reads_.store(all_read ? Reads::kYes : Reads::kNo, std::memory_order_release);
  return absl::OkStatus();
}

std::string MemberOps::reads() const {
  switch (reads_.load(std::memory_order_acquire)) {
    case Reads::kYes: return "yes";
    case Reads::kNo: return absl::StrCat("no: ", reads_off_);
    case Reads::kUnknown: break;
  }
  return "not decided yet";
}

std::optional<absl::Status> MemberOps::GatherByReads(const OpPlan& plan, const MemberIoRegion& io,
                                                     int64_t now) {
  if (std::optional<absl::Status> met = MeetToRead(plan, io, now); !met || !met->ok()) return met;
  // Each member of this one's group, at its index in the group: one
  // contiguous block of the output (a gather along the first dimension).
  const uint64_t block = plan.in_bytes;
  for (int m : plan.groups[plan.group_of[index_]]) {
    uint8_t* to = io.out + static_cast<uint64_t>(plan.index_in_group[m]) * block;
    if (static_cast<uint32_t>(m) == index_) {
      std::memmove(to, io.in, block);
      continue;
    }
    absl::StatusOr<const uint8_t*> from =
        MemberRegion(m, *view_.entry(m, s_), Side::kInput, block, plan.dtype);
    if (!from.ok()) return ReadFailed(plan, m, Side::kInput, from.status());
    std::memcpy(to, *from, block);
  }
  Advance();
  // The next place: every member's input was read once every member is
  // there (until then its owner must not change it).
  return FinishAtNextPlace(plan, "its reads of the others' inputs", Path::kReads);
}

std::optional<absl::Status> MemberOps::ReduceByReads(const OpPlan& plan, const MemberIoRegion& io,
                                                     uint8_t* out, int64_t now) {
  if (std::optional<absl::Status> met = MeetToRead(plan, io, now); !met || !met->ok()) return met;
  ios_.assign(view_.layout.members, MemberIo{});
  for (int m : plan.groups[plan.group_of[index_]]) {
    if (static_cast<uint32_t>(m) == index_) {
      ios_[m].in = io.in;
      continue;
    }
    absl::StatusOr<const uint8_t*> from =
        MemberRegion(m, *view_.entry(m, s_), Side::kInput, plan.in_bytes, plan.dtype);
    if (!from.ok()) return ReadFailed(plan, m, Side::kInput, from.status());
    ios_[m].in = *from;
  }
  // A result over this member's input (in place) waits until the others
  // read that input.
  const bool over_input = out == io.in;
  if (over_input) scratch_.resize(plan.out_bytes);
  ios_[index_].out = over_input ? scratch_.data() : out;
  if (absl::Status st = RunShare(plan, /*all_inputs=*/false); !st.ok()) return Abandon(st);
  Advance();
  std::optional<absl::Status> done =
      FinishAtNextPlace(plan, "its reads of the others' inputs", Path::kReads);
  if (over_input && done && done->ok()) std::memcpy(out, scratch_.data(), plan.out_bytes);
  return done;
}

std::pair<size_t, size_t> MemberOps::ShareOf(const OpPlan& plan, int index_in_group) {
  // Shares as equal as whole pages (of input elements) make them: each
  // boundary is the equal split's, rounded down to a page.
  const size_t es = DTypeSize(plan.dtype);
  const size_t count = plan.in_bytes / es;
  const size_t page = std::max<size_t>(1, 4096 / es);
  const size_t members = static_cast<size_t>(plan.group_size);
  // (count * i fits: count is at most kMaxSplitReadBytes.)
  auto boundary = [&](size_t i) { return i >= members ? count : count * i / members / page * page; };
  const size_t begin = boundary(static_cast<size_t>(index_in_group));
  return {begin, boundary(static_cast<size_t>(index_in_group) + 1) - begin};
}

absl::Status MemberOps::MapGroupRegions(const OpPlan& plan, const std::vector<int>& group) {
  ios_.assign(view_.layout.members, MemberIo{});
  shares_from_.assign(view_.layout.members, nullptr);
  for (int m : group) {
    if (static_cast<uint32_t>(m) == index_) continue;
    const Entry& e = *view_.entry(m, s_);
    absl::StatusOr<const uint8_t*> in = MemberRegion(m, e, Side::kInput, plan.in_bytes, plan.dtype);
    if (!in.ok()) return ReadFailed(plan, m, Side::kInput, in.status());
    absl::StatusOr<const uint8_t*> shared =
        MemberRegion(m, e, Side::kOutput, plan.out_bytes, plan.out_dtype);
    if (!shared.ok()) return ReadFailed(plan, m, Side::kOutput, shared.status());
    ios_[m].in = *in;
    shares_from_[m] = *shared;
  }
  return absl::OkStatus();
}

void MemberOps::CopyOthersShares(const OpPlan& plan, const std::vector<int>& group,
                                 uint8_t* out) {
  const size_t out_es = DTypeSize(plan.out_dtype);
  const bool stream = executor_.Streams(plan);
  for (int m : group) {
    if (static_cast<uint32_t>(m) == index_) continue;
    const auto [from, n] = ShareOf(plan, plan.index_in_group[m]);
    if (n == 0) continue;
    uint8_t* to = out + from * out_es;
    const uint8_t* share = shares_from_[m] + from * out_es;
    if (stream) {
      StreamCopy(to, share, n * out_es);
    } else {
      std::memcpy(to, share, n * out_es);
    }
  }
}

std::optional<absl::Status> MemberOps::ReduceBySplitReads(const OpPlan& plan,
                                                          const MemberIoRegion& io, uint8_t* out,
                                                          int64_t now) {
  // First place: every member publishes where its input and its output are.
  const Signature first = TwoPlaces(Place::kRead, plan);
  const auto [out_id, out_offset] = ResultWhere(io);
  PublishWhere(io.in_id, io.in_offset, out_id, out_offset);
  // The group's first member says how its members write their shares.
  const std::vector<int>& group = plan.groups[plan.group_of[index_]];
  const bool decides = static_cast<uint32_t>(group[0]) == index_;
  const int size_class = member_reads::ShareStores::ClassOf(plan.in_bytes * group.size());
  if (decides) view_.entry(index_, s_)->stream_shares = share_stores_.Next(size_class) ? 1 : 0;
  if (std::optional<absl::Status> met = Meet(first, nullptr, 0, now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  const int64_t started = fastq::MonotonicNs();
  const bool stream = view_.entry(static_cast<uint32_t>(group[0]), s_)->stream_shares != 0;
  if (absl::Status mapped = MapGroupRegions(plan, group); !mapped.ok()) return mapped;
  // This member's share of the result, from every input. In place, only
  // this member reads its input's share: the others read their own.
  ios_[index_].in = io.in;
  ios_[index_].out = out;
  const auto [begin, len] = ShareOf(plan, plan.index_in_group[index_]);
  if (absl::Status st = ReduceShare(plan, begin, len, stream); !st.ok()) return Abandon(st);
  Advance();
  // Second place: every share is written (and every input read).
  if (reduced_place_number_ != PlaceNumber(Place::kReduced)) {
    reduced_place_.clear();
    absl::StrAppend(&reduced_place_, member_ops::kReducedPlace, plan.signature);
    reduced_place_number_ = PlaceNumber(Place::kReduced);
  }
  if (absl::Status met = MeetAfterWork(plan, {reduced_place_, reduced_place_number_},
                                       "its share of the result reduced");
      !met.ok()) {
    return met;
  }
  Advance();
  CopyOthersShares(plan, group, out);
  // Third place: every member read the others' shares (until then each
  // owner must not change its output).
  std::optional<absl::Status> done =
      FinishAtNextPlace(plan, "its reads of the others' shares", Path::kSplit);
  if (decides && done && done->ok()) {
    share_stores_.Record(size_class, stream, fastq::MonotonicNs() - started, plan.in_bytes);
  }
  return done;
}

}  // namespace collectived::internal
