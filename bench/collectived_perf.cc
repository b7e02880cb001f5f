// collectived_perf: latency and bandwidth of every collective, in the manner
// of nccl-tests' all_reduce_perf.
//
//   collectived_perf [--op=psum|...|all] [--members=2[,4,...]] [--dtype=float32]
//                    [--min-bytes=8] [--max-bytes=64M] [--step-factor=2]
//                    [--iters=20] [--warmup=5] [--check=true] [--json]
//                    [--socket=PATH] [--device=cpu|cuda[:N]|GPU-<uuid>] [--hosts=N]
//
// The parent process starts a private daemon (unless --socket names a running
// one), then for each member count N starts N member processes (this same
// binary, exec'd in member mode), which join one mesh and run, for every op
// and size: one checked op, a barrier, `warmup` untimed ops and `iters` timed
// ops issued back to back. Each member times each op with a steady clock and
// sends its times to the parent through a pipe; an iteration's time is the
// slowest member's, and a row reports the median and the minimum over the
// iterations. See bench/README.md for the column definitions.
//
// With --device=cuda the members' buffers are GPU memory (the daemon's CUDA
// VMM allocations): inputs are written with cudaMemcpy before the timed ops
// and results are copied back to the host to be checked.
//
// With --hosts=N (N > 1) the parent starts N private daemons as the hosts of
// a cluster on loopback (daemon 0 serves the coordinator) and member m joins
// through daemon m mod N (--placement=round_robin, the default) or daemon
// m * N / members (--placement=runs: each host a contiguous run of members,
// as processes of a multi-host JAX job are numbered): every mesh spans the
// hosts, and ops go between the daemons over Gloo (host memory) or NCCL (GPU
// memory).
//
// The parent never talks gRPC; members are fork+exec'd, never plain forked.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include <grpcpp/grpcpp.h>

#include "collectived/client.h"
#include "collectived/dtype.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "plan/op_plan.h"

#if COLLECTIVED_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using collectived::Array;
using collectived::DType;

// ---------------------------------------------------------------------------
// Ops and the size plan (computed identically by the parent and the members).

using collectived::CollectiveKind;

// The benchmark's rows: the collectives, whose values are the SDK's own
// CollectiveKind (one vocabulary; each row runs as a collectived::Collective
// through Mesh::submit and Mesh::run, the SDK's one mapping to the wire), and
// two probes of the gRPC path that are not collectives.
enum class Op : int {
  kPsum = static_cast<int>(CollectiveKind::kPsum),
  kPmean = static_cast<int>(CollectiveKind::kPmean),
  kPmax = static_cast<int>(CollectiveKind::kPmax),
  kPmin = static_cast<int>(CollectiveKind::kPmin),
  kAllGather = static_cast<int>(CollectiveKind::kAllGather),
  kPpermute = static_cast<int>(CollectiveKind::kPpermute),
  kPsumScatter = static_cast<int>(CollectiveKind::kPsumScatter),
  kAllToAll = static_cast<int>(CollectiveKind::kAllToAll),
  kBroadcast = static_cast<int>(CollectiveKind::kBroadcast),
  kBarrier = static_cast<int>(CollectiveKind::kBarrier),
  // Not a collective: one Write and one Read on a gRPC bidi stream to a bare
  // server in this benchmark that answers at once (the floor of the gRPC path).
  kGrpcEcho = 100,
  // Not a collective: the same server answers a round only once every member
  // of the mesh sent it (the floor of a gRPC op that needs all members).
  kGrpcRendezvous = 101,
};

constexpr Op kAllOps[] = {Op::kPsum,        Op::kPmean,    Op::kPmax,      Op::kPmin,
                          Op::kAllGather,   Op::kPpermute, Op::kPsumScatter,
                          Op::kAllToAll,    Op::kBroadcast, Op::kBarrier};

const char* OpName(Op op) {
  switch (op) {
    case Op::kPsum: return "psum";
    case Op::kPmean: return "pmean";
    case Op::kPmax: return "pmax";
    case Op::kPmin: return "pmin";
    case Op::kAllGather: return "all_gather";
    case Op::kPpermute: return "ppermute";
    case Op::kPsumScatter: return "psum_scatter";
    case Op::kAllToAll: return "all_to_all";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
    case Op::kGrpcEcho: return "grpc_echo";
    case Op::kGrpcRendezvous: return "grpc_rendezvous";
  }
  return "?";
}

std::optional<Op> OpFromName(absl::string_view name) {
  for (Op op : kAllOps) {
    if (name == OpName(op)) return op;
  }
  if (name == OpName(Op::kGrpcEcho)) return Op::kGrpcEcho;
  if (name == OpName(Op::kGrpcRendezvous)) return Op::kGrpcRendezvous;
  return std::nullopt;
}

bool IsGrpcProbe(Op op) { return op == Op::kGrpcEcho || op == Op::kGrpcRendezvous; }

// Ops with a single row of size 0.
bool Sizeless(Op op) { return op == Op::kBarrier || IsGrpcProbe(op); }

bool IsReduction(Op op) {
  return op == Op::kPsum || op == Op::kPmean || op == Op::kPmax || op == Op::kPmin;
}

// Ops whose dimension 0 is split into n tiles.
bool IsTiled(Op op) {
  return op == Op::kAllGather || op == Op::kPsumScatter || op == Op::kAllToAll;
}

// nccl-tests' bus bandwidth factor.
double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kPsum:
    case Op::kPmean:
    case Op::kPmax:
    case Op::kPmin:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kPsumScatter:
    case Op::kAllToAll:
      return static_cast<double>(n - 1) / n;
    case Op::kBroadcast:
    case Op::kPpermute:
      return 1.0;
    case Op::kBarrier:
    case Op::kGrpcEcho:
    case Op::kGrpcRendezvous:
      return 0.0;
  }
  return 0.0;
}

// The result dtype of an op: a reduction's as jax.lax defines it (the
// daemon's rule, plan/), the input's for the others.
DType OutDType(Op op, DType dt) {
  if (op == Op::kPsum) return collectived::ReduceResultDType(collectived::ReduceKind::kSum, dt);
  if (op == Op::kPmean) {
    return collectived::ReduceResultDType(collectived::ReduceKind::kMean, dt);
  }
  return dt;
}

struct Row {
  Op op;
  int64_t in_count = 0;   // elements of the input, per member
  int64_t out_count = 0;  // elements of the output, per member
  int64_t bytes = 0;      // the reported size (nccl-tests semantics)
  int64_t count = 0;      // bytes / element size
  size_t in_bytes = 0;
  size_t out_bytes = 0;
};

struct Config {
  std::vector<Op> ops;
  std::vector<int> members;
  DType dtype = DType::kF32;
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{64} << 20;
  int64_t step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
  bool check = true;
  std::string socket;
  bool fast_path = true;       // --path=fast (default) or grpc
  bool breakdown = false;      // print where fast-path op time goes
  bool stream = false;         // GPU ops ordered with each member's CUDA stream
  int64_t spin_us = -1;        // client polling before sleeping; -1: the SDK's default
  std::vector<std::string> daemon_args;  // extra flags for a private daemon
  std::string device = "cpu";  // where the members' buffers live (Client::Allocate)
  int hosts = 1;               // private daemons forming a cluster
  bool in_runs = false;        // --placement=runs: member m on daemon m * hosts / members
  bool shared_output = false;  // --output=shared: results into a mesh-shared buffer
  std::string echo_socket;     // grpc_echo: the parent's echo server
  // Member mode (hidden flags).
  int member = -1;
  int report_fd = -1;
  std::string mesh;
};

std::vector<Row> PlanRows(const Config& cfg, int n) {
  std::vector<Row> rows;
  const int64_t es = static_cast<int64_t>(collectived::DTypeSize(cfg.dtype));
  for (Op op : cfg.ops) {
    const DType out_dt = OutDType(op, cfg.dtype);
    const int64_t out_es = static_cast<int64_t>(collectived::DTypeSize(out_dt));
    if (Sizeless(op)) {
      rows.push_back(Row{op});
      continue;
    }
    int64_t last_bytes = -1;
    for (int64_t s = cfg.min_bytes; s <= cfg.max_bytes;) {
      Row r{op};
      int64_t elems = std::max<int64_t>(1, s / es);
      if (IsTiled(op)) elems = std::max<int64_t>(n, elems / n * n);
      switch (op) {
        case Op::kAllGather:  // `bytes` is the output size
          r.out_count = elems;
          r.in_count = elems / n;
          r.count = r.out_count;
          break;
        case Op::kPsumScatter:
          r.in_count = elems;
          r.out_count = elems / n;
          r.count = r.in_count;
          break;
        default:
          r.in_count = r.out_count = r.count = elems;
          break;
      }
      r.bytes = r.count * es;
      r.in_bytes = static_cast<size_t>(r.in_count * es);
      r.out_bytes = static_cast<size_t>(r.out_count * out_es);
      if (r.bytes != last_bytes) rows.push_back(r);
      last_bytes = r.bytes;
      if (s > cfg.max_bytes / cfg.step_factor) break;
      s *= cfg.step_factor;
    }
  }
  return rows;
}

// ---------------------------------------------------------------------------
// Flags. Hand-parsed so that every bad flag exits 2 with a message.

