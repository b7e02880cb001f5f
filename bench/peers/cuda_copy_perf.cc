// cuda_copy_perf: the device's copy bandwidth, the ceiling of any collective
// that reads and writes the same GPU's memory.
//
//   cuda_copy_perf [--method=memcpy,kernel] [--device=N] [--min-bytes=1M]
//                  [--max-bytes=64M] [--step-factor=2] [--iters=20]
//                  [--warmup=5] [--check=true] [--json]
//
// For each size S: one device-to-device copy of S bytes between two buffers
// (cudaMalloc'd once) on one stream, by
//   memcpy  cudaMemcpyAsync(cudaMemcpyDeviceToDevice)
//   kernel  a grid-stride copy kernel in 16-byte words (copy_kernel.cu)
// one checked copy, `warmup` untimed copies and `iters` timed copies back to
// back, each timed by a pair of CUDA events; a row reports the median and the
// minimum over the iterations. A copy moves 2S bytes through the memory (S
// read, S written): `copy_gbps` = 2S / time, GB = 1e9 bytes.
//
// Table and JSON as the other peers: JSON rows carry collectived_perf's keys
// ("op" is "copy", "members" 1, "dtype" "uint8", "count" = bytes) with
// "system" = "cuda_memcpy" or "cuda_kernel", algbw_gbps = S / time,
// busbw_gbps = copy_gbps = 2S / time, "device" ("cuda:N") and "gpu" (its name).
//
// Exit status: 0; 1 on an error or a failed check; 2 for a bad flag; 77 when
// no GPU is usable (no device, no driver), with the CUDA runtime's reason.
#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "copy_kernel.h"
#include "peer_common.h"

