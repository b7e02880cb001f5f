#include "exec/cuda/cuda_executor.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/fast_queue.h"
#include "common/sync.h"
#include "exec/cuda/cuda_kernels.h"
#include "exec/spanning.h"

namespace collectived {

struct CudaExecutor::Device {
  Mutex mu;
  cudaStream_t stream ABSL_GUARDED_BY(mu) = nullptr;
  // RunTimed's events around an op on `stream` (made on first use).
  cudaEvent_t before ABSL_GUARDED_BY(mu) = nullptr;
  cudaEvent_t after ABSL_GUARDED_BY(mu) = nullptr;
};

// One NCCL communicator per GPU, rank = ordinal (the daemon is every rank).
struct CudaExecutor::Nccl {
  std::vector<ncclComm_t> comms;
  ~Nccl() {
    // Abort, not destroy: destroy waits for queued work, which a broken
    // exchange may never finish.
    for (ncclComm_t c : comms) {
      if (c != nullptr) ncclCommAbort(c);
    }
  }
};

namespace {

using cuda_kernels::Aligned16;
using cuda_kernels::AllToAllDims;
using cuda_kernels::kInlineMembers;
using cuda_kernels::MemberTable;

absl::Status CudaError(absl::string_view call, cudaError_t e) {
  return absl::InternalError(absl::StrCat("cuda executor: ", call, ": ", cudaGetErrorName(e),
                                          " (", cudaGetErrorString(e), ")"));
}

#define COLLECTIVED_CUDA_RETURN_IF_ERROR(name, call) \
  do {                                               \
    const cudaError_t cuda_error_ = (call);          \
    if (cuda_error_ != cudaSuccess) {                \
      return CudaError(name, cuda_error_);           \
    }                                                \
  } while (0)

#define COLLECTIVED_RETURN_IF_ERROR(expr)       \
  do {                                          \
    const absl::Status status_ = (expr);        \
    if (!status_.ok()) return status_;          \
  } while (0)

int64_t Product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

// The largest copy unit (16, 8, 4, 2 or 1 bytes) dividing `bytes` and every
// address.
int CopyUnit(uint64_t bytes, const std::vector<const void*>& a, const std::vector<void*>& b) {
  uint64_t bits = bytes | 16;
  for (const void* p : a) bits |= reinterpret_cast<uintptr_t>(p);
  for (void* p : b) bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<int>(bits & (~bits + 1));  // lowest set bit, at most 16
}

// Makes the current device `device` for the calling thread and restores the
// previous one when done.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  absl::Status Set(int device) {
    COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaGetDevice", cudaGetDevice(&saved_));
    if (saved_ != device) {
      COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaSetDevice", cudaSetDevice(device));
      restore_ = true;
    }
    return absl::OkStatus();
  }
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(saved_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int saved_ = 0;
  bool restore_ = false;
};

// Device scratch of `bytes` on the current device: ordered on `stream`
// where the device has memory pools (*stream_ordered true: free it with
// cudaFreeAsync on `stream`), else from cudaMalloc (*stream_ordered false:
// free it after synchronizing `stream`).
absl::StatusOr<uint8_t*> AllocScratch(uint64_t bytes, cudaStream_t stream, bool* stream_ordered) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, stream);
  if (e == cudaSuccess) {
    *stream_ordered = true;
    return static_cast<uint8_t*>(p);
  }
  if (e != cudaErrorNotSupported) return CudaError("cudaMallocAsync", e);
  cudaGetLastError();  // no memory pools on this device: clear it, use cudaMalloc
  COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaMalloc", cudaMalloc(&p, bytes));
  *stream_ordered = false;
  return static_cast<uint8_t*>(p);
}

// Frees scratch from AllocScratch once `stream` (on the current device) has
// finished with it, and waits for the stream.
void FreeScratch(void* p, bool stream_ordered, cudaStream_t stream) {
  if (stream_ordered) {
    cudaFreeAsync(p, stream);
    cudaStreamSynchronize(stream);
  } else {
    cudaStreamSynchronize(stream);
    cudaFree(p);
  }
}

// One op on one device's stream: its scratch memory, its pointer tables and
// the bytes its staging moved.
class OpRun {
 public:
  OpRun(const OpPlan& plan, const std::vector<MemberIo>& io, cudaStream_t stream)
      : plan_(plan), io_(io), stream_(stream) {}
  // Frees the scratch (stream-ordered) and waits for the stream: nothing the
  // op enqueued is still running when it returns, error or not.
  ~OpRun() {
    for (void* p : scratch_) cudaFreeAsync(p, stream_);
    cudaStreamSynchronize(stream_);
    for (void* p : sync_scratch_) cudaFree(p);
  }
  OpRun(const OpRun&) = delete;
  OpRun& operator=(const OpRun&) = delete;

  absl::Status Execute() {
    switch (plan_.kind) {
      case OpKind::kPsum:
      case OpKind::kPmean:
      case OpKind::kPmax:
      case OpKind::kPmin:
        return RunReduce();
      case OpKind::kAllGather:
        return RunGather();
      case OpKind::kPsumScatter:
        return RunReduceScatter();
      case OpKind::kPpermute:
      case OpKind::kBroadcast:
        return RunPermute();
      case OpKind::kAllToAll:
        return RunAllToAll();
      case OpKind::kBarrier:
        return absl::OkStatus();
      default:
        return absl::UnimplementedError("cuda executor: unsupported op kind");
    }
  }