constexpr char kUsage[] =
    "usage: collectived_perf [flags]\n"
    "  --op=NAME          psum (default), pmean, pmax, pmin, all_gather, ppermute,\n"
    "                     psum_scatter, all_to_all, broadcast, barrier, or all;\n"
    "                     a comma list is accepted too; grpc_echo (not in all) times\n"
    "                     a bare gRPC bidi-stream round trip to a server in the\n"
    "                     benchmark that answers at once; grpc_rendezvous (not in\n"
    "                     all) the same, answered once every member sent its round\n"
    "  --members=N[,M..]  member processes (default 2)\n"
    "  --dtype=NAME       float32 (default), float64, float16, bfloat16, int8, uint8,\n"
    "                     int32, uint32, int64, uint64, bool, float8_e4m3fn,\n"
    "                     float8_e5m2\n"
    "  --min-bytes=SIZE   smallest size (default 8); suffixes K, M, G (powers of 1024)\n"
    "  --max-bytes=SIZE   largest size (default 64M)\n"
    "  --step-factor=F    multiply the size by F between rows (default 2)\n"
    "  --iters=N          timed iterations per size (default 20)\n"
    "  --warmup=N         untimed iterations per size (default 5)\n"
    "  --check[=BOOL]     verify the result of the first (untimed) op of each size\n"
    "                     (default true)\n"
    "  --json[=BOOL]      one JSON object per row on stdout instead of the table\n"
    "  --socket=PATH      use the daemon at PATH; empty (default): start a private one\n"
    "  --path=fast|grpc   submit ops through the shared-memory queue (default) or the\n"
    "                     gRPC Execute stream\n"
    "  --spin-us=N        microseconds a waiting member polls before sleeping\n"
    "                     (default: the SDK's)\n"
    "  --breakdown        after each row, where each member's fast-path op time went (the ops\n"
    "                     are then asynchronous: the daemon path, never member-side):\n"
    "                     medians of submit (SDK) -> taken (daemon's queue thread) ->\n"
    "                     matched (every member's op there, its turn) -> ready (members'\n"
    "                     streams reached it) -> started (a daemon thread runs it) ->\n"
    "                     launched (GPU: kernels enqueued) -> executed (outputs written)\n"
    "                     -> completed (published) -> reaped (the member saw it), and\n"
    "                     a GPU op's first enqueue -> GPU done (CUDA events: the\n"
    "                     launching and the GPU's work; it begins about at started)\n"
    "  --stream           with --device=cuda: each member orders its ops with its own\n"
    "                     CUDA stream (Mesh::submit(op, stream)) and times submit ->\n"
    "                     the stream synchronized: what an op costs the stream\n"
    "  --daemon-args=STR  extra flags for the private daemon, space separated\n"
    "                     (e.g. \"--threads=2 --fast-path-spin-us=0\")\n"
    "  --device=DEV       where the members' buffers live: cpu (default), cuda (= cuda:0),\n"
    "                     cuda:N (the daemon's ordinal), GPU-<uuid> or cuda:GPU-<uuid>\n"
    "                     (needs a build with CUDA and a GPU the daemon can use), or\n"
    "                     cuda:spread: member m on GPU m mod (visible GPUs), so ops\n"
    "                     cross GPUs (NCCL) when there are several\n"
    "  --hosts=N          start N private daemons as the hosts of a cluster on loopback\n"
    "                     and spread the members over them (default 1; host memory\n"
    "                     only; not with --socket)\n"
    "  --placement=P      with --hosts: round_robin (member m on host m mod N, the\n"
    "                     default) or runs (member m on host m*N/members: each host a\n"
    "                     contiguous run of members)\n"
    "  --output=O         where results go: member (each member's own buffer, the\n"
    "                     default) or shared (one buffer the mesh's members share,\n"
    "                     Mesh::AllocateShared: written once; psum, pmean, pmax, pmin,\n"
    "                     all_gather and broadcast only, host memory)\n";

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "collectived_perf: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

// "64M" -> 67108864. Suffixes K, M, G (optionally followed by B or iB).
std::optional<int64_t> ParseSize(absl::string_view text) {
  std::string t = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  int shift = 0;
  for (absl::string_view suffix : {"IB", "B"}) {
    if (t.size() > suffix.size() && absl::EndsWith(t, suffix)) {
      t.resize(t.size() - suffix.size());
      break;
    }
  }
  if (!t.empty()) {
    switch (t.back()) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) t.pop_back();
  }
  int64_t v = 0;
  if (t.empty() || !absl::SimpleAtoi(t, &v) || v < 0) return std::nullopt;
  if (v > (INT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

std::optional<bool> ParseBool(absl::string_view text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "" || t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return std::nullopt;
}

int ParseInt(const std::string& flag, const std::string& value, int lo, int hi) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    UsageError(absl::StrCat("--", flag, "=", value, ": expected an integer in ", lo, "..", hi));
  }
  return v;
}

Config ParseFlags(int argc, char** argv) {
  Config cfg;
  std::string ops = "psum", members = "2";
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (!absl::StartsWith(arg, "--")) UsageError(absl::StrCat("unexpected argument '", arg, "'"));
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    std::replace(name.begin(), name.end(), '_', '-');
    const bool is_bool = name == "json" || name == "check" || name == "nojson" ||
                         name == "nocheck" || name == "no-json" || name == "no-check" ||
                         name == "breakdown" || name == "stream";
    if (is_bool) {
      bool negated = absl::StartsWith(name, "no");
      std::string base = negated ? name.substr(name[2] == '-' ? 3 : 2) : name;
      if (negated && has_value) UsageError(absl::StrCat("--", name, " takes no value"));
      std::optional<bool> b = negated ? std::optional<bool>(false) : ParseBool(value);
      if (!b) UsageError(absl::StrCat("--", name, "=", value, ": expected true or false"));
      (base == "json"        ? cfg.json
       : base == "check"     ? cfg.check
       : base == "breakdown" ? cfg.breakdown
                             : cfg.stream) = *b;
      continue;
    }
    static const char* const kValued[] = {"op",     "members", "dtype",  "min-bytes",
                                          "max-bytes", "step-factor", "iters", "warmup",
                                          "socket", "member",  "report-fd", "mesh",
                                          "path",   "spin-us", "daemon-args", "echo-socket",
                                          "device", "hosts", "placement", "output"};
    if (std::none_of(std::begin(kValued), std::end(kValued),
                     [&](const char* f) { return name == f; })) {
      UsageError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (a + 1 >= argc) UsageError(absl::StrCat("--", name, " needs a value"));
      value = argv[++a];
    }
    if (name == "op") {
      ops = value;
    } else if (name == "members") {
      members = value;
    } else if (name == "dtype") {
      auto dt = collectived::DTypeFromName(std::string(value));
      if (!dt) {
        UsageError(absl::StrCat("--dtype=", value,
                                ": expected float32, float64, float16, bfloat16, int8, uint8, "
                                "int32, uint32, int64, uint64, bool, float8_e4m3fn or "
                                "float8_e5m2"));
      }
      cfg.dtype = *dt;
    } else if (name == "min-bytes" || name == "max-bytes") {
      auto v = ParseSize(value);
      if (!v) UsageError(absl::StrCat("--", name, "=", value, ": expected a size like 8, 1K, 64M"));
      (name == "min-bytes" ? cfg.min_bytes : cfg.max_bytes) = *v;
    } else if (name == "step-factor") {
      cfg.step_factor = ParseInt(name, value, 2, 1 << 20);
    } else if (name == "iters") {
      cfg.iters = ParseInt(name, value, 1, 1000000);
    } else if (name == "warmup") {
      cfg.warmup = ParseInt(name, value, 0, 1000000);
    } else if (name == "socket") {
      cfg.socket = value;
    } else if (name == "path") {
      if (value != "fast" && value != "grpc") UsageError("--path must be fast or grpc");
      cfg.fast_path = value == "fast";
    } else if (name == "spin-us") {
      cfg.spin_us = ParseInt(name, value, 0, 1000000);
    } else if (name == "daemon-args") {
      cfg.daemon_args = absl::StrSplit(value, ' ', absl::SkipEmpty());
    } else if (name == "device") {
      cfg.device = value;
    } else if (name == "hosts") {
      cfg.hosts = ParseInt(name, value, 1, 64);
    } else if (name == "placement") {
      if (value != "round_robin" && value != "runs") {
        UsageError("--placement must be round_robin or runs");
      }
      cfg.in_runs = value == "runs";
    } else if (name == "output") {
      if (value != "member" && value != "shared") UsageError("--output must be member or shared");
      cfg.shared_output = value == "shared";
    } else if (name == "echo-socket") {  // hidden
      cfg.echo_socket = value;
    } else if (name == "member") {  // hidden: member mode
      cfg.member = ParseInt(name, value, 0, 4096);
    } else if (name == "report-fd") {  // hidden
      cfg.report_fd = ParseInt(name, value, 0, 1 << 20);
    } else if (name == "mesh") {  // hidden
      cfg.mesh = value;
    } else {
      UsageError(absl::StrCat("unknown flag --", name));
    }
  }
  // --op
  for (absl::string_view part : absl::StrSplit(ops, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (part == "all") {
      for (Op op : kAllOps) cfg.ops.push_back(op);
      continue;
    }
    auto op = OpFromName(part);
    if (!op) {
      UsageError(absl::StrCat("--op=", ops, ": unknown op '", part,
                              "' (psum, pmean, pmax, pmin, all_gather, ppermute, psum_scatter, "
                              "all_to_all, broadcast, barrier, all)"));
    }
    cfg.ops.push_back(*op);
  }
  if (cfg.ops.empty()) UsageError("--op is empty");
  // De-duplicate, keeping the first occurrence.
  std::vector<Op> uniq;
  for (Op op : cfg.ops) {
    if (std::find(uniq.begin(), uniq.end(), op) == uniq.end()) uniq.push_back(op);
  }
  cfg.ops = uniq;
  if (cfg.dtype == DType::kBool) {
    auto it = std::find(cfg.ops.begin(), cfg.ops.end(), Op::kPsumScatter);
    if (it != cfg.ops.end()) {
      if (cfg.ops.size() == 1) UsageError("psum_scatter does not support --dtype=bool (JAX rejects it too)");
      cfg.ops.erase(it);
      if (cfg.member < 0) {
        std::fprintf(stderr, "collectived_perf: skipping psum_scatter: bool is not supported\n");
      }
    }
  }
  // --members
  for (absl::string_view part : absl::StrSplit(members, ',', absl::SkipWhitespace())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 1024) {
      UsageError(absl::StrCat("--members=", members, ": expected a comma list of integers in 1..1024"));
    }
    cfg.members.push_back(n);
  }
  if (cfg.members.empty()) UsageError("--members is empty");
  if (cfg.min_bytes < 1) UsageError("--min-bytes must be at least 1");
  if (cfg.max_bytes < cfg.min_bytes) {
    UsageError(absl::StrCat("--max-bytes (", cfg.max_bytes, ") is smaller than --min-bytes (",
                            cfg.min_bytes, ")"));
  }
  if (cfg.max_bytes > (int64_t{16} << 30)) UsageError("--max-bytes must be at most 16G");
  // --device
  cfg.device = std::string(absl::StripAsciiWhitespace(cfg.device));
  if (cfg.device.empty()) cfg.device = "cpu";
  if (cfg.device != "cpu") {
    if (cfg.device != "cuda" && !absl::StartsWith(cfg.device, "cuda:") &&
        !absl::StartsWith(cfg.device, "GPU-")) {
      UsageError(absl::StrCat("--device=", cfg.device,
                              ": expected cpu, cuda, cuda:N, GPU-<uuid> or cuda:GPU-<uuid>"));
    }
#if !COLLECTIVED_PERF_CUDA
    std::fprintf(stderr,
                 "collectived_perf: --device=%s: this collectived_perf was built without CUDA "
                 "(COLLECTIVED_WITH_CUDA=OFF, or the CUDA toolkit or NCCL was not found); "
                 "rebuild with -DCOLLECTIVED_WITH_CUDA=AUTO or ON for GPU buffers\n",
                 cfg.device.c_str());
    std::exit(2);
#endif
    for (Op op : cfg.ops) {
      if (IsGrpcProbe(op)) {
        UsageError(absl::StrCat("--op=", OpName(op), " is not a collective and takes no --device"));
      }
    }
    if (cfg.device == "cuda") cfg.device = "cuda:0";
  }
  if (cfg.stream && (cfg.device == "cpu" || cfg.hosts > 1)) {
    UsageError("--stream orders GPU ops with a CUDA stream: it needs --device=cuda[:N] (and one "
               "host)");
  }
  if (cfg.member >= 0 && (cfg.report_fd < 0 || cfg.mesh.empty() || cfg.members.size() != 1)) {
    UsageError("--member needs --report-fd, --mesh and a single --members");
  }
  if (cfg.shared_output) {
    for (Op op : cfg.ops) {
      if (op != Op::kPsum && op != Op::kPmean && op != Op::kPmax && op != Op::kPmin &&
          op != Op::kAllGather && op != Op::kBroadcast) {
        UsageError(absl::StrCat("--output=shared: ", OpName(op),
                                " gives members different results (psum, pmean, pmax, pmin, "
                                "all_gather and broadcast only)"));
      }
    }
    if (cfg.device != "cpu") UsageError("--output=shared: host memory only (--device=cpu)");
    if (cfg.hosts > 1) UsageError("--output=shared: meshes of one host only (not with --hosts)");
  }
  if (cfg.hosts > 1 && cfg.member < 0) {
    if (!cfg.socket.empty()) UsageError("--hosts starts its own daemons: not with --socket");
  }
  return cfg;
}

