#include "tests/integration/sweep.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

namespace collectived::integration {
namespace {

constexpr DType kAllDTypes[] = {DType::kF32,      DType::kF64,     DType::kF16, DType::kBF16,
                                DType::kI8,       DType::kU8,      DType::kI32, DType::kU32,
                                DType::kI64,      DType::kU64,     DType::kBool,
                                DType::kF8E4M3FN, DType::kF8E5M2};

uint64_t Mix(uint64_t z) {  // splitmix64
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool Reduction(Op op) {
  return op == Op::kPsum || op == Op::kPmean || op == Op::kPmax || op == Op::kPmin;
}

bool GroupIdentical(Op op) {
  return Reduction(op) || op == Op::kAllGather || op == Op::kBroadcast || op == Op::kBarrier;
}

// Builds the cases of one sweep.
class Builder {
 public:
  explicit Builder(std::vector<Case>* cases) : cases_(cases) {}

  // Adds the case (out of place, and in place when the result fits), naming
  // it from its fields.
  void Add(Op op, DType dt, Shape shape, const std::vector<std::string>& axes, int n,
           OpParams p = {}, const std::string& variant = "", bool out_of_place = true,
           bool in_place = true) {
    DType out_dt;
    Shape out_shape;
    if (!ResultType(op, dt, shape, n, p, &out_dt, &out_shape)) std::abort();  // sweep bug
    const bool fits = NumElements(out_shape) * ElemSize(out_dt) == NumElements(shape) * ElemSize(dt);
    // all_gather and psum_scatter take a required output in the SDK.
    const bool may_in_place = fits && op != Op::kAllGather && op != Op::kPsumScatter;
    for (int placement = 0; placement < 2; ++placement) {
      const bool inp = placement == 1;
      if (inp ? !(in_place && may_in_place) : !out_of_place) continue;
      Case c;
      c.op = op;
      c.dtype = dt;
      c.shape = shape;
      c.axes = axes;
      c.params = p;
      c.in_place = inp;
      c.separate_output = !inp && (counter_ % 2 == 1);
      c.input = Reduction(op) || op == Op::kPsumScatter ? InputKind::kArith : InputKind::kRandomBits;
      c.check_future = counter_ % 3 == 2;
      c.group_identical = GroupIdentical(op);
      c.batch = batch_;
      c.name = std::string(OpName(op)) + "." + ShortName(dt) + "." + ShapeStr(shape) +
               (variant.empty() ? "" : "." + variant) + "." + AxesString(axes) + "." +
               (inp ? "in" : (c.separate_output ? "out2" : "out"));
      if (batch_ >= 0) c.name = "b" + std::to_string(batch_) + "." + c.name;
      ++counter_;
      cases_->push_back(std::move(c));
    }
  }

  void Special(const std::string& name, const std::vector<std::string>& axes) {
    Case c;
    c.name = name;
    c.special = name;
    c.axes = axes;
    c.op = Op::kPsum;
    c.group_identical = true;  // the hash covers the follow-up psum's bits and sequence
    cases_->push_back(std::move(c));
  }

  void set_batch(int b) { batch_ = b; }

 private:
  std::vector<Case>* cases_;
  int counter_ = 0;
  int batch_ = -1;
};

std::string AgVariant(const OpParams& p) {
  return "axis" + std::to_string(p.axis) + (p.tiled ? ".tiled" : "");
}
std::string PsVariant(const OpParams& p) {
  return "dim" + std::to_string(p.axis) + (p.tiled ? ".tiled" : "");
}
std::string A2aVariant(const OpParams& p) {
  return "s" + std::to_string(p.axis) + "c" + std::to_string(p.concat_axis) +
         (p.tiled ? ".tiled" : "");
}

OpParams Ag(int axis, bool tiled) {
  OpParams p;
  p.axis = axis;
  p.tiled = tiled;
  return p;
}
OpParams A2a(int s, int c, bool tiled) {
  OpParams p;
  p.axis = s;
  p.concat_axis = c;
  p.tiled = tiled;
  return p;
}

// Permutations of a group of n, by name.
std::vector<std::pair<std::string, std::vector<std::pair<int, int>>>> Perms(int n) {
  std::vector<std::pair<std::string, std::vector<std::pair<int, int>>>> perms;
  std::vector<std::pair<int, int>> ring, back, reverse, one, ident, swaps;
  for (int i = 0; i < n; ++i) {
    ring.emplace_back(i, (i + 1) % n);
    back.emplace_back(i, (i + n - 1) % n);
    reverse.emplace_back(i, n - 1 - i);
    ident.emplace_back(i, i);
  }
  for (int i = 0; i + 1 < n; i += 2) {
    swaps.emplace_back(i, i + 1);
    swaps.emplace_back(i + 1, i);
  }
  one.emplace_back(0, n - 1);
  perms.push_back({"ring", ring});
  perms.push_back({"back", back});
  perms.push_back({"reverse", reverse});
  perms.push_back({"one", one});  // everyone but n-1 gets zeros
  perms.push_back({"empty", {}});
  perms.push_back({"ident", ident});
  perms.push_back({"swaps", swaps});  // odd n: the last member gets zeros
  return perms;
}

OpParams PermParams(const std::vector<std::pair<int, int>>& perm) {
  OpParams p;
  p.perm = perm;
  return p;
}

void MainSweep(const MeshSpec& mesh, std::vector<Case>* cases) {
  Builder b(cases);
  const auto choices = AxisChoices(mesh);
  for (size_t ci = 0; ci < choices.size(); ++ci) {
    const auto& axes = choices[ci];
    const bool full = ci == 0;
    const int n = GroupOf(mesh, axes, 0).size;

    // Reductions: every dtype; shapes incl. scalar, empty, one element, odd
    // sizes, and sizes spanning several 4 KiB chunks.
    const std::vector<Shape> red_shapes =
        full ? std::vector<Shape>{{}, {0}, {1}, {7}, {1031}, {2, 2500}}
             : std::vector<Shape>{{}, {7}, {1031}};
    for (Op op : {Op::kPsum, Op::kPmean, Op::kPmax, Op::kPmin}) {
      for (DType dt : kAllDTypes) {
        for (const Shape& s : red_shapes) b.Add(op, dt, s, axes, n);
      }
    }
    // Every axis (AxisNames::All()), a few reductions.
    if (full && mesh.axes.size() > 1) {
      b.Add(Op::kPsum, DType::kF32, {1031}, kEveryAxis, mesh.num_members());
      b.Add(Op::kPmax, DType::kBF16, {7}, kEveryAxis, mesh.num_members());
    }

    // all_gather.
    {
      const std::vector<std::pair<Shape, OpParams>> every_dtype = {
          {{7}, Ag(0, false)}, {{1031}, Ag(0, true)}, {{3, 5}, Ag(1, true)}};
      const std::vector<std::pair<Shape, OpParams>> variants = {
          {{}, Ag(0, false)},     {{0}, Ag(0, false)},     {{0}, Ag(0, true)},
          {{1}, Ag(0, true)},     {{7}, Ag(1, false)},     {{3, 5}, Ag(0, false)},
          {{3, 5}, Ag(1, false)}, {{3, 5}, Ag(2, false)},  {{3, 5}, Ag(0, true)},
          {{2, 0}, Ag(1, true)},  {{4, 1, 3}, Ag(1, true)}, {{2, 3, 700}, Ag(2, true)},
          {{2, 3, 700}, Ag(1, false)}, {{2, 3, 4}, Ag(3, false)},
          // Negative axes count from the end of the output.
          {{3, 5}, Ag(-1, false)},    {{3, 5}, Ag(-3, false)}, {{2, 3, 700}, Ag(-1, true)},
          {{4, 1, 3}, Ag(-3, true)}};
      if (full) {
        for (const auto& [s, p] : every_dtype) {
          for (DType dt : kAllDTypes) b.Add(Op::kAllGather, dt, s, axes, n, p, AgVariant(p));
        }
        for (size_t k = 0; k < variants.size(); ++k) {
          const auto& [s, p] = variants[k];
          const std::vector<DType> dts = k % 2 == 0
              ? std::vector<DType>{DType::kBool, DType::kBF16, DType::kU32, DType::kF64}
              : std::vector<DType>{DType::kU8, DType::kF16, DType::kF32, DType::kI64};
          for (DType dt : dts) b.Add(Op::kAllGather, dt, s, axes, n, p, AgVariant(p));
        }
      } else {
        for (const auto& [s, p] : every_dtype) {
          for (DType dt : {DType::kBool, DType::kBF16, DType::kF32, DType::kF64}) {
            b.Add(Op::kAllGather, dt, s, axes, n, p, AgVariant(p));
          }
        }
        b.Add(Op::kAllGather, DType::kI32, {3, 5}, axes, n, Ag(2, false), AgVariant(Ag(2, false)));
      }
    }

    // ppermute.
    {
      const auto perms = Perms(n);
      if (full) {
        for (DType dt : kAllDTypes) {
          b.Add(Op::kPpermute, dt, {7}, axes, n, PermParams(perms[0].second), perms[0].first);
        }
        for (size_t k = 0; k < perms.size(); ++k) {
          const DType dt = kAllDTypes[(3 * k) % std::size(kAllDTypes)];
          b.Add(Op::kPpermute, dt, {1031}, axes, n, PermParams(perms[k].second), perms[k].first);
          b.Add(Op::kPpermute, DType::kF32, {3, 5}, axes, n, PermParams(perms[k].second),
                perms[k].first);
        }
        for (Shape s : {Shape{}, Shape{0}}) {
          for (DType dt : {DType::kF64, DType::kBool}) {
            b.Add(Op::kPpermute, dt, s, axes, n, PermParams(perms[1].second), perms[1].first);
          }
        }
      } else {
        for (size_t k : {0, 2, 3, 6}) {
          for (DType dt : {DType::kF32, DType::kBool, DType::kBF16}) {
            b.Add(Op::kPpermute, dt, {1031}, axes, n, PermParams(perms[k].second), perms[k].first);
          }
        }
      }
    }

    // psum_scatter (bool is rejected: see the errors sweep).
    {
      auto ps = [](int d, bool tiled) {
        OpParams p;
        p.axis = d;
        p.tiled = tiled;
        return p;
      };
      const std::vector<std::pair<Shape, OpParams>> every_dtype = {
          {{n}, ps(0, false)}, {{2 * n}, ps(0, true)}, {{n * 515}, ps(0, true)},
          {{3, 2 * n}, ps(1, true)}};
      const std::vector<std::pair<Shape, OpParams>> variants = {
          {{n, 3}, ps(0, false)},     {{3, n}, ps(1, false)},  {{2, n, 5}, ps(1, false)},
          {{n, 0}, ps(0, false)},     {{0}, ps(0, true)},      {{4 * n, 3}, ps(0, true)},
          {{3, n * 300}, ps(1, true)}, {{2, n, 600}, ps(1, false)},
          {{3, n}, ps(-1, false)},    {{4 * n, 3}, ps(-2, true)}};
      std::vector<DType> non_bool;
      for (DType dt : kAllDTypes) {
        if (dt != DType::kBool) non_bool.push_back(dt);
      }
      if (full) {
        for (const auto& [s, p] : every_dtype) {
          for (DType dt : non_bool) b.Add(Op::kPsumScatter, dt, s, axes, n, p, PsVariant(p));
        }
        for (const auto& [s, p] : variants) {
          for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
            b.Add(Op::kPsumScatter, dt, s, axes, n, p, PsVariant(p));
          }
        }
      } else {
        for (const auto& [s, p] : {every_dtype[0], every_dtype[2], every_dtype[3]}) {
          for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kU64}) {
            b.Add(Op::kPsumScatter, dt, s, axes, n, p, PsVariant(p));
          }
        }
      }
    }

