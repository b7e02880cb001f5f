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

namespace collectived::internal {

using member_ops::Entry;

namespace member_reads {

absl::StatusOr<bool> AllowedByEnvironment() {
  const char* env = getenv("COLLECTIVED_MEMBER_READS");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "1") return true;
  if (std::string_view(env) == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "COLLECTIVED_MEMBER_READS='", env, "': expected 1 (members read each other's buffers, the "
      "default) or 0 (they do not)"));
}

}  // namespace member_reads

void MemberOps::PublishWhere(const std::string* id, uint64_t offset) {
  Entry* mine = view_.entry(index_, s_);
  mine->in_id_len = id == nullptr ? 0 : static_cast<uint32_t>(id->size());
  if (id != nullptr) std::memcpy(view_.payload(index_, s_), id->data(), id->size());
  mine->in_offset = offset;
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

absl::StatusOr<const uint8_t*> MemberOps::MemberInput(uint32_t m, const Entry& e,
                                                      uint64_t bytes, DType dtype) {
  // Each word once: the member (or a corrupt segment) may change them.
  const uint32_t id_len = e.in_id_len;
  const uint64_t offset = e.in_offset;
  if (id_len == 0 || id_len > std::min<uint64_t>(member_reads::kMaxIdBytes,
                                                 view_.layout.payload_bytes)) {
    return absl::InternalError(
        absl::StrCat("member ", m, "'s entry names no buffer (", id_len, " bytes)"));
  }
  const absl::string_view id(reinterpret_cast<const char*>(view_.payload(m, s_)), id_len);
  absl::StatusOr<std::pair<const uint8_t*, uint64_t>> mapped = MappedPeer(m, id);
  if (!mapped.ok()) return mapped.status();
  const auto [base, size] = *mapped;
  if (offset > size || bytes > size - offset) {
    return absl::InternalError(absl::StrCat("member ", m, "'s input (", bytes, " bytes at ",
                                            offset, ") is not within its buffer '", id, "' (",
                                            size, " bytes)"));
  }
  // The kernels load whole elements (the buffer's base is page-aligned).
  if (!ElementAligned(offset, dtype)) {
    return absl::InternalError(absl::StrCat("member ", m, "'s input offset ", offset,
                                            " is not a multiple of its element size ",
                                            DTypeSize(dtype)));
  }
  return base + offset;
}

absl::string_view MemberOps::TwoPlaces(absl::string_view first_prefix, const OpPlan& plan) {
  signature_.clear();
  absl::StrAppend(&signature_, member_ops::kDonePlace, first_prefix, plan.signature);
  return absl::string_view(signature_).substr(absl::string_view(member_ops::kDonePlace).size());
}

std::optional<absl::Status> MemberOps::MeetToRead(const OpPlan& plan, const MemberIoRegion& io,
                                                  int64_t now) {
  const absl::string_view first = TwoPlaces(member_ops::kReadPlace, plan);
  PublishWhere(io.in_id, io.in_offset);
  return Meet(first, nullptr, 0, now, op_timeout_);
}

absl::Status MemberOps::ReadFailed(const OpPlan& plan, uint32_t m, const absl::Status& why) {
  // The daemon refused a member's buffer (it left, or freed the buffer
  // while its op ran), or its entry is not what it published.
  return Abandon(absl::AbortedError(absl::StrCat("member-side ", plan.signature, ": member ",
                                                 index_, " cannot read member ", m,
                                                 "'s input: ", why.message())));
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
  const absl::string_view first = TwoPlaces(member_ops::kProbePlace, plan);
  // First place: every member says who it runs as.
  PublishWhere(nullptr, 0);
  view_.entry(index_, s_)->uid = static_cast<uint32_t>(getuid());
  if (std::optional<absl::Status> met = Meet(first, nullptr, 0, now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  const absl::Status why_not = WhyNotRead();
  Advance();
  // Second place: every member says whether it reads, and whether it has a
  // CPU of its own (where a reduction reads only if every member has one).
  view_.entry(index_, s_)->read_failed = (why_not.ok() ? 0 : member_ops::kNoReads) |
                                         (busy_poll_ ? 0 : member_ops::kNoReductionReads);
  std::optional<absl::Status> probed =
      Meet(signature_, nullptr, 0, fastq::CoarseMonotonicNs(), op_timeout_);
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
  reduction_reads_ = all_read && (said_no & member_ops::kNoReductionReads) == 0;
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
    absl::StatusOr<const uint8_t*> from = MemberInput(m, *view_.entry(m, s_), block, plan.dtype);
    if (!from.ok()) return ReadFailed(plan, m, from.status());
    std::memcpy(to, *from, block);
  }
  Advance();
  // The next place: every member's input was read once every member is
  // there (until then its owner must not change it).
  return FinishAtNextPlace(plan, "its reads of the others' inputs");
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
        MemberInput(m, *view_.entry(m, s_), plan.in_bytes, plan.dtype);
    if (!from.ok()) return ReadFailed(plan, m, from.status());
    ios_[m].in = *from;
  }
  // A result over this member's input (in place) waits until the others
  // read that input.
  const bool over_input = out == io.in;
  if (over_input) scratch_.resize(plan.out_bytes);
  ios_[index_].out = over_input ? scratch_.data() : out;
  if (absl::Status st = RunShare(plan, /*all_inputs=*/false); !st.ok()) return Abandon(st);
  Advance();
  std::optional<absl::Status> done = FinishAtNextPlace(plan, "its reads of the others' inputs");
  if (over_input && done && done->ok()) std::memcpy(out, scratch_.data(), plan.out_bytes);
  return done;
}

}  // namespace collectived::internal
