#include "daemon/exec/cuda/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/sync.h"
#include "daemon/exec/cuda/cuda_kernels.h"

namespace collectived {

struct CudaExecutor::Device {
  Mutex mu;
  cudaStream_t stream ABSL_GUARDED_BY(mu) = nullptr;
};

namespace {

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
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
    if (e == cudaSuccess) {
      scratch_.push_back(p);
      return static_cast<uint8_t*>(p);
    }
    if (e != cudaErrorNotSupported) return CudaError("cudaMallocAsync", e);
    cudaGetLastError();  // clear it
    COLLECTIVED_CUDA_RETURN_IF_ERROR("cudaMalloc", cudaMalloc(&p, bytes));
    sync_scratch_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

  absl::Status CopyD2D(void* dst, const void* src, uint64_t bytes) {
    if (dst == src || bytes == 0) return absl::OkStatus();
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
    const size_t in_es = DTypeSize(plan_.dtype);
    const size_t out_es = DTypeSize(plan_.out_dtype);
    const uint64_t count = plan_.in_bytes / in_es;
    if (count == 0) return absl::OkStatus();
    const ReduceKind kind = ToReduceKind(plan_.kind);
    // As CpuExecutor::RunReduce: a mesh of one member, or an op over no
    // axes, reduces nothing (ReduceMeshOfOne); each group's first member
    // only.
    const bool mesh_of_one = plan_.members() == 1 || plan_.axis_ids.empty();
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
                                        count, stream_));
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
                                      stream_));
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
}

CudaExecutor::~CudaExecutor() {
  for (auto& d : devices_) {
    MutexLock lock(&d->mu);
    if (d->stream != nullptr) cudaStreamDestroy(d->stream);
  }
}

absl::Status CudaExecutor::Run(const OpPlan& plan, const std::vector<MemberIo>& io,
                               Traffic* traffic) {
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
    if (m.device != device) {
      return absl::UnimplementedError("members on different GPUs need NCCL (not built yet)");
    }
    if ((plan.in_bytes > 0 && m.in == nullptr) || (plan.out_bytes > 0 && m.out == nullptr)) {
      return absl::InvalidArgumentError("cuda executor: a member region is null");
    }
  }
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(absl::StrCat("cuda executor: device ", device,
                                                   " out of range (", device_count_,
                                                   " devices)"));
  }
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
    OpRun run(plan, io, dev.stream);
    absl::Status status = run.Execute();
    if (status.ok()) status = run.Finish();
    if (!status.ok()) return status;
    extra_read = run.extra_read();
    extra_written = run.extra_written();
  }
  if (traffic != nullptr) *traffic = AccountTraffic(plan, extra_read, extra_written);
  return absl::OkStatus();
}

std::unique_ptr<Executor> MakeCudaExecutor() { return std::make_unique<CudaExecutor>(); }

}  // namespace collectived
