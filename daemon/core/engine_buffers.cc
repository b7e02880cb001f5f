// The engine's buffers: allocation within the quotas, mesh-shared
// buffers, freeing, lookups; and the member-side segments handed to members.
#include "daemon/core/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "collectived/member_ops_code.h"
#include "common/fast_queue.h"
#include "daemon/core/engine_internal.h"
#include "daemon/core/join_request.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {

using namespace engine_internal;  // NOLINT(build/namespaces): the engine's own helpers

namespace {

// A buffer the members of a mesh share: the allocator's buffer, marked with
// the mesh (SharedBuffer::shared_mesh).
class MeshSharedBuffer final : public SharedBuffer {
 public:
  MeshSharedBuffer(std::shared_ptr<SharedBuffer> inner, std::string mesh_id)
      : inner_(std::move(inner)), mesh_id_(std::move(mesh_id)) {}
  void* data() const override { return inner_->data(); }
  size_t size() const override { return inner_->size(); }
  int fd() const override { return inner_->fd(); }
  absl::string_view kind() const override { return inner_->kind(); }
  std::string device() const override { return inner_->device(); }
  int device_ordinal() const override { return inner_->device_ordinal(); }
  absl::string_view shared_mesh() const override { return mesh_id_; }

 private:
  const std::shared_ptr<SharedBuffer> inner_;
  const std::string mesh_id_;
};

BufferView InfoOf(const std::string& id, const SharedBuffer& buffer) {
  return BufferView{id, static_cast<int64_t>(buffer.size()), std::string(buffer.kind()),
                    buffer.device()};
}

}  // namespace

absl::Status Engine::CheckBufferQuota(const Session& session, uint64_t bytes, bool gpu) const {
  if (static_cast<int>(session.buffers.size()) >= options_.max_buffers_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat("session has ", session.buffers.size(),
                                                     " buffers; the limit is ",
                                                     options_.max_buffers_per_session));
  }
  if (!FitsBufferQuota(session, bytes, gpu)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session holds ", gpu ? session.gpu_buffer_bytes : session.buffer_bytes, " ",
        gpu ? "GPU" : "host", " buffer bytes; ", bytes, " more exceeds the limit of ",
        gpu ? options_.max_gpu_buffer_bytes_per_session : options_.max_buffer_bytes_per_session));
  }
  return absl::OkStatus();
}

bool Engine::FitsBufferQuota(const Session& session, uint64_t bytes, bool gpu) const {
  const uint64_t held = gpu ? session.gpu_buffer_bytes : session.buffer_bytes;
  const uint64_t limit =
      gpu ? options_.max_gpu_buffer_bytes_per_session : options_.max_buffer_bytes_per_session;
  return held <= limit && bytes <= limit - held;
}

absl::StatusOr<std::pair<Engine::Mesh*, int>> Engine::SharedBufferMember(
    Session& session, const std::string& mesh_id) {
  auto m = session.meshes.find(mesh_id);
  auto it = meshes_.find(mesh_id);
  if (m == session.meshes.end() || it == meshes_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a buffer shared by mesh '", mesh_id, "': this session is not a member of that mesh"));
  }
  Mesh& mesh = *it->second;
  if (mesh.state == MeshState::kBroken) {
    return absl::AbortedError(absl::StrCat("mesh '", mesh.name, "' generation ", mesh.generation,
                                           " is broken: ", mesh.broken_reason));
  }
  if (mesh.state != MeshState::kReady) {
    return absl::FailedPreconditionError(
        absl::StrCat("mesh '", mesh.name, "' is still forming: shared buffers once it is ready"));
  }
  mesh.shared_asked.resize(mesh.shape.num_members(), 0);
  return std::make_pair(&mesh, m->second);
}

