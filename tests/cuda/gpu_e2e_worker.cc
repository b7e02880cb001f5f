// collectived_gpu_e2e_worker: one member process of the GPU end-to-end tests
// (gpu_e2e_test.cc). Its buffer is GPU memory the daemon allocated
// (Client::Allocate on "cuda:0"); it writes inputs and reads results with
// cudaMemcpy, as a JAX process would. (With --device=cpu: host memory.)
//
//   --socket=S --mesh=NAME --members=N --member=I
//   --mode=ops    run psum (f32 out of place, i32 in place, a 16 MiB f32 in
//                 place), pmax (f32, i32), all_gather (f32 tiled, i32
//                 stacked) and ppermute (f32 ring, i32 to one member) and
//                 check every result exactly against values computed here
//                 from every member's inputs; also that out-of-place ops
//                 left their input alone and nothing was written past a
//                 result
//   --mode=stream stream-ordered submission (Mesh::set_stream): on a CUDA
//                 stream, a gate (a host function that holds the stream
//                 until this process opens it, after psum_async returned),
//                 then the input copied in (pinned memory, async), then psum
//                 in place submitted without synchronizing, then the result
//                 copied out on the stream; checks it after one
//                 cudaStreamSynchronize. A psum_async that waited for the
//                 stream on the host would never return before the gate
//                 gives up (20 s): that fails the check. Then 300
//                 stream-ordered pmax in a row (more than the 256 slots),
//                 checked once at the end.
//   --mode=loop   psum f32[1024] in place until an op fails; print it
//   --mode=stall  join, then never submit (a stuck-but-alive member)
//   --bytes=B     the buffer's size (default 64 MiB; ops needs about 17 MiB)
//   --device=D    where the buffer is (default cuda:0); "cpu" runs the same
//                 checks on host memory (memcpy instead of cudaMemcpy), which
//                 checks this worker and the test on a host without a GPU
//   --op-timeout-ms=T  the mesh's op timeout (0: the daemon's default)
//
// Output lines:
//   ALLOCATE_FAILED code=<CODE> msg=<message>   (exit 3)
//   READY index=<i> pid=<pid> device=<cuda:GPU-...> ordinal=<n>
//   CHECK op=<name> ok=1 | ok=0 <what differed>
//   FAILED code=<CODE> after_ms=<ms> msg=<message>   (loop mode)
//   DONE checks=<n> failed=<n>
// Exit status: 0 when every check passed (ops) or the loop saw its failure;
// 1 otherwise; 2 for bad arguments.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectived/client.h"
#include "tests/harness/flags.h"

namespace {

using collectived::Array;
using collectived::Buffer;
using collectived::Mesh;
using collectived::OpFuture;

struct Flags : ::collectived::testing::MemberFlags {
  Flags() { mode = "ops"; }
  std::string device = "cuda:0";
  int64_t bytes = int64_t{64} << 20, op_timeout_ms = 0;
};

bool Parse(int argc, char** argv, Flags& f) {
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    auto value = [&](const char* name, std::string* out) {
      return ::collectived::testing::FlagValue(arg, name, out);
    };
    std::string v;
    if (::collectived::testing::ParseMemberFlag(arg, &f) || value("device", &f.device)) {
    } else if (value("bytes", &v)) {
      f.bytes = std::atoll(v.c_str());
    } else if (value("op-timeout-ms", &v)) {
      f.op_timeout_ms = std::atoll(v.c_str());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return false;
    }
  }
  return !f.socket.empty() && !f.mesh.empty() && f.members > 0 && f.member >= 0 &&
         f.member < f.members && f.bytes > 0 &&
         (f.mode == "ops" || f.mode == "loop" || f.mode == "stall" || f.mode == "stream");
}

