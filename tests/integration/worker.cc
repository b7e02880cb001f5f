// collectived_test_worker: one member process of the integration tests.
//
//   collectived_test_worker --socket=PATH --mesh=NAME --axes=x:2,y:4 --member=I
//                           --sweep=main|large|async|errors [--seed=N]
//                           [--device=cpu|cuda:N]
//
// Connects to the daemon, joins mesh NAME with coordinate = row-major unravel
// of I, and runs the sweep (tests/integration/sweep.h). For every case it
// builds the inputs of every group member deterministically, runs the op
// through the SDK, and compares this member's output bitwise with the naive
// reference model (reference.h); it also checks that the bytes around the
// output (and an out-of-place input) were left alone. One line per case:
//
//   CASE <name> OK <fnv1a-64 of the output bytes, hex>
//   CASE <name> FAIL <first mismatching element: index, expected, got | reason>
//
// then `DONE <ok> <failed>`. Exit status 0 only if every case passed. A
// failing case does not stop the sweep: the other members keep going, so the
// worker must keep submitting the same ops.
//
// --device: where the buffers live (default cpu). The worker reaches them
// only through MemberMemory (tests/harness/member_memory.h): inputs and
// sentinels are written from host copies, outputs read back into host copies
// (memcpy for host memory, cudaMemcpy for a GPU), so the sweep is the same on
// every backend. cuda:N needs a build with CUDA; without it the worker exits
// with status 2 saying so.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "collectived/client.h"
#include "tests/harness/member_memory.h"
#include "tests/integration/reference.h"
#include "tests/integration/sweep.h"

namespace collectived::integration {
namespace {

using collectived::testing::MemberMemory;

constexpr size_t kGuard = 64;  // sentinel bytes checked around every region
constexpr int kSlots = 8;      // buffers for ops outstanding at once

struct Args {
  std::string socket;
  std::string mesh_name;
  MeshSpec mesh;
  int member = -1;
  std::string sweep;
  uint64_t seed = 1;
  std::string device = "cpu";
};

// The SDK's spelling of a case's axes (sweep.h: kEveryAxis is All()).
AxisNames ToAxisNames(const std::vector<std::string>& axes) {
  return axes == kEveryAxis ? AxisNames::All() : AxisNames(axes);
}

uint8_t Sentinel(size_t pos) { return static_cast<uint8_t>(pos * 131 + 0x5b); }

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::string Hex(uint64_t h) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
  return buf;
}

// Where a case's input and output live.
struct Layout {
  DType out_dt = DType::kF32;
  Shape out_shape;
  size_t in_bytes = 0, out_bytes = 0;
  size_t in_off = 0, out_off = 0;
  bool out_in_b = false;  // output in the slot's second buffer
  size_t a_extent = 0, b_extent = 0;  // bytes of A / B the case uses (incl. guards)
};

Layout MakeLayout(const Case& c, int n, size_t index) {
  Layout l;
  if (!ResultType(c.op, c.dtype, c.shape, n, c.params, &l.out_dt, &l.out_shape)) std::abort();
  const size_t es = ElemSize(c.dtype), oes = ElemSize(l.out_dt);
  l.in_bytes = static_cast<size_t>(NumElements(c.shape)) * es;
  l.out_bytes = static_cast<size_t>(NumElements(l.out_shape)) * oes;
  const size_t k = index % 3;  // vary the offsets (always element-aligned)
  l.in_off = kGuard + es * 13 * k;
  l.a_extent = l.in_off + l.in_bytes + kGuard;
  if (c.in_place) {
    l.out_off = l.in_off;
  } else if (c.separate_output) {
    l.out_in_b = true;
    l.out_off = kGuard + oes * 5 * k;
    l.b_extent = l.out_off + l.out_bytes + kGuard;
  } else {
    l.out_off = AlignUp(l.a_extent, 64) + oes * 7 * ((k + 1) % 3);
    l.a_extent = l.out_off + l.out_bytes + kGuard;
  }
  return l;
}

class Worker {
 public:
  Worker(Args args, std::unique_ptr<MemberMemory> memory)
      : args_(std::move(args)), memory_(std::move(memory)) {}