    // all_to_all.
    {
      const std::vector<std::pair<Shape, OpParams>> every_dtype = {
          {{n, 3}, A2a(0, 1, false)}, {{2 * n, 3}, A2a(0, 1, true)}};
      const std::vector<std::pair<Shape, OpParams>> variants = {
          {{n}, A2a(0, 0, false)},          {{3, n}, A2a(1, 0, false)},
          {{n, 3}, A2a(0, 0, false)},       {{3, n}, A2a(1, 1, false)},
          {{2, n, 3}, A2a(1, 2, false)},    {{2, 3, n}, A2a(2, 0, false)},
          {{n, 0}, A2a(0, 1, false)},       {{2 * n}, A2a(0, 0, true)},
          {{3, 2 * n}, A2a(1, 0, true)},    {{3, 2 * n}, A2a(1, 1, true)},
          {{2 * n, 5}, A2a(0, 0, true)},    {{2, 3 * n, 2}, A2a(1, 2, true)},
          {{n * 300, 2}, A2a(0, 1, true)},  {{0, 3}, A2a(0, 1, true)},
          {{4, n * 2, 130}, A2a(1, 2, true)}, {{2, 3, 2 * n}, A2a(2, 0, true)},
          {{2 * n, 3, 2}, A2a(0, 2, true)}, {{n, 2, 3}, A2a(0, 2, false)},
          {{2, 3, n}, A2a(2, 1, false)},
          // Negative axes count from the end (concat_axis: of the output).
          {{2, 3, n}, A2a(-1, -3, false)},  {{n, 2, 3}, A2a(-3, -1, false)},
          {{3, 2 * n}, A2a(-1, -2, true)},  {{2, 3 * n, 2}, A2a(-2, -1, true)}};
      if (full) {
        for (const auto& [s, p] : every_dtype) {
          for (DType dt : kAllDTypes) b.Add(Op::kAllToAll, dt, s, axes, n, p, A2aVariant(p));
        }
        for (size_t k = 0; k < variants.size(); ++k) {
          const auto& [s, p] = variants[k];
          const std::vector<DType> dts = k % 2 == 0
              ? std::vector<DType>{DType::kBool, DType::kBF16, DType::kU32, DType::kF64}
              : std::vector<DType>{DType::kI8, DType::kF16, DType::kF32, DType::kU64};
          for (DType dt : dts) b.Add(Op::kAllToAll, dt, s, axes, n, p, A2aVariant(p));
        }
      } else {
        for (size_t k : {0, 2, 4, 8, 11, 12}) {
          const auto& [s, p] = variants[k];
          for (DType dt : {DType::kF32, DType::kU8}) {
            b.Add(Op::kAllToAll, dt, s, axes, n, p, A2aVariant(p));
          }
        }
      }
    }

