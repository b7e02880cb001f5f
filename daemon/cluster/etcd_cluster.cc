#include "daemon/cluster/etcd_cluster.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "collectived/v1/etcd_records.pb.h"
#include "daemon/cluster/lease_file.h"
#include "daemon/cluster/mesh_registry.h"
#include "daemon/util/log.h"

namespace collectived {
namespace {

// The reasons of the generations that ended, kept per key.
constexpr int kKeptEndings = 8;
// How long a registry call (not a wait) may take, retries on conflicts
// included.
constexpr absl::Duration kCallTime = absl::Seconds(10);

RegistryGeneration ToGeneration(const v1::EtcdMesh& m) {
  RegistryGeneration g;
  g.number = m.generation();
  g.axes = m.axes();
  g.members = m.members();
  g.token_digest = m.token_digest();
  g.first_host = m.first_host();
  g.op_timeout_ms = m.op_timeout_ms();
  g.op_timeout_host = m.op_timeout_host();
  g.secret = m.secret();
  for (const auto& [index, host] : m.member_host()) {
    g.member_host[index] = host;
    ++g.host_members[host];
  }
  return g;
}

void FromGeneration(const RegistryGeneration& g, v1::EtcdMesh* m) {
  m->set_generation(g.number);
  m->set_ended(false);
  m->set_axes(g.axes);
  m->set_members(g.members);
  m->set_token_digest(g.token_digest);
  m->set_first_host(g.first_host);
  m->set_op_timeout_ms(g.op_timeout_ms);
  m->set_op_timeout_host(g.op_timeout_host);
  m->set_secret(g.secret);
  m->clear_member_host();
  for (const auto& [index, host] : g.member_host) (*m->mutable_member_host())[index] = host;
}

// The compare that the record is as it was read.
EtcdCompare Unchanged(const std::string& key, bool exists, int64_t mod_revision) {
  return exists ? EtcdCompare::ModRevision(key, EtcdCompare::Result::kEqual, mod_revision)
                : EtcdCompare::Absent(key);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEtcdAddress(const std::string& address, bool* tls) {
  std::string rest;
  if (absl::StartsWith(address, "etcd://")) {
    *tls = false;
    rest = address.substr(7);
  } else if (absl::StartsWith(address, "etcds://")) {
    *tls = true;
    rest = address.substr(8);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not etcd://HOST:PORT[,HOST:PORT...] (or etcds://)"));
  }
  std::vector<std::string> endpoints = absl::StrSplit(rest, ',', absl::SkipWhitespace());
  if (endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' names no etcd endpoint"));
  }
  for (const std::string& e : endpoints) {
    const size_t colon = e.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(e.substr(colon + 1), &port) ||
        port <= 0 || port > 65535 || e.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", e, "' is not HOST:PORT (in '", address, "')"));
    }
  }
  return endpoints;
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Create(EtcdClusterOptions options) {
  if (absl::Status st = ValidateHostId(options.host_id); !st.ok()) return st;
  if (absl::Status st = ValidateAddress(options.address); !st.ok()) return st;
  if (options.prefix.empty() || options.prefix.back() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("the etcd key prefix '", options.prefix, "' must end with '/'"));
  }
  if (options.lease_ttl < absl::Seconds(1) || options.retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must be >= 1 s and retry_interval positive");
  }
  auto etcd = EtcdClient::Create(options.etcd);
  if (!etcd.ok()) return etcd.status();
  return std::unique_ptr<EtcdCluster>(new EtcdCluster(std::move(options), *std::move(etcd)));
}

EtcdCluster::EtcdCluster(EtcdClusterOptions options, std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), etcd_(std::move(etcd)), ttl_(options_.lease_ttl) {}

EtcdCluster::~EtcdCluster() { Stop(/*leave=*/false); }

std::string EtcdCluster::description() const {
  return absl::StrCat("etcd://", absl::StrJoin(etcd_->endpoints(), ","));
}

std::string EtcdCluster::HostKey(const std::string& id) const {
  return absl::StrCat(options_.prefix, "hosts/", id);
}
std::string EtcdCluster::MeshKey(const std::string& key) const {
  return absl::StrCat(options_.prefix, "meshes/", key);
}
std::string EtcdCluster::StoreKey(const std::string& key) const {
  return absl::StrCat(options_.prefix, "store/", key);
}

absl::Time EtcdCluster::CallDeadline() const { return absl::Now() + kCallTime; }

// ---- Membership ----

void EtcdCluster::Start() {
  MutexLock lock(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  int64_t previous = 0;
  if (absl::SimpleAtoi(ReadLeaseFile(options_.lease_file), &previous)) previous_lease_ = previous;
  thread_ = std::thread([this] { Loop(); });
}

void EtcdCluster::Stop(bool leave) {
  int64_t lease = 0;
  {
    MutexLock lock(&mu_);
    if (state_ == ClusterState::kStopped) return;
    stopping_ = true;
    wake_.SignalAll();
    lease = lease_;
    lease_ = 0;
  }
  if (thread_.joinable()) thread_.join();
  if (leave && lease != 0) {
    absl::Status st = etcd_->RevokeLease(lease, absl::Now() + options_.etcd.rpc_timeout);
    if (!st.ok() && !absl::IsNotFound(st)) {
      LogEvent(LogLevel::kWarn, "cluster_leave_failed", {{"error", st.ToString()}});
    }
  }
  MutexLock lock(&mu_);
  state_ = ClusterState::kStopped;
}

ClusterState EtcdCluster::state() {
  MutexLock lock(&mu_);
  return state_;
}

std::string EtcdCluster::lease_id() {
  MutexLock lock(&mu_);
  return lease_ == 0 ? "" : absl::StrCat(lease_);
}

int64_t EtcdCluster::lease() {
  MutexLock lock(&mu_);
  return lease_;
}

absl::Status EtcdCluster::last_error() {
  MutexLock lock(&mu_);
  return last_error_;
}

bool EtcdCluster::WaitForState(ClusterState want, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (state_ != want && absl::Now() < deadline) wake_.WaitWithDeadline(&mu_, deadline);
  return state_ == want;
}

void EtcdCluster::SetState(ClusterState state, const absl::Status& error) {
  bool changed;
  {
    MutexLock lock(&mu_);
    changed = state_ != state;
    state_ = state;
    last_error_ = error;
    wake_.SignalAll();
  }
  if (changed) LogClusterState(options_.host_id, state, error);
}

bool EtcdCluster::SleepUnlessStopping(absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  MutexLock lock(&mu_);
  while (!stopping_ && absl::Now() < deadline) wake_.WaitWithDeadline(&mu_, deadline);
  return !stopping_;
}

absl::Status EtcdCluster::JoinOnce() {
  const absl::Time deadline = absl::Now() + 2 * options_.etcd.rpc_timeout;
  auto granted = etcd_->GrantLease(options_.lease_ttl, deadline);
  if (!granted.ok()) return granted.status();
  const int64_t lease = granted->id;
  v1::EtcdHost record;
  record.set_address(options_.address);
  record.set_joined_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  const std::string key = HostKey(options_.host_id);
  const std::string value = record.SerializeAsString();
  auto fail = [&](absl::Status st) {
    // The lease granted for nothing goes (it would expire anyway).
    (void)etcd_->RevokeLease(lease, absl::Now() + options_.etcd.rpc_timeout);
    return st;
  };
  auto txn = etcd_->Txn({EtcdCompare::Absent(key)}, {EtcdOp::Put(key, value, lease)},
                        {EtcdOp::Get(key)}, deadline);
  if (!txn.ok()) return fail(txn.status());
  if (!txn->succeeded) {
    const EtcdRange& held = txn->ranges.at(0);
    if (held.kvs.empty()) return fail(absl::AbortedError("the host record changed; try again"));
    const EtcdKeyValue& kv = held.kvs[0];
    if (kv.lease == lease) {
      // Our own write, applied before its answer was lost.
    } else if (previous_lease_ != 0 && kv.lease == previous_lease_) {
      // This daemon's former self (it restarted, or lost touch): it takes
      // the id back at once; the old lease's keys go with it.
      auto again = etcd_->Txn(
          {EtcdCompare::Lease(key, EtcdCompare::Result::kEqual, previous_lease_)},
          {EtcdOp::Put(key, value, lease)}, {}, deadline);
      if (!again.ok()) return fail(again.status());
      if (!again->succeeded) return fail(absl::AbortedError("the host record changed; try again"));
      (void)etcd_->RevokeLease(previous_lease_, deadline);
    } else {
      v1::EtcdHost live;
      live.ParseFromString(kv.value);
      return fail(absl::AlreadyExistsError(absl::StrCat(
          "host id '", options_.host_id, "' is held by a live daemon at ", live.address(),
          " (its etcd lease ", kv.lease, " ends ", absl::ToInt64Milliseconds(options_.lease_ttl),
          " ms after its last keep-alive): give this daemon another --host-id, or stop the other "
          "one (a restarted daemon that presents its previous lease is let in at once)")));
    }
  }
  previous_lease_ = lease;
  if (absl::Status st = WriteLeaseFile(options_.lease_file, absl::StrCat(lease)); !st.ok()) {
    LogEvent(LogLevel::kWarn, "cluster_lease_file",
             {{"error", st.ToString()},
              {"effect", "a restart of this daemon waits for its lease to end"}});
  }
  {
    MutexLock lock(&mu_);
    lease_ = lease;
    ttl_ = granted->ttl;
  }
  LogEvent(LogLevel::kInfo, "cluster_joined",
           {{"host_id", options_.host_id}, {"address", options_.address},
            {"coordinator", description()},
            {"lease_ttl_ms", absl::StrCat(absl::ToInt64Milliseconds(granted->ttl))}});
  return absl::OkStatus();
}

void EtcdCluster::Loop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (lease() == 0) {
      absl::Status st = JoinOnce();
      if (st.ok()) {
        SetState(ClusterState::kJoined, absl::OkStatus());
        continue;
      }
      SetState(ClusterState::kUnavailable, st);
      if (!SleepUnlessStopping(options_.retry_interval)) return;
      continue;
    }
    absl::Duration ttl;
    ClusterState now;
    {
      MutexLock lock(&mu_);
      ttl = ttl_;
      now = state_;
    }
    const absl::Duration interval =
        now == ClusterState::kJoined ? ttl / 3 : std::min(ttl / 3, options_.retry_interval);
    if (!SleepUnlessStopping(interval)) return;
    const int64_t held = lease();
    if (held == 0) continue;
    auto kept = etcd_->KeepAlive(held, absl::Now() + options_.etcd.rpc_timeout);
    if (kept.ok()) {
      SetState(ClusterState::kJoined, absl::OkStatus());
    } else if (absl::IsNotFound(kept.status())) {
      // The lease ended (etcd was away longer than it): join again, which
      // takes the host id back with the previous lease if nobody took it.
      {
        MutexLock lock(&mu_);
        lease_ = 0;
      }
      SetState(ClusterState::kUnavailable, kept.status());
    } else {
      // etcd is away for a moment: the lease may still hold.
      SetState(ClusterState::kUnavailable, kept.status());
    }
  }
}

// ---- The store ----

absl::Status EtcdCluster::Set(const std::string& key, const std::string& value, bool overwrite,
                              bool owned) {
  if (absl::Status st = ValidateKey(key); !st.ok()) return st;
  if (absl::Status st = ValidateValue(value); !st.ok()) return st;
  const int64_t held = owned ? lease() : 0;
  if (owned && held == 0) {
    return absl::FailedPreconditionError("this daemon is not joined to the cluster (no lease)");
  }
  const std::string k = StoreKey(key);
  const absl::Time deadline = CallDeadline();
  if (overwrite) return etcd_->Put(k, value, held, deadline).status();
  auto txn = etcd_->Txn({EtcdCompare::Absent(k)}, {EtcdOp::Put(k, value, held)},
                        {EtcdOp::Get(k)}, deadline);
  if (!txn.ok()) return txn.status();
  if (txn->succeeded) return absl::OkStatus();
  const EtcdRange& there = txn->ranges.at(0);
  if (!there.kvs.empty() && there.kvs[0].value == value && there.kvs[0].lease == held) {
    return absl::OkStatus();  // our own write, whose answer was lost
  }
  return absl::AlreadyExistsError(absl::StrCat("key '", key, "' is already set"));
}

bool EtcdCluster::WaitForChange(std::unique_ptr<EtcdWatch>& watch, int64_t revision,
                                absl::Time deadline) {
  if (watch == nullptr) {
    auto w = etcd_->Watch(options_.prefix, /*prefix=*/true, revision + 1, deadline);
    if (!w.ok()) {
      // etcd is away: look again a little later (the caller reads again).
      absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
      return absl::Now() < deadline;
    }
    watch = *std::move(w);
  }
  auto events = watch->Next(deadline);
  if (events.ok()) return true;
  if (!absl::IsDeadlineExceeded(events.status())) {
    // The watch ended (compaction, etcd away): read again and watch anew.
    watch.reset();
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
  return absl::Now() < deadline;
}

absl::StatusOr<std::vector<std::string>> EtcdCluster::Get(const std::vector<std::string>& keys,
                                                          absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be >= 0");
  if (keys.empty() || keys.size() > kMaxKeysPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat("keys has ", keys.size(), " entries; 1 to ",
                                                   kMaxKeysPerRequest, " are allowed"));
  }
  for (const std::string& k : keys) {
    if (absl::Status st = ValidateKey(k); !st.ok()) return st;
  }
  const absl::Time deadline = absl::Now() + std::min(timeout, kMaxKeyWait);
  std::unique_ptr<EtcdWatch> watch;
  for (;;) {
    std::vector<EtcdOp> gets;
    for (const std::string& k : keys) gets.push_back(EtcdOp::Get(StoreKey(k)));
    auto read = etcd_->Txn({}, gets, {}, std::max(deadline, absl::Now() + absl::Seconds(1)));
    if (!read.ok()) return read.status();
    std::vector<std::string> values, missing;
    size_t bytes = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      const EtcdRange& r = read->ranges.at(i);
      if (r.kvs.empty()) {
        missing.push_back(keys[i]);
      } else {
        bytes += r.kvs[0].value.size();
        values.push_back(r.kvs[0].value);
      }
    }
    if (missing.empty()) {
      if (bytes > kMaxAnswerBytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the values of these keys are ", bytes, " bytes; at most ", kMaxAnswerBytes,
            " are answered at once"));
      }
      return values;
    }
    if (absl::Now() >= deadline || !WaitForChange(watch, read->revision, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("keys not set before the deadline: ", BoundedList(missing)));
    }
  }
}

