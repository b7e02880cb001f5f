#include "daemon/cluster/in_memory_coordinator.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/util/log.h"
#include "daemon/util/random_id.h"

namespace collectived {
namespace {

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}



}  // namespace

absl::Status ValidateHostId(absl::string_view host_id) {
  if (host_id.empty()) return absl::InvalidArgumentError("host_id is empty");
  if (host_id.size() > kMaxHostIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("host_id is ", host_id.size(),
                                                   " characters long; at most ",
                                                   kMaxHostIdLength, " are allowed"));
  }
  if (std::string bad = FirstBadChar(host_id, IsIdChar); !bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_id has ", bad, "; only [A-Za-z0-9._-] are allowed"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAddress(absl::string_view address) {
  if (address.empty()) return absl::InvalidArgumentError("address is empty");
  if (address.size() > kMaxAddressLength) {
    return absl::InvalidArgumentError(absl::StrCat("address is ", address.size(),
                                                   " characters long; at most ",
                                                   kMaxAddressLength, " are allowed"));
  }
  if (std::string bad = FirstBadChar(address, [](char c) { return c > 0x20 && c < 0x7f; });
      !bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address has ", bad, "; only printable characters without spaces"));
  }
  return absl::OkStatus();
}

absl::Status ValidateKey(absl::string_view key, absl::string_view what) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (key.size() > kMaxKeyLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", key.size(),
                                                   " characters long; at most ",
                                                   kMaxKeyLength, " are allowed"));
  }
  if (std::string bad =
          FirstBadChar(key, [](char c) { return IsIdChar(c) || c == '/' || c == ':'; });
      !bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", key.substr(0, 64), "' has ", bad,
                     "; only [A-Za-z0-9._/:-] are allowed"));
  }
  return absl::OkStatus();
}

absl::Status ValidateValue(absl::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value is ", value.size(), " bytes; at most ", kMaxValueBytes, " are allowed"));
  }
  return absl::OkStatus();
}