  int Run() {
    if (!BuildSweep(args_.sweep, args_.mesh, &cases_)) {
      std::fprintf(stderr, "unknown sweep '%s'\n", args_.sweep.c_str());
      return 2;
    }
    auto client = Client::Connect({.socket_path = args_.socket,
                                   .client_name = absl::StrCat("worker-", args_.member)});
    if (!client.ok()) return Fatal("connect", client.status());
    client_ = *std::move(client);
    MeshOptions mo;
    mo.name = args_.mesh_name;
    mo.axes = args_.mesh.axes;
    mo.coordinate = args_.mesh.Coordinate(args_.member);
    mo.join_timeout = absl::Seconds(60);
    mo.op_timeout = absl::Seconds(60);
    auto mesh = client_->JoinMesh(mo);
    if (!mesh.ok()) return Fatal("join", mesh.status());
    mesh_ = *std::move(mesh);
    if (mesh_->index() != args_.member || mesh_->coordinate() != mo.coordinate ||
        mesh_->size() != args_.mesh.num_members()) {
      std::printf("FATAL mesh reports index %d size %d, expected %d of %d\n", mesh_->index(),
                  mesh_->size(), args_.member, args_.mesh.num_members());
      return 1;
    }
    if (!CheckAxisIndex()) return 1;
    if (absl::Status st = AllocateBuffers(); !st.ok()) return Fatal("allocate", st);

    size_t i = 0;
    while (i < cases_.size()) {
      if (!cases_[i].special.empty()) {
        RunSpecial(cases_[i]);
        ++i;
      } else if (cases_[i].batch >= 0) {
        size_t j = i;
        while (j < cases_.size() && cases_[j].batch == cases_[i].batch) ++j;
        RunBatch(i, j);
        i = j;
      } else {
        RunSync(i);
        ++i;
      }
    }
    std::printf("DONE %d %d\n", ok_, failed_);
    std::fflush(stdout);
    return failed_ == 0 && ok_ == static_cast<int>(cases_.size()) ? 0 : 1;
  }

 private:
  int Fatal(const char* what, const absl::Status& st) {
    std::printf("FATAL %s: %s\n", what, st.ToString().c_str());
    std::fflush(stdout);
    return 1;
  }

  // Host <-> buffer copies; a copy that fails ends the worker (the driver
  // sees the FATAL line and the exit status).
  void Put(const Buffer& b, size_t offset, const void* src, size_t bytes) {
    if (absl::Status st = memory_->Write(b, offset, src, bytes); !st.ok()) {
      std::exit(Fatal("write", st));
    }
  }
  void Put(const Buffer& b, size_t offset, const std::vector<uint8_t>& bytes) {
    Put(b, offset, bytes.data(), bytes.size());
  }
  std::vector<uint8_t> Get(const Buffer& b, size_t offset, size_t bytes) {
    absl::StatusOr<std::vector<uint8_t>> v = memory_->Read(b, offset, bytes);
    if (!v.ok()) std::exit(Fatal("read", v.status()));
    return *std::move(v);
  }
  // `bytes` sentinel bytes (as at offset 0 of a buffer).
  static std::vector<uint8_t> Sentinels(size_t bytes) {
    std::vector<uint8_t> v(bytes);
    for (size_t k = 0; k < bytes; ++k) v[k] = Sentinel(k);
    return v;
  }

  void Report(const Case& c, bool ok, const std::string& detail) {
    std::printf("CASE %s %s %s\n", c.name.c_str(), ok ? "OK" : "FAIL", detail.c_str());
    std::fflush(stdout);
    (ok ? ok_ : failed_)++;
  }

  // axis_index / axis_size of the SDK against our own group arithmetic.
  bool CheckAxisIndex() {
    std::vector<std::vector<std::string>> choices = AxisChoices(args_.mesh);
    choices.push_back({});  // the empty tuple
    choices.push_back(kEveryAxis);
    for (const auto& axes : choices) {
      Group g = GroupOf(args_.mesh, axes, args_.member);
      const AxisNames names = ToAxisNames(axes);
      if (mesh_->axis_index(names) != g.rank || mesh_->axis_size(names) != g.size) {
        std::printf("FATAL axis_index%s = %d (want %d), axis_size = %d (want %d)\n",
                    AxesString(axes).c_str(), mesh_->axis_index(names), g.rank,
                    mesh_->axis_size(names), g.size);
        return false;
      }
    }
    return true;
  }

  Group GroupFor(const Case& c) const {
    return GroupOf(args_.mesh, c.axes, args_.member, c.op == Op::kPpermute);
  }

  int SlotOf(size_t i) const {
    const Case& c = cases_[i];
    if (c.batch < 0) return 0;
    size_t first = i;
    while (first > 0 && cases_[first - 1].batch == c.batch) --first;
    return static_cast<int>(i - first) % kSlots;
  }

