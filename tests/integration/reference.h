// Naive reference model of the jax.lax named-axis collectives, written from
// their specification (as measured from JAX 0.10 on x86 CPU) and independent
// of the daemon's code: every output element is computed on its own by index
// arithmetic, with scalar arithmetic and explicit NaN rules.
//
// Only the DType enum of the public SDK header is used (as a name for element
// types); sizes, names and the float16/bfloat16 conversions are our own.
#ifndef COLLECTIVED_TESTS_INTEGRATION_REFERENCE_H_
#define COLLECTIVED_TESTS_INTEGRATION_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collectived/dtype.h"

namespace collectived::integration {

using Shape = std::vector<int64_t>;

enum class Op {
  kPsum,
  kPmean,
  kPmax,
  kPmin,
  kAllGather,
  kPpermute,
  kPsumScatter,
  kAllToAll,
  kBroadcast,
  kBarrier,
};

const char* OpName(Op op);
// Our own element size / short name tables (not the SDK's).
size_t ElemSize(DType dt);
const char* ShortName(DType dt);  // f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64 bool f8e4m3fn f8e5m2
bool IsFloatType(DType dt);

int64_t NumElements(const Shape& shape);
std::string ShapeStr(const Shape& shape);  // "[3,5]"

// Parameters of the ops that take any. Negative axes count from the end, as
// in numpy: of the output for all_gather (rank + 1 dimensions untiled), of
// the input for psum_scatter and all_to_all's split_axis, and of the output
// (the input's rank) for all_to_all's concat_axis.
struct OpParams {
  int axis = 0;         // all_gather axis / psum_scatter scatter_dimension / all_to_all split_axis
  int concat_axis = 0;  // all_to_all
  bool tiled = false;
  int root = 0;                              // broadcast
  std::vector<std::pair<int, int>> perm;     // ppermute (source, dest)
};

// `p` with its negative axes for `op` on an input of `rank` dimensions
// counted from the end (still out of range if they were).
OpParams NonNegativeAxes(Op op, size_t rank, const OpParams& p);

// The result dtype and shape of `op` on an input of (dt, shape) in a group of
// n members; false (and a reason) when the op is invalid for these arguments.
bool ResultType(Op op, DType dt, const Shape& shape, int n, const OpParams& p, DType* out_dt,
                Shape* out_shape, std::string* why = nullptr);

// Computes the output of one member. `inputs` holds the raw input bytes of
// the n group members in group order (for ppermute: in mesh order, see the
// Group helper in sweep.h); `rank` is this member's index in that order.
//
// NaN results of float sums (psum, pmean, psum_scatter) are exact: the NaN
// of the last NaN member, quieted (float16: the first NaN of the
// accumulator), or the default NaN of an invalid operation; float16 and
// bfloat16 NaNs canonical (see F32ToF16 / F32ToBF16). float8 is reduced as
// float16 (members in group order, rounded to float16 per addition) and
// converted to float8 once at the end (F32ToF8); pmean: that float8 sum as
// float16, times float16(1/n), rounded to float16 and then to float8.
//
// `mesh_of_one`: the mesh has one member, a one-device program in JAX, whose
// psum/pmean/pmax/pmin reduce nothing: the input converted to the result
// dtype, float bits kept (bfloat16 NaNs canonical, float8_e5m2 NaNs 0x7f). Not so for psum_scatter,
// nor for a group of one inside a bigger mesh.
std::vector<uint8_t> Reference(Op op, DType dt, const Shape& shape, const OpParams& p,
                               const std::vector<const uint8_t*>& inputs, int rank,
                               bool mesh_of_one = false);

// float16 / bfloat16 conversions (round to nearest even). NaN results follow
// Eigen (used by XLA): float16 NaN -> sign|0x7e00, bfloat16 NaN -> sign|0x7fc0.
float F16ToF32(uint16_t h);
uint16_t F64ToF16(double d);
inline uint16_t F32ToF16(float f) { return F64ToF16(static_cast<double>(f)); }
float BF16ToF32(uint16_t b);
uint16_t F32ToBF16(float f);

// float8 (e4m3fn when `e4m3fn`, else e5m2) <-> float. F8ToF32 is exact (a
// NaN stays a NaN of its sign). F32ToF8 rounds a float to the nearest float8
// value, ties to the even code, the way XLA's float16 -> float8 conversion
// ends every float8 collective on CPU (XLA runs them in float16): e4m3fn has
// no infinity, so a magnitude above 464 (halfway from 448 to the 480 it
// lacks), inf and NaN give sign | 0x7f; e5m2 overflows to +-inf from 61440
// and gives 0x7f for every NaN (sign dropped).
float F8ToF32(bool e4m3fn, uint8_t b);
uint8_t F32ToF8(bool e4m3fn, float f);

// Human-readable value of one element (for FAIL lines): bits and value.
std::string ElemString(DType dt, const uint8_t* p);

}  // namespace collectived::integration

#endif  // COLLECTIVED_TESTS_INTEGRATION_REFERENCE_H_
