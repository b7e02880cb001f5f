// The member's side of member-side small ops (common/member_ops.h): a mapped
// mesh segment, and the op run among the members through it.
//
// Thread-safety: one op at a time per MemberOps (the Mesh serializes its
// synchronous ops).
#ifndef COLLECTIVED_CLIENT_SRC_MEMBER_OPS_H_
#define COLLECTIVED_CLIENT_SRC_MEMBER_OPS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectived/v1/collective.pb.h"
#include "common/member_ops.h"
#include "exec/cpu_executor.h"
#include "plan/op_plan.h"

namespace collectived::internal {

// Where one member's op reads and writes in this process. The SDK fills it
// from the op's arrays; an op it cannot describe goes to the daemon.
struct MemberIoRegion {
  const uint8_t* in = nullptr;  // null: not host memory this process maps
  uint64_t in_offset = 0;       // in its buffer
  const std::string* in_id = nullptr;  // its buffer's id (null: unknown)
  uint64_t in_avail = 0;        // bytes from `in` to the end of its buffer
  bool in_place = false;        // no output: the result replaces the input
  uint8_t* out = nullptr;
  uint64_t out_offset = 0;
  uint64_t out_avail = 0;  // bytes from `out` to the end of the region the op may write
  bool same_buffer = false;  // input and output are in one buffer
  // `out`'s buffer's id when it is this member's own (null: unknown).
  const std::string* out_id = nullptr;
  // Set when `out` is in a buffer the mesh shares (Mesh::AllocateShared):
  // its id, the same for every member.
  const std::string* shared_out = nullptr;
};

// What an op's plan depends on, as the SDK's call gives it (PlanOp reads no
// other field of an OpSpec for the kinds that run member-side): a loop's ops
// are matched to the last op's plan without building an OpSpec.
struct MemberOpKey {
  int kind = 0;   // v1::OpKind
  int dtype = 0;  // v1::DType; 0 without an input
  absl::Span<const int64_t> shape;
  absl::Span<const std::string> axes;
  bool no_axes = false;  // the empty tuple (axes is then empty)
  int64_t gather_axis = 0;
  bool gather_tiled = false;
};

// Moves the calling thread onto the CPUs of its affinity mask that `used`
// (1 + CPU, 0: unknown) names the fewest times, if that is fewer than
// `below` times, then gives the thread its mask back (the kernel moves a
// thread at once when its CPU leaves its mask, and leaves it where it is
// when the mask widens again). Returns 1 + the CPU it runs on now, or 0 when
// it did not move (every CPU of its mask is named `below` times or more, or
// the kernel said no). Members that share a CPU use it to part.
uint32_t MoveToLeastUsedCpu(const std::vector<uint32_t>& used, uint32_t below);

// The most members of a mesh that should share one CPU: ceil(members / cpus)
// (1 when each can have its own; `cpus` below 1 counts as 1).
inline uint32_t MembersPerCpu(uint32_t members, int cpus) {
  const uint32_t c = static_cast<uint32_t>(cpus < 1 ? 1 : cpus);
  return (members + c - 1) / c;
}

// Whether the member at `index`, last on `cpu` (1 + CPU; 0: unknown), is
// past its CPU's share: `most` members of lower index last ran there
// (`cpu_of(m)`: member m's 1 + CPU). Of the members on one CPU the first
// `most` stay (were all to move, they could land together again).
template <typename CpuOf>
bool OverCpuShare(uint32_t index, uint32_t cpu, uint32_t most, CpuOf cpu_of) {
  if (cpu == 0) return false;
  uint32_t lower_here = 0;
  for (uint32_t m = 0; m < index; ++m) lower_here += cpu_of(m) == cpu ? 1 : 0;
  return lower_here >= most;
}

// Whether `offset` is a multiple of `dt`'s size (a power of two; no offset
// is, for kInvalid's 0): a mask, not a division.
inline bool ElementAligned(uint64_t offset, DType dt) {
  const size_t es = DTypeSize(dt);
  return es != 0 && (offset & (es - 1)) == 0;
}

// All_gathers and reductions whose members read each other's inputs
// (member_reads.cc).
namespace member_reads {
// An all_gather along the first dimension reads the other members' inputs
// from their buffers, mapped read-only (one copy), rather than copying them
// through the segment (two copies) or going to the daemon, from kMinBytes of
// input per member up to kMaxOutBytes of output: below, the segment's copies
// cost no more than the second place; above, the daemon's copies
// (non-temporal, on its threads) win. Measured with collectived_perf against
// both paths, 2 and 4 members (bench/README.md): at 16 MiB of output the
// reads took 0.68x the daemon's time with 2 members and 0.76x with 4 on 2
// CPUs (medians of 8 and 6 runs); at 32 MiB, 1.4x with 2.
inline constexpr uint64_t kMinBytes = 1 << 10;
// With more members than CPUs (then every place is a futex hand-off, and
// the second costs more than the segment's copies save), from
// kMinSharedCpuBytes per member, reductions too: 4 members on 2 CPUs
// (spread two and two, SpreadOverCpus), in runs of 50 ops, read 1-2 KiB per
// member in 1.0-1.5x the segment's time (all_gather) or 1.2-1.6x (psum),
// 4 KiB in 0.9-1.1x or 1.1-1.5x, 8 KiB in 0.7x or 1.0x, 16 KiB in 0.55x or
// 0.75x, 32 KiB in 0.6x (bench/README.md, "More members than CPUs").
inline constexpr uint64_t kMinSharedCpuBytes = 8 << 10;
inline constexpr uint64_t kMaxOutBytes = 16 << 20;
// A reduction (psum, pmean, pmax, pmin) reads them from kMinReduceBytes of
// input per member (kMinSharedCpuBytes with more members than CPUs) up to
// kMaxReduceReadBytes of input over its group when every member can have a
// CPU of its own (a place then costs a cache-line transfer, not a futex
// hand-off), up to kMaxSharedCpuReduceReadBytes when not (two members then
// compute the whole result on one CPU): below, copying the input into the
// segment costs less than the second place; above, each member computing
// the whole result costs more than splitting it (4 members on 2 CPUs: equal
// at 64 KiB per member, 0.6-0.85x at 128 KiB). Measured with
// collectived_perf against the other paths, 2 members on 2 CPUs and 4 on 2
// (bench/README.md).
inline constexpr uint64_t kMinReduceBytes = 1 << 10;
inline constexpr uint64_t kMaxReduceReadBytes = 2 << 20;
inline constexpr uint64_t kMaxSharedCpuReduceReadBytes = 256 << 10;
// Above that, up to kMaxSplitReadBytes of input over its group, each
// member computes an equal share of the result from the inputs where they
// are, into its output, and copies the others' shares from their outputs
// (ReduceBySplitReads): the members then compute the result once between
// them, each on its CPU, where the daemon computes it on its threads and
// writes it to every member (4 members on 2 CPUs: 0.3-0.8x the daemon's
// time from 128 KiB to 2 MiB per member, 0.9x at 4 MiB; 2 members of 16 MiB
// each: 0.71x, cached shares as ShareStores picks them; past 32 MiB over
// the group the working set leaves the cache).
inline constexpr uint64_t kMaxSplitReadBytes = 32 << 20;
// Whether $COLLECTIVED_MEMBER_READS allows reads: unset, empty or "1" yes,
// "0" no (the segment and the daemon paths); INVALID_ARGUMENT for any other
// value. The members of a mesh read only when every one of them says yes.
absl::StatusOr<bool> AllowedByEnvironment();
// The longest op signature such an op carries (its places prefix it).
inline constexpr size_t kMaxPlanSignature =
    member_ops::kMaxSignature - member_ops::kMaxPlacePrefix;
// The longest buffer id an entry names (ids are the daemon's, far shorter).
inline constexpr size_t kMaxIdBytes = member_ops::kMinPayload;
// Another member's buffers this member keeps mapped, at most (the least
// recently read goes first).
inline constexpr size_t kMappedPerMember = 8;

// How the member that decides for its group (its first) has ReduceBySplitReads
// write the shares: with streaming stores, or through the cache. Which wins
// depends on where the CPUs are: when the members' CPUs share a cache the
// others read a cached share from it (2 MiB per member on the development
// machine: 112 µs an op against 190 streamed); when they do not, they read
// it from the writer's cache across the machine, and a streamed share from
// memory costs less (540 µs against 177). A VM's CPUs move between the two
// while a program runs, so the choice is measured, per size class (input
// over the group: 2 to 4 MiB, 4 to 8, 8 to 16, 16 to 32).
//
// A cached op's time depends on the ops before it: after a streamed op it
// runs as slowly as a streamed one, and it gets faster over the next cached
// ops (16 MiB per member: 3,400 µs down to 1,850 in 10-15 ops, where
// streamed ops take 2,600-2,900 whatever came before). So each way is
// measured in a block of kBlock ops in a row, by its least. The first
// kWarmUp ops of a class alternate and count for nothing (they fault the
// buffers in and ran 2-5 times slower than later ones); then a block
// streamed, then a block cached; then the faster, its time per byte a moving
// average, and from time to time a block of the other way, which takes over
// when its least beats that average. The first try comes kExplore ops after
// the trial; each try that loses doubles the wait, up to kMaxExplore ops (a
// try costs its block and, back to cached, the ops that get fast again);
// one that wins sets it back to kExplore. Not thread-safe (the op's thread
// only).
class ShareStores {
 public:
  static constexpr int kClasses = 4;
  static constexpr uint32_t kWarmUp = 8;
  static constexpr uint32_t kBlock = 8;
  static constexpr uint32_t kFirstOps = kWarmUp + 2 * kBlock;  // warm-up, then each way's block
  static constexpr uint32_t kExplore = 64;
  static constexpr uint32_t kMaxExplore = 1024;
  // The class of an op with `group_bytes` of input over its group.
  static int ClassOf(uint64_t group_bytes);
  // Whether the next op of `size_class` streams.
  bool Next(int size_class);
  // The op of `size_class` that streamed or not took `ns` for `bytes` (the
  // op the last Next of that class was for).
  void Record(int size_class, bool streamed, int64_t ns, uint64_t bytes);