  // Waits for everything enqueued; the op's first asynchronous error.
  absl::Status Finish() {
    COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  uint64_t extra_read() const { return extra_read_; }
  uint64_t extra_written() const { return extra_written_; }

 private:
  int n() const { return plan_.group_size; }
  int num_groups() const { return static_cast<int>(plan_.groups.size()); }
  int Member(int g, int i) const { return plan_.groups[g][i]; }

  // Scratch memory, stream-ordered where the device has memory pools, else
  // from cudaMalloc (freed after the stream is synchronized).
  absl::StatusOr<uint8_t*> Alloc(uint64_t bytes) {
    bool stream_ordered = false;
    auto p = AllocScratch(bytes, stream_, &stream_ordered);
    if (!p.ok()) return p.status();
    (stream_ordered ? scratch_ : sync_scratch_).push_back(*p);
    return *p;
  }

  // Copies within the device; a null `dst` (a member whose result another
  // GPU writes, spanning.h) copies nothing.
  absl::Status CopyD2D(void* dst, const void* src, uint64_t bytes) {
    if (dst == nullptr || dst == src || bytes == 0) return absl::OkStatus();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }

  // A table of ins[e]/outs[e]: inline, or in device arrays past
  // kInlineMembers entries.
  absl::StatusOr<MemberTable> Table(const std::vector<const void*>& ins,
                                    const std::vector<void*>& outs) {
    MemberTable t;
    const size_t entries = ins.size();
    if (entries <= static_cast<size_t>(kInlineMembers)) {
      std::copy(ins.begin(), ins.end(), t.in);
      std::copy(outs.begin(), outs.end(), t.out);
      return t;
    }
    // Kept until the stream is synchronized (the copies read them).
    host_tables_.emplace_back(ins.begin(), ins.end());
    const std::vector<const void*>& in_host = host_tables_.back();
    host_tables_.emplace_back(outs.begin(), outs.end());
    const std::vector<const void*>& out_host = host_tables_.back();
    const uint64_t bytes = entries * sizeof(void*);
    auto dev = Alloc(2 * bytes);
    if (!dev.ok()) return dev.status();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync",
        cudaMemcpyAsync(*dev, in_host.data(), bytes, cudaMemcpyHostToDevice, stream_));
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync",
        cudaMemcpyAsync(*dev + bytes, out_host.data(), bytes, cudaMemcpyHostToDevice, stream_));
    t.dev_in = reinterpret_cast<const void* const*>(*dev);
    t.dev_out = reinterpret_cast<void* const*>(*dev + bytes);
    return t;
  }

  // Every member's input and output, group-major.
  void AllMembers(std::vector<const void*>* ins, std::vector<void*>* outs) const {
    for (int g = 0; g < num_groups(); ++g) {
      for (int i = 0; i < n(); ++i) {
        ins->push_back(io_[Member(g, i)].in);
        outs->push_back(io_[Member(g, i)].out);
      }
    }
  }

  // The input of every member, or a staged copy of it where the member runs
  // in place (out == in): data movement would overwrite inputs others still
  // read. Indexed by member.
  absl::StatusOr<std::vector<const void*>> StagedInputs() {
    std::vector<const void*> src(io_.size());
    uint64_t in_place = 0;
    for (size_t m = 0; m < io_.size(); ++m) in_place += io_[m].in == io_[m].out ? 1 : 0;
    uint8_t* scratch = nullptr;
    if (in_place > 0) {
      auto s = Alloc(in_place * plan_.in_bytes);
      if (!s.ok()) return s.status();
      scratch = *s;
    }
    for (size_t m = 0; m < io_.size(); ++m) {
      src[m] = io_[m].in;
      if (io_[m].in == io_[m].out) {
        COLLECTIVED_RETURN_IF_ERROR(CopyD2D(scratch, io_[m].in, plan_.in_bytes));
        src[m] = scratch;
        scratch += plan_.in_bytes;
        extra_read_ += plan_.in_bytes;
        extra_written_ += plan_.in_bytes;
      }
    }
    return src;
  }

  absl::Status RunReduce() {
    if (plan_.continues_fold) {
      // Only the host chain (spanning.h, between daemons) continues a fold.
      return absl::UnimplementedError("cuda executor: a reduction that continues a fold");
    }
    const size_t in_es = DTypeSize(plan_.dtype);
    const size_t out_es = DTypeSize(plan_.out_dtype);
    const uint64_t count = plan_.in_bytes / in_es;
    if (count == 0) return absl::OkStatus();
    const ReduceKind kind = ToReduceKind(plan_.kind);
    // As CpuExecutor::RunReduce: a mesh of one member, or an op over no
    // axes, reduces nothing (ReduceMeshOfOne); each group's first member
    // only.
    const bool mesh_of_one = plan_.ReducesNothing();
    const int n_eff = mesh_of_one ? 1 : n();
    std::vector<const void*> ins;
    std::vector<void*> outs;
    for (int g = 0; g < num_groups(); ++g) {
      for (int i = 0; i < n_eff; ++i) {
        ins.push_back(io_[Member(g, i)].in);
        outs.push_back(io_[Member(g, i)].out);
      }
    }
    // Over no axes nothing is converted either (JAX: psum(x, ()) is x):
    // every float bit is kept, bfloat16 and float8_e5m2 NaNs included.
    const bool keep_bits = plan_.axis_ids.empty() && IsFloat(plan_.dtype);
    if (mesh_of_one && keep_bits) {
      for (size_t e = 0; e < ins.size(); ++e) {
        COLLECTIVED_RETURN_IF_ERROR(CopyD2D(outs[e], ins[e], plan_.in_bytes));
      }
      return absl::OkStatus();
    }
    if (mesh_of_one) {
      switch (plan_.dtype) {
        case DType::kF32:
        case DType::kF64:
        case DType::kF16:
        case DType::kF8E4M3FN:
          // Every bit kept.
          for (size_t e = 0; e < ins.size(); ++e) {
            COLLECTIVED_RETURN_IF_ERROR(CopyD2D(outs[e], ins[e], plan_.in_bytes));
          }
          return absl::OkStatus();
        case DType::kBF16: {
          auto table = Table(ins, outs);
          if (!table.ok()) return table.status();
          COLLECTIVED_CUDA_RETURN_IF_ERROR(
              "LaunchCanonicalizeBF16",
              cuda_kernels::LaunchCanonicalizeBF16(*table, static_cast<int>(ins.size()), count,
                                                   stream_));
          return absl::OkStatus();
        }
        case DType::kF8E5M2: {
          auto table = Table(ins, outs);
          if (!table.ok()) return table.status();
          COLLECTIVED_CUDA_RETURN_IF_ERROR(
              "LaunchCanonicalizeF8E5M2",
              cuda_kernels::LaunchCanonicalizeF8E5M2(*table, static_cast<int>(ins.size()), count,
                                                     stream_));
          return absl::OkStatus();
        }
        default:
          break;  // integers and bool: the exact one-member reduction
      }
    }
    bool in_place = false;
    for (size_t e = 0; e < ins.size(); ++e) in_place |= ins[e] == outs[e];
    if (out_es <= in_es || !in_place) {
      auto table = Table(ins, outs);
      if (!table.ok()) return table.status();
      COLLECTIVED_CUDA_RETURN_IF_ERROR(
          "LaunchAllReduce",
          cuda_kernels::LaunchAllReduce(kind, plan_.dtype, *table, n_eff, num_groups(), n_eff,
                                        count, Aligned16(ins) && Aligned16(outs), stream_));
      return absl::OkStatus();
    }
    // A result wider than the input, in place: an output element covers
    // input elements other threads still read. Reduce into scratch (one
    // result per group), then copy it to every output.
    auto scratch = Alloc(static_cast<uint64_t>(num_groups()) * plan_.out_bytes);
    if (!scratch.ok()) return scratch.status();
    std::vector<void*> staged(outs.size(), nullptr);
    for (int g = 0; g < num_groups(); ++g) {
      staged[static_cast<size_t>(g) * n_eff] = *scratch + static_cast<uint64_t>(g) * plan_.out_bytes;
    }
    auto table = Table(ins, staged);
    if (!table.ok()) return table.status();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "LaunchAllReduce",
        cuda_kernels::LaunchAllReduce(kind, plan_.dtype, *table, n_eff, num_groups(), 1, count,
                                      Aligned16(ins) && Aligned16(staged), stream_));
    extra_written_ += static_cast<uint64_t>(num_groups()) * plan_.out_bytes;
    for (int g = 0; g < num_groups(); ++g) {
      for (int i = 0; i < n_eff; ++i) {
        COLLECTIVED_RETURN_IF_ERROR(CopyD2D(outs[static_cast<size_t>(g) * n_eff + i],
                                            staged[static_cast<size_t>(g) * n_eff],
                                            plan_.out_bytes));
        extra_read_ += plan_.out_bytes;
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunReduceScatter() {
    const size_t es = DTypeSize(plan_.dtype);
    const uint64_t total = plan_.in_bytes / es;
    if (total == 0) return absl::OkStatus();
    const uint64_t outer = static_cast<uint64_t>(Product(plan_.in_shape, 0, plan_.axis));
    const uint64_t inner = total / outer / static_cast<uint64_t>(n());
    std::vector<const void*> ins;
    std::vector<void*> outs;
    AllMembers(&ins, &outs);
    bool in_place = false;
    for (size_t e = 0; e < ins.size(); ++e) in_place |= ins[e] == outs[e];
    if (n() == 1 || !in_place) {
      // (With n == 1 each output element is its own input element.)
      auto table = Table(ins, outs);
      if (!table.ok()) return table.status();
      COLLECTIVED_CUDA_RETURN_IF_ERROR(
          "LaunchReduceScatter",
          cuda_kernels::LaunchReduceScatter(plan_.dtype, *table, n(), num_groups(), outer, inner,
                                            stream_));
      return absl::OkStatus();
    }
    // In place with n > 1: results to scratch first, then to the outputs.
    auto scratch = Alloc(ins.size() * plan_.out_bytes);
    if (!scratch.ok()) return scratch.status();
    std::vector<void*> staged(outs.size());
    for (size_t e = 0; e < outs.size(); ++e) staged[e] = *scratch + e * plan_.out_bytes;
    auto table = Table(ins, staged);
    if (!table.ok()) return table.status();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "LaunchReduceScatter",
        cuda_kernels::LaunchReduceScatter(plan_.dtype, *table, n(), num_groups(), outer, inner,
                                          stream_));
    for (size_t e = 0; e < outs.size(); ++e) {
      COLLECTIVED_RETURN_IF_ERROR(CopyD2D(outs[e], staged[e], plan_.out_bytes));
    }
    extra_read_ += outs.size() * plan_.out_bytes;
    extra_written_ += outs.size() * plan_.out_bytes;
    return absl::OkStatus();
  }

  absl::Status RunGather() {
    if (plan_.in_bytes == 0) return absl::OkStatus();
    const uint64_t outer = static_cast<uint64_t>(Product(plan_.in_shape, 0, plan_.axis));
    const uint64_t inner_bytes = plan_.in_bytes / outer;
    std::vector<const void*> ins;
    std::vector<void*> outs;
    if (n() > 1) {
      // In place (out == in) is only possible in a group of one; stage any
      // other, as the other ops do.
      auto src = StagedInputs();
      if (!src.ok()) return src.status();
      for (int g = 0; g < num_groups(); ++g) {
        for (int i = 0; i < n(); ++i) {
          ins.push_back((*src)[Member(g, i)]);
          outs.push_back(io_[Member(g, i)].out);
        }
      }
    } else {
      // Groups of one: the output is the input (a copy unless in place).
      AllMembers(&ins, &outs);
      for (size_t e = 0; e < ins.size(); ++e) {
        COLLECTIVED_RETURN_IF_ERROR(CopyD2D(outs[e], ins[e], plan_.in_bytes));
      }
      return absl::OkStatus();
    }
    auto table = Table(ins, outs);
    if (!table.ok()) return table.status();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "LaunchAllGather",
        cuda_kernels::LaunchAllGather(*table, n(), num_groups(), outer, inner_bytes,
                                      CopyUnit(inner_bytes, ins, outs), stream_));
    return absl::OkStatus();
  }

  absl::Status RunPermute() {
    const uint64_t bytes = plan_.in_bytes;
    if (bytes == 0) return absl::OkStatus();
    auto src = StagedInputs();
    if (!src.ok()) return src.status();
    for (int g = 0; g < num_groups(); ++g) {
      for (int dst = 0; dst < n(); ++dst) {
        const int s = plan_.kind == OpKind::kBroadcast ? plan_.root : plan_.perm_source[dst];
        uint8_t* out = io_[Member(g, dst)].out;
        if (out == nullptr) continue;  // written on another GPU
        if (s < 0) {
          COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaMemsetAsync",
                                           cudaMemsetAsync(out, 0, bytes, stream_));
        } else {
          COLLECTIVED_RETURN_IF_ERROR(CopyD2D(out, (*src)[Member(g, s)], bytes));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunAllToAll() {
    if (plan_.in_bytes == 0) return absl::OkStatus();
    const size_t es = DTypeSize(plan_.dtype);
    auto src = StagedInputs();
    if (!src.ok()) return src.status();
    std::vector<const void*> ins;
    std::vector<void*> outs;
    for (int g = 0; g < num_groups(); ++g) {
      for (int i = 0; i < n(); ++i) {
        ins.push_back((*src)[Member(g, i)]);
        outs.push_back(io_[Member(g, i)].out);
      }
    }
    const AllToAllDims dims = cuda_kernels::CollapseAllToAll(
        plan_.a2a_shape.data(), static_cast<int>(plan_.a2a_shape.size()), plan_.split_axis,
        plan_.concat_axis, n());
    auto table = Table(ins, outs);
    if (!table.ok()) return table.status();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "LaunchAllToAll",
        cuda_kernels::LaunchAllToAll(*table, n(), num_groups(), plan_.in_bytes / es, es, dims,
                                     stream_));
    return absl::OkStatus();
  }

  const OpPlan& plan_;
  const std::vector<MemberIo>& io_;
  const cudaStream_t stream_;
  std::vector<void*> scratch_;
  std::vector<void*> sync_scratch_;
  std::deque<std::vector<const void*>> host_tables_;
  uint64_t extra_read_ = 0;
  uint64_t extra_written_ = 0;
};

absl::Status NcclError(absl::string_view call, ncclResult_t r) {
  return absl::InternalError(absl::StrCat("cuda executor: ", call, ": ", ncclGetErrorString(r),
                                          " (", ncclGetLastError(nullptr), ")"));
}

// Waits until no communicator of `comms` is ncclInProgress (what a
// non-blocking communicator reports while it initializes or enqueues), or
// `deadline` (DEADLINE_EXCEEDED saying `what` did not complete `within`:
// "within <kNcclTimeout>" unless given), or
// until `*abort` (when given) is true (ABORTED).
absl::Status AwaitComms(const std::vector<ncclComm_t>& comms, absl::string_view what,
                        absl::Time deadline,
                        absl::string_view within = "",
                        const std::atomic<bool>* abort = nullptr) {
  for (;;) {
    bool pending = false;
    for (ncclComm_t c : comms) {
      if (c == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(c, &state);
      if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r);
      if (state == ncclInProgress) {
        pending = true;
      } else if (state != ncclSuccess) {
        return NcclError(what, state);
      }
    }
    if (!pending) return absl::OkStatus();
    if (abort != nullptr && abort->load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat("cuda executor: ", what, " aborted"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "cuda executor: ", what, " did not complete ",
          within.empty()
              ? absl::StrCat("within ", absl::FormatDuration(CudaExecutor::kNcclTimeout))
              : std::string(within)));
    }
    std::this_thread::yield();
  }
}

