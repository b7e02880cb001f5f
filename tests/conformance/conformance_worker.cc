// collectived_conformance_worker: one member process of the JAX conformance
// test. It runs every case of tests/conformance/data/vectors.json whose mesh is
// --mesh through the SDK and compares each result bit-exactly with what JAX
// produced.
//
//   collectived_conformance_worker --socket=S --vectors=PATH --mesh=x:2,y:4 --member=I
//       [--window=N] [--filter=SUBSTRING] [--op_timeout_ms=MS] [--device=cpu|cuda:N]
//
// Start one process per member (I = 0 .. members-1, the row-major index of
// the member's mesh coordinate). All members must pass the same --mesh,
// --filter and --vectors: they run the same list of cases in file order, so
// the n-th op of every member is the same case.
//
// Each case reads its input from one region of a shared buffer and writes its
// result to a separate region that is filled with 0xA5 beforehand (so an op
// that leaves bytes unwritten fails), followed by 64 guard bytes (so an op
// that writes past its output fails); the input must come back unchanged.
// Up to --window ops (default 8) are in flight at once (the *_async SDK
// calls; ops of a mesh run in submission order), each in its own region;
// --window=1 runs them one at a time.
//
// --device: where the buffer lives (default cpu). Inputs and poison go in
// and results come out through MemberMemory (tests/harness/member_memory.h):
// memcpy for host memory, cudaMemcpy for a GPU; the checks run on host
// copies. cuda:N needs a build with CUDA (else exit status 2, saying so).
//
// Output: one line per case, `CASE <name> OK` or `CASE <name> FAIL <detail>`,
// then `SUMMARY ...`. Exit status 0 only if every case passed; 1 if any failed;
// 2 for usage or set-up errors.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectived/client.h"
#include "collectived/dtype.h"
#include "tests/conformance/vectors.h"
#include "tests/harness/member_memory.h"

namespace {

using collectived::Array;
using collectived::AxisNames;
using collectived::DType;
using collectived::OpFuture;
using collectived::conformance::Case;
using collectived::conformance::MeshLayout;
using collectived::testing::MemberMemory;

constexpr unsigned char kPoison = 0xA5;  // fills output regions and guards before each op
constexpr size_t kAlign = 64;
constexpr size_t kGuard = 64;  // poison bytes after each output region

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string Hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  // Little-endian element: print most significant byte first.
  for (size_t i = n; i-- > 0;) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

// "0x3f800000 (1)": the element's bits and its value.
std::string Describe(DType dt, const unsigned char* p) {
  const size_t size = collectived::DTypeSize(dt);
  std::string value;
  char buf[64];
  switch (dt) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
      value = buf;
      break;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      std::snprintf(buf, sizeof(buf), "%.17g", v);
      value = buf;
      break;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      float v = dt == DType::kF16 ? collectived::HalfToFloat(bits) : collectived::BF16ToFloat(bits);
      std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(v));
      value = buf;
      break;
    }
    case DType::kI8: value = absl::StrCat(static_cast<int8_t>(p[0])); break;
    case DType::kU8: value = absl::StrCat(p[0]); break;
    case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); value = absl::StrCat(v); break; }
    case DType::kU32: { uint32_t v; std::memcpy(&v, p, 4); value = absl::StrCat(v); break; }
    case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); value = absl::StrCat(v); break; }
    case DType::kU64: { uint64_t v; std::memcpy(&v, p, 8); value = absl::StrCat(v); break; }
    case DType::kBool: value = p[0] == 0 ? "false" : p[0] == 1 ? "true" : "invalid-bool"; break;
    case DType::kF8E4M3FN:
    case DType::kF8E5M2: {
      const float v = dt == DType::kF8E4M3FN ? collectived::F8E4M3FNToFloat(p[0])
                                             : collectived::F8E5M2ToFloat(p[0]);
      std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(v));
      value = buf;
      break;
    }
    default: value = "?"; break;
  }
  return absl::StrCat(Hex(p, size), " (", value, ")");
}

// Multi-index of the row-major flat element `flat` in `shape`: "[1,0,2]".
std::string Unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return "[]";
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  return absl::StrCat("[", absl::StrJoin(idx, ","), "]");
}