absl::StatusOr<int64_t> EtcdCluster::Delete(const std::vector<std::string>& keys,
                                            const std::string& prefix) {
  int64_t deleted = 0;
  const absl::Time deadline = CallDeadline();
  for (const std::string& k : keys) {
    if (absl::Status st = ValidateKey(k); !st.ok()) return st;
    auto n = etcd_->Delete(StoreKey(k), /*prefix=*/false, deadline);
    if (!n.ok()) return n.status();
    deleted += *n;
  }
  if (!prefix.empty()) {
    auto n = etcd_->Delete(StoreKey(prefix), /*prefix=*/true, deadline);
    if (!n.ok()) return n.status();
    deleted += *n;
  }
  return deleted;
}

absl::StatusOr<std::vector<HostRecord>> EtcdCluster::ListHosts() {
  auto r = etcd_->Get(absl::StrCat(options_.prefix, "hosts/"), /*prefix=*/true, CallDeadline());
  if (!r.ok()) return r.status();
  std::vector<HostRecord> hosts;
  const size_t skip = options_.prefix.size() + 6;
  for (const EtcdKeyValue& kv : r->kvs) {
    v1::EtcdHost h;
    if (!h.ParseFromString(kv.value)) continue;
    HostRecord rec;
    rec.host_id = kv.key.substr(skip);
    rec.address = h.address();
    rec.joined_at = absl::FromUnixMillis(h.joined_at_unix_ms());
    rec.last_heartbeat = rec.joined_at;
    hosts.push_back(std::move(rec));
  }
  return hosts;
}