 private:
  enum class Role : uint8_t { kUncounted, kTrial, kInUse, kTry };
  struct Class {
    uint32_t ops = 0;
    Role role = Role::kUncounted;  // of the op the last Next was for
    double trial[2] = {0, 0};      // the least of each way's block (cached, streamed); 0: none
    bool streamed = false;         // the way in use
    double in_use = 0;             // its time per byte, a moving average; 0: none yet
    double tried = 0;              // the least of the try under way; 0: none yet
    uint32_t try_left = 0;         // ops of the try still to run
    uint32_t until_try = 0;        // ops of the way in use before the next try
    uint32_t wait = kExplore;      // the wait before the next try (doubled when one loses)
  };
  Class classes_[kClasses];
};
}  // namespace member_reads

class MemberOps {
 public:
  // Asks the daemon "EXPIRED <mesh> <d> <s>": true when the mesh broke (the
  // segment says why), false when nobody is missing.
  using ExpiredFn = std::function<absl::StatusOr<bool>(uint32_t d, uint32_t s)>;
  // Asks the daemon "PEERFD <mesh> <member> <buffer id>": a read-only
  // descriptor of that member's buffer (the caller owns it) and its size.
  struct PeerFd {
    int fd = -1;
    uint64_t size = 0;
  };
  using PeerFdFn = std::function<absl::StatusOr<PeerFd>(uint32_t member, const std::string& id)>;

