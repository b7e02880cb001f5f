#include "daemon/cluster/in_memory_coordinator.h"

#include <algorithm>
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

// The first character of `text` for which `ok` is false, quoted for an
// error message, or "" if all are fine.
template <typename Ok>
std::string FirstBadChar(absl::string_view text, Ok ok) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!ok(text[i])) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      return c >= 0x21 && c < 0x7f ? absl::StrCat("'", std::string(1, text[i]), "' at ", i)
                                   : absl::StrCat("byte 0x", absl::Hex(c), " at ", i);
    }
  }
  return "";
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

InMemoryCoordinator::InMemoryCoordinator(InMemoryCoordinatorOptions options)
    : options_(options) {}

InMemoryCoordinator::~InMemoryCoordinator() {
  Shutdown();
  timer_.Stop();
}

absl::StatusOr<LeaseGrant> InMemoryCoordinator::Join(absl::string_view host_id,
                                                     absl::string_view address) {
  if (absl::Status st = ValidateHostId(host_id); !st.ok()) return st;
  if (absl::Status st = ValidateAddress(address); !st.ok()) return st;
  const std::string id(host_id);
  const std::string lease_id = RandomId("l-");
  const absl::Time now = absl::Now();
  LeaseGrant grant;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    if (hosts_.count(id) > 0) {
      EndLeaseLocked(id, "replaced by a new join of the host");
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
    leases_[lease_id] = id;
    grant.lease_id = lease_id;
    grant.ttl = options_.lease_ttl;
    grant.hosts = HostsLocked();
  }
  timer_.Schedule(now + options_.lease_ttl, [this, lease_id] { OnLeaseTimer(lease_id); });
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
  {
    MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) return absl::NotFoundError("lease not found");
    host_id = it->second;
    EndLeaseLocked(host_id, "left");
  }
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

void InMemoryCoordinator::EndLeaseLocked(const std::string& host_id, absl::string_view why) {
  auto h = hosts_.find(host_id);
  if (h == hosts_.end()) return;
  const std::string lease_id = h->second.lease_id;
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
  LogEvent(LogLevel::kDebug, "cluster_lease_ended", {{"host_id", host_id}, {"why", std::string(why)}});
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
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) return;  // left or replaced
    const Host& h = hosts_[it->second];
    const absl::Time now = absl::Now();
    if (now < h.expires_at) {
      // Renewed since: look again at the new expiry.
      timer_.Schedule(h.expires_at, [this, lease_id] { OnLeaseTimer(lease_id); });
      return;
    }
    host_id = it->second;
    EndLeaseLocked(host_id, "expired");
  }
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
  // Every waiter is looked at: at most max_waiters, each with at most
  // kMaxKeysPerRequest keys; rendezvous traffic is a few keys per host.
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& w = it->second;
    const bool wants = std::find(w.keys.begin(), w.keys.end(), key) != w.keys.end();
    const bool ready =
        wants && std::all_of(w.keys.begin(), w.keys.end(),
                             [this](const std::string& k) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                      return store_.count(k) > 0;
                    });
    if (!ready) {
      ++it;
      continue;
    }
    timer_.Cancel(w.timer);
    out->push_back({std::move(w.done), ValuesLocked(w.keys)});
    it = waiters_.erase(it);
  }
}

std::vector<KeyValue> InMemoryCoordinator::ValuesLocked(const std::vector<std::string>& keys) {
  std::vector<KeyValue> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back({k, store_.at(k).value});
  return out;
}

void InMemoryCoordinator::Get(std::vector<std::string> keys, absl::Duration timeout,
                              GetCallback done) {
  if (keys.empty()) {
    done(absl::InvalidArgumentError("keys is empty"));
    return;
  }
  if (keys.size() > kMaxKeysPerRequest) {
    done(absl::InvalidArgumentError(absl::StrCat("keys has ", keys.size(), " keys; at most ",
                                                 kMaxKeysPerRequest, " are allowed")));
    return;
  }
  for (const std::string& k : keys) {
    if (absl::Status st = ValidateKey(k, "keys[]"); !st.ok()) {
      done(st);
      return;
    }
  }
  if (timeout < absl::ZeroDuration()) {
    done(absl::InvalidArgumentError("timeout must be >= 0"));
    return;
  }
  timeout = std::min(timeout, kMaxKeyWait);
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
        now_result = absl::NotFoundError(
            absl::StrCat("keys not set: ", absl::StrJoin(missing, ", ")));
      } else if (static_cast<int>(waiters_.size()) >= options_.max_waiters) {
        now_result = absl::ResourceExhaustedError(
            absl::StrCat(waiters_.size(), " gets are waiting already, the most allowed"));
      } else {
        const uint64_t id = next_waiter_++;
        Waiter& w = waiters_[id];
        w.keys = std::move(keys);
        w.done = std::move(done);
        // Scheduled under mu_: the timeout callback takes mu_ and so cannot
        // look for the waiter before it is complete.
        w.timer = timer_.Schedule(absl::Now() + timeout, [this, id] { OnWaitTimeout(id); });
        return;
      }
    }
  }
  done(std::move(now_result));
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
    waiters_.erase(it);
  }
  done(absl::DeadlineExceededError(
      absl::StrCat("keys not set before the deadline: ", absl::StrJoin(missing, ", "))));
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
  if (!prefix.empty()) {
    for (auto it = store_.lower_bound(std::string(prefix));
         it != store_.end() && absl::StartsWith(it->first, prefix);) {
      auto next = std::next(it);
      EraseKeyLocked(it);
      ++deleted;
      it = next;
    }
  }
  return deleted;
}

void InMemoryCoordinator::Shutdown() {
  std::vector<GetCallback> waiting;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (auto& [id, w] : waiters_) {
      timer_.Cancel(w.timer);
      waiting.push_back(std::move(w.done));
    }
    waiters_.clear();
  }
  for (GetCallback& done : waiting) {
    done(absl::UnavailableError("the coordinator is shutting down"));
  }
}

int64_t InMemoryCoordinator::key_count() {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(store_.size());
}

}  // namespace collectived
