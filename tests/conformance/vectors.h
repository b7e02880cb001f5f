// Loader of the JAX conformance vectors (tests/conformance/data/vectors.json,
// made by tests/conformance/gen_vectors.py). Shared by the conformance worker
// and the gtest driver.
//
// Thread-safety: plain data and pure functions.
#ifndef COLLECTIVED_TESTS_CONFORMANCE_VECTORS_H_
#define COLLECTIVED_TESTS_CONFORMANCE_VECTORS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace collectived::conformance {

// Axes of a mesh, major to minor: {{"x", 2}, {"y", 4}}.
using MeshLayout = std::vector<std::pair<std::string, int>>;

// One generated case: a jax.lax collective run over a mesh.
struct Case {
  std::string name;
  std::string op;  // psum pmean pmax pmin all_gather ppermute psum_scatter all_to_all
  MeshLayout mesh;
  std::vector<std::string> axes;  // in the order given to JAX (tuple order kept)
  std::string dtype;              // numpy spelling: "float32", "bfloat16", ...
  std::vector<int64_t> shape;
  // params (only those of `op` are meaningful)
  int axis = 0;                            // all_gather
  bool tiled = false;                      // all_gather, psum_scatter, all_to_all
  int scatter_dimension = 0;               // psum_scatter
  int split_axis = 0;                      // all_to_all
  int concat_axis = 0;                     // all_to_all
  std::vector<std::pair<int, int>> perm;   // ppermute (source, dest)
  std::string out_dtype;
  std::vector<int64_t> out_shape;
  std::vector<std::string> inputs;   // raw little-endian bytes per member (row-major mesh order)
  std::vector<std::string> outputs;  // expected bytes per member
};

struct Vectors {
  std::string generator;  // e.g. "jax 0.10.2"
  std::vector<Case> cases;
};

// Parses the vectors file at `path`, validating its structure (field types,
// one input and output per mesh member, hex strings).
absl::StatusOr<Vectors> LoadVectors(const std::string& path);

// "x:2,y:4" for {{"x",2},{"y",4}}.
std::string LayoutString(const MeshLayout& mesh);
// Inverse of LayoutString; error for malformed text.
absl::StatusOr<MeshLayout> ParseLayout(const std::string& text);
// "x2y4": a compact tag usable in mesh and test names.
std::string LayoutTag(const MeshLayout& mesh);
// Number of members of the mesh (product of axis sizes).
int NumMembers(const MeshLayout& mesh);

}  // namespace collectived::conformance

#endif  // COLLECTIVED_TESTS_CONFORMANCE_VECTORS_H_