// ---------------------------------------------------------------------------
// Element access and the test patterns.

double GetElem(DType dt, const void* p, size_t i) {
  switch (dt) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kF16: return collectived::HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return collectived::BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kI8: return static_cast<const int8_t*>(p)[i];
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kU32: return static_cast<const uint32_t*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kU64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(p)[i];  // raw byte: 0/1 expected
    case DType::kF8E4M3FN: return collectived::F8E4M3FNToFloat(static_cast<const uint8_t*>(p)[i]);
    case DType::kF8E5M2: return collectived::F8E5M2ToFloat(static_cast<const uint8_t*>(p)[i]);
    default: return std::nan("");
  }
}

// Stores v rounded (floats) or wrapped (integers) to dt.
void SetElem(DType dt, void* p, size_t i, double v) {
  const int64_t w = std::isfinite(v) ? static_cast<int64_t>(v) : 0;
  switch (dt) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = collectived::FloatToHalf(static_cast<float>(v));
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = collectived::FloatToBF16(static_cast<float>(v));
      break;
    case DType::kI8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(w); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(w); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(w); break;
    case DType::kU32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(w); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = w; break;
    case DType::kU64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(w); break;
    case DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0; break;
    case DType::kF8E4M3FN:
      static_cast<uint8_t*>(p)[i] = collectived::FloatToF8E4M3FN(static_cast<float>(v));
      break;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(p)[i] = collectived::FloatToF8E5M2(static_cast<float>(v));
      break;
    default: break;
  }
}

// v as dt represents it.
double Represent(DType dt, double v) {
  alignas(8) unsigned char tmp[8];
  SetElem(dt, tmp, 0, v);
  return GetElem(dt, tmp, 0);
}

// Reductions: small non-negative integers (0..4; bool 0/1), so sums are exact
// in every float type and the expected values are computed exactly.
int64_t RedVal(DType dt, int i, int64_t k) {
  return dt == DType::kBool ? (k + i) % 2 : (k + 3 * i) % 5;
}

// Data movement: values that identify the source member and position, exact
// in dt.
int64_t MoveVal(DType dt, int i, int64_t k) {
  int64_t m = int64_t{1} << 24;
  switch (dt) {
    case DType::kBool: m = 2; break;
    case DType::kI8: m = 127; break;
    case DType::kU8: m = 255; break;
    case DType::kBF16: m = 256; break;
    case DType::kF16: m = 2048; break;
    case DType::kF8E4M3FN: m = 16; break;  // every integer up to 16 is exact
    case DType::kF8E5M2: m = 8; break;
    default: break;
  }
  return (k * 13 + int64_t{i} * 7 + 1) % m;
}

void FillInput(Op op, DType dt, int me, void* p, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    const int64_t v = IsReduction(op) || op == Op::kPsumScatter ? RedVal(dt, me, k)
                                                                : MoveVal(dt, me, k);
    SetElem(dt, p, static_cast<size_t>(k), static_cast<double>(v));
  }
}

// What member `me` of `n` must hold at output element k.
double Expected(Op op, DType dt, int n, int me, const Row& r, int64_t k) {
  const DType out_dt = OutDType(op, dt);
  switch (op) {
    case Op::kPsum:
    case Op::kPsumScatter: {
      const int64_t kk = op == Op::kPsum ? k : me * (r.in_count / n) + k;
      int64_t s = 0;
      for (int i = 0; i < n; ++i) s += RedVal(dt, i, kk);
      return Represent(out_dt, static_cast<double>(s));
    }
    case Op::kPmax:
    case Op::kPmin: {
      int64_t m = RedVal(dt, 0, k);
      for (int i = 1; i < n; ++i) {
        m = op == Op::kPmax ? std::max(m, RedVal(dt, i, k)) : std::min(m, RedVal(dt, i, k));
      }
      return Represent(out_dt, static_cast<double>(m));
    }
    case Op::kPmean: {
      int64_t s = 0;
      for (int i = 0; i < n; ++i) s += RedVal(dt, i, k);
      switch (dt) {
        // The sum times the reciprocal 1/n, as XLA (and the daemon) compute
        // it: at 3, 5 or 6 members x * (1/n) and x / n can differ in the
        // last bit.
        case DType::kF64:
          return static_cast<double>(s) * (1.0 / n);
        case DType::kF32:
        case DType::kBool:
          return static_cast<float>(s) * (1.0f / static_cast<float>(n));
        case DType::kF16:  // the sum times 1/n rounded to float16, in float32, rounded
          return Represent(dt, static_cast<float>(Represent(dt, static_cast<double>(s))) *
                                   collectived::HalfToFloat(collectived::FloatToHalf(
                                       1.0f / static_cast<float>(n))));
        case DType::kBF16:  // the sum rounded to bfloat16, times 1/n in float32, rounded
          return Represent(dt, static_cast<float>(Represent(dt, static_cast<double>(s))) *
                                   (1.0f / static_cast<float>(n)));
        case DType::kF8E4M3FN:
        case DType::kF8E5M2: {
          // In float16 (as XLA): the sum rounded to float8, times
          // float16(1/n), rounded to float16, then to float8.
          const float scale = collectived::HalfToFloat(
              collectived::FloatToHalf(1.0f / static_cast<float>(n)));
          const float product =
              static_cast<float>(Represent(dt, static_cast<double>(s))) * scale;
          return Represent(dt, collectived::HalfToFloat(collectived::FloatToHalf(product)));
        }
        case DType::kI64:
        case DType::kU64:  // the wrapped sum, times 1/n in float64
          return Represent(dt, static_cast<double>(s)) * (1.0 / n);
        default:  // narrower integers: the wrapped sum, times 1/n in float32
          return static_cast<float>(Represent(dt, static_cast<double>(s))) *
                 (1.0f / static_cast<float>(n));
      }
    }
    case Op::kAllGather: {
      const int64_t tile = r.out_count / n;
      return static_cast<double>(MoveVal(dt, static_cast<int>(k / tile), k % tile));
    }
    case Op::kPpermute:
      return static_cast<double>(MoveVal(dt, (me + n - 1) % n, k));
    case Op::kAllToAll: {
      const int64_t tile = r.in_count / n;
      return static_cast<double>(MoveVal(dt, static_cast<int>(k / tile), me * tile + k % tile));
    }
    case Op::kBroadcast:
      return static_cast<double>(MoveVal(dt, 0, k));
    case Op::kBarrier:
    case Op::kGrpcEcho:
    case Op::kGrpcRendezvous:
      break;
  }
  return 0;
}