absl::StatusOr<BufferView> Engine::AttachSharedBuffer(Session& session, Mesh& mesh, int index,
                                                      bool made_now, int64_t size_bytes,
                                                      const DeviceSpec& spec) {
  const size_t k = mesh.shared_asked[index];
  auto e = mesh.shared.find(k);
  if (e == mesh.shared.end()) return absl::InternalError(absl::StrCat("no shared buffer ", k));
  const Mesh::Shared& shared = e->second;
  // Once every member has asked for number k, nobody asks for it again.
  auto asked = [&] {
    ++mesh.shared_asked[index];
    if (*std::min_element(mesh.shared_asked.begin(), mesh.shared_asked.end()) > k) {
      mesh.shared.erase(e);
    }
  };
  std::shared_ptr<SharedBuffer> buffer = shared.buffer.lock();
  // Gone once no member's session holds it: a reference the daemon keeps a
  // moment longer (a descriptor on its way) does not keep it for later
  // members.
  bool held = made_now;
  for (size_t i = 0; buffer != nullptr && !held && i < mesh.member_session.size(); ++i) {
    const std::string& sid = mesh.member_session[i];
    Session* holder = sid.empty() ? nullptr : FindSession(sid);
    held = holder != nullptr && holder->buffers.count(shared.id) > 0;
  }
  if (buffer == nullptr || !held) {
    // This member's k-th request is answered (the next one asks for k+1).
    const int creator = shared.creator;
    asked();
    return absl::FailedPreconditionError(absl::StrCat(
        "shared buffer ", k, " of mesh '", mesh.name, "' (made by member ", creator,
        ") was freed by every member that held it before member ", index,
        " asked for it; its next request gets the next shared buffer"));
  }
  if (size_bytes != shared.size_bytes || buffer->device() != spec.ToString()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared buffer ", k, " of mesh '", mesh.name, "' is ", shared.size_bytes, " bytes on ",
        buffer->device(), " (member ", shared.creator, " asked first) but member ", index,
        " asks for ", size_bytes, " bytes on ", spec.ToString(),
        "; every member must ask for the same"));
  }
  if (absl::Status st = CheckBufferQuota(session, buffer->size(), /*gpu=*/false); !st.ok()) {
    return st;
  }
  if (session.buffers.count(shared.id) > 0) {
    return absl::InternalError(absl::StrCat("shared buffer '", shared.id, "' already held"));
  }
  const BufferView info = InfoOf(shared.id, *buffer);
  session.buffers.emplace(shared.id, std::move(buffer));
  session.buffer_bytes += static_cast<uint64_t>(info.size_bytes);
  asked();
  return info;
}

absl::StatusOr<BufferAllocator*> Engine::CheckAllocationLocked(
    const std::string& session_id, int64_t size_bytes, const absl::StatusOr<DeviceSpec>& spec,
    const std::string& mesh_id, std::optional<BufferView>* attached) {
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  if (!spec.ok()) return spec.status();
  const bool gpu = spec->kind != DeviceSpec::Kind::kCpu;
  auto a = allocators_.find(spec->buffer_kind());
  if (a == allocators_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", spec->ToString(), ": this daemon has no usable ",
        KindLabel(spec->buffer_kind()), " allocator: ", NoAllocatorReason(spec->buffer_kind())));
  }
  if (size_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes must be >= 1; got ", size_bytes));
  }
  if (static_cast<uint64_t>(size_bytes) > options_.max_buffer_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size_bytes ", size_bytes, " exceeds the per-buffer limit of ", options_.max_buffer_size));
  }
  if (absl::Status st = CheckBufferQuota(*session, static_cast<uint64_t>(size_bytes), gpu);
      !st.ok()) {
    return st;
  }
  if (mesh_id.empty()) return a->second;
  if (gpu) {
    return absl::UnimplementedError(absl::StrCat(
        "device ", spec->ToString(), ": buffers shared by a mesh are host memory so far"));
  }
  auto member = SharedBufferMember(*session, mesh_id);
  if (!member.ok()) return member.status();
  auto [mesh, index] = *member;
  if (mesh->shared_asked[index] < mesh->shared_made) {
    auto info = AttachSharedBuffer(*session, *mesh, index, /*made_now=*/false, size_bytes, *spec);
    if (!info.ok()) return info.status();
    *attached = *std::move(info);
    return nullptr;
  }
  if (static_cast<int>(mesh->shared.size()) >= options_.max_buffers_per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mesh '", mesh->name, "' has ", mesh->shared.size(),
                     " shared buffers not yet asked for by every member; the limit is ",
                     options_.max_buffers_per_session));
  }
  return a->second;
}

