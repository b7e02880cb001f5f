// All_gathers whose members read each other's inputs: one copy from each
// owner's memory straight into the reader's output (process_vm_readv, the
// kernel's cross-memory attach), where the segment path copies every input
// in and out again. See member_ops.h (GatherByReads, ProbeReads).
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "client/src/member_ops.h"
#include "common/fast_queue.h"

namespace collectived::internal {

using member_ops::Entry;

namespace member_reads {

uint64_t NewToken() {
  uint64_t token = 0;
  if (getrandom(&token, sizeof token, 0) != static_cast<ssize_t>(sizeof token)) {
    // No entropy source: the time and this process still tell processes
    // apart (the token only guards against a pid naming another process).
    token = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            (static_cast<uint64_t>(getpid()) << 32);
  }
  return token == 0 ? 1 : token;
}

absl::StatusOr<Mode> ModeFromEnvironment() {
  const char* env = getenv("COLLECTIVED_MEMBER_READS");
  if (env == nullptr || std::string_view(env) == "auto" || *env == '\0') return Mode::kAuto;
  if (std::string_view(env) == "always") return Mode::kAlways;
  if (std::string_view(env) == "never") return Mode::kNever;
  return absl::InvalidArgumentError(absl::StrCat("COLLECTIVED_MEMBER_READS='", env,
                                                 "': expected auto, always or never"));
}

}  // namespace member_reads

namespace {

// Place signatures: the op's with these prefixes (the second place's is the
// first's with kDone before it).
constexpr absl::string_view kDone = "done: ";
constexpr absl::string_view kRead = "read: ";
constexpr absl::string_view kProbe = "probe: every member reads every other";
constexpr absl::string_view kProbed = "done: probe: every member reads every other";

static_assert(kDone.size() + kRead.size() + member_reads::kMaxPlanSignature <=
              member_ops::kMaxSignature);

}  // namespace

void MemberOps::PublishWhere(const uint8_t* in) {
  Entry* mine = view_.entry(index_, s_);
  mine->pid = static_cast<int32_t>(getpid());
  mine->read_failed = 0;
  mine->in_addr = reinterpret_cast<uint64_t>(in);
  mine->token_addr = reinterpret_cast<uint64_t>(&token_);
  mine->token = token_;
}

absl::Status MemberOps::ReadMember(uint32_t m, const Entry& e, uint8_t* to,
                                   uint64_t bytes) const {
  // Each word once: the member (or a corrupt segment) may change them.
  const pid_t pid = e.pid;
  const uint64_t in_addr = e.in_addr, token_addr = e.token_addr, token = e.token;
  uint64_t word = ~token;
  iovec local[2] = {{&word, sizeof word}, {to, bytes}};
  iovec remote[2] = {{reinterpret_cast<void*>(token_addr), sizeof word},
                     {reinterpret_cast<void*>(in_addr), bytes}};
  const ssize_t n = process_vm_readv(pid, local, bytes > 0 ? 2 : 1, remote, bytes > 0 ? 2 : 1, 0);
  if (n < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "member ", index_, " could not read member ", m, "'s memory (pid ", pid,
        ", process_vm_readv): ", strerror(errno)));
  }
  if (static_cast<uint64_t>(n) != sizeof word + bytes) {
    return absl::FailedPreconditionError(absl::StrCat("member ", index_, " read ", n, " of ",
                                                      sizeof word + bytes, " bytes of member ", m,
                                                      "'s memory (pid ", pid, ")"));
  }
  if (word != token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pid ", pid, " is not member ", m, "'s process as member ", index_,
        " sees it (another PID namespace?)"));
  }
  return absl::OkStatus();
}

