#include "daemon/exec/spanning.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace collectived {
namespace {

#define COLLECTIVED_SPANNING_RETURN_IF_ERROR(expr) \
  do {                                             \
    const absl::Status status_ = (expr);           \
    if (!status_.ok()) return status_;             \
  } while (0)

bool IsReduce(OpKind kind) {
  return kind == OpKind::kPsum || kind == OpKind::kPmean || kind == OpKind::kPmax ||
         kind == OpKind::kPmin;
}

// The partitions of an op's members, ascending.
std::vector<int> Partitions(const std::vector<MemberIo>& io) {
  std::vector<int> parts;
  for (const MemberIo& m : io) parts.push_back(m.device);
  std::sort(parts.begin(), parts.end());
  parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
  return parts;
}

// The op's work: the sub-plans and member tables handed to the fabric live
// here until Finish.
class SpanningOp {
 public:
  SpanningOp(const OpPlan& plan, const std::vector<MemberIo>& io, Fabric* fabric,
             SpanningTraffic* traffic)
      : plan_(plan), io_(io), fabric_(fabric), traffic_(traffic), parts_(Partitions(io)) {}

  absl::Status Run() {
    if (UsesLanes()) return RunLanes();
    return RunReplicated();
  }

 private:
  int n() const { return plan_.group_size; }

  // The lane schedule needs one group (a lane is reduced over all of a
  // group's members), a reduction (not a mesh of one, which reduces
  // nothing) and a result as wide as the input (so that element offsets in
  // the input and the output agree, in place included).
  bool UsesLanes() const {
    return IsReduce(plan_.kind) && plan_.groups.size() == 1 && !plan_.ReducesNothing() &&
           plan_.out_dtype == plan_.dtype && plan_.in_bytes > 0;
  }

  // Whether member `i` of a group (its group index) has an input some member
  // of that group on partition `part` needs.
  bool Needed(const std::vector<int>& group, int i, int part) const {
    switch (plan_.kind) {
      case OpKind::kPpermute:
        for (int d = 0; d < n(); ++d) {
          if (plan_.perm_source[d] == i && io_[group[d]].device == part) return true;
        }
        return false;
      case OpKind::kBroadcast:
        return i == plan_.root;
      default:
        return true;
    }
  }

  absl::Status RunReplicated() {
    std::vector<Transfer> transfers;
    // Per partition: the sub-plan of its groups and its member table.
    std::vector<std::pair<int, size_t>> runs;
    for (int part : parts_) {
      OpPlan& sub = plans_.emplace_back(plan_);
      std::vector<MemberIo>& io = ios_.emplace_back();
      sub.mesh_members = plan_.mesh_members > 0 ? plan_.mesh_members : plan_.members();
      sub.groups.clear();
      sub.group_of.clear();
      sub.index_in_group.clear();
      const uint8_t* unread = nullptr;  // the input of a member nobody here reads
      for (const std::vector<int>& group : plan_.groups) {
        bool local = false;
        for (int m : group) local |= io_[m].device == part;
        if (!local) continue;
        std::vector<int>& g = sub.groups.emplace_back();
        for (int i = 0; i < n(); ++i) {
          const int m = group[i];
          g.push_back(static_cast<int>(io.size()));
          sub.group_of.push_back(static_cast<int>(sub.groups.size()) - 1);
          sub.index_in_group.push_back(i);
          if (io_[m].device == part) {
            io.push_back(io_[m]);
            continue;
          }
          MemberIo remote;
          remote.device = part;
          if (plan_.in_bytes > 0 && Needed(group, i, part)) {
            auto staged = fabric_->Scratch(part, plan_.in_bytes);
            if (!staged.ok()) return staged.status();
            transfers.push_back(Transfer{io_[m].device, io_[m].in, part, *staged, plan_.in_bytes});
            remote.in = *staged;
          } else {
            if (unread == nullptr) {
              auto s = fabric_->Scratch(part, std::max<uint64_t>(plan_.in_bytes, 1));
              if (!s.ok()) return s.status();
              unread = *s;
            }
            remote.in = unread;
          }
          io.push_back(remote);
        }
      }
      runs.emplace_back(part, plans_.size() - 1);
    }
    COLLECTIVED_SPANNING_RETURN_IF_ERROR(Exchange(transfers));
    for (const auto& [part, index] : runs) {
      COLLECTIVED_SPANNING_RETURN_IF_ERROR(fabric_->RunLocal(part, plans_[index], ios_[index]));
    }
    return absl::OkStatus();
  }

