// ValidateJoin alone: every field it refuses, with the words it uses, and
// what a valid request asks for.
#include "daemon/core/join_request.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace collectived {
namespace {

JoinRequest Request(std::vector<std::pair<std::string, int>> axes,
                    std::vector<int> coordinate = {}) {
  JoinRequest req;
  req.session_id = "s-1";
  req.mesh_name = "train";
  for (const auto& [name, size] : axes) req.axes.push_back(AxisRequest{name, size});
  req.coordinate = std::move(coordinate);
  return req;
}

constexpr JoinLimits kLocal{.max_mesh_members = 64, .in_cluster = false};
constexpr JoinLimits kCluster{.max_mesh_members = 64, .in_cluster = true};

TEST(ValidateJoinTest, AValidRequestGivesShapeIndexAndKey) {
  JoinRequest req = Request({{"data", 2}, {"model", 4}}, {1, 2});
  req.scope = "team";
  absl::StatusOr<JoinSpec> spec = ValidateJoin(req, kLocal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->shape.names, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(spec->shape.sizes, (std::vector<int>{2, 4}));
  EXPECT_EQ(spec->members, 8);
  EXPECT_FALSE(spec->assign);
  EXPECT_EQ(spec->index, 1 * 4 + 2);  // row-major
  EXPECT_EQ(spec->key, "team/train");

  absl::StatusOr<JoinSpec> assigned = ValidateJoin(Request({{"i", 3}}), kLocal);
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_TRUE(assigned->assign);
  EXPECT_EQ(assigned->index, -1);
  EXPECT_EQ(assigned->key, "/train");
}

TEST(ValidateJoinTest, EachBadFieldIsNamed) {
  struct Case {
    JoinRequest req;
    JoinLimits limits;
    std::string says;
  };
  auto with = [](JoinRequest r, auto edit) {
    edit(r);
    return r;
  };
  const JoinRequest ok = Request({{"i", 2}}, {0});
  const std::vector<Case> cases = {
      {with(ok, [](auto& r) { r.mesh_name = ""; }), kLocal, "mesh_name '' must be 1 to 128"},
      {with(ok, [](auto& r) { r.mesh_name = "a b"; }), kLocal, "mesh_name 'a b'"},
      {Request({}), kLocal, "a mesh needs 1 to 8 axes; got 0"},
      {Request({{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}, {"e", 1}, {"f", 1}, {"g", 1}, {"h", 1},
                {"i", 1}}),
       kLocal, "a mesh needs 1 to 8 axes; got 9"},
      {Request({{"x/y", 2}}), kLocal, "axis name 'x/y' must be 1 to 64"},
      {Request({{"i", 2}, {"i", 2}}), kLocal, "axis name 'i' repeats"},
      {Request({{"i", 0}}), kLocal, "axis 'i' has size 0; must be >= 1"},
      {Request({{"i", 8}, {"j", 9}}), kLocal, "mesh has more than 64 members"},
      {Request({{"i", 2}}), kCluster, "give each member its coordinate"},
      {Request({{"i", 2}, {"j", 2}}, {0}), kLocal, "coordinate has 1 entries for 2 axes"},
      {Request({{"i", 2}}, {2}), kLocal, "coordinate 2 out of range for axis 'i' of size 2"},
      {Request({{"i", 2}}, {-1}), kLocal, "coordinate -1 out of range"},
      {with(ok, [](auto& r) { r.timeout_ms = -1; }), kLocal, "timeouts must be >= 0"},
      {with(ok, [](auto& r) { r.op_timeout_ms = -5; }), kLocal, "timeouts must be >= 0"},
      {with(ok, [](auto& r) { r.scope = "a/b"; }), kLocal, "scope 'a/b' must be up to 128"},
      {with(ok, [](auto& r) { r.join_token = std::string(257, 't'); }), kLocal,
       "join_token is longer than 256 bytes"},
      {with(ok,
            [](auto& r) {
              r.mesh_name = std::string(128, 'n');
              r.scope = std::string(60, 's');
            }),
       kCluster, "in a cluster, a mesh's scope and name together must be at most 179"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<JoinSpec> spec = ValidateJoin(c.req, c.limits);
    ASSERT_FALSE(spec.ok()) << c.says;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    EXPECT_NE(spec.status().message().find(c.says), std::string::npos)
        << "'" << spec.status().message() << "' lacks '" << c.says << "'";
  }
  // The long key is fine on a daemon of its own.
  JoinRequest long_key = ok;
  long_key.mesh_name = std::string(128, 'n');
  long_key.scope = std::string(60, 's');
  EXPECT_TRUE(ValidateJoin(long_key, kLocal).ok());
}

TEST(ValidateJoinTest, NamesAllowTheirOwnCharactersOnly) {
  EXPECT_TRUE(ValidName("a.b-c_9", 64, ".-"));
  EXPECT_FALSE(ValidName("a:b", 64, ".-"));
  EXPECT_TRUE(ValidName("a:b/c", 128, ".:/-"));
  EXPECT_FALSE(ValidName(std::string(65, 'a'), 64, ""));
  EXPECT_FALSE(ValidName("", 64, ""));
  EXPECT_EQ(MeshKey("", "m"), "/m");
}

}  // namespace
}  // namespace collectived
