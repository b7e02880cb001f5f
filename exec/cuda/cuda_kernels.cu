// The CUDA kernels of CudaExecutor (see cuda_kernels.h).
//
// One thread per output element, grid-stride in x over the elements and in y
// over the groups (or members). Every reduction element is computed by
// reduce_ops::ReduceElement with the codec and combiner VisitReduce picks in
// SoftwareEnv: the CPU's rules, with the flushing and x86's NaN results done
// in software (the GPU gives the canonical NaN 0x7fffffff for any NaN
// result and is built without FTZ and without FMA contraction, see
// CMakeLists.txt).
//
// Kernel instances: 52 reductions (13 dtypes x 4 kinds; those whose result
// is as wide as the input also in a 16-byte vector form), 12 reduce-scatters
// (the sums), 1 bfloat16 and 1 float8_e5m2 canonicalization, 5 gather and 4
// all_to_all copy widths.
#include "exec/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace collectived {
namespace cuda_kernels {
namespace {

using reduce_ops::SoftwareEnv;

constexpr int kThreads = 256;

dim3 Grid(uint64_t work, int64_t rows) {
  const uint64_t blocks = std::max<uint64_t>(1, std::min<uint64_t>((work + kThreads - 1) / kThreads, 8192));
  const int64_t y = std::max<int64_t>(1, std::min<int64_t>(rows, 65535));
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(y), 1);
}

__device__ inline uint64_t FirstIndex() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline uint64_t Stride() { return static_cast<uint64_t>(gridDim.x) * blockDim.x; }

template <typename Codec, typename Combiner>
__global__ void AllReduceKernel(MemberTable table, int n, int num_groups, int num_outs,
                                uint64_t count, Codec codec, Combiner op) {
  using In = typename Codec::In;
  using Out = typename Codec::Out;
  for (int g = blockIdx.y; g < num_groups; g += gridDim.y) {
    const int64_t base = static_cast<int64_t>(g) * n;
    for (uint64_t q = FirstIndex(); q < count; q += Stride()) {
      // Every input of element q is read before any output of it is written.
      const Out r = reduce_ops::ReduceElement(codec, op, n, [&](int k) {
        return reinterpret_cast<const In*>(table.In(base + k))[q];
      });
      for (int k = 0; k < num_outs; ++k) {
        Out* out = reinterpret_cast<Out*>(table.Out(base + k));
        if (out != nullptr) out[q] = r;  // null: written on another GPU
      }
    }
  }
}

// AllReduceKernel with 16-byte loads and stores: each thread reduces V
// consecutive elements (one 16-byte vector of every member), the elements
// past the last whole vector one at a time. Every address is 16-byte
// aligned and the result is as wide as the input (the launcher checks).
template <typename Codec, typename Combiner>
__global__ void AllReduceVectorKernel(MemberTable table, int n, int num_groups, int num_outs,
                                      uint64_t count, Codec codec, Combiner op) {
  using In = typename Codec::In;
  using Out = typename Codec::Out;
  using Acc = typename Codec::Acc;
  constexpr int V = 16 / sizeof(In);
  static_assert(sizeof(Out) == sizeof(In) && 16 % sizeof(In) == 0);
  struct alignas(16) InVec {
    In v[V];
  };
  struct alignas(16) OutVec {
    Out v[V];
  };
  const uint64_t vectors = count / V;
  for (int g = blockIdx.y; g < num_groups; g += gridDim.y) {
    const int64_t base = static_cast<int64_t>(g) * n;
    for (uint64_t q = FirstIndex(); q < vectors; q += Stride()) {
      // Every input of these elements is read before any output of them is
      // written.
      Acc acc[V];
      {
        const InVec x = reinterpret_cast<const InVec*>(table.In(base))[q];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = op.First(codec.Load(x.v[j]));
      }
      for (int k = 1; k < n; ++k) {
        const InVec x = reinterpret_cast<const InVec*>(table.In(base + k))[q];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = op(acc[j], codec.Load(x.v[j]));
      }
      OutVec r;
#pragma unroll
      for (int j = 0; j < V; ++j) r.v[j] = codec.Store(acc[j]);
      for (int k = 0; k < num_outs; ++k) {
        OutVec* out = reinterpret_cast<OutVec*>(table.Out(base + k));
        if (out != nullptr) out[q] = r;  // null: written on another GPU
      }
    }
    for (uint64_t q = vectors * V + FirstIndex(); q < count; q += Stride()) {
      const Out r = reduce_ops::ReduceElement(codec, op, n, [&](int k) {
        return reinterpret_cast<const In*>(table.In(base + k))[q];
      });
      for (int k = 0; k < num_outs; ++k) {
        Out* out = reinterpret_cast<Out*>(table.Out(base + k));
        if (out != nullptr) out[q] = r;
      }
    }
  }
}

template <typename Codec, typename Combiner>
__global__ void ReduceScatterKernel(MemberTable table, int n, int num_groups, uint64_t outer,
                                    uint64_t inner, Codec codec, Combiner op) {
  using In = typename Codec::In;
  using Out = typename Codec::Out;
  const int64_t members = static_cast<int64_t>(num_groups) * n;
  const uint64_t count = outer * inner;
  for (int64_t m = blockIdx.y; m < members; m += gridDim.y) {
    const int64_t base = m / n * n;
    const uint64_t j = static_cast<uint64_t>(m % n);
    if (table.Out(m) == nullptr) continue;  // written on another GPU
    for (uint64_t q = FirstIndex(); q < count; q += Stride()) {
      const uint64_t src = ReduceScatterSource(n, inner, j, q);
      const Out r = reduce_ops::ReduceElement(codec, op, n, [&](int k) {
        return reinterpret_cast<const In*>(table.In(base + k))[src];
      });
      reinterpret_cast<Out*>(table.Out(m))[q] = r;
    }
  }
}

__global__ void CanonicalizeBF16Kernel(MemberTable table, int entries, uint64_t count) {
  for (int e = blockIdx.y; e < entries; e += gridDim.y) {
    const auto* in = reinterpret_cast<const uint16_t*>(table.In(e));
    auto* out = reinterpret_cast<uint16_t*>(table.Out(e));
    if (out == nullptr) continue;  // written on another GPU
    for (uint64_t q = FirstIndex(); q < count; q += Stride()) {
      out[q] = reduce_ops::CanonicalizeBF16NaN(in[q]);
    }
  }
}

__global__ void CanonicalizeF8E5M2Kernel(MemberTable table, int entries, uint64_t count) {
  for (int e = blockIdx.y; e < entries; e += gridDim.y) {
    const auto* in = reinterpret_cast<const uint8_t*>(table.In(e));
    auto* out = reinterpret_cast<uint8_t*>(table.Out(e));
    if (out == nullptr) continue;  // written on another GPU
    for (uint64_t q = FirstIndex(); q < count; q += Stride()) {
      out[q] = reduce_ops::CanonicalizeF8E5M2NaN(in[q]);
    }
  }
}

// Units of `U` (1..16 bytes); inner counted in units.
template <typename U>
__global__ void AllGatherKernel(MemberTable table, int n, int num_groups, uint64_t outer,
                                uint64_t inner) {
  const int64_t members = static_cast<int64_t>(num_groups) * n;
  const uint64_t count = outer * n * inner;
  for (int64_t m = blockIdx.y; m < members; m += gridDim.y) {
    const int64_t base = m / n * n;
    U* out = reinterpret_cast<U*>(table.Out(m));
    if (out == nullptr) continue;  // written on another GPU
    for (uint64_t q = FirstIndex(); q < count; q += Stride()) {
      int64_t from = 0;
      uint64_t src = 0;
      AllGatherSource(n, inner, q, &from, &src);
      out[q] = reinterpret_cast<const U*>(table.In(base + from))[src];
    }
  }
}

template <typename U>
__global__ void AllToAllKernel(MemberTable table, int n, int num_groups, uint64_t elements,
                               AllToAllDims d) {
  const int64_t members = static_cast<int64_t>(num_groups) * n;
  for (int64_t m = blockIdx.y; m < members; m += gridDim.y) {
    const int64_t base = m / n * n;
    const int64_t dst = m % n;
    U* out = reinterpret_cast<U*>(table.Out(m));
    if (out == nullptr) continue;  // written on another GPU
    for (uint64_t q = FirstIndex(); q < elements; q += Stride()) {
      int64_t from = 0, src = 0;
      AllToAllSource(d, dst, q, &from, &src);
      out[q] = reinterpret_cast<const U*>(table.In(base + from))[src];
    }
  }
}

// Which VisitReduce recipes are sums (psum_scatter instantiates only those).
template <typename C>
struct IsAddition : std::false_type {};
template <typename E>
struct IsAddition<reduce_ops::Add<E>> : std::true_type {};
template <typename E>
struct IsAddition<reduce_ops::AddLastNaN<E>> : std::true_type {};
template <typename E>
struct IsAddition<reduce_ops::HalfAdd<E>> : std::true_type {};

template <typename C>
struct IsMean : std::false_type {};
template <typename T, typename E>
struct IsMean<reduce_ops::FloatMean<T, E>> : std::true_type {};
template <typename F, typename E>
struct IsMean<reduce_ops::WidenedMean<F, E>> : std::true_type {};
template <typename F, typename E>
struct IsMean<reduce_ops::F8Mean<F, E>> : std::true_type {};
template <typename T, typename R>
struct IsMean<reduce_ops::IntMean<T, R>> : std::true_type {};
template <>
struct IsMean<reduce_ops::BoolMean> : std::true_type {};

}  // namespace