  // Maps segment `fd` (`bytes` long; takes the descriptor) of a mesh of
  // `shape` in which this member is `index`. `live_fd` (taken too): a
  // duplicate of the session's side socket, watched while waiting: when it
  // hangs up the daemon is gone. `peer_fd` (may be null: then the members
  // never read each other's buffers). INTERNAL when the segment is not one
  // this code can use.
  static absl::StatusOr<std::unique_ptr<MemberOps>> Map(int fd, uint64_t bytes, MeshShape shape,
                                                        int index, absl::Duration op_timeout,
                                                        int live_fd, ExpiredFn expired,
                                                        PeerFdFn peer_fd = nullptr);
  ~MemberOps();
  MemberOps(const MemberOps&) = delete;
  MemberOps& operator=(const MemberOps&) = delete;

  // Input bytes up to which an op can run member-side.
  uint64_t payload_bytes() const { return view_.layout.payload_bytes; }

  // Runs `op` among the members if it can. nullopt: it must go through the
  // daemon (the op is not one for this path, or a member took the daemon
  // path at this place, or the members' ops differ); otherwise the op's
  // outcome (an invalid op is refused here as the daemon would, and a
  // broken mesh or a missing member give the daemon's ABORTED or
  // DEADLINE_EXCEEDED).
  // `spec` builds the op's OpSpec (with the fields `key` describes): called
  // only when the op has not the last op's plan. `interrupted` (may be
  // null) is called about every kSlice while this member waits for the
  // others; once it returns true, this member gives up the op (Abandon:
  // the mesh breaks for every member) and the outcome is CANCELLED.
  std::optional<absl::Status> TryRun(const MemberOpKey& key, absl::FunctionRef<v1::OpSpec()> spec,
                                     const MemberIoRegion& io,
                                     const std::function<bool()>* interrupted = nullptr);