  absl::Status AllocateBuffers() {
    // Slot 0 also serves the error cases and their follow-up psum.
    std::vector<size_t> a(kSlots, 4096), b(kSlots, 4096);
    a[0] = b[0] = 64 * 1024;
    int slots = 1;
    for (size_t i = 0; i < cases_.size(); ++i) {
      if (!cases_[i].special.empty()) continue;
      Layout l = MakeLayout(cases_[i], GroupFor(cases_[i]).size, i);
      const int s = SlotOf(i);
      slots = std::max(slots, s + 1);
      a[s] = std::max(a[s], l.a_extent);
      b[s] = std::max(b[s], l.b_extent);
    }
    for (int s = 0; s < slots; ++s) {
      auto ba = memory_->Allocate(*client_, a[s]);
      if (!ba.ok()) return ba.status();
      auto bb = memory_->Allocate(*client_, b[s]);
      if (!bb.ok()) return bb.status();
      buf_a_.push_back(std::make_unique<Buffer>(*std::move(ba)));
      buf_b_.push_back(std::make_unique<Buffer>(*std::move(bb)));
    }
    return absl::OkStatus();
  }

  // Per-case state between submission and check.
  struct Prepared {
    size_t index = 0;
    Group group;
    Layout layout;
    std::vector<std::vector<uint8_t>> inputs;  // group members' inputs, in group order
    Buffer* a = nullptr;
    Buffer* b = nullptr;
    Array x, out;
  };

  Prepared Prepare(size_t i, int slot) {
    const Case& c = cases_[i];
    Prepared p;
    p.index = i;
    p.group = GroupFor(c);
    p.layout = MakeLayout(c, p.group.size, i);
    for (int m : p.group.members) p.inputs.push_back(MakeInput(c, args_.seed, m));
    p.a = buf_a_[slot].get();
    p.b = buf_b_[slot].get();
    std::vector<uint8_t> a = Sentinels(p.layout.a_extent);
    const std::vector<uint8_t>& mine = p.inputs[p.group.rank];
    if (!mine.empty()) std::memcpy(a.data() + p.layout.in_off, mine.data(), mine.size());
    Put(*p.a, 0, a);
    Put(*p.b, 0, Sentinels(p.layout.b_extent));
    p.x = Array{p.a, p.layout.in_off, c.dtype, c.shape};
    p.out = Array{p.layout.out_in_b ? p.b : p.a, p.layout.out_off, p.layout.out_dt,
                  p.layout.out_shape};
    return p;
  }

  OpFuture SubmitAsync(const Case& c, const Prepared& p) {
    Mesh& m = *mesh_;
    const AxisNames axes = ToAxisNames(c.axes);
    std::optional<Array> out;
    if (!c.in_place) out = p.out;
    switch (c.op) {
      case Op::kPsum: return m.psum_async(p.x, axes, out);
      case Op::kPmean: return m.pmean_async(p.x, axes, out);
      case Op::kPmax: return m.pmax_async(p.x, axes, out);
      case Op::kPmin: return m.pmin_async(p.x, axes, out);
      case Op::kAllGather:
        return m.all_gather_async(p.x, axes, p.out, {.axis = c.params.axis, .tiled = c.params.tiled});
      case Op::kPpermute: return m.ppermute_async(p.x, axes, c.params.perm, out);
      case Op::kPsumScatter:
        return m.psum_scatter_async(p.x, axes, p.out,
                                    {.scatter_dimension = c.params.axis, .tiled = c.params.tiled});
      case Op::kAllToAll:
        return m.all_to_all_async(p.x, axes,
                                  {.split_axis = c.params.axis,
                                   .concat_axis = c.params.concat_axis,
                                   .tiled = c.params.tiled},
                                  out);
      case Op::kBroadcast: return m.broadcast_async(p.x, axes, c.params.root, out);
      case Op::kBarrier: return m.barrier_async(axes);
    }
    std::abort();
  }

  absl::Status SubmitSync(const Case& c, const Prepared& p) {
    Mesh& m = *mesh_;
    const AxisNames axes = ToAxisNames(c.axes);
    std::optional<Array> out;
    if (!c.in_place) out = p.out;
    switch (c.op) {
      case Op::kPsum: return m.psum(p.x, axes, out);
      case Op::kPmean: return m.pmean(p.x, axes, out);
      case Op::kPmax: return m.pmax(p.x, axes, out);
      case Op::kPmin: return m.pmin(p.x, axes, out);
      case Op::kAllGather:
        return m.all_gather(p.x, axes, p.out, {.axis = c.params.axis, .tiled = c.params.tiled});
      case Op::kPpermute: return m.ppermute(p.x, axes, c.params.perm, out);
      case Op::kPsumScatter:
        return m.psum_scatter(p.x, axes, p.out,
                              {.scatter_dimension = c.params.axis, .tiled = c.params.tiled});
      case Op::kAllToAll:
        return m.all_to_all(p.x, axes,
                            {.split_axis = c.params.axis,
                             .concat_axis = c.params.concat_axis,
                             .tiled = c.params.tiled},
                            out);
      case Op::kBroadcast: return m.broadcast(p.x, axes, c.params.root, out);
      case Op::kBarrier: return m.barrier(axes);
    }
    std::abort();
  }