namespace {

// A blocking call's timeout: refused when negative, else capped at the
// longest wait the coordinator holds.
absl::StatusOr<absl::Duration> CheckedWait(absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be >= 0");
  return std::min(timeout, kMaxKeyWait);
}

// Most bytes of answers one Set copies for its waiters (under the lock).
constexpr uint64_t kMaxAnswerBytesPerSet = uint64_t{64} << 20;

absl::Status WaitersFullError(size_t waiters) {
  return absl::ResourceExhaustedError(
      absl::StrCat(waiters, " gets and mesh waits are waiting already, the most allowed"));
}

absl::StatusOr<absl::Duration> ValidateGet(const std::vector<std::string>& keys,
                                           absl::Duration timeout) {
  if (keys.empty()) return absl::InvalidArgumentError("keys is empty");
  if (keys.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("keys has ", keys.size(), " keys; at most ",
                                                   kMaxKeysPerRequest, " are allowed"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status st = ValidateKey(keys[i], "keys[]"); !st.ok()) return st;
    for (size_t j = 0; j < i; ++j) {
      if (keys[j] == keys[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys[", i, "] repeats keys[", j, "] ('", keys[i], "')"));
      }
    }
  }
  return CheckedWait(timeout);
}

absl::StatusOr<absl::Duration> ValidateMeshWait(absl::string_view key, int64_t generation,
                                                absl::Duration timeout) {
  if (absl::Status st = ValidateKey(key); !st.ok()) return st;
  if (absl::Status st = ValidateMeshGeneration(generation); !st.ok()) return st;
  return CheckedWait(timeout);
}

}  // namespace

InMemoryCoordinator::InMemoryCoordinator(InMemoryCoordinatorOptions options)
    : options_(options) {}

InMemoryCoordinator::~InMemoryCoordinator() {
  Shutdown();
  timer_.Stop();
}

absl::StatusOr<LeaseGrant> InMemoryCoordinator::Join(absl::string_view host_id,
                                                     absl::string_view address,
                                                     absl::string_view previous_lease_id) {
  if (absl::Status st = ValidateHostId(host_id); !st.ok()) return st;
  if (absl::Status st = ValidateAddress(address); !st.ok()) return st;
  const std::string id(host_id);
  const std::string lease_id = RandomId("l-");
  const absl::Time now = absl::Now();
  LeaseGrant grant;
  Outbox after;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    if (auto live = hosts_.find(id); live != hosts_.end()) {
      if (previous_lease_id.empty() || previous_lease_id != live->second.lease_id) {
        const Host& h = live->second;
        return absl::AlreadyExistsError(absl::StrCat(
            "host id '", id, "' is held by a live daemon at ", h.address, " (last heartbeat ",
            absl::ToInt64Milliseconds(now - h.last_heartbeat), " ms ago; its lease ends ",
            absl::ToInt64Milliseconds(options_.lease_ttl),
            " ms after its last heartbeat): give this daemon another --host-id, or stop the "
            "other one (a restarted daemon that presents its previous lease is let in at "
            "once)"));
      }
      EndLeaseLocked(id, "replaced by its own daemon, which joined again", &after);
    } else if (static_cast<int>(hosts_.size()) >= options_.max_hosts) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the cluster has ", hosts_.size(), " hosts, the most allowed"));
    }
    Host& h = hosts_[id];
    h.address = std::string(address);
    h.lease_id = lease_id;
    h.joined_at = now;
    h.last_heartbeat = now;
    h.expires_at = now + options_.lease_ttl;
    // Under mu_: a Leave right after this Join cancels it.
    h.timer = timer_.Schedule(h.expires_at, [this, lease_id] { OnLeaseTimer(lease_id); });
    leases_[lease_id] = id;
    grant.lease_id = lease_id;
    grant.ttl = options_.lease_ttl;
    grant.hosts = HostsLocked();
  }
  Deliver(after);
  LogEvent(LogLevel::kInfo, "cluster_host_joined",
           {{"host_id", id}, {"address", std::string(address)},
            {"lease_ttl_ms", absl::StrCat(absl::ToInt64Milliseconds(options_.lease_ttl))}});
  return grant;
}

absl::Status InMemoryCoordinator::Heartbeat(absl::string_view lease_id) {
  if (lease_id.empty()) return absl::InvalidArgumentError("lease_id is empty");
  MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        "lease not found: it expired, was left or replaced, or the coordinator restarted; "
        "join again");
  }
  Host& h = hosts_[it->second];
  h.last_heartbeat = absl::Now();
  // The lease's timer reschedules itself at the new expiry when it fires.
  h.expires_at = h.last_heartbeat + options_.lease_ttl;
  return absl::OkStatus();
}

absl::Status InMemoryCoordinator::Leave(absl::string_view lease_id) {
  if (lease_id.empty()) return absl::InvalidArgumentError("lease_id is empty");
  std::string host_id;
  Outbox after;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) return absl::NotFoundError("lease not found");
    host_id = it->second;
    EndLeaseLocked(host_id, "left", &after);
  }
  Deliver(after);
  LogEvent(LogLevel::kInfo, "cluster_host_left", {{"host_id", host_id}});
  return absl::OkStatus();
}

std::vector<HostRecord> InMemoryCoordinator::ListHosts() {
  MutexLock lock(&mu_);
  return HostsLocked();
}

std::vector<HostRecord> InMemoryCoordinator::HostsLocked() {
  std::vector<HostRecord> out;
  out.reserve(hosts_.size());
  for (const auto& [id, h] : hosts_) {
    out.push_back({id, h.address, h.joined_at, h.last_heartbeat});
  }
  return out;
}

