#include "daemon/server/wire.h"

#include <string>

namespace collectived {
namespace {

void AddBuffers(const std::vector<DeviceBuffers>& by_device,
                google::protobuf::RepeatedPtrField<v1::DeviceBufferStats>* out) {
  for (const DeviceBuffers& d : by_device) {
    v1::DeviceBufferStats* s = out->Add();
    s->set_device(d.device);
    s->set_kind(d.kind);
    s->set_buffers(d.buffers);
    s->set_buffer_bytes(d.buffer_bytes);
  }
}

}  // namespace

JoinRequest FromProto(const v1::JoinMeshRequest& req) {
  JoinRequest r;
  r.session_id = req.session_id();
  r.mesh_name = req.mesh_name();
  r.axes.reserve(req.axes_size());
  for (const v1::Axis& a : req.axes()) r.axes.push_back(AxisRequest{a.name(), a.size()});
  r.coordinate.assign(req.coordinate().begin(), req.coordinate().end());
  r.timeout_ms = req.timeout_ms();
  r.op_timeout_ms = req.op_timeout_ms();
  r.scope = req.scope();
  r.join_token = req.join_token();
  return r;
}

v1::CreateSessionResponse ToProto(const NewSession& session) {
  v1::CreateSessionResponse resp;
  resp.set_session_id(session.session_id);
  resp.set_attach_token(session.attach_token);
  resp.set_side_socket_path(session.side_socket_path);
  resp.set_attach_timeout_ms(session.attach_timeout_ms);
  resp.set_daemon_id(session.daemon_id);
  return resp;
}

v1::Member ToProto(const MemberView& member) {
  v1::Member m;
  m.set_index(member.index);
  for (int c : member.coordinate) m.add_coordinate(c);
  m.set_session_id(member.session_id);
  m.set_client_name(member.client_name);
  m.set_pid(member.pid);
  m.set_host(member.host);
  m.set_member_side_ops(member.member_side_ops);
  return m;
}

v1::MeshInfo ToProto(const MeshView& mesh) {
  v1::MeshInfo info;
  info.set_mesh_id(mesh.mesh_id);
  info.set_name(mesh.name);
  info.set_scope(mesh.scope);
  for (size_t i = 0; i < mesh.shape.names.size(); ++i) {
    v1::Axis* a = info.add_axes();
    a->set_name(mesh.shape.names[i]);
    a->set_size(mesh.shape.sizes[i]);
  }
  info.set_generation(mesh.generation);
  info.set_state(mesh.state);
  for (const MemberView& m : mesh.members) *info.add_members() = ToProto(m);
  info.set_op_timeout_ms(mesh.op_timeout_ms);
  info.set_completed_ops(mesh.completed_ops);
  info.set_member_op_bytes(mesh.member_op_bytes);
  info.set_member_side_ops(mesh.member_side_ops);
  return info;
}

v1::JoinMeshResponse ToProto(const Joined& joined) {
  v1::JoinMeshResponse resp;
  *resp.mutable_mesh() = ToProto(joined.mesh);
  *resp.mutable_self() = ToProto(joined.self);
  return resp;
}

v1::BufferInfo ToProto(const BufferView& buffer) {
  v1::BufferInfo info;
  info.set_buffer_id(buffer.buffer_id);
  info.set_size_bytes(buffer.size_bytes);
  info.set_kind(buffer.kind);
  info.set_device(buffer.device);
  return info;
}

v1::SubmitResponse ToProto(const Accepted& accepted) {
  v1::SubmitResponse resp;
  resp.set_op_id(accepted.op_id);
  resp.set_sequence(accepted.sequence);
  for (int64_t d : accepted.out_shape) resp.add_out_shape(d);
  resp.set_out_dtype(ToProto(accepted.out_dtype));
  return resp;
}

v1::WaitResponse ToProto(const Waited& waited) {
  v1::WaitResponse resp;
  resp.set_op_id(waited.op_id);
  resp.set_sequence(waited.sequence);
  return resp;
}

v1::ListSessionsResponse ToProto(const std::vector<SessionView>& sessions) {
  v1::ListSessionsResponse resp;
  for (const SessionView& s : sessions) {
    v1::SessionInfo* info = resp.add_sessions();
    info->set_session_id(s.session_id);
    info->set_client_name(s.client_name);
    info->set_pid(s.pid);
    info->set_uid(s.uid);
    info->set_attached(s.attached);
    info->set_buffers(s.buffers);
    info->set_buffer_bytes(s.buffer_bytes);
    AddBuffers(s.buffers_by_device, info->mutable_buffers_by_device());
    for (const std::string& id : s.mesh_ids) info->add_mesh_ids(id);
    info->set_ops_submitted(s.ops_submitted);
  }
  return resp;
}

v1::ListMeshesResponse ToProto(const std::vector<MeshView>& meshes) {
  v1::ListMeshesResponse resp;
  for (const MeshView& m : meshes) *resp.add_meshes() = ToProto(m);
  return resp;
}

v1::ListPendingOpsResponse ToProto(const std::vector<PendingOpView>& ops) {
  v1::ListPendingOpsResponse resp;
  for (const PendingOpView& op : ops) {
    v1::PendingOp* p = resp.add_ops();
    p->set_mesh_id(op.mesh_id);
    p->set_mesh_name(op.mesh_name);
    p->set_sequence(op.sequence);
    p->set_description(op.description);
    for (int32_t m : op.submitted) p->add_submitted(m);
    for (int32_t m : op.missing) p->add_missing(m);
    for (int32_t m : op.elsewhere) p->add_elsewhere(m);
    p->set_state(op.state);
    p->set_age_ms(op.age_ms);
    p->set_deadline_ms(op.deadline_ms);
    p->set_member_side(op.member_side);
    p->set_member_op(op.member_op);
  }
  return resp;
}

v1::GetStatsResponse ToProto(const EngineStats& stats) {
  v1::GetStatsResponse resp;
  resp.set_daemon_id(stats.daemon_id);
  resp.set_uptime_ms(stats.uptime_ms);
  resp.set_sessions(stats.sessions);
  resp.set_meshes(stats.meshes);
  resp.set_buffers(stats.buffers);
  resp.set_buffer_bytes(stats.buffer_bytes);
  resp.set_ops_completed(stats.ops_completed);
  resp.set_ops_failed(stats.ops_failed);
  for (const KindStats& k : stats.by_kind) {
    v1::OpKindStats* out = resp.add_by_kind();
    out->set_kind(std::string(OpKindName(k.kind)));
    out->set_completed(k.completed);
    out->set_failed(k.failed);
    out->set_bytes(k.bytes);
    out->set_bytes_read(k.bytes_read);
    out->set_bytes_written(k.bytes_written);
    out->set_bytes_required(k.bytes_required);
  }
  resp.set_executor_threads(stats.executor_threads);
  AddBuffers(stats.buffers_by_device, resp.mutable_buffers_by_device());
  if (stats.cluster.has_value()) {
    const ClusterView& from = *stats.cluster;
    v1::ClusterStats* c = resp.mutable_cluster();
    c->set_host_id(from.host_id);
    c->set_state(from.state);
    c->set_coordinator(from.coordinator);
    c->set_serves_coordinator(from.serves_coordinator);
    c->set_last_error(from.last_error);
    c->set_meshes_across_hosts(from.meshes_across_hosts);
    c->set_ops_across_hosts(from.ops_across_hosts);
    c->set_ops_across_hosts_failed(from.ops_across_hosts_failed);
  }
  resp.set_submitted_fast_path(stats.submitted_fast_path);
  resp.set_submitted_execute(stats.submitted_execute);
  resp.set_submitted_unary(stats.submitted_unary);
  resp.set_member_side_ops(stats.member_side_ops);
  resp.set_member_segment_bytes(stats.member_segment_bytes);
  resp.set_member_side_sessions(stats.member_side_sessions);
  return resp;
}

}  // namespace collectived
