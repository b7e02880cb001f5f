// InMemoryCoordinator: the Coordinator a daemon runs with --coordinator.
//
// State lives in this process only: a coordinator that restarts starts empty,
// its former leases are unknown (Heartbeat answers NOT_FOUND, so the daemons
// join again) and its keys are gone (the rendezvous of a running op is
// already over by then; a new one starts after the re-join).
//
// Leases expire on a DeadlineTimer: a lease not renewed within its ttl ends,
// its host leaves ListHosts and the keys it owns (Set with a lease_id) are
// deleted. Keys set without a lease stay until deleted.
//
// The mesh registry keeps, per mesh key, the last generation number, the live
// generation (if any) and the reasons of the last kKeptMeshEndings ended
// generations (late MeshWait callers get the real reason). A key whose record
// has no live generation is forgotten once its last generation ended more
// than kMeshMemory ago, or earlier when max_meshes records exist and a new key
// needs one (the record idle the longest goes). Generation numbers never
// repeat: a forgotten key starts again above every number a forgotten key
// had. MeshWait / MeshLeave on a forgotten key answer NOT_FOUND, as they do
// for the numbers below a key's first after it was registered again. A host's
// lease ending (expiry, Leave, a new Join of the host) ends every live
// generation in which the host holds members.
//
// Thread model: every method takes mu_; Get callbacks and the timer's expiry
// run with no lock held (gathered under the lock, run after unlocking). The
// timer thread expires leases and times out waits.
#ifndef COLLECTIVED_DAEMON_CLUSTER_IN_MEMORY_COORDINATOR_H_
#define COLLECTIVED_DAEMON_CLUSTER_IN_MEMORY_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "common/sync.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/mesh_registry.h"
#include "daemon/core/timer.h"

namespace collectived {

struct InMemoryCoordinatorOptions {
  // How long a lease lives without a heartbeat.
  absl::Duration lease_ttl = absl::Seconds(10);
  // Most hosts with a lease at once (RESOURCE_EXHAUSTED beyond).
  int max_hosts = 4096;
  // Most keys, and most key + value bytes, stored at once.
  int64_t max_keys = 65536;
  int64_t max_store_bytes = int64_t{256} << 20;
  // Most Gets and MeshWaits waiting at once (together).
  int max_waiters = 4096;
  // Most mesh keys remembered at once (RESOURCE_EXHAUSTED for a new key
  // when every one of them has a live generation).
  int max_meshes = 4096;
};

class InMemoryCoordinator final : public Coordinator {
 public:
  explicit InMemoryCoordinator(InMemoryCoordinatorOptions options = {});
  // Shuts down (waiting Gets get UNAVAILABLE) and stops the timer.
  ~InMemoryCoordinator() override;
  InMemoryCoordinator(const InMemoryCoordinator&) = delete;
  InMemoryCoordinator& operator=(const InMemoryCoordinator&) = delete;

  absl::StatusOr<LeaseGrant> Join(absl::string_view host_id, absl::string_view address,
                                  absl::string_view previous_lease_id = {}) override;
  absl::Status Heartbeat(absl::string_view lease_id) override;
  absl::Status Leave(absl::string_view lease_id) override;
  std::vector<HostRecord> ListHosts() override;
  absl::Status Set(absl::string_view key, absl::string_view value,
                   const SetOptions& options) override;
  WaitId Get(std::vector<std::string> keys, absl::Duration timeout, GetCallback done) override;
  absl::StatusOr<int64_t> Delete(const std::vector<std::string>& keys,
                                 absl::string_view prefix) override;
  absl::StatusOr<int64_t> MeshRegister(const MeshRegistration& registration) override;
  WaitId MeshWait(std::string key, int64_t generation, absl::Duration timeout,
                MeshWaitCallback done) override;
  absl::Status MeshLeave(absl::string_view key, int64_t generation, absl::string_view host_id,
                         absl::string_view lease_id, const std::vector<int32_t>& indices,
                         bool broken, absl::string_view reason) override;
  void Shutdown() override;

  // How many keys are stored (for tests and stats).
  int64_t key_count();
  // How many mesh keys the registry remembers (for tests and stats).
  int64_t mesh_key_count();
  // Gets and MeshWaits waiting now.
  int64_t waiter_count();
  // Timer callbacks pending (lease expiries and wait deadlines; for tests).
  int64_t timer_count();
  void CancelWait(WaitId id) override;

  // Ended generations whose reasons a key keeps.
  static constexpr size_t kKeptMeshEndings = 8;
  // How long a key without a live generation is remembered.
  static constexpr absl::Duration kMeshMemory = absl::Minutes(10);

 private:
  struct Host {
    std::string address;
    std::string lease_id;
    absl::Time joined_at;
    absl::Time last_heartbeat;
    absl::Time expires_at;
    // The lease's expiry check (cancelled when the lease ends otherwise).
    DeadlineTimer::TimerId timer = 0;
  };
  struct Entry {
    std::string value;
    std::string owner_lease;  // "" when not owned
  };
  struct Waiter {
    std::vector<std::string> keys;
    GetCallback done;
    DeadlineTimer::TimerId timer = 0;
  };
  // A Get answer to deliver after unlocking.
  struct Answer {
    GetCallback done;
    absl::StatusOr<std::vector<KeyValue>> result;
  };