  // Checks the buffers after a successful op; reports the case.
  void Check(const Case& c, const Prepared& p, const OpFuture* future) {
    if (future != nullptr && c.op != Op::kBarrier) {
      if (future->out_shape() != p.layout.out_shape || future->out_dtype() != p.layout.out_dt) {
        Report(c, false,
               absl::StrCat("OpFuture reports ", ShortName(future->out_dtype()),
                            ShapeStr(future->out_shape()), ", expected ", ShortName(p.layout.out_dt),
                            ShapeStr(p.layout.out_shape)));
        return;
      }
    }
    std::vector<const uint8_t*> ptrs;
    for (const auto& in : p.inputs) ptrs.push_back(in.data());
    std::vector<uint8_t> expected =
        Reference(c.op, c.dtype, c.shape, c.params, ptrs, p.group.rank,
                  args_.mesh.num_members() == 1);
    const Layout& l = p.layout;
    const std::vector<uint8_t> a_now = Get(*p.a, 0, l.a_extent);
    const std::vector<uint8_t> b_now = Get(*p.b, 0, l.b_extent);
    const uint8_t* got = (l.out_in_b ? b_now : a_now).data() + l.out_off;
    if (expected.size() != l.out_bytes) std::abort();
    const size_t oes = ElemSize(l.out_dt);
    if (l.out_bytes > 0 && std::memcmp(got, expected.data(), l.out_bytes) != 0) {
      size_t e = 0;
      while (std::memcmp(got + e * oes, expected.data() + e * oes, oes) == 0) ++e;
      size_t bad = 0;
      for (size_t k = e; k < l.out_bytes / oes; ++k) {
        bad += std::memcmp(got + k * oes, expected.data() + k * oes, oes) != 0;
      }
      return Report(
          c, false,
          absl::StrCat("element ", e, " of ", l.out_bytes / oes, ": expected ",
                       ElemString(l.out_dt, expected.data() + e * oes), " got ",
                       ElemString(l.out_dt, got + e * oes), " (", bad,
                       " elements differ; group rank ", p.group.rank, " of ", p.group.size, ")"));
    }
    // Everything around the output keeps its sentinel; an out-of-place input
    // is unchanged.
    std::string damage = CheckUntouched(p, a_now, b_now);
    if (!damage.empty()) {
      Report(c, false, damage);
      return;
    }
    Report(c, true, Hex(Fnv1a(got, l.out_bytes)));
  }

  // `a_now` and `b_now`: the used extents of buffers A and B, read back.
  std::string CheckUntouched(const Prepared& p, const std::vector<uint8_t>& a_now,
                             const std::vector<uint8_t>& b_now) {
    const Layout& l = p.layout;
    auto check = [&](const Buffer* buf, const std::vector<uint8_t>& now, size_t extent,
                     const char* name) -> std::string {
      const uint8_t* d = now.data();
      for (size_t k = 0; k < extent; ++k) {
        const bool in_out = (buf == (l.out_in_b ? p.b : p.a)) && k >= l.out_off &&
                            k < l.out_off + l.out_bytes;
        if (in_out) continue;
        const bool in_in = buf == p.a && k >= l.in_off && k < l.in_off + l.in_bytes;
        const uint8_t want = in_in ? p.inputs[p.group.rank][k - l.in_off] : Sentinel(k);
        if (d[k] != want) {
          return absl::StrCat(in_in ? "input" : "guard", " byte at offset ", k, " of buffer ",
                              name, " changed: expected ", want, " got ", d[k], " (output at ",
                              l.out_off, "+", l.out_bytes, ", input at ", l.in_off, "+",
                              l.in_bytes, ")");
        }
      }
      return "";
    };
    std::string s = check(p.a, a_now, l.a_extent, "A");
    if (s.empty()) s = check(p.b, b_now, l.b_extent, "B");
    return s;
  }

