// nccl_perf: psum and all_gather over bare NCCL, measured as collectived_perf
// measures them (same flags, sizes, patterns, check, table and JSON keys; see
// peer_common.h and bench/README.md), in the manner of nccl-tests:
//
//   nccl_perf [--op=psum|all_gather|all] [--dtype=float32] [--min-bytes=8]
//             [--max-bytes=64M] [--step-factor=2] [--iters=20] [--warmup=5]
//             [--check=true] [--json] [--gpus=N]
//
// One process, one rank per visible GPU (or the first --gpus of them), made
// with ncclCommInitAll. psum = ncclAllReduce(ncclSum), all_gather =
// ncclAllGather, out of place on buffers allocated once with cudaMalloc. Per
// size: one checked op, a device synchronization (the barrier), `warmup`
// untimed ops and `iters` timed ops back to back, each rank's op timed with a
// pair of CUDA events on its stream; an iteration's time is the slowest rank's,
// and a row reports the median and the minimum over the iterations. The
// "members" of a row are the ranks.
//
// With one GPU there is one rank: NCCL's single-rank path (a local copy of the
// input into the output), not a collective over a link; busbw is then 0 by
// the nccl-tests definition (factor 2(n-1)/n or (n-1)/n). It is said in the
// output.
//
// Exit status: 0; 1 on an error or a failed check; 2 for a bad flag; 77 when
// no GPU is usable (no device, no driver), with the CUDA runtime's reason.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "peer_common.h"

namespace {

constexpr int kNoGpu = 77;

constexpr char kUsage[] =
    "usage: nccl_perf [flags]   (one process, one NCCL rank per visible GPU)\n";
constexpr char kOwnUsage[] =
    "  --gpus=N           ranks: the first N visible GPUs (default: all of them)\n";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "nccl_perf: %s\n", what.c_str());
  std::exit(1);
}

