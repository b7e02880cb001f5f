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
// Thread model: every method takes mu_; Get callbacks and the timer's expiry
// run with no lock held (gathered under the lock, run after unlocking). The
// timer thread expires leases and times out waits.
#ifndef COLLECTIVED_DAEMON_CLUSTER_IN_MEMORY_COORDINATOR_H_
#define COLLECTIVED_DAEMON_CLUSTER_IN_MEMORY_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "common/sync.h"
#include "daemon/cluster/coordinator.h"
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
  // Most Gets waiting at once.
  int max_waiters = 4096;
};

class InMemoryCoordinator final : public Coordinator {
 public:
  explicit InMemoryCoordinator(InMemoryCoordinatorOptions options = {});
  // Shuts down (waiting Gets get UNAVAILABLE) and stops the timer.
  ~InMemoryCoordinator() override;
  InMemoryCoordinator(const InMemoryCoordinator&) = delete;
  InMemoryCoordinator& operator=(const InMemoryCoordinator&) = delete;

  absl::StatusOr<LeaseGrant> Join(absl::string_view host_id, absl::string_view address) override;
  absl::Status Heartbeat(absl::string_view lease_id) override;
  absl::Status Leave(absl::string_view lease_id) override;
  std::vector<HostRecord> ListHosts() override;
  absl::Status Set(absl::string_view key, absl::string_view value,
                   const SetOptions& options) override;
  void Get(std::vector<std::string> keys, absl::Duration timeout, GetCallback done) override;
  absl::StatusOr<int64_t> Delete(const std::vector<std::string>& keys,
                                 absl::string_view prefix) override;
  void Shutdown() override;

  // How many keys are stored (for tests and stats).
  int64_t key_count();

 private:
  struct Host {
    std::string address;
    std::string lease_id;
    absl::Time joined_at;
    absl::Time last_heartbeat;
    absl::Time expires_at;
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

  // Ends the lease of `host_id` (expiry, leave or replacement): removes the
  // host and deletes the keys its lease owns.
  void EndLeaseLocked(const std::string& host_id, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseKeyLocked(std::map<std::string, Entry, std::less<>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The timer callback of a lease: ends it if it was not renewed, or
  // schedules itself again at the new expiry.
  void OnLeaseTimer(const std::string& lease_id);
  void OnWaitTimeout(uint64_t waiter_id);
  // The waiters whose keys are now all present, with their values.
  void CollectReadyLocked(absl::string_view key, std::vector<Answer>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<KeyValue> ValuesLocked(const std::vector<std::string>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<HostRecord> HostsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  // Last member: stopped first in the destructor, before the state above.
  DeadlineTimer timer_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_IN_MEMORY_COORDINATOR_H_