// The Fabric of an op across GPUs: partitions are device ordinals; transfers
// are NCCL sends and receives (cudaMemcpyAsync within a GPU), local runs are
// OpRuns, everything on each device's one stream.
class NcclFabric final : public Fabric {
 public:
  NcclFabric(const std::vector<ncclComm_t>& comms, const std::vector<cudaStream_t>& streams,
             absl::Time deadline)
      : comms_(comms), streams_(streams), deadline_(deadline) {}
  ~NcclFabric() override { Release(); }

  absl::StatusOr<uint8_t*> Scratch(int part, uint64_t bytes) override {
    ScopedDevice scoped;
    COLLECTIVED_RETURN_IF_ERROR(scoped.Set(part));
    bool stream_ordered = false;
    auto p = AllocScratch(std::max<uint64_t>(bytes, 1), streams_[part], &stream_ordered);
    if (!p.ok()) return p.status();
    scratch_.push_back(Scratched{part, *p, stream_ordered});
    return *p;
  }

  absl::Status Exchange(const std::vector<Transfer>& transfers) override {
    std::vector<ncclComm_t> used;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return NcclError("ncclGroupStart", r);
    absl::Status status;
    for (const Transfer& t : transfers) {
      if (t.bytes == 0) continue;
      if (t.src_part == t.dst_part) {
        ScopedDevice scoped;
        status = scoped.Set(t.src_part);
        if (status.ok()) {
          const cudaError_t e = cudaMemcpyAsync(t.dst, t.src, t.bytes, cudaMemcpyDeviceToDevice,
                                                streams_[t.src_part]);
          if (e != cudaSuccess) status = CudaError("cudaMemcpyAsync", e);
        }
        if (!status.ok()) break;
        continue;
      }
      r = ncclSend(t.src, t.bytes, ncclUint8, t.dst_part, comms_[t.src_part],
                   streams_[t.src_part]);
      if (r == ncclSuccess || r == ncclInProgress) {
        r = ncclRecv(t.dst, t.bytes, ncclUint8, t.src_part, comms_[t.dst_part],
                     streams_[t.dst_part]);
      }
      if (r != ncclSuccess && r != ncclInProgress) {
        status = NcclError("ncclSend/ncclRecv", r);
        break;
      }
      used.push_back(comms_[t.src_part]);
      used.push_back(comms_[t.dst_part]);
    }
    r = ncclGroupEnd();
    exchanged_ = true;
    if (status.ok() && r != ncclSuccess && r != ncclInProgress) {
      status = NcclError("ncclGroupEnd", r);
    }
    // A non-blocking communicator takes no more calls until the group is
    // enqueued, error or not.
    const absl::Status enqueued =
        AwaitComms(used, "enqueueing the exchange between GPUs", deadline_);
    if (status.ok()) status = enqueued;
    // Part of a failed group may be enqueued (a send whose receive was
    // refused would never finish): the communicators must be aborted before
    // any memory the group uses is freed (see Finish).
    if (!status.ok()) failed_ = true;
    return status;
  }