  // Marks the mesh broken for every member with `reason` (ABORTED): a
  // member that gave up an op in flight on the daemon path. The daemon
  // breaks the mesh at the next op of any member.
  void MarkBroken(absl::string_view reason);

  // Member-side ops this member completed, for diagnostics.
  uint64_t completed() const { return ops_; }
  // The paths a member-side op takes (README "How an op travels").
  enum class Path { kSegment, kReads, kSplit, kShared, kCount };
  // Those of them that took `path`, for diagnostics. Any thread.
  uint64_t completed(Path path) const {
    return path_ops_[static_cast<int>(path)].load(std::memory_order_relaxed);
  }

  // Whether this mesh's all_gathers read the members' inputs from their
  // buffers (member_reads): "yes", "not decided yet" (no such op yet), or
  // "no: " and why, for diagnostics. Any thread.
  std::string reads() const;

 private:
  MemberOps(void* base, uint64_t bytes, member_ops::Layout layout, MeshShape shape, int index,
            absl::Duration op_timeout, int live_fd, ExpiredFn expired, PeerFdFn peer_fd);
  // A place's signature: its text, and a number that stands for that text
  // among this member's places (0: none). Equal numbers are equal texts:
  // Meet neither writes a numbered text its entry holds already nor
  // compares it again with a peer's it found equal before (SameSignature).
  struct Signature {
    absl::string_view text;
    uint64_t number = 0;
  };
  // The places of an op, numbered per cached plan (PlaceNumber): each
  // place's text is its prefix (common/member_ops.h, none for kOp) and the
  // plan's signature, so a number stands for one text.
  enum class Place : uint64_t {
    kOp = 1,
    kProbe,
    kProbeDone,
    kRead,
    kReadDone,
    kReduced,
    kCount
  };
  uint64_t PlaceNumber(Place place) const {
    return plan_number_ * static_cast<uint64_t>(Place::kCount) + static_cast<uint64_t>(place);
  }
  // Publishes this member's entry at its next place (D, S) with `signature`
  // and `payload_bytes` of `payload`, and waits until every member's entry
  // for that place is there. OK: every entry is there with the same
  // signature and payload size (S is not advanced: the caller does once the
  // op ran). nullopt: the op goes to the daemon (a member took the daemon
  // path at this place, or the entries differ). Otherwise the op's error (a
  // broken mesh, a missing member, the daemon gone). `now`: CoarseMonotonicNs;
  // `timeout`: how long to wait before asking the daemon who is missing.
  std::optional<absl::Status> Meet(Signature signature, const uint8_t* payload,
                                   uint64_t payload_bytes, int64_t now, absl::Duration timeout);
  // Meet's: `signature` into this member's entry `mine` at place `s`,
  // unless it is there already.
  void WriteSignature(member_ops::Entry& mine, uint64_t s, Signature signature);
  // Meet's: whether member m's entry `theirs` at place `s` has the
  // signature of this member's `mine` (numbered `number`).
  bool SameSignature(uint32_t m, uint64_t s, const member_ops::Entry& theirs,
                     const member_ops::Entry& mine, uint64_t number);
  // Whether a member other than this one last ran on this member's CPU.
  bool PeerOnThisCpu() const;
  // Members that share a CPU hand it to each other through futex sleeps and
  // wake-ups, several microseconds an op, and the scheduler keeps them
  // there: the woken member runs where its waker ran. So the members spread
  // themselves over the CPUs they may use, at most ceil(members / CPUs) on
  // one: when that many members with a lower index last ran on this one's
  // CPU, this one moves to the CPU fewest members last ran on, if fewer than
  // that ran there (MoveToLeastUsedCpu; at most once per kMoveEvery). When
  // every member can have a CPU of its own (busy_poll_) they then poll apart;
  // with more members than CPUs no CPU hands over more often than it must
  // (4 members on 2 CPUs: 3 on one made each op 1.5x as long, 4 twice).
  // Meet asks at every op, before publishing: of two members on one CPU, the
  // first to arrive sleeps and the other never waits, so a check made only
  // when waiting would never move either of them.
  void SpreadOverCpus();
  // Meet's wait once polling did not find the members: sleeps on the bell
  // until `ready`, asking the daemon about missing members past `timeout`.
  // OK once ready; otherwise the op's error (the daemon gone, an interrupted
  // wait, a member-side op given up).
  absl::Status SleepUntil(absl::FunctionRef<bool()> ready, absl::string_view signature,
                          uint32_t d, uint64_t s, absl::Duration timeout);
  // An op whose output is in a buffer the mesh shares: at its place, each
  // member copies its own input into its block (all_gather) or the first
  // member computes the result (a small reduction), and a second place tells
  // every member that the result is written.
  std::optional<absl::Status> RunIntoShared(const OpPlan& plan, const MemberIoRegion& io,
                                            int64_t now);
  // An all_gather along the first dimension whose inputs the members read
  // from each other's buffers (member_reads.cc; ReadsFit has the bounds): at
  // its place each member publishes which buffer and offset its input is
  // at, copies every other member of its group from that buffer, mapped
  // read-only, straight into its output (one copy, none through the
  // segment), and a second place tells every member that its input was read
  // (it may then change it). The first such op of a mesh is preceded by
  // ProbeReads.
  std::optional<absl::Status> GatherByReads(const OpPlan& plan, const MemberIoRegion& io,
                                            int64_t now);
  // A reduction whose inputs the members read from each other's buffers,
  // the same way: at its place each member publishes where its input is,
  // computes its group's result from the inputs where they are (its own,
  // and the others' mapped read-only; none is copied into the segment),
  // and a second place tells every member that its input was read. In
  // place, the result waits in scratch_ until then.
  std::optional<absl::Status> ReduceByReads(const OpPlan& plan, const MemberIoRegion& io,
                                            uint8_t* out, int64_t now);
  // A larger reduction (SplitsByReads), the same way, in three
  // places: at the first each member publishes where its input and its
  // output are; it then writes its share of the result (ShareOf) into its
  // output, from every member's input; at the second every share is
  // written, and each member copies the others' from their outputs; the
  // third tells every member that its output was read.
  std::optional<absl::Status> ReduceBySplitReads(const OpPlan& plan, const MemberIoRegion& io,
                                                 uint8_t* out, int64_t now);
  // ReduceBySplitReads at its first place: maps every other member's input
  // (into ios_) and output (into shares_from_) of `group` (now: the entries
  // of this place are rewritten two places on). OK, or ReadFailed's error.
  absl::Status MapGroupRegions(const OpPlan& plan, const std::vector<int>& group);
  // ReduceBySplitReads after its second place: copies the other members'
  // shares of `group` from their outputs into `out`.
  void CopyOthersShares(const OpPlan& plan, const std::vector<int>& group, uint8_t* out);
  // The elements [first, first + count) of a reduction's result that the
  // member at `index_in_group` computes in ReduceBySplitReads: the group's
  // equal split, its boundaries rounded down to whole pages of input.
  static std::pair<size_t, size_t> ShareOf(const OpPlan& plan, int index_in_group);
  // Whether `plan` (with `io`) is an op GatherByReads, ReduceByReads or
  // ReduceBySplitReads runs.
  bool ReadsFit(const OpPlan& plan, const MemberIoRegion& io) const;
  // ReadsFit's bounds for a reduction.
  bool ReductionReads(const OpPlan& plan) const;
  // Whether every member has a CPU of its own, as the probe said (before
  // it, true).
  bool OwnCpus() const;
  // Whether a reduction that reads runs by ReduceBySplitReads (else by
  // ReduceByReads): above kMaxReduceReadBytes over its group, or
  // kMaxSharedCpuReduceReadBytes when a member has no CPU of its own.
  bool SplitsByReads(const OpPlan& plan) const;
  // When `plan` runs by reads (ProbeReads first, if the mesh has not
  // decided yet): runs it with GatherByReads, ReduceByReads or
  // ReduceBySplitReads (`out`: where the result goes), sets `result` to
  // TryRun's outcome and returns true.
  // False when it does not run so.
  bool RanByReads(const OpPlan& plan, const MemberIoRegion& io, uint8_t* out, int64_t now,
                  std::optional<absl::Status>* result);
  // Two places at which every member says whether it will read (its
  // COLLECTIVED_MEMBER_READS, a way to ask the daemon for buffers, the same
  // user as every other member), before `plan`'s op (whose signature the
  // places carry): the members then all read from each other, or none of
  // them ever does in this mesh. OK once reads_ is decided; otherwise Meet's
  // outcome.
  std::optional<absl::Status> ProbeReads(const OpPlan& plan, int64_t now);
  // This member's vote in ProbeReads (its entry at place S holds the
  // members' uids): OK, or why not.
  absl::Status WhyNotRead() const;
  // Publishes in this member's entry at place S where its input is: `id`
  // (null at the probe, which writes the member's uid instead) at `offset`.
  // And, for ReduceBySplitReads, where its output is (`out_id` at
  // `out_offset`; null otherwise).
  void PublishWhere(const std::string* id, uint64_t offset, const std::string* out_id,
                    uint64_t out_offset);
  // Where `io`'s result goes: its output's buffer id (null: unknown) and
  // offset, or in place its input's.
  static std::pair<const std::string*, uint64_t> ResultWhere(const MemberIoRegion& io) {
    return io.in_place ? std::make_pair(io.in_id, io.in_offset)
                       : std::make_pair(io.out_id, io.out_offset);
  }
  enum class Side { kInput, kOutput };
  // Where `bytes` of member m's input or output (`side`) of `dtype` (its
  // entry `e`) are in its buffer, mapped read-only (mapped now if it is not
  // yet), or why they are not (outside the buffer, or not at a multiple of
  // the element size).
  absl::StatusOr<const uint8_t*> MemberRegion(uint32_t m, const member_ops::Entry& e, Side side,
                                              uint64_t bytes, DType dtype);
  // Sets signature_ to the last place's signature of an op that reads
  // (ProbeReads, GatherByReads, ReduceByReads, ReduceBySplitReads): the
  // first place's with kDonePlace before it, numbered kProbeDone or
  // kReadDone (built once per plan); returns the first place's, `first`
  // (kProbe or kRead): its prefix and `plan`'s signature, a view into
  // signature_. `plan` is the cached plan.
  Signature TwoPlaces(Place first, const OpPlan& plan);
  // The first place of GatherByReads and ReduceByReads: publishes where
  // this member's input is and meets the others (signature_ becomes the
  // second place's signature). Meet's outcome.
  std::optional<absl::Status> MeetToRead(const OpPlan& plan, const MemberIoRegion& io,
                                         int64_t now);
  // The error (after Abandon) of a read of member m's input or output that
  // failed.
  absl::Status ReadFailed(const OpPlan& plan, uint32_t m, Side side, const absl::Status& why);
  // Member m's buffer `id`, mapped read-only: its base and size.
  absl::StatusOr<std::pair<const uint8_t*, uint64_t>> MappedPeer(uint32_t m,
                                                                 absl::string_view id);
  // The last place of an op that takes more than one (RunIntoShared and
  // the reads; signature_ is its signature): once every member is there,
  // `what` is done; the op completes, counted under `path`. Otherwise the
  // wait's error.
  std::optional<absl::Status> FinishAtNextPlace(const OpPlan& plan, absl::string_view what,
                                                Path path);
  // A place after this member's work on `plan` (`signature`), waited for
  // with room for the others' work: OK once every member is there;
  // otherwise the wait's error, or (another path taken there, which no
  // member following the protocol takes) INTERNAL naming `what`.
  absl::Status MeetAfterWork(const OpPlan& plan, Signature signature, absl::string_view what);
  // Runs `plan` on the inputs in the segment at place S, writing this
  // member's result to `out` (the daemon's code and floating-point
  // environment).
  absl::Status Compute(const OpPlan& plan, uint8_t* out);
  // Runs this member's share of `plan` on ios_, in the daemon's
  // floating-point environment: its own group's result (RunOneMember), or
  // when that does not apply, every group's (ios_ must then hold every
  // member's input; `all_inputs` says so, else this is INTERNAL).
  absl::Status RunShare(const OpPlan& plan, bool all_inputs);
  // Elements [begin, begin + len) of this member's group's result of the
  // reduction `plan`, from ios_, the same way (with streaming stores if
  // `stream`).
  absl::Status ReduceShare(const OpPlan& plan, size_t begin, size_t len, bool stream);
  // This member is past its place: S moves on.
  void Advance();
  // An op completed member-side by `path`: counted, and shown to the daemon
  // (for its diagnostics).
  void Completed(Path path);
  // Whether the daemon's end of the side socket is still open.
  bool DaemonAlive() const;
  // The segment's status once the daemon marked it broken, else OK.
  absl::Status Broken() const;
  // Gives up on an op this member published and cannot finish: marks the
  // segment broken (the other members must not wait for it, nor run its
  // place without it) and returns `status`.
  absl::Status Abandon(absl::Status status);
  // UNAVAILABLE: the daemon went away while this member waited.
  static absl::Status DaemonLost();
  // Calls interrupted_ (set); one that throws gives the op up (Abandon)
  // before the exception goes on.
  bool AskInterrupted(absl::string_view signature);

