// The CUDA kernels of CudaExecutor, behind plain launch functions (compiled
// by nvcc in cuda_kernels.cu; this header is host C++ and needs only the CUDA
// runtime API's types).
//
// Members are addressed through a MemberTable, group-major: entry g * n + i
// is the member with group index i in group g (n the group size). A null
// output is a member whose result another GPU writes: nothing is written
// for it. Every
// launcher enqueues its work on `stream` and returns the launch error
// (cudaSuccess, or what cudaGetLastError reported; cudaErrorInvalidValue for
// a dtype the plan library does not have). The element-wise arithmetic is
// reduce_ops.h's, in SoftwareEnv: the same bits as the CPU kernels.
//
// Thread-safety: the launchers keep no state; the usual CUDA stream rules
// apply to the memory they touch.
#ifndef COLLECTIVED_EXEC_CUDA_CUDA_KERNELS_H_
#define COLLECTIVED_EXEC_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "exec/reduce_ops.h"
#include "plan/op_plan.h"

namespace collectived {
namespace cuda_kernels {

// Members whose pointers travel in the kernel's parameters; more than this
// and the pointers live in device arrays (dev_in/dev_out).
inline constexpr int kInlineMembers = 64;

// Device addresses of members' inputs and outputs, passed to kernels by
// value.
struct MemberTable {
  const void* in[kInlineMembers] = {};
  void* out[kInlineMembers] = {};
  // Device arrays of every entry's pointers, when there are more than
  // kInlineMembers entries (else null and in/out are used).
  const void* const* dev_in = nullptr;
  void* const* dev_out = nullptr;