    // broadcast.
    {
      auto root = [](int r) {
        OpParams p;
        p.root = r;
        return p;
      };
      std::vector<int> roots = {0};
      if (n > 1) roots.push_back(n - 1);
      if (n / 2 != 0 && n / 2 != n - 1) roots.push_back(n / 2);
      if (full) {
        for (size_t k = 0; k < std::size(kAllDTypes); ++k) {
          const int r = roots[k % roots.size()];
          b.Add(Op::kBroadcast, kAllDTypes[k], {7}, axes, n, root(r), "root" + std::to_string(r));
        }
        for (Shape s : {Shape{}, Shape{0}, Shape{1031}, Shape{3, 5}}) {
          for (int r : roots) {
            b.Add(Op::kBroadcast, DType::kF16, s, axes, n, root(r), "root" + std::to_string(r));
          }
        }
      } else {
        for (int r : roots) {
          if (r == n / 2 && r != 0 && r != n - 1) continue;  // the first and last root only
          for (DType dt : {DType::kF64, DType::kBool}) {
            b.Add(Op::kBroadcast, dt, {1031}, axes, n, root(r), "root" + std::to_string(r));
          }
        }
      }
    }

    // barrier.
    b.Add(Op::kBarrier, DType::kF32, {0}, axes, n, {}, "", true, false);
  }
  // Barrier over every axis.
  b.Add(Op::kBarrier, DType::kF32, {0}, kEveryAxis, mesh.num_members(), {}, "", true, false);
}

