// peer_common.h: what mpi_perf and gloo_perf share with each other, and (by
// definition, not by code) with bench/collectived_perf.cc, so that the three
// benchmarks measure and report the same thing:
//
//   - the flags (--op, --dtype, --min-bytes, --max-bytes, --step-factor,
//     --iters, --warmup, --check, --json) and their parsing;
//   - the size plan (min..max by the step factor, rounded down to whole
//     elements, for all_gather to a multiple of N elements; `bytes` is the
//     per-member input size for psum and the per-member OUTPUT size for
//     all_gather);
//   - the input patterns and the exact check of the results (small integers
//     for psum, member- and position-identifying values for all_gather);
//   - the summary of a row (an iteration's time is the slowest member's; a row
//     reports the median and the minimum over the iterations) and the bus
//     bandwidth factors (all-reduce 2(N-1)/N, all-gather (N-1)/N);
//   - the output: an nccl-tests style table, or one JSON object per row with
//     collectived_perf's keys plus "system".
//
// Only the standard library is used, so the peers build without the
// project's own libraries. See bench/README.md ("Peer comparison").
#pragma once

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace peers {

// ---------------------------------------------------------------------------
// Ops and dtypes.

enum class Op { kPsum, kAllGather };

inline const char* OpName(Op op) { return op == Op::kPsum ? "psum" : "all_gather"; }

inline std::optional<Op> OpFromName(const std::string& name) {
  if (name == "psum") return Op::kPsum;
  if (name == "all_gather") return Op::kAllGather;
  return std::nullopt;
}

// nccl-tests' bus bandwidth factor: all-reduce 2(N-1)/N, all-gather (N-1)/N.
inline double BusFactor(Op op, int n) {
  return op == Op::kPsum ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

enum class DType { kF32, kF64, kI32, kU32, kI64, kU64 };

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kI32,
                                DType::kU32, DType::kI64, DType::kU64};

inline const char* DTypeName(DType dt) {
  switch (dt) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kU32: return "uint32";
    case DType::kI64: return "int64";
    case DType::kU64: return "uint64";
  }
  return "?";
}

inline std::optional<DType> DTypeFromName(const std::string& name) {
  for (DType dt : kAllDTypes) {
    if (name == DTypeName(dt)) return dt;
  }
  return std::nullopt;
}

// Calls f(T{}) with T the C++ type of dt.
template <typename F>
decltype(auto) WithType(DType dt, F&& f) {
  switch (dt) {
    case DType::kF64: return f(double{});
    case DType::kI32: return f(int32_t{});
    case DType::kU32: return f(uint32_t{});
    case DType::kI64: return f(int64_t{});
    case DType::kU64: return f(uint64_t{});
    case DType::kF32: break;
  }
  return f(float{});
}

inline int64_t DTypeSize(DType dt) {
  return WithType(dt, [](auto t) { return static_cast<int64_t>(sizeof(t)); });
}

// ---------------------------------------------------------------------------
// Configuration and flags.

struct Config {
  std::vector<Op> ops;
  DType dtype = DType::kF32;
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{64} << 20;
  int64_t step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
  bool check = true;
  bool help = false;
};