  COLLECTIVED_HD const uint8_t* In(int64_t e) const {
    return static_cast<const uint8_t*>(dev_in != nullptr ? dev_in[e] : in[e]);
  }
  COLLECTIVED_HD uint8_t* Out(int64_t e) const {
    return static_cast<uint8_t*>(dev_out != nullptr ? dev_out[e] : out[e]);
  }
};

// psum/pmean/pmax/pmin: for each of `num_groups` groups of `n` members and
// each of `count` elements, Reduce(kind, dt) of the n inputs (group order),
// written to the outputs of the group's first `num_outs` entries (n, or 1
// for a staging buffer). Each element's inputs are read before its outputs
// are written, so an output may be its member's input when the result
// dtype is no wider than the input dtype. `aligned16`: every input and
// output address of the table is a multiple of 16 bytes; then, where the
// result is as wide as the input, each thread moves 16 bytes per load and
// store (the same arithmetic, element by element).
cudaError_t LaunchAllReduce(ReduceKind kind, DType dt, const MemberTable& table, int n,
                            int num_groups, int num_outs, uint64_t count, bool aligned16,
                            cudaStream_t stream);

// Whether every non-null address of `ptrs` is a multiple of 16 bytes.
template <typename P>
inline bool Aligned16(const P& ptrs) {
  for (const auto* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// psum_scatter: inputs viewed as [outer, n, inner] elements of dt; member j
// of each group gets [outer, inner], the kSum reduction of block [:, j, :]
// of the group's n inputs. An output may be its member's input only when
// n == 1.
cudaError_t LaunchReduceScatter(DType dt, const MemberTable& table, int n, int num_groups,
                                uint64_t outer, uint64_t inner, cudaStream_t stream);

// out[e][i] = CanonicalizeBF16NaN(in[e][i]) for `entries` entries of
// `count` bfloat16 elements (ReduceMeshOfOne of bfloat16; in place is fine).
cudaError_t LaunchCanonicalizeBF16(const MemberTable& table, int entries, uint64_t count,
                                   cudaStream_t stream);

// out[e][i] = CanonicalizeF8E5M2NaN(in[e][i]) (every NaN becomes 0x7f) for
// `entries` entries of `count` float8_e5m2 elements (ReduceMeshOfOne of
// float8_e5m2; in place is fine).
cudaError_t LaunchCanonicalizeF8E5M2(const MemberTable& table, int entries, uint64_t count,
                                     cudaStream_t stream);

// all_gather: inputs viewed as [outer, inner_bytes], outputs as
// [outer, n, inner_bytes]; every member of a group gets every member's input
// at its group index. Copies in units of `unit` bytes (1, 2, 4, 8 or 16),
// which must divide inner_bytes and every address. Outputs must not overlap
// the inputs (stage them).
cudaError_t LaunchAllGather(const MemberTable& table, int n, int num_groups, uint64_t outer,
                            uint64_t inner_bytes, int unit, cudaStream_t stream);

// all_to_all on the collapsed a2a shape: at most 5 dimensions, `split` and
// `concat` the split and concat dimensions. block = in with block[split] /=
// n; out = block with out[concat] *= n. Block `dst` along the split axis of
// member `from` goes to position `from` along the concat axis of member
// `dst`. Outputs must not overlap the inputs (stage them).
struct AllToAllDims {
  static constexpr int kMaxRank = 5;
  int rank = 0;
  int split = 0;
  int concat = 0;
  int64_t in[kMaxRank] = {};
  int64_t block[kMaxRank] = {};
  int64_t out[kMaxRank] = {};
};
// The collapsed dims of an all_to_all of `shape` (the plan's a2a_shape),
// split and concat dimensions `split` and `concat`, over groups of n:
// runs of other dimensions merged.
inline AllToAllDims CollapseAllToAll(const int64_t* shape, int rank, int split, int concat,
                                     int n) {
  AllToAllDims d;
  bool last_free = false;
  for (int i = 0; i < rank; ++i) {
    const bool special = i == split || i == concat;
    if (!special && last_free) {
      d.in[d.rank - 1] *= shape[i];
      continue;
    }
    if (i == split) d.split = d.rank;
    if (i == concat) d.concat = d.rank;
    d.in[d.rank++] = shape[i];
    last_free = !special;
  }
  for (int i = 0; i < d.rank; ++i) d.block[i] = d.in[i];
  d.block[d.split] /= n;
  for (int i = 0; i < d.rank; ++i) d.out[i] = d.block[i];
  d.out[d.concat] *= n;
  return d;
}

// Where the kernels read (the layouts, shared with the host tests):
//  - all_to_all: output element q of member `dst` is element *src of the
//    group's member *from;
COLLECTIVED_HD inline void AllToAllSource(const AllToAllDims& d, int64_t dst, uint64_t q,
                                          int64_t* from, int64_t* src) {
  int64_t idx[AllToAllDims::kMaxRank] = {};
  uint64_t rest = q;
  for (int i = d.rank - 1; i >= 0; --i) {
    idx[i] = static_cast<int64_t>(rest % static_cast<uint64_t>(d.out[i]));
    rest /= static_cast<uint64_t>(d.out[i]);
  }
  *from = idx[d.concat] / d.block[d.concat];
  idx[d.concat] %= d.block[d.concat];
  idx[d.split] += dst * d.block[d.split];
  int64_t s = 0;
  for (int i = 0; i < d.rank; ++i) s = s * d.in[i] + idx[i];
  *src = s;
}
//  - all_gather ([outer, n, inner] units): output unit q of any member is
//    unit *src of the group's member *from;
COLLECTIVED_HD inline void AllGatherSource(int n, uint64_t inner, uint64_t q, int64_t* from,
                                           uint64_t* src) {
  const uint64_t row = q / inner;  // o * n + from
  *from = static_cast<int64_t>(row % static_cast<uint64_t>(n));
  *src = row / static_cast<uint64_t>(n) * inner + q % inner;
}
//  - psum_scatter: output element q of group member j reduces element
//    ReduceScatterSource(...) of every member of the group.
COLLECTIVED_HD inline uint64_t ReduceScatterSource(int n, uint64_t inner, uint64_t j,
                                                   uint64_t q) {
  return (q / inner * static_cast<uint64_t>(n) + j) * inner + q % inner;
}

cudaError_t LaunchAllToAll(const MemberTable& table, int n, int num_groups, uint64_t elements,
                           size_t element_size, const AllToAllDims& dims, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace collectived

#endif  // COLLECTIVED_EXEC_CUDA_CUDA_KERNELS_H_