void CudaOk(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    Die(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

void NcclOk(ncclResult_t res, const char* what) {
  if (res != ncclSuccess) Die(std::string(what) + ": " + ncclGetErrorString(res));
}

ncclDataType_t NcclType(peers::DType dt) {
  switch (dt) {
    case peers::DType::kF32: return ncclFloat32;
    case peers::DType::kF64: return ncclFloat64;
    case peers::DType::kI32: return ncclInt32;
    case peers::DType::kU32: return ncclUint32;
    case peers::DType::kI64: return ncclInt64;
    case peers::DType::kU64: return ncclUint64;
  }
  return ncclFloat32;
}

struct Rank {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* in = nullptr;
  void* out = nullptr;
  std::vector<cudaEvent_t> start, stop;  // one pair per timed iteration
};

// Launches row r's op on every rank (one NCCL group).
void Launch(std::vector<Rank>& ranks, const peers::Row& r, peers::DType dt, bool timed, int it) {
  NcclOk(ncclGroupStart(), "ncclGroupStart");
  for (Rank& k : ranks) {
    CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
    if (timed) CudaOk(cudaEventRecord(k.start[static_cast<size_t>(it)], k.stream), "cudaEventRecord");
    if (r.op == peers::Op::kPsum) {
      NcclOk(ncclAllReduce(k.in, k.out, static_cast<size_t>(r.in_count), NcclType(dt), ncclSum,
                           k.comm, k.stream),
             "ncclAllReduce");
    } else {
      NcclOk(ncclAllGather(k.in, k.out, static_cast<size_t>(r.in_count), NcclType(dt), k.comm,
                           k.stream),
             "ncclAllGather");
    }
  }
  NcclOk(ncclGroupEnd(), "ncclGroupEnd");
  if (timed) {
    for (Rank& k : ranks) {
      CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
      CudaOk(cudaEventRecord(k.stop[static_cast<size_t>(it)], k.stream), "cudaEventRecord");
    }
  }
}

void SyncAll(std::vector<Rank>& ranks) {
  for (Rank& k : ranks) {
    CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
    CudaOk(cudaStreamSynchronize(k.stream), "cudaStreamSynchronize");
  }
}

}  // namespace

int main(int argc, char** argv) {
  peers::Config cfg;
  int want_gpus = 0;
  std::string err = peers::ParseFlags(argc, argv, cfg, {"gpus"},
                                      [&](const std::string& name, const std::string& value) {
                                        auto v = peers::ParseInt(value, 1, 1024);
                                        if (!v) return "--" + name + "=" + value + ": expected 1..1024";
                                        want_gpus = static_cast<int>(*v);
                                        return std::string();
                                      });
  if (cfg.help || !err.empty()) {
    if (!err.empty()) std::fprintf(stderr, "nccl_perf: %s\n", err.c_str());
    std::fprintf(err.empty() ? stdout : stderr, "%s%s%s", kUsage, peers::kCommonUsage, kOwnUsage);
    return err.empty() ? 0 : 2;
  }

  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::fprintf(stderr, "nccl_perf: no usable GPU: %s\n",
                 e != cudaSuccess
                     ? (std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)).c_str()
                     : "cudaGetDeviceCount found 0 devices");
    return kNoGpu;
  }
  if (want_gpus > count) {
    Die("--gpus=" + std::to_string(want_gpus) + " but only " + std::to_string(count) +
        " GPU(s) are visible");
  }
  const int n = want_gpus > 0 ? want_gpus : count;

  std::vector<peers::Row> rows = peers::PlanRows(cfg, n);
  size_t max_in = 64, max_out = 64;
  int64_t max_fill = 1;
  for (const peers::Row& r : rows) {
    max_in = std::max(max_in, r.in_bytes);
    max_out = std::max(max_out, r.out_bytes);
    max_fill = std::max(max_fill, r.in_count);
  }

  std::vector<Rank> ranks(static_cast<size_t>(n));
  std::vector<int> devs(static_cast<size_t>(n));
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) devs[static_cast<size_t>(i)] = i;
  NcclOk(ncclCommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll");
  for (int i = 0; i < n; ++i) {
    Rank& k = ranks[static_cast<size_t>(i)];
    k.device = i;
    k.comm = comms[static_cast<size_t>(i)];
    CudaOk(cudaSetDevice(i), "cudaSetDevice");
    CudaOk(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CudaOk(cudaMalloc(&k.in, max_in), "cudaMalloc (input)");
    CudaOk(cudaMalloc(&k.out, max_out), "cudaMalloc (output)");
    k.start.resize(static_cast<size_t>(cfg.iters));
    k.stop.resize(static_cast<size_t>(cfg.iters));
    for (int it = 0; it < cfg.iters; ++it) {
      CudaOk(cudaEventCreate(&k.start[static_cast<size_t>(it)]), "cudaEventCreate");
      CudaOk(cudaEventCreate(&k.stop[static_cast<size_t>(it)]), "cudaEventCreate");
    }
  }

  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  cudaDeviceProp prop{};
  CudaOk(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::string describe = "NCCL " + std::to_string(nccl_version) + ", " + std::to_string(n) +
                         " rank(s) on " + prop.name + (n > 1 ? " ..." : "");
  if (n == 1) {
    describe += "; ONE rank: NCCL's single-rank path (a local copy), busbw 0 by definition";
    std::fprintf(stderr,
                 "nccl_perf: note: 1 visible GPU, so nranks = 1: this measures NCCL's own "
                 "single-rank path (a device-local copy), not a collective over a link\n");
  }
  peers::Printer printer(cfg, "nccl", "nccl_perf", describe);

  std::vector<unsigned char> host(std::max(max_in, max_out));
  int check_failures = 0;
  std::optional<peers::Op> filled;
  for (const peers::Row& r : rows) {
    if (filled != r.op) {
      for (int i = 0; i < n; ++i) {
        Rank& k = ranks[static_cast<size_t>(i)];
        peers::FillInput(r.op, cfg.dtype, i, host.data(), max_fill);
        CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
        CudaOk(cudaMemcpy(k.in, host.data(),
                          static_cast<size_t>(max_fill * peers::DTypeSize(cfg.dtype)),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy H2D");
      }
      filled = r.op;
    }
    std::string check = "skipped";
    if (cfg.check) {
      for (Rank& k : ranks) {
        CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
        CudaOk(cudaMemset(k.out, 0xA5, r.out_bytes), "cudaMemset");
        CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      }
      Launch(ranks, r, cfg.dtype, false, 0);
      SyncAll(ranks);
      check = "ok";
      for (int i = 0; i < n; ++i) {
        Rank& k = ranks[static_cast<size_t>(i)];
        CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
        CudaOk(cudaMemcpy(host.data(), k.out, r.out_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
        std::string bad = peers::Verify(r.op, cfg.dtype, n, r, host.data());
        if (!bad.empty()) {
          check = "fail";
          std::fprintf(stderr, "nccl_perf: check failed: rank %d, %s %lld B: %s\n", i,
                       peers::OpName(r.op), static_cast<long long>(r.bytes), bad.c_str());
        }
      }
      if (check == "fail") ++check_failures;
    }
    SyncAll(ranks);  // every size starts together
    for (int w = 0; w < cfg.warmup; ++w) Launch(ranks, r, cfg.dtype, false, 0);
    for (int it = 0; it < cfg.iters; ++it) Launch(ranks, r, cfg.dtype, true, it);
    SyncAll(ranks);
    std::vector<std::vector<int64_t>> times(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      Rank& k = ranks[static_cast<size_t>(i)];
      CudaOk(cudaSetDevice(k.device), "cudaSetDevice");
      for (int it = 0; it < cfg.iters; ++it) {
        float ms = 0;
        CudaOk(cudaEventElapsedTime(&ms, k.start[static_cast<size_t>(it)],
                                    k.stop[static_cast<size_t>(it)]),
               "cudaEventElapsedTime");
        times[static_cast<size_t>(i)].push_back(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
      }
    }
    printer.PrintRow(r, n, peers::Summarize(r, n, times, check));
  }
  printer.Footer();

  for (Rank& k : ranks) {
    cudaSetDevice(k.device);
    for (cudaEvent_t e : k.start) cudaEventDestroy(e);
    for (cudaEvent_t e : k.stop) cudaEventDestroy(e);
    cudaFree(k.in);
    cudaFree(k.out);
    cudaStreamDestroy(k.stream);
    ncclCommDestroy(k.comm);
  }
  if (check_failures > 0) {
    std::fprintf(stderr, "nccl_perf: %d row(s) failed the check\n", check_failures);
    return 1;
  }
  return 0;
}