cudaError_t LaunchAllReduce(ReduceKind kind, DType dt, const MemberTable& table, int n,
                            int num_groups, int num_outs, uint64_t count, bool aligned16,
                            cudaStream_t stream) {
  if (count == 0 || num_groups == 0) return cudaSuccess;
  const bool known = reduce_ops::VisitReduce<SoftwareEnv>(kind, dt, n, [&](auto codec, auto op) {
    using Codec = decltype(codec);
    constexpr size_t in_size = sizeof(typename Codec::In);
    if constexpr (sizeof(typename Codec::Out) == in_size && 16 % in_size == 0) {
      const uint64_t per_vector = 16 / in_size;
      if (aligned16 && count >= per_vector) {
        // One thread per vector; the tail (fewer than per_vector elements)
        // goes to the first threads.
        AllReduceVectorKernel<<<Grid(count / per_vector, num_groups), kThreads, 0, stream>>>(
            table, n, num_groups, num_outs, count, codec, op);
        return;
      }
    }
    AllReduceKernel<<<Grid(count, num_groups), kThreads, 0, stream>>>(
        table, n, num_groups, num_outs, count, codec, op);
  });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t LaunchReduceScatter(DType dt, const MemberTable& table, int n, int num_groups,
                                uint64_t outer, uint64_t inner, cudaStream_t stream) {
  if (outer * inner == 0 || num_groups == 0) return cudaSuccess;
  if (dt == DType::kBool) return cudaErrorInvalidValue;  // the planner rejects it
  const dim3 grid = Grid(outer * inner, static_cast<int64_t>(num_groups) * n);
  const bool known = reduce_ops::VisitReduce<SoftwareEnv>(
      ReduceKind::kSum, dt, n, [&](auto codec, auto op) {
        using Codec = decltype(codec);
        using Op = decltype(op);
        if constexpr (IsAddition<Op>::value && !IsMean<Codec>::value &&
                      !std::is_same_v<Codec, reduce_ops::BoolCount>) {
          ReduceScatterKernel<<<grid, kThreads, 0, stream>>>(table, n, num_groups, outer, inner,
                                                             codec, op);
        }
      });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t LaunchCanonicalizeBF16(const MemberTable& table, int entries, uint64_t count,
                                   cudaStream_t stream) {
  if (count == 0 || entries == 0) return cudaSuccess;
  CanonicalizeBF16Kernel<<<Grid(count, entries), kThreads, 0, stream>>>(table, entries, count);
  return cudaGetLastError();
}

cudaError_t LaunchCanonicalizeF8E5M2(const MemberTable& table, int entries, uint64_t count,
                                     cudaStream_t stream) {
  if (count == 0 || entries == 0) return cudaSuccess;
  CanonicalizeF8E5M2Kernel<<<Grid(count, entries), kThreads, 0, stream>>>(table, entries, count);
  return cudaGetLastError();
}

cudaError_t LaunchAllGather(const MemberTable& table, int n, int num_groups, uint64_t outer,
                            uint64_t inner_bytes, int unit, cudaStream_t stream) {
  if (outer * inner_bytes == 0 || num_groups == 0) return cudaSuccess;
  if (unit <= 0 || inner_bytes % static_cast<uint64_t>(unit) != 0) return cudaErrorInvalidValue;
  const uint64_t inner = inner_bytes / static_cast<uint64_t>(unit);
  const dim3 grid = Grid(outer * n * inner, static_cast<int64_t>(num_groups) * n);
  switch (unit) {
    case 16:
      AllGatherKernel<uint4><<<grid, kThreads, 0, stream>>>(table, n, num_groups, outer, inner);
      break;
    case 8:
      AllGatherKernel<uint64_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, outer, inner);
      break;
    case 4:
      AllGatherKernel<uint32_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, outer, inner);
      break;
    case 2:
      AllGatherKernel<uint16_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, outer, inner);
      break;
    case 1:
      AllGatherKernel<uint8_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, outer, inner);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchAllToAll(const MemberTable& table, int n, int num_groups, uint64_t elements,
                           size_t element_size, const AllToAllDims& dims, cudaStream_t stream) {
  if (elements == 0 || num_groups == 0) return cudaSuccess;
  if (dims.rank < 1 || dims.rank > AllToAllDims::kMaxRank) return cudaErrorInvalidValue;
  const dim3 grid = Grid(elements, static_cast<int64_t>(num_groups) * n);
  switch (element_size) {
    case 8:
      AllToAllKernel<uint64_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, elements, dims);
      break;
    case 4:
      AllToAllKernel<uint32_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, elements, dims);
      break;
    case 2:
      AllToAllKernel<uint16_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, elements, dims);
      break;
    case 1:
      AllToAllKernel<uint8_t><<<grid, kThreads, 0, stream>>>(table, n, num_groups, elements, dims);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace collectived
