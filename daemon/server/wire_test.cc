// The server's edge: every field of the wire format reaches the engine's
// types and comes back, and what a client may send out of range (an op kind
// or dtype the daemon does not know) is carried to the checks that name it.
#include "daemon/server/wire.h"

#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>

namespace collectived {
namespace {

using google::protobuf::util::MessageDifferencer;

v1::OpSpec FullSpec() {
  v1::OpSpec op;
  op.set_mesh_id("m-1");
  op.set_kind(v1::ALL_GATHER);
  op.add_axes("x");
  op.add_axes("y");
  op.set_dtype(v1::BFLOAT16);
  op.add_shape(3);
  op.add_shape(5);
  op.mutable_input()->set_buffer_id("b-in");
  op.mutable_input()->set_offset(64);
  op.mutable_input()->set_size_bytes(30);
  op.mutable_output()->set_buffer_id("b-out");
  op.mutable_output()->set_offset(128);
  op.mutable_all_gather()->set_axis(-1);
  op.mutable_all_gather()->set_tiled(true);
  op.set_timeout_ms(250);
  op.mutable_stream_sync()->mutable_ready()->set_buffer_id("b-w");
  op.mutable_stream_sync()->mutable_done()->set_buffer_id("b-w");
  op.mutable_stream_sync()->mutable_done()->set_offset(8);
  op.mutable_stream_sync()->set_value(7);
  return op;
}

TEST(WireTest, AnOpCarriesEveryField) {
  const OpRequest r = FromProto(FullSpec());
  EXPECT_EQ(r.mesh_id, "m-1");
  EXPECT_EQ(r.kind, OpKind::kAllGather);
  EXPECT_EQ(r.axes, (std::vector<std::string>{"x", "y"}));
  EXPECT_FALSE(r.no_axes);
  EXPECT_EQ(r.dtype, DType::kBF16);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(r.input.buffer_id, "b-in");
  EXPECT_EQ(r.input.offset, 64);
  EXPECT_EQ(r.input.size_bytes, std::optional<int64_t>(30));
  ASSERT_TRUE(r.output.has_value());
  EXPECT_EQ(r.output->buffer_id, "b-out");
  EXPECT_EQ(r.output->offset, 128);
  EXPECT_FALSE(r.output->size_bytes.has_value());
  EXPECT_EQ(r.all_gather.axis, -1);
  EXPECT_TRUE(r.all_gather.tiled);
  EXPECT_EQ(r.timeout_ms, 250);
  ASSERT_TRUE(r.stream_sync.has_value());
  EXPECT_EQ(r.stream_sync->ready.buffer_id, "b-w");
  EXPECT_EQ(r.stream_sync->ready.offset, 0);
  EXPECT_EQ(r.stream_sync->done.offset, 8);
  EXPECT_EQ(r.stream_sync->value, 7u);
}

TEST(WireTest, UnsetRegionsAndTheOtherKindsParameters) {
  v1::OpSpec op;
  op.set_kind(v1::PPERMUTE);
  op.set_no_axes(true);
  v1::PermutePair* p = op.mutable_ppermute()->add_perm();
  p->set_source(0);
  p->set_dest(1);
  p = op.mutable_ppermute()->add_perm();
  p->set_source(1);
  p->set_dest(0);
  OpRequest r = FromProto(op);
  EXPECT_TRUE(r.no_axes);
  EXPECT_FALSE(r.output.has_value()) << "unset: in place";
  EXPECT_FALSE(r.stream_sync.has_value());
  EXPECT_FALSE(r.input.size_bytes.has_value());
  EXPECT_EQ(r.perm, (std::vector<std::pair<int, int>>{{0, 1}, {1, 0}}));

  op.Clear();
  op.mutable_psum_scatter()->set_scatter_dimension(2);
  op.mutable_psum_scatter()->set_tiled(true);
  r = FromProto(op);
  EXPECT_EQ(r.psum_scatter.scatter_dimension, 2);
  EXPECT_TRUE(r.psum_scatter.tiled);
  EXPECT_FALSE(r.all_gather.tiled) << "only the oneof's case is read";

  op.Clear();
  op.mutable_all_to_all()->set_split_axis(1);
  op.mutable_all_to_all()->set_concat_axis(-1);
  op.mutable_all_to_all()->set_tiled(true);
  r = FromProto(op);
  EXPECT_EQ(r.all_to_all.split_axis, 1);
  EXPECT_EQ(r.all_to_all.concat_axis, -1);
  EXPECT_TRUE(r.all_to_all.tiled);

  op.Clear();
  op.mutable_broadcast()->set_root(3);
  EXPECT_EQ(FromProto(op).root, 3);
}

// The fast path converts every op into one request: nothing of an op may
// stay behind for the next.
TEST(WireTest, ConvertingIntoARequestLeavesNothingOfTheOpBefore) {
  OpRequest r;
  v1::OpSpec permute = FullSpec();
  v1::PermutePair* p = permute.mutable_ppermute()->add_perm();
  p->set_source(1);
  p->set_dest(0);
  FromProto(permute, r);
  ASSERT_EQ(r.perm.size(), 1u);
  FromProto(FullSpec(), r);
  EXPECT_TRUE(r.perm.empty());
  EXPECT_TRUE(r.all_gather.tiled);

  v1::OpSpec plain;
  plain.set_kind(v1::PSUM);
  plain.mutable_input()->set_buffer_id("b");
  FromProto(plain, r);
  EXPECT_EQ(r.mesh_id, "");
  EXPECT_TRUE(r.axes.empty());
  EXPECT_TRUE(r.shape.empty());
  EXPECT_EQ(r.dtype, DType::kInvalid);
  EXPECT_EQ(r.input.buffer_id, "b");
  EXPECT_EQ(r.input.offset, 0);
  EXPECT_FALSE(r.input.size_bytes.has_value());
  EXPECT_FALSE(r.output.has_value());
  EXPECT_FALSE(r.stream_sync.has_value());
  EXPECT_EQ(r.all_gather.axis, 0);
  EXPECT_FALSE(r.all_gather.tiled);
  EXPECT_EQ(r.timeout_ms, 0);

  // And an op that has them again gets them back whole.
  FromProto(FullSpec(), r);
  ASSERT_TRUE(r.output.has_value());
  EXPECT_FALSE(r.output->size_bytes.has_value());
  ASSERT_TRUE(r.stream_sync.has_value());
  EXPECT_EQ(r.stream_sync->done.offset, 8);
}

TEST(WireTest, UnknownKindsAndDtypesReachPlanOpWhichNamesThem) {
  const MeshShape mesh{{"i"}, {2}};
  v1::OpSpec op;
  op.set_kind(static_cast<v1::OpKind>(42));
  absl::StatusOr<OpPlan> plan = PlanOp(FromProto(op), mesh);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("unknown op kind 42"), std::string::npos)
      << plan.status();