// Empty if `got` equals `want` bytewise; otherwise where and how they differ.
std::string CompareBytes(DType dt, const std::vector<int64_t>& shape, const unsigned char* got,
                         const std::string& want) {
  const size_t size = collectived::DTypeSize(dt);
  const auto* w = reinterpret_cast<const unsigned char*>(want.data());
  const size_t n = want.size() / size;
  size_t first = n, differing = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i * size, w + i * size, size) != 0) {
      if (first == n) first = i;
      ++differing;
    }
  }
  if (differing == 0) return "";
  return absl::StrCat("element ", first, " ", Unravel(static_cast<int64_t>(first), shape),
                      ": expected ", Describe(dt, w + first * size), " got ",
                      Describe(dt, got + first * size), " (", differing, " of ", n,
                      " elements differ)");
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

struct Slot {
  size_t in_offset = 0;
  size_t out_offset = 0;
};

struct InFlight {
  const Case* c = nullptr;
  OpFuture future;
  Slot slot;
  std::string submit_error;  // set when the op could not be submitted
};

struct Options {
  std::string socket;
  std::string vectors;
  std::string mesh;
  int member = -1;
  int window = 8;
  std::string filter;
  int64_t op_timeout_ms = 30000;
  std::string device = "cpu";
};

int Usage(const char* argv0, const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: %s --socket=S --vectors=PATH --mesh=x:2,y:4 --member=I "
               "[--window=N] [--filter=SUBSTRING] [--op_timeout_ms=MS] [--device=cpu|cuda:N]\n",
               why.c_str(), argv0);
  return 2;
}

class Worker {
 public:
  Worker(const Options& opt, const MemberMemory& memory, collectived::Mesh& mesh,
         collectived::Buffer& buffer, size_t slot_bytes, size_t in_region)
      : opt_(opt),
        memory_(memory),
        mesh_(mesh),
        buf_(buffer),
        slot_bytes_(slot_bytes),
        in_region_(in_region) {}

