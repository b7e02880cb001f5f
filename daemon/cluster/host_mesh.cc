#include "daemon/cluster/host_mesh.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "daemon/cluster/host_mesh_internal.h"
#include "exec/spanning.h"

namespace collectived {
namespace host_mesh_internal {


using host_header::kHeaderCapacity;
using host_header::MakeHeader;
using host_header::ParseHeader;
using host_header::WireHeader;

// This host's view of the global schedule: see the comment of host_mesh.h.
class HostFabric final : public Fabric {
 public:
  HostFabric(HostMesh* mesh, Executor* executor, int64_t sequence, absl::Time deadline)
      : mesh_(mesh), executor_(executor), sequence_(sequence), deadline_(deadline) {}
  ~HostFabric() override { FreeScratch(); }

  absl::StatusOr<uint8_t*> Scratch(int part, uint64_t bytes) override {
    if (part != mesh_->self()) return mesh_->placeholder();
    uint8_t* p = mesh_->scratch().Get(bytes);
    if (p == nullptr) return absl::ResourceExhaustedError("host mesh: scratch allocation");
    return p;
  }

  absl::Status Exchange(const std::vector<Transfer>& transfers) override {
    if (!first_error_.ok()) return first_error_;
    const int self = mesh_->self();
    std::vector<Posted> posted;
    absl::Status status;
    for (const Transfer& t : transfers) {
      const uint64_t slot = (static_cast<uint64_t>(sequence_) << kSlotShift) | counter_++;
      if (t.bytes == 0 || !status.ok()) continue;
      if (t.src_part == self && t.dst_part == self) {
        if (t.dst != t.src) std::memmove(t.dst, t.src, t.bytes);
        traffic_.read += t.bytes;
        traffic_.written += t.bytes;
      } else if (t.src_part == self) {
        status = mesh_->Post(posted, /*send=*/true, t.dst_part, const_cast<uint8_t*>(t.src),
                             t.bytes, slot, /*directed=*/t.bytes >= kDirectedMinBytes);
        traffic_.read += t.bytes;
      } else if (t.dst_part == self) {
        status = mesh_->Post(posted, /*send=*/false, t.src_part, t.dst, t.bytes, slot,
                             /*directed=*/t.bytes >= kDirectedMinBytes);
        traffic_.written += t.bytes;
      }
    }
    status = status.ok() ? mesh_->WaitAll(posted, deadline_) : mesh_->Forget(posted, status);
    if (!status.ok()) first_error_ = status;
    return status;
  }

  absl::Status RunLocal(int part, const OpPlan& plan, const std::vector<MemberIo>& io) override {
    if (!first_error_.ok()) return first_error_;
    if (part != mesh_->self()) return absl::OkStatus();
    std::vector<MemberIo> local = io;
    for (MemberIo& m : local) m.device = -1;
    Traffic t;
    absl::Status st = executor_->Run(plan, local, &t);
    traffic_.read += t.read;
    traffic_.written += t.written;
    traffic_.required += t.required;
    if (!st.ok()) first_error_ = st;
    return st;
  }

  absl::Status Copy(int part, uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    if (!first_error_.ok()) return first_error_;
    if (part != mesh_->self()) return absl::OkStatus();
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
    traffic_.read += bytes;
    traffic_.written += bytes;
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    FreeScratch();
    return first_error_;
  }

  const Traffic& traffic() const { return traffic_; }

 private:
  void FreeScratch() { mesh_->scratch().Release(/*reuse=*/first_error_.ok()); }