  // A live generation (mesh_registry.h) and its waiting MeshWaits.
  struct MeshGeneration : RegistryGeneration {
    std::set<uint64_t> waiters;  // ids in mesh_waiters_
  };
  struct MeshEnding {
    int64_t generation = 0;
    std::string reason;
  };
  struct MeshRecord {
    // The first generation number this record issued: a key forgotten and
    // registered again starts above every forgotten key's numbers, so the
    // numbers below were never this record's.
    int64_t first_generation = 1;
    int64_t last_generation = 0;
    std::unique_ptr<MeshGeneration> live;  // null when none
    std::deque<MeshEnding> endings;  // the last kKeptMeshEndings, oldest first
    absl::Time idle_since;  // when the last generation ended
  };
  struct MeshWaiter {
    std::string key;
    MeshWaitCallback done;
    DeadlineTimer::TimerId timer = 0;
  };
  // A MeshWait answer to deliver after unlocking.
  struct MeshAnswer {
    MeshWaitCallback done;
    absl::StatusOr<MeshMembership> result;
  };
  // What a call does once it has unlocked mu_ (Deliver): its MeshWait
  // answers, then its log lines (a write to stderr may block, and must not
  // hold up the whole coordinator or the answers).
  struct Outbox {
    std::vector<std::function<void()>> logs;
    std::vector<MeshAnswer> answers;
  };

  // Ends the lease of `host_id` (expiry, leave or replacement): removes the
  // host, deletes the keys its lease owns and ends the live mesh generations
  // it holds members of (their waiters' answers and the log lines go to
  // `out`).
  void EndLeaseLocked(const std::string& host_id, absl::string_view why, Outbox* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes every key starting with `prefix`; how many.
  int64_t DeletePrefixLocked(absl::string_view prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseKeyLocked(std::map<std::string, Entry, std::less<>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The timer callback of a lease: ends it if it was not renewed, or
  // schedules itself again at the new expiry.
  void OnLeaseTimer(const std::string& lease_id);
  void OnWaitTimeout(uint64_t waiter_id);
  // Removes Get waiter `it` (its timer and its keys' index entries).
  void EraseWaiterLocked(std::map<uint64_t, Waiter>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes MeshWait waiter `it` (its timer and its generation's entry).
  void EraseMeshWaiterLocked(std::map<uint64_t, MeshWaiter>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The waiters whose keys are now all present, with their values.
  void CollectReadyLocked(absl::string_view key, std::vector<Answer>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when they hold more than kMaxAnswerBytes.
  absl::StatusOr<std::vector<KeyValue>> ValuesLocked(const std::vector<std::string>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<HostRecord> HostsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t WaiterCountLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Ends the live generation of `record` for `reason`: its waiters get
  // ABORTED (into `out`), the reason is kept.
  void EndGenerationLocked(const std::string& key, MeshRecord& record, std::string reason,
                           Outbox* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MeshMembership MembershipLocked(const MeshGeneration& gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DEADLINE_EXCEEDED for a generation still forming: the missing indices
  // and who registered how many.
  absl::Status NotFullLocked(const std::string& key, const MeshGeneration& gen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTED (ended, with the kept reason) or NOT_FOUND (never issued, or
  // forgotten) for a generation of `key` that is not live.
  absl::Status NotLiveLocked(const std::string& key, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the records idle for kMeshMemory (checked at most once a minute,
  // or always with `need_room` when max_meshes are held, then forgetting the
  // record idle the longest). False when no room could be made.
  bool SweepMeshesLocked(bool need_room) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnMeshWaitTimeout(uint64_t waiter_id);
  static void Deliver(Outbox& out);

  const InMemoryCoordinatorOptions options_;
  Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // By host id (ordered: ListHosts is sorted).
  std::map<std::string, Host> hosts_ ABSL_GUARDED_BY(mu_);
  // lease id -> host id.
  absl::flat_hash_map<std::string, std::string> leases_ ABSL_GUARDED_BY(mu_);
  // Ordered, for prefix deletes.
  std::map<std::string, Entry, std::less<>> store_ ABSL_GUARDED_BY(mu_);
  int64_t store_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // lease id -> the keys it owns.
  absl::flat_hash_map<std::string, std::set<std::string>> owned_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // The Gets waiting for each key (a Set looks only at these).
  absl::flat_hash_map<std::string, std::set<uint64_t>> waiting_on_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  // The mesh registry, by key.
  std::map<std::string, MeshRecord, std::less<>> meshes_ ABSL_GUARDED_BY(mu_);
  // Every generation number a forgotten key had is at most this.
  int64_t forgotten_generations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_mesh_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<uint64_t, MeshWaiter> mesh_waiters_ ABSL_GUARDED_BY(mu_);
  // Last member: stopped first in the destructor, before the state above.
  DeadlineTimer timer_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_IN_MEMORY_COORDINATOR_H_