namespace {

constexpr int kNoGpu = 77;

constexpr char kUsage[] =
    "usage: cuda_copy_perf [flags]\n"
    "  --method=LIST      memcpy (cudaMemcpyAsync D2D), kernel (a copy kernel), or both\n"
    "                     as a comma list (default memcpy,kernel)\n"
    "  --device=N         the CUDA device ordinal (default 0)\n"
    "  --min-bytes=SIZE   smallest copy (default 1M); suffixes K, M, G (powers of 1024)\n"
    "  --max-bytes=SIZE   largest copy (default 64M, at most 16G)\n"
    "  --step-factor=F    multiply the size by F between rows (default 2)\n"
    "  --iters=N          timed copies per size (default 20)\n"
    "  --warmup=N         untimed copies per size (default 5)\n"
    "  --check[=BOOL]     verify one untimed copy per size (default true)\n"
    "  --json[=BOOL]      one JSON object per row on stdout instead of the table\n";

[[noreturn]] void UsageError(const std::string& msg) {
  std::fprintf(stderr, "cuda_copy_perf: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cuda_copy_perf: %s\n", what.c_str());
  std::exit(1);
}

void CudaOk(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    Die(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

struct Flags {
  std::vector<std::string> methods = {"memcpy", "kernel"};
  int device = 0;
  int64_t min_bytes = int64_t{1} << 20;
  int64_t max_bytes = int64_t{64} << 20;
  int64_t step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool json = false;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) UsageError("unexpected argument '" + arg + "'");
    auto [name, value, has_value] = peers::SplitFlag(arg);
    if (name == "json" || name == "check") {
      auto b = peers::ParseBool(value);
      if (!b) UsageError("--" + name + "=" + value + ": expected true or false");
      (name == "json" ? f.json : f.check) = *b;
      continue;
    }
    if (name == "nojson" || name == "no-json" || name == "nocheck" || name == "no-check") {
      if (has_value) UsageError("--" + name + " takes no value");
      (name.find("json") != std::string::npos ? f.json : f.check) = false;
      continue;
    }
    static const char* const kValued[] = {"method", "device", "min-bytes", "max-bytes",
                                          "step-factor", "iters", "warmup"};
    if (std::none_of(std::begin(kValued), std::end(kValued),
                     [&](const char* v) { return name == v; })) {
      UsageError("unknown flag --" + name);
    }
    if (!has_value) {
      if (a + 1 >= argc) UsageError("--" + name + " needs a value");
      value = argv[++a];
    }
    if (name == "method") {
      f.methods = peers::SplitComma(value);
      if (f.methods.empty()) UsageError("--method is empty");
      for (const std::string& m : f.methods) {
        if (m != "memcpy" && m != "kernel") {
          UsageError("--method=" + value + ": unknown method '" + m + "' (memcpy, kernel)");
        }
      }
    } else if (name == "min-bytes" || name == "max-bytes") {
      auto v = peers::ParseSize(value);
      if (!v) UsageError("--" + name + "=" + value + ": expected a size like 8, 1K, 64M");
      (name == "min-bytes" ? f.min_bytes : f.max_bytes) = *v;
    } else {
      const int64_t lo = name == "warmup" || name == "device" ? 0 : name == "step-factor" ? 2 : 1;
      const int64_t hi = name == "step-factor" ? (1 << 20) : name == "device" ? 1023 : 1000000;
      auto v = peers::ParseInt(value, lo, hi);
      if (!v) {
        UsageError("--" + name + "=" + value + ": expected an integer in " + std::to_string(lo) +
                   ".." + std::to_string(hi));
      }
      if (name == "device") f.device = static_cast<int>(*v);
      if (name == "step-factor") f.step_factor = *v;
      if (name == "iters") f.iters = static_cast<int>(*v);
      if (name == "warmup") f.warmup = static_cast<int>(*v);
    }
  }
  if (f.min_bytes < 1) UsageError("--min-bytes must be at least 1");
  if (f.max_bytes < f.min_bytes) UsageError("--max-bytes is smaller than --min-bytes");
  if (f.max_bytes > (int64_t{16} << 30)) UsageError("--max-bytes must be at most 16G");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);

  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    std::fprintf(stderr, "cuda_copy_perf: no usable GPU: %s\n",
                 e != cudaSuccess
                     ? (std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)).c_str()
                     : "cudaGetDeviceCount found 0 devices");
    return kNoGpu;
  }
  if (f.device >= count) {
    Die("--device=" + std::to_string(f.device) + " but only " + std::to_string(count) +
        " GPU(s) are visible");
  }
  CudaOk(cudaSetDevice(f.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  CudaOk(cudaGetDeviceProperties(&prop, f.device), "cudaGetDeviceProperties");

  std::vector<int64_t> sizes;
  for (int64_t s = f.min_bytes; s <= f.max_bytes;) {
    sizes.push_back(s);
    if (s > f.max_bytes / f.step_factor) break;
    s *= f.step_factor;
  }
  const size_t max_bytes = static_cast<size_t>(sizes.back());
  void *src = nullptr, *dst = nullptr;
  CudaOk(cudaMalloc(&src, max_bytes), "cudaMalloc (source)");
  CudaOk(cudaMalloc(&dst, max_bytes), "cudaMalloc (destination)");
  cudaStream_t stream = nullptr;
  CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<cudaEvent_t> start(static_cast<size_t>(f.iters)), stop(static_cast<size_t>(f.iters));
  for (int i = 0; i < f.iters; ++i) {
    CudaOk(cudaEventCreate(&start[static_cast<size_t>(i)]), "cudaEventCreate");
    CudaOk(cudaEventCreate(&stop[static_cast<size_t>(i)]), "cudaEventCreate");
  }
  // The source: a byte pattern that a misplaced or missing byte breaks.
  std::vector<unsigned char> host(max_bytes), back;
  for (size_t k = 0; k < max_bytes; ++k) host[k] = static_cast<unsigned char>((k * 131 + k / 251) & 0xff);
  CudaOk(cudaMemcpy(src, host.data(), max_bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");

  auto copy = [&](const std::string& method, size_t bytes) {
    if (method == "memcpy") {
      CudaOk(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    } else {
      CudaOk(LaunchCopyKernel(dst, src, bytes, prop.multiProcessorCount, stream), "copy kernel");
    }
  };

  int failures = 0;
  for (const std::string& method : f.methods) {
    const std::string system = "cuda_" + method;
    if (!f.json) {
      std::printf("# cuda_copy_perf: %s, device %d (%s), iters %d, warmup %d, check %s\n",
                  method == "memcpy" ? "cudaMemcpyAsync D2D" : "copy kernel (16-byte words)",
                  f.device, prop.name, f.iters, f.warmup, f.check ? "on" : "off");
      std::printf("# time = median (and min) over iterations; copy(GB/s) = 2 x size / time "
                  "(read + write)\n#\n");
      std::printf("# %10s %13s %13s %12s %7s\n", "size(B)", "time_us(med)", "time_us(min)",
                  "copy(GB/s)", "check");
    }
    double sum = 0;
    for (int64_t s : sizes) {
      const size_t bytes = static_cast<size_t>(s);
      std::string check = "skipped";
      if (f.check) {
        CudaOk(cudaMemsetAsync(dst, 0xA5, bytes, stream), "cudaMemsetAsync");
        copy(method, bytes);
        CudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        back.resize(bytes);
        CudaOk(cudaMemcpy(back.data(), dst, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
        check = std::memcmp(back.data(), host.data(), bytes) == 0 ? "ok" : "fail";
        if (check == "fail") {
          size_t k = 0;
          while (k < bytes && back[k] == host[k]) ++k;
          std::fprintf(stderr, "cuda_copy_perf: check failed: %s %zu B: byte %zu is %u, expected %u\n",
                       method.c_str(), bytes, k, back[k], host[k]);
          ++failures;
        }
      }
      for (int w = 0; w < f.warmup; ++w) copy(method, bytes);
      for (int i = 0; i < f.iters; ++i) {
        CudaOk(cudaEventRecord(start[static_cast<size_t>(i)], stream), "cudaEventRecord");
        copy(method, bytes);
        CudaOk(cudaEventRecord(stop[static_cast<size_t>(i)], stream), "cudaEventRecord");
      }
      CudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      std::vector<double> us;
      for (int i = 0; i < f.iters; ++i) {
        float ms = 0;
        CudaOk(cudaEventElapsedTime(&ms, start[static_cast<size_t>(i)], stop[static_cast<size_t>(i)]),
               "cudaEventElapsedTime");
        us.push_back(static_cast<double>(ms) * 1e3);
      }
      std::sort(us.begin(), us.end());
      const size_t n = us.size();
      const double med = n % 2 == 1 ? us[n / 2] : (us[n / 2 - 1] + us[n / 2]) / 2;
      const double algbw = med > 0 ? static_cast<double>(s) / (med * 1e3) : 0;  // bytes/ns = GB/s
      const double copy_gbps = 2 * algbw;
      sum += copy_gbps;
      if (f.json) {
        std::printf("{\"system\":\"%s\",\"op\":\"copy\",\"members\":1,\"dtype\":\"uint8\","
                    "\"bytes\":%" PRId64 ",\"count\":%" PRId64
                    ",\"time_us\":%.3f,\"time_us_min\":%.3f,\"algbw_gbps\":%.6f,"
                    "\"busbw_gbps\":%.6f,\"copy_gbps\":%.6f,\"check\":\"%s\",\"device\":\"cuda:%d\",\"gpu\":\"%s\"}\n",
                    system.c_str(), s, s, med, us[0], algbw, copy_gbps, copy_gbps, check.c_str(), f.device,
                    prop.name);
      } else {
        std::printf("%12" PRId64 " %13.2f %13.2f %12.3f %7s\n", s, med, us[0], copy_gbps,
                    check.c_str());
      }
      std::fflush(stdout);
    }
    if (!f.json) {
      std::printf("# avg copy bandwidth: %.3f GB/s over %zu sizes\n\n", sum / static_cast<double>(sizes.size()),
                  sizes.size());
    }
  }

  for (int i = 0; i < f.iters; ++i) {
    cudaEventDestroy(start[static_cast<size_t>(i)]);
    cudaEventDestroy(stop[static_cast<size_t>(i)]);
  }
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
  if (failures > 0) {
    std::fprintf(stderr, "cuda_copy_perf: %d row(s) failed the check\n", failures);
    return 1;
  }
  return 0;
}
