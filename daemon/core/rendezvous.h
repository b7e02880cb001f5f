// The engine's seam to other hosts: meshes whose members live on several
// daemons of a cluster.
//
// The engine stays the matcher: it validates joins and submissions of its
// own members exactly as for a mesh on one host. What it cannot know alone
// (which members the other hosts hold, when the mesh is full, how to move
// bytes to them) it asks a MeshRendezvous:
//
//   1. Register: each local member's join is registered with the cluster's
//      mesh registry, which checks it against the other hosts' members (same
//      axes and token, coordinate not taken elsewhere) and answers with the
//      generation the mesh will have.
//   2. Form: once per mesh, waits until every member of that generation has
//      joined on some host, then connects the mesh's hosts and answers with
//      the global topology and a CrossHostMesh, the per-mesh executor handle
//      that owns the connections.
//   3. CrossHostMesh::Start runs each op once the local members have all
//      submitted: it checks that every host submitted the same op, moves the
//      bytes and calls back when this host's outputs are written.
//   4. Leave: local members that left a forming mesh, or a mesh that broke
//      here, are reported so the other hosts learn it.
//
// Every callback is called exactly once, on a thread of the rendezvous, never
// with an engine lock held by the caller. Implementations: ClusterRendezvous
// (daemon/cluster/cluster_rendezvous.h: the cluster's registry, the host
// transport), and FakeRendezvous (tests/fakes/fake_rendezvous.h: the test
// plays the registry and the other hosts; daemon/core/engine_cluster_test.cc).
#ifndef COLLECTIVED_DAEMON_CORE_RENDEZVOUS_H_
#define COLLECTIVED_DAEMON_CORE_RENDEZVOUS_H_

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exec/executor.h"
#include "plan/op_plan.h"

namespace collectived {

// What every host's members of a mesh must agree on.
struct MeshJoinInfo {
  // The mesh's scope and name (Engine's MeshKey): the registry's key.
  std::string key;
  // The axes, canonical ("data=2,model=4"), and the member count.
  std::string axes;
  int64_t members = 0;
  // The join token the members present ("" for none).
  std::string token;
  // The op timeout members asked for (0: none asked).
  int64_t op_timeout_ms = 0;
};

// A formed mesh as every host sees it.
struct MeshTopology {
  int64_t generation = 0;
  // The host id of each member, by member index.
  std::vector<std::string> member_host;
  // The mesh's hosts, ascending host id (a host's rank is its index here),
  // and their advertised addresses.
  std::vector<std::string> hosts;
  std::vector<std::string> addresses;
  // This host's rank.
  int self = -1;
  // The op timeout some member asked for (0: none).
  int64_t op_timeout_ms = 0;
};

// What the engine is told by a mesh's connections, and asked, between ops.
// Called on a thread of the connections, never with their locks held.
struct CrossHostObserver {
  // Another host broke the mesh (its code and reason: "member 4 (1,1) pid
  // N host h1 'x' is gone: ..."), or is gone, or could not be understood:
  // called at most once.
  std::function<void(const absl::Status& why)> on_broken;
  // Another host asks what this host's members are doing at op `sequence`
  // of the mesh: the members it still waits for ("5 (2,1) pid N host h2
  // 'x'; ..."), or "" when every local member submitted it.
  std::function<std::string(int64_t sequence)> on_query;
};

// One mesh's connections to its other hosts. Ops are started one at a time
// (the engine starts the next once the previous one called back).
class CrossHostMesh {
 public:
  // `status`: the op's result on this host. `broken`: the connections can
  // no longer be trusted (a peer is gone, timed out or was aborted): the
  // engine breaks the mesh. An op all hosts refused alike (their ops
  // differ) is not broken.
  using Done = absl::AnyInvocable<void(absl::Status status, bool broken, Traffic traffic)>;

  // Aborts (see Abort) and waits for the op in flight to call back.
  virtual ~CrossHostMesh() = default;

  // Runs `plan` (op number `sequence` of the mesh) over `io`: one entry per
  // member of the mesh, this host's members with their regions, the others'
  // null. `executor` runs this host's share (on the members' memory).
  // `verdict` is not OK when this host's members disagree: the op then
  // fails on every host with FAILED_PRECONDITION naming this host. Fails
  // with DEADLINE_EXCEEDED, naming the hosts that did not take part, at
  // `deadline`. Returns at once; `done` runs on the mesh's thread.
  // `timeout`, the op's deadline from its first submission, is for the
  // messages that say how long it waited.
  virtual void Start(std::shared_ptr<const OpPlan> plan, int64_t sequence,
                     std::vector<MemberIo> io, Executor* executor, absl::Status verdict,
                     absl::Time deadline, Done done,
                     absl::Duration timeout = absl::ZeroDuration()) = 0;
  // Breaks the mesh here for `why`: the other hosts are told (its code and
  // message, which should name the cause: the member, the host) before the
  // connections close, the op in flight (if any) fails with `why`, and
  // later Starts fail at once. Idempotent: the first cause stands.
  virtual void Abort(const absl::Status& why) = 0;
  // Installs the engine's observer (once, before the first Start). A break
  // by another host that came earlier is reported at once, on this thread.
  virtual void Observe(CrossHostObserver observer) = 0;
};

struct FormedMesh {
  MeshTopology topology;
  std::unique_ptr<CrossHostMesh> mesh;
};

// Where the rendezvous stands with its cluster (GetStats' ClusterStats).
struct RendezvousStatus {
  std::string state;  // "starting", "joined", "unavailable", "stopped"
  std::string coordinator;
  bool serves_coordinator = false;
  std::string last_error;
};

class MeshRendezvous {
 public:
  virtual ~MeshRendezvous() = default;
  // Never blocks on the network; takes only the rendezvous' own locks.
  virtual RendezvousStatus Status() = 0;

  // This daemon's host id in the cluster.
  virtual std::string host_id() const = 0;

  // Registers member `index` of mesh `info`, joined on this host, answering
  // by `deadline` (the joiner's) at the latest. `done` gets the generation
  // the mesh will have, or why the join is refused (the registry's
  // FAILED_PRECONDITION, ALREADY_EXISTS, PERMISSION_DENIED, or UNAVAILABLE
  // while the registry cannot be reached). Registrations are sent in the
  // order of the calls.
  virtual void Register(const MeshJoinInfo& info, int index, absl::Time deadline,
                        absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) = 0;

  // Waits until generation `generation` of mesh `key` is full (or `deadline`
  // passes), then connects its hosts. `done` gets the topology and the
  // connections, or the error every local joiner gets: DEADLINE_EXCEEDED
  // naming the missing coordinates, ABORTED when another host's members
  // left or the mesh broke, UNAVAILABLE when no coordinator answers.
  // `cancel`, once set, stops the wait and the connecting (and drops a
  // connection made after it was set): the engine's mesh went away; `done`
  // then gets CANCELLED.
  virtual void Form(const std::string& key, int64_t generation, absl::Time deadline,
                    std::shared_ptr<const std::atomic<bool>> cancel,
                    absl::AnyInvocable<void(absl::StatusOr<FormedMesh>)> done) = 0;

  // Members `indices` of generation `generation` of mesh `key` left it while
  // it was forming (`broken` false), or the mesh broke here for `reason`
  // (`broken` true). Sent in call order after earlier Registers; failures
  // are logged, not returned.
  virtual void Leave(const std::string& key, int64_t generation, std::vector<int> indices,
                     bool broken, const std::string& reason) = 0;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_RENDEZVOUS_H_