  absl::Status RunLocal(int part, const OpPlan& plan, const std::vector<MemberIo>& io) override {
    ScopedDevice scoped;
    COLLECTIVED_RETURN_IF_ERROR(scoped.Set(part));
    auto& run = runs_.emplace_back(part, std::make_unique<OpRun>(plan, io, streams_[part]));
    return run.second->Execute();
  }

  absl::Status Copy(int part, uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    if (dst == src || bytes == 0) return absl::OkStatus();
    ScopedDevice scoped;
    COLLECTIVED_RETURN_IF_ERROR(scoped.Set(part));
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync",
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, streams_[part]));
    return absl::OkStatus();
  }

  // Polls every stream until its work is done, a communicator reports an
  // error, or the deadline.
  absl::Status Finish() override {
    if (failed_) {
      // Not waited for: the caller aborts the communicators first.
      return absl::InternalError("cuda executor: an exchange between GPUs failed");
    }
    absl::Status status = Wait();
    if (status.ok()) {
      for (auto& [part, run] : runs_) {
        extra_read_ += run->extra_read();
        extra_written_ += run->extra_written();
      }
    }
    if (!status.ok()) failed_ = true;
    // After a failure the caller aborts the communicators before anything
    // here is freed (see ~NcclFabric); on success the streams are idle.
    if (status.ok()) Release();
    return status;
  }

  bool failed() const { return failed_; }
  uint64_t extra_read() const { return extra_read_; }
  uint64_t extra_written() const { return extra_written_; }

  // Frees the scratch and the runs (each waits for its stream). Uses only
  // the streams: never the plans or member tables of the runs, which may be
  // gone by now.
  void Release() {
    for (auto& [part, run] : runs_) {
      ScopedDevice scoped;
      if (scoped.Set(part).ok()) run.reset();
    }
    runs_.clear();
    for (const Scratched& s : scratch_) {
      ScopedDevice scoped;
      if (!scoped.Set(s.part).ok()) continue;
      FreeScratch(s.p, s.stream_ordered, streams_[s.part]);
    }
    scratch_.clear();
  }

 private:
  absl::Status Wait() {
    std::vector<int> parts;
    for (const Scratched& sc : scratch_) parts.push_back(sc.part);
    for (const auto& [part, run] : runs_) parts.push_back(part);
    for (size_t d = 0; d < streams_.size(); ++d) {
      if (streams_[d] != nullptr) parts.push_back(static_cast<int>(d));
    }
    std::sort(parts.begin(), parts.end());
    parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
    for (int part : parts) {
      for (;;) {
        const cudaError_t e = cudaStreamQuery(streams_[part]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return CudaError("cudaStreamQuery", e);
        if (exchanged_) {
          ncclResult_t state = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(comms_[part], &state);
          if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r);
          if (state != ncclSuccess && state != ncclInProgress) {
            return NcclError("the exchange between GPUs", state);
          }
        }
        if (absl::Now() > deadline_) {
          return absl::DeadlineExceededError(absl::StrCat(
              "cuda executor: an op across GPUs did not finish on GPU ", part, " within ",
              absl::FormatDuration(CudaExecutor::kNcclTimeout)));
        }
        std::this_thread::yield();
      }
    }
    return absl::OkStatus();
  }

  const std::vector<ncclComm_t>& comms_;
  const std::vector<cudaStream_t>& streams_;
  const absl::Time deadline_;
  struct Scratched {
    int part;
    void* p;
    bool stream_ordered;  // cudaMallocAsync (else cudaMalloc)
  };
  std::vector<Scratched> scratch_;
  std::deque<std::pair<int, std::unique_ptr<OpRun>>> runs_;
  bool exchanged_ = false;
  bool failed_ = false;
  uint64_t extra_read_ = 0;
  uint64_t extra_written_ = 0;
};