// Empty when `out` holds what it must; else a description of the first
// mismatch.
std::string Verify(Op op, DType dt, int n, int me, const Row& r, const void* out) {
  const DType out_dt = OutDType(op, dt);
  // The reduction patterns repeat every 10 elements: look the values up.
  const bool periodic = IsReduction(op) || op == Op::kPsumScatter;
  double table[10];
  if (periodic) {
    for (int j = 0; j < 10; ++j) {
      table[j] = Expected(op == Op::kPsumScatter ? Op::kPsum : op, dt, n, me, r, j);
    }
  }
  const int64_t offset = op == Op::kPsumScatter ? me * (r.in_count / n) : 0;
  int64_t bad = 0;
  std::string first;
  for (int64_t k = 0; k < r.out_count; ++k) {
    const double got = GetElem(out_dt, out, static_cast<size_t>(k));
    const double want = periodic ? table[(k + offset) % 10] : Expected(op, dt, n, me, r, k);
    if (got == want || (std::isnan(got) && std::isnan(want))) continue;
    if (bad++ == 0) {
      first = absl::StrCat("element ", k, " is ", got, ", expected ", want);
    }
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", r.out_count, " elements wrong; first: ", first);
}

// ---------------------------------------------------------------------------
// GPU buffers: the members read and write them through host staging copies.
// Every helper returns only when the copy is complete on the device, as the
// SDK's ordering contract asks of inputs (README, "GPU buffers").

#if COLLECTIVED_PERF_CUDA
absl::Status CudaCall(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}
#endif

// --stream: a CUDA stream of its own on GPU `device`, for a member's ops.
absl::StatusOr<void*> MakeStream(int device) {
#if COLLECTIVED_PERF_CUDA
  cudaStream_t s = nullptr;
  absl::Status st = CudaCall(cudaSetDevice(device), "cudaSetDevice");
  if (st.ok()) {
    st = CudaCall(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  if (!st.ok()) return st;
  return static_cast<void*>(s);
#else
  (void)device;
  return absl::UnimplementedError("--stream in a build without CUDA");
#endif
}

// Waits until `stream` (null: none) has done all its work.
absl::Status SyncStream(void* stream) {
  if (stream == nullptr) return absl::OkStatus();
#if COLLECTIVED_PERF_CUDA
  return CudaCall(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                  "cudaStreamSynchronize");
#else
  return absl::UnimplementedError("--stream in a build without CUDA");
#endif
}

// Copies `bytes` from host memory `src` into the buffer.
absl::Status Upload(const collectived::Buffer& b, const void* src, size_t bytes) {
  if (b.device_ordinal() < 0) {
    std::memcpy(b.data(), src, bytes);
    return absl::OkStatus();
  }
#if COLLECTIVED_PERF_CUDA
  absl::Status st = CudaCall(cudaSetDevice(b.device_ordinal()), "cudaSetDevice");
  if (st.ok()) st = CudaCall(cudaMemcpy(b.data(), src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  if (st.ok()) st = CudaCall(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return st;
#else
  return absl::UnimplementedError("GPU buffer in a build without CUDA");
#endif
}

// Sets the first `bytes` of the buffer to `value`.
absl::Status Memset(const collectived::Buffer& b, int value, size_t bytes) {
  if (b.device_ordinal() < 0) {
    std::memset(b.data(), value, bytes);
    return absl::OkStatus();
  }
#if COLLECTIVED_PERF_CUDA
  absl::Status st = CudaCall(cudaSetDevice(b.device_ordinal()), "cudaSetDevice");
  if (st.ok()) st = CudaCall(cudaMemset(b.data(), value, bytes), "cudaMemset");
  if (st.ok()) st = CudaCall(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return st;
#else
  return absl::UnimplementedError("GPU buffer in a build without CUDA");
#endif
}

// The first `bytes` of the buffer, readable on the host: the buffer itself
// for host memory, else a copy in `staging`.
absl::StatusOr<const void*> Download(const collectived::Buffer& b, size_t bytes,
                                     std::vector<unsigned char>& staging) {
  if (b.device_ordinal() < 0) return static_cast<const void*>(b.data());
#if COLLECTIVED_PERF_CUDA
  staging.resize(std::max(staging.size(), bytes));
  absl::Status st = CudaCall(cudaSetDevice(b.device_ordinal()), "cudaSetDevice");
  if (st.ok()) {
    st = CudaCall(cudaMemcpy(staging.data(), b.data(), bytes, cudaMemcpyDeviceToHost),
                  "cudaMemcpy D2H");
  }
  if (!st.ok()) return st;
  return static_cast<const void*>(staging.data());
#else
  (void)bytes;
  (void)staging;
  return absl::UnimplementedError("GPU buffer in a build without CUDA");
#endif
}

// ---------------------------------------------------------------------------
// Member mode.

bool WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t w = write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

// Protocol to the parent, one line each:
//   READY <kMemberSide, or why this member's ops all go through the daemon>
//   CHECKFAIL <row> <text>
//   ROW <row> <ok|fail|skipped> <ns> <ns> ...
//   ERR <text>
//   DONE
constexpr absl::string_view kMemberSide = "member-side";

int MemberFail(int fd, const std::string& what) {
  std::string line = what;
  std::replace(line.begin(), line.end(), '\n', ' ');
  WriteAll(fd, absl::StrCat("ERR ", line, "\n"));
  return 1;
}

// One row's op, built before the timed loop so that only the call is timed.
struct OpCall {
  Op op;
  collectived::Collective collective;  // not for the probes
};

OpCall MakeCall(Op op, DType dt, int n, const Row& r, const collectived::Buffer& in,
                const collectived::Buffer& out) {
  OpCall c{op, {}};
  if (IsGrpcProbe(op)) return c;
  collectived::Collective& k = c.collective;
  k.kind = static_cast<CollectiveKind>(op);
  k.axes = "x";
  if (op == Op::kBarrier) return c;
  k.x = Array{&in, 0, dt, {r.in_count}};
  k.out = Array{&out, 0, OutDType(op, dt), {r.out_count}};
  // all_gather, psum_scatter and all_to_all over dimension 0, tiled;
  // broadcast from group index 0 (k.axis).
  k.tiled = IsTiled(op);
  if (op == Op::kPpermute) {
    for (int s = 0; s < n; ++s) k.perm.emplace_back(s, (s + 1) % n);  // i -> i+1
  }
  return c;
}

// Where a fast-path op's time went and what memory it moved.
struct Profile {
  collectived::OpTiming timing;
  collectived::OpTraffic traffic;
};

// Runs one op; with `profile`, also reports its profile. Without, as
// programs do (Mesh::run, as the synchronous methods): a small one may run
// among the members (member-side small ops; --daemon-args=--member_op_bytes=0
// sends every op through the daemon). A profiled op is asynchronous
// (Mesh::submit), so it always goes through the daemon: the phases are the
// daemon path's. With `stream` (--stream), the op is ordered with that CUDA
// stream (Mesh::submit(op, stream)) and returns once the stream is
// synchronized and the op's future is ready.
absl::Status RunOp(collectived::Mesh& m, const OpCall& c, Profile* profile = nullptr,
                   void* stream = nullptr) {
  if (profile == nullptr && stream == nullptr) return m.run(c.collective);
  collectived::OpFuture f = stream == nullptr ? m.submit(c.collective)
                                              : m.submit(c.collective, stream);
  absl::Status st = SyncStream(stream);
  if (absl::Status done = f.Wait(); !done.ok()) st = done;
  if (profile == nullptr) return st;
  *profile = Profile{f.timing(), f.traffic()};
  return st;
}

// What the executor moved for one op (all members), against the minimum.
std::string TrafficSummary(const collectived::OpTraffic& t) {
  if (t.bytes_required == 0) return "";
  return absl::StrFormat("; moved %d B read + %d B written = %.2fx the minimum %d B",
                         t.bytes_read, t.bytes_written,
                         static_cast<double>(t.bytes_read + t.bytes_written) /
                             static_cast<double>(t.bytes_required),
                         t.bytes_required);
}

// Medians of the fast-path phases over a row's iterations, for --breakdown:
// the time between each two stages that every iteration stamped (a stage an
// op does not reach, such as a CPU op's launch, is left out), the total, and
// a GPU op's device time.
std::string PhaseSummary(const std::vector<Profile>& p) {
  if (p.empty() || p[0].timing.taken_ns == 0) return "not on the fast path";
  using T = collectived::OpTiming;
  struct Stage {
    const char* name;
    int64_t T::*at;
  };
  static constexpr Stage kStages[] = {
      {"submit", &T::submitted_ns},  {"taken", &T::taken_ns},
      {"matched", &T::matched_ns},   {"ready", &T::ready_ns},
      {"started", &T::started_ns},   {"launched", &T::launched_ns},
      {"executed", &T::executed_ns}, {"completed", &T::completed_ns},
      {"reaped", &T::reaped_ns}};
  auto median = [&](auto value) {
    std::vector<int64_t> v;
    for (const Profile& x : p) v.push_back(value(x.timing));
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[v.size() / 2]) / 1e3;
  };
  std::vector<const Stage*> present;
  for (const Stage& st : kStages) {
    if (std::all_of(p.begin(), p.end(), [&](const Profile& x) { return x.timing.*st.at != 0; })) {
      present.push_back(&st);
    }
  }
  std::string out;
  for (size_t i = 1; i < present.size(); ++i) {
    const Stage& a = *present[i - 1];
    const Stage& b = *present[i];
    absl::StrAppendFormat(&out, "%s%s->%s %.2f us", i == 1 ? "" : ", ", a.name, b.name,
                          median([&](const T& t) { return t.*b.at - t.*a.at; }));
  }
  absl::StrAppendFormat(&out, ", total %.2f us",
                        median([](const T& t) { return t.reaped_ns - t.submitted_ns; }));
  if (std::all_of(p.begin(), p.end(), [](const Profile& x) { return x.timing.device_ns > 0; })) {
    absl::StrAppendFormat(&out, "; first enqueue->GPU done %.2f us",
                          median([](const T& t) { return t.device_ns; }));
  }
  return out + TrafficSummary(p.back().traffic);
}

// Metadata of a grpc_rendezvous stream: how many members answer together.
constexpr char kRendezvousMembersKey[] = "collectived-perf-rendezvous";

// The member's end of grpc_echo and grpc_rendezvous: a bidi stream to the
// parent's echo server, carrying the same messages as the SDK's Execute
// stream. `rendezvous_members` > 0: the server answers a round once that
// many streams of the same mesh sent it.
class EchoClient {
 public:
  absl::Status Open(const std::string& socket, const collectived::v1::OpSpec& spec,
                    int rendezvous_members) {
    channel_ = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    stub_ = collectived::v1::Collective::NewStub(channel_);
    if (rendezvous_members > 0) {
      ctx_.AddMetadata(kRendezvousMembersKey, absl::StrCat(rendezvous_members));
    }
    stream_ = stub_->Execute(&ctx_);
    *request_.mutable_op() = spec;
    return RoundTrip();
  }
  absl::Status RoundTrip() {
    request_.set_tag(request_.tag() + 1);
    if (!stream_->Write(request_) || !stream_->Read(&result_)) {
      return absl::UnavailableError("echo stream broke");
    }
    return result_.tag() == request_.tag() ? absl::OkStatus()
                                           : absl::InternalError("echo answered another tag");
  }
  ~EchoClient() {
    if (stream_) {
      stream_->WritesDone();
      stream_->Finish().IgnoreError();
    }
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<collectived::v1::Collective::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<collectived::v1::OpRequest, collectived::v1::OpResult>>
      stream_;
  collectived::v1::OpRequest request_;
  collectived::v1::OpResult result_;
};

// A psum OpSpec like the SDK sends, so the echo carries a realistic message.
collectived::v1::OpSpec EchoSpec(const std::string& mesh_id, const collectived::Buffer& in,
                                 const collectived::Buffer& out) {
  collectived::v1::OpSpec spec;
  spec.set_mesh_id(mesh_id);
  spec.set_kind(collectived::v1::PSUM);
  spec.add_axes("x");
  spec.set_dtype(collectived::v1::FLOAT32);
  spec.add_shape(2);
  spec.mutable_input()->set_buffer_id(in.id());
  spec.mutable_output()->set_buffer_id(out.id());
  return spec;
}

int RunMember(const Config& cfg) {
  const int fd = cfg.report_fd;
  const int n = cfg.members[0];
  const int me = cfg.member;
  const std::vector<Row> rows = PlanRows(cfg, n);
  size_t max_in = 64, max_out = 64;
  std::map<Op, int64_t> fill_count;
  for (const Row& r : rows) {
    max_in = std::max(max_in, r.in_bytes);
    max_out = std::max(max_out, r.out_bytes);
    fill_count[r.op] = std::max(fill_count[r.op], r.in_count);
  }

  collectived::ClientOptions options{.socket_path = cfg.socket,
                                     .client_name = absl::StrCat("perf-", n, "-", me)};
  options.fast_path = cfg.fast_path;
  if (cfg.spin_us >= 0) {
    options.fast_path_spin = absl::Microseconds(cfg.spin_us);
    options.grpc_spin = absl::Microseconds(cfg.spin_us);
  }
  auto client = collectived::Client::Connect(options);
  if (!client.ok()) return MemberFail(fd, absl::StrCat("connect: ", client.status().ToString()));
  // The buffers first: a device the daemon cannot use fails every member the
  // same way, before any of them waits in the mesh for the others.
  std::string device = cfg.device;
#if COLLECTIVED_PERF_CUDA
  if (device == "cuda:spread") {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
      return MemberFail(fd, "--device=cuda:spread: this process sees no CUDA device");
    }
    device = absl::StrCat("cuda:", me % gpus);
  }
#endif
  auto in = (*client)->Allocate(max_in, device);
  if (!in.ok()) {
    return MemberFail(fd, absl::StrCat("allocate ", max_in, " B on ", device, ": ",
                                       in.status().ToString()));
  }
  absl::StatusOr<collectived::Buffer> out =
      cfg.shared_output ? absl::StatusOr<collectived::Buffer>(absl::UnknownError("after the join"))
                        : (*client)->Allocate(max_out, device);
  if (!cfg.shared_output && !out.ok()) {
    return MemberFail(fd, absl::StrCat("allocate ", max_out, " B on ", device, ": ",
                                       out.status().ToString()));
  }
  auto mesh = (*client)->JoinMesh({.name = cfg.mesh,
                                   .axes = {{"x", n}},
                                   .coordinate = {me},
                                   .join_timeout = absl::Seconds(60)});
  if (!mesh.ok()) return MemberFail(fd, absl::StrCat("join mesh: ", mesh.status().ToString()));
  collectived::Mesh& m = **mesh;
  if (cfg.shared_output) {
    out = m.AllocateShared(max_out);
    if (!out.ok()) {
      return MemberFail(fd, absl::StrCat("allocate a shared ", max_out, " B: ",
                                         out.status().ToString()));
    }
  }
  const bool on_gpu = in->device_ordinal() >= 0;
  // --stream: this member's ops are ordered with its own CUDA stream.
  void* stream = nullptr;
  if (cfg.stream) {
    absl::StatusOr<void*> made = MakeStream(in->device_ordinal());
    if (!made.ok()) return MemberFail(fd, absl::StrCat("--stream: ", made.status().ToString()));
    stream = *made;
  }
  // GPU buffers: the inputs are written and the results read through these.
  std::vector<unsigned char> staging_in(on_gpu ? max_in : 0), staging_out;
  // One stream per probe op, opened before the rows (like the SDK's).
  std::map<Op, std::unique_ptr<EchoClient>> probes;
  for (Op op : cfg.ops) {
    if (!IsGrpcProbe(op) || probes.count(op) > 0) continue;
    auto& probe = probes[op] = std::make_unique<EchoClient>();
    if (absl::Status st = probe->Open(cfg.echo_socket, EchoSpec(m.id(), *in, *out),
                                      op == Op::kGrpcRendezvous ? n : 0);
        !st.ok()) {
      return MemberFail(fd, absl::StrCat(OpName(op), ": ", st.ToString()));
    }
  }
  std::string member_side =
      m.member_side().ok() ? std::string(kMemberSide) : m.member_side().ToString();
  std::replace(member_side.begin(), member_side.end(), '\n', ' ');
  if (!WriteAll(fd, absl::StrCat("READY ", member_side, "\n"))) return 1;

  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> times(static_cast<size_t>(cfg.iters));
  std::optional<Op> filled;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const Row& r = rows[ri];
    auto where = [&] {
      return Sizeless(r.op) ? std::string(OpName(r.op))
                                  : absl::StrCat(OpName(r.op), " ", r.bytes, " B");
    };
    if (filled != r.op && !Sizeless(r.op)) {
      if (on_gpu) {
        const size_t bytes = static_cast<size_t>(fill_count[r.op]) * collectived::DTypeSize(cfg.dtype);
        FillInput(r.op, cfg.dtype, me, staging_in.data(), fill_count[r.op]);
        if (absl::Status st = Upload(*in, staging_in.data(), bytes); !st.ok()) {
          return MemberFail(fd, absl::StrCat(where(), ": writing the input: ", st.ToString()));
        }
      } else {
        FillInput(r.op, cfg.dtype, me, in->data(), fill_count[r.op]);
      }
      filled = r.op;
    }
    const OpCall call = MakeCall(r.op, cfg.dtype, n, r, *in, *out);
    std::string check = "skipped";
    if (cfg.check && !Sizeless(r.op)) {
      if (absl::Status st = Memset(*out, 0xA5, r.out_bytes); !st.ok()) {
        return MemberFail(fd, absl::StrCat(where(), ": filling the output: ", st.ToString()));
      }
      absl::Status st = RunOp(m, call, nullptr, stream);
      if (!st.ok()) return MemberFail(fd, absl::StrCat(where(), ": ", st.ToString()));
      absl::StatusOr<const void*> result = Download(*out, r.out_bytes, staging_out);
      if (!result.ok()) {
        return MemberFail(fd, absl::StrCat(where(), ": reading the result: ",
                                           result.status().ToString()));
      }
      std::string bad = Verify(r.op, cfg.dtype, n, me, r, *result);
      check = bad.empty() ? "ok" : "fail";
      if (!bad.empty() && !WriteAll(fd, absl::StrCat("CHECKFAIL ", ri, " ", bad, "\n"))) return 1;
    }
    // Start every size together.
    if (absl::Status st = m.barrier("x"); !st.ok()) {
      return MemberFail(fd, absl::StrCat(where(), ": barrier: ", st.ToString()));
    }
    auto run = [&](Profile* profile) {
      return IsGrpcProbe(r.op) ? probes.at(r.op)->RoundTrip() : RunOp(m, call, profile, stream);
    };
    for (int w = 0; w < cfg.warmup; ++w) {
      absl::Status st = run(nullptr);
      if (!st.ok()) return MemberFail(fd, absl::StrCat(where(), " (warmup): ", st.ToString()));
    }
    std::vector<Profile> phases(cfg.breakdown ? cfg.iters : 0);
    for (int it = 0; it < cfg.iters; ++it) {
      const Clock::time_point t0 = Clock::now();
      absl::Status st = run(cfg.breakdown ? &phases[static_cast<size_t>(it)] : nullptr);
      const Clock::time_point t1 = Clock::now();
      if (!st.ok()) return MemberFail(fd, absl::StrCat(where(), ": ", st.ToString()));
      times[static_cast<size_t>(it)] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    }
    if (cfg.breakdown &&
        !WriteAll(fd, absl::StrCat("PHASES ", ri, " ", PhaseSummary(phases), "\n"))) {
      return 1;
    }
    if (!WriteAll(fd, absl::StrCat("ROW ", ri, " ", check, " ", absl::StrJoin(times, " "), "\n"))) {
      return 1;
    }
  }
  // Nobody leaves before everyone finished (leaving breaks the mesh).
  if (absl::Status st = m.barrier("x"); !st.ok()) {
    return MemberFail(fd, absl::StrCat("final barrier: ", st.ToString()));
  }
  WriteAll(fd, "DONE\n");
  return 0;
}

// ---------------------------------------------------------------------------
// Parent: processes.

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

std::string SelfExe() {
  char buf[4096];
  ssize_t len = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (len <= 0) return "";
  return std::string(buf, static_cast<size_t>(len));
}

bool Executable(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

// The daemon built with this benchmark, else one next to it, else $PATH.
std::string FindDaemon() {
#ifdef COLLECTIVED_DAEMON_BIN
  if (Executable(COLLECTIVED_DAEMON_BIN)) return COLLECTIVED_DAEMON_BIN;
#endif
  std::string self = SelfExe();
  if (size_t slash = self.rfind('/'); slash != std::string::npos) {
    std::string dir = self.substr(0, slash);
    for (const char* rel : {"/collectived", "/../daemon/collectived"}) {
      if (Executable(dir + rel)) return dir + rel;
    }
  }
  const char* path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/collectived");
    if (Executable(candidate)) return candidate;
  }
  return "";
}

bool SocketLive(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

std::string Tail(const std::string& s, size_t max = 4000) {
  std::string t = s.size() > max ? "..." + s.substr(s.size() - max) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

std::string ReadFile(const std::string& path) {
  std::string data;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return data;
  char buf[8192];
  ssize_t got;
  while ((got = read(fd, buf, sizeof(buf))) > 0) data.append(buf, static_cast<size_t>(got));
  close(fd);
  return data;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "ended";
}

// Waits for pid at most `timeout`; true (and *status) when it was reaped.
bool WaitFor(pid_t pid, absl::Duration timeout, int* status) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    pid_t w = waitpid(pid, status, WNOHANG);
    if (w == pid) return true;
    if (w < 0 && errno != EINTR) return false;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// A collectived started (and stopped) by this benchmark.
class OwnDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<OwnDaemon>> Start(
      const std::vector<std::string>& extra_args) {
    std::unique_ptr<OwnDaemon> d(new OwnDaemon());
    d->binary_ = FindDaemon();
    if (d->binary_.empty()) {
      return absl::NotFoundError(
          "cannot find the collectived daemon (not built alongside, not next to this binary, "
          "not on $PATH); pass --socket=PATH to use a running one");
    }
    const char* base = getenv("TMPDIR");
    std::string tmpl =
        absl::StrCat(base != nullptr && *base ? base : "/tmp", "/collectived_perf-XXXXXX");
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, ": ", strerror(errno)));
    }
    d->dir_ = buf.data();
    d->socket_ = d->dir_ + "/collectived.sock";
    d->log_ = d->dir_ + "/daemon.log";
    if (d->socket_.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", d->socket_));
    }
    std::vector<std::string> argv = {d->binary_, "--socket=" + d->socket_, "--log_level=warn"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    if (pid == 0) {
      // Own process group: a terminal ^C reaches us, and we stop the daemon.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      int log = open(d->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (log >= 0) {
        dup2(log, STDOUT_FILENO);
        dup2(log, STDERR_FILENO);
      }
      execv(args[0], args.data());
      std::fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
      _exit(127);
    }
    d->pid_ = pid;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!SocketLive(d->socket_)) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        d->pid_ = -1;
        return absl::InternalError(absl::StrCat("daemon ", d->binary_, " ", DescribeExit(status),
                                                " during start-up: ", Tail(ReadFile(d->log_))));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("daemon ", d->binary_, " did not listen on ", d->socket_, " in 20 s"));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return d;
  }

  ~OwnDaemon() {
    Stop();
    unlink(log_.c_str());
    unlink(socket_.c_str());
    unlink((socket_ + ".fds").c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }

  // SIGTERM, then SIGKILL if it does not stop in 10 s. Empty: a clean stop.
  std::string Stop() {
    if (pid_ <= 0) return "";
    kill(pid_, SIGTERM);
    int status = 0;
    std::string problem;
    if (!WaitFor(pid_, absl::Seconds(10), &status)) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      problem = "did not stop within 10 s of SIGTERM; killed";
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      problem = DescribeExit(status);
    }
    pid_ = -1;
    if (std::string log = Tail(ReadFile(log_)); !problem.empty() && !log.empty()) {
      problem += ": " + log;
    }
    return problem;
  }

  // Non-empty when the daemon is no longer running.
  std::string Died() {
    if (pid_ <= 0) return "";
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return "";
    pid_ = -1;
    std::string log = Tail(ReadFile(log_));
    return absl::StrCat("the daemon ", DescribeExit(status), log.empty() ? "" : ": ", log);
  }

  const std::string& socket() const { return socket_; }
  const std::string& binary() const { return binary_; }
  pid_t pid() const { return pid_; }

  // Waits until the daemon's log contains `needle`; false (with the log's
  // tail in *why) when it dies or `timeout` passes first.
  bool WaitForLog(const std::string& needle, absl::Duration timeout, std::string* why) {
    const absl::Time deadline = absl::Now() + timeout;
    while (ReadFile(log_).find(needle) == std::string::npos) {
      if (std::string died = Died(); !died.empty()) {
        *why = died;
        return false;
      }
      if (absl::Now() > deadline) {
        *why = absl::StrCat("no \"", needle, "\" in its log within ",
                            absl::FormatDuration(timeout), ": ", Tail(ReadFile(log_)));
        return false;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

 private:
  OwnDaemon() = default;
  std::string binary_, dir_, socket_, log_;
  pid_t pid_ = -1;
};

// ---------------------------------------------------------------------------
// Parent: results.

struct RowResult {
  double med_us = 0, min_us = 0, algbw = 0, busbw = 0;
  std::string check;
};

RowResult Summarize(const Row& r, int n, const std::vector<std::vector<int64_t>>& times,
                    const std::vector<std::string>& checks) {
  const size_t iters = times[0].size();
  std::vector<int64_t> per_iter(iters, 0);
  for (const auto& t : times) {
    for (size_t i = 0; i < iters; ++i) per_iter[i] = std::max(per_iter[i], t[i]);
  }
  std::sort(per_iter.begin(), per_iter.end());
  const double med_ns = iters % 2 == 1 ? static_cast<double>(per_iter[iters / 2])
                                       : (static_cast<double>(per_iter[iters / 2 - 1]) +
                                          static_cast<double>(per_iter[iters / 2])) / 2;
  RowResult res;
  res.med_us = med_ns / 1e3;
  res.min_us = static_cast<double>(per_iter[0]) / 1e3;
  res.algbw = med_ns > 0 ? static_cast<double>(r.bytes) / med_ns : 0;  // bytes/ns == GB/s
  res.busbw = res.algbw * BusFactor(r.op, n);
  bool all_ok = true, any_fail = false;
  for (const auto& c : checks) {
    all_ok = all_ok && c == "ok";
    any_fail = any_fail || c == "fail";
  }
  res.check = any_fail ? "fail" : all_ok ? "ok" : "skipped";
  return res;
}

class Printer {
 public:
  Printer(const Config& cfg, std::string daemon) : cfg_(cfg), daemon_(std::move(daemon)) {}

  void PrintRow(const Row& r, int n, const RowResult& res) {
    if (cfg_.json) {
      std::printf(
          "{\"op\":\"%s\",\"members\":%d,\"dtype\":\"%s\",\"bytes\":%" PRId64
          ",\"count\":%" PRId64 ",\"time_us\":%.3f,\"time_us_min\":%.3f,\"algbw_gbps\":%.6f,"
          "\"busbw_gbps\":%.6f,\"check\":\"%s\"%s}\n",
          OpName(r.op), n, std::string(collectived::DTypeName(cfg_.dtype)).c_str(), r.bytes,
          r.count, res.med_us, res.min_us, res.algbw, res.busbw, res.check.c_str(),
          cfg_.device == "cpu" ? "" : absl::StrCat(",\"device\":\"", cfg_.device, "\"").c_str());
      std::fflush(stdout);
      return;
    }
    if (!open_ || r.op != op_ || n != n_) {
      Footer();
      Header(r.op, n);
    }
    const std::string type =
        Sizeless(r.op) ? "-" : std::string(collectived::DTypeName(cfg_.dtype));
    std::printf("%12" PRId64 " %12" PRId64 " %9s %13.2f %13.2f %12.3f %12.3f %7s\n", r.bytes,
                r.count, type.c_str(), res.med_us,
                res.min_us, res.algbw, res.busbw, res.check.c_str());
    std::fflush(stdout);
    if (!Sizeless(r.op)) {
      busbw_sum_ += res.busbw;
      ++rows_;
    }
  }

  // Member `index`'s ops all go through the daemon, for `why`: said in the
  // header of every table of this member count (the first such member's).
  void DaemonOnly(size_t index, absl::string_view why) {
    if (daemon_only_.empty()) daemon_only_ = absl::StrCat("member ", index, ": ", why);
  }
  // A new member count: its members report afresh.
  void NewMembers() { daemon_only_.clear(); }

  void Footer() {
    if (!open_ || cfg_.json) return;
    if (rows_ > 0) std::printf("# avg busbw: %.3f GB/s over %d sizes\n", busbw_sum_ / rows_, rows_);
    std::printf("\n");
    std::fflush(stdout);
    open_ = false;
  }

 private:
  void Header(Op op, int n) {
    open_ = true;
    op_ = op;
    n_ = n;
    busbw_sum_ = 0;
    rows_ = 0;
    std::printf("# collectived_perf: op %s, members %d, dtype %s, %sdaemon %s\n", OpName(op), n,
                std::string(collectived::DTypeName(cfg_.dtype)).c_str(),
                cfg_.device == "cpu" ? "" : absl::StrCat("buffers on ", cfg_.device, ", ").c_str(),
                daemon_.c_str());
    std::printf(
        "# iters %d, warmup %d, check %s; time = median (and min) over iterations of the slowest "
        "member's op time\n",
        cfg_.iters, cfg_.warmup, cfg_.check ? "on" : "off");
    if (!daemon_only_.empty()) {
      std::printf("# no member-side ops, every op through the daemon (%s)\n",
                  daemon_only_.c_str());
    }
    std::printf("#\n# %10s %12s %9s %13s %13s %12s %12s %7s\n", "size(B)", "count", "type",
                "time_us(med)", "time_us(min)", "algbw(GB/s)", "busbw(GB/s)", "check");
  }

  const Config& cfg_;
  std::string daemon_;
  bool open_ = false;
  Op op_ = Op::kPsum;
  int n_ = 0;
  double busbw_sum_ = 0;
  int rows_ = 0;
  std::string daemon_only_;
};

struct Member {
  pid_t pid = -1;
  int report_fd = -1;  // protocol lines
  int output_fd = -1;  // stdout+stderr
  std::string report_buf, output;
  bool done = false;     // sent DONE
  bool failed = false;
  int fail_order = 0;  // 1 for the first member that failed, ...
  bool reported = false;  // failed with an ERR line (not a crash)
  std::string error;
  size_t rows_received = 0;
  std::vector<std::vector<int64_t>> times;  // per row
  std::vector<std::string> checks;          // per row
  std::vector<std::string> phases;          // per row, with --breakdown
  int status = 0;
  bool reaped = false;
};

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// Runs one member count; returns 0 (all fine), 1 (failure, reported) or 3
// (checks failed).
int RunMembers(const Config& cfg, int n, const std::vector<std::string>& sockets,
               Printer& printer, const std::vector<std::unique_ptr<OwnDaemon>>& daemons,
               int* check_failures) {
  const std::vector<Row> rows = PlanRows(cfg, n);
  printer.NewMembers();
  const std::string mesh = absl::StrCat("collectived_perf-", getpid(), "-n", n);
  const std::string self = SelfExe();
  std::vector<std::string> ops;
  for (Op op : cfg.ops) ops.push_back(OpName(op));

  std::vector<Member> members(static_cast<size_t>(n));
  auto kill_all = [&] {
    for (Member& m : members) {
      if (m.pid > 0 && !m.reaped) kill(m.pid, SIGKILL);
    }
    for (Member& m : members) {
      if (m.pid > 0 && !m.reaped) {
        waitpid(m.pid, &m.status, 0);
        m.reaped = true;
      }
      CloseFd(&m.report_fd);
      CloseFd(&m.output_fd);
    }
  };

  const pid_t parent = getpid();
  for (int i = 0; i < n; ++i) {
    int rep[2], outp[2];
    if (pipe2(rep, O_CLOEXEC) != 0 || pipe2(outp, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "collectived_perf: pipe: %s\n", strerror(errno));
      kill_all();
      return 1;
    }
    std::vector<std::string> argv = {
        self,
        absl::StrCat("--member=", i),
        absl::StrCat("--members=", n),
        "--report-fd=3",
        "--mesh=" + mesh,
        "--socket=" + sockets[cfg.in_runs ? static_cast<size_t>(i) * sockets.size() / n
                                          : static_cast<size_t>(i) % sockets.size()],
        "--op=" + absl::StrJoin(ops, ","),
        absl::StrCat("--dtype=", std::string(collectived::DTypeName(cfg.dtype))),
        absl::StrCat("--min-bytes=", cfg.min_bytes),
        absl::StrCat("--max-bytes=", cfg.max_bytes),
        absl::StrCat("--step-factor=", cfg.step_factor),
        absl::StrCat("--iters=", cfg.iters),
        absl::StrCat("--warmup=", cfg.warmup),
        absl::StrCat("--check=", cfg.check ? "true" : "false"),
        absl::StrCat("--path=", cfg.fast_path ? "fast" : "grpc"),
        absl::StrCat("--breakdown=", cfg.breakdown ? "true" : "false"),
        absl::StrCat("--stream=", cfg.stream ? "true" : "false"),
        "--echo-socket=" + cfg.echo_socket,
        "--device=" + cfg.device,
        absl::StrCat("--output=", cfg.shared_output ? "shared" : "member"),
        absl::StrCat("--spin-us=", cfg.spin_us < 0 ? std::string("") : absl::StrCat(cfg.spin_us)),
    };
    if (cfg.spin_us < 0) argv.pop_back();
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "collectived_perf: fork: %s\n", strerror(errno));
      close(rep[0]); close(rep[1]); close(outp[0]); close(outp[1]);
      kill_all();
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      dup2(rep[1], 3);
      dup2(outp[1], STDOUT_FILENO);
      dup2(outp[1], STDERR_FILENO);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
      execv(args[0], args.data());
      std::fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
      _exit(127);
    }
    close(rep[1]);
    close(outp[1]);
    Member& m = members[static_cast<size_t>(i)];
    m.pid = pid;
    m.report_fd = rep[0];
    m.output_fd = outp[0];
    m.times.resize(rows.size());
    m.checks.resize(rows.size());
    m.phases.resize(rows.size());
  }

  size_t next_row = 0;
  std::optional<absl::Time> fail_deadline;  // after the first failure: collect the others'
  std::vector<std::string> check_messages;
  int check_lines = 0;
  int failures = 0;
  auto fail = [&](Member& m, std::string error) {
    if (m.failed || m.done) return;
    m.failed = true;
    m.fail_order = ++failures;
    m.error = std::move(error);
    if (!fail_deadline) fail_deadline = absl::Now() + absl::Seconds(1);
  };
  auto handle_line = [&](Member& m, size_t index, absl::string_view line) {
    if (absl::ConsumePrefix(&line, "READY ")) {
      // The header says so when a member's ops all go through the daemon
      // (e.g. a daemon of another build than this program's SDK).
      if (line != kMemberSide) printer.DaemonOnly(index, line);
      return;
    }
    if (line == "DONE") {
      m.done = true;
      return;
    }
    if (absl::StartsWith(line, "ERR ")) {
      m.reported = true;
      fail(m, std::string(line.substr(4)));
      return;
    }
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    size_t row = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &row) && row < rows.size()) {
      if (parts[0] == "PHASES") {
        size_t skip = parts[0].size() + 1 + parts[1].size() + 1;
        m.phases[row] = std::string(line.size() > skip ? line.substr(skip) : absl::string_view());
        return;
      }
      if (parts[0] == "CHECKFAIL") {
        size_t skip = parts[0].size() + 1 + parts[1].size() + 1;
        const Row& r = rows[row];
        check_messages.push_back(absl::StrCat(
            "check failed: member ", index, ", ", OpName(r.op), " ", r.bytes, " B: ",
            line.size() > skip ? line.substr(skip) : absl::string_view()));
        return;
      }
      if (parts[0] == "ROW" && parts.size() == 3 + static_cast<size_t>(cfg.iters)) {
        m.checks[row] = std::string(parts[2]);
        m.times[row].resize(static_cast<size_t>(cfg.iters));
        bool ok = true;
        for (int it = 0; it < cfg.iters; ++it) {
          ok = ok && absl::SimpleAtoi(parts[3 + static_cast<size_t>(it)],
                                      &m.times[row][static_cast<size_t>(it)]);
        }
        if (ok) {
          m.rows_received = std::max(m.rows_received, row + 1);
          return;
        }
      }
    }
    fail(m, absl::StrCat("unexpected report line: ", line));
  };

  while (true) {
    // Print the rows every member has reported.
    while (next_row < rows.size() &&
           std::all_of(members.begin(), members.end(),
                       [&](const Member& m) { return m.rows_received > next_row; })) {
      std::vector<std::vector<int64_t>> times;
      std::vector<std::string> checks;
      for (const Member& m : members) {
        times.push_back(m.times[next_row]);
        checks.push_back(m.checks[next_row]);
      }
      RowResult res = Summarize(rows[next_row], n, times, checks);
      if (res.check == "fail") ++*check_failures;
      printer.PrintRow(rows[next_row], n, res);
      if (cfg.breakdown && !cfg.json) {
        for (size_t i = 0; i < members.size(); ++i) {
          std::printf("#   member %zu: %s\n", i, members[i].phases[next_row].c_str());
        }
        std::fflush(stdout);
      }
      ++next_row;
    }
    for (const std::string& msg : check_messages) {
      if (++check_lines <= 20) {
        std::fprintf(stderr, "collectived_perf: %s\n", msg.c_str());
      } else if (check_lines == 21) {
        std::fprintf(stderr, "collectived_perf: (more check failures not shown)\n");
      }
    }
    check_messages.clear();
    const bool all_done = std::all_of(members.begin(), members.end(), [](const Member& m) {
      return m.done && m.report_fd < 0 && m.output_fd < 0;
    });
    if (all_done) break;
    if (fail_deadline && absl::Now() >= *fail_deadline) break;
    if (g_stop_signal != 0) break;

    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> owner;  // member, is_report
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].report_fd >= 0) {
        fds.push_back({members[i].report_fd, POLLIN, 0});
        owner.emplace_back(i, true);
      }
      if (members[i].output_fd >= 0) {
        fds.push_back({members[i].output_fd, POLLIN, 0});
        owner.emplace_back(i, false);
      }
    }
    int timeout_ms = 1000;
    if (fail_deadline) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(*fail_deadline - absl::Now())));
    }
    if (fds.empty()) {
      absl::SleepFor(absl::Milliseconds(std::min(timeout_ms, 20)));
    } else if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      std::fprintf(stderr, "collectived_perf: poll: %s\n", strerror(errno));
      kill_all();
      return 1;
    }
    for (size_t f = 0; f < fds.size(); ++f) {
      if (fds[f].revents == 0) continue;
      Member& m = members[owner[f].first];
      int* fd = owner[f].second ? &m.report_fd : &m.output_fd;
      char buf[65536];
      ssize_t got = read(*fd, buf, sizeof(buf));
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) {
        CloseFd(fd);
        continue;
      }
      if (!owner[f].second) {
        m.output.append(buf, static_cast<size_t>(got));
        if (m.output.size() > 256 * 1024) m.output.erase(0, m.output.size() - 128 * 1024);
        continue;
      }
      m.report_buf.append(buf, static_cast<size_t>(got));
      size_t nl;
      while ((nl = m.report_buf.find('\n')) != std::string::npos) {
        std::string line = m.report_buf.substr(0, nl);
        m.report_buf.erase(0, nl + 1);
        handle_line(m, owner[f].first, line);
      }
    }
    // Members that ended: a clean exit after DONE is fine; anything else fails.
    for (Member& m : members) {
      if (m.reaped) continue;
      if (waitpid(m.pid, &m.status, WNOHANG) != m.pid) continue;
      m.reaped = true;
      // Collect what is left in its pipes.
      for (int* fd : {&m.report_fd, &m.output_fd}) {
        if (*fd < 0) continue;
        fcntl(*fd, F_SETFL, O_NONBLOCK);
        char buf[65536];
        ssize_t got;
        while ((got = read(*fd, buf, sizeof(buf))) > 0) {
          if (fd == &m.output_fd) {
            m.output.append(buf, static_cast<size_t>(got));
          } else {
            m.report_buf.append(buf, static_cast<size_t>(got));
          }
        }
        CloseFd(fd);
      }
      size_t nl;
      while ((nl = m.report_buf.find('\n')) != std::string::npos) {
        std::string line = m.report_buf.substr(0, nl);
        m.report_buf.erase(0, nl + 1);
        handle_line(m, static_cast<size_t>(&m - members.data()), line);
      }
      const bool clean = WIFEXITED(m.status) && WEXITSTATUS(m.status) == 0;
      if (!m.done || !clean) {
        std::string out = Tail(m.output);
        fail(m, absl::StrCat(DescribeExit(m.status), out.empty() ? "" : ": ", out));
      }
    }
  }

  if (g_stop_signal != 0) {
    kill_all();
    std::fprintf(stderr, "collectived_perf: stopped by signal %d\n",
                 static_cast<int>(g_stop_signal));
    return 1;
  }
  const bool any_failed =
      std::any_of(members.begin(), members.end(), [](const Member& m) { return m.failed; });
  if (!any_failed) {
    kill_all();  // all reaped already; closes what is left
    return 0;
  }
  printer.Footer();
  // Report the root cause first, then the others (usually consequences of it,
  // such as the mesh breaking when one member died). A member that died
  // without reporting an error (crashed, killed) is the likeliest root cause;
  // otherwise the first to report.
  kill_all();
  std::string daemon_problem;
  for (const auto& d : daemons) {
    if (std::string died = d->Died(); !died.empty()) {
      absl::StrAppend(&daemon_problem, daemon_problem.empty() ? "" : "; ", died);
    }
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].failed) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) {
              return std::make_pair(members[a].reported, members[a].fail_order) <
                     std::make_pair(members[b].reported, members[b].fail_order);
            });
  // Members that failed exactly as the first (an allocation the daemon
  // refuses, say) are named on its line rather than repeated.
  std::vector<size_t> same;
  for (size_t i : order) {
    if (i != order[0] && members[i].error == members[order[0]].error) same.push_back(i);
  }
  for (size_t i : order) {
    const Member& m = members[i];
    if (i != order[0] && m.error == members[order[0]].error) continue;
    std::string also;
    if (i == order[0] && !same.empty()) {
      also = absl::StrCat(same.size() == 1 ? " (member " : " (members ", absl::StrJoin(same, ","),
                          " failed the same way)");
    }
    std::fprintf(stderr, "collectived_perf: %s member %zu of %d (pid %d) failed: %s%s\n",
                 i == order[0] ? "error:" : "also:", i, n, static_cast<int>(m.pid),
                 m.error.c_str(), also.c_str());
  }
  if (!daemon_problem.empty()) {
    std::fprintf(stderr, "collectived_perf: %s\n", daemon_problem.c_str());
  }
  return 1;
}

