// The case sweeps of the integration tests, shared by the worker (which runs
// them) and the gtest driver (which knows which case names to expect from
// every worker and which members must get bitwise-identical results).
//
// Everything here is deterministic: the same (sweep, mesh) gives the same
// cases in the same order, and a case's inputs depend only on (seed, case
// name, member index, element index), so every member can compute every
// other member's input.
#ifndef COLLECTIVED_TESTS_INTEGRATION_SWEEP_H_
#define COLLECTIVED_TESTS_INTEGRATION_SWEEP_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/reference.h"

namespace collectived::integration {

// Mesh axes, major to minor: {{"x", 2}, {"y", 4}}.
struct MeshSpec {
  std::vector<std::pair<std::string, int>> axes;
  int num_members() const;
  std::vector<int> Coordinate(int member) const;  // row-major unravel
};

// Parses "x:2,y:4"; false on a malformed spec.
bool ParseMeshSpec(const std::string& text, MeshSpec* spec);
std::string MeshSpecString(const MeshSpec& spec);  // "x:2,y:4"

// A case's axes: names of mesh axes, in the order given; kEveryAxis for
// every axis of the mesh (the SDK's AxisNames::All()); empty for the empty
// tuple (JAX's axis_name=(): groups of one).
inline const std::vector<std::string> kEveryAxis = {"*"};

// The group of `member` for a collective over `axes`.
struct Group {
  int size = 1;
  int rank = 0;              // the member's index in `members`
  int key = 0;               // identifies the group among the mesh's groups
  std::vector<int> members;  // mesh indices in group order
};
// Group order: row-major over `axes` in the order given. With mesh_order
// (ppermute) the axes are first sorted into mesh order.
Group GroupOf(const MeshSpec& mesh, const std::vector<std::string>& axes, int member,
              bool mesh_order = false);

// How a case's inputs are drawn.
enum class InputKind {
  kArith,       // values for arithmetic: normal numbers, ±0, ±inf, NaN, extremes
  kRandomBits,  // arbitrary bit patterns (floats incl. NaN payloads), 0/1 for bool
};

struct Case {
  std::string name;  // unique within a sweep; no spaces
  Op op = Op::kPsum;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<std::string> axes;  // see kEveryAxis
  OpParams params;
  bool in_place = false;      // no output argument
  bool separate_output = false;  // output in a second buffer (else after the input)
  InputKind input = InputKind::kArith;
  // >= 0: submitted with the *_async API together with the other cases of
  // the same batch, then waited for. -1: the synchronous API.
  int batch = -1;
  // Also submit through *_async + Wait and check OpFuture's out_shape/dtype.
  bool check_future = false;
  // Non-empty: an error-path case handled specially by the worker.
  std::string special;
  // Every member of a group must get bitwise-identical outputs.
  bool group_identical = false;
};

// Sweeps:
//   "main"   - every op x dtype x shapes x in/out of place, over every axis
//              choice of the mesh (full cross product for the first choice,
//              a reduced one for the others);
//   "large"  - multi-MiB buffers (psum, pmean, pmax, all_gather, ppermute,
//              psum_scatter, all_to_all, broadcast);
//   "async"  - batches of 8 ops outstanding at once;
//   "errors" - invalid ops rejected at submit, each followed by a valid op,
//              and ops over the empty tuple ().
// Returns false for an unknown sweep name.
bool BuildSweep(const std::string& sweep, const MeshSpec& mesh, std::vector<Case>* cases);

// The axis choices the sweeps iterate over for `mesh`.
std::vector<std::vector<std::string>> AxisChoices(const MeshSpec& mesh);
std::string AxesString(const std::vector<std::string>& axes);  // "{x,y}", "{*}", "()"

// Deterministic input of `member` for case `c`.
std::vector<uint8_t> MakeInput(const Case& c, uint64_t seed, int member);

// 64-bit FNV-1a.
uint64_t Fnv1a(const uint8_t* data, size_t size, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace collectived::integration

#endif  // COLLECTIVED_TESTS_INTEGRATION_SWEEP_H_