std::optional<absl::Status> MemberOps::ProbeReads(int64_t now) {
  // First place: every member says where its token is.
  PublishWhere(reinterpret_cast<const uint8_t*>(&token_));
  if (std::optional<absl::Status> met = Meet(kProbe, nullptr, 0, now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  // This member's vote: yes when it reads every other member and wants to.
  absl::Status why_not = absl::OkStatus();
  const auto mode = member_reads::ModeFromEnvironment().value_or(member_reads::Mode::kAuto);
  if (mode == member_reads::Mode::kNever) {
    why_not = absl::FailedPreconditionError("COLLECTIVED_MEMBER_READS=never");
  } else if (mode == member_reads::Mode::kAuto && !busy_poll_) {
    // Its two places per op cost more than the copies they save when the
    // members take turns on CPUs.
    why_not = absl::FailedPreconditionError(absl::StrCat(
        "member ", index_, " may use fewer CPUs than the mesh has members "
        "(COLLECTIVED_MEMBER_READS=always reads all the same)"));
  }
  for (uint32_t m = 0; m < view_.layout.members && why_not.ok(); ++m) {
    if (m != index_) why_not = ReadMember(m, *view_.entry(m, s_), nullptr, 0);
  }
  const bool failed = !why_not.ok();
  Advance();
  // Second place: every member says whether it could read all the others.
  view_.entry(index_, s_)->read_failed = failed ? 1 : 0;
  std::optional<absl::Status> probed = Meet(kProbed, nullptr, 0, fastq::MonotonicNs(), op_timeout_);
  if (!probed) {
    return Abandon(absl::InternalError(
        "member-side probe of reads: a member did not confirm it at the place after the "
        "probe's (a corrupt segment?)"));
  }
  if (!probed->ok()) return probed;
  // Every member sees the same words: all read, or none does.
  bool all_read = true;
  for (uint32_t m = 0; m < view_.layout.members; ++m) {
    all_read = all_read && view_.entry(m, s_)->read_failed == 0;
  }
  Advance();
  if (!all_read) {
    reads_off_ = failed ? std::string(why_not.message()) : "another member said no";
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
  // signature_: the second place's; the first's is its tail.
  signature_.clear();
  absl::StrAppend(&signature_, kDone, kRead, plan.signature);
  const absl::string_view read = absl::string_view(signature_).substr(kDone.size());
  PublishWhere(io.in);
  if (std::optional<absl::Status> met = Meet(read, nullptr, 0, now, op_timeout_);
      !met || !met->ok()) {
    return met;
  }
  // Each member of this one's group, at its index in the group: one
  // contiguous block of the output (a gather along the first dimension).
  const uint64_t block = plan.in_bytes;
  for (int m : plan.groups[plan.group_of[index_]]) {
    uint8_t* to = io.out + static_cast<uint64_t>(plan.index_in_group[m]) * block;
    if (static_cast<uint32_t>(m) == index_) {
      std::memmove(to, io.in, block);
      continue;
    }
    if (absl::Status st = ReadMember(m, *view_.entry(m, s_), to, block); !st.ok()) {
      // The probe said every member reads every other: the member died,
      // or its entry is not what it published.
      return Abandon(absl::AbortedError(absl::StrCat("member-side ", plan.signature, ": ",
                                                     st.message())));
    }
  }
  Advance();
  // The next place: every member's input was read once every member is
  // there (until then its owner must not change it). Bounded like the op,
  // plus a second per 64 MiB read (a floor of 64 MiB/s).
  const absl::Duration read_time =
      absl::Seconds(static_cast<double>(plan.out_bytes) / static_cast<double>(64 << 20));
  std::optional<absl::Status> done =
      Meet(signature_, nullptr, 0, fastq::MonotonicNs(), op_timeout_ + read_time);
  if (!done) {
    return Abandon(absl::InternalError(absl::StrCat(
        "member-side ", plan.signature, ": a member did not confirm its reads at the place "
        "after the op's (a corrupt segment?)")));
  }
  if (!done->ok()) return *done;
  Advance();
  Completed();
  return absl::OkStatus();
}

}  // namespace collectived::internal