void Line(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// --- inputs: a function of (member, element), so that every member can
// compute what every other member contributed. All values are small
// integers or quarters: f32 sums of up to 8 of them are exact in any order.

float PsumF32(int m, int64_t j) {
  return static_cast<float>(j % 977) - 3.0f * static_cast<float>(m) + 0.25f * static_cast<float>(m + 1);
}
int32_t PsumI32(int m, int64_t j) {
  return (m + 1) * 100003 * static_cast<int32_t>(j % 13 - 6) + static_cast<int32_t>(j) - 7 * m;
}
float PmaxF32(int m, int64_t j) {
  return static_cast<float>((j * 31 + m * 17) % 101 - 50) + 0.5f * static_cast<float>(m);
}
int32_t PmaxI32(int m, int64_t j) {
  return static_cast<int32_t>((j * 7919 + int64_t{m} * 104729) % 20011) - 10000;
}
float GatherF32(int m, int64_t j) { return static_cast<float>(m * 10000 + j); }
int32_t GatherI32(int m, int64_t j) { return -(m * 100000) - static_cast<int32_t>(j) - 1; }
// The large psum: (m + 1) * r with |r| < 2047; the sum is r * N(N+1)/2.
float BigF32(int m, int64_t j) { return static_cast<float>((m + 1) * (j % 4093 - 2046)); }

template <typename T>
std::vector<T> Make(int64_t n, const std::function<T(int64_t)>& f) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = f(j);
  return v;
}

// --- device memory ----------------------------------------------------------

constexpr unsigned char kSentinel = 0xa5;
constexpr size_t kGuard = 256;  // bytes after every region that must stay kSentinel

