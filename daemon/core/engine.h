// Engine: sessions, meshes, buffers, op matching, deadlines and failures.
//
// The engine is the daemon's core and knows nothing of gRPC or of the wire
// format: it takes and gives its own types (engine_types.h, plan/op_request.h),
// which the server converts at its edge (daemon/server/wire.h); the side
// channel attaches sessions and fetches buffer descriptors. Every
// asynchronous result (join, op, wait) is delivered through a callback that is
// called exactly once, never with the engine's lock held, from a gRPC, timer
// or executor thread.
//
// Thread model: one mutex (mu_) guards all state; no method blocks on I/O or
// on another member while holding it. Ops run on the runner pool through the
// Executor, outside the lock, holding references to the buffers they use.
#ifndef COLLECTIVED_DAEMON_CORE_ENGINE_H_
#define COLLECTIVED_DAEMON_CORE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/member_ops.h"
#include "common/sync.h"
#include "absl/time/time.h"
#include "daemon/core/stream_sync.h"
#include "daemon/core/backends.h"
#include "daemon/core/engine_types.h"
#include "plan/op_request.h"
#include "plan/plan_op.h"
#include "daemon/core/join_request.h"
#include "daemon/core/mesh_names.h"
#include "daemon/core/rendezvous.h"
#include "daemon/core/timer.h"
#include "exec/executor.h"
#include "exec/thread_pool.h"
#include "daemon/memory/shared_buffer.h"
#include "daemon/util/log.h"

namespace collectived {

// Told about each op once, as the engine ends it: its kind, its status code,
// the input bytes of one member (plan.in_bytes) and the time from the first
// member's submission to the end. Called with the engine's lock held, on
// whichever thread ends the op: it must be quick and must not call the engine.
using OpObserver =
    std::function<void(OpKind kind, absl::StatusCode code, uint64_t member_bytes,
                       absl::Duration latency)>;

struct EngineOptions {
  absl::Duration join_timeout = absl::Seconds(60);
  // Metrics (daemon/server/metrics.h); empty: none.
  OpObserver op_observer;
  absl::Duration op_timeout = absl::Seconds(60);
  // A session that does not attach its side socket in time is closed.
  absl::Duration attach_timeout = absl::Seconds(10);
  // A mesh name's join token binds every later generation of the name while
  // any mesh of it exists (forming, ready, or broken with members that have
  // not left), and for this long after the last one is gone; then the next
  // first member sets a new token. See daemon/core/mesh_names.h.
  absl::Duration token_hold = absl::Seconds(60);
  int max_sessions = 1024;
  int max_meshes = 1024;
  int max_mesh_members = 4096;
  int max_buffers_per_session = 4096;
  // Buffer bytes one session may hold in host memory (memfd buffers) and,
  // counted apart, in GPU memory (every other kind, all GPUs together).
  uint64_t max_buffer_bytes_per_session = uint64_t{64} << 30;
  uint64_t max_gpu_buffer_bytes_per_session = uint64_t{64} << 30;
  uint64_t max_buffer_size = uint64_t{16} << 30;
  // Completed ops kept per session for Wait.
  int max_retained_ops = 4096;
  // Threads that start ops (each op then fans out on the executor's pool).
  int runner_threads = 4;
  // Ops that touch at most this many bytes (inputs plus outputs, all
  // members) run on the thread that completed them (the last member's
  // submission), saving the hand-off to a runner thread (a futex wake-up,
  // 40-70 us on a VM: as long as an op of a few MiB takes); bigger ones and
  // ops queued behind another op go to the runners.
  uint64_t inline_op_bytes = 16 * 1024 * 1024;
  // Member-side small ops (common/member_ops.h): a mesh of this host gets a
  // segment whose entries hold inputs of up to this many bytes (fewer for
  // big meshes: the segment stays within member_ops::kMaxSegmentBytes).
  // 0: no segments, every op goes through the daemon.
  uint64_t member_op_bytes = 64 * 1024;
  // The most bytes the segments of the meshes the engine holds take
  // together: a mesh that forms past it gets none (its ops go through the
  // daemon). A member that keeps a segment mapped after its mesh is gone
  // keeps those pages on its own account, outside this count.
  uint64_t member_segment_total_bytes = uint64_t{1} << 30;
  // Meshes across hosts (daemon/core/rendezvous.h): with a rendezvous, every
  // mesh is a cluster mesh: its members may join on any daemon of the
  // cluster (with explicit coordinates), and it forms when the cluster's
  // registry has all of them. Not owned; must outlive the engine.
  MeshRendezvous* rendezvous = nullptr;
  // Shown in diagnostics: host name and pid of the daemon.
  std::string host = "localhost";
  std::string daemon_id;
  std::string side_socket_path;
};

// What diagnostics show of a session id: enough to tell sessions apart, not
// enough to act as one.
std::string DisplayId(const std::string& id);

// When an op reached each stage in the daemon, CLOCK_MONOTONIC ns (0: it
// did not, or nobody can tell). The fast path hands them to the member
// (OpTiming), for collectived_perf --breakdown.
struct OpStamps {
  // Its turn came: every member had submitted it and the mesh's op before
  // it was done.
  int64_t matched_ns = 0;
  // Its inputs were ready: the stream-ordered members' streams had reached
  // it (matched_ns when no member is stream-ordered).
  int64_t ready_ns = 0;
  int64_t started_ns = 0;  // a daemon thread began to run it
  DeviceTiming device;     // a GPU op: its launches done, and its device time
  int64_t executed_ns = 0;  // the executor returned: every output written
};

// The result of one op for one member.
struct OpOutcome {
  absl::Status status;
  int64_t sequence = -1;
  // The result's shape and dtype (empty / kInvalid when the op never planned).
  std::vector<int64_t> out_shape;
  DType out_dtype = DType::kInvalid;
  // When it reached each stage; all 0 if it never ran.
  OpStamps stamps;
  // What the executor moved (all members together); zero if it never ran.
  Traffic traffic;