  // Runs `cases` in order with at most opt.window ops in flight.
  void Run(const std::vector<const Case*>& cases) {
    std::deque<InFlight> inflight;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (static_cast<int>(inflight.size()) >= opt_.window) {
        Finish(inflight.front());
        inflight.pop_front();
      }
      Slot slot;
      slot.in_offset = (i % static_cast<size_t>(opt_.window)) * slot_bytes_;
      slot.out_offset = slot.in_offset + in_region_;
      inflight.push_back(Submit(*cases[i], slot));
    }
    while (!inflight.empty()) {
      Finish(inflight.front());
      inflight.pop_front();
    }
  }

  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  InFlight Submit(const Case& c, Slot slot) {
    InFlight f;
    f.c = &c;
    f.slot = slot;
    const int me = opt_.member;
    std::optional<DType> dt = collectived::DTypeFromName(c.dtype);
    std::optional<DType> out_dt = collectived::DTypeFromName(c.out_dtype);
    if (!dt || !out_dt) {
      f.submit_error = absl::StrCat("unknown dtype '", c.dtype, "' or out_dtype '", c.out_dtype, "'");
      return f;
    }
    const std::string& input = c.inputs[me];
    const std::string& want = c.outputs[me];
    absl::Status st = memory_.Write(buf_, slot.in_offset, input.data(), input.size());
    if (st.ok()) {
      const std::vector<unsigned char> poison(want.size() + kGuard, kPoison);
      st = memory_.Write(buf_, slot.out_offset, poison.data(), poison.size());
    }
    if (!st.ok()) {
      f.submit_error = absl::StrCat("writing the input: ", st.ToString());
      return f;
    }

    Array x{&buf_, slot.in_offset, *dt, c.shape};
    Array out{&buf_, slot.out_offset, *out_dt, c.out_shape};
    AxisNames axes(c.axes);
    if (c.op == "psum") {
      f.future = mesh_.psum_async(x, axes, out);
    } else if (c.op == "pmean") {
      f.future = mesh_.pmean_async(x, axes, out);
    } else if (c.op == "pmax") {
      f.future = mesh_.pmax_async(x, axes, out);
    } else if (c.op == "pmin") {
      f.future = mesh_.pmin_async(x, axes, out);
    } else if (c.op == "all_gather") {
      f.future = mesh_.all_gather_async(x, axes, out, {.axis = c.axis, .tiled = c.tiled});
    } else if (c.op == "ppermute") {
      f.future = mesh_.ppermute_async(x, axes, c.perm, out);
    } else if (c.op == "psum_scatter") {
      f.future = mesh_.psum_scatter_async(
          x, axes, out, {.scatter_dimension = c.scatter_dimension, .tiled = c.tiled});
    } else if (c.op == "all_to_all") {
      f.future = mesh_.all_to_all_async(
          x, axes, {.split_axis = c.split_axis, .concat_axis = c.concat_axis, .tiled = c.tiled},
          out);
    } else {
      f.submit_error = absl::StrCat("unknown op '", c.op, "'");
    }
    return f;
  }

  void Finish(InFlight& f) {
    const Case& c = *f.c;
    std::string detail = f.submit_error;
    if (detail.empty()) detail = Check(f);
    if (detail.empty()) {
      ++passed_;
      std::printf("CASE %s OK\n", c.name.c_str());
    } else {
      ++failed_;
      std::printf("CASE %s FAIL %s\n", c.name.c_str(), detail.c_str());
    }
    std::fflush(stdout);
  }

  // Empty when the case passed.
  std::string Check(const InFlight& f) {
    const Case& c = *f.c;
    const int me = opt_.member;
    absl::Status st = f.future.Wait();
    if (!st.ok()) return absl::StrCat("op failed: ", st.ToString());
    std::vector<std::string> problems;
    const std::string got_dtype(collectived::DTypeName(f.future.out_dtype()));
    if (got_dtype != c.out_dtype) {
      problems.push_back(absl::StrCat("out_dtype: expected ", c.out_dtype, " got ", got_dtype));
    }
    if (f.future.out_shape() != c.out_shape) {
      problems.push_back(absl::StrCat("out_shape: expected ", ShapeStr(c.out_shape), " got ",
                                      ShapeStr(f.future.out_shape())));
    }
    const DType out_dt = *collectived::DTypeFromName(c.out_dtype);
    const std::string& want = c.outputs[me];
    const std::string& input = c.inputs[me];
    // Host copies of the output with its guard and of the input.
    std::vector<unsigned char> out(want.size() + kGuard), in(input.size());
    st = memory_.Read(buf_, f.slot.out_offset, out.data(), out.size());
    if (st.ok()) st = memory_.Read(buf_, f.slot.in_offset, in.data(), in.size());
    if (!st.ok()) return absl::StrCat("reading the result: ", st.ToString());
    std::string diff = CompareBytes(out_dt, c.out_shape, out.data(), want);
    if (!diff.empty()) problems.push_back(absl::StrCat("output ", diff));
    for (size_t i = 0; i < kGuard; ++i) {
      if (out[want.size() + i] != kPoison) {
        problems.push_back(absl::StrCat("wrote past the end of the output (byte ", i,
                                        " after its ", want.size(), " bytes)"));
        break;
      }
    }
    if (!input.empty() && std::memcmp(in.data(), input.data(), input.size()) != 0) {
      const DType in_dt = *collectived::DTypeFromName(c.dtype);
      problems.push_back(absl::StrCat(
          "input modified: ", CompareBytes(in_dt, c.shape, in.data(), input)));
    }
    return absl::StrJoin(problems, "; ");
  }

  const Options& opt_;
  const MemberMemory& memory_;
  collectived::Mesh& mesh_;
  collectived::Buffer& buf_;
  size_t slot_bytes_;
  size_t in_region_;
  int passed_ = 0;
  int failed_ = 0;
};

