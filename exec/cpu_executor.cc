#include "exec/cpu_executor.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/container/inlined_vector.h"
#include "exec/reduce.h"
#include "exec/stream_copy.h"

namespace collectived {
namespace {

void Copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

int64_t Product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

// Copies the block `block` (a shape) that starts at `src_start` in an array of
// `src_shape` to `dst_start` in an array of `dst_shape`; all row-major with
// elements of `es` bytes. Trailing dimensions the block spans fully are copied
// as one contiguous run.
void CopyBlock(uint8_t* dst, const std::vector<int64_t>& dst_shape,
               const std::vector<int64_t>& dst_start, const uint8_t* src,
               const std::vector<int64_t>& src_shape,
               const std::vector<int64_t>& src_start,
               const std::vector<int64_t>& block, size_t es) {
  const int rank = static_cast<int>(block.size());
  if (Product(block, 0, rank) == 0) return;
  std::vector<int64_t> src_stride(rank + 1, static_cast<int64_t>(es));
  std::vector<int64_t> dst_stride(rank + 1, static_cast<int64_t>(es));
  for (int d = rank - 1; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src_shape[d];
    dst_stride[d] = dst_stride[d + 1] * dst_shape[d];
  }
  // d0: first dimension of the contiguous run.
  int d0 = rank;
  while (d0 > 0) {
    --d0;
    if (block[d0] != src_shape[d0] || block[d0] != dst_shape[d0]) break;
  }
  const size_t run = static_cast<size_t>(rank == 0 ? es : block[d0] * src_stride[d0 + 1]);
  int64_t src_base = 0, dst_base = 0;
  for (int d = 0; d < rank; ++d) {
    src_base += src_start[d] * src_stride[d + 1];
    dst_base += dst_start[d] * dst_stride[d + 1];
  }
  // Odometer over dimensions [0, d0).
  std::vector<int64_t> idx(d0, 0);
  for (;;) {
    int64_t so = src_base, dof = dst_base;
    for (int d = 0; d < d0; ++d) {
      so += idx[d] * src_stride[d + 1];
      dof += idx[d] * dst_stride[d + 1];
    }
    std::memcpy(dst + dof, src + so, run);
    int d = d0 - 1;
    while (d >= 0 && ++idx[d] == block[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

}  // namespace

CpuExecutor::CpuExecutor(CpuExecutorOptions options) : options_(options) {
  int threads = options_.threads > 0
                    ? options_.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The thread that calls Run works too.
  pool_ = std::make_unique<ThreadPool>(threads - 1);
}

absl::Status CpuExecutor::Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                              Traffic* traffic) {
  uint64_t staged = 0;
  switch (plan.kind) {
    case OpKind::kPsum:
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
      RunReduce(plan, io);
      break;
    case OpKind::kAllGather:
      RunGather(plan, io);
      break;
    case OpKind::kPsumScatter:
      RunReduceScatter(plan, io);
      break;
    case OpKind::kPpermute:
    case OpKind::kBroadcast:
      staged = RunPermute(plan, io);
      break;
    case OpKind::kAllToAll:
      staged = RunAllToAll(plan, io);
      break;
    case OpKind::kBarrier:
      break;
    default:
      return absl::UnimplementedError("cpu executor: unsupported op kind");
  }
  if (traffic != nullptr) *traffic = AccountTraffic(plan, staged, staged);
  return absl::OkStatus();
}

bool CpuExecutor::SmallReductionOrGather(const OpPlan& plan) const {
  return (IsReduction(plan.kind) || plan.kind == OpKind::kAllGather) &&
         plan.bytes_touched() <= options_.serial_bytes;
}

bool CpuExecutor::Streams(const OpPlan& plan) const {
  return plan.bytes_touched() >= options_.stream_bytes;
}

void CpuExecutor::ParallelFor(const OpPlan& plan, size_t n, absl::FunctionRef<void(size_t)> fn) {
  if (plan.bytes_touched() <= options_.serial_bytes) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // The pool's ParallelFor returns once every task ran: fn outlives them.
  pool_->ParallelFor(n, [fn](size_t i) { fn(i); });
}

namespace {

// `len` elements of a psum/pmean/pmax/pmin's result from the inputs of one
// group of `plan` (one per member of the group, in its order), into each
// of `outputs`.
void ReduceInputs(const OpPlan& plan, const void* const* inputs, void* const* outputs,
                  int num_outputs, size_t len, bool stream) {
  ReduceTo(ToReduceKind(plan.kind), plan.dtype, inputs, plan.group_size, outputs, num_outputs,
           len, stream, FoldPart{plan.continues_fold, plan.mean_divisor});
}

// Elements [begin, begin + len) of a psum/pmean/pmax/pmin's result for one
// group of `plan`, into the outputs of its members that have one.
void ReduceGroupRange(const OpPlan& plan, const std::vector<MemberIo>& io,
                      const std::vector<int>& group, size_t begin, size_t len, bool stream) {
  const size_t in_es = DTypeSize(plan.dtype);
  const size_t out_es = DTypeSize(plan.out_dtype);
  // A mesh of one member is a one-device program in JAX, and an op over no
  // axes (JAX's empty tuple) is no collective: nothing is reduced (see
  // ReduceMeshOfOne). A group of one over a named axis of a bigger mesh is.
  if (plan.ReducesNothing()) {
    if (io[group[0]].out == nullptr) return;  // written elsewhere
    if (plan.axis_ids.empty() && IsFloat(plan.dtype)) {
      // Over no axes nothing is converted either (JAX: psum(x, ()) is x):
      // every float bit is kept, bfloat16 and float8_e5m2 NaNs included.
      if (io[group[0]].out != io[group[0]].in) {
        std::memmove(io[group[0]].out + begin * out_es, io[group[0]].in + begin * in_es,
                     len * in_es);
      }
      return;
    }
    ReduceMeshOfOne(ToReduceKind(plan.kind), plan.dtype, io[group[0]].in + begin * in_es,
                    io[group[0]].out + begin * out_es, len);
    return;
  }
  const int n = plan.group_size;
  absl::InlinedVector<const void*, 16> inputs(n);
  absl::InlinedVector<void*, 16> outputs;
  for (int i = 0; i < n; ++i) {
    inputs[i] = io[group[i]].in + begin * in_es;
    if (io[group[i]].out != nullptr) outputs.push_back(io[group[i]].out + begin * out_es);
  }
  if (outputs.empty()) return;
  ReduceInputs(plan, inputs.data(), outputs.data(), static_cast<int>(outputs.size()), len,
               stream);
}

// Bytes [begin, end) of group member `src`'s input, copied to where an
// all_gather of `plan` puts them in the outputs of its group's members that
// have one. The input is viewed as [outer, inner] and the output as
// [outer, n, inner].
void GatherRange(const OpPlan& plan, const std::vector<MemberIo>& io,
                 const std::vector<int>& group, int src, size_t begin, size_t end, bool stream) {
  const size_t outer = static_cast<size_t>(Product(plan.in_shape, 0, plan.axis));
  const size_t inner_bytes = plan.in_bytes / outer;
  const int n = plan.group_size;
  constexpr size_t kCopyBlock = 16 * 1024;
  const uint8_t* in = io[group[src]].in;
  for (size_t pos = begin; pos < end;) {
    // A run of the input that stays within one row o of [outer, inner].
    const size_t o = pos / inner_bytes;
    const size_t off = pos % inner_bytes;
    const size_t len = std::min({end - pos, inner_bytes - off, kCopyBlock});
    const size_t out_pos = (o * n + src) * inner_bytes + off;
    for (int dst = 0; dst < n; ++dst) {
      if (io[group[dst]].out == nullptr) continue;  // written elsewhere
      uint8_t* out = io[group[dst]].out + out_pos;
      if (out == in + pos) continue;  // one member, in place
      if (stream) {
        StreamCopy(out, in + pos, len);
      } else {
        Copy(out, in + pos, len);
      }
    }
    pos += len;
  }
}

}  // namespace

void CpuExecutor::RunReduce(const OpPlan& plan, const std::vector<MemberIo>& io) {
  const size_t in_es = DTypeSize(plan.dtype);
  const size_t out_es = DTypeSize(plan.out_dtype);
  const size_t count = plan.in_bytes / in_es;
  if (count == 0) return;
  const size_t chunk = std::max<size_t>(64, options_.chunk_bytes / std::max(in_es, out_es));
  const size_t chunks = (count + chunk - 1) / chunk;
  const bool stream = Streams(plan);
  // Each chunk of the inputs is read once; its result goes to every member's
  // output from L1 (see ReduceTo).
  ParallelFor(plan, plan.groups.size() * chunks, [&](size_t task) {
    const size_t begin = (task % chunks) * chunk;
    ReduceGroupRange(plan, io, plan.groups[task / chunks], begin, std::min(chunk, count - begin),
                     stream);
  });
}

void CpuExecutor::RunGather(const OpPlan& plan, const std::vector<MemberIo>& io) {
  if (plan.in_bytes == 0) return;
  const bool stream = Streams(plan);
  // Tasks: one source member's input, a chunk of its bytes at a time, copied
  // to every member of its group in blocks small enough to stay in L1, so
  // each input byte is read from memory once.
  const size_t chunks = (plan.in_bytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
  const size_t per_group = static_cast<size_t>(plan.group_size) * chunks;
  ParallelFor(plan, plan.groups.size() * per_group, [&](size_t task) {
    const size_t begin = (task % chunks) * options_.chunk_bytes;
    GatherRange(plan, io, plan.groups[task / per_group],
                static_cast<int>((task % per_group) / chunks), begin,
                std::min(plan.in_bytes, begin + options_.chunk_bytes), stream);
  });
}

bool CpuExecutor::RunOneMember(const OpPlan& plan, const std::vector<MemberIo>& io, int member) {
  if (!SmallReductionOrGather(plan) || member < 0 ||
      static_cast<size_t>(member) >= plan.group_of.size() || plan.group_of[member] < 0) {
    return false;
  }
  const std::vector<int>& group = plan.groups[static_cast<size_t>(plan.group_of[member])];
  const bool stream = Streams(plan);
  if (IsReduction(plan.kind)) {
    const size_t count = plan.in_bytes / DTypeSize(plan.dtype);
    if (count > 0) ReduceGroupRange(plan, io, group, 0, count, stream);
  } else if (plan.in_bytes > 0) {
    for (int src = 0; src < plan.group_size; ++src) {
      GatherRange(plan, io, group, src, 0, plan.in_bytes, stream);
    }
  }
  return true;
}

bool CpuExecutor::RunSmallGroup(const OpPlan& plan, const void* const* inputs,
                                void* out) const {
  if (!SmallReductionOrGather(plan) || plan.groups.size() != 1 || Streams(plan)) return false;
  if (IsReduction(plan.kind)) {
    if (plan.ReducesNothing()) return false;
    const size_t count = plan.in_bytes / DTypeSize(plan.dtype);
    if (count > 0) ReduceInputs(plan, inputs, &out, 1, count, /*stream=*/false);
    return true;
  }
  if (plan.in_bytes == 0) return true;
  // As GatherRange: the inputs viewed as [outer, inner], the output as
  // [outer, n, inner].
  const size_t outer = static_cast<size_t>(Product(plan.in_shape, 0, plan.axis));
  const size_t inner = plan.in_bytes / outer;
  const size_t n = static_cast<size_t>(plan.group_size);
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t o = 0; o < outer; ++o) {
    for (size_t src = 0; src < n; ++src) {
      Copy(dst + (o * n + src) * inner, static_cast<const uint8_t*>(inputs[src]) + o * inner,
           inner);
    }
  }
  return true;
}

bool CpuExecutor::ReduceShare(const OpPlan& plan, const std::vector<MemberIo>& io, int member,
                              size_t begin, size_t len, bool stream) {
  const size_t es = DTypeSize(plan.dtype);
  if (!IsReduction(plan.kind) || es == 0 || member < 0 ||
      static_cast<size_t>(member) >= plan.group_of.size() || plan.group_of[member] < 0 ||
      begin > plan.in_bytes / es || len > plan.in_bytes / es - begin) {
    return false;
  }
  if (len > 0) {
    ReduceGroupRange(plan, io, plan.groups[static_cast<size_t>(plan.group_of[member])], begin,
                     len, stream);
  }
  return true;
}

void CpuExecutor::RunReduceScatter(const OpPlan& plan, const std::vector<MemberIo>& io) {
  // Input viewed as [outer, n, inner] (elements); member j gets [:, j, :].
  const size_t es = DTypeSize(plan.dtype);
  const int n = plan.group_size;
  const size_t outer = static_cast<size_t>(Product(plan.in_shape, 0, plan.axis));
  const size_t total = plan.in_bytes / es;
  if (total == 0) return;
  const size_t inner = total / outer / n;
  const size_t chunk = std::max<size_t>(64, options_.chunk_bytes / es);
  const size_t chunks = (inner + chunk - 1) / chunk;
  const size_t per_group = static_cast<size_t>(n) * chunks;
  ParallelFor(plan, plan.groups.size() * per_group, [&](size_t task) {
    const auto& group = plan.groups[task / per_group];
    const int j = static_cast<int>((task % per_group) / chunks);
    const size_t begin = (task % chunks) * chunk;
    const size_t len = std::min(chunk, inner - begin);
    if (io[group[j]].out == nullptr) return;  // written elsewhere
    absl::InlinedVector<const void*, 16> inputs(n);
    for (size_t o = 0; o < outer; ++o) {
      const size_t offset = (o * n + j) * inner + begin;
      for (int i = 0; i < n; ++i) inputs[i] = io[group[i]].in + offset * es;
      Reduce(ReduceKind::kSum, plan.dtype, inputs.data(), n,
             io[group[j]].out + (o * inner + begin) * es, len);
    }
  });
}

uint64_t CpuExecutor::RunPermute(const OpPlan& plan, const std::vector<MemberIo>& io) {
  const size_t bytes = plan.in_bytes;
  if (bytes == 0) return 0;
  const int n = plan.group_size;
  // In-place members would overwrite inputs others still read: stage them.
  std::vector<const uint8_t*> src(io.size());
  std::vector<std::vector<uint8_t>> staged(io.size());
  uint64_t staged_bytes = 0;
  for (size_t m = 0; m < io.size(); ++m) {
    src[m] = io[m].in;
    if (io[m].in == io[m].out) {
      staged[m].assign(io[m].in, io[m].in + bytes);
      src[m] = staged[m].data();
      staged_bytes += bytes;
    }
  }
  const size_t chunks = (bytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
  const size_t per_group = static_cast<size_t>(n) * chunks;
  ParallelFor(plan, plan.groups.size() * per_group, [&](size_t task) {
    const auto& group = plan.groups[task / per_group];
    const int dst = static_cast<int>((task % per_group) / chunks);
    const size_t begin = (task % chunks) * options_.chunk_bytes;
    const size_t len = std::min(options_.chunk_bytes, bytes - begin);
    const int s = plan.kind == OpKind::kBroadcast ? plan.root : plan.perm_source[dst];
    if (io[group[dst]].out == nullptr) return;  // written elsewhere
    uint8_t* out = io[group[dst]].out + begin;
    if (s < 0) {
      std::memset(out, 0, len);
    } else {
      std::memcpy(out, src[group[s]] + begin, len);
    }
  });
  return staged_bytes;
}

uint64_t CpuExecutor::RunAllToAll(const OpPlan& plan, const std::vector<MemberIo>& io) {
  if (plan.in_bytes == 0) return 0;
  const size_t es = DTypeSize(plan.dtype);
  const int n = plan.group_size;
  const int a = plan.split_axis, c = plan.concat_axis;
  const std::vector<int64_t>& in_shape = plan.a2a_shape;
  std::vector<int64_t> block = in_shape;
  block[a] /= n;
  std::vector<int64_t> out_shape = block;
  out_shape[c] *= n;
  std::vector<const uint8_t*> src(io.size());
  std::vector<std::vector<uint8_t>> staged(io.size());
  uint64_t staged_bytes = 0;
  for (size_t m = 0; m < io.size(); ++m) {
    src[m] = io[m].in;
    if (io[m].in == io[m].out) {
      staged[m].assign(io[m].in, io[m].in + plan.in_bytes);
      src[m] = staged[m].data();
      staged_bytes += plan.in_bytes;
    }
  }
  const size_t pairs = static_cast<size_t>(n) * n;
  ParallelFor(plan, plan.groups.size() * pairs, [&](size_t task) {
    const auto& group = plan.groups[task / pairs];
    const int dst = static_cast<int>((task % pairs) / n);
    const int from = static_cast<int>(task % n);
    if (io[group[dst]].out == nullptr) return;  // written elsewhere
    // Block `dst` along the split axis of member `from` goes to position
    // `from` along the concat axis of member `dst`.
    std::vector<int64_t> src_start(in_shape.size(), 0), dst_start(in_shape.size(), 0);
    src_start[a] = dst * block[a];
    dst_start[c] = from * block[c];
    CopyBlock(io[group[dst]].out, out_shape, dst_start, src[group[from]], in_shape,
              src_start, block, es);
  });
  return staged_bytes;
}

}  // namespace collectived