// The probes' server, with no engine and no daemon. grpc_echo: answers each
// OpRequest of an Execute stream at once with an OpResult of the same tag
// (the round trip of the gRPC path without its work). grpc_rendezvous: holds
// each request until every member of its mesh sent the same tag, then
// answers them all (the floor of an op that needs all members, which no
// engine can go under).
class EchoService final : public collectived::v1::Collective::CallbackService {
  class Reactor;
  // Streams waiting for the rest of their round, by (mesh, tag).
  class Rounds {
   public:
    // Returns the round's streams once `members` of them arrived.
    std::vector<Reactor*> Arrive(const std::string& mesh, int64_t tag, int members, Reactor* r) {
      std::lock_guard<std::mutex> lock(mu_);
      auto key = std::make_pair(mesh, tag);
      std::vector<Reactor*>& waiting = waiting_[key];
      waiting.push_back(r);
      if (static_cast<int>(waiting.size()) < members) return {};
      std::vector<Reactor*> all = std::move(waiting);
      waiting_.erase(key);
      return all;
    }
    // A stream of `mesh` ended: the streams waiting for it would wait forever.
    std::vector<Reactor*> Abandon(const std::string& mesh) {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<Reactor*> left;
      for (auto it = waiting_.lower_bound({mesh, std::numeric_limits<int64_t>::min()});
           it != waiting_.end() && it->first.first == mesh;) {
        left.insert(left.end(), it->second.begin(), it->second.end());
        it = waiting_.erase(it);
      }
      return left;
    }