  OpOutcome() = default;
  OpOutcome(absl::Status s, int64_t seq) : status(std::move(s)), sequence(seq) {}
};
using OpDone = std::function<void(const OpOutcome&)>;

// A session's buffers by id.
using BufferTable = absl::flat_hash_map<std::string, std::shared_ptr<SharedBuffer>>;

// Where one member's op reads and writes (ResolveBuffers).
struct SubmittedBuffers {
  std::shared_ptr<SharedBuffer> in_buf, out_buf;
  uint64_t in_offset = 0, out_offset = 0;
};

// Resolves the regions `op` names among a session's `buffers` for its
// `plan`, and checks them: a region inside its buffer, aligned to the
// element size and within the size the client declared; an output on the
// input's device, the same region as the input or apart from it; in place
// only when the result has the input's size. A barrier or an op of no
// bytes names none. Pure: looks at nothing but its arguments.
absl::Status ResolveBuffers(const OpRequest& op, const OpPlan& plan,
                            const BufferTable& buffers, SubmittedBuffers& out);

class Engine {
 public:
  // Runs on `backends`: the viable allocators and executors (see
  // daemon/core/backends.h; the engine does not ask them again).
  Engine(EngineOptions options, Backends backends);
  // Host memory only: the memfd allocator and `executor`.
  Engine(EngineOptions options, std::unique_ptr<Executor> executor);
  // Fails everything still pending (see Shutdown) and joins the threads.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Opens a session. RESOURCE_EXHAUSTED past max_sessions.
  absl::StatusOr<NewSession> CreateSession(std::string client_name);
  // Ties a session to the peer of a side socket (credentials from
  // SO_PEERCRED). PERMISSION_DENIED for a wrong token, FAILED_PRECONDITION if
  // already attached.
  absl::Status AttachSession(const std::string& session_id, const std::string& token,
                             int pid, int uid);
  // Closes a session: its meshes break (naming it and `reason`), its buffers
  // are released, its waiters fail. NOT_FOUND for unknown sessions.
  absl::Status CloseSession(const std::string& session_id, const std::string& reason);

