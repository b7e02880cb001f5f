// Member-side small ops: the layout of a mesh generation's shared segment.
//
// For an op whose input is small (at most Header::payload_bytes), the
// members of a mesh of one host exchange through a segment instead of
// through the daemon: each publishes its op's signature and input in its
// slot, and once every member's entry for that place in the mesh's op order
// is there and the signatures agree, each computes the result itself, with
// the daemon's own CPU executor code on the same plan, so every member gets
// the bits the daemon would have written.
//
// The daemon creates the segment when the mesh forms (a sealed memfd), hands
// it over the side socket ("SEGMENT <mesh id>") to members of that
// generation only, and stays the authority:
//  - it counts each member's accepted daemon-path ops (daemon_ops), so a
//    member waiting for a peer's entry sees at once that the peer took the
//    daemon path for this place, and takes it too;
//  - it marks the segment broken (status and message) when the mesh breaks
//    (a member died or left, a daemon-path op timed out), and wakes every
//    waiter;
//  - a waiter whose deadline passes asks it ("EXPIRED <mesh id>"): it reads
//    the counters, names the members that are missing, and breaks the mesh;
//  - a member that gives up marks the segment broken itself; the daemon
//    breaks the mesh at the first daemon-path op that follows.
// The daemon writes the words it owns and reads the entries' keys and
// signature text only, bounded and checked: a corrupt segment hurts only the
// members of its mesh.
//
// Place in the op order. A member's next op is at (D, S): D its daemon-path
// ops the daemon accepted (daemon_ops[member]), S its member-side ops done.
// Every member makes the same choice at each place, so D and S agree among
// members at the same place. A member publishes an entry keyed (D, S) only
// for a synchronous op with no daemon-path op of its own in flight (so D is
// exact), and then waits until, for every other member m, either
// daemon_ops[m] > D (m took the daemon path here: so does the waiter) or m's
// entry at (D, S) is there. With every entry there, equal signatures run the
// op member-side; otherwise every member takes the daemon path, which
// reports the mismatch as it always does.
//
// Two entries per member (S mod 2) are enough: a member publishes (D, S + 2)
// only after completing (D', S + 1) member-side, which needed every member's
// (D', S + 1) entry, published only after that member was done with S.
//
// Wake-ups: each member sleeps on its own bell (fast_queue.h's Ring /
// SpinThenSleep); whoever publishes rings every other member's bell.
//
// An all_gather or a reduction whose members read each other's inputs
// (mapping each other's buffers read-only, client/src/member_reads.cc)
// carries no input: its entry names the input's buffer and offset, and a
// second place tells the owners that their inputs were read.
#ifndef COLLECTIVED_COMMON_MEMBER_OPS_H_
#define COLLECTIVED_COMMON_MEMBER_OPS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/fast_queue.h"

namespace collectived::member_ops {

inline constexpr uint32_t kMagic = 0x3153434d;  // "MCS1"
inline constexpr uint32_t kVersion = 5;
// Header::code: which code plans and computes the ops (the daemon's
// COLLECTIVED_MEMBER_OPS_CODE, cmake/MemberOpsCode.cmake). A member runs
// ops member-side only when its SDK's is the same: the daemon and every
// member then compute with the same code, so the bits cannot differ.
inline constexpr size_t kCodeBytes = 64;
// Signature text kept in an entry (longer ones take the daemon path).
inline constexpr size_t kMaxSignature = 240;
// The segment of a mesh is at most this big: the payload per entry shrinks
// with the number of members (and a mesh too big for kMinPayload gets none).
inline constexpr size_t kMaxSegmentBytes = size_t{16} << 20;
inline constexpr size_t kMinPayload = 64;
inline constexpr size_t kMaxReason = 1024;
// Header::broken while its reason is being written.
inline constexpr uint32_t kBrokenWriting = 0xffffffff;

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t members;
  uint32_t payload_bytes;  // input bytes an entry holds
  uint64_t entry_bytes;    // stride of entries
  uint64_t slot_offset;    // of member 0's slot
  uint64_t entry_offset;   // of member 0's first entry
  int64_t op_timeout_ms;   // the mesh's op timeout when it formed
  char code[kCodeBytes];   // NUL-terminated (see kCodeBytes)
  // Daemon: 0 while the mesh works; else the absl::StatusCode every waiter
  // returns, with `reason` (written before `broken`).
  alignas(64) fastq::Word broken;
  uint32_t reason_len;
  char reason[kMaxReason];
};