void InMemoryCoordinator::EndLeaseLocked(const std::string& host_id, absl::string_view why,
                                         Outbox* out) {
  auto h = hosts_.find(host_id);
  if (h == hosts_.end()) return;
  const std::string lease_id = h->second.lease_id;
  // A lease that expired is ended from its own timer, which has started
  // (Cancel does nothing then); a left or replaced one stops its timer here.
  timer_.Cancel(h->second.timer);
  leases_.erase(lease_id);
  hosts_.erase(h);
  if (auto owned = owned_.find(lease_id); owned != owned_.end()) {
    for (const std::string& key : owned->second) {
      if (auto it = store_.find(key); it != store_.end() && it->second.owner_lease == lease_id) {
        store_bytes_ -= static_cast<int64_t>(it->first.size() + it->second.value.size());
        store_.erase(it);
      }
    }
    owned_.erase(owned);
  }
  for (auto& [key, record] : meshes_) {
    if (record.live != nullptr && record.live->host_members.count(host_id) > 0) {
      EndGenerationLocked(key, record,
                          absl::StrCat("host ", host_id, "'s lease ended (", why, ")"), out);
    }
  }
  LogEventLater(out->logs, LogLevel::kDebug, "cluster_lease_ended",
                {{"host_id", host_id}, {"why", std::string(why)}});
}

void InMemoryCoordinator::EraseKeyLocked(std::map<std::string, Entry, std::less<>>::iterator it) {
  if (!it->second.owner_lease.empty()) {
    if (auto owned = owned_.find(it->second.owner_lease); owned != owned_.end()) {
      owned->second.erase(it->first);
    }
  }
  store_bytes_ -= static_cast<int64_t>(it->first.size() + it->second.value.size());
  store_.erase(it);
}

void InMemoryCoordinator::OnLeaseTimer(const std::string& lease_id) {
  std::string host_id;
  Outbox after;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) return;  // left or replaced
    Host& h = hosts_[it->second];
    const absl::Time now = absl::Now();
    if (now < h.expires_at) {
      // Renewed since: look again at the new expiry.
      h.timer = timer_.Schedule(h.expires_at, [this, lease_id] { OnLeaseTimer(lease_id); });
      return;
    }
    host_id = it->second;
    EndLeaseLocked(host_id, "expired", &after);
  }
  Deliver(after);
  LogEvent(LogLevel::kWarn, "cluster_lease_expired",
           {{"host_id", host_id},
            {"lease_ttl_ms", absl::StrCat(absl::ToInt64Milliseconds(options_.lease_ttl))}});
}

absl::Status InMemoryCoordinator::Set(absl::string_view key, absl::string_view value,
                                      const SetOptions& options) {
  if (absl::Status st = ValidateKey(key); !st.ok()) return st;
  if (absl::Status st = ValidateValue(value); !st.ok()) return st;
  std::vector<Answer> answers;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    if (!options.lease_id.empty() && leases_.count(options.lease_id) == 0) {
      return absl::NotFoundError("lease_id: lease not found (expired or left); join again");
    }
    auto it = store_.find(key);
    const int64_t new_bytes = static_cast<int64_t>(key.size() + value.size());
    int64_t old_bytes = 0;
    if (it != store_.end()) {
      if (!options.overwrite) {
        return absl::AlreadyExistsError(
            absl::StrCat("key '", key, "' exists; set overwrite to replace it"));
      }
      old_bytes = static_cast<int64_t>(it->first.size() + it->second.value.size());
    } else if (static_cast<int64_t>(store_.size()) >= options_.max_keys) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the store holds ", store_.size(), " keys, the most allowed"));
    }
    if (store_bytes_ - old_bytes + new_bytes > options_.max_store_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the store would hold more than ", options_.max_store_bytes, " bytes"));
    }
    if (it != store_.end()) EraseKeyLocked(it);
    Entry& e = store_[std::string(key)];
    e.value = std::string(value);
    e.owner_lease = options.lease_id;
    store_bytes_ += new_bytes;
    if (!options.lease_id.empty()) owned_[options.lease_id].insert(std::string(key));
    CollectReadyLocked(key, &answers);
  }
  for (Answer& a : answers) a.done(std::move(a.result));
  return absl::OkStatus();
}