   private:
    std::mutex mu_;
    std::map<std::pair<std::string, int64_t>, std::vector<Reactor*>> waiting_;
  };

  class Reactor final : public grpc::ServerBidiReactor<collectived::v1::OpRequest,
                                                       collectived::v1::OpResult> {
   public:
    Reactor(Rounds* rounds, int members) : rounds_(rounds), members_(members) {
      StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        if (members_ > 0) {
          for (Reactor* r : rounds_->Abandon(mesh_)) {
            r->Finish(grpc::Status(grpc::StatusCode::ABORTED, "a member's stream ended"));
          }
        }
        Finish(grpc::Status::OK);
        return;
      }
      result_.set_tag(request_.tag());
      if (members_ == 0) {
        StartWrite(&result_);
        return;
      }
      // The waiting streams have no read outstanding until their write is
      // done, so none of them can end meanwhile.
      mesh_ = request_.op().mesh_id();
      for (Reactor* r : rounds_->Arrive(mesh_, request_.tag(), members_, this)) {
        r->StartWrite(&r->result_);
      }
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      StartRead(&request_);
    }
    void OnDone() override { delete this; }

   private:
    Rounds* const rounds_;
    const int members_;  // 0: echo
    std::string mesh_;
    collectived::v1::OpRequest request_;
    collectived::v1::OpResult result_;
  };

 public:
  grpc::ServerBidiReactor<collectived::v1::OpRequest, collectived::v1::OpResult>* Execute(
      grpc::CallbackServerContext* ctx) override {
    int members = 0;
    auto it = ctx->client_metadata().find(kRendezvousMembersKey);
    if (it != ctx->client_metadata().end() &&
        !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &members)) {
      members = 0;
    }
    return new Reactor(&rounds_, std::max(0, members));
  }

 private:
  Rounds rounds_;
};