void LargeSweep(const MeshSpec& mesh, std::vector<Case>* cases) {
  Builder b(cases);
  const auto choices = AxisChoices(mesh);
  const std::vector<std::string> first = choices[0];
  const std::vector<std::string> all = kEveryAxis;
  const int n1 = GroupOf(mesh, first, 0).size;
  const int na = mesh.num_members();
  constexpr int64_t kM = 1 << 20;  // 4 MiB of float32
  auto only_out = [&](Op op, DType dt, Shape s, const std::vector<std::string>& axes, int n,
                      OpParams p = {}, const std::string& v = "") {
    b.Add(op, dt, std::move(s), axes, n, std::move(p), v, true, false);
  };
  auto only_in = [&](Op op, DType dt, Shape s, const std::vector<std::string>& axes, int n,
                     OpParams p = {}, const std::string& v = "") {
    b.Add(op, dt, std::move(s), axes, n, std::move(p), v, false, true);
  };
  b.Add(Op::kPsum, DType::kF32, {kM}, all, na);                       // 4 MiB, in and out
  only_out(Op::kPsum, DType::kF32, {kM}, first, n1);
  only_in(Op::kPsum, DType::kBF16, {2 * kM}, all, na);                // 4 MiB
  only_out(Op::kPsum, DType::kF16, {kM}, first, n1);                  // 2 MiB
  only_in(Op::kPmean, DType::kF64, {kM / 2}, all, na);                // 4 MiB
  only_out(Op::kPmax, DType::kF32, {kM}, all, na);
  only_out(Op::kAllGather, DType::kF32, {kM / 2}, all, na, Ag(0, true), AgVariant(Ag(0, true)));
  only_out(Op::kAllGather, DType::kF32, {1024, 512}, first, n1, Ag(1, true),
           AgVariant(Ag(1, true)));
  const auto perms = Perms(na);
  only_in(Op::kPpermute, DType::kF32, {kM}, all, na, PermParams(perms[0].second), perms[0].first);
  only_out(Op::kPpermute, DType::kF32, {kM}, all, na, PermParams(perms[2].second), perms[2].first);
  OpParams ps;
  ps.axis = 0;
  ps.tiled = true;
  only_out(Op::kPsumScatter, DType::kF32, {na * (kM / 4)}, all, na, ps, PsVariant(ps));
  only_in(Op::kAllToAll, DType::kF32, {na * 512, 512}, all, na, A2a(0, 1, true),
          A2aVariant(A2a(0, 1, true)));
  OpParams root;
  root.root = na - 1;
  only_in(Op::kBroadcast, DType::kU8, {3 * kM}, all, na, root, "root" + std::to_string(na - 1));
}