  void RunSync(size_t i) {
    const Case& c = cases_[i];
    Prepared p = Prepare(i, 0);
    if (c.check_future) {
      OpFuture f = SubmitAsync(c, p);
      absl::Status st = f.Wait();
      if (!st.ok()) return Report(c, false, absl::StrCat("status ", st.ToString()));
      Check(c, p, &f);
    } else {
      absl::Status st = SubmitSync(c, p);
      if (!st.ok()) return Report(c, false, absl::StrCat("status ", st.ToString()));
      Check(c, p, nullptr);
    }
  }

  // Submits cases [begin, end) at once, then waits for them (in reverse
  // order for odd batches) and checks each.
  void RunBatch(size_t begin, size_t end) {
    std::vector<Prepared> prepared;
    std::vector<OpFuture> futures;
    for (size_t i = begin; i < end; ++i) prepared.push_back(Prepare(i, static_cast<int>(i - begin)));
    for (size_t k = 0; k < prepared.size(); ++k) {
      futures.push_back(SubmitAsync(cases_[begin + k], prepared[k]));
    }
    const bool reverse = cases_[begin].batch % 2 == 1;
    std::vector<absl::Status> status(prepared.size());
    for (size_t w = 0; w < prepared.size(); ++w) {
      const size_t k = reverse ? prepared.size() - 1 - w : w;
      status[k] = futures[k].Wait();
    }
    for (size_t k = 0; k < prepared.size(); ++k) {
      const Case& c = cases_[begin + k];
      if (!status[k].ok()) {
        Report(c, false, absl::StrCat("status ", status[k].ToString()));
        continue;
      }
      // Ops of one mesh get consecutive sequence numbers in submission order.
      if (futures[k].sequence() != futures[0].sequence() + static_cast<int64_t>(k)) {
        Report(c, false, absl::StrCat("sequence ", futures[k].sequence(), ", expected ",
                                      futures[0].sequence() + static_cast<int64_t>(k)));
        continue;
      }
      Check(c, prepared[k], &futures[k]);
    }
  }

  // ---------------------------------------------------------------------
  // Error paths. Every special case submits an invalid op (on every member
  // unless said otherwise), checks the error code and that the buffers are
  // unchanged, then runs a valid psum over every axis and checks its result:
  // a rejected op must change nothing. The reported hash covers the psum's
  // output and its sequence number, which must agree across the mesh.

