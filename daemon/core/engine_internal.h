// The engine's helpers that more than one of its files use (daemon/core/
// engine*.cc): names and texts for messages, range checks, the member-side
// segment's words as diagnostics read them. Only the engine includes it.
#ifndef COLLECTIVED_DAEMON_CORE_ENGINE_INTERNAL_H_
#define COLLECTIVED_DAEMON_CORE_ENGINE_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "plan/op_request.h"
#include "common/member_ops.h"
#include "plan/op_plan.h"

namespace collectived::engine_internal {

inline std::string CoordString(const std::vector<int>& c) {
  return absl::StrCat("(", absl::StrJoin(c, ","), ")");
}

inline std::string AxesString(const MeshShape& s) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < s.names.size(); ++i) parts.push_back(absl::StrCat(s.names[i], "=", s.sizes[i]));
  return absl::StrJoin(parts, ",");
}

inline int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// Checks that [offset, offset + bytes) lies in a buffer of `size` bytes and
// that offset is aligned to `align`.
inline absl::Status CheckRange(absl::string_view what, const std::string& id, int64_t offset,
                        uint64_t bytes, size_t size, size_t align) {
  if (offset < 0) {
    return absl::OutOfRangeError(absl::StrCat(what, " offset ", offset, " is negative"));
  }
  uint64_t off = static_cast<uint64_t>(offset);
  if (off > size || bytes > size - off) {
    return absl::OutOfRangeError(absl::StrCat(what, " range [", off, ", ", off, "+", bytes,
                                              ") exceeds buffer '", id, "' of ", size,
                                              " bytes"));
  }
  if (align > 1 && off % align != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " offset ", off, " is not a multiple of the element size ", align));
  }
  return absl::OkStatus();
}

// Checks the declared length of a region (BufferRegion::size_bytes), when the
// client gave one, against the `bytes` of `data` (e.g. "result f32[8]") that
// the op reads or writes there.
inline absl::Status CheckDeclared(absl::string_view kind, absl::string_view what,
                           const BufferRegion& ref, uint64_t bytes, absl::string_view data) {
  if (!ref.size_bytes.has_value()) return absl::OkStatus();
  const int64_t declared = *ref.size_bytes;
  if (declared < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, ": ", what, " size_bytes ", declared, " is negative"));
  }
  if (static_cast<uint64_t>(declared) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, ": ", what, " region of ", declared, " bytes is smaller than the ", data,
        " of ", bytes, " bytes; give ", what == "output" ? "an output" : "an input",
        " of at least ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

// How much later than its deadline a cluster mesh's joiner times out on its
// own while the registry is being asked (a Form is in flight), so that the
// registry's answer, which names the missing members of every host, comes
// first. Without a Form (no registry reached) it times out at its deadline.
inline constexpr absl::Duration kClusterJoinGrace = absl::Milliseconds(500);
// How soon a registration that found no coordinator is tried again.
inline constexpr absl::Duration kRegisterRetry = absl::Milliseconds(250);

// How errors name a kind of memory.
inline std::string KindLabel(absl::string_view kind) {
  if (kind == "memfd") return "host (memfd)";
  if (kind == "cuda") return "CUDA";
  return std::string(kind);
}

// The member-side ops member `index` reports in segment `seg` (0 for an
// index outside it): shown, never acted on.
inline int64_t ReportedMemberSideOps(const member_ops::View& seg, int index) {
  if (index < 0 || static_cast<uint32_t>(index) >= seg.layout.members) return 0;
  return seg.slot(static_cast<uint32_t>(index))->member_ops.v.load(std::memory_order_relaxed);
}

// The most member-side ops any member of `seg` reports.
inline int64_t MostMemberSideOps(const member_ops::View& seg) {
  int64_t most = 0;
  for (uint32_t m = 0; m < seg.layout.members; ++m) {
    most = std::max(most, ReportedMemberSideOps(seg, static_cast<int>(m)));
  }
  return most;
}

// Text a member wrote in the segment (it may write anything there):
// at most `limit` of its `len` bytes, anything but printable ASCII as '?'.
inline std::string MemberText(const char* text, size_t len, size_t limit) {
  std::string out(text, std::min(len, limit));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

// The op a member's entry waits in, from its signature: the op's own
// signature, then which stage of it the place is, if it is one of two
// ("psum f32[4096] over (i) (reading the members' buffers)").
inline std::string EntrySignature(const member_ops::Entry& e) {
  const std::string text = MemberText(e.signature, e.sig_len, member_ops::kMaxSignature);
  const member_ops::PlaceName place = member_ops::NameOfPlace(text);
  const absl::string_view op(place.op.data(), place.op.size());
  if (place.stage.empty()) return std::string(op);
  return absl::StrCat(op, " (", absl::string_view(place.stage.data(), place.stage.size()), ")");
}

// The kind of a member-side op from its signature's first word ("psum
// f32[4] over (i)"); kUnspecified when it names none (a member wrote it).
inline OpKind KindOfSignature(absl::string_view signature) {
  const absl::string_view word = signature.substr(0, signature.find(' '));
  for (int k = 1; k < kNumOpKinds; ++k) {
    if (OpKindName(static_cast<OpKind>(k)) == word) return static_cast<OpKind>(k);
  }
  return OpKind::kUnspecified;
}

// Why a member marked the segment broken (it gave up on a member-side op),
// bounded and printable (a member may write anything there).
inline std::string MemberBrokenReason(const member_ops::View& v) {
  const member_ops::Header* h = v.header();
  const uint32_t code = h->broken.v.load(std::memory_order_seq_cst);
  const std::string reason = MemberText(h->reason, h->reason_len, member_ops::kMaxReason);
  if (reason.empty() || code == member_ops::kBrokenWriting) {
    return "a member marked the mesh's member-side segment broken";
  }
  return reason;
}

// Whether place key `a` is after place key `b` (member_ops::Key: D first,
// then S, whose 24 bits wrap: compared modulo 2^24).
inline bool KeyAfter(uint64_t a, uint64_t b) {
  if ((a >> 24) != (b >> 24)) return (a >> 24) > (b >> 24);
  const uint32_t ds = static_cast<uint32_t>((a - b) & 0xffffff);
  return ds != 0 && ds < (1u << 23);
}

}  // namespace collectived::engine_internal

#endif  // COLLECTIVED_DAEMON_CORE_ENGINE_INTERNAL_H_