// A link between the hosts of a cluster mesh (HostLink, spanning.h): one
// NCCL communicator with one rank per host, on the device of this host's
// members, and a stream of its own.
class NcclHostLink final : public HostLink {
 public:
  // `device_mu`: the executor's lock of the device (its one launch order).
  NcclHostLink(int device, int rank, ncclComm_t comm, cudaStream_t stream, Mutex* device_mu)
      : device_(device), rank_(rank), comm_(comm), stream_(stream), device_mu_(device_mu) {}
  ~NcclHostLink() override {
    ScopedDevice scoped;
    if (!scoped.Set(device_).ok()) return;
    AbortComm();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  NcclHostLink(const NcclHostLink&) = delete;
  NcclHostLink& operator=(const NcclHostLink&) = delete;

  int device() const override { return device_; }

  absl::Status Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                   const SpanningOptions& options, uint8_t* placeholder, absl::Time deadline,
                   const std::atomic<bool>& abort, Traffic* traffic) override;

 private:
  class Fabric;
  // Stops the communicator's kernels and frees it (the stream then drains).
  void AbortComm() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const int device_;
  const int rank_;
  ncclComm_t comm_;
  const cudaStream_t stream_;
  Mutex* const device_mu_;
};

// This host's view of an op's schedule across hosts (partitions are host
// ranks): its sends and receives go through the link's communicator, its
// local runs, copies and scratch are on the link's stream; the other hosts'
// parts are skipped. Like GlooFabric, but with the bytes on the GPU.
class NcclHostLink::Fabric final : public collectived::Fabric {
 public:
  Fabric(ncclComm_t comm, cudaStream_t stream, int self, int device, uint8_t* placeholder,
         absl::Time deadline, const std::atomic<bool>& abort)
      : comm_(comm),
        stream_(stream),
        self_(self),
        device_(device),
        placeholder_(placeholder),
        deadline_(deadline),
        abort_(abort) {}
  // Frees what it holds; after a failure only once the communicator was
  // aborted (the caller's duty), so that nothing still uses it.
  ~Fabric() override { Release(); }