  HostMesh* const mesh_;
  Executor* const executor_;
  const int64_t sequence_;
  const absl::Time deadline_;
  uint64_t counter_ = 1;  // 0: the header
  absl::Status first_error_;
  Traffic traffic_;
};

absl::Status HostMesh::WaitHeaders(const Op& op, std::vector<Posted>& sends) {
  // Shortly before the deadline, the hosts whose header has not come are
  // asked what their members are doing.
  const absl::Time now = absl::Now();
  const absl::Duration lead =
      std::min(kQueryLead, std::max(absl::ZeroDuration(), (op.deadline - now) / 4));
  const absl::Time query_at = op.deadline == absl::InfiniteFuture() ? op.deadline
                                                                    : op.deadline - lead;
  std::vector<int> late;
  for (absl::Time until : {query_at, op.deadline}) {
    late.clear();
    for (Posted& x : header_recvs_) {
      const absl::Status st = x.transfer->Wait(late.empty() ? until : absl::Now());
      if (st.ok()) continue;
      if (!absl::IsDeadlineExceeded(st) || !transport_->broken().ok()) return Failure(st);
      late.push_back(x.rank);
    }
    if (late.empty()) break;
    if (until == query_at && query_at < op.deadline) {
      for (int rank : late) transport_->Query(rank, op.sequence);
    }
  }
  if (!late.empty()) {
    // What the late hosts said their members are doing (their answers may
    // still be on their way).
    const std::map<int, std::string> answers =
        transport_->Answers(late, op.sequence, absl::Now() + kAnswerGrace);
    std::vector<std::string> waiting, missing, silent, behind;
    std::set<int> late_set(late.begin(), late.end());
    for (size_t m = 0; m < topology_.member_host.size(); ++m) {
      const auto it = std::find(topology_.hosts.begin(), topology_.hosts.end(),
                                topology_.member_host[m]);
      const int rank = static_cast<int>(it - topology_.hosts.begin());
      if (late_set.count(rank) == 0) waiting.push_back(absl::StrCat(m));
    }
    for (int rank : late) {
      auto a = answers.find(rank);
      if (a == answers.end()) {
        silent.push_back(host(rank));
      } else if (a->second.empty()) {
        behind.push_back(host(rank));
      } else {
        missing.push_back(a->second);
      }
    }
    std::string text = absl::StrCat("op ", op.sequence, " timed out");
    if (op.timeout > absl::ZeroDuration()) {
      absl::StrAppend(&text, " after ", absl::ToInt64Milliseconds(op.timeout), " ms");
    }
    absl::StrAppend(&text, ": ", WaitingMembers(waiting), " in ", op.plan->signature);
    if (!missing.empty()) absl::StrAppend(&text, "; missing: ", absl::StrJoin(missing, "; "));
    if (!behind.empty()) {
      absl::StrAppend(&text, "; ", behind.size() == 1 ? "host " : "hosts ",
                      absl::StrJoin(behind, ", "),
                      " had every member's op but did not start it in time (busy with an "
                      "earlier op?)");
    }
    if (!silent.empty()) {
      absl::StrAppend(&text, "; ", silent.size() == 1 ? "host " : "hosts ",
                      absl::StrJoin(silent, ", "),
                      " did not take part within the op timeout and did not answer (a cut "
                      "link, or a daemon that hangs)");
    }
    return absl::DeadlineExceededError(text);
  }
  absl::Status status;
  for (Posted& x : sends) {
    if (!status.ok()) break;
    status = WaitOne(x, op.deadline);
  }
  return Forget(sends, status);
}

HostMesh::Result HostMesh::ExchangeHeaders(const Op& op, absl::Status verdict) {
  Result r;
  const int size = static_cast<int>(topology_.hosts.size());
  const int self = topology_.self;
  std::vector<WireHeader> headers(size);
  headers[self] = MakeHeader(*op.plan, topology_, op.sequence, op.io.size(), options_,
                             op.executor != nullptr ? op.executor->buffer_kind() : "", verdict);
  absl::Status status = next_headers_;
  if (status.ok() && header_recvs_.empty()) {
    header_in_.resize(size);
    for (int rank = 0; rank < size && status.ok(); ++rank) {
      if (rank == self) continue;
      header_in_[rank].fill(0);
      status = Post(header_recvs_, /*send=*/false, rank, header_in_[rank].data(), kHeaderCapacity,
                    kHeaderSlot);
    }
  }
  std::vector<Posted> sends;
  for (int rank = 0; rank < size && status.ok(); ++rank) {
    if (rank == self) continue;
    status = Post(sends, /*send=*/true, rank, reinterpret_cast<uint8_t*>(&headers[self]),
                  sizeof(WireHeader), kHeaderSlot);
  }
  status = status.ok() ? WaitHeaders(op, sends) : Forget(sends, status);
  if (!status.ok()) {
    r.status = status;
    r.broken = true;
    return r;
  }
  std::vector<Posted> received;
  received.swap(header_recvs_);
  for (Posted& x : received) {
    headers[x.rank] = ParseHeader(header_in_[x.rank], x.transfer->bytes());
    // The next op's header may come as soon as its host starts it. A
    // receive that cannot be posted again is the next op's failure, not
    // this one's: a host that finished this op may break the mesh at once.
    header_in_[x.rank].fill(0);
    if (next_headers_.ok()) {
      next_headers_ = Post(header_recvs_, /*send=*/false, x.rank, header_in_[x.rank].data(),
                           kHeaderCapacity, kHeaderSlot);
    }
  }
  if (!next_headers_.ok()) header_recvs_.clear();
  const host_header::Verdict v = host_header::Judge(headers, topology_.hosts, op.sequence);
  r.status = v.status;
  r.broken = v.broken;
  return r;
}

HostMesh::Result HostMesh::Run(Op& op) {
  sequence_ = op.sequence;
  const OpPlan& plan = *op.plan;
  // This host's own checks join its verdict: the other hosts learn them in
  // the header exchange.
  absl::Status verdict = op.verdict;
  std::vector<int> rank_of(op.io.size(), -1);
  if (verdict.ok() && op.io.size() != topology_.member_host.size()) {
    verdict = absl::InvalidArgumentError(absl::StrCat(
        op.io.size(), " member regions for a mesh of ", topology_.member_host.size(), " members"));
  }
  if (verdict.ok() && op.io.size() != plan.members()) {
    verdict = absl::InvalidArgumentError(absl::StrCat(op.io.size(), " member regions for an op of ",
                                                      plan.members(), " members"));
  }
  if (verdict.ok() && op.executor == nullptr) verdict = absl::InternalError("no executor");
  for (size_t m = 0; verdict.ok() && m < op.io.size(); ++m) {
    const auto it = std::find(topology_.hosts.begin(), topology_.hosts.end(),
                              topology_.member_host[m]);
    if (it == topology_.hosts.end()) {
      verdict = absl::InternalError(absl::StrCat("member ", m, " is on host ",
                                                 topology_.member_host[m], ", not of the mesh"));
      break;
    }
    rank_of[m] = static_cast<int>(it - topology_.hosts.begin());
  }
  // Memory the transport cannot move goes over the executor's link, on one device
  // per host: the device of this host's members.
  const bool over_link = op.executor != nullptr && op.executor->buffer_kind() != "memfd";
  int device = -1;
  if (verdict.ok() && over_link) {
    verdict = LinkDevice(op, rank_of, &device);
  }
  if (verdict.ok()) {
    placeholder_base_ = placeholder_.Get(std::max(plan.in_bytes, plan.out_bytes));
    if (placeholder_base_ == nullptr) {
      verdict = absl::ResourceExhaustedError("placeholder mapping (mmap) failed");
    }
  }

  Result r = ExchangeHeaders(op, verdict);
  if (!r.status.ok() || plan.kind == OpKind::kBarrier || plan.in_bytes + plan.out_bytes == 0) {
    return r;
  }

  std::vector<MemberIo> io(op.io.size());
  for (size_t m = 0; m < io.size(); ++m) {
    io[m].device = rank_of[m];
    if (rank_of[m] == topology_.self) {
      io[m].in = op.io[m].in;
      io[m].out = op.io[m].out;
    } else {
      io[m].in = placeholder_base_;
      io[m].out = placeholder_base_;
    }
  }
  if (over_link) return RunOverLink(op, io, device);
  HostFabric fabric(this, op.executor, op.sequence, op.deadline);
  SpanningTraffic moved;
  SpanningOptions options;
  options.chain = true;
  options.chain_chunk_bytes = ChainChunkBytes(options_.chunk_bytes, plan.in_bytes);
  options.lanes_min_bytes = options_.replicate_below_bytes;
  r.status = RunSpanning(plan, io, &fabric, &moved, options);
  r.traffic = fabric.traffic();
  // Any failure after the headers matched leaves the hosts at different
  // points of the schedule: the connections cannot be trusted.
  r.broken = !r.status.ok();
  return r;
}

}  // namespace host_mesh_internal

using host_mesh_internal::HostMesh;
using host_mesh_internal::kLanes;
using host_mesh_internal::ObserverRelay;


absl::StatusOr<std::unique_ptr<CrossHostMesh>> ConnectHostMesh(
    AddressBook& book, const std::string& prefix, const MeshTopology& topology,
    const std::string& bind_host, TransportSecurity security, absl::Time deadline,
    const HostMeshOptions& options) {
  const int size = static_cast<int>(topology.hosts.size());
  if (size < 1 || topology.self < 0 || topology.self >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("host mesh: rank ", topology.self, " of ", size, " hosts"));
  }
  auto relay = std::make_shared<ObserverRelay>();
  TransportOptions transport_options = options.transport;
  transport_options.lanes = kLanes;
  transport_options.on_break = [relay](int, const absl::Status& why) { relay->Broken(why); };
  transport_options.on_query = [relay](int64_t sequence) { return relay->Query(sequence); };
  auto transport = HostTransport::Connect(book, prefix, topology.hosts, topology.self, bind_host,
                                          std::move(security), deadline, transport_options);
  if (!transport.ok()) return transport.status();
  return std::unique_ptr<CrossHostMesh>(
      new HostMesh(topology, *std::move(transport), std::move(relay), options));
}

}  // namespace collectived