  // Joins a mesh; `done` runs when the mesh is full, or on failure/deadline.
  using JoinDone = std::function<void(absl::StatusOr<Joined>)>;
  void JoinMesh(const JoinRequest& request, JoinDone done) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LeaveMesh(const std::string& session_id, const std::string& mesh_id);
  absl::StatusOr<MeshView> DescribeMesh(const std::string& mesh_id, const std::string& mesh_name,
                                        const std::string& scope = "");

  // A zero-filled buffer on `device` (ParseDevice's forms; "" is "cpu").
  // INVALID_ARGUMENT for a malformed device or size, FAILED_PRECONDITION
  // when this daemon has no usable allocator for the device's kind of
  // memory, RESOURCE_EXHAUSTED past a quota (host and GPU bytes are counted
  // apart), and what the allocator says (e.g. NOT_FOUND for a GPU that does
  // not exist). A failed call changes nothing.
  //
  // With `mesh_id`: a buffer the members of that mesh share (the session
  // must be a member). Each member's k-th such call gets the same buffer:
  // the first caller's allocates it, the others' map it (same id, counted in
  // every session's quota); a size or device that differs from the first
  // caller's is FAILED_PRECONDITION naming it. Host memory only so far
  // (UNIMPLEMENTED for GPU memory). Ops may name it as every member's
  // output of an op whose result is the same for all (see CheckSharedOutput):
  // the daemon then writes the result once.
  absl::StatusOr<BufferView> AllocateBuffer(const std::string& session_id, int64_t size_bytes,
                                            const std::string& device = "",
                                            const std::string& mesh_id = "");
  absl::Status FreeBuffer(const std::string& session_id, const std::string& buffer_id);
  // The buffer, for passing its descriptor to the owning session's process.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> GetBuffer(const std::string& session_id,
                                                          const std::string& buffer_id);