  absl::StatusOr<uint8_t*> Scratch(int part, uint64_t bytes) override {
    if (part != self_) return placeholder_;
    bool stream_ordered = false;
    auto p = AllocScratch(std::max<uint64_t>(bytes, 1), stream_, &stream_ordered);
    if (!p.ok()) return p.status();
    scratch_.push_back(Scratched{*p, stream_ordered});
    return *p;
  }

  absl::Status Exchange(const std::vector<Transfer>& transfers) override {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return NcclError("ncclGroupStart", r);
    absl::Status status;
    for (const Transfer& t : transfers) {
      if (t.bytes == 0) continue;
      if (t.src_part == self_ && t.dst_part == self_) {
        if (t.dst != t.src) {
          const cudaError_t e =
              cudaMemcpyAsync(t.dst, t.src, t.bytes, cudaMemcpyDeviceToDevice, stream_);
          if (e != cudaSuccess) status = CudaError("cudaMemcpyAsync", e);
        }
        traffic_.read += t.bytes;
        traffic_.written += t.bytes;
      } else if (t.src_part == self_) {
        r = ncclSend(t.src, t.bytes, ncclUint8, t.dst_part, comm_, stream_);
        if (r != ncclSuccess && r != ncclInProgress) status = NcclError("ncclSend", r);
        traffic_.read += t.bytes;
      } else if (t.dst_part == self_) {
        r = ncclRecv(t.dst, t.bytes, ncclUint8, t.src_part, comm_, stream_);
        if (r != ncclSuccess && r != ncclInProgress) status = NcclError("ncclRecv", r);
        traffic_.written += t.bytes;
      }
      if (!status.ok()) break;
    }
    r = ncclGroupEnd();
    if (status.ok() && r != ncclSuccess && r != ncclInProgress) {
      status = NcclError("ncclGroupEnd", r);
    }
    // The non-blocking communicator takes no more calls until the group is
    // enqueued, error or not.
    const absl::Status enqueued = AwaitComms({comm_}, "enqueueing the exchange between hosts",
                                             deadline_, "within the op timeout", &abort_);
    if (status.ok()) status = enqueued;
    // Part of a failed group may be enqueued (a send whose receive never
    // comes): Finish does not wait for it; the caller aborts the
    // communicator before anything here is freed.
    if (!status.ok()) failed_ = status;
    return status;
  }

  absl::Status RunLocal(int part, const OpPlan& plan, const std::vector<MemberIo>& io) override {
    if (part != self_) return absl::OkStatus();
    auto local = std::make_unique<std::vector<MemberIo>>(io);
    for (MemberIo& m : *local) m.device = device_;
    auto run = std::make_unique<OpRun>(plan, *local, stream_);
    const absl::Status status = run->Execute();
    runs_.push_back(Local{std::move(local), std::move(run)});
    return status;
  }

  absl::Status Copy(int part, uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    if (part != self_ || dst == src || bytes == 0) return absl::OkStatus();
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    traffic_.read += bytes;
    traffic_.written += bytes;
    return absl::OkStatus();
  }

