#include "tests/conformance/vectors.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace collectived::conformance {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// Small typed accessors over google.protobuf.Struct; each names the case and
// field in its error.
class Fields {
 public:
  Fields(const Struct& s, std::string where) : s_(s), where_(std::move(where)) {}

  absl::StatusOr<const Value*> Get(const std::string& key) const {
    auto it = s_.fields().find(key);
    if (it == s_.fields().end()) return Error(key, "missing");
    return &it->second;
  }
  absl::StatusOr<std::string> String(const std::string& key) const {
    auto v = Get(key);
    if (!v.ok()) return v.status();
    if ((*v)->kind_case() != Value::kStringValue) return Error(key, "not a string");
    return (*v)->string_value();
  }
  absl::StatusOr<const ListValue*> List(const std::string& key) const {
    auto v = Get(key);
    if (!v.ok()) return v.status();
    if ((*v)->kind_case() != Value::kListValue) return Error(key, "not a list");
    return &(*v)->list_value();
  }
  absl::StatusOr<const Struct*> Object(const std::string& key) const {
    auto v = Get(key);
    if (!v.ok()) return v.status();
    if ((*v)->kind_case() != Value::kStructValue) return Error(key, "not an object");
    return &(*v)->struct_value();
  }
  absl::StatusOr<int64_t> Int(const std::string& key) const {
    auto v = Get(key);
    if (!v.ok()) return v.status();
    return ToInt(**v, key);
  }
  absl::StatusOr<bool> Bool(const std::string& key) const {
    auto v = Get(key);
    if (!v.ok()) return v.status();
    if ((*v)->kind_case() != Value::kBoolValue) return Error(key, "not a bool");
    return (*v)->bool_value();
  }
  absl::StatusOr<std::vector<int64_t>> Ints(const std::string& key) const {
    auto l = List(key);
    if (!l.ok()) return l.status();
    std::vector<int64_t> out;
    for (const Value& v : (*l)->values()) {
      auto i = ToInt(v, key);
      if (!i.ok()) return i.status();
      out.push_back(*i);
    }
    return out;
  }
  absl::StatusOr<std::vector<std::string>> Strings(const std::string& key) const {
    auto l = List(key);
    if (!l.ok()) return l.status();
    std::vector<std::string> out;
    for (const Value& v : (*l)->values()) {
      if (v.kind_case() != Value::kStringValue) return Error(key, "has a non-string element");
      out.push_back(v.string_value());
    }
    return out;
  }

  absl::StatusOr<int64_t> ToInt(const Value& v, const std::string& key) const {
    if (v.kind_case() != Value::kNumberValue) return Error(key, "not a number");
    double d = v.number_value();
    if (d != std::floor(d) || std::fabs(d) > 9.0e15) return Error(key, "not an integer");
    return static_cast<int64_t>(d);
  }
  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": field '", key, "' ", what));
  }

 private:
  const Struct& s_;
  std::string where_;
};

absl::StatusOr<std::string> FromHex(const std::string& hex, const std::string& where) {
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(where, ": odd hex length"));
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": bad hex digit"));
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

#define ASSIGN_OR_RETURN(lhs, expr)       \
  do {                                    \
    auto _v = (expr);                     \
    if (!_v.ok()) return _v.status();     \
    lhs = *std::move(_v);                 \
  } while (0)