struct EchoServer {
  std::string dir, socket;
  EchoService service;
  std::unique_ptr<grpc::Server> server;
  ~EchoServer() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!socket.empty()) unlink(socket.c_str());
    if (!dir.empty()) rmdir(dir.c_str());
  }
};

absl::StatusOr<std::unique_ptr<EchoServer>> StartEchoServer() {
  auto e = std::make_unique<EchoServer>();
  const char* tmp = getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/collectived-echo-XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, ": ", strerror(errno)));
  }
  e->dir = buf.data();
  e->socket = e->dir + "/echo.sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + e->socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&e->service);
  e->server = builder.BuildAndStart();
  if (!e->server) return absl::UnavailableError(absl::StrCat("cannot listen on ", e->socket));
  return e;
}

// A port on 127.0.0.1 that was free a moment ago (0 if none).
int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// --hosts: cfg.hosts daemons as hosts h0.. of a cluster on loopback, h0 also
// the coordinator; returns once every one has joined.
absl::StatusOr<std::vector<std::unique_ptr<OwnDaemon>>> StartCluster(const Config& cfg) {
  const int port = FreeLoopbackPort();
  if (port == 0) return absl::UnavailableError("no free port on 127.0.0.1");
  // GPU buffers go between the daemons over NCCL: on loopback, as the
  // daemons are (each sets NCCL_HOSTID from its host id). An operator's
  // choice is kept.
  setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  std::vector<std::unique_ptr<OwnDaemon>> daemons;
  for (int h = 0; h < cfg.hosts; ++h) {
    std::vector<std::string> args = cfg.daemon_args;
    // Info level: the cluster's state is read from the log.
    args.push_back("--log_level=info");
    args.push_back(absl::StrCat("--host-id=h", h));
    if (h == 0) {
      args.push_back(absl::StrCat("--tcp=127.0.0.1:", port));
      args.push_back("--coordinator");
    } else {
      args.push_back("--tcp=127.0.0.1:0");
      args.push_back(absl::StrCat("--cluster=127.0.0.1:", port));
    }
    auto d = OwnDaemon::Start(args);
    if (!d.ok()) return d.status();
    daemons.push_back(*std::move(d));
  }
  for (int h = 0; h < cfg.hosts; ++h) {
    std::string why;
    if (!daemons[h]->WaitForLog(absl::StrCat("event=cluster_state state=joined host_id=h", h),
                                absl::Seconds(20), &why)) {
      return absl::UnavailableError(absl::StrCat("daemon h", h, " did not join: ", why));
    }
  }
  return daemons;
}