// Per member, on cache lines of its own.
struct Slot {
  fastq::Word bell;      // futex the member sleeps on
  fastq::Word sleeping;  // nonzero while it sleeps (or is about to)
  // Daemon: the member's daemon-path ops accepted so far (D), low 32 bits.
  fastq::Word daemon_ops;
  // Member: its member-side ops completed (S), low 32 bits; the daemon only
  // shows it (diagnostics), never acts on it.
  fastq::Word member_ops;
  // Member: 1 + the CPU it last published from (0: unknown); a waiter does
  // not spin while a member it waits for last ran on its own CPU.
  fastq::Word cpu;
};

// An input of at most this many bytes is in the entry's first cache line,
// beside its key: a member waiting for the others then fetches one line of
// each (the one it polls), not two.
inline constexpr size_t kSmallInput = 40;

struct Entry {
  // Member: (D + 1) << 24 | (S & 0xffffff), stored last (seq_cst); 0: none.
  std::atomic<uint64_t> key;
  // Member: how many times it wrote new text into `signature` (the text
  // differed from what was there). A member that found a peer's signature
  // equal to its own compares it again only once either text changed
  // (client/src/member_ops.cc, MemberOps::SameSignature): in the key's
  // line, which the waiter has fetched already.
  uint64_t sig_gen;
  uint32_t sig_len;
  uint32_t in_bytes;
  // The input, when it is at most kSmallInput bytes (else in the payload).
  uint8_t small[kSmallInput];
  char signature[kMaxSignature];
  // CLOCK_MONOTONIC, when the member published it (diagnostics only: not in
  // the key's line, which the others poll).
  int64_t published_ns;
  // Member, for an op whose members read each other's inputs
  // (client/src/member_reads.cc): the input's buffer (its id, in_id_len
  // bytes, is the start of the entry's payload) and offset there; for a
  // reduction that splits its result, the output's too (its id follows the
  // input's in the payload); at the probe's first place, the member's uid.
  uint32_t in_id_len;
  // The place after the probe (client/src/member_reads.cc): kNoReads when
  // this member said no (then no member reads in this mesh), kNoCpuOfItsOwn
  // when it has no CPU of its own (then every member reads from larger
  // sizes, and splits a reduction's result from a smaller one).
  uint32_t read_failed;
  uint64_t in_offset;
  uint32_t uid;
  uint32_t out_id_len;
  uint64_t out_offset;
  // For a reduction that splits its result, set by the first member of its
  // group: whether every member of the group writes its share with
  // streaming stores (nonzero) or through the cache.
  uint32_t stream_shares;
  // `payload_bytes` of input follow, 64-byte aligned.
};
inline constexpr size_t kEntryHeaderBytes = 64 * ((sizeof(Entry) + 63) / 64);
// Entry::read_failed's bits.
inline constexpr uint32_t kNoReads = 1;
inline constexpr uint32_t kNoCpuOfItsOwn = 2;

static_assert(sizeof(Header) <= 2048);
static_assert(sizeof(Entry) <= 384, "an entry's header keeps its size");
static_assert(offsetof(Entry, small) + kSmallInput == 64, "a small input shares the key's line");
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline uint64_t Key(uint64_t d, uint64_t s) { return ((d + 1) << 24) | (s & 0xffffff); }

// An entry's signature starts with its op's ("psum f32[4] over (i)"). The
// places of an op that takes two, and of the probe before the first op whose
// members read each other's buffers, put one of these before it: read, the
// first place of such an op; probe, the probe's; done, the place after
// either; reduced, the place between of a reduction that splits its result
// (each member's share of it is written); written, the place after an op
// into a mesh-shared buffer.
// (Character arrays: std::string_view and the SDK's absl::string_view,
// which may be a type of its own, both take them.)
inline constexpr char kReadPlace[] = "read: ";
inline constexpr char kProbePlace[] = "probe: ";
inline constexpr char kDonePlace[] = "done: ";
inline constexpr char kWrittenPlace[] = "written: ";
inline constexpr char kReducedPlace[] = "reduced: ";
// The most these prefixes add to an op's signature.
inline constexpr size_t kMaxPlacePrefix = 16;
static_assert(sizeof(kDonePlace) - 1 + sizeof(kProbePlace) - 1 <= kMaxPlacePrefix &&
              sizeof(kDonePlace) - 1 + sizeof(kReadPlace) - 1 <= kMaxPlacePrefix &&
              sizeof(kWrittenPlace) - 1 <= kMaxPlacePrefix &&
              sizeof(kReducedPlace) - 1 <= kMaxPlacePrefix);