absl::StatusOr<BufferView> Engine::AllocateBuffer(const std::string& session_id,
                                                  int64_t size_bytes, const std::string& device,
                                                  const std::string& mesh_id) {
  const absl::StatusOr<DeviceSpec> spec = ParseDevice(device);
  BufferAllocator* allocator = nullptr;
  {
    MutexLock lock(&mu_);
    std::optional<BufferView> attached;
    auto a = CheckAllocationLocked(session_id, size_bytes, spec, mesh_id, &attached);
    if (!a.ok()) return a.status();
    if (attached.has_value()) return *std::move(attached);
    allocator = *a;
  }
  const bool gpu = spec->kind != DeviceSpec::Kind::kCpu;
  // Allocate outside the lock: faulting in pages takes time.
  auto buffer = allocator->Allocate(static_cast<size_t>(size_bytes), *spec);
  if (!buffer.ok()) return buffer.status();
  if ((*buffer)->kind() != allocator->kind()) {
    return absl::InternalError(absl::StrCat("the ", allocator->kind(), " allocator made a ",
                                            (*buffer)->kind(), " buffer"));
  }
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  if (!mesh_id.empty()) {
    auto member = SharedBufferMember(*session, mesh_id);
    if (!member.ok()) return member.status();
    auto [mesh, index] = *member;
    // Another member's call may have made it meanwhile: then this one's
    // allocation is dropped.
    if (mesh->shared_asked[index] < mesh->shared_made) {
      return AttachSharedBuffer(*session, *mesh, index, /*made_now=*/false, size_bytes, *spec);
    }
    // Made only if this session can hold it: a failed call leaves nothing.
    std::shared_ptr<SharedBuffer> shared =
        std::make_shared<MeshSharedBuffer>(*std::move(buffer), mesh_id);
    if (absl::Status st = CheckBufferQuota(*session, shared->size(), /*gpu=*/false); !st.ok()) {
      return st;
    }
    mesh->shared[mesh->shared_made++] = Mesh::Shared{RandomId("b-"), shared, size_bytes, index};
    return AttachSharedBuffer(*session, *mesh, index, /*made_now=*/true, size_bytes, *spec);
  }
  if (static_cast<int>(session->buffers.size()) >= options_.max_buffers_per_session ||
      !FitsBufferQuota(*session, (*buffer)->size(), gpu)) {
    return absl::ResourceExhaustedError("buffer quota exceeded by concurrent allocations");
  }
  const BufferView info = InfoOf(RandomId("b-"), **buffer);
  (gpu ? session->gpu_buffer_bytes : session->buffer_bytes) += (*buffer)->size();
  session->buffers.emplace(info.buffer_id, *std::move(buffer));
  return info;
}

absl::Status Engine::FreeBuffer(const std::string& session_id, const std::string& buffer_id) {
  std::shared_ptr<SharedBuffer> released;  // unmapped outside the lock
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  Session* session = *s;
  auto it = session->buffers.find(buffer_id);
  if (it == session->buffers.end()) {
    return absl::NotFoundError(absl::StrCat("buffer '", buffer_id, "' not found in this session"));
  }
  (it->second->kind() == "memfd" ? session->buffer_bytes : session->gpu_buffer_bytes) -=
      it->second->size();
  released = std::move(it->second);
  session->buffers.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Engine::GetBuffer(const std::string& session_id,
                                                                const std::string& buffer_id) {
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  auto it = (*s)->buffers.find(buffer_id);
  if (it == (*s)->buffers.end()) {
    return absl::NotFoundError(absl::StrCat("buffer '", buffer_id, "' not found in this session"));
  }
  return it->second;
}

absl::StatusOr<const Engine::Mesh*> Engine::SegmentMeshLocked(const Session& s,
                                                              const std::string& mesh_id,
                                                              int* index) const {
  auto mine = s.meshes.find(mesh_id);
  if (mine == s.meshes.end()) {
    return absl::NotFoundError(absl::StrCat(
        "mesh '", mesh_id, "' not found among this session's meshes (join it first)"));
  }
  *index = mine->second;
  const Mesh& mesh = *meshes_.at(mesh_id);
  if (mesh.state == MeshState::kBroken) {
    return absl::AbortedError(absl::StrCat("mesh '", mesh.name, "' generation ", mesh.generation,
                                           " is broken: ", mesh.broken_reason));
  }
  if (!mesh.segment) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh '", mesh.name, "' has no member-side segment (",
        mesh.state == MeshState::kForming ? "it has not formed yet"
        : mesh.cluster                    ? "it may span hosts"
                                          : "member-side ops are off on this daemon",
        ")"));
  }
  return &mesh;
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Engine::GetMemberSegment(
    const std::string& session_id, const std::string& mesh_id) {
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  int index = -1;
  absl::StatusOr<const Mesh*> mesh = SegmentMeshLocked(**s, mesh_id, &index);
  if (!mesh.ok()) return mesh.status();
  if (!(*s)->member_side) {
    (*s)->member_side = true;
    member_side_sessions_.fetch_add(1, std::memory_order_relaxed);
  }
  return (*mesh)->segment;
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> Engine::GetPeerBuffer(
    const std::string& session_id, const std::string& mesh_id, int member,
    const std::string& buffer_id) {
  MutexLock lock(&mu_);
  auto s = GetSession(session_id);
  if (!s.ok()) return s.status();
  int index = -1;
  absl::StatusOr<const Mesh*> found = SegmentMeshLocked(**s, mesh_id, &index);
  if (!found.ok()) return found.status();
  const Mesh& mesh = **found;
  if (member < 0 || member >= static_cast<int>(mesh.member_session.size()) || member == index) {
    return absl::InvalidArgumentError(absl::StrCat(
        "member ", member, " is not another member of mesh '", mesh.name, "' (it has ",
        mesh.member_session.size(), "; this session is member ", index, ")"));
  }
  auto peer = GetSession(mesh.member_session[member]);
  if (!peer.ok()) {
    return absl::NotFoundError(absl::StrCat("member ", member, " of mesh '", mesh.name,
                                            "' has no session now"));
  }
  if ((*peer)->uid != (*s)->uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "member ", member, " of mesh '", mesh.name, "' runs as another user (uid ",
        (*peer)->uid, ", this session's is ", (*s)->uid, "): its buffers are its own"));
  }
  auto it = (*peer)->buffers.find(buffer_id);
  if (it == (*peer)->buffers.end()) {
    return absl::NotFoundError(absl::StrCat("buffer '", buffer_id, "' not found among member ",
                                            member, "'s buffers"));
  }
  if (it->second->kind() != "memfd") {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer '", buffer_id, "' is not in host memory"));
  }
  return it->second;
}