// ---- The mesh registry ----

absl::StatusOr<EtcdCluster::Snapshot> EtcdCluster::Read(const std::string& key,
                                                        absl::Time deadline) {
  auto read = etcd_->Txn({},
                         {EtcdOp::Get(MeshKey(key)),
                          EtcdOp::Get(absl::StrCat(options_.prefix, "hosts/"), /*prefix=*/true)},
                         {}, deadline);
  if (!read.ok()) return read.status();
  Snapshot snap;
  snap.revision = read->revision;
  snap.mesh = std::make_unique<v1::EtcdMesh>();
  const EtcdRange& mesh = read->ranges.at(0);
  if (!mesh.kvs.empty()) {
    snap.exists = true;
    snap.mod_revision = mesh.kvs[0].mod_revision;
    if (!snap.mesh->ParseFromString(mesh.kvs[0].value)) {
      return absl::DataLossError(absl::StrCat("the registry's record of mesh '", key,
                                              "' in etcd does not parse"));
    }
  }
  const size_t skip = options_.prefix.size() + 6;
  for (const EtcdKeyValue& kv : read->ranges.at(1).kvs) {
    v1::EtcdHost h;
    h.ParseFromString(kv.value);
    HostRecord rec;
    rec.host_id = kv.key.substr(skip);
    rec.address = h.address();
    rec.joined_at = absl::FromUnixMillis(h.joined_at_unix_ms());
    rec.last_heartbeat = rec.joined_at;
    snap.host_lease[rec.host_id] = kv.lease;
    snap.hosts[rec.host_id] = std::move(rec);
  }
  return snap;
}

