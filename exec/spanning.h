// Ops whose members' memory lies in several partitions: the GPUs of one host
// (CudaExecutor, NCCL between them) and the hosts of a cluster mesh
// (GlooCrossHostMesh).
//
// A partition is memory one same-partition executor runs on (MemberIo::device
// names it). RunSpanning splits an op into exchanges between partitions
// (Fabric::Exchange), runs of the op inside each partition (Fabric::RunLocal)
// and local copies, so that every member gets the bits a single-partition run
// gives: the reductions combine every member's input in group order, on one
// partition (lanes, replication) or continuing the same fold from partition
// to partition (chain).
//
// Three schedules:
//  - lanes (psum/pmean/pmax/pmin of one group whose result has the input's
//    dtype): the elements are cut into one lane per partition; each
//    partition receives its lane of every remote member's input, reduces the
//    lane over all members in group order into its members' outputs, and
//    sends the reduced lane to every other partition. Per partition, with k
//    local members of S bytes each and P partitions: k·S·(P−1)/P bytes sent
//    and S·(P−1)/P received for the lanes of others, then S/P·(P−1) sent and
//    S·(P−1)/P received for the results: with one member per partition that
//    is the 2·(P−1)/P·S of a ring all-reduce, and the result is exact.
//  - replication (everything else: data movement, several groups, results
//    wider than the input): each partition receives the inputs of remote
//    members of its groups that its members' results need (all of them for
//    reductions, all_gather, psum_scatter and all_to_all; the sources of its
//    destinations for ppermute; the root for broadcast) and runs the op
//    there, writing only its own members' outputs.
//
//  - chain (asked for with SpanningOptions::chain; the schedule of hosts):
//    psum/pmean/pmax/pmin of one group whose members form one contiguous run
//    per partition in group order (partition p0's members first, then p1's,
//    ...), some partition holding several of them, and whose fold can
//    continue from a partial result with the same bits (max/min of every
//    dtype; sums and means of float32, float64 and float16, which round to
//    the dtype after every addition; integer sums, which wrap; not
//    bfloat16/float8 sums, which accumulate wider than the dtype, and not
//    bool). The elements are cut into chunks; partition h folds chunk c of
//    the running result of the partitions before it with its own members'
//    inputs, in group order, and passes it on; the last one writes the
//    result, which travels back down the chain. Chunk c is folded on
//    partition h at step c + h, so the partitions work on different chunks
//    at once. Every member gets exactly the one-partition bits (the group's
//    fold order, kept), and each partition sends about S of running results
//    and S of results (the last and the first only one of the two) whatever
//    its number of members: the members of one partition are combined
//    there, only one partial crosses. With two partitions that is what a
//    ring all-reduce sends (S each); with P > 2 the middle ones send 2S
//    where a ring sends 2(P-1)/P*S, and every link carries S each way. With
//    one member per partition the lanes run instead (the same bytes as a
//    ring, every partition sending and receiving at once).
//
// Thread-safety: RunSpanning uses only the fabric it is given; a Fabric is
// used by one op at a time.
#ifndef COLLECTIVED_EXEC_SPANNING_H_
#define COLLECTIVED_EXEC_SPANNING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "exec/executor.h"
#include "plan/op_plan.h"

namespace collectived {

// `bytes` from `src` on partition `src_part` to `dst` on `dst_part`.
struct Transfer {
  int src_part = 0;
  const uint8_t* src = nullptr;
  int dst_part = 0;
  uint8_t* dst = nullptr;
  uint64_t bytes = 0;
};

// What moves bytes between partitions and runs ops inside one. Calls are
// ordered: each call's work happens after the work of earlier calls on the
// partitions it touches has finished reading and writing what this call
// touches (a fabric on GPU streams gets this from stream order), and Finish
// waits for everything.
class Fabric {
 public:
  virtual ~Fabric() = default;
  // `bytes` of memory on partition `part`, valid until Finish returns.
  virtual absl::StatusOr<uint8_t*> Scratch(int part, uint64_t bytes) = 0;
  // Every transfer, as one batch (transfers within one partition included).
  virtual absl::Status Exchange(const std::vector<Transfer>& transfers) = 0;
  // `plan` over `io`, every region on partition `part`. A null `out` is a
  // member whose result is written elsewhere: its input may be read, its
  // output is not written. `plan` and `io` stay valid until Finish.
  virtual absl::Status RunLocal(int part, const OpPlan& plan, const std::vector<MemberIo>& io) = 0;
  // `bytes` from `src` to `dst`, both on partition `part`.
  virtual absl::Status Copy(int part, uint8_t* dst, const uint8_t* src, uint64_t bytes) = 0;
  // Waits for everything issued since the last Finish and frees the scratch;
  // the first error of that work.
  virtual absl::Status Finish() = 0;
};

// Bytes a spanning op moved besides what a one-partition run moves.
struct SpanningTraffic {
  uint64_t exchanged = 0;  // between partitions
  uint64_t copied = 0;     // inside partitions, and to scratch
};

// Whether the members of `io` lie in more than one partition.
bool SpansPartitions(const std::vector<MemberIo>& io);

struct SpanningOptions {
  // Reductions use the chain schedule where it applies (see above), the
  // lanes otherwise.
  bool chain = false;
  // The chain's chunk size (at most 256 chunks an op).
  uint64_t chain_chunk_bytes = 256 * 1024;
  // Reductions whose input is smaller than this are replicated instead of
  // cut into lanes or chained: one exchange (every partition gets every
  // input it lacks) instead of two or more, for ops where the number of
  // exchanges, not the bytes, sets the time.
  uint64_t lanes_min_bytes = 0;
};

// Runs `plan` over `io` (one entry per member, MemberIo::device its
// partition) through `fabric`, and returns when every output is written
// (Finish is called, error or not). `traffic` may be null.
absl::Status RunSpanning(const OpPlan& plan, const std::vector<MemberIo>& io, Fabric* fabric,
                         SpanningTraffic* traffic, const SpanningOptions& options = {});

}  // namespace collectived

#endif  // COLLECTIVED_EXEC_SPANNING_H_