  op.set_kind(v1::PSUM);
  op.set_dtype(static_cast<v1::DType>(77));
  plan = PlanOp(FromProto(op), mesh);
  EXPECT_NE(plan.status().message().find("dtype 77 is not one of"), std::string::npos)
      << plan.status();
  // A number the request cannot carry is not mistaken for another one.
  op.set_dtype(static_cast<v1::DType>(256 + 1));
  EXPECT_EQ(FromProto(op).dtype, DType::kInvalid);
  plan = PlanOp(FromProto(op), mesh);
  EXPECT_NE(plan.status().message().find("dtype (unset or out of range) is not one of"),
            std::string::npos)
      << plan.status();
}

TEST(WireTest, AJoinCarriesEveryField) {
  v1::JoinMeshRequest req;
  req.set_session_id("s-1");
  req.set_mesh_name("train");
  v1::Axis* a = req.add_axes();
  a->set_name("data");
  a->set_size(2);
  a = req.add_axes();
  a->set_name("model");
  a->set_size(-3);  // carried as sent: ValidateJoin refuses it
  req.add_coordinate(1);
  req.add_coordinate(0);
  req.set_timeout_ms(100);
  req.set_op_timeout_ms(200);
  req.set_scope("team");
  req.set_join_token("secret");
  const JoinRequest r = FromProto(req);
  EXPECT_EQ(r.session_id, "s-1");
  EXPECT_EQ(r.mesh_name, "train");
  ASSERT_EQ(r.axes.size(), 2u);
  EXPECT_EQ(r.axes[0].name, "data");
  EXPECT_EQ(r.axes[0].size, 2);
  EXPECT_EQ(r.axes[1].size, -3);
  EXPECT_EQ(r.coordinate, (std::vector<int>{1, 0}));
  EXPECT_EQ(r.timeout_ms, 100);
  EXPECT_EQ(r.op_timeout_ms, 200);
  EXPECT_EQ(r.scope, "team");
  EXPECT_EQ(r.join_token, "secret");
}

TEST(WireTest, AMeshComesBackWithEveryField) {
  MeshView mesh;
  mesh.mesh_id = "m-1";
  mesh.name = "train";
  mesh.scope = "team";
  mesh.shape = MeshShape{{"x", "y"}, {2, 1}};
  mesh.generation = 3;
  mesh.state = "READY";
  mesh.op_timeout_ms = 5000;
  mesh.completed_ops = 12;
  mesh.member_op_bytes = 65536;
  mesh.member_side_ops = 9;
  mesh.members.push_back(MemberView{1, {1, 0}, "s-abc...", "worker", 42, "h1", 9});
  const v1::MeshInfo info = ToProto(mesh);

  v1::MeshInfo want;
  want.set_mesh_id("m-1");
  want.set_name("train");
  want.set_scope("team");
  v1::Axis* a = want.add_axes();
  a->set_name("x");
  a->set_size(2);
  a = want.add_axes();
  a->set_name("y");
  a->set_size(1);
  want.set_generation(3);
  want.set_state("READY");
  want.set_op_timeout_ms(5000);
  want.set_completed_ops(12);
  want.set_member_op_bytes(65536);
  want.set_member_side_ops(9);
  v1::Member* m = want.add_members();
  m->set_index(1);
  m->add_coordinate(1);
  m->add_coordinate(0);
  m->set_session_id("s-abc...");
  m->set_client_name("worker");
  m->set_pid(42);
  m->set_host("h1");
  m->set_member_side_ops(9);
  EXPECT_TRUE(MessageDifferencer::Equals(info, want)) << info.DebugString();

  const v1::JoinMeshResponse joined = ToProto(Joined{mesh, mesh.members[0]});
  EXPECT_TRUE(MessageDifferencer::Equals(joined.mesh(), want));
  EXPECT_TRUE(MessageDifferencer::Equals(joined.self(), want.members(0)));
}

TEST(WireTest, StatsShowTheClusterOnlyInOne) {
  EngineStats stats;
  stats.daemon_id = "host:1";
  stats.by_kind.push_back(KindStats{OpKind::kPsum, 3, 1, 96, 200, 100, 150});
  stats.buffers_by_device.push_back(DeviceBuffers{"cpu", "memfd", 2, 8192});
  stats.submitted_fast_path = 5;
  v1::GetStatsResponse resp = ToProto(stats);
  EXPECT_FALSE(resp.has_cluster()) << "a daemon of its own shows no cluster";
  EXPECT_EQ(resp.daemon_id(), "host:1");
  ASSERT_EQ(resp.by_kind_size(), 1);
  EXPECT_EQ(resp.by_kind(0).kind(), "psum");
  EXPECT_EQ(resp.by_kind(0).completed(), 3);
  EXPECT_EQ(resp.by_kind(0).failed(), 1);
  EXPECT_EQ(resp.by_kind(0).bytes(), 96);
  EXPECT_EQ(resp.by_kind(0).bytes_read(), 200);
  EXPECT_EQ(resp.by_kind(0).bytes_written(), 100);
  EXPECT_EQ(resp.by_kind(0).bytes_required(), 150);
  ASSERT_EQ(resp.buffers_by_device_size(), 1);
  EXPECT_EQ(resp.buffers_by_device(0).kind(), "memfd");
  EXPECT_EQ(resp.buffers_by_device(0).buffer_bytes(), 8192);
  EXPECT_EQ(resp.submitted_fast_path(), 5);

  stats.cluster.emplace();
  stats.cluster->host_id = "h2";
  stats.cluster->state = "joined";
  stats.cluster->ops_across_hosts_failed = 4;
  resp = ToProto(stats);
  ASSERT_TRUE(resp.has_cluster());
  EXPECT_EQ(resp.cluster().host_id(), "h2");
  EXPECT_EQ(resp.cluster().state(), "joined");
  EXPECT_EQ(resp.cluster().ops_across_hosts_failed(), 4);
}

TEST(WireTest, PendingOpsAndSessionsComeBackWithEveryField) {
  PendingOpView op;
  op.mesh_id = "m-1";
  op.mesh_name = "train";
  op.sequence = 4;
  op.description = "psum f32[8] over (i)";
  op.submitted = {0};
  op.missing = {2};
  op.elsewhere = {1};
  op.state = "waiting";
  op.age_ms = 10;
  op.deadline_ms = 90;
  const v1::ListPendingOpsResponse ops = ToProto(std::vector<PendingOpView>{op});
  ASSERT_EQ(ops.ops_size(), 1);
  const v1::PendingOp& p = ops.ops(0);
  EXPECT_EQ(p.mesh_name(), "train");
  EXPECT_EQ(p.sequence(), 4);
  EXPECT_EQ(p.description(), "psum f32[8] over (i)");
  EXPECT_EQ(p.missing_size(), 1);
  EXPECT_EQ(p.elsewhere(0), 1);
  EXPECT_EQ(p.state(), "waiting");
  EXPECT_EQ(p.deadline_ms(), 90);
  EXPECT_FALSE(p.member_side());

  SessionView s;
  s.session_id = "s-abc...";
  s.uid = 1000;
  s.attached = true;
  s.mesh_ids = {"m-1", "m-2"};
  s.buffers_by_device.push_back(DeviceBuffers{"cpu", "memfd", 1, 4096});
  const v1::ListSessionsResponse sessions = ToProto(std::vector<SessionView>{s});
  ASSERT_EQ(sessions.sessions_size(), 1);
  EXPECT_EQ(sessions.sessions(0).uid(), 1000);
  EXPECT_TRUE(sessions.sessions(0).attached());
  EXPECT_EQ(sessions.sessions(0).mesh_ids_size(), 2);
  EXPECT_EQ(sessions.sessions(0).buffers_by_device(0).buffer_bytes(), 4096);

  const v1::SubmitResponse accepted =
      ToProto(Accepted{7, 3, {2, 4}, DType::kF16});
  EXPECT_EQ(accepted.op_id(), 7);
  EXPECT_EQ(accepted.sequence(), 3);
  EXPECT_EQ(accepted.out_shape_size(), 2);
  EXPECT_EQ(accepted.out_dtype(), v1::FLOAT16);
}

}  // namespace
}  // namespace collectived