std::string EtcdCluster::GoneHosts(const v1::EtcdMesh& mesh, const Snapshot& snap) {
  std::set<std::string> gone;
  for (const auto& [index, host] : mesh.member_host()) {
    if (snap.hosts.count(host) == 0) gone.insert(host);
  }
  return absl::StrJoin(gone, ", ");
}

void EtcdCluster::End(const std::string& key, v1::EtcdMesh& mesh, const std::string& reason,
                      std::vector<EtcdOp>* ops) {
  mesh.set_ended(true);
  auto* e = mesh.add_endings();
  e->set_generation(mesh.generation());
  e->set_reason(reason);
  while (mesh.endings_size() > kKeptEndings) mesh.mutable_endings()->DeleteSubrange(0, 1);
  // The keys its hosts connected through are of no use any more.
  ops->push_back(
      EtcdOp::Delete(StoreKey(MeshStorePrefix(key, mesh.generation()) + "/"), /*prefix=*/true));
}

absl::StatusOr<int64_t> EtcdCluster::MeshRegister(MeshRegistration reg, absl::Time by) {
  const int64_t held = lease();
  if (held == 0) {
    return absl::FailedPreconditionError("this daemon is not joined to the cluster (no lease)");
  }
  reg.host_id = options_.host_id;
  reg.lease_id = absl::StrCat(held);
  if (absl::Status st = ValidateMeshRegistration(reg); !st.ok()) return st;
  const absl::Time deadline = std::min(by, CallDeadline());
  const std::string record_key = MeshKey(reg.key);
  const std::string host_key = HostKey(options_.host_id);
  for (;;) {
    auto snap = Read(reg.key, deadline);
    if (!snap.ok()) return snap.status();
    auto lease = snap->host_lease.find(options_.host_id);
    if (lease == snap->host_lease.end() || lease->second != held) {
      return absl::NotFoundError(absl::StrCat("lease_id: host ", options_.host_id,
                                              " holds no such lease (it expired); join again"));
    }
    v1::EtcdMesh& mesh = *snap->mesh;
    std::vector<EtcdOp> ops;
    bool live = snap->exists && !mesh.ended();
    if (live) {
      if (std::string gone = GoneHosts(mesh, *snap); !gone.empty()) {
        End(reg.key, mesh, absl::StrCat("the lease of host ", gone, " ended (its daemon is gone)"),
            &ops);
        live = false;
      }
    }
    RegistryGeneration gen;
    if (live) {
      gen = ToGeneration(mesh);
      bool ours = true;
      for (int32_t i : reg.indices) {
        auto h = gen.member_host.find(i);
        ours = ours && h != gen.member_host.end() && h->second == options_.host_id;
      }
      if (ours) return gen.number;  // our own write, whose answer was lost
      if (absl::Status st = CheckRegistration(reg.key, gen, reg); !st.ok()) return st;
    } else {
      gen = StartGeneration(snap->exists ? mesh.generation() + 1 : 1, reg);
    }
    AddRegistration(gen, reg);
    FromGeneration(gen, &mesh);
    ops.push_back(EtcdOp::Put(record_key, mesh.SerializeAsString()));
    auto txn = etcd_->Txn({Unchanged(record_key, snap->exists, snap->mod_revision),
                           EtcdCompare::Lease(host_key, EtcdCompare::Result::kEqual, held)},
                          ops, {}, deadline);
    if (!txn.ok()) return txn.status();
    if (txn->succeeded) {
      if (gen.full()) {
        LogEvent(LogLevel::kInfo, "cluster_mesh_ready",
                 {{"key", reg.key}, {"generation", absl::StrCat(gen.number)},
                  {"members", absl::StrCat(gen.members)}});
      }
      return gen.number;
    }
    // Another host changed the record meanwhile: read it again.
  }
}