std::string CudaError(cudaError_t err, const char* what) {
  return absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// Consecutive regions of the buffer, each followed by a guard, 256-byte
// aligned.
class Layout {
 public:
  explicit Layout(size_t capacity) : capacity_(capacity) {}
  // Offset of a new region of `bytes` bytes; nullopt when it does not fit.
  std::optional<size_t> Take(size_t bytes) {
    const size_t at = next_;
    const size_t end = at + bytes + kGuard;
    if (end > capacity_) return std::nullopt;
    next_ = (end + 255) / 256 * 256;
    return at;
  }

 private:
  size_t capacity_;
  size_t next_ = 0;
};

class Member {
 public:
  // `gpu`: the buffer is device memory (else host memory).
  Member(const Buffer& buf, bool gpu) : buf_(buf), gpu_(gpu), layout_(buf.size()) {}

  int checks() const { return checks_; }
  int failed() const { return failed_; }

  // Writes `bytes` (then a guard of kSentinel) at `offset`.
  std::string Put(size_t offset, const void* bytes, size_t size) {
    std::vector<unsigned char> host(size + kGuard, kSentinel);
    if (size > 0) std::memcpy(host.data(), bytes, size);
    if (!gpu_) {
      std::memcpy(Device(offset), host.data(), host.size());
      return "";
    }
    cudaError_t err = cudaMemcpy(Device(offset), host.data(), host.size(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) return CudaError(err, "cudaMemcpy to the device");
    // A copy from pageable memory may return before its bytes land: the
    // ordering contract wants the writes complete when the op is submitted.
    err = cudaDeviceSynchronize();
    return err == cudaSuccess ? "" : CudaError(err, "cudaDeviceSynchronize");
  }
  // Reads `size` bytes and the guard after them.
  std::string Get(size_t offset, size_t size, std::vector<unsigned char>* host) {
    host->assign(size + kGuard, 0);
    if (!gpu_) {
      std::memcpy(host->data(), Device(offset), host->size());
      return "";
    }
    cudaError_t err = cudaMemcpy(host->data(), Device(offset), host->size(), cudaMemcpyDeviceToHost);
    return err == cudaSuccess ? "" : CudaError(err, "cudaMemcpy to the host");
  }

  // Runs one op: `input` at a fresh region; out of place (`in_place`
  // false) the result goes to another fresh region, first filled with
  // kSentinel (so that zeros the op must write are seen to be written).
  // `op` gets the input and the output array (equal when in place) and
  // returns the op's status. Checks that the result is `want` element for
  // element, that nothing past it changed, and, out of place, that the input
  // is unchanged. Prints one CHECK line.
  template <typename T>
  void Check(const std::string& name, const std::vector<T>& input,
             std::vector<int64_t> in_shape, std::vector<int64_t> out_shape,
             const std::vector<T>& want, bool in_place,
             const std::function<absl::Status(const Array&, const Array&)>& op) {
    ++checks_;
    const std::string problem = RunAndCompare(input, std::move(in_shape), std::move(out_shape),
                                              want, in_place, op);
    if (problem.empty()) {
      Line(absl::StrCat("CHECK op=", name, " ok=1"));
    } else {
      ++failed_;
      Line(absl::StrCat("CHECK op=", name, " ok=0 ", problem));
    }
  }

 private:
  // The buffer's byte `offset`: a device address when gpu_.
  void* Device(size_t offset) const { return static_cast<char*>(buf_.data()) + offset; }

  template <typename T>
  std::string RunAndCompare(const std::vector<T>& input, std::vector<int64_t> in_shape,
                            std::vector<int64_t> out_shape, const std::vector<T>& want,
                            bool in_place,
                            const std::function<absl::Status(const Array&, const Array&)>& op) {
    const size_t in_bytes = input.size() * sizeof(T);
    const size_t out_bytes = want.size() * sizeof(T);
    if (in_place && in_bytes != out_bytes) return "bad test: in place with another size";
    std::optional<size_t> in_at = layout_.Take(in_bytes);
    std::optional<size_t> out_at = in_place ? in_at : layout_.Take(out_bytes);
    if (!in_at || !out_at) return absl::StrCat("bad test: buffer of ", buf_.size(), " bytes too small");
    if (std::string e = Put(*in_at, input.data(), in_bytes); !e.empty()) return e;
    if (!in_place) {
      std::vector<unsigned char> fill(out_bytes, kSentinel);
      if (std::string e = Put(*out_at, fill.data(), out_bytes); !e.empty()) return e;
    }
    const Array in = Array::Of<T>(buf_, std::move(in_shape), *in_at);
    const Array out = Array::Of<T>(buf_, std::move(out_shape), *out_at);
    absl::Status st = op(in, out);
    if (!st.ok()) return absl::StrCat("status=", st.ToString());

    std::vector<unsigned char> got;
    if (std::string e = Get(*out_at, out_bytes, &got); !e.empty()) return e;
    int64_t bad = 0, first = -1;
    T first_got{}, first_want{};
    for (size_t j = 0; j < want.size(); ++j) {
      T v;
      std::memcpy(&v, got.data() + j * sizeof(T), sizeof(T));
      if (!(v == want[j])) {
        if (bad++ == 0) {
          first = static_cast<int64_t>(j);
          first_got = v;
          first_want = want[j];
        }
      }
    }
    std::string problem;
    if (bad > 0) {
      absl::StrAppend(&problem, "wrong=", bad, "/", want.size(), " first=", first,
                      " got=", first_got, " want=", first_want, " ");
    }
    for (size_t k = 0; k < kGuard; ++k) {
      if (got[out_bytes + k] != kSentinel) {
        absl::StrAppend(&problem, "written_past_the_result_at_byte=", out_bytes + k, " ");
        break;
      }
    }
    if (!in_place) {
      std::vector<unsigned char> again;
      if (std::string e = Get(*in_at, in_bytes, &again); !e.empty()) return e;
      if (in_bytes > 0 && std::memcmp(again.data(), input.data(), in_bytes) != 0) {
        absl::StrAppend(&problem, "input_changed ");
      }
    }
    if (!problem.empty()) problem.pop_back();
    return problem;
  }

  const Buffer& buf_;
  bool gpu_;
  Layout layout_;
  int checks_ = 0, failed_ = 0;
};

int RunOps(Mesh& mesh, const Buffer& buf, bool gpu, int n, int me) {
  Member member(buf, gpu);
  constexpr int64_t kN = 1024;

  // psum f32, out of place.
  member.Check<float>(
      "psum_f32", Make<float>(kN, [&](int64_t j) { return PsumF32(me, j); }), {kN}, {kN},
      Make<float>(kN, [&](int64_t j) {
        float s = 0;
        for (int m = 0; m < n; ++m) s += PsumF32(m, j);
        return s;
      }),
      false, [&](const Array& in, const Array& out) { return mesh.psum(in, "i", out); });

  // psum i32, in place, over a [4, 256] array.
  member.Check<int32_t>(
      "psum_i32", Make<int32_t>(kN, [&](int64_t j) { return PsumI32(me, j); }), {4, 256},
      {4, 256},
      Make<int32_t>(kN, [&](int64_t j) {
        int32_t s = 0;
        for (int m = 0; m < n; ++m) s += PsumI32(m, j);
        return s;
      }),
      true, [&](const Array& in, const Array&) { return mesh.psum(in, "i"); });

  // A large psum (16 MiB per member), in place: many blocks.
  constexpr int64_t kBig = int64_t{4} << 20;
  member.Check<float>(
      "psum_f32_16MiB", Make<float>(kBig, [&](int64_t j) { return BigF32(me, j); }), {kBig},
      {kBig}, Make<float>(kBig, [&](int64_t j) {
        return static_cast<float>((j % 4093 - 2046) * n * (n + 1) / 2);
      }),
      true, [&](const Array& in, const Array&) { return mesh.psum(in, "i"); });

  // pmax f32 and i32, out of place.
  member.Check<float>(
      "pmax_f32", Make<float>(kN, [&](int64_t j) { return PmaxF32(me, j); }), {kN}, {kN},
      Make<float>(kN, [&](int64_t j) {
        float v = PmaxF32(0, j);
        for (int m = 1; m < n; ++m) v = std::max(v, PmaxF32(m, j));
        return v;
      }),
      false, [&](const Array& in, const Array& out) { return mesh.pmax(in, "i", out); });
  member.Check<int32_t>(
      "pmax_i32", Make<int32_t>(kN, [&](int64_t j) { return PmaxI32(me, j); }), {kN}, {kN},
      Make<int32_t>(kN, [&](int64_t j) {
        int32_t v = PmaxI32(0, j);
        for (int m = 1; m < n; ++m) v = std::max(v, PmaxI32(m, j));
        return v;
      }),
      false, [&](const Array& in, const Array& out) { return mesh.pmax(in, "i", out); });

  // all_gather: f32 tiled (concatenated: [n * 256]), i32 stacked ([n, 256]).
  constexpr int64_t kG = 256;
  member.Check<float>(
      "all_gather_f32_tiled", Make<float>(kG, [&](int64_t j) { return GatherF32(me, j); }),
      {kG}, {n * kG},
      Make<float>(n * kG, [&](int64_t j) { return GatherF32(static_cast<int>(j / kG), j % kG); }),
      false, [&](const Array& in, const Array& out) {
        return mesh.all_gather(in, "i", out, {.tiled = true});
      });
  member.Check<int32_t>(
      "all_gather_i32", Make<int32_t>(kG, [&](int64_t j) { return GatherI32(me, j); }), {kG},
      {n, kG},
      Make<int32_t>(n * kG,
                    [&](int64_t j) { return GatherI32(static_cast<int>(j / kG), j % kG); }),
      false, [&](const Array& in, const Array& out) { return mesh.all_gather(in, "i", out); });

  // ppermute f32 around the ring: member s sends to s + 1.
  std::vector<std::pair<int, int>> ring;
  for (int s = 0; s < n; ++s) ring.emplace_back(s, (s + 1) % n);
  const int from = (me + n - 1) % n;
  member.Check<float>(
      "ppermute_f32_ring", Make<float>(kN, [&](int64_t j) { return PsumF32(me, j); }), {kN},
      {kN}, Make<float>(kN, [&](int64_t j) { return PsumF32(from, j); }), false,
      [&](const Array& in, const Array& out) { return mesh.ppermute(in, "i", ring, out); });

  // ppermute i32, member 0 to the last one alone: the others receive zeros.
  member.Check<int32_t>(
      "ppermute_i32_one", Make<int32_t>(kN, [&](int64_t j) { return PsumI32(me, j); }), {kN},
      {kN},
      Make<int32_t>(kN, [&](int64_t j) { return me == n - 1 ? PsumI32(0, j) : int32_t{0}; }),
      false, [&](const Array& in, const Array& out) {
        return mesh.ppermute(in, "i", {{0, n - 1}}, out);
      });

  Line(absl::StrCat("DONE checks=", member.checks(), " failed=", member.failed()));
  return member.failed() == 0 ? 0 : 1;
}

// --mode=stream (see the top of the file).
int RunStream(Mesh& mesh, const Buffer& buf, int n, int me) {
  constexpr int64_t kCount = 1 << 20;  // 4 MiB of f32
  const size_t bytes = kCount * sizeof(float);
  cudaStream_t stream = nullptr;
  float* host_in = nullptr;
  float* host_out = nullptr;
  auto fail = [](const std::string& what) {
    Line(absl::StrCat("CHECK op=stream ok=0 ", what));
    Line("DONE checks=1 failed=1");
    return 1;
  };
  if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return fail(CudaError(err, "cudaStreamCreateWithFlags"));
  }
  if (cudaError_t err = cudaMallocHost(reinterpret_cast<void**>(&host_in), bytes); err != cudaSuccess) {
    return fail(CudaError(err, "cudaMallocHost"));
  }
  if (cudaError_t err = cudaMallocHost(reinterpret_cast<void**>(&host_out), bytes); err != cudaSuccess) {
    return fail(CudaError(err, "cudaMallocHost"));
  }
  for (int64_t j = 0; j < kCount; ++j) host_in[j] = PsumF32(me, j);
  if (absl::Status st = mesh.set_stream(stream); !st.ok()) {
    return fail(absl::StrCat("set_stream: ", st.ToString()));
  }
  // The input lands only after the gate opens, which is after psum_async
  // returned: a daemon that read it at submission would sum stale data, an
  // SDK that waited for the stream would wait for the gate's timeout.
  struct Gate {
    std::atomic<bool> open{false};
    std::atomic<bool> timed_out{false};
  };
  static Gate gate;
  if (cudaError_t err = cudaLaunchHostFunc(
          stream,
          [](void*) {
            const absl::Time deadline = absl::Now() + absl::Seconds(20);
            while (!gate.open.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
            if (!gate.open.load()) gate.timed_out.store(true);
          },
          nullptr);
      err != cudaSuccess) {
    return fail(CudaError(err, "cudaLaunchHostFunc"));
  }
  if (cudaError_t err =
          cudaMemcpyAsync(buf.data(), host_in, bytes, cudaMemcpyHostToDevice, stream);
      err != cudaSuccess) {
    return fail(CudaError(err, "cudaMemcpyAsync in"));
  }
  const Array x = Array::Of<float>(buf, {kCount});
  OpFuture psum = mesh.psum_async(x, "i");
  gate.open.store(true);
  if (cudaError_t err =
          cudaMemcpyAsync(host_out, buf.data(), bytes, cudaMemcpyDeviceToHost, stream);
      err != cudaSuccess) {
    return fail(CudaError(err, "cudaMemcpyAsync out"));
  }
  if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess) {
    return fail(CudaError(err, "cudaStreamSynchronize"));
  }
  if (gate.timed_out.load()) return fail("psum_async waited for the stream on the host");
  if (absl::Status st = psum.Wait(); !st.ok()) return fail(absl::StrCat("psum: ", st.ToString()));
  for (int64_t j = 0; j < kCount; ++j) {
    float want = 0;
    for (int m = 0; m < n; ++m) want += PsumF32(m, j);
    if (host_out[j] != want) {
      return fail(absl::StrCat("psum element ", j, " is ", host_out[j], ", want ", want));
    }
  }
  Line("CHECK op=stream_psum ok=1");
  // More ops than slots, none waited for on the host until the last.
  const Array small = Array::Of<float>(buf, {256});
  for (int64_t j = 0; j < 256; ++j) host_in[j] = static_cast<float>(me * 1000 + j);
  if (cudaError_t err = cudaMemcpyAsync(buf.data(), host_in, 256 * sizeof(float),
                                        cudaMemcpyHostToDevice, stream);
      err != cudaSuccess) {
    return fail(CudaError(err, "cudaMemcpyAsync in"));
  }
  OpFuture last;
  for (int k = 0; k < 300; ++k) last = mesh.pmax_async(small, "i");
  if (cudaError_t err = cudaMemcpyAsync(host_out, buf.data(), 256 * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream);
      err != cudaSuccess) {
    return fail(CudaError(err, "cudaMemcpyAsync out"));
  }
  if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess) {
    return fail(CudaError(err, "cudaStreamSynchronize"));
  }
  if (absl::Status st = last.Wait(); !st.ok()) return fail(absl::StrCat("pmax: ", st.ToString()));
  for (int64_t j = 0; j < 256; ++j) {
    const float want = static_cast<float>((n - 1) * 1000 + j);
    if (host_out[j] != want) {
      return fail(absl::StrCat("pmax element ", j, " is ", host_out[j], ", want ", want));
    }
  }
  Line("CHECK op=stream_pmax_300 ok=1");
  mesh.set_stream(nullptr).IgnoreError();
  Line("DONE checks=2 failed=0");
  return 0;
}

