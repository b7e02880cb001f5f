// The SDK's Array size helpers.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "collectived/client.h"

namespace collectived {
namespace {

TEST(ArrayTest, SizesOfOrdinaryShapes) {
  EXPECT_EQ((Array{nullptr, 0, DType::kF32, {}}).num_elements(), 1);
  EXPECT_EQ((Array{nullptr, 0, DType::kF32, {}}).num_bytes(), 4u);
  EXPECT_EQ((Array{nullptr, 0, DType::kF64, {3, 5}}).num_bytes(), 120u);
  EXPECT_EQ((Array{nullptr, 0, DType::kF16, {0, 7}}).num_bytes(), 0u);
  EXPECT_EQ((Array{nullptr, 0, DType::kF8E4M3FN, {3, 7}}).num_bytes(), 21u);
  EXPECT_EQ((Array{nullptr, 0, DType::kF8E5M2, {5}}).num_bytes(), 5u);
}

// Overflowing or negative shapes are reported, not wrapped around: a
// zero dimension does not hide an overflowing product of the others.
TEST(ArrayTest, SizesThatOverflowAreReported) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  constexpr size_t kNoSize = std::numeric_limits<size_t>::max();
  EXPECT_EQ((Array{nullptr, 0, DType::kF32, {kHuge, 4}}).num_elements(), -1);
  EXPECT_EQ((Array{nullptr, 0, DType::kF32, {kHuge, 4}}).num_bytes(), kNoSize);
  EXPECT_EQ((Array{nullptr, 0, DType::kU8, {kHuge, 4, 0}}).num_elements(), -1);
  EXPECT_EQ((Array{nullptr, 0, DType::kF32, {2, -3}}).num_elements(), -1);
  EXPECT_EQ((Array{nullptr, 0, DType::kF32, {2, -3}}).num_bytes(), kNoSize);
  // The element count fits, the byte count does not.
  EXPECT_EQ((Array{nullptr, 0, DType::kF64, {kHuge}}).num_elements(), kHuge);
  EXPECT_EQ((Array{nullptr, 0, DType::kF64, {kHuge}}).num_bytes(), kNoSize);
}

}  // namespace
}  // namespace collectived