  // Validates `op` and enqueues it as the session's next op on its mesh. On
  // error nothing changes and `done` is not called. On success `done` is
  // called exactly once when the op completes or fails. With `retain`, the
  // outcome is also kept for Wait.
  absl::StatusOr<Accepted> Submit(const std::string& session_id, const OpRequest& op,
                                  bool retain, OpDone done);
  // Member-side small ops (common/member_ops.h). The segment of a mesh the
  // session is a member of: FAILED_PRECONDITION when the mesh has none (not
  // formed, across hosts, or member_op_bytes is 0), ABORTED when broken.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> GetMemberSegment(const std::string& session_id,
                                                                 const std::string& mesh_id);
  // Another member's host buffer, for a member-side all_gather that reads
  // the members' inputs (client/src/member_reads.cc): `buffer_id` of the
  // session that is member `member` of mesh `mesh_id`, which the session
  // `session_id` is a member of too. PERMISSION_DENIED when that session
  // belongs to another user; NOT_FOUND, INVALID_ARGUMENT, ABORTED (broken)
  // and FAILED_PRECONDITION (no segment, GPU memory) as the names say.
  absl::StatusOr<std::shared_ptr<SharedBuffer>> GetPeerBuffer(const std::string& session_id,
                                                              const std::string& mesh_id,
                                                              int member,
                                                              const std::string& buffer_id);
  // A member waiting member-side at place (d, s) passed its deadline. When
  // some member has neither its entry there nor a daemon-path op past `d`,
  // the mesh breaks with DEADLINE_EXCEEDED naming them (in the segment, for
  // every waiter) and this returns true; false when nobody is missing (the
  // caller looks again).
  absl::StatusOr<bool> MemberOpExpired(const std::string& session_id, const std::string& mesh_id,
                                       uint32_t d, uint32_t s);

  // Waits for a retained op; `done` gets the op's outcome, or
  // DEADLINE_EXCEEDED ("still running") when `timeout` (if > 0) passes first.
  void Wait(const std::string& session_id, int64_t op_id, absl::Duration timeout,
            std::function<void(absl::StatusOr<Waited>)> done);

  std::vector<SessionView> ListSessions();
  std::vector<MeshView> ListMeshes();
  // Ops of one mesh (every mesh: empty id) not yet done: daemon-path ops
  // (submitted, waiting or running) and member-side ops some members wait in.
  absl::StatusOr<std::vector<PendingOpView>> ListPendingOps(const std::string& mesh_id);
  EngineStats GetStats();
  // Sessions that took a mesh's member-side segment and are still open:
  // their members poll for each other on CPUs of their own (MemberOps), and
  // the daemon's own polling threads leave them those CPUs (FastPath's
  // SpinBudget). Any thread.
  int member_side_sessions() const {
    return member_side_sessions_.load(std::memory_order_relaxed);
  }
  // How an op reached the daemon: the server counts each submission before
  // it calls Submit (GetStats' submitted_*, the metrics' share by path).
  enum class SubmitPath { kFastPath = 0, kExecute = 1, kUnary = 2 };
  void CountSubmission(SubmitPath path) {
    submitted_[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
  }

  // Stops accepting work; every pending join, op and wait fails with
  // UNAVAILABLE naming `reason`. Ops already running finish. Idempotent.
  void Shutdown(const std::string& reason);

  const EngineOptions& options() const { return options_; }

 private:
  using Callbacks = std::vector<std::function<void()>>;

  struct RetainedOp {
    bool done = false;
    OpOutcome outcome;
    std::vector<std::function<void(const OpOutcome&)>> waiters;
  };

  struct Session {
    std::string id;
    std::string token;
    std::string client_name;
    int pid = 0;
    int uid = -1;
    bool attached = false;
    DeadlineTimer::TimerId attach_timer = 0;
    BufferTable buffers;
    // Bytes of its host (memfd) buffers and, apart, of its GPU buffers.
    uint64_t buffer_bytes = 0;
    uint64_t gpu_buffer_bytes = 0;
    // Mesh id -> member index.
    std::map<std::string, int> meshes;
    int64_t next_op_id = 1;
    int64_t ops_submitted = 0;
    std::map<int64_t, RetainedOp> retained;
    // It took a mesh's member-side segment (counted in member_side_sessions_).
    bool member_side = false;
  };

  struct Submission {
    std::string session_id;
    std::shared_ptr<const OpPlan> plan;
    std::shared_ptr<SharedBuffer> in_buf, out_buf;
    uint64_t in_offset = 0, out_offset = 0;
    // Stream-ordered submission: the member's ready/done words.
    std::optional<SyncWords> sync;
    OpDone done;
  };

  struct PendingOp {
    int64_t sequence = 0;
    std::vector<std::optional<Submission>> subs;
    int submitted = 0;
    absl::Time first_submit;
    absl::Time deadline;
    DeadlineTimer::TimerId timer = 0;
    bool running = false;
    int64_t matched_ns = 0;  // when it began to run (OpStamps)
    // Set when the members' ops disagree; the op then fails in its turn.
    absl::Status verdict;
    // While running and waiting for members' streams: stops the wait when
    // the mesh breaks or the daemon shuts down.
    std::shared_ptr<OpCancel> cancel;
  };

  enum class MeshState { kForming, kReady, kBroken };

  struct JoinWaiter {
    std::string session_id;
    // When the join times out (while a cluster mesh asks the registry, its
    // local timer waits kClusterJoinGrace more, so that the registry's
    // answer, which names the missing members of every host, comes first).
    absl::Time deadline;
    DeadlineTimer::TimerId timer = 0;
    JoinDone done;
  };

  struct Mesh {
    std::string id;
    std::string name;
    std::string scope;
    std::string key;    // scope and name: what names_ is keyed by
    std::string token;  // join token (the name's when the mesh was created)
    MeshShape shape;
    int64_t generation = 1;
    MeshState state = MeshState::kForming;
    std::string broken_reason;
    // The reason with its code (what the other hosts were told).
    absl::Status broken_status;
    bool assign = false;  // coordinates assigned by the daemon
    absl::Duration op_timeout;
    bool op_timeout_set = false;
    // By member index: the session ("" while free), and whether it left.
    std::vector<std::string> member_session;
    std::vector<bool> member_left;
    std::map<int, JoinWaiter> join_waiters;  // by member index, while forming
    std::vector<int64_t> next_sequence;      // per member
    std::map<int64_t, PendingOp> pending;    // by sequence
    int64_t completed = 0;
    // Members this daemon holds: every member, except for a cluster mesh,
    // which counts the members the cluster's registry placed here.
    int local_members = 0;
    // A cluster mesh (EngineOptions::rendezvous): the generation the
    // registry gave it (0 until the first registration answers), whether
    // Form was asked, the host of each member once formed, and the
    // connections to the other hosts (destroyed off the engine's lock: see
    // RetireCross).
    bool cluster = false;
    // Every member joined here before the registry formed it: it runs as a
    // mesh of this host alone (and works while no coordinator answers).
    bool local_only = false;
    // The last UNAVAILABLE of a registration: the join waits on (the mesh
    // may fill here), and times out with it.
    absl::Status registry_error;
    // Joins of this name refused while it formed (other axes, coordinates
    // or op timeout, or no token), newest last, at most kMaxRefusedJoins:
    // a member that waits for the others and times out is told of them.
    std::vector<std::string> refused_joins;
    int64_t cluster_generation = 0;
    // Registrations sent to the registry and not answered yet.
    int registering = 0;
    // By member index: the registry accepted this host's registration of
    // it (for cluster_generation): exactly such an index is given back when
    // its joiner goes.
    std::vector<bool> registered;
    // Set to stop the mesh's Form when the mesh goes away.
    std::shared_ptr<std::atomic<bool>> form_cancel;
    MeshJoinInfo join_info;
    std::vector<std::string> member_host;
    std::shared_ptr<CrossHostMesh> cross;
    // Buffers its members share (AllocateBuffer with a mesh id), by number
    // k: member i's (shared_asked[i] + 1)-th request gets number
    // shared_asked[i]. The mesh holds no buffer itself (the sessions that
    // mapped it do: it goes when the last one frees it); an entry goes once
    // every member has asked for its number.
    struct Shared {
      std::string id;
      std::weak_ptr<SharedBuffer> buffer;
      int64_t size_bytes = 0;  // as the first request asked
      int creator = 0;         // the member whose request allocated it
    };
    std::map<size_t, Shared> shared;
    std::vector<size_t> shared_asked;
    size_t shared_made = 0;  // numbers given so far
    // Member-side small ops: the segment (made when the mesh forms, for a
    // mesh of this host) and the engine's view of it (its own layout).
    std::shared_ptr<SharedBuffer> segment;
    member_ops::View seg;
  };

  // All of these require mu_ held. Callbacks to run after unlocking are
  // appended to `cbs`.
  Session* FindSession(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CloseSession's work; the session must exist.
  void CloseSessionLocked(const std::string& session_id, const std::string& reason,
                          Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Session*> GetSession(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mesh `mesh_id` of session `s` (its member index in `*index`) when
  // it has a member-side segment: NOT_FOUND when `s` is not a member,
  // ABORTED when the mesh broke, FAILED_PRECONDITION without a segment.
  absl::StatusOr<const Mesh*> SegmentMeshLocked(const Session& s, const std::string& mesh_id,
                                                int* index) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JoinMesh's work: takes `done` (into the mesh's join waiters) only when
  // the join stands; otherwise the error, and nothing changed.
  absl::Status JoinLocked(const JoinRequest& req, JoinDone& done, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mesh a valid join joins: the forming one of its name (refused, and
  // the refusal kept for its waiters, when the join does not match it) or a
  // new one.
  absl::StatusOr<Mesh*> MeshToJoinLocked(const JoinRequest& req, const JoinSpec& spec,
                                         Session& session, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new mesh for the join's name, unless an earlier generation's token
  // binds the name or the mesh limit is reached.
  absl::StatusOr<Mesh*> NewMeshLocked(const JoinRequest& req, const JoinSpec& spec,
                                      Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteJoin(Mesh& mesh, Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnJoinDeadline(const std::string& mesh_id, int index)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Fails joiner `index` of `mesh` at its deadline: DEADLINE_EXCEEDED
  // naming who joined and who is missing, or UNAVAILABLE when the cluster's
  // registry could not be reached. The caller erases the mesh if it is left
  // empty (MaybeEraseMesh).
  void OnJoinDeadlineLocked(Mesh& mesh, int index, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the op's outputs in mesh-shared buffers (SharedBuffer::
  // shared_mesh) follow the rule: every member's output is the same region
  // of one such buffer, no input overlaps it, the op's result is the same
  // for every member (psum, pmean, pmax, pmin, all_gather, broadcast over
  // every axis), on one host. FAILED_PRECONDITION naming what differs.
  absl::Status CheckSharedOutput(const Mesh& mesh, const PendingOp& op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveJoiner(Mesh& mesh, int index, const absl::Status& status, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the mesh's pending ops with ABORTED; `level` is that of the log
  // line (a member leaving on purpose is not a warning). Across hosts, the
  // other hosts are told `reason` with `code` (an op that timed out:
  // DEADLINE_EXCEEDED), which their members' op in flight fails with.
  // `from_other_host`: another host broke it and told every host already;
  // the connections are then left as they are, so that an op in flight
  // here that needs nothing more from that host still finishes (they close
  // when the mesh goes).
  void BreakMesh(Mesh& mesh, const std::string& reason, Callbacks& cbs,
                 LogLevel level = LogLevel::kWarn,
                 absl::StatusCode code = absl::StatusCode::kAborted, bool from_other_host = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Another host broke cross-host mesh `mesh_id` (or is gone): the mesh
  // breaks here for its reason (CrossHostObserver::on_broken).
  void OnCrossBroken(const std::string& mesh_id, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The local members of mesh `mesh_id` that have not submitted op
  // `sequence` ("" when every one did): what another host asks when that
  // op is late there (CrossHostObserver::on_query).
  std::string MissingAt(const std::string& mesh_id, int64_t sequence) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `status` into the mesh's segment (the first status only) and
  // wakes every member waiting on it.
  void MarkSegmentBroken(Mesh& mesh, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeEraseMesh(const std::string& mesh_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a mesh from meshes_ (the only way one is removed), counting it
  // off its NameRecord.
  void EraseMesh(absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailOp(Mesh& mesh, PendingOp& op, const absl::Status& status, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnOpFull(Mesh& mesh, PendingOp& op, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartNext(Mesh& mesh, Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // MaybeStartNext's steps. The mesh's front op when every local member
  // submitted it and it is not running (failing the refused ones of a
  // one-host mesh on the way), or nullptr.
  PendingOp* FrontOpToStart(Mesh& mesh, Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The members' regions of `op` into `io` (its buffers referenced in
  // `keep`); the kind of memory they are.
  static absl::string_view GatherMemberIo(const PendingOp& op, std::vector<MemberIo>& io,
                                          std::vector<std::shared_ptr<SharedBuffer>>& keep);
  // What starts `op` on the mesh's connections to the other hosts, with a
  // verdict and when its inputs were ready (OpStamps).
  std::function<void(absl::Status, int64_t)> CrossStarter(Mesh& mesh, const PendingOp& op,
                                                 Executor* executor,
                                                 std::shared_ptr<const OpPlan> plan,
                                                 std::vector<MemberIo> io,
                                                 std::vector<std::shared_ptr<SharedBuffer>> keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when `op` waits for its members' streams on the stream waiter
  // (then `run`s, or fails; both are moved there); false when they are
  // ready (both left as they are).
  bool WaitForStreams(Mesh& mesh, PendingOp& op, const std::string& signature,
                      std::function<void(int64_t)>& run,
                      std::function<void(absl::Status, int64_t)>& start_cross)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnOpDeadline(const std::string& mesh_id, int64_t sequence) ABSL_LOCKS_EXCLUDED(mu_);
  void OnOpFinished(const std::string& mesh_id, int64_t sequence, absl::Status status,
                    const OpStamps& stamps, const Traffic& traffic, bool broken = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cluster meshes: registers member `index` (after unlocking, through
  // `cbs`); the registry's answer to member `index`'s registration,
  // and the answer to Form.
  void Register(Mesh& mesh, int index, const std::string& session_id, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRegistered(const std::string& mesh_id, const std::string& key, int index,
                    const std::string& session_id, absl::StatusOr<int64_t> generation)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Registers member `index` of the mesh again after kRegisterRetry, if
  // that session's joiner still waits for the mesh to form then.
  void RegisterLater(const std::string& mesh_id, int index, const std::string& session_id);
  // Asks the rendezvous to form `mesh` (its generation, form_cancel) by
  // `deadline`; OnFormed answers.
  void StartForm(Mesh& mesh, absl::Time deadline, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFormed(const std::string& mesh_id, absl::StatusOr<FormedMesh> formed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OnFormed's outcomes. The registry's failure: joiners past their own
  // deadline fail, the others wait on (forming again until the next
  // deadline), or all fail.
  void NotFormed(absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it,
                 const absl::Status& status, Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The formed mesh taken on: its topology, connections and observer, the
  // joins completed. Returns the connections when the mesh cannot be taken
  // (its local members left, or none were placed here), for the caller to
  // abort outside the lock.
  std::unique_ptr<CrossHostMesh> AdoptFormed(
      absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it, FormedMesh formed,
      Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the cluster that members `indices` of a cluster mesh left it while
  // forming, or (broken) that it broke here.
  void TellCluster(const Mesh& mesh, std::vector<int> indices, bool broken,
                   const std::string& reason, Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys a mesh's connections on a runner thread: their destructor waits
  // for their thread, which calls back into the engine.
  void RetireCross(Mesh& mesh) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every local joiner of a forming mesh with `status` and erases it.
  void FailForming(absl::flat_hash_map<std::string, std::unique_ptr<Mesh>>::iterator it,
                   const absl::Status& status, Callbacks& cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The host id shown for member `index` ("" outside a cluster mesh).
  std::string HostOf(const Mesh& mesh, int index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submit's steps. The submission of `session` for `op`: its mesh (one
  // that formed and is not broken: a segment a member marked broken breaks
  // it now), its plan and its buffers.
  absl::StatusOr<Submission> ResolveSubmissionLocked(Session& session, const OpRequest& op,
                                                     Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for one more retained op: drops the oldest completed one at the
  // limit; RESOURCE_EXHAUSTED when none completed.
  absl::Status MakeRoomToRetainLocked(Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retains the session's next op (its outcome kept for Wait): `user_done`
  // wrapped to record the outcome and wake its waiters.
  OpDone RetainingDone(Session& session, OpDone user_done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places `sub`, member `index`'s op, at its sequence in the mesh's pending
  // ops (arming the op's deadline with the first member's), and matches the
  // op once every local member's is there.
  Accepted EnqueueLocked(Mesh& mesh, int index, Submission sub, const OpRequest& op,
                         Session& session, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeliverOutcome(const Submission& sub, const OpOutcome& outcome, Callbacks& cbs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MemberLabel(const Mesh& mesh, int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MemberView MemberInfo(const Mesh& mesh, int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MeshView MeshInfoOf(const Mesh& mesh) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member-side ops of `mesh` some members wait in while others have
  // not come (read from its segment, which only shows what the members
  // wrote): one PendingOp each, member_side set.
  void AddMemberSidePending(const Mesh& mesh, std::vector<PendingOpView>& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountOp(OpKind kind, bool ok, uint64_t bytes, const Traffic& traffic = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the members' buffers of a matched op are of one kind of memory
  // and a usable executor runs on it; else the FAILED_PRECONDITION every
  // member gets.
  absl::Status CheckMemory(const Mesh& mesh, const PendingOp& op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The executor of buffers of `kind` ("memfd" for ops without buffers), or
  // nullptr.
  Executor* ExecutorFor(absl::string_view kind) const;
  // Why there is no usable allocator / executor for `kind`.
  std::string NoAllocatorReason(absl::string_view kind) const;
  std::string NoExecutorReason(absl::string_view kind) const;
  // AllocateBuffer's steps. The session's buffer count and host or GPU
  // bytes, with `bytes` more: RESOURCE_EXHAUSTED naming the limit, or OK.
  absl::Status CheckBufferQuota(const Session& session, uint64_t bytes, bool gpu) const;
  bool FitsBufferQuota(const Session& session, uint64_t bytes, bool gpu) const;
  // The request checked: the allocator to use; or, when a mesh-shared buffer
  // the session asks for is made already, nullptr with it in *attached.
  absl::StatusOr<BufferAllocator*> CheckAllocationLocked(
      const std::string& session_id, int64_t size_bytes, const absl::StatusOr<DeviceSpec>& spec,
      const std::string& mesh_id, std::optional<BufferView>* attached)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mesh and this session's member index in it, for a mesh-shared buffer.
  absl::StatusOr<std::pair<Mesh*, int>> SharedBufferMember(Session& session,
                                                           const std::string& mesh_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the session buffer number shared_asked[index] of the mesh, which
  // was made (`made_now`: by this call).
  absl::StatusOr<BufferView> AttachSharedBuffer(Session& session, Mesh& mesh, int index,
                                                bool made_now, int64_t size_bytes,
                                                const DeviceSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the session's buffers to `by_device` (keyed by device).
  static void CountByDevice(const Session& s,
                            std::map<std::string, DeviceBuffers>& by_device);
  static void Run(Callbacks& cbs);

  const EngineOptions options_;
  // Owns the backends; the maps index them by buffer kind.
  const Backends backends_;
  std::map<std::string, BufferAllocator*, std::less<>> allocators_;
  std::map<std::string, Executor*, std::less<>> executors_;
  const absl::Time started_;

  Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Mesh>> meshes_ ABSL_GUARDED_BY(mu_);
  // Bytes of the segments of the meshes in meshes_ (member_segment_total_bytes).
  uint64_t segment_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The sessions with member_side set (written under mu_, read by any thread).
  std::atomic<int> member_side_sessions_{0};
  // Which mesh holds each name (scope and name), and each name's
  // generations and join token.
  MeshNames names_ ABSL_GUARDED_BY(mu_){options_.token_hold};

  // By kind, in OpKind order (GetStats' by_kind).
  std::map<OpKind, KindStats> stats_ ABSL_GUARDED_BY(mu_);
  // Ops started on meshes' CrossHostMesh whose callback has not returned
  // yet: the destructor waits for none to be left (the callbacks use the
  // engine).
  int cross_ops_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Ops of meshes across hosts that completed / failed here (GetStats).
  int64_t cross_ops_completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cross_ops_failed_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar cross_idle_;

  // Submissions by SubmitPath (CountSubmission); no lock.
  std::atomic<int64_t> submitted_[3] = {0, 0, 0};

  // Declared last: destroyed first, so no timer or runner callback outlives
  // the state above.
  std::unique_ptr<DeadlineTimer> timer_;
  std::unique_ptr<ThreadPool> runners_;
  // Ops waiting for their members' streams (stream_sync); its callbacks
  // schedule on runners_, so it goes first.
  std::unique_ptr<StreamWaiter> stream_waiter_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_ENGINE_H_