void InMemoryCoordinator::CollectReadyLocked(absl::string_view key, std::vector<Answer>* out) {
  // Only the waiters of `key` are looked at (each with at most
  // kMaxKeysPerRequest keys), in the order they came.
  auto on = waiting_on_.find(key);
  if (on == waiting_on_.end()) return;
  // The answers are copied here, under mu_: at most kMaxAnswerBytesPerSet
  // of them for one Set (rendezvous traffic is a few KiB per host); the
  // waiters past it get RESOURCE_EXHAUSTED instead of a copy.
  const std::set<uint64_t> ids = on->second;
  uint64_t copied = 0;
  for (uint64_t id : ids) {
    auto it = waiters_.find(id);
    Waiter& w = it->second;
    uint64_t bytes = 0;
    const bool ready =
        std::all_of(w.keys.begin(), w.keys.end(),
                    [this, &bytes](const std::string& k) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                      auto e = store_.find(k);
                      if (e == store_.end()) return false;
                      bytes += e->second.value.size();
                      return true;
                    });
    if (!ready) continue;
    // An answer past kMaxAnswerBytes is refused by ValuesLocked, uncopied.
    const bool copies = bytes <= kMaxAnswerBytes;
    if (copies && copied + bytes > kMaxAnswerBytesPerSet) {
      out->push_back({std::move(w.done),
                      absl::ResourceExhaustedError(absl::StrCat(
                          "the key set for this get released more than ", kMaxAnswerBytesPerSet,
                          " bytes of answers at once; get again"))});
    } else {
      if (copies) copied += bytes;
      out->push_back({std::move(w.done), ValuesLocked(w.keys)});
    }
    EraseWaiterLocked(it);
  }
}

void InMemoryCoordinator::EraseWaiterLocked(std::map<uint64_t, Waiter>::iterator it) {
  timer_.Cancel(it->second.timer);
  for (const std::string& k : it->second.keys) {
    auto on = waiting_on_.find(k);
    if (on == waiting_on_.end()) continue;
    on->second.erase(it->first);
    if (on->second.empty()) waiting_on_.erase(on);
  }
  waiters_.erase(it);
}

absl::StatusOr<std::vector<KeyValue>> InMemoryCoordinator::ValuesLocked(
    const std::vector<std::string>& keys) {
  size_t bytes = 0;
  for (const std::string& k : keys) bytes += store_.at(k).value.size();
  if (bytes > kMaxAnswerBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the values of these ", keys.size(),
                                                     " keys are ", bytes, " bytes; one get answers at most ",
                                                     kMaxAnswerBytes));
  }
  std::vector<KeyValue> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back({k, store_.at(k).value});
  return out;
}

WaitId InMemoryCoordinator::Get(std::vector<std::string> keys, absl::Duration timeout,
                                GetCallback done) {
  absl::StatusOr<absl::Duration> checked = ValidateGet(keys, timeout);
  if (!checked.ok()) {
    done(checked.status());
    return 0;
  }
  timeout = *checked;
  absl::StatusOr<std::vector<KeyValue>> now_result;
  {
    MutexLock lock(&mu_);
    if (shutdown_) {
      now_result = absl::UnavailableError("the coordinator is shutting down");
    } else {
      std::vector<std::string> missing;
      for (const std::string& k : keys) {
        if (store_.count(k) == 0) missing.push_back(k);
      }
      if (missing.empty()) {
        now_result = ValuesLocked(keys);
      } else if (timeout == absl::ZeroDuration()) {
        now_result = absl::NotFoundError(absl::StrCat("keys not set: ", BoundedList(missing)));
      } else if (WaiterCountLocked() >= options_.max_waiters) {
        now_result = WaitersFullError(WaiterCountLocked());
      } else {
        const uint64_t id = next_waiter_++;
        Waiter& w = waiters_[id];
        w.keys = std::move(keys);
        for (const std::string& k : w.keys) waiting_on_[k].insert(id);
        w.done = std::move(done);
        // Scheduled under mu_: the timeout callback takes mu_ and so cannot
        // look for the waiter before it is complete.
        w.timer = timer_.Schedule(absl::Now() + timeout, [this, id] { OnWaitTimeout(id); });
        return id;
      }
    }
  }
  done(std::move(now_result));
  return 0;
}