// "64M" -> 67108864. Suffixes K, M, G are powers of 1024 (optionally followed
// by B or iB; any case).
inline std::optional<int64_t> ParseSize(std::string t) {
  for (char& c : t) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char* suffix : {"IB", "B"}) {
    const size_t len = std::strlen(suffix);
    if (t.size() > len && t.compare(t.size() - len, len, suffix) == 0) {
      t.resize(t.size() - len);
      break;
    }
  }
  int shift = 0;
  if (!t.empty()) {
    switch (t.back()) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) t.pop_back();
  }
  if (t.empty() || t.size() > 18 ||
      !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  const int64_t v = std::strtoll(t.c_str(), nullptr, 10);
  if (v > (INT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

inline std::optional<int64_t> ParseInt(const std::string& t, int64_t lo, int64_t hi) {
  if (t.empty() || t.size() > 18) return std::nullopt;
  size_t i = t[0] == '-' ? 1 : 0;
  if (i == t.size() ||
      !std::all_of(t.begin() + static_cast<std::ptrdiff_t>(i), t.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  const int64_t v = std::strtoll(t.c_str(), nullptr, 10);
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

inline std::optional<bool> ParseBool(std::string t) {
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t.empty() || t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return std::nullopt;
}

inline std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string part = s.substr(start, comma - start);
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty()) parts.push_back(part);
    start = comma + 1;
  }
  return parts;
}

// Text of the common flags, for each program's usage message.
constexpr char kCommonUsage[] =
    "  --op=NAME          psum (default) or all_gather; a comma list (psum,all_gather)\n"
    "                     or `all` runs both\n"
    "  --dtype=NAME       float32 (default), float64, int32, uint32, int64, uint64\n"
    "  --min-bytes=SIZE   smallest size (default 8); suffixes K, M, G (powers of 1024)\n"
    "  --max-bytes=SIZE   largest size (default 64M, at most 16G)\n"
    "  --step-factor=F    multiply the size by F between rows (default 2)\n"
    "  --iters=N          timed iterations per size (default 20)\n"
    "  --warmup=N         untimed iterations per size (default 5)\n"
    "  --check[=BOOL]     verify the result of one untimed op per size (default true;\n"
    "                     --nocheck turns it off)\n"
    "  --json[=BOOL]      one JSON object per row on stdout instead of the table\n";

// One "--name" or "--name=value" argument: the name with `_` read as `-`, the
// value, and whether "=value" was there. `arg` starts with "--".
struct FlagArg {
  std::string name, value;
  bool has_value = false;
};
inline FlagArg SplitFlag(const std::string& arg) {
  FlagArg f{arg.substr(2), "", false};
  if (size_t eq = f.name.find('='); eq != std::string::npos) {
    f.value = f.name.substr(eq + 1);
    f.name.resize(eq);
    f.has_value = true;
  }
  std::replace(f.name.begin(), f.name.end(), '_', '-');
  return f;
}

// Parses argv into cfg. Flags take `--flag=value` or `--flag value`; `_` may
// replace `-`. `extra(name, value)` handles the program's own valued flags
// (listed in `extra_names`) and returns an error text or "". Returns an error
// text (the caller prints it with the usage and exits 2) or "".
inline std::string ParseFlags(int argc, char** argv, Config& cfg,
                              const std::vector<std::string>& extra_names,
                              const std::function<std::string(const std::string&,
                                                              const std::string&)>& extra) {
  std::string ops = "psum";
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    if (arg == "--help" || arg == "-h") {
      cfg.help = true;
      return "";
    }
    if (arg.rfind("--", 0) != 0) return "unexpected argument '" + arg + "'";
    auto [name, value, has_value] = SplitFlag(arg);
    if (name == "json" || name == "check") {
      std::optional<bool> b = ParseBool(value);
      if (!b) return "--" + name + "=" + value + ": expected true or false";
      (name == "json" ? cfg.json : cfg.check) = *b;
      continue;
    }
    if (name == "nojson" || name == "no-json" || name == "nocheck" || name == "no-check") {
      if (has_value) return "--" + name + " takes no value";
      (name.find("json") != std::string::npos ? cfg.json : cfg.check) = false;
      continue;
    }
    static const char* const kValued[] = {"op",          "dtype", "min-bytes", "max-bytes",
                                          "step-factor", "iters", "warmup"};
    const bool common = std::any_of(std::begin(kValued), std::end(kValued),
                                    [&](const char* f) { return name == f; });
    const bool own = std::find(extra_names.begin(), extra_names.end(), name) != extra_names.end();
    if (!common && !own) return "unknown flag --" + name;
    if (!has_value) {
      if (a + 1 >= argc) return "--" + name + " needs a value";
      value = argv[++a];
    }
    if (own) {
      if (std::string err = extra(name, value); !err.empty()) return err;
    } else if (name == "op") {
      ops = value;
    } else if (name == "dtype") {
      auto dt = DTypeFromName(value);
      if (!dt) {
        return "--dtype=" + value + ": expected float32, float64, int32, uint32, int64 or uint64";
      }
      cfg.dtype = *dt;
    } else if (name == "min-bytes" || name == "max-bytes") {
      auto v = ParseSize(value);
      if (!v) return "--" + name + "=" + value + ": expected a size like 8, 1K, 64M";
      (name == "min-bytes" ? cfg.min_bytes : cfg.max_bytes) = *v;
    } else {
      const int64_t lo = name == "warmup" ? 0 : name == "step-factor" ? 2 : 1;
      const int64_t hi = name == "step-factor" ? (1 << 20) : 1000000;
      auto v = ParseInt(value, lo, hi);
      if (!v) {
        return "--" + name + "=" + value + ": expected an integer in " + std::to_string(lo) +
               ".." + std::to_string(hi);
      }
      if (name == "step-factor") cfg.step_factor = *v;
      if (name == "iters") cfg.iters = static_cast<int>(*v);
      if (name == "warmup") cfg.warmup = static_cast<int>(*v);
    }
  }
  cfg.ops.clear();
  for (const std::string& part : SplitComma(ops)) {
    std::vector<Op> add;
    if (part == "all") {
      add = {Op::kPsum, Op::kAllGather};
    } else if (auto op = OpFromName(part)) {
      add = {*op};
    } else {
      return "--op=" + ops + ": unknown op '" + part + "' (psum, all_gather, all)";
    }
    for (Op op : add) {
      if (std::find(cfg.ops.begin(), cfg.ops.end(), op) == cfg.ops.end()) cfg.ops.push_back(op);
    }
  }
  if (cfg.ops.empty()) return "--op is empty";
  if (cfg.min_bytes < 1) return "--min-bytes must be at least 1";
  if (cfg.max_bytes < cfg.min_bytes) {
    return "--max-bytes (" + std::to_string(cfg.max_bytes) + ") is smaller than --min-bytes (" +
           std::to_string(cfg.min_bytes) + ")";
  }
  if (cfg.max_bytes > (int64_t{16} << 30)) return "--max-bytes must be at most 16G";
  return "";
}

// The flags that reproduce cfg (for members started by a parent).
inline std::vector<std::string> CommonArgs(const Config& cfg) {
  std::string ops;
  for (Op op : cfg.ops) ops += std::string(ops.empty() ? "" : ",") + OpName(op);
  return {"--op=" + ops,
          std::string("--dtype=") + DTypeName(cfg.dtype),
          "--min-bytes=" + std::to_string(cfg.min_bytes),
          "--max-bytes=" + std::to_string(cfg.max_bytes),
          "--step-factor=" + std::to_string(cfg.step_factor),
          "--iters=" + std::to_string(cfg.iters),
          "--warmup=" + std::to_string(cfg.warmup),
          std::string("--check=") + (cfg.check ? "true" : "false")};
}

// ---------------------------------------------------------------------------
// The size plan (collectived_perf's PlanRows, for psum and all_gather).

struct Row {
  Op op = Op::kPsum;
  int64_t in_count = 0;   // elements of the input, per member
  int64_t out_count = 0;  // elements of the output, per member
  int64_t bytes = 0;      // the reported size (nccl-tests semantics)
  int64_t count = 0;      // bytes / element size
  size_t in_bytes = 0;
  size_t out_bytes = 0;
};

inline std::vector<Row> PlanRows(const Config& cfg, int n) {
  std::vector<Row> rows;
  const int64_t es = DTypeSize(cfg.dtype);
  for (Op op : cfg.ops) {
    int64_t last_bytes = -1;
    for (int64_t s = cfg.min_bytes; s <= cfg.max_bytes;) {
      Row r;
      r.op = op;
      int64_t elems = std::max<int64_t>(1, s / es);
      if (op == Op::kAllGather) {  // `bytes` is the output size; input is 1/n of it
        elems = std::max<int64_t>(n, elems / n * n);
        r.out_count = elems;
        r.in_count = elems / n;
      } else {
        r.in_count = r.out_count = elems;
      }
      r.count = r.out_count;
      r.bytes = r.count * es;
      r.in_bytes = static_cast<size_t>(r.in_count * es);
      r.out_bytes = static_cast<size_t>(r.out_count * es);
      if (r.bytes != last_bytes) rows.push_back(r);
      last_bytes = r.bytes;
      if (s > cfg.max_bytes / cfg.step_factor) break;
      s *= cfg.step_factor;
    }
  }
  return rows;
}

// ---------------------------------------------------------------------------
// Test patterns and the check (the same values as collectived_perf uses).

// psum input of member i at element k: 0..4, so every sum is exact.
inline int64_t RedVal(int i, int64_t k) { return (k + 3 * int64_t{i}) % 5; }

// all_gather input of member i at element k: identifies member and position,
// exact in every supported dtype (below 2^24).
inline int64_t MoveVal(int i, int64_t k) { return (k * 13 + int64_t{i} * 7 + 1) % (int64_t{1} << 24); }

// Fills `count` input elements of member `me` for op (count is the largest
// input of any row, so every row's input is a prefix of it).
inline void FillInput(Op op, DType dt, int me, void* p, int64_t count) {
  WithType(dt, [&](auto t) {
    using T = decltype(t);
    T* x = static_cast<T*>(p);
    for (int64_t k = 0; k < count; ++k) {
      x[k] = static_cast<T>(op == Op::kPsum ? RedVal(me, k) : MoveVal(me, k));
    }
  });
}

// Empty when `out` (row r's output of member `me` of `n`) holds what it must;
// else a description of the first mismatch.
inline std::string Verify(Op op, DType dt, int n, const Row& r, const void* out) {
  return WithType(dt, [&](auto t) -> std::string {
    using T = decltype(t);
    const T* y = static_cast<const T*>(out);
    T table[5];  // psum results repeat every 5 elements
    for (int j = 0; j < 5; ++j) {
      int64_t s = 0;
      for (int i = 0; i < n; ++i) s += RedVal(i, j);
      table[j] = static_cast<T>(s);
    }
    const int64_t tile = std::max<int64_t>(1, r.out_count / n);
    int64_t bad = 0;
    std::string first;
    for (int64_t k = 0; k < r.out_count; ++k) {
      const T want = op == Op::kPsum ? table[k % 5]
                                     : static_cast<T>(MoveVal(static_cast<int>(k / tile), k % tile));
      if (y[k] == want) continue;
      if (bad++ == 0) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "element %" PRId64 " is %.17g, expected %.17g", k,
                      static_cast<double>(y[k]), static_cast<double>(want));
        first = buf;
      }
    }
    if (bad == 0) return "";
    return std::to_string(bad) + " of " + std::to_string(r.out_count) +
           " elements wrong; first: " + first;
  });
}

