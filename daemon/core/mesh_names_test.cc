// MeshNames alone: who holds a name, generations that never repeat, and the
// join token's hold across generations.
#include "daemon/core/mesh_names.h"

#include <gtest/gtest.h>

namespace collectived {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(MeshNamesTest, AHolderUntilReleasedAndGenerationsNeverRepeat) {
  MeshNames names(absl::Seconds(60));
  EXPECT_EQ(names.Holder("/train"), nullptr);
  EXPECT_EQ(names.Begin("/train", "m-1", ""), 1);
  ASSERT_NE(names.Holder("/train"), nullptr);
  EXPECT_EQ(*names.Holder("/train"), "m-1");
  EXPECT_EQ(names.Holder("job/train"), nullptr) << "another scope is another name";

  // Only the holder releases the name.
  names.Release("/train", "m-other");
  ASSERT_NE(names.Holder("/train"), nullptr);
  names.Release("/train", "m-1");
  EXPECT_EQ(names.Holder("/train"), nullptr);

  // The broken generation is still there; a new one forms beside it, and
  // generations count on after every mesh of the name went away.
  EXPECT_EQ(names.Begin("/train", "m-2", ""), 2);
  names.Release("/train", "m-2");
  names.MeshGone("/train", kT0);
  names.MeshGone("/train", kT0);
  EXPECT_EQ(names.Begin("/train", "m-3", ""), 3);
  EXPECT_EQ(*names.Holder("/train"), "m-3");
}

TEST(MeshNamesTest, ATokenBindsWhileAMeshExistsAndForTheHoldAfter) {
  MeshNames names(absl::Seconds(60));
  EXPECT_TRUE(names.CheckToken("/train", "train", "anything", kT0).ok()) << "a new name";
  names.Begin("/train", "m-1", "secret");
  names.Release("/train", "m-1");  // broke; its members have not left yet

  absl::Status st = names.CheckToken("/train", "train", "other", kT0 + absl::Hours(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("mesh 'train' needs the join token of its generation 1"),
            std::string::npos)
      << st;
  EXPECT_TRUE(names.CheckToken("/train", "train", "secret", kT0).ok());

  // The last mesh goes: the token binds for the hold, then not.
  names.MeshGone("/train", kT0);
  EXPECT_FALSE(names.CheckToken("/train", "train", "", kT0 + absl::Seconds(59)).ok());
  EXPECT_TRUE(names.CheckToken("/train", "train", "", kT0 + absl::Seconds(60)).ok());

  // The next generation's first member sets the token anew.
  EXPECT_EQ(names.Begin("/train", "m-2", "new"), 2);
  EXPECT_TRUE(names.CheckToken("/train", "train", "new", kT0).ok());
  EXPECT_FALSE(names.CheckToken("/train", "train", "secret", kT0).ok());
}

TEST(MeshNamesTest, AHoldOfZeroBindsOnlyWhileAMeshExists) {
  MeshNames names(absl::ZeroDuration());
  names.Begin("/m", "m-1", "t");
  EXPECT_FALSE(names.CheckToken("/m", "m", "", kT0).ok());
  names.Release("/m", "m-1");
  names.MeshGone("/m", kT0);
  EXPECT_TRUE(names.CheckToken("/m", "m", "", kT0).ok());
}

}  // namespace
}  // namespace collectived