int Run(const Flags& f) {
  auto client = collectived::Client::Connect(
      {.socket_path = f.socket, .client_name = absl::StrCat("gpu-e2e-", f.member)});
  if (!client.ok()) {
    Line(absl::StrCat("CONNECT_FAILED ", client.status().ToString()));
    return 1;
  }
  // Allocated before joining: a member that cannot have GPU memory says so
  // and leaves the others to time out in JoinMesh, not in an op.
  const bool gpu = f.device != "cpu";
  auto buf = (*client)->Allocate(static_cast<size_t>(f.bytes), f.device);
  if (!buf.ok()) {
    Line(absl::StrCat("ALLOCATE_FAILED code=", absl::StatusCodeToString(buf.status().code()),
                      " msg=", buf.status().message()));
    return 3;
  }
  if (gpu != (absl::StartsWith(buf->device(), "cuda:GPU-") && buf->device_ordinal() >= 0)) {
    Line(absl::StrCat("WRONG_KIND_OF_BUFFER device=", buf->device(),
                      " ordinal=", buf->device_ordinal()));
    return 1;
  }
  if (cudaError_t err = gpu ? cudaSetDevice(buf->device_ordinal()) : cudaSuccess;
      err != cudaSuccess) {
    Line(absl::StrCat("CUDA_FAILED ", CudaError(err, "cudaSetDevice")));
    return 1;
  }
  auto mesh = (*client)->JoinMesh({.name = f.mesh,
                                   .axes = {{"i", f.members}},
                                   .coordinate = {f.member},
                                   .join_timeout = absl::Seconds(30),
                                   .op_timeout = absl::Milliseconds(f.op_timeout_ms)});
  if (!mesh.ok()) {
    Line(absl::StrCat("JOIN_FAILED code=", absl::StatusCodeToString(mesh.status().code()),
                      " msg=", mesh.status().message()));
    return 1;
  }
  Line(absl::StrCat("READY index=", (*mesh)->index(), " pid=", getpid(), " device=",
                    buf->device(), " ordinal=", buf->device_ordinal()));

  if (f.mode == "stall") {
    absl::SleepFor(absl::Seconds(60));
    return 0;
  }
  if (f.mode == "stream") {
    if (!gpu) {
      Line("CHECK op=stream ok=0 stream mode needs a GPU buffer");
      return 1;
    }
    return RunStream(**mesh, *buf, f.members, f.member);
  }
  if (f.mode == "loop") {
    // The buffer is zeroed: the sums stay 0.
    const Array x = Array::Of<float>(*buf, {1024});
    absl::Status failure;
    absl::Time submitted;
    while (failure.ok()) {
      submitted = absl::Now();
      failure = (*mesh)->psum(x, "i");
    }
    Line(absl::StrCat("FAILED code=", absl::StatusCodeToString(failure.code()),
                      " after_ms=", absl::ToInt64Milliseconds(absl::Now() - submitted),
                      " msg=", failure.message()));
    return 0;
  }
  return RunOps(**mesh, *buf, gpu, f.members, f.member);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, f)) {
    std::fprintf(stderr, "usage: see the comment at the top of gpu_e2e_worker.cc\n");
    return 2;
  }
  return Run(f);
}
