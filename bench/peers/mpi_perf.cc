// mpi_perf: psum and all_gather over MPI, measured and reported exactly as
// bench/collectived_perf does, so that the two can be compared row by row
// (bench/peers/compare.py does that).
//
//   mpirun -np N [--oversubscribe --bind-to none --mca btl self,vader]
//       mpi_perf [--op=psum,all_gather] [--dtype=float32] [--min-bytes=8]
//                [--max-bytes=64M] [--step-factor=2] [--iters=20] [--warmup=5]
//                [--check=true] [--json]
//
// The members are the MPI ranks (N = the size of MPI_COMM_WORLD). psum is
// MPI_Allreduce(MPI_SUM) and all_gather is MPI_Allgather, both out of place
// (separate input and output buffers, allocated once for the largest size).
// For every op and size, each rank runs: one op whose result it verifies
// (with --check; exact small-integer data), MPI_Barrier, `warmup` untimed ops,
// then `iters` timed ops back to back, each timed with the monotonic clock.
// Rank 0 gathers every rank's per-iteration times; an iteration's time is the
// slowest rank's, and a row reports the median and the minimum (see
// peer_common.h and bench/README.md). JSON rows carry collectived_perf's keys
// plus "system":"openmpi".
//
// Exit status: 0; 1 when a check failed; 2 for a bad flag. An MPI error
// aborts the whole job (MPI's default error handler), so mpirun exits nonzero.

// Only MPI's C API is used: keep Open MPI's (and MPICH's) deprecated C++
// bindings out, so that nothing but the C library has to be linked.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "peer_common.h"

namespace {

using peers::Config;
using peers::DType;
using peers::Op;
using peers::Row;

constexpr char kUsage[] =
    "usage: mpirun -np N mpi_perf [flags]\n"
    "The members are the MPI ranks.\n";

MPI_Datatype MpiType(DType dt) {
  switch (dt) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kU32: return MPI_UINT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU64: return MPI_UINT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4".
std::string LibraryVersion() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string v(buf, static_cast<size_t>(len));
  if (size_t cut = v.find_first_of(",\n"); cut != std::string::npos) v.resize(cut);
  return v;
}

// One row's op with its arguments, set up before the timed loop.
struct Call {
  Op op;
  const void* in;
  void* out;
  int in_count;
  MPI_Datatype type;
};

void RunOp(const Call& c) {
  if (c.op == Op::kPsum) {
    MPI_Allreduce(c.in, c.out, c.in_count, c.type, MPI_SUM, MPI_COMM_WORLD);
  } else {
    MPI_Allgather(c.in, c.in_count, c.type, c.out, c.in_count, c.type, MPI_COMM_WORLD);
  }
}

int Run(const Config& cfg, int rank, int n) {
  const std::vector<Row> rows = peers::PlanRows(cfg, n);
  size_t max_in = 0, max_out = 0;
  std::map<Op, int64_t> fill_count;
  for (const Row& r : rows) {
    if (r.in_count > INT_MAX || r.out_count > INT_MAX) {
      if (rank == 0) {
        std::fprintf(stderr, "mpi_perf: %s of %" PRId64 " B needs more than INT_MAX elements\n",
                     peers::OpName(r.op), r.bytes);
      }
      return 2;
    }
    max_in = std::max(max_in, r.in_bytes);
    max_out = std::max(max_out, r.out_bytes);
    fill_count[r.op] = std::max(fill_count[r.op], r.in_count);
  }
  void* in = peers::AllocBuffer(max_in);
  void* out = peers::AllocBuffer(max_out);

  peers::Printer printer(cfg, "openmpi", "mpi_perf",
                         LibraryVersion() + ", " + std::to_string(n) + " ranks");
  std::vector<int64_t> times(static_cast<size_t>(cfg.iters));
  std::vector<int64_t> all_times(rank == 0 ? times.size() * static_cast<size_t>(n) : 1);
  int check_failures = 0;
  bool have_filled = false;
  Op filled = Op::kPsum;
  for (const Row& r : rows) {
    if (!have_filled || filled != r.op) {
      peers::FillInput(r.op, cfg.dtype, rank, in, fill_count[r.op]);
      filled = r.op;
      have_filled = true;
    }
    const Call call{r.op, in, out, static_cast<int>(r.in_count), MpiType(cfg.dtype)};
    std::string check = "skipped";
    if (cfg.check) {
      std::memset(out, 0xA5, r.out_bytes);
      RunOp(call);
      const std::string bad = peers::Verify(r.op, cfg.dtype, n, r, out);
      int failed = bad.empty() ? 0 : 1, any_failed = 0;
      if (failed) {
        std::fprintf(stderr, "mpi_perf: check failed: rank %d, %s %" PRId64 " B: %s\n", rank,
                     peers::OpName(r.op), r.bytes, bad.c_str());
      }
      MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      check = any_failed ? "fail" : "ok";
      if (any_failed) ++check_failures;
    }
    // Start every size together.
    MPI_Barrier(MPI_COMM_WORLD);
    for (int w = 0; w < cfg.warmup; ++w) RunOp(call);
    for (int it = 0; it < cfg.iters; ++it) {
      const int64_t t0 = peers::NowNs();
      RunOp(call);
      times[static_cast<size_t>(it)] = peers::NowNs() - t0;
    }
    MPI_Gather(times.data(), cfg.iters, MPI_INT64_T, all_times.data(), cfg.iters, MPI_INT64_T, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
      std::vector<std::vector<int64_t>> per_rank(static_cast<size_t>(n));
      for (int m = 0; m < n; ++m) {
        auto first = all_times.begin() + static_cast<std::ptrdiff_t>(m) * cfg.iters;
        per_rank[static_cast<size_t>(m)].assign(first, first + cfg.iters);
      }
      printer.PrintRow(r, n, peers::Summarize(r, n, per_rank, check));
    }
  }
  if (rank == 0) printer.Footer();
  std::free(in);
  std::free(out);
  if (check_failures > 0) {
    if (rank == 0) std::fprintf(stderr, "mpi_perf: %d row(s) failed the check\n", check_failures);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  Config cfg;
  // Every rank parses the same flags, so every rank takes the same path.
  const std::string err = peers::ParseFlags(
      argc, argv, cfg, {}, [](const std::string&, const std::string&) { return std::string(); });
  int rc = 0;
  if (cfg.help) {
    if (rank == 0) std::printf("%sflags:\n%s", kUsage, peers::kCommonUsage);
  } else if (!err.empty()) {
    if (rank == 0) std::fprintf(stderr, "mpi_perf: %s\n%sflags:\n%s", err.c_str(), kUsage, peers::kCommonUsage);
    rc = 2;
  } else {
    rc = Run(cfg, rank, n);
  }
  MPI_Finalize();
  return rc;
}