// What a place's signature names: the op, and which of its stages the place
// is (empty for an op's only place). Either can be anything a member wrote.
struct PlaceName {
  std::string_view op;
  std::string_view stage;
};
inline PlaceName NameOfPlace(std::string_view signature) {
  auto strip = [&signature](std::string_view prefix) {
    if (signature.substr(0, prefix.size()) != prefix) return false;
    signature.remove_prefix(prefix.size());
    return true;
  };
  if (strip(kWrittenPlace)) return {signature, "confirming the result written"};
  if (strip(kReducedPlace)) return {signature, "confirming its share of the result reduced"};
  const bool done = strip(kDonePlace);
  if (strip(kProbePlace)) return {signature, "asking whether the members read each other's buffers"};
  if (strip(kReadPlace)) {
    return {signature, done ? "confirming the reads of the members' buffers"
                            : "reading the members' buffers"};
  }
  return {signature, done ? "confirming" : ""};
}

// The layout of a segment for `members` members with `payload_bytes` of
// input per entry (rounded up to 64). 0 bytes when it does not fit
// kMaxSegmentBytes.
struct Layout {
  uint32_t members = 0;
  uint32_t payload_bytes = 0;
  uint64_t entry_bytes = 0;
  uint64_t slot_offset = 0;
  uint64_t entry_offset = 0;
  uint64_t total_bytes = 0;

  static Layout For(uint32_t members, uint64_t payload_bytes) {
    Layout l;
    if (members == 0 || members > 4096) return l;
    payload_bytes = (payload_bytes + 63) / 64 * 64;
    const uint64_t fixed = 2048 + uint64_t{members} * sizeof(Slot);
    // Shrink the payload until the segment (rounded to pages) fits.
    const uint64_t entry_offset = (fixed + 4095) / 4096 * 4096;
    auto total = [&](uint64_t payload) {
      return (entry_offset + uint64_t{members} * 2 * (kEntryHeaderBytes + payload) + 4095) /
             4096 * 4096;
    };
    while (payload_bytes >= kMinPayload && total(payload_bytes) > kMaxSegmentBytes) {
      payload_bytes /= 2;
      payload_bytes = payload_bytes / 64 * 64;
    }
    if (payload_bytes < kMinPayload) return l;
    l.members = members;
    l.payload_bytes = static_cast<uint32_t>(payload_bytes);
    l.entry_bytes = kEntryHeaderBytes + payload_bytes;
    l.slot_offset = 2048;
    l.entry_offset = entry_offset;
    l.total_bytes = total(payload_bytes);
    return l;
  }
};

// Views of a mapped segment, with the layout kept by the viewer: the
// offsets in the header are never read back (any member can write them).
struct View {
  uint8_t* base = nullptr;
  Layout layout;

  Header* header() const { return reinterpret_cast<Header*>(base); }
  Slot* slot(uint32_t m) const {
    return reinterpret_cast<Slot*>(base + layout.slot_offset) + m;
  }
  Entry* entry(uint32_t m, uint64_t s) const {
    return reinterpret_cast<Entry*>(base + layout.entry_offset +
                                    (uint64_t{m} * 2 + (s & 1)) * layout.entry_bytes);
  }
  uint8_t* payload(uint32_t m, uint64_t s) const {
    return reinterpret_cast<uint8_t*>(entry(m, s)) + kEntryHeaderBytes;
  }
  // Where an op's input of `bytes` is in the entry (the same size for
  // every member of the op: the signatures say so).
  uint8_t* input(uint32_t m, uint64_t s, uint64_t bytes) const {
    return bytes <= kSmallInput ? entry(m, s)->small : payload(m, s);
  }
};