void InMemoryCoordinator::OnWaitTimeout(uint64_t waiter_id) {
  GetCallback done;
  std::vector<std::string> missing;
  {
    MutexLock lock(&mu_);
    auto it = waiters_.find(waiter_id);
    if (it == waiters_.end()) return;  // answered meanwhile
    for (const std::string& k : it->second.keys) {
      if (store_.count(k) == 0) missing.push_back(k);
    }
    done = std::move(it->second.done);
    EraseWaiterLocked(it);
  }
  done(absl::DeadlineExceededError(
      absl::StrCat("keys not set before the deadline: ", BoundedList(missing))));
}

absl::StatusOr<int64_t> InMemoryCoordinator::Delete(const std::vector<std::string>& keys,
                                                    absl::string_view prefix) {
  if (keys.empty() && prefix.empty()) {
    return absl::InvalidArgumentError("give keys or a prefix to delete");
  }
  if (keys.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("keys has ", keys.size(), " keys; at most ",
                                                   kMaxKeysPerRequest, " are allowed"));
  }
  for (const std::string& k : keys) {
    if (absl::Status st = ValidateKey(k, "keys[]"); !st.ok()) return st;
  }
  if (!prefix.empty()) {
    if (absl::Status st = ValidateKey(prefix, "prefix"); !st.ok()) return st;
  }
  MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
  int64_t deleted = 0;
  for (const std::string& k : keys) {
    if (auto it = store_.find(k); it != store_.end()) {
      EraseKeyLocked(it);
      ++deleted;
    }
  }
  if (!prefix.empty()) deleted += DeletePrefixLocked(prefix);
  return deleted;
}

int64_t InMemoryCoordinator::DeletePrefixLocked(absl::string_view prefix) {
  int64_t deleted = 0;
  for (auto it = store_.lower_bound(prefix);
       it != store_.end() && absl::StartsWith(it->first, prefix);) {
    auto next = std::next(it);
    EraseKeyLocked(it);
    ++deleted;
    it = next;
  }
  return deleted;
}

void InMemoryCoordinator::Shutdown() {
  std::vector<GetCallback> waiting;
  std::vector<MeshWaitCallback> mesh_waiting;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (auto& [id, w] : waiters_) {
      timer_.Cancel(w.timer);
      waiting.push_back(std::move(w.done));
    }
    waiters_.clear();
    waiting_on_.clear();
    for (auto& [id, w] : mesh_waiters_) {
      timer_.Cancel(w.timer);
      mesh_waiting.push_back(std::move(w.done));
    }
    mesh_waiters_.clear();
    for (auto& [key, record] : meshes_) {
      if (record.live != nullptr) record.live->waiters.clear();
    }
  }
  for (GetCallback& done : waiting) {
    done(absl::UnavailableError("the coordinator is shutting down"));
  }
  for (MeshWaitCallback& done : mesh_waiting) {
    done(absl::UnavailableError("the coordinator is shutting down"));
  }
}

// ---- The mesh registry ----

void InMemoryCoordinator::Deliver(Outbox& out) {
  for (MeshAnswer& a : out.answers) a.done(std::move(a.result));
  out.answers.clear();
  for (std::function<void()>& log : out.logs) log();
  out.logs.clear();
}

int64_t InMemoryCoordinator::WaiterCountLocked() {
  return static_cast<int64_t>(waiters_.size() + mesh_waiters_.size());
}