void AsyncSweep(const MeshSpec& mesh, std::vector<Case>* cases) {
  Builder b(cases);
  const auto choices = AxisChoices(mesh);
  for (int batch = 0; batch < 6; ++batch) {
    b.set_batch(batch);
    const auto& axes = choices[batch % choices.size()];
    const int n = GroupOf(mesh, axes, 0).size;
    const DType d1 = kAllDTypes[batch % 11], d2 = kAllDTypes[(batch + 5) % 11];
    auto perms = Perms(n);
    OpParams ps;
    ps.axis = 0;
    ps.tiled = true;
    OpParams root;
    root.root = batch % n;
    // 8 ops outstanding at once; out of place and in place alternate.
    const bool odd = batch % 2 == 1;
    b.Add(Op::kPsum, DType::kF32, {1031}, axes, n, {}, "", !odd, odd);
    b.Add(Op::kAllGather, d1, {7, 3}, axes, n, Ag(1, false), AgVariant(Ag(1, false)));
    b.Add(Op::kPpermute, d2, {513}, axes, n, PermParams(perms[batch % perms.size()].second),
          perms[batch % perms.size()].first, odd, !odd);
    b.Add(Op::kPmax, DType::kF16, {2000}, axes, n, {}, "", !odd, odd);
    if (batch == 3) {
      b.Add(Op::kBarrier, DType::kF32, {0}, axes, n, {}, "", true, false);
    } else {
      b.Add(Op::kAllToAll, DType::kF64, {2 * n, 300}, axes, n, A2a(0, 1, true),
            A2aVariant(A2a(0, 1, true)), odd, !odd);
    }
    b.Add(Op::kBroadcast, DType::kBool, {100}, axes, n, root, "root" + std::to_string(root.root),
          !odd, odd);
    b.Add(Op::kPsumScatter, DType::kU32, {n * 1500}, axes, n, ps, PsVariant(ps));
    b.Add(Op::kPmean, batch % 2 ? DType::kI64 : DType::kI8, {777}, axes, n, {}, "", true, false);
  }
}