// Writes a fresh header into a zeroed region of l.total_bytes; `code`
// (truncated to kCodeBytes - 1) is the daemon's code identity.
inline void Init(void* base, const Layout& l, int64_t op_timeout_ms, std::string_view code) {
  auto* h = static_cast<Header*>(base);
  h->magic = kMagic;
  h->version = kVersion;
  h->members = l.members;
  h->payload_bytes = l.payload_bytes;
  h->entry_bytes = l.entry_bytes;
  h->slot_offset = l.slot_offset;
  h->entry_offset = l.entry_offset;
  h->op_timeout_ms = op_timeout_ms;
  const size_t n = code.size() < kCodeBytes ? code.size() : kCodeBytes - 1;
  std::memcpy(h->code, code.data(), n);
  h->code[n] = '\0';
}

// The code identity in the header of a mapped region of `bytes` (empty when
// the region is too small for a header), copied once: a member may change it.
inline std::string_view CodeOf(const void* base, uint64_t bytes, char (&copy)[kCodeBytes]) {
  if (bytes < sizeof(Header)) return {};
  std::memcpy(copy, static_cast<const Header*>(base)->code, kCodeBytes);
  copy[kCodeBytes - 1] = '\0';
  return std::string_view(copy, std::strlen(copy));
}

// The layout of a mapped region of `bytes` that holds a segment for
// `members` members this code can use (the layout its header claims is the
// one For gives), else a layout of 0 bytes. Reads each header word once: a
// member may change them meanwhile.
inline Layout ValidLayout(const void* base, uint64_t bytes, uint32_t members) {
  if (bytes < sizeof(Header)) return {};
  const auto* h = static_cast<const Header*>(base);
  if (h->magic != kMagic || h->version != kVersion || h->members != members) return {};
  const uint32_t payload_bytes = h->payload_bytes;
  const Layout l = Layout::For(members, payload_bytes);
  if (l.total_bytes == 0 || l.total_bytes > bytes || l.payload_bytes != payload_bytes ||
      l.entry_bytes != h->entry_bytes || l.slot_offset != h->slot_offset ||
      l.entry_offset != h->entry_offset) {
    return {};
  }
  return l;
}

// Rings every member's bell but `except` (-1: all).
inline void RingAll(const View& v, int64_t except) {
  for (uint32_t m = 0; m < v.layout.members; ++m) {
    if (static_cast<int64_t>(m) == except) continue;
    fastq::Ring(v.slot(m)->bell, v.slot(m)->sleeping);
  }
}

// Where member `m` stands at place (d, s) (key Key(d, s)): its entry is
// there, it took the daemon path at this place (its D is past d), or
// neither yet. A member that ran this place member-side may already be on
// the daemon path for its next op, so a D past d means the daemon path only
// if the entry is not there after D was read: the member may have
// published, run this place and sent its next op to the daemon between the
// two loads (its entry stays until it publishes at s + 2, which needs this
// waiter's entry at s + 1). Taking that for the daemon path sent this
// member's op to the daemon alone, where it met the other members' next op,
// and left this member a place behind them.
enum class Presence { kHere, kDaemonPath, kNotYet };
inline Presence PresenceAt(const View& v, uint32_t m, uint32_t d, uint64_t s, uint64_t key) {
  const std::atomic<uint64_t>& entry_key = v.entry(m, s)->key;
  if (entry_key.load(std::memory_order_seq_cst) == key) return Presence::kHere;
  const uint32_t ops = v.slot(m)->daemon_ops.v.load(std::memory_order_seq_cst);
  if (static_cast<int32_t>(ops - d) <= 0) return Presence::kNotYet;
  return entry_key.load(std::memory_order_seq_cst) == key ? Presence::kHere
                                                          : Presence::kDaemonPath;
}

// Marks the segment broken with status code `code` and `reason` unless it
// already is (the first status stays), and wakes every member: claims the
// word with kBrokenWriting, writes the reason, then publishes the code, so
// a reader that sees the code sees the reason. Used by the daemon and by a
// member that gives up on an op.
inline void MarkBroken(const View& v, uint32_t code, const char* reason, size_t reason_len) {
  Header* h = v.header();
  uint32_t expected = 0;
  if (!h->broken.v.compare_exchange_strong(expected, kBrokenWriting, std::memory_order_seq_cst)) {
    return;
  }
  const size_t len = reason_len < kMaxReason ? reason_len : kMaxReason;
  std::memcpy(h->reason, reason, len);
  h->reason_len = static_cast<uint32_t>(len);
  h->broken.v.store(code, std::memory_order_seq_cst);
  RingAll(v, -1);
}

}  // namespace collectived::member_ops

#endif  // COLLECTIVED_COMMON_MEMBER_OPS_H_