MeshMembership InMemoryCoordinator::MembershipLocked(const MeshGeneration& gen) {
  // Called by MembershipOf before it returns, under mu_.
  return MembershipOf(gen, [this](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    HostRecord r;
    // Every host of a live generation holds a lease (a lease's end ends it).
    if (auto h = hosts_.find(id); h != hosts_.end()) {
      r.address = h->second.address;
      r.joined_at = h->second.joined_at;
      r.last_heartbeat = h->second.last_heartbeat;
    }
    return r;
  });
}

absl::Status InMemoryCoordinator::NotFullLocked(const std::string& key,
                                                const MeshGeneration& gen) {
  return NotFullError(key, gen);
}

absl::Status InMemoryCoordinator::NotLiveLocked(const std::string& key, int64_t generation) {
  auto it = meshes_.find(key);
  if (it == meshes_.end() || generation > it->second.last_generation ||
      generation < it->second.first_generation) {
    return absl::NotFoundError(absl::StrCat(
        "mesh '", key, "' has no generation ", generation,
        " (never registered, or forgotten: ended more than ", absl::FormatDuration(kMeshMemory),
        " ago, or sooner to make room for other meshes)"));
  }
  for (const MeshEnding& e : it->second.endings) {
    if (e.generation == generation) {
      return absl::AbortedError(absl::StrCat(MeshName(key, generation), " ended: ", e.reason));
    }
  }
  return absl::AbortedError(absl::StrCat(MeshName(key, generation),
                                         " ended (the mesh is at generation ",
                                         it->second.last_generation, " now)"));
}

void InMemoryCoordinator::EndGenerationLocked(const std::string& key, MeshRecord& record,
                                              std::string reason, Outbox* out) {
  MeshGeneration& gen = *record.live;
  const absl::Status aborted =
      absl::AbortedError(absl::StrCat(MeshName(key, gen.number), " ended: ", reason));
  for (uint64_t id : gen.waiters) {
    auto w = mesh_waiters_.find(id);
    if (w == mesh_waiters_.end()) continue;
    timer_.Cancel(w->second.timer);
    out->answers.push_back({std::move(w->second.done), aborted});
    mesh_waiters_.erase(w);
  }
  // The keys its hosts connected through are of no use any more.
  const int64_t deleted = DeletePrefixLocked(MeshStorePrefix(key, gen.number) + "/");
  LogEventLater(out->logs, LogLevel::kInfo, "cluster_mesh_ended",
                {{"key", key},
                 {"generation", absl::StrCat(gen.number)},
                 {"reason", reason},
                 {"store_keys_deleted", absl::StrCat(deleted)}});
  record.endings.push_back({gen.number, std::move(reason)});
  while (record.endings.size() > kKeptMeshEndings) record.endings.pop_front();
  record.idle_since = absl::Now();
  record.live.reset();
}

bool InMemoryCoordinator::SweepMeshesLocked(bool need_room) {
  const absl::Time now = absl::Now();
  if (!need_room && now - last_mesh_sweep_ < absl::Minutes(1)) return true;
  last_mesh_sweep_ = now;
  auto oldest = meshes_.end();
  for (auto it = meshes_.begin(); it != meshes_.end();) {
    const MeshRecord& r = it->second;
    if (r.live != nullptr) {
      ++it;
      continue;
    }
    if (now - r.idle_since >= kMeshMemory) {
      forgotten_generations_ = std::max(forgotten_generations_, r.last_generation);
      it = meshes_.erase(it);
      continue;
    }
    if (oldest == meshes_.end() || r.idle_since < oldest->second.idle_since) oldest = it;
    ++it;
  }
  if (!need_room || static_cast<int64_t>(meshes_.size()) < options_.max_meshes) return true;
  if (oldest == meshes_.end()) return false;
  forgotten_generations_ = std::max(forgotten_generations_, oldest->second.last_generation);
  meshes_.erase(oldest);
  return true;
}