void ErrorSweep(std::vector<Case>* cases) {
  Builder b(cases);
  for (const char* name :
       {"err.inplace_psum_bool", "err.inplace_pmean_i8", "err.all_gather_output_is_input",
        "err.output_out_of_range", "err.output_offset_past_end", "err.input_out_of_range",
        "err.unknown_axis", "err.axis_named_twice", "err.psum_scatter_bool",
        "err.all_gather_axis_out_of_range", "err.ppermute_dest_twice", "err.broadcast_root_range",
        "err.misaligned_offset", "err.psum_scatter_wrong_dim", "err.all_to_all_not_divisible",
        "err.partial_overlap", "err.freed_buffer", "err.member0_only", "err.mismatched_ops",
        "err.shape_overflow", "err.output_shorter_than_result", "err.output_shape_negative",
        "empty_tuple"}) {
    b.Special(name, kEveryAxis);
  }
}

}  // namespace

int MeshSpec::num_members() const {
  int n = 1;
  for (const auto& a : axes) n *= a.second;
  return n;
}

std::vector<int> MeshSpec::Coordinate(int member) const {
  std::vector<int> c(axes.size());
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i) {
    c[i] = member % axes[i].second;
    member /= axes[i].second;
  }
  return c;
}

bool ParseMeshSpec(const std::string& text, MeshSpec* spec) {
  spec->axes.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string part = text.substr(pos, comma - pos);
    const size_t colon = part.find(':');
    if (colon == std::string::npos || colon == 0) return false;
    const int size = std::atoi(part.c_str() + colon + 1);
    if (size < 1) return false;
    spec->axes.emplace_back(part.substr(0, colon), size);
    pos = comma + 1;
  }
  return !spec->axes.empty();
}

std::string MeshSpecString(const MeshSpec& spec) {
  std::string s;
  for (const auto& [name, size] : spec.axes) {
    if (!s.empty()) s += ",";
    s += name + ":" + std::to_string(size);
  }
  return s;
}

Group GroupOf(const MeshSpec& mesh, const std::vector<std::string>& axes_in, int member,
              bool mesh_order) {
  std::vector<int> ids;
  if (axes_in == kEveryAxis) {
    for (size_t i = 0; i < mesh.axes.size(); ++i) ids.push_back(static_cast<int>(i));
  }
  for (const std::string& a : axes_in) {
    for (size_t i = 0; i < mesh.axes.size(); ++i) {
      if (mesh.axes[i].first == a) ids.push_back(static_cast<int>(i));
    }
  }
  if (mesh_order) std::sort(ids.begin(), ids.end());
  const std::vector<int> coord = mesh.Coordinate(member);
  Group g;
  g.size = 1;
  for (int id : ids) g.size *= mesh.axes[id].second;
  // Key: the coordinates on the axes not named, as a mesh-shaped index.
  for (size_t a = 0; a < mesh.axes.size(); ++a) {
    const bool named = std::find(ids.begin(), ids.end(), static_cast<int>(a)) != ids.end();
    g.key = g.key * mesh.axes[a].second + (named ? 0 : coord[a]);
  }
  g.rank = 0;
  for (int id : ids) g.rank = g.rank * mesh.axes[id].second + coord[id];
  for (int k = 0; k < g.size; ++k) {
    std::vector<int> c = coord;
    int rest = k;
    for (int i = static_cast<int>(ids.size()) - 1; i >= 0; --i) {
      c[ids[i]] = rest % mesh.axes[ids[i]].second;
      rest /= mesh.axes[ids[i]].second;
    }
    int m = 0;
    for (size_t a = 0; a < mesh.axes.size(); ++a) m = m * mesh.axes[a].second + c[a];
    g.members.push_back(m);
  }
  return g;
}