// Allocates `bytes` (at least 64), 64-byte aligned and zeroed; aborts on
// failure. Free with std::free.
inline void* AllocBuffer(size_t bytes) {
  const size_t size = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) {
    std::fprintf(stderr, "cannot allocate %zu bytes\n", size);
    std::abort();
  }
  std::memset(p, 0, size);  // touch every page before timing
  return p;
}

// Nanoseconds on the monotonic clock.
inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------
// Results.

struct RowResult {
  double med_us = 0, min_us = 0, algbw = 0, busbw = 0;
  std::string check;
};

// times[m][i]: member m's time of iteration i, in ns. An iteration's time is
// the slowest member's; the row reports the median and the minimum of those.
inline RowResult Summarize(const Row& r, int n, const std::vector<std::vector<int64_t>>& times,
                           const std::string& check) {
  const size_t iters = times.empty() ? 0 : times[0].size();
  std::vector<int64_t> per_iter(iters, 0);
  for (const auto& t : times) {
    for (size_t i = 0; i < iters && i < t.size(); ++i) per_iter[i] = std::max(per_iter[i], t[i]);
  }
  RowResult res;
  res.check = check;
  if (iters == 0) return res;
  std::sort(per_iter.begin(), per_iter.end());
  const double med_ns = iters % 2 == 1 ? static_cast<double>(per_iter[iters / 2])
                                       : (static_cast<double>(per_iter[iters / 2 - 1]) +
                                          static_cast<double>(per_iter[iters / 2])) /
                                             2;
  res.med_us = med_ns / 1e3;
  res.min_us = static_cast<double>(per_iter[0]) / 1e3;
  res.algbw = med_ns > 0 ? static_cast<double>(r.bytes) / med_ns : 0;  // bytes/ns == GB/s
  res.busbw = res.algbw * BusFactor(r.op, n);
  return res;
}