int RunParent(const Config& flags) {
  Config cfg = flags;
  std::unique_ptr<EchoServer> echo;
  if (std::any_of(cfg.ops.begin(), cfg.ops.end(), IsGrpcProbe)) {
    auto e = StartEchoServer();
    if (!e.ok()) {
      std::fprintf(stderr, "collectived_perf: echo server: %s\n", e.status().ToString().c_str());
      return 1;
    }
    echo = *std::move(e);
    cfg.echo_socket = echo->socket;
  }

  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::unique_ptr<OwnDaemon>> daemons;
  std::vector<std::string> sockets;
  std::string socket = cfg.socket, daemon_desc;
  if (socket.empty() && cfg.hosts > 1) {
    auto cluster = StartCluster(cfg);
    if (!cluster.ok()) {
      std::fprintf(stderr, "collectived_perf: cannot start a cluster of %d daemons: %s\n",
                   cfg.hosts, cluster.status().ToString().c_str());
      return 1;
    }
    daemons = *std::move(cluster);
    for (const auto& d : daemons) sockets.push_back(d->socket());
    daemon_desc = absl::StrCat(cfg.hosts, " daemons of a cluster on loopback (",
                               daemons[0]->binary(), "), members ", cfg.in_runs ? "in runs" : "round robin");
  } else if (socket.empty()) {
    auto d = OwnDaemon::Start(cfg.daemon_args);
    if (!d.ok()) {
      std::fprintf(stderr, "collectived_perf: cannot start a daemon: %s\n",
                   d.status().ToString().c_str());
      return 1;
    }
    daemons.push_back(*std::move(d));
    socket = daemons[0]->socket();
    sockets = {socket};
    daemon_desc = absl::StrCat(daemons[0]->binary(), " (started, pid ", daemons[0]->pid(),
                               ", socket ", socket, ")");
  } else {
    if (!SocketLive(socket)) {
      std::fprintf(stderr, "collectived_perf: no daemon is listening on %s\n", socket.c_str());
      return 1;
    }
    daemon_desc = socket;
    sockets = {socket};
  }

  Printer printer(cfg, daemon_desc);
  int check_failures = 0;
  int rc = 0;
  for (int n : cfg.members) {
    rc = RunMembers(cfg, n, sockets, printer, daemons, &check_failures);
    if (rc != 0) break;
  }
  printer.Footer();
  for (auto& d : daemons) {
    std::string problem = d->Stop();
    if (!problem.empty()) {
      std::fprintf(stderr, "collectived_perf: the daemon %s\n", problem.c_str());
      if (rc == 0) rc = 1;
    }
  }
  if (rc == 0 && check_failures > 0) {
    std::fprintf(stderr, "collectived_perf: %d row(s) failed the check\n", check_failures);
    rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const Config cfg = ParseFlags(argc, argv);
  if (cfg.member >= 0) return RunMember(cfg);
  return RunParent(cfg);
}