std::vector<std::vector<std::string>> AxisChoices(const MeshSpec& mesh) {
  std::vector<std::vector<std::string>> choices;
  if (mesh.axes.size() == 1) {
    choices.push_back({mesh.axes[0].first});
    choices.push_back(kEveryAxis);
  } else {
    // Every axis alone, every ordered pair (both orders; with three or more
    // axes also non-adjacent pairs), and with more than two axes all of them
    // in reverse order.
    for (const auto& a : mesh.axes) choices.push_back({a.first});
    for (size_t i = 0; i < mesh.axes.size(); ++i) {
      for (size_t j = 0; j < mesh.axes.size(); ++j) {
        if (i != j) choices.push_back({mesh.axes[i].first, mesh.axes[j].first});
      }
    }
    if (mesh.axes.size() > 2) {
      std::vector<std::string> names;
      for (auto it = mesh.axes.rbegin(); it != mesh.axes.rend(); ++it) names.push_back(it->first);
      choices.push_back(names);
    }
  }
  return choices;
}

std::string AxesString(const std::vector<std::string>& axes) {
  if (axes.empty()) return "()";
  std::string s = "{";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + axes[i];
  return s + "}";
}

bool BuildSweep(const std::string& sweep, const MeshSpec& mesh, std::vector<Case>* cases) {
  cases->clear();
  if (sweep == "main") {
    MainSweep(mesh, cases);
  } else if (sweep == "large") {
    LargeSweep(mesh, cases);
  } else if (sweep == "async") {
    AsyncSweep(mesh, cases);
  } else if (sweep == "errors") {
    ErrorSweep(cases);
  } else {
    return false;
  }
  return true;
}