absl::StatusOr<Case> ParseCase(const Struct& s, size_t index) {
  Case c;
  Fields f(s, absl::StrCat("case #", index));
  ASSIGN_OR_RETURN(c.name, f.String("name"));
  Fields cf(s, absl::StrCat("case ", c.name));
  ASSIGN_OR_RETURN(c.op, cf.String("op"));
  const ListValue* mesh = nullptr;
  ASSIGN_OR_RETURN(mesh, cf.List("mesh"));
  for (const Value& axis : mesh->values()) {
    if (axis.kind_case() != Value::kListValue || axis.list_value().values_size() != 2 ||
        axis.list_value().values(0).kind_case() != Value::kStringValue ||
        axis.list_value().values(1).kind_case() != Value::kNumberValue) {
      return cf.Error("mesh", "is not a list of [name, size] pairs");
    }
    c.mesh.emplace_back(axis.list_value().values(0).string_value(),
                        static_cast<int>(axis.list_value().values(1).number_value()));
  }
  ASSIGN_OR_RETURN(c.axes, cf.Strings("axes"));
  ASSIGN_OR_RETURN(c.dtype, cf.String("dtype"));
  ASSIGN_OR_RETURN(c.shape, cf.Ints("shape"));
  ASSIGN_OR_RETURN(c.out_dtype, cf.String("out_dtype"));
  ASSIGN_OR_RETURN(c.out_shape, cf.Ints("out_shape"));
  const Struct* params = nullptr;
  ASSIGN_OR_RETURN(params, cf.Object("params"));
  Fields pf(*params, absl::StrCat("case ", c.name, " params"));
  if (c.op == "all_gather") {
    ASSIGN_OR_RETURN(c.axis, pf.Int("axis"));
    ASSIGN_OR_RETURN(c.tiled, pf.Bool("tiled"));
  } else if (c.op == "psum_scatter") {
    ASSIGN_OR_RETURN(c.scatter_dimension, pf.Int("scatter_dimension"));
    ASSIGN_OR_RETURN(c.tiled, pf.Bool("tiled"));
  } else if (c.op == "all_to_all") {
    ASSIGN_OR_RETURN(c.split_axis, pf.Int("split_axis"));
    ASSIGN_OR_RETURN(c.concat_axis, pf.Int("concat_axis"));
    ASSIGN_OR_RETURN(c.tiled, pf.Bool("tiled"));
  } else if (c.op == "ppermute") {
    const ListValue* perm = nullptr;
    ASSIGN_OR_RETURN(perm, pf.List("perm"));
    for (const Value& pair : perm->values()) {
      if (pair.kind_case() != Value::kListValue || pair.list_value().values_size() != 2) {
        return pf.Error("perm", "is not a list of [source, dest] pairs");
      }
      int64_t src = 0, dst = 0;
      ASSIGN_OR_RETURN(src, pf.ToInt(pair.list_value().values(0), "perm"));
      ASSIGN_OR_RETURN(dst, pf.ToInt(pair.list_value().values(1), "perm"));
      c.perm.emplace_back(static_cast<int>(src), static_cast<int>(dst));
    }
  } else if (c.op != "psum" && c.op != "pmean" && c.op != "pmax" && c.op != "pmin") {
    return cf.Error("op", absl::StrCat("has unknown value '", c.op, "'"));
  }
  std::vector<std::string> hex;
  ASSIGN_OR_RETURN(hex, cf.Strings("inputs"));
  for (size_t m = 0; m < hex.size(); ++m) {
    std::string bytes;
    ASSIGN_OR_RETURN(bytes, FromHex(hex[m], absl::StrCat("case ", c.name, " inputs[", m, "]")));
    c.inputs.push_back(std::move(bytes));
  }
  ASSIGN_OR_RETURN(hex, cf.Strings("outputs"));
  for (size_t m = 0; m < hex.size(); ++m) {
    std::string bytes;
    ASSIGN_OR_RETURN(bytes, FromHex(hex[m], absl::StrCat("case ", c.name, " outputs[", m, "]")));
    c.outputs.push_back(std::move(bytes));
  }
  const size_t members = static_cast<size_t>(NumMembers(c.mesh));
  if (c.inputs.size() != members || c.outputs.size() != members) {
    return absl::InvalidArgumentError(absl::StrCat("case ", c.name, ": ", c.inputs.size(),
                                                   " inputs and ", c.outputs.size(),
                                                   " outputs for ", members, " members"));
  }
  return c;
}

}  // namespace

absl::StatusOr<Vectors> LoadVectors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  Struct root;
  auto st = google::protobuf::util::JsonStringToMessage(ss.str(), &root);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", st.ToString()));
  }
  Vectors v;
  Fields f(root, path);
  ASSIGN_OR_RETURN(v.generator, f.String("generator"));
  const ListValue* cases = nullptr;
  ASSIGN_OR_RETURN(cases, f.List("cases"));
  for (int i = 0; i < cases->values_size(); ++i) {
    const Value& c = cases->values(i);
    if (c.kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": case #", i, " is not an object"));
    }
    Case parsed;
    ASSIGN_OR_RETURN(parsed, ParseCase(c.struct_value(), static_cast<size_t>(i)));
    v.cases.push_back(std::move(parsed));
  }
  return v;
}

std::string LayoutString(const MeshLayout& mesh) {
  std::vector<std::string> parts;
  for (const auto& [name, size] : mesh) parts.push_back(absl::StrCat(name, ":", size));
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<MeshLayout> ParseLayout(const std::string& text) {
  MeshLayout mesh;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(part, ':');
    int size = 0;
    if (kv.size() != 2 || kv[0].empty() || !absl::SimpleAtoi(kv[1], &size) || size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad mesh layout '", text, "' (expected e.g. x:2,y:4)"));
    }
    mesh.emplace_back(std::string(kv[0]), size);
  }
  return mesh;
}

std::string LayoutTag(const MeshLayout& mesh) {
  std::string tag;
  for (const auto& [name, size] : mesh) absl::StrAppend(&tag, name, size);
  return tag;
}

int NumMembers(const MeshLayout& mesh) {
  int n = 1;
  for (const auto& axis : mesh) n *= axis.second;
  return n;
}

}  // namespace collectived::conformance