  absl::Status RunLanes() {
    const std::vector<int>& group = plan_.groups[0];
    const uint64_t es = DTypeSize(plan_.dtype);
    const uint64_t count = plan_.in_bytes / es;
    const uint64_t lanes = parts_.size();
    // Each partition's first member in group order: where results arrive.
    std::map<int, int> first;
    for (int i = n() - 1; i >= 0; --i) first[io_[group[i]].device] = group[i];

    // 1. Each lane's owner receives that lane of every remote member's input.
    std::vector<Transfer> to_owners;
    std::vector<uint64_t> begin(lanes + 1);
    for (uint64_t j = 0; j <= lanes; ++j) begin[j] = count * j / lanes;
    for (uint64_t j = 0; j < lanes; ++j) {
      const uint64_t len = begin[j + 1] - begin[j];
      if (len == 0) continue;
      const int owner = parts_[j];
      OpPlan& sub = plans_.emplace_back(plan_);
      sub.in_shape = sub.out_shape = {static_cast<int64_t>(len)};
      sub.in_bytes = sub.out_bytes = len * es;
      sub.groups.assign(1, {});
      sub.group_of.assign(n(), 0);
      sub.index_in_group.clear();
      std::vector<MemberIo>& io = ios_.emplace_back();
      for (int i = 0; i < n(); ++i) {
        const MemberIo& m = io_[group[i]];
        sub.groups[0].push_back(i);
        sub.index_in_group.push_back(i);
        if (m.device == owner) {
          io.push_back(MemberIo{m.in + begin[j] * es, m.out + begin[j] * es, owner});
          continue;
        }
        auto staged = fabric_->Scratch(owner, len * es);
        if (!staged.ok()) return staged.status();
        to_owners.push_back(Transfer{m.device, m.in + begin[j] * es, owner, *staged, len * es});
        io.push_back(MemberIo{*staged, nullptr, owner});
      }
    }
    COLLECTIVED_SPANNING_RETURN_IF_ERROR(Exchange(to_owners));

    // 2. Each owner reduces its lane over all members, in group order, into
    // its own members' outputs.
    size_t index = 0;
    for (uint64_t j = 0; j < lanes; ++j) {
      if (begin[j + 1] == begin[j]) continue;
      COLLECTIVED_SPANNING_RETURN_IF_ERROR(
          fabric_->RunLocal(parts_[j], plans_[index], ios_[index]));
      ++index;
    }

    // 3. Every reduced lane to every other partition's first member.
    std::vector<Transfer> results;
    for (uint64_t j = 0; j < lanes; ++j) {
      const uint64_t len = begin[j + 1] - begin[j];
      if (len == 0) continue;
      const int owner = parts_[j];
      const uint8_t* lane = io_[first[owner]].out + begin[j] * es;
      for (int part : parts_) {
        if (part == owner) continue;
        results.push_back(
            Transfer{owner, lane, part, io_[first[part]].out + begin[j] * es, len * es});
      }
    }
    COLLECTIVED_SPANNING_RETURN_IF_ERROR(Exchange(results));

    // 4. From each partition's first member to its others (their own lane is
    // already there; the copy rewrites it with the same bits).
    for (int i = 0; i < n(); ++i) {
      const MemberIo& m = io_[group[i]];
      const int f = first[m.device];
      if (group[i] == f) continue;
      COLLECTIVED_SPANNING_RETURN_IF_ERROR(
          fabric_->Copy(m.device, m.out, io_[f].out, plan_.out_bytes));
      if (traffic_ != nullptr) traffic_->copied += plan_.out_bytes;
    }
    return absl::OkStatus();
  }

  absl::Status Exchange(const std::vector<Transfer>& transfers) {
    if (transfers.empty()) return absl::OkStatus();
    if (traffic_ != nullptr) {
      for (const Transfer& t : transfers) {
        (t.src_part == t.dst_part ? traffic_->copied : traffic_->exchanged) += t.bytes;
      }
    }
    return fabric_->Exchange(transfers);
  }

  const OpPlan& plan_;
  const std::vector<MemberIo>& io_;
  Fabric* const fabric_;
  SpanningTraffic* const traffic_;
  const std::vector<int> parts_;
  // Stable addresses: the fabric keeps references until Finish.
  std::deque<OpPlan> plans_;
  std::deque<std::vector<MemberIo>> ios_;
};

}  // namespace

bool SpansPartitions(const std::vector<MemberIo>& io) {
  for (const MemberIo& m : io) {
    if (m.device != io[0].device) return true;
  }
  return false;
}

absl::Status RunSpanning(const OpPlan& plan, const std::vector<MemberIo>& io, Fabric* fabric,
                         SpanningTraffic* traffic) {
  if (io.size() != plan.members()) {
    return absl::InvalidArgumentError(absl::StrCat("spanning op: ", io.size(),
                                                   " member regions for an op of ",
                                                   plan.members(), " members"));
  }
  if (plan.kind == OpKind::kBarrier) return fabric->Finish();  // nothing to move
  absl::Status status;
  {
    SpanningOp op(plan, io, fabric, traffic);
    status = op.Run();
    // The op's sub-plans must outlive the work that reads them.
    const absl::Status finished = fabric->Finish();
    if (status.ok()) status = finished;
  }
  return status;
}

}  // namespace collectived
