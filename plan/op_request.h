// One member's op as the core receives it: the project's own form of the
// wire format's OpSpec (plan/wire_plan.h converts at the edge), so that
// planning, the engine and the executors never see protobuf.
//
// Values are as the client sent them: PlanOp and the engine check every
// field (an unknown kind or dtype is carried as is and refused there, with
// its number). Plain data.
#ifndef COLLECTIVED_PLAN_OP_REQUEST_H_
#define COLLECTIVED_PLAN_OP_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectived/dtype.h"
#include "plan/op_plan.h"

namespace collectived {

// A region of a session's buffer (the wire's BufferRef).
struct BufferRegion {
  std::string buffer_id;
  // Byte offset into the buffer; the engine checks it against the buffer
  // and the element size.
  int64_t offset = 0;
  // The length the client declared; unset: as long as the op needs.
  std::optional<int64_t> size_bytes;
};

// Stream-ordered submission (the wire's StreamSync): the op reads no input
// before the word at `ready` reaches `value`, and the daemon raises the word
// at `done` to `value` once the op has ended.
struct StreamOrder {
  BufferRegion ready;
  BufferRegion done;
  uint64_t value = 0;
};

struct OpRequest {
  std::string mesh_id;
  OpKind kind = OpKind::kUnspecified;
  // The axes in the order given; empty means every axis unless `no_axes`
  // (JAX's empty tuple).
  std::vector<std::string> axes;
  bool no_axes = false;
  DType dtype = DType::kInvalid;
  // This member's input.
  std::vector<int64_t> shape;
  BufferRegion input;
  // Unset: the result goes in place of the input.
  std::optional<BufferRegion> output;

  // The parameters of the kinds that have some; the others' stay at their
  // defaults (as the wire's oneof leaves them).
  struct AllGather {
    int axis = 0;
    bool tiled = false;
  } all_gather;
  struct PsumScatter {
    int scatter_dimension = 0;
    bool tiled = false;
  } psum_scatter;
  struct AllToAll {
    int split_axis = 0;
    int concat_axis = 0;
    bool tiled = false;
  } all_to_all;
  // ppermute: (source, dest) group indices.
  std::vector<std::pair<int, int>> perm;
  // broadcast: the root's group index.
  int root = 0;

  // Deadline of the whole op (0: the mesh's op timeout; < 0 is refused).
  int64_t timeout_ms = 0;
  std::optional<StreamOrder> stream_sync;
};

}  // namespace collectived

#endif  // COLLECTIVED_PLAN_OP_REQUEST_H_