  // Polls the stream until its work is done, the communicator reports an
  // error, `abort`, or the deadline.
  absl::Status Finish() override {
    if (!failed_.ok()) return failed_;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return CudaError("cudaStreamQuery", e);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError("the exchange between hosts", state);
      }
      if (abort_.load(std::memory_order_acquire)) {
        return absl::AbortedError("cuda executor: the exchange between hosts was aborted");
      }
      if (absl::Now() > deadline_) {
        return absl::DeadlineExceededError(
            "cuda executor: the exchange between hosts did not finish within the op timeout");
      }
      std::this_thread::yield();
    }
    for (const Local& l : runs_) {
      traffic_.read += l.run->extra_read();
      traffic_.written += l.run->extra_written();
    }
    Release();
    return absl::OkStatus();
  }

  const Traffic& traffic() const { return traffic_; }

  // Frees the runs (each waits for the stream) and the scratch.
  void Release() {
    runs_.clear();
    for (const Scratched& s : scratch_) FreeScratch(s.p, s.stream_ordered, stream_);
    scratch_.clear();
  }

 private:
  struct Scratched {
    void* p;
    bool stream_ordered;  // cudaMallocAsync (else cudaMalloc)
  };
  // A local run and the member table it reads (it keeps a reference).
  struct Local {
    std::unique_ptr<std::vector<MemberIo>> io;
    std::unique_ptr<OpRun> run;
  };

  const ncclComm_t comm_;
  const cudaStream_t stream_;
  const int self_;
  const int device_;
  uint8_t* const placeholder_;
  const absl::Time deadline_;
  const std::atomic<bool>& abort_;
  std::vector<Scratched> scratch_;
  std::deque<Local> runs_;
  Traffic traffic_;
  absl::Status failed_;  // a failed exchange
};

absl::Status NcclHostLink::Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                               const SpanningOptions& options, uint8_t* placeholder,
                               absl::Time deadline, const std::atomic<bool>& abort,
                               Traffic* traffic) {
  if (comm_ == nullptr) {
    return absl::AbortedError("cuda executor: the link between hosts broke in an earlier op");
  }
  // One launch order per GPU, as for the executor's own ops (NCCL's rule
  // for communicators sharing a device): the op holds the device.
  MutexLock device_lock(device_mu_);
  ScopedDevice scoped;
  COLLECTIVED_RETURN_IF_ERROR(scoped.Set(device_));
  absl::Status status;
  Traffic moved;
  {
    Fabric fabric(comm_, stream_, rank_, device_, placeholder, deadline, abort);
    SpanningTraffic spanning;
    status = RunSpanning(plan, io, &fabric, &spanning, options);
    // Stuck or broken: stop the communicator's kernels before the fabric
    // waits for the stream and frees the memory they use.
    if (!status.ok()) AbortComm();
    moved = fabric.traffic();
  }
  if (!status.ok()) return status;
  if (traffic != nullptr) *traffic = moved;
  return absl::OkStatus();
}
}  // namespace

CudaExecutor::CudaExecutor() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // E.g. cudaErrorInsufficientDriver (no driver) or cudaErrorNoDevice.
    why_not_ = absl::StrCat("cuda executor: cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                            cudaGetErrorString(e), ")");
    cudaGetLastError();  // clear it for whoever uses the runtime next
    return;
  }
  if (count < 1) {
    why_not_ = "cuda executor: cudaGetDeviceCount found no CUDA device";
    return;
  }
  device_count_ = count;
  for (int d = 0; d < count; ++d) devices_.push_back(std::make_unique<Device>());
  // Ranks in this process (RunAcrossGpus), where NCCL would otherwise read
  // and write peers' buffers directly: the members' VMM buffers are mapped
  // for their own GPU only (and scratch comes from per-device pools), so
  // make it go through its own buffers. Set here, before any NCCL call
  // (links between hosts call NCCL from other threads); a value the
  // operator set is kept.
  setenv("NCCL_P2P_DIRECT_DISABLE", "1", /*overwrite=*/0);
}

CudaExecutor::~CudaExecutor() {
  {
    MutexLock lock(&across_mu_);
    nccl_.reset();
  }
  for (auto& d : devices_) {
    MutexLock lock(&d->mu);
    if (d->stream != nullptr) cudaStreamDestroy(d->stream);
    if (d->before != nullptr) cudaEventDestroy(d->before);
    if (d->after != nullptr) cudaEventDestroy(d->after);
  }
}

namespace {

// Records `event` on `stream`, making it (with timing) first if needed.
absl::Status RecordEvent(cudaEvent_t& event, cudaStream_t stream) {
  if (event == nullptr) {
    COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaEventCreate", cudaEventCreate(&event));
  }
  COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaEventRecord", cudaEventRecord(event, stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaExecutor::RunTimed(const OpPlan& plan, const std::vector<MemberIo>& io,
                                    Traffic* traffic, DeviceTiming* timing) {
  if (!IsViable()) return absl::FailedPreconditionError(why_not_);
  if (io.size() != plan.members()) {
    return absl::InvalidArgumentError(absl::StrCat("cuda executor: ", io.size(),
                                                   " member regions for an op of ",
                                                   plan.members(), " members"));
  }
  if (plan.kind == OpKind::kBarrier || io.empty()) {
    if (traffic != nullptr) *traffic = Traffic{};
    return absl::OkStatus();
  }
  const int device = io[0].device;
  for (const MemberIo& m : io) {
    if ((plan.in_bytes > 0 && m.in == nullptr) || (plan.out_bytes > 0 && m.out == nullptr)) {
      return absl::InvalidArgumentError("cuda executor: a member region is null");
    }
    if (m.device < 0 || m.device >= device_count_) {
      return absl::InvalidArgumentError(absl::StrCat("cuda executor: device ", m.device,
                                                     " out of range (", device_count_,
                                                     " devices)"));
    }
  }
  if (SpansPartitions(io)) return RunAcrossGpus(plan, io, traffic);
  Device& dev = *devices_[device];
  MutexLock lock(&dev.mu);
  ScopedDevice scoped;
  COLLECTIVED_RETURN_IF_ERROR(scoped.Set(device));
  if (dev.stream == nullptr) {
    COLLECTIVED_CUDA_RETURN_IF_ERROR(
        "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&dev.stream, cudaStreamNonBlocking));
  }
  uint64_t extra_read = 0, extra_written = 0;
  {
    if (timing != nullptr) COLLECTIVED_RETURN_IF_ERROR(RecordEvent(dev.before, dev.stream));
    OpRun run(plan, io, dev.stream);
    absl::Status status = run.Execute();
    if (status.ok() && timing != nullptr) {
      status = RecordEvent(dev.after, dev.stream);
      timing->launched_ns = fastq::MonotonicNs();
    }
    if (status.ok()) status = run.Finish();
    if (!status.ok()) return status;
    if (timing != nullptr) {
      float ms = 0;
      COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaEventElapsedTime",
                                       cudaEventElapsedTime(&ms, dev.before, dev.after));
      timing->device_ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    }
    extra_read = run.extra_read();
    extra_written = run.extra_written();
  }
  if (traffic != nullptr) *traffic = AccountTraffic(plan, extra_read, extra_written);
  return absl::OkStatus();
}

absl::Status CudaExecutor::CreateComms(absl::Time deadline) {
  auto nccl = std::make_unique<Nccl>();
  nccl->comms.assign(device_count_, nullptr);
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r);
  r = ncclGroupStart();
  if (r != ncclSuccess) return NcclError("ncclGroupStart", r);
  absl::Status status;
  for (int d = 0; d < device_count_; ++d) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ScopedDevice scoped;
    status = scoped.Set(d);
    if (!status.ok()) break;
    r = ncclCommInitRankConfig(&nccl->comms[d], device_count_, id, d, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      status = NcclError("ncclCommInitRankConfig", r);
      break;
    }
  }
  r = ncclGroupEnd();
  if (status.ok() && r != ncclSuccess && r != ncclInProgress) {
    status = NcclError("ncclGroupEnd", r);
  }
  if (status.ok()) {
    status = AwaitComms(nccl->comms, "creating the NCCL communicators", deadline);
  }
  if (!status.ok()) return status;  // ~Nccl aborts what was created
  nccl_ = std::move(nccl);
  return absl::OkStatus();
}