  void* base_;
  uint64_t bytes_;
  member_ops::View view_;
  const MeshShape shape_;
  const uint32_t index_;
  const absl::Duration op_timeout_;
  const int live_fd_;  // duplicate of the side socket, polled for hangup
  ExpiredFn expired_;
  // TryRun's `interrupted`, while it runs (Meet calls it).
  const std::function<bool()>* interrupted_ = nullptr;
  // MembersPerCpu for the CPUs its thread could use when the mesh formed.
  const uint32_t members_per_cpu_;
  // Whether a waiter polls without yielding first: when this process may
  // use at least as many CPUs as the mesh has members (members_per_cpu_ 1;
  // else a busy peer could hold the CPU another member needs).
  const bool busy_poll_;
  // Runs the op on this member's share: the daemon's own code.
  CpuExecutor executor_;
  std::vector<MemberIo> ios_;  // TryRun's executor arguments, kept to reuse
  // The last place's signature of an op of several, kept to reuse, and its
  // number (0: none).
  std::string signature_;
  uint64_t signature_number_ = 0;
  std::vector<uint8_t> scratch_;  // ReduceByReads' results in place, kept to reuse
  // ReduceBySplitReads': each member's output (null: this member's, and
  // the other groups'), and its second place's signature, kept to reuse.
  std::vector<const uint8_t*> shares_from_;
  std::string reduced_place_;
  uint64_t reduced_place_number_ = 0;
  member_reads::ShareStores share_stores_;  // when this member decides for its group
  // Whether the members of this mesh read each other's inputs
  // (ProbeReads decides, the same for every member), and why not.
  // reads_ is stored once (release), after reads_off_, by the op's thread;
  // reads() may look from any thread.
  enum class Reads { kUnknown, kYes, kNo };
  std::atomic<Reads> reads_{Reads::kUnknown};
  // Set by ProbeReads before reads_ (and only read by the op's thread):
  // whether every member has a CPU of its own (a member's busy_poll_ is its
  // own; the probe makes it common), which picks the reads' bounds (without,
  // each place is a futex hand-off, and two members share a CPU's work).
  bool own_cpus_ = false;
  std::string reads_off_;
  PeerFdFn peer_fd_;
  // The other members' buffers mapped read-only, by member (at most
  // kMappedPerMember each; `used`: when last read, in reads).
  struct PeerMapping {
    std::string id;
    const uint8_t* base = nullptr;
    uint64_t size = 0;
    uint64_t used = 0;
  };
  std::vector<std::vector<PeerMapping>> peer_maps_;
  uint64_t peer_reads_ = 0;
  uint64_t s_ = 0;    // member-side places done (S)
  uint64_t ops_ = 0;  // member-side ops done (an op into a shared buffer takes two places)
  std::atomic<uint64_t> path_ops_[static_cast<int>(Path::kCount)] = {};
  // The key this member published and has not run member-side (0: none).
  uint64_t unused_key_ = 0;
  // The last op's plan, and the key it is the plan of (a loop plans once).
  struct CachedKey {
    int kind = 0;
    int dtype = 0;
    std::vector<int64_t> shape;
    std::vector<std::string> axes;
    bool no_axes = false;
    int64_t gather_axis = 0;
    bool gather_tiled = false;
  };
  // Whether the cached plan is `key`'s.
  bool HasPlanFor(const MemberOpKey& key) const;
  std::optional<OpPlan> cached_plan_;
  CachedKey cached_key_;
  // Counts the plans cached so far (the current one's number; 0: none).
  uint64_t plan_number_ = 0;
  // By entry (S mod 2): the number of the signature Meet last wrote there,
  // or 0 when it had none (Meet then compares before writing).
  uint64_t signature_written_[2] = {0, 0};
  // By member and entry (m * 2 + S mod 2): the member's Entry::sig_gen and
  // this member's signature number when Meet last found the two texts
  // equal (number 0: never).
  struct Compared {
    uint64_t gen = 0;
    uint64_t number = 0;
  };
  std::vector<Compared> compared_;
  int64_t alive_checked_ns_ = 0;  // when DaemonAlive last said yes
  uint32_t last_cpu_ = 0;         // the CPU last stored in this member's slot
  int64_t last_move_ns_ = 0;      // when it last moved (SpreadOverCpus)
};

}  // namespace collectived::internal

#endif  // COLLECTIVED_CLIENT_SRC_MEMBER_OPS_H_