absl::StatusOr<int64_t> InMemoryCoordinator::MeshRegister(const MeshRegistration& reg) {
  if (absl::Status st = ValidateMeshRegistration(reg); !st.ok()) return st;
  Outbox after;
  int64_t number = 0;
  bool became_ready = false;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    auto lease = leases_.find(reg.lease_id);
    if (lease == leases_.end() || lease->second != reg.host_id) {
      return absl::NotFoundError(absl::StrCat(
          "lease_id: host ", reg.host_id,
          " holds no such lease (it expired, was left or replaced); join again"));
    }
    SweepMeshesLocked(/*need_room=*/false);
    auto it = meshes_.find(reg.key);
    if (it == meshes_.end()) {
      if (static_cast<int64_t>(meshes_.size()) >= options_.max_meshes &&
          !SweepMeshesLocked(/*need_room=*/true)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the registry holds ", meshes_.size(), " meshes, the most allowed"));
      }
      it = meshes_.emplace(reg.key, MeshRecord()).first;
      it->second.last_generation = forgotten_generations_;
      it->second.first_generation = forgotten_generations_ + 1;
    }
    MeshRecord& record = it->second;
    if (record.live != nullptr) {
      if (absl::Status st = CheckRegistration(reg.key, *record.live, reg); !st.ok()) return st;
    } else {
      record.live = std::make_unique<MeshGeneration>();
      static_cast<RegistryGeneration&>(*record.live) =
          StartGeneration(++record.last_generation, reg);
    }
    MeshGeneration& gen = *record.live;
    number = gen.number;
    AddRegistration(gen, reg);
    if (gen.full()) {
      became_ready = true;
      const MeshMembership membership = MembershipLocked(gen);
      for (uint64_t id : gen.waiters) {
        auto w = mesh_waiters_.find(id);
        if (w == mesh_waiters_.end()) continue;
        timer_.Cancel(w->second.timer);
        after.answers.push_back({std::move(w->second.done), membership});
        mesh_waiters_.erase(w);
      }
      gen.waiters.clear();
    }
  }
  Deliver(after);
  if (became_ready) {
    LogEvent(LogLevel::kInfo, "cluster_mesh_ready",
             {{"key", reg.key}, {"generation", absl::StrCat(number)},
              {"members", absl::StrCat(reg.members)}});
  }
  return number;
}

WaitId InMemoryCoordinator::MeshWait(std::string key, int64_t generation,
                                     absl::Duration timeout, MeshWaitCallback done) {
  absl::StatusOr<absl::Duration> checked = ValidateMeshWait(key, generation, timeout);
  if (!checked.ok()) {
    done(checked.status());
    return 0;
  }
  timeout = *checked;
  absl::StatusOr<MeshMembership> now_result;
  {
    MutexLock lock(&mu_);
    auto it = meshes_.find(key);
    MeshGeneration* gen = it != meshes_.end() && it->second.live != nullptr &&
                                  it->second.live->number == generation
                              ? it->second.live.get()
                              : nullptr;
    if (shutdown_) {
      now_result = absl::UnavailableError("the coordinator is shutting down");
    } else if (gen == nullptr) {
      now_result = NotLiveLocked(key, generation);
    } else if (gen->full()) {
      now_result = MembershipLocked(*gen);
    } else if (timeout == absl::ZeroDuration()) {
      now_result = NotFullLocked(key, *gen);
    } else if (WaiterCountLocked() >= options_.max_waiters) {
      now_result = WaitersFullError(WaiterCountLocked());
    } else {
      const uint64_t id = next_waiter_++;
      MeshWaiter& w = mesh_waiters_[id];
      w.key = std::move(key);
      w.done = std::move(done);
      gen->waiters.insert(id);
      // Scheduled under mu_, as Get's timeout.
      w.timer = timer_.Schedule(absl::Now() + timeout, [this, id] { OnMeshWaitTimeout(id); });
      return id;
    }
  }
  done(std::move(now_result));
  return 0;
}