uint64_t Fnv1a(const uint8_t* data, size_t size, uint64_t h) {
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<uint8_t> MakeInput(const Case& c, uint64_t seed, int member) {
  const size_t es = ElemSize(c.dtype);
  const int64_t count = NumElements(c.shape);
  std::vector<uint8_t> out(static_cast<size_t>(count) * es);
  const uint64_t base =
      Mix(Mix(seed ^ Fnv1a(reinterpret_cast<const uint8_t*>(c.name.data()), c.name.size())) +
          static_cast<uint64_t>(member));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t r = Mix(base + static_cast<uint64_t>(i) * 0x632be59bd9b4e019ull);
    const uint64_t r2 = Mix(r);
    uint8_t* dst = out.data() + static_cast<size_t>(i) * es;
    uint64_t bits = r2;
    if (c.dtype == DType::kBool) {
      bits = c.input == InputKind::kArith && i % 4 == 0 ? ((r & 7) == 0) : (r & 1);
    } else if (c.input == InputKind::kArith && IsFloatType(c.dtype)) {
      // Per-format: {exp bias, mantissa bits, exponent spread} and specials.
      struct Fmt {
        int bias, mbits, ebits, spread;
        uint64_t specials[13];
      };
      static const Fmt kF32 = {127, 23, 8, 20,
                               {0x0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
                                0x7f7fffff, 0xff7fffff, 0x1, 0x80000001, 0x00800000, 0x3f800000,
                                0xbf800000}};
      static const Fmt kF64 = {1023, 52, 11, 60,
                               {0x0, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
                                0x7ff8000000000000, 0xfff8000000000000, 0x7fefffffffffffff,
                                0xffefffffffffffff, 0x1, 0x8000000000000001, 0x0010000000000000,
                                0x3ff0000000000000, 0xbff0000000000000}};
      static const Fmt kF16 = {15, 10, 5, 10,
                               {0x0, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7bff, 0xfbff, 0x1,
                                0x8001, 0x0400, 0x3c00, 0xbc00}};
      static const Fmt kBF16 = {127, 7, 8, 30,
                                {0x0, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f7f, 0xff7f, 0x1,
                                 0x8001, 0x0080, 0x3f80, 0xbf80}};
      // float8: e4m3fn's NaN is 0x7f (no inf; 0x7e is 448), e5m2 is IEEE-like.
      static const Fmt kF8E4M3FN = {7, 3, 4, 6,
                                    {0x0, 0x80, 0x7f, 0xff, 0x7f, 0xff, 0x7e, 0xfe, 0x1, 0x81,
                                     0x08, 0x38, 0xb8}};
      static const Fmt kF8E5M2 = {15, 2, 5, 10,
                                  {0x0, 0x80, 0x7c, 0xfc, 0x7e, 0xfd, 0x7b, 0xfb, 0x1, 0x81, 0x04,
                                   0x3c, 0xbc}};
      const Fmt& f = c.dtype == DType::kF32        ? kF32
                     : c.dtype == DType::kF64      ? kF64
                     : c.dtype == DType::kF16      ? kF16
                     : c.dtype == DType::kF8E4M3FN ? kF8E4M3FN
                     : c.dtype == DType::kF8E5M2   ? kF8E5M2
                                                   : kBF16;
      const uint64_t sign_bit = uint64_t{1} << (f.mbits + f.ebits);
      const int cls = static_cast<int>(i % 16);
      auto normal = [&] {
        const int64_t e = f.bias + static_cast<int64_t>((r >> 8) % (2 * f.spread + 1)) - f.spread;
        const uint64_t mant = r2 & ((uint64_t{1} << f.mbits) - 1);
        return ((r & 1) ? sign_bit : 0) | (static_cast<uint64_t>(e) << f.mbits) | mant;
      };
      if (cls == 5) {
        bits = (r & 1) ? sign_bit : 0;  // ±0: the sign of zero sums and ties
      } else if (cls == 9) {
        bits = sign_bit;  // -0 on every member: psum gives +0, pmax keeps -0
      } else if (cls == 3 || cls == 11) {
        bits = ((r >> 7) & 1) ? f.specials[(r >> 16) % 13] : normal();
      } else if (cls == 13) {
        // Small integers: exact sums, many ties.
        const int v = static_cast<int>((r >> 8) % 7) - 3;
        const double d = v;
        if (c.dtype == DType::kF32) bits = std::bit_cast<uint32_t>(static_cast<float>(d));
        else if (c.dtype == DType::kF64) bits = std::bit_cast<uint64_t>(d);
        else if (c.dtype == DType::kF16) bits = F64ToF16(d);
        else if (c.dtype == DType::kF8E4M3FN) bits = F32ToF8(true, static_cast<float>(d));
        else if (c.dtype == DType::kF8E5M2) bits = F32ToF8(false, static_cast<float>(d));
        else bits = F32ToBF16(static_cast<float>(d));
      } else {
        bits = normal();
      }
    } else if (c.input == InputKind::kArith && i % 8 == 7) {
      // Integer extremes: 0, all ones, top bit only, all but the top bit, 1, top|1.
      const int w = static_cast<int>(es * 8);
      const uint64_t top = uint64_t{1} << (w - 1);
      const uint64_t ones = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
      const uint64_t ext[] = {0, ones, top, ones ^ top, 1, top | 1};
      bits = ext[(r >> 8) % 6];
    }
    std::memcpy(dst, &bits, es);  // little-endian: the low bytes
  }
  return out;
}

}  // namespace collectived::integration
