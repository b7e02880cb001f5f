#include "daemon/cluster/host_op_header.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace collectived {
namespace host_header {
namespace {

// FNV-1a, 64 bits: the same on every host (absl::Hash is seeded per process).
class Fnv {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= b[i];
      h_ *= 0x100000001b3ull;
    }
  }
  void Int(int64_t v) { Bytes(&v, sizeof(v)); }
  template <typename T>
  void Ints(const std::vector<T>& v) {
    Int(static_cast<int64_t>(v.size()));
    for (const T& x : v) Int(static_cast<int64_t>(x));
  }
  void Str(absl::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace

void CopyText(char* dst, size_t size, absl::string_view text) {
  const size_t n = std::min(size - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string Text(const char* s, size_t size) { return std::string(s, strnlen(s, size)); }

WireHeader ParseHeader(const std::array<uint8_t, kHeaderCapacity>& raw, uint64_t got) {
  WireHeader h{};
  uint32_t lead[3] = {0, 0, 0};
  std::memcpy(lead, raw.data(), std::min<uint64_t>(sizeof(lead), got));
  if (lead[0] != kMagic || lead[1] != kVersion || lead[2] != sizeof(WireHeader) ||
      got != sizeof(WireHeader)) {
    h.magic = lead[0];
    h.version = lead[1] == kVersion ? ~kVersion : lead[1];
    h.bytes = lead[2];
    h.sequence = -1;
    CopyText(h.signature, sizeof(h.signature),
             absl::StrCat("an op in another wire format (version ", lead[1], ", ", lead[2],
                          " bytes; this build's: version ", kVersion, ", ", sizeof(WireHeader),
                          ")"));
    return h;
  }
  std::memcpy(&h, raw.data(), sizeof(h));
  return h;
}

// The plan, and the mesh's layout of members on hosts: with both the same,
// every host runs the same schedule, so every slot's sender and receiver
// agree on its size (the transport breaks the mesh otherwise).
uint64_t PlanHash(const OpPlan& plan, const MeshTopology& topology) {
  Fnv f;
  f.Int(static_cast<int64_t>(topology.hosts.size()));
  for (const std::string& h : topology.hosts) f.Str(h);
  f.Int(static_cast<int64_t>(topology.member_host.size()));
  for (const std::string& h : topology.member_host) f.Str(h);
  f.Ints(plan.in_shape);
  f.Ints(plan.out_shape);
  f.Ints(plan.axis_ids);
  f.Int(static_cast<int64_t>(plan.groups.size()));
  for (const auto& g : plan.groups) f.Ints(g);
  f.Ints(plan.group_of);
  f.Ints(plan.index_in_group);
  f.Int(plan.axis);
  f.Int(plan.tiled ? 1 : 0);
  f.Int(plan.split_axis);
  f.Int(plan.concat_axis);
  f.Ints(plan.a2a_shape);
  f.Ints(plan.perm_source);
  f.Int(static_cast<int64_t>(plan.mesh_members));
  f.Str(plan.signature);
  return f.value();
}

WireHeader MakeHeader(const OpPlan& plan, const MeshTopology& topology, int64_t sequence,
                      size_t members, const HostMeshOptions& options, absl::string_view memory,
                      const absl::Status& verdict) {
  WireHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kMagic;
  h.version = kVersion;
  h.bytes = sizeof(WireHeader);
  h.sequence = sequence;
  h.kind = static_cast<int32_t>(plan.kind);
  h.dtype = static_cast<int32_t>(plan.dtype);
  h.out_dtype = static_cast<int32_t>(plan.out_dtype);
  h.group_size = plan.group_size;
  h.num_groups = static_cast<int64_t>(plan.groups.size());
  h.members = static_cast<int64_t>(members);
  h.root = plan.root;
  h.refused = verdict.ok() ? 0 : 1;
  h.in_bytes = plan.in_bytes;
  h.out_bytes = plan.out_bytes;
  h.hash = PlanHash(plan, topology);
  h.chunk_bytes = options.chunk_bytes;
  h.replicate_below_bytes = options.replicate_below_bytes;
  CopyText(h.memory, sizeof(h.memory), memory);
  CopyText(h.signature, sizeof(h.signature),
           plan.signature.empty()
               ? absl::StrCat(OpKindName(plan.kind), " ", ShapeString(plan.dtype, plan.in_shape))
               : plan.signature);
  if (!verdict.ok()) CopyText(h.text, sizeof(h.text), verdict.message());
  return h;
}

bool SameWireFormat(const WireHeader& a, const WireHeader& b) {
  return a.magic == b.magic && a.version == b.version;
}

std::string Differences(const WireHeader& a, const WireHeader& b) {
  // Headers of another wire format are compared by nothing else.
  if (!SameWireFormat(a, b)) return "wire version";
  std::vector<std::string> d;
  if (a.sequence != b.sequence) d.push_back("sequence");
  if (a.kind != b.kind) d.push_back("kind");
  if (a.dtype != b.dtype) d.push_back("dtype");
  if (a.out_dtype != b.out_dtype) d.push_back("result dtype");
  if (a.in_bytes != b.in_bytes) d.push_back("input bytes");
  if (a.out_bytes != b.out_bytes) d.push_back("result bytes");
  if (a.group_size != b.group_size) d.push_back("group size");
  if (a.num_groups != b.num_groups) d.push_back("number of groups");
  if (a.members != b.members) d.push_back("members");
  if (a.root != b.root) d.push_back("root");
  if (a.hash != b.hash) d.push_back("plan (groups, permutation, axes or shapes) or mesh layout");
  if (a.chunk_bytes != b.chunk_bytes) d.push_back("--cluster-chunk-bytes");
  if (a.replicate_below_bytes != b.replicate_below_bytes) {
    d.push_back("--cluster-replicate-bytes");
  }
  if (Text(a.memory, sizeof(a.memory)) != Text(b.memory, sizeof(b.memory))) {
    d.push_back(absl::StrCat("kind of memory (", Text(a.memory, sizeof(a.memory)), " and ",
                             Text(b.memory, sizeof(b.memory)), ")"));
  }
  return absl::StrJoin(d, ", ");
}

Verdict Judge(const std::vector<WireHeader>& headers, const std::vector<std::string>& hosts,
              int64_t sequence) {
  Verdict v;
  const size_t size = headers.size();
  // Hosts at different op counts or in another wire format come first: no
  // later op could agree, so that (not a refusal) is the answer, and the
  // mesh breaks.
  bool diverged = false;
  for (size_t rank = 1; rank < size; ++rank) {
    diverged = diverged || !SameWireFormat(headers[rank], headers[0]) ||
               headers[rank].sequence != headers[0].sequence;
  }
  std::vector<std::string> refusals;
  for (size_t rank = 0; rank < size; ++rank) {
    if (headers[rank].refused != 0) {
      refusals.push_back(absl::StrCat("host ", hosts[rank], " refused it: ",
                                      Text(headers[rank].text, sizeof(headers[rank].text))));
    }
  }
  if (!refusals.empty() && !diverged) {
    v.status = absl::FailedPreconditionError(
        absl::StrCat("op ", sequence, " of the mesh: ", absl::StrJoin(refusals, "; ")));
    return v;
  }
  std::vector<std::string> mismatches;
  const WireHeader& ref = headers[0];
  const std::string ref_sig = Text(ref.signature, sizeof(ref.signature));
  for (size_t rank = 1; rank < size; ++rank) {
    const std::string diff = Differences(headers[rank], ref);
    if (diff.empty()) continue;
    const std::string sig = Text(headers[rank].signature, sizeof(headers[rank].signature));
    std::string what = absl::StrCat("host ", hosts[rank], " submitted ", sig, " where host ",
                                    hosts[0], " submitted ", ref_sig);
    if (SameWireFormat(headers[rank], ref) && headers[rank].sequence != ref.sequence) {
      absl::StrAppend(&what, " (op ", headers[rank].sequence, " where op ", ref.sequence, ")");
    }
    absl::StrAppend(&what, " (", diff, " differ)");
    mismatches.push_back(std::move(what));
  }
  if (mismatches.empty()) return v;
  v.status = absl::FailedPreconditionError(
      absl::StrCat("op ", sequence, " of the mesh: the hosts submitted different ops: ",
                   absl::StrJoin(mismatches, "; ")));
  // Hosts at different op counts (or wire formats) would differ at every
  // later op too: the mesh breaks, and its next generation starts afresh.
  v.broken = diverged;
  if (v.broken) {
    v.status = absl::FailedPreconditionError(
        absl::StrCat(v.status.message(),
                     "; the hosts' op counts or wire formats differ, so the mesh breaks (join "
                     "again)"));
  }
  return v;
}

}  // namespace host_header
}  // namespace collectived