int Main(int argc, char** argv) {
  Options opt;
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      std::string prefix = absl::StrCat(flag, "=");
      if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
      return std::nullopt;
    };
    if (auto v = value("--socket")) opt.socket = *v;
    else if (auto v = value("--vectors")) opt.vectors = *v;
    else if (auto v = value("--mesh")) opt.mesh = *v;
    else if (auto v = value("--member")) opt.member = std::atoi(v->c_str());
    else if (auto v = value("--window")) opt.window = std::atoi(v->c_str());
    else if (auto v = value("--filter")) opt.filter = *v;
    else if (auto v = value("--op_timeout_ms")) opt.op_timeout_ms = std::atoll(v->c_str());
    else if (auto v = value("--device")) opt.device = *v;
    else return Usage(argv[0], absl::StrCat("unknown argument ", arg));
  }
  if (opt.vectors.empty() || opt.mesh.empty()) return Usage(argv[0], "--vectors and --mesh are required");
  if (opt.window < 1) return Usage(argv[0], "--window must be >= 1");
  auto layout = collectived::conformance::ParseLayout(opt.mesh);
  if (!layout.ok()) return Usage(argv[0], layout.status().ToString());
  const int members = collectived::conformance::NumMembers(*layout);
  if (opt.member < 0 || opt.member >= members) {
    return Usage(argv[0], absl::StrCat("--member must be in 0..", members - 1));
  }

  auto memory = MemberMemory::ForDevice(opt.device);
  if (!memory.ok()) {
    std::fprintf(stderr, "device: %s\n", memory.status().ToString().c_str());
    return 2;
  }

  auto vectors = collectived::conformance::LoadVectors(opt.vectors);
  if (!vectors.ok()) {
    std::fprintf(stderr, "loading vectors: %s\n", vectors.status().ToString().c_str());
    return 2;
  }
  std::vector<const Case*> cases;
  size_t max_in = 0, max_out = 0;
  for (const Case& c : vectors->cases) {
    if (c.mesh != *layout) continue;
    if (!opt.filter.empty() && c.name.find(opt.filter) == std::string::npos) continue;
    cases.push_back(&c);
    max_in = std::max(max_in, c.inputs[opt.member].size());
    max_out = std::max(max_out, c.outputs[opt.member].size());
  }

  // Row-major unravel of the member index.
  std::vector<int> coordinate(layout->size());
  for (int i = static_cast<int>(layout->size()) - 1, rest = opt.member; i >= 0; --i) {
    coordinate[i] = rest % (*layout)[i].second;
    rest /= (*layout)[i].second;
  }
  std::printf("WORKER member=%d coordinate=[%s] mesh=%s device=%s cases=%zu generator=%s\n",
              opt.member, absl::StrJoin(coordinate, ",").c_str(), opt.mesh.c_str(),
              opt.device.c_str(), cases.size(), vectors->generator.c_str());
  std::fflush(stdout);

  auto client = collectived::Client::Connect(
      {.socket_path = opt.socket,
       .client_name = absl::StrCat("conformance-", collectived::conformance::LayoutTag(*layout),
                                   "-", opt.member)});
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 2;
  }
  auto mesh = (*client)->JoinMesh(
      {.name = absl::StrCat("conformance-", collectived::conformance::LayoutTag(*layout)),
       .axes = *layout,
       .coordinate = coordinate,
       .join_timeout = absl::Seconds(60),
       .op_timeout = absl::Milliseconds(opt.op_timeout_ms)});
  if (!mesh.ok()) {
    std::fprintf(stderr, "join mesh: %s\n", mesh.status().ToString().c_str());
    return 2;
  }
  if ((*mesh)->coordinate() != coordinate || (*mesh)->index() != opt.member) {
    std::fprintf(stderr, "joined at coordinate [%s] index %d, asked for [%s] index %d\n",
                 absl::StrJoin((*mesh)->coordinate(), ",").c_str(), (*mesh)->index(),
                 absl::StrJoin(coordinate, ",").c_str(), opt.member);
    return 2;
  }

  const size_t in_region = AlignUp(std::max<size_t>(max_in, 1));
  const size_t slot_bytes = in_region + AlignUp(max_out + kGuard);
  auto buffer = (*memory)->Allocate(**client, slot_bytes * static_cast<size_t>(opt.window));
  if (!buffer.ok()) {
    std::fprintf(stderr, "allocate: %s\n", buffer.status().ToString().c_str());
    return 2;
  }

  Worker worker(opt, **memory, **mesh, *buffer, slot_bytes, in_region);
  worker.Run(cases);
  std::printf("SUMMARY member=%d mesh=%s passed=%d failed=%d\n", opt.member, opt.mesh.c_str(),
              worker.passed(), worker.failed());
  std::fflush(stdout);
  // Leave only after every member finished its ops: Leave breaks the mesh for
  // the others, which may still wait on results of the last cases.
  absl::Status st = (*mesh)->barrier();
  if (!st.ok()) std::fprintf(stderr, "final barrier: %s\n", st.ToString().c_str());
  return worker.failed() == 0 && st.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