absl::StatusOr<MeshMembership> EtcdCluster::MeshWait(const std::string& key, int64_t generation,
                                                     absl::Duration timeout) {
  if (absl::Status st = ValidateKey(key); !st.ok()) return st;
  if (absl::Status st = ValidateMeshGeneration(generation); !st.ok()) return st;
  if (timeout < absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be >= 0");
  const absl::Time deadline = absl::Now() + std::min(timeout, kMaxKeyWait);
  const std::string record_key = MeshKey(key);
  std::unique_ptr<EtcdWatch> watch;
  for (;;) {
    auto snap = Read(key, std::max(deadline, absl::Now() + absl::Seconds(1)));
    if (!snap.ok()) return snap.status();
    v1::EtcdMesh& mesh = *snap->mesh;
    if (!snap->exists || generation > mesh.generation()) {
      return absl::NotFoundError(absl::StrCat("mesh '", key, "' has no generation ", generation,
                                              " (never registered)"));
    }
    if (generation < mesh.generation() || mesh.ended()) {
      for (const auto& e : mesh.endings()) {
        if (e.generation() == generation) {
          return absl::AbortedError(
              absl::StrCat(MeshName(key, generation), " ended: ", e.reason()));
        }
      }
      return absl::AbortedError(absl::StrCat(MeshName(key, generation),
                                             " ended (the mesh is at generation ",
                                             mesh.generation(), " now)"));
    }
    if (std::string gone = GoneHosts(mesh, *snap); !gone.empty()) {
      const std::string reason =
          absl::StrCat("the lease of host ", gone, " ended (its daemon is gone)");
      std::vector<EtcdOp> ops;
      End(key, mesh, reason, &ops);
      ops.push_back(EtcdOp::Put(record_key, mesh.SerializeAsString()));
      auto txn = etcd_->Txn({Unchanged(record_key, true, snap->mod_revision)}, ops, {},
                            CallDeadline());
      if (!txn.ok()) return txn.status();
      if (txn->succeeded) {
        return absl::AbortedError(absl::StrCat(MeshName(key, generation), " ended: ", reason));
      }
      continue;  // changed meanwhile: look again
    }
    const RegistryGeneration gen = ToGeneration(mesh);
    if (gen.full()) {
      return MembershipOf(gen, [&](const std::string& id) {
        auto h = snap->hosts.find(id);
        return h == snap->hosts.end() ? HostRecord{} : h->second;
      });
    }
    if (absl::Now() >= deadline || !WaitForChange(watch, snap->revision, deadline)) {
      return NotFullError(key, gen);
    }
  }
}

absl::Status EtcdCluster::MeshLeave(const std::string& key, int64_t generation,
                                    const std::vector<int32_t>& indices, bool broken,
                                    const std::string& reason) {
  if (absl::Status st = ValidateMeshLeave(key, generation, indices, reason); !st.ok()) return st;
  const std::string host = options_.host_id;
  const std::string record_key = MeshKey(key);
  const absl::Time deadline = CallDeadline();
  for (;;) {
    auto snap = Read(key, deadline);
    if (!snap.ok()) return snap.status();
    v1::EtcdMesh& mesh = *snap->mesh;
    if (!snap->exists || generation > mesh.generation()) {
      return absl::NotFoundError(
          absl::StrCat("mesh '", key, "' has no generation ", generation, " (never registered)"));
    }
    // A generation that ended already: nothing changes.
    if (generation < mesh.generation() || mesh.ended()) return absl::OkStatus();
    RegistryGeneration gen = ToGeneration(mesh);
    // Only a host with members in the generation can end it or free indices.
    if (gen.host_members.count(host) == 0) return absl::OkStatus();
    std::vector<EtcdOp> ops;
    if (broken || gen.full()) {
      // Members leaving a formed mesh break it.
      End(key, mesh,
          absl::StrCat("host ", host, ": ",
                       reason.empty() ? (broken ? "broke" : "left the formed mesh") : reason),
          &ops);
    } else if (RemoveRegistrations(gen, host, indices)) {
      FromGeneration(gen, &mesh);
      End(key, mesh, "every member left", &ops);
    } else {
      FromGeneration(gen, &mesh);
    }
    ops.push_back(EtcdOp::Put(record_key, mesh.SerializeAsString()));
    auto txn =
        etcd_->Txn({Unchanged(record_key, true, snap->mod_revision)}, ops, {}, deadline);
    if (!txn.ok()) return txn.status();
    if (txn->succeeded) {
      if (mesh.ended()) {
        LogEvent(LogLevel::kInfo, "cluster_mesh_ended",
                 {{"key", key},
                  {"generation", absl::StrCat(generation)},
                  {"reason", mesh.endings(mesh.endings_size() - 1).reason()}});
      }
      return absl::OkStatus();
    }
  }
}

}  // namespace collectived