  void RunSpecial(const Case& c) {
    const int n = args_.mesh.num_members();
    const std::string axis0 = args_.mesh.axes[0].first;
    const int n0 = args_.mesh.axes[0].second;
    Buffer& e = *buf_a_[0];
    Buffer& e2 = *buf_b_[0];
    const size_t size = e.size();
    Put(e, 0, Sentinels(size));
    Put(e2, 0, Sentinels(e2.size()));

    const std::string& s = c.special;
    const AxisNames all = AxisNames::All();
    absl::StatusCode want = absl::StatusCode::kInvalidArgument;
    absl::Status st;
    auto f32 = [&](Shape shape, size_t off = 0, Buffer* b = nullptr) {
      return Array{b ? b : &e, off, DType::kF32, std::move(shape)};
    };
    if (s == "empty_tuple") {
      return FollowUp(c, EmptyTuple());
    } else if (s == "err.inplace_psum_bool") {
      st = mesh_->psum(Array{&e, 0, DType::kBool, {7}}, all);  // result is int32[7]
    } else if (s == "err.inplace_pmean_i8") {
      st = mesh_->pmean(Array{&e, 0, DType::kI8, {7}}, all);  // result is float32[7]
    } else if (s == "err.all_gather_output_is_input") {
      // The closest the SDK gets to an all_gather "in place": the output
      // region starts at the input but is n times larger.
      st = mesh_->all_gather(f32({7}), all, f32({n, 7}));
    } else if (s == "err.output_out_of_range") {
      want = absl::StatusCode::kOutOfRange;
      st = mesh_->psum(f32({8}), all, f32({8}, size - 16));
    } else if (s == "err.output_offset_past_end") {
      want = absl::StatusCode::kOutOfRange;
      st = mesh_->psum(f32({8}), all, f32({8}, size + 64));
    } else if (s == "err.input_out_of_range") {
      want = absl::StatusCode::kOutOfRange;
      st = mesh_->psum(f32({static_cast<int64_t>(size / 4) + 1}), all, f32({8}, 0, &e2));
    } else if (s == "err.unknown_axis") {
      st = mesh_->psum(f32({7}), "no_such_axis");
    } else if (s == "err.axis_named_twice") {
      st = mesh_->psum(f32({7}), {axis0, axis0});
    } else if (s == "err.psum_scatter_bool") {
      st = mesh_->psum_scatter(Array{&e, 0, DType::kBool, {n}}, all, Array{&e2, 0, DType::kBool, {}});
    } else if (s == "err.all_gather_axis_out_of_range") {
      st = mesh_->all_gather(f32({7}), all, f32({7, n}, 0, &e2), {.axis = 2});
    } else if (s == "err.ppermute_dest_twice") {
      st = mesh_->ppermute(f32({7}), axis0, {{0, 0}, {1, 0}});
    } else if (s == "err.broadcast_root_range") {
      st = mesh_->broadcast(f32({7}), axis0, n0);
    } else if (s == "err.misaligned_offset") {
      st = mesh_->psum(f32({4}, 2), all);
    } else if (s == "err.psum_scatter_wrong_dim") {
      st = mesh_->psum_scatter(f32({n + 1}), all, f32({}, 0, &e2));
    } else if (s == "err.all_to_all_not_divisible") {
      st = mesh_->all_to_all(f32({n + 1}), all, {.tiled = true});
    } else if (s == "err.partial_overlap") {
      st = mesh_->psum(f32({16}), all, f32({16}, 32));
    } else if (s == "err.shape_overflow") {
      // f32[0, 2^62] gathered along its second dimension: the input is empty,
      // the result's second dimension would overflow int64.
      st = mesh_->all_gather(Array{&e, 0, DType::kF32, {0, int64_t{1} << 62}}, axis0,
                             f32({0}, 0, &e2), {.axis = 1, .tiled = true});
    } else if (s == "err.output_shorter_than_result") {
      // The declared output f32[4] is shorter than the result f32[8]; the
      // buffer has room after it, which must stay untouched.
      st = mesh_->psum(f32({8}), axis0, f32({4}, 64, &e2));
    } else if (s == "err.output_shape_negative") {
      st = mesh_->all_gather(f32({7}), axis0, f32({-1, 7}, 0, &e2));
    } else if (s == "err.freed_buffer") {
      want = absl::StatusCode::kNotFound;
      auto freed = memory_->Allocate(*client_, 4096);
      if (!freed.ok()) return Report(c, false, "allocate: " + freed.status().ToString());
      if (absl::Status fs = client_->Free(*freed); !fs.ok()) {
        return Report(c, false, "free: " + fs.ToString());
      }
      st = mesh_->psum(Array{&*freed, 0, DType::kF32, {7}}, all);
    } else if (s == "err.member0_only") {
      // Only member 0 submits (three invalid ops); the others go straight to
      // the psum, which must still match member 0's.
      if (args_.member == 0) {
        absl::Status s1 = mesh_->psum(f32({7}), "no_such_axis");
        absl::Status s2 = mesh_->psum(f32({8}), all, f32({8}, size - 16));
        absl::Status s3 = mesh_->psum(Array{&e, 0, DType::kBool, {7}}, all);
        if (s1.code() != absl::StatusCode::kInvalidArgument ||
            s2.code() != absl::StatusCode::kOutOfRange ||
            s3.code() != absl::StatusCode::kInvalidArgument) {
          return FollowUp(c, absl::StrCat("member 0's invalid ops returned ", s1.ToString(), " / ",
                                          s2.ToString(), " / ", s3.ToString()));
        }
      }
      return FollowUp(c, "");
    } else if (s == "err.mismatched_ops") {
      // Every member submits, but member 0 a different op: all fail with
      // FAILED_PRECONDITION and nothing is written.
      want = absl::StatusCode::kFailedPrecondition;
      st = args_.member == 0 ? mesh_->pmax(f32({7}), all, f32({7}, 0, &e2))
                             : mesh_->psum(f32({7}), all, f32({7}, 0, &e2));
    } else {
      return Report(c, false, "unknown special case");
    }
    std::string problem;
    if (st.code() != want) {
      problem = absl::StrCat("expected ", absl::StatusCodeToString(want), ", got ", st.ToString());
    } else {
      const std::vector<uint8_t> d = Get(e, 0, size);
      const std::vector<uint8_t> d2 = Get(e2, 0, e2.size());
      for (size_t k = 0; k < size && problem.empty(); ++k) {
        if (d[k] != Sentinel(k)) problem = absl::StrCat("rejected op changed buffer byte ", k);
      }
      for (size_t k = 0; k < e2.size() && problem.empty(); ++k) {
        if (d2[k] != Sentinel(k)) problem = absl::StrCat("rejected op changed output byte ", k);
      }
    }
    FollowUp(c, problem);
  }