absl::Status CudaExecutor::RunAcrossGpus(const OpPlan& plan, const std::vector<MemberIo>& io,
                                         Traffic* traffic) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::vector<int> devices;
  for (const MemberIo& m : io) devices.push_back(m.device);
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  MutexLock across(&across_mu_);
  // Every device the op uses, in ordinal order (so two ops never wait on
  // each other), for one launch order per GPU.
  for (int d : devices) devices_[d]->mu.Lock();
  struct Unlock {
    CudaExecutor* self;
    const std::vector<int>& devices;
    ~Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (auto it = devices.rbegin(); it != devices.rend(); ++it) self->devices_[*it]->mu.Unlock();
    }
  } unlock{this, devices};
  const absl::Time deadline = absl::Now() + kNcclTimeout;

  std::vector<cudaStream_t> streams(device_count_, nullptr);
  for (int d : devices) {
    ScopedDevice scoped;
    COLLECTIVED_RETURN_IF_ERROR(scoped.Set(d));
    if (devices_[d]->stream == nullptr) {
      COLLECTIVED_CUDA_RETURN_IF_ERROR(
          "cudaStreamCreateWithFlags",
          cudaStreamCreateWithFlags(&devices_[d]->stream, cudaStreamNonBlocking));
    }
    streams[d] = devices_[d]->stream;
  }
  if (nccl_ == nullptr) {
    COLLECTIVED_RETURN_IF_ERROR(CreateComms(deadline));
  }

  SpanningTraffic moved;
  absl::Status status;
  uint64_t extra_read = 0, extra_written = 0;
  {
    NcclFabric fabric(nccl_->comms, streams, deadline);
    status = RunSpanning(plan, io, &fabric, &moved);
    if (fabric.failed()) {
      // Stuck or broken: abort every communicator (their kernels stop), then
      // let the fabric wait for the streams and free its memory.
      nccl_.reset();
    }
    extra_read = fabric.extra_read();
    extra_written = fabric.extra_written();
  }
  if (!status.ok()) return status;
  if (traffic != nullptr) {
    *traffic = AccountTraffic(plan, extra_read + moved.exchanged + moved.copied,
                              extra_written + moved.exchanged + moved.copied);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaExecutor::NewHostLinkId() {
  if (!IsViable()) return absl::FailedPreconditionError(why_not_);
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r);
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<HostLink>> CudaExecutor::ConnectHosts(
    const std::string& id, int rank, int ranks, int device, absl::Time deadline,
    const std::atomic<bool>& abort) {
  if (!IsViable()) return absl::FailedPreconditionError(why_not_);
  if (id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda executor: a link id of ", id.size(),
                                                   " bytes (NCCL's has ", sizeof(ncclUniqueId),
                                                   ")"));
  }
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda executor: rank ", rank, " of ", ranks, " hosts"));
  }
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(absl::StrCat("cuda executor: device ", device,
                                                   " out of range (", device_count_,
                                                   " devices)"));
  }
  ScopedDevice scoped;
  COLLECTIVED_RETURN_IF_ERROR(scoped.Set(device));
  cudaStream_t stream = nullptr;
  COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags",
                                   cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, ranks, uid, rank, &config);
  absl::Status status;
  if (r != ncclSuccess && r != ncclInProgress) {
    status = NcclError("ncclCommInitRankConfig", r);
  } else {
    status = AwaitComms({comm}, "connecting the hosts (NCCL)", deadline,
                        "by the deadline of the op that needed it", &abort);
  }
  if (!status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return status;
  }
  return std::unique_ptr<HostLink>(
      new NcclHostLink(device, rank, comm, stream, &devices_[device]->mu));
}

std::unique_ptr<Executor> MakeCudaExecutor() { return std::make_unique<CudaExecutor>(); }

}  // namespace collectived
