// ResolveBuffers alone: the regions a submission names among its session's
// buffers, and every way they can be wrong, with the words used.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "daemon/core/engine.h"
#include "daemon/memory/shared_buffer.h"
#include "plan/wire_plan.h"

namespace collectived {
namespace {

using Buffers = BufferTable;

OpRequest Psum(int64_t elems, const std::string& in, int64_t in_offset) {
  OpRequest op;
  op.mesh_id = "m";
  op.kind = OpKind::kPsum;
  op.dtype = DType::kF32;
  op.shape.push_back(elems);
  op.input.buffer_id = in;
  op.input.offset = in_offset;
  return op;
}

OpPlan Plan(const OpRequest& op) {
  MeshShape shape{{"i"}, {2}};
  absl::StatusOr<OpPlan> plan = PlanOp(op, shape);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : OpPlan{};
}

class ResolveBuffersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* id : {"a", "b"}) {
      auto b = CreateMemfdBuffer(4096);
      ASSERT_TRUE(b.ok()) << b.status();
      buffers_[id] = *b;
    }
  }
  Buffers buffers_;
};

TEST_F(ResolveBuffersTest, InPlaceAndIntoAnOutputResolveTheirRegions) {
  const OpRequest in_place = Psum(16, "a", 64);
  SubmittedBuffers got;
  ASSERT_TRUE(ResolveBuffers(in_place, Plan(in_place), buffers_, got).ok());
  EXPECT_EQ(got.in_buf, buffers_["a"]);
  EXPECT_EQ(got.out_buf, buffers_["a"]);
  EXPECT_EQ(got.in_offset, 64u);
  EXPECT_EQ(got.out_offset, 64u);

  OpRequest into = Psum(16, "a", 0);
  into.output = BufferRegion{"b"};
  into.output->offset = 128;
  into.output->size_bytes = 64;
  got = {};
  ASSERT_TRUE(ResolveBuffers(into, Plan(into), buffers_, got).ok());
  EXPECT_EQ(got.out_buf, buffers_["b"]);
  EXPECT_EQ(got.out_offset, 128u);

  OpRequest barrier;
  barrier.mesh_id = "m";
  barrier.kind = OpKind::kBarrier;
  got = {};
  ASSERT_TRUE(ResolveBuffers(barrier, Plan(barrier), buffers_, got).ok());
  EXPECT_EQ(got.in_buf, nullptr);  // a barrier names no buffer
}

TEST_F(ResolveBuffersTest, EachBadRegionIsRefusedWithItsReason) {
  struct Case {
    OpRequest op;
    absl::StatusCode code;
    std::string says;
  };
  auto with = [](OpRequest op, auto edit) {
    edit(op);
    return op;
  };
  const OpRequest ok = Psum(16, "a", 0);
  const std::vector<Case> cases = {
      {Psum(16, "", 0), absl::StatusCode::kInvalidArgument, "input buffer_id is empty"},
      {Psum(16, "zz", 0), absl::StatusCode::kNotFound, "input buffer 'zz' not found"},
      {Psum(16, "a", 4064), absl::StatusCode::kOutOfRange, "exceeds buffer 'a' of 4096 bytes"},
      {Psum(16, "a", -4), absl::StatusCode::kOutOfRange, "input offset -4 is negative"},
      {Psum(16, "a", 2), absl::StatusCode::kInvalidArgument, "not a multiple of the element size 4"},
      {with(ok, [](OpRequest& o) { o.input.size_bytes = 32; }),
       absl::StatusCode::kInvalidArgument, "input region of 32 bytes is smaller than the input"},
      {with(ok, [](OpRequest& o) { o.output = BufferRegion{"zz"}; }),
       absl::StatusCode::kNotFound, "output buffer 'zz' not found"},
      {with(ok,
            [](OpRequest& o) {
              o.output = BufferRegion{"b"};
              o.output->size_bytes = 8;
            }),
       absl::StatusCode::kInvalidArgument, "output region of 8 bytes is smaller than the result"},
      {with(ok,
            [](OpRequest& o) {
              o.output = BufferRegion{"a"};
              o.output->offset = 32;
            }),
       absl::StatusCode::kInvalidArgument, "overlap without being the same region"},
  };
  for (const Case& c : cases) {
    SubmittedBuffers got;
    const absl::Status st = ResolveBuffers(c.op, Plan(c.op), buffers_, got);
    EXPECT_EQ(st.code(), c.code) << c.says << ": " << st;
    EXPECT_NE(st.message().find(c.says), std::string::npos)
        << "'" << st.message() << "' lacks '" << c.says << "'";
  }
}

TEST_F(ResolveBuffersTest, AResultOfAnotherSizeNeedsAnOutput) {
  OpRequest op = Psum(16, "a", 0);
  op.kind = OpKind::kPmean;
  op.dtype = DType::kI32;  // pmean of int32 gives float32: same size, in place is fine
  SubmittedBuffers got;
  EXPECT_TRUE(ResolveBuffers(op, Plan(op), buffers_, got).ok());
  op.dtype = DType::kI8;  // int8 -> float32: four times the bytes
  const absl::Status st = ResolveBuffers(op, Plan(op), buffers_, got);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("does not fit in place of the input"), std::string::npos) << st;
}

}  // namespace
}  // namespace collectived