  // Collectives over the empty tuple, JAX's axis_name=(): no axes, so every
  // member is a group of one, as in JAX: psum, pmean, all_gather and
  // psum_scatter give the input unchanged (no inserted or scattered
  // dimension), all_to_all sees a group of size 1, axis_index is 0 and
  // axis_size 1; AxisNames::All() is every axis. The inputs are finite and
  // non-zero, whose bits a sum over one member keeps. Returns a problem, or "".
  std::string EmptyTuple() {
    const AxisNames none = AxisNames::None();  // ()
    if (mesh_->axis_index(none) != 0 || mesh_->axis_size(none) != 1) {
      return absl::StrCat("axis_index(()) = ", mesh_->axis_index(none), ", axis_size(()) = ",
                          mesh_->axis_size(none), "; want 0 and 1");
    }
    if (mesh_->axis_index(AxisNames::All()) != args_.member ||
        mesh_->axis_size(AxisNames::All()) != args_.mesh.num_members()) {
      return absl::StrCat("axis_index(All()) = ", mesh_->axis_index(AxisNames::All()),
                          ", axis_size(All()) = ", mesh_->axis_size(AxisNames::All()),
                          "; want ", args_.member, " and ", args_.mesh.num_members());
    }
    Buffer& a = *buf_a_[0];
    Buffer& b = *buf_b_[0];
    std::vector<float> mine(6);
    for (size_t k = 0; k < mine.size(); ++k) mine[k] = 1.5f * static_cast<float>(k + 1) + args_.member;
    const size_t bytes = mine.size() * sizeof(float);
    // The result, in buffer `where` at offset 0, must be the input.
    auto expect = [&](const OpFuture& f, const char* what, const Shape& shape, const Buffer& where)
        -> std::string {
      if (absl::Status st = f.Wait(); !st.ok()) return absl::StrCat(what, ": ", st.ToString());
      if (f.out_shape() != shape || f.out_dtype() != DType::kF32) {
        return absl::StrCat(what, ": result ", ShortName(f.out_dtype()), ShapeStr(f.out_shape()),
                            ", want f32", ShapeStr(shape));
      }
      std::vector<float> got(mine.size());
      if (absl::Status st = memory_->Read(where, 0, got.data(), bytes); !st.ok()) {
        return absl::StrCat(what, ": reading the result: ", st.ToString());
      }
      for (size_t k = 0; k < mine.size(); ++k) {
        if (got[k] != mine[k]) {
          return absl::StrCat(what, ": element ", k, " is ", got[k], ", want ", mine[k],
                              " (the input)");
        }
      }
      return "";
    };
    auto fill = [&] {
      Put(a, 0, mine.data(), bytes);
      Put(b, 0, std::vector<uint8_t>(bytes));
    };
    std::string problem;
    fill();
    problem = expect(mesh_->psum_async(Array::Of<float>(a, {6}), none), "psum over ()", {6}, a);
    if (!problem.empty()) return problem;
    fill();
    problem = expect(mesh_->pmean_async(Array::Of<float>(a, {6}), none, Array::Of<float>(b, {6})),
                     "pmean over ()", {6}, b);
    if (!problem.empty()) return problem;
    fill();
    problem = expect(mesh_->all_gather_async(Array::Of<float>(a, {2, 3}), none,
                                             Array::Of<float>(b, {2, 3}), {.axis = 1}),
                     "all_gather over ()", {2, 3}, b);
    if (!problem.empty()) return problem;
    fill();
    problem = expect(mesh_->psum_scatter_async(Array::Of<float>(a, {6}), none,
                                               Array::Of<float>(b, {6})),
                     "psum_scatter over ()", {6}, b);
    if (!problem.empty()) return problem;
    fill();
    problem = expect(mesh_->all_to_all_async(Array::Of<float>(a, {1, 6}), none,
                                             {.split_axis = 0, .concat_axis = 1},
                                             Array::Of<float>(b, {6, 1})),
                     "all_to_all over ()", {6, 1}, b);
    if (!problem.empty()) return problem;
    fill();
    problem = expect(mesh_->ppermute_async(Array::Of<float>(a, {6}), none, {{0, 0}},
                                           Array::Of<float>(b, {6})),
                     "ppermute over ()", {6}, b);
    if (!problem.empty()) return problem;
    if (absl::Status st = mesh_->barrier(none); !st.ok()) return "barrier(()): " + st.ToString();
    // Parameters are checked against the group of one.
    if (absl::Status st = mesh_->broadcast(Array::Of<float>(a, {6}), none, 1);
        st.code() != absl::StatusCode::kInvalidArgument) {
      return "broadcast over () with root 1: " + st.ToString() + ", want INVALID_ARGUMENT";
    }
    return "";
  }