void InMemoryCoordinator::CancelWait(WaitId id) {
  const absl::Status cancelled = absl::CancelledError("the caller went away");
  GetCallback get_done;
  MeshWaitCallback mesh_done;
  {
    MutexLock lock(&mu_);
    if (auto w = waiters_.find(id); w != waiters_.end()) {
      get_done = std::move(w->second.done);
      EraseWaiterLocked(w);
    } else if (auto m = mesh_waiters_.find(id); m != mesh_waiters_.end()) {
      mesh_done = std::move(m->second.done);
      EraseMeshWaiterLocked(m);
    }
  }
  if (get_done) get_done(cancelled);
  if (mesh_done) mesh_done(cancelled);
}

int64_t InMemoryCoordinator::waiter_count() {
  MutexLock lock(&mu_);
  return WaiterCountLocked();
}

void InMemoryCoordinator::OnMeshWaitTimeout(uint64_t waiter_id) {
  MeshWaitCallback done;
  absl::Status status;
  {
    MutexLock lock(&mu_);
    auto w = mesh_waiters_.find(waiter_id);
    if (w == mesh_waiters_.end()) return;  // answered meanwhile
    done = std::move(w->second.done);
    // A waiter is answered when its generation fills or ends, so the key's
    // live generation is still the one it waits for.
    auto it = meshes_.find(w->second.key);
    if (it != meshes_.end() && it->second.live != nullptr) {
      status = NotFullLocked(w->second.key, *it->second.live);
    } else {
      status = absl::DeadlineExceededError(
          absl::StrCat("mesh '", w->second.key, "' did not fill before the deadline"));
    }
    EraseMeshWaiterLocked(w);
  }
  done(status);
}

void InMemoryCoordinator::EraseMeshWaiterLocked(std::map<uint64_t, MeshWaiter>::iterator it) {
  timer_.Cancel(it->second.timer);
  if (auto m = meshes_.find(it->second.key); m != meshes_.end() && m->second.live != nullptr) {
    m->second.live->waiters.erase(it->first);
  }
  mesh_waiters_.erase(it);
}

absl::Status InMemoryCoordinator::MeshLeave(absl::string_view key, int64_t generation,
                                            absl::string_view host_id, absl::string_view lease_id,
                                            const std::vector<int32_t>& indices, bool broken,
                                            absl::string_view reason) {
  if (absl::Status st = ValidateMeshLeave(key, generation, indices, reason); !st.ok()) return st;
  if (absl::Status st = ValidateHostId(host_id); !st.ok()) return st;
  Outbox after;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    if (auto lease = leases_.find(lease_id); lease == leases_.end() || lease->second != host_id) {
      return absl::NotFoundError(absl::StrCat(
          "lease_id: host ", host_id,
          " holds no such lease (it expired, was left or replaced, which ended its meshes)"));
    }
    auto it = meshes_.find(key);
    if (it == meshes_.end() || it->second.live == nullptr ||
        it->second.live->number != generation) {
      absl::Status st = NotLiveLocked(std::string(key), generation);
      // A generation that ended already: nothing changes.
      return st.code() == absl::StatusCode::kAborted ? absl::OkStatus() : st;
    }
    MeshRecord& record = it->second;
    MeshGeneration& gen = *record.live;
    const std::string host(host_id);
    // Only a host with members in the generation can end it or free indices.
    if (gen.host_members.count(host) == 0) return absl::OkStatus();
    if (broken || gen.full()) {
      // Members leaving a formed mesh break it.
      EndGenerationLocked(
          it->first, record,
          absl::StrCat("host ", host, ": ",
                       reason.empty() ? (broken ? "broke" : "left the formed mesh") : reason),
          &after);
    } else {
      RemoveRegistrations(gen, host, indices);
      if (gen.member_host.empty()) {
        EndGenerationLocked(it->first, record, "every member left", &after);
      }
    }
  }
  Deliver(after);
  return absl::OkStatus();
}

int64_t InMemoryCoordinator::mesh_key_count() {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(meshes_.size());
}

int64_t InMemoryCoordinator::timer_count() { return static_cast<int64_t>(timer_.pending()); }

int64_t InMemoryCoordinator::key_count() {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(store_.size());
}

}  // namespace collectived