// Prints rows as collectived_perf does (table or JSON), with "system" added.
class Printer {
 public:
  // `system`: the JSON "system" value; `program`: the table's title;
  // `describe`: one line about the transport (shown in the table header).
  Printer(const Config& cfg, std::string system, std::string program, std::string describe)
      : cfg_(cfg),
        system_(std::move(system)),
        program_(std::move(program)),
        describe_(std::move(describe)) {}

  void PrintRow(const Row& r, int n, const RowResult& res) {
    if (cfg_.json) {
      std::printf(
          "{\"system\":\"%s\",\"op\":\"%s\",\"members\":%d,\"dtype\":\"%s\",\"bytes\":%" PRId64
          ",\"count\":%" PRId64
          ",\"time_us\":%.3f,\"time_us_min\":%.3f,\"algbw_gbps\":%.6f,\"busbw_gbps\":%.6f,"
          "\"check\":\"%s\"}\n",
          system_.c_str(), OpName(r.op), n, DTypeName(cfg_.dtype), r.bytes, r.count, res.med_us,
          res.min_us, res.algbw, res.busbw, res.check.c_str());
      std::fflush(stdout);
      return;
    }
    if (!open_ || r.op != op_ || n != n_) {
      Footer();
      Header(r.op, n);
    }
    std::printf("%12" PRId64 " %12" PRId64 " %9s %13.2f %13.2f %12.3f %12.3f %7s\n", r.bytes,
                r.count, DTypeName(cfg_.dtype), res.med_us, res.min_us, res.algbw, res.busbw,
                res.check.c_str());
    std::fflush(stdout);
    busbw_sum_ += res.busbw;
    ++rows_;
  }

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
    std::printf("# %s: op %s, members %d, dtype %s, %s\n", program_.c_str(), OpName(op), n,
                DTypeName(cfg_.dtype), describe_.c_str());
    std::printf(
        "# iters %d, warmup %d, check %s; time = median (and min) over iterations of the slowest "
        "member's op time\n",
        cfg_.iters, cfg_.warmup, cfg_.check ? "on" : "off");
    std::printf("#\n# %10s %12s %9s %13s %13s %12s %12s %7s\n", "size(B)", "count", "type",
                "time_us(med)", "time_us(min)", "algbw(GB/s)", "busbw(GB/s)", "check");
  }

  const Config& cfg_;
  std::string system_, program_, describe_;
  bool open_ = false;
  Op op_ = Op::kPsum;
  int n_ = 0;
  double busbw_sum_ = 0;
  int rows_ = 0;
};

}  // namespace peers