absl::StatusOr<bool> Engine::MemberOpExpired(const std::string& session_id,
                                             const std::string& mesh_id, uint32_t d,
                                             uint32_t s) {
  Callbacks cbs;
  bool broke = false;
  {
    MutexLock lock(&mu_);
    auto session = GetSession(session_id);
    if (!session.ok()) return session.status();
    auto member = (*session)->meshes.find(mesh_id);
    if (member == (*session)->meshes.end()) {
      return absl::NotFoundError(absl::StrCat(
          "mesh '", mesh_id, "' not found among this session's meshes (join it first)"));
    }
    Mesh& mesh = *meshes_.at(mesh_id);
    if (!mesh.segment) return absl::FailedPreconditionError("the mesh has no member-side segment");
    if (mesh.state == MeshState::kBroken) return true;  // the segment says why
    // Everything read here is the members' to write: only compared, and
    // the signature's text is bounded and cleaned before it is shown.
    const member_ops::View& v = mesh.seg;
    const uint64_t key = member_ops::Key(d, s);
    std::vector<std::string> waiting, missing;
    for (uint32_t m = 0; m < v.layout.members; ++m) {
      switch (member_ops::PresenceAt(v, m, d, s, key)) {
        case member_ops::Presence::kHere: waiting.push_back(absl::StrCat(m)); break;
        case member_ops::Presence::kDaemonPath: break;
        case member_ops::Presence::kNotYet:
          missing.push_back(MemberLabel(mesh, static_cast<int>(m)));
          break;
      }
    }
    if (missing.empty()) return false;
    const member_ops::Entry& mine = *v.entry(static_cast<uint32_t>(member->second), s);
    const std::string what = EntrySignature(mine);
    const std::string reason = absl::StrCat(
        "member-side op ", s, " after daemon op ", d, " timed out after ",
        Millis(mesh.op_timeout), " ms: ", WaitingMembers(waiting), " in ", what,
        "; missing: ", absl::StrJoin(missing, "; "));
    MarkSegmentBroken(mesh, absl::DeadlineExceededError(
                                absl::StrCat("mesh '", mesh.name, "': ", reason)));
    BreakMesh(mesh, reason, cbs);
    broke = true;
    // Counted as the daemon counts its own ops' timeouts (once per op, by
    // the first member that asks: the mesh is broken for the others).
    if (options_.op_observer) {
      options_.op_observer(KindOfSignature(what), absl::StatusCode::kDeadlineExceeded,
                           mine.in_bytes, mesh.op_timeout);
    }
  }
  Run(cbs);
  return broke;
}

}  // namespace collectived
