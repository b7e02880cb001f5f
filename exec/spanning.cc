#include "exec/spanning.h"

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

// The chain cuts an op into at most this many chunks.
constexpr uint64_t kMaxChainChunks = 256;

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
             SpanningTraffic* traffic, const SpanningOptions& options)
      : plan_(plan),
        io_(io),
        fabric_(fabric),
        traffic_(traffic),
        options_(options),
        parts_(Partitions(io)) {}

  absl::Status Run() {
    if (UsesLanes()) {
      std::vector<std::vector<int>> runs = ChainRuns();
      if (!runs.empty()) return RunChain(runs);
      return RunLanes();
    }
    return RunReplicated();
  }

 private:
  int n() const { return plan_.group_size; }

  // The lane schedule needs one group (a lane is reduced over all of a
  // group's members), a reduction (not a mesh of one, which reduces
  // nothing) and a result as wide as the input (so that element offsets in
  // the input and the output agree, in place included).
  bool UsesLanes() const {
    return IsReduction(plan_.kind) && plan_.groups.size() == 1 && !plan_.ReducesNothing() &&
           plan_.out_dtype == plan_.dtype && plan_.in_bytes > 0 &&
           plan_.in_bytes >= options_.lanes_min_bytes;
  }

  // Whether continuing a fold from a partial result gives the bits of the
  // whole fold (reduce.h): max/min keep an input's bits or the identity's;
  // float32/float64/float16 sums round to the dtype after every addition
  // (a partial is exactly the accumulator), and integers wrap. bfloat16 and
  // float8 sums accumulate wider than the dtype: a partial would round.
  bool ChainExact() const {
    if (plan_.kind == OpKind::kPmax || plan_.kind == OpKind::kPmin) return true;
    switch (plan_.dtype) {
      case DType::kBF16:
      case DType::kF8E4M3FN:
      case DType::kF8E5M2:
      case DType::kBool:
        return false;
      default:
        return true;
    }
  }

  // The chain schedule's runs: the group's members (group indices) cut into
  // one run per partition, in group order; empty when the chain does not
  // apply (not asked for, not exact, a partition whose members are not
  // contiguous in the group, or one member per partition).
  std::vector<std::vector<int>> ChainRuns() const {
    std::vector<std::vector<int>> runs;
    if (!options_.chain || !ChainExact() || parts_.size() < 2) return runs;
    const std::vector<int>& group = plan_.groups[0];
    std::vector<int> seen;
    for (int i = 0; i < n(); ++i) {
      const int part = io_[group[i]].device;
      if (i > 0 && part == io_[group[i - 1]].device) {
        runs.back().push_back(i);
        continue;
      }
      if (std::find(seen.begin(), seen.end(), part) != seen.end()) return {};
      seen.push_back(part);
      runs.push_back({i});
    }
    // One member per partition: the lanes send what a ring sends (2(P-1)/P
    // of S per partition) and every partition sends and receives at once,
    // where the chain's first hop waits for nothing to come back; the chain
    // only saves bytes where a partition combines several members.
    if (static_cast<int>(runs.size()) == n()) return {};
    return runs;
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
      SlicePlan(len, n());
      std::vector<MemberIo>& io = ios_.emplace_back();
      for (int i = 0; i < n(); ++i) {
        const MemberIo& m = io_[group[i]];
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

  // The chain (spanning.h): partition h of the chain folds chunk c of the
  // running result of partitions 0..h-1 with its members' chunk c at step
  // c + h and sends it on in the same step's exchange; the last partition
  // writes the result, which travels back down the chain one hop a step.
  absl::Status RunChain(const std::vector<std::vector<int>>& runs) {
    const std::vector<int>& group = plan_.groups[0];
    const int hosts = static_cast<int>(runs.size());
    const uint64_t es = DTypeSize(plan_.dtype);
    const uint64_t count = plan_.in_bytes / es;
    const uint64_t per_chunk =
        std::max<uint64_t>(1, std::max<uint64_t>(options_.chain_chunk_bytes / es,
                                                 (count + kMaxChainChunks - 1) / kMaxChainChunks));
    const uint64_t chunks = (count + per_chunk - 1) / per_chunk;
    auto part_of = [&](int h) { return io_[group[runs[h][0]]].device; };
    auto first_out = [&](int h) { return io_[group[runs[h][0]]].out; };
    // Where partition h's running result is read from when it sends chunks
    // on: its first member's output, or that member's input when it is
    // the only member of the first partition (a fold of one input is the
    // input, for the next partition's fold).
    auto partial = [&](int h) -> const uint8_t* {
      if (SendsInput(runs, h)) return io_[group[runs[0][0]]].in;
      return first_out(h);
    };
    // What partitions 1.. receive: the running result, chunk by chunk.
    std::vector<uint8_t*> received(hosts, nullptr);
    for (int h = 1; h < hosts; ++h) {
      auto s = fabric_->Scratch(part_of(h), plan_.in_bytes);
      if (!s.ok()) return s.status();
      received[h] = *s;
    }
    auto chunk_begin = [&](uint64_t c) { return c * per_chunk; };
    auto chunk_len = [&](uint64_t c) { return std::min(per_chunk, count - c * per_chunk); };

    const int64_t steps = static_cast<int64_t>(chunks) + 2 * hosts - 3;
    for (int64_t t = 0; t < steps; ++t) {
      for (int h = 0; h < hosts; ++h) {
        const int64_t c = t - h;
        if (c < 0 || c >= static_cast<int64_t>(chunks)) continue;
        if (SendsInput(runs, h)) continue;
        COLLECTIVED_SPANNING_RETURN_IF_ERROR(
            Fold(runs, h, chunk_begin(c), chunk_len(c), received[h]));
      }
      std::vector<Transfer> transfers;
      for (int h = 0; h + 1 < hosts; ++h) {
        const int64_t c = t - h;
        if (c < 0 || c >= static_cast<int64_t>(chunks)) continue;
        const uint64_t off = chunk_begin(c) * es;
        transfers.push_back(Transfer{part_of(h), partial(h) + off, part_of(h + 1),
                                     received[h + 1] + off, chunk_len(c) * es});
      }
      for (int j = 0; j + 1 < hosts; ++j) {
        const int64_t c = t - (hosts - 1) - j;
        if (c < 0 || c >= static_cast<int64_t>(chunks)) continue;
        const int from = hosts - 1 - j;
        const uint64_t off = chunk_begin(c) * es;
        transfers.push_back(Transfer{part_of(from), first_out(from) + off, part_of(from - 1),
                                     first_out(from - 1) + off, chunk_len(c) * es});
      }
      COLLECTIVED_SPANNING_RETURN_IF_ERROR(Exchange(transfers));
    }
    // The result, from each earlier partition's first member to its others.
    for (int h = 0; h + 1 < hosts; ++h) {
      for (size_t r = 1; r < runs[h].size(); ++r) {
        COLLECTIVED_SPANNING_RETURN_IF_ERROR(
            fabric_->Copy(part_of(h), io_[group[runs[h][r]]].out, first_out(h), plan_.out_bytes));
        if (traffic_ != nullptr) traffic_->copied += plan_.out_bytes;
      }
    }
    return absl::OkStatus();
  }

  // Chain partition h's fold of elements [begin, begin + len): the running
  // result received (h > 0) and its members' inputs, in group order, into
  // its first member's output (the last partition: every member's output,
  // with the op's own kind; the others sum, max or min).
  absl::Status Fold(const std::vector<std::vector<int>>& runs, int h, uint64_t begin,
                    uint64_t len, uint8_t* received) {
    const std::vector<int>& group = plan_.groups[0];
    const bool last = h + 1 == static_cast<int>(runs.size());
    const int part = io_[group[runs[h][0]]].device;
    const uint64_t es = DTypeSize(plan_.dtype);
    OpPlan& sub = SlicePlan(len, static_cast<int>(runs[h].size()) + (h > 0 ? 1 : 0));
    if (!last && sub.kind == OpKind::kPmean) sub.kind = OpKind::kPsum;
    // What arrives is the running result, unless the partition before sent
    // its raw input: then this is the whole fold's start.
    sub.continues_fold = h > 0 && !SendsInput(runs, h - 1);
    sub.mean_divisor = n();
    std::vector<MemberIo>& io = ios_.emplace_back();
    if (h > 0) io.push_back(MemberIo{received + begin * es, nullptr, part});
    for (size_t r = 0; r < runs[h].size(); ++r) {
      const MemberIo& m = io_[group[runs[h][r]]];
      io.push_back(MemberIo{m.in + begin * es,
                            (last || r == 0) ? m.out + begin * es : nullptr, part});
    }
    return fabric_->RunLocal(part, sub, io);
  }

  // Whether chain partition h sends its member's raw input on (the first
  // partition, when it has one member: a fold of one input is that input,
  // for the next partition's fold) instead of a running result it folded.
  static bool SendsInput(const std::vector<std::vector<int>>& runs, int h) {
    return h == 0 && runs[0].size() == 1;
  }

  // A sub-plan of the op (kept until Finish) over `len` elements and one
  // group of `members` members in order 0..members-1, the mesh's size kept.
  OpPlan& SlicePlan(uint64_t len, int members) {
    OpPlan& sub = plans_.emplace_back(plan_);
    sub.mesh_members = plan_.mesh_members > 0 ? plan_.mesh_members : plan_.members();
    sub.in_shape = sub.out_shape = {static_cast<int64_t>(len)};
    sub.in_bytes = sub.out_bytes = len * DTypeSize(plan_.dtype);
    sub.group_size = members;
    sub.groups.assign(1, {});
    sub.group_of.assign(members, 0);
    sub.index_in_group.clear();
    for (int i = 0; i < members; ++i) {
      sub.groups[0].push_back(i);
      sub.index_in_group.push_back(i);
    }
    return sub;
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
  const SpanningOptions options_;
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
                         SpanningTraffic* traffic, const SpanningOptions& options) {
  if (io.size() != plan.members()) {
    return absl::InvalidArgumentError(absl::StrCat("spanning op: ", io.size(),
                                                   " member regions for an op of ",
                                                   plan.members(), " members"));
  }
  if (plan.kind == OpKind::kBarrier) return fabric->Finish();  // nothing to move
  absl::Status status;
  {
    SpanningOp op(plan, io, fabric, traffic, options);
    status = op.Run();
    // The op's sub-plans must outlive the work that reads them.
    const absl::Status finished = fabric->Finish();
    if (status.ok()) status = finished;
  }
  return status;
}

}  // namespace collectived
