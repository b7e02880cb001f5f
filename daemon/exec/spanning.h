// Ops whose members' memory lies in several partitions: the GPUs of one host
// today (CudaExecutor, NCCL between them), other hosts later.
//
// A partition is memory one same-partition executor runs on (MemberIo::device
// names it). RunSpanning splits an op into exchanges between partitions
// (Fabric::Exchange), runs of the op inside each partition (Fabric::RunLocal)
// and local copies, so that every member gets the bits a single-partition run
// gives: the reductions still combine every member's input in group order on
// one partition, never partial results.
//
// Two schedules:
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
// Thread-safety: RunSpanning uses only the fabric it is given; a Fabric is
// used by one op at a time.
#ifndef COLLECTIVED_DAEMON_EXEC_SPANNING_H_
#define COLLECTIVED_DAEMON_EXEC_SPANNING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/exec/executor.h"
#include "daemon/plan/op_plan.h"

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

// Runs `plan` over `io` (one entry per member, MemberIo::device its
// partition) through `fabric`, and returns when every output is written
// (Finish is called, error or not). `traffic` may be null.
absl::Status RunSpanning(const OpPlan& plan, const std::vector<MemberIo>& io, Fabric* fabric,
                         SpanningTraffic* traffic);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_EXEC_SPANNING_H_