  // A valid psum over every axis after an error case; reports the case.
  void FollowUp(const Case& c, const std::string& problem) {
    Case f;
    f.name = c.name + ".followup";
    f.op = Op::kPsum;
    // int32 (wrapping sums): independent of the float reduction semantics,
    // which the main sweep covers.
    f.dtype = DType::kI32;
    f.shape = {1031};
    f.input = InputKind::kArith;
    Prepared p;
    p.group = GroupOf(args_.mesh, kEveryAxis, args_.member);
    p.layout = MakeLayout(f, p.group.size, 1);
    for (int m : p.group.members) p.inputs.push_back(MakeInput(f, args_.seed, m));
    p.a = buf_a_[0].get();
    p.b = buf_b_[0].get();
    std::vector<uint8_t> a = Sentinels(p.layout.a_extent);
    const auto& mine = p.inputs[p.group.rank];
    std::memcpy(a.data() + p.layout.in_off, mine.data(), mine.size());
    Put(*p.a, 0, a);
    p.x = Array{p.a, p.layout.in_off, f.dtype, f.shape};
    p.out = Array{p.a, p.layout.out_off, p.layout.out_dt, p.layout.out_shape};
    OpFuture fut = mesh_->psum_async(p.x, AxisNames::All(), p.out);
    absl::Status st = fut.Wait();
    if (!problem.empty()) return Report(c, false, problem);
    if (!st.ok()) return Report(c, false, "the valid psum after the error failed: " + st.ToString());
    std::vector<const uint8_t*> ptrs;
    for (const auto& in : p.inputs) ptrs.push_back(in.data());
    std::vector<uint8_t> expected = Reference(Op::kPsum, f.dtype, f.shape, {}, ptrs, p.group.rank,
                                              args_.mesh.num_members() == 1);
    const std::vector<uint8_t> a_now = Get(*p.a, 0, p.layout.a_extent);
    const uint8_t* got = a_now.data() + p.layout.out_off;
    if (std::memcmp(got, expected.data(), expected.size()) != 0) {
      size_t e = 0;
      while (std::memcmp(got + 4 * e, expected.data() + 4 * e, 4) == 0) ++e;
      return Report(c, false,
                    absl::StrCat("the valid psum after the error gave a wrong result: element ", e,
                                 " expected ", ElemString(DType::kI32, expected.data() + 4 * e),
                                 " got ", ElemString(DType::kI32, got + 4 * e)));
    }
    std::string damage = CheckUntouched(p, a_now, {});
    if (!damage.empty()) return Report(c, false, "the valid psum after the error: " + damage);
    const int64_t seq = fut.sequence();
    uint64_t h = Fnv1a(got, expected.size());
    h = Fnv1a(reinterpret_cast<const uint8_t*>(&seq), sizeof(seq), h);
    Report(c, true, Hex(h));
  }

  Args args_;
  std::unique_ptr<MemberMemory> memory_;
  std::vector<Case> cases_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Mesh> mesh_;
  std::vector<std::unique_ptr<Buffer>> buf_a_, buf_b_;
  int ok_ = 0, failed_ = 0;
};

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t len = std::strlen(flag);
      return a.compare(0, len, flag) == 0 ? a.c_str() + len : nullptr;
    };
    if (const char* v = value("--socket=")) {
      args->socket = v;
    } else if (const char* v = value("--mesh=")) {
      args->mesh_name = v;
    } else if (const char* v = value("--axes=")) {
      if (!ParseMeshSpec(v, &args->mesh)) return false;
    } else if (const char* v = value("--member=")) {
      args->member = std::atoi(v);
    } else if (const char* v = value("--sweep=")) {
      args->sweep = v;
    } else if (const char* v = value("--seed=")) {
      args->seed = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("--device=")) {
      args->device = v;
    } else {
      return false;
    }
  }
  return !args->mesh_name.empty() && !args->mesh.axes.empty() && args->member >= 0 &&
         args->member < args->mesh.num_members() && !args->sweep.empty();
}

}  // namespace
}  // namespace collectived::integration

int main(int argc, char** argv) {
  collectived::integration::Args args;
  if (!collectived::integration::ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: %s --socket=PATH --mesh=NAME --axes=x:2,y:4 --member=I "
                 "--sweep=main|large|async|errors [--seed=N] [--device=cpu|cuda:N]\n",
                 argv[0]);
    return 2;
  }
  auto memory = collectived::testing::MemberMemory::ForDevice(args.device);
  if (!memory.ok()) {
    std::printf("FATAL device: %s\n", memory.status().ToString().c_str());
    return 2;
  }
  return collectived::integration::Worker(std::move(args), *std::move(memory)).Run();
}
