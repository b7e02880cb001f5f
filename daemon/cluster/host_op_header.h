// The op header the hosts of a mesh exchange before every op (HostMesh,
// host_mesh.h "Header exchange"): its wire format, how it is made from an
// op's plan, read from received bytes, and compared. Pure functions, the
// same on every host of one build.

#ifndef COLLECTIVED_DAEMON_CLUSTER_HOST_OP_HEADER_H_
#define COLLECTIVED_DAEMON_CLUSTER_HOST_OP_HEADER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/cluster/host_mesh.h"
#include "plan/op_plan.h"

namespace collectived {
namespace host_header {

constexpr uint32_t kMagic = 0x434f4c47;  // "COLG"
// 2: the chain schedule (its chunk size in the header). 3: the kind of
// memory (GPU ops across hosts). 4: the replication threshold. 5: the size
// after the version, a 4 KiB receive and one header slot for every op. 6:
// two Gloo contexts, one a direction. 7: the daemon's own authenticated
// transport (host_transport.h) instead of Gloo's; a host of version 6 or
// earlier fails the handshake (another magic), before any header.
constexpr uint32_t kVersion = 7;

// The fixed-size signature of an op every host sends every other. magic,
// version and bytes lead, in every version: a header is received into
// kHeaderCapacity bytes (the transport refuses a message longer than its
// receive), and nothing past them is read unless all three match this
// build's and as many bytes came.
struct WireHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t bytes;  // sizeof(WireHeader)
  uint32_t reserved;
  int64_t sequence;
  int32_t kind;
  int32_t dtype;
  int32_t out_dtype;
  int32_t group_size;
  int64_t num_groups;
  int64_t members;
  int32_t root;
  int32_t refused;  // 1: this host's verdict is not OK (`text` says why)
  uint64_t in_bytes;
  uint64_t out_bytes;
  uint64_t hash;
  // The chain's chunk and the replication threshold (HostMeshOptions):
  // they set the schedule and the transfers' sizes.
  uint64_t chunk_bytes;
  uint64_t replicate_below_bytes;
  // The kind of memory the op runs on (Executor::buffer_kind: "memfd",
  // "cuda"): it picks the transport (the host transport, or the executor's HostLink).
  char memory[16];
  char signature[160];
  char text[192];
};
static_assert(std::is_trivially_copyable_v<WireHeader>);
constexpr size_t kHeaderCapacity = 4096;
static_assert(sizeof(WireHeader) <= kHeaderCapacity);
static_assert(offsetof(WireHeader, bytes) == 8);

// Writes `text` into the fixed field `dst` of `size` bytes, truncated and
// NUL-terminated.
void CopyText(char* dst, size_t size, absl::string_view text);
// A fixed field's text (up to its NUL, at most `size` bytes).
std::string Text(const char* s, size_t size);

// What a host's header bytes say (`got` of them came): its header when
// magic, version and size are this build's; else a header that differs
// from every host's in its wire version (and names no op).
WireHeader ParseHeader(const std::array<uint8_t, kHeaderCapacity>& raw, uint64_t got);

// The plan, and the mesh's layout of members on hosts, hashed (FNV-1a):
// with both the same, every host runs the same schedule.
uint64_t PlanHash(const OpPlan& plan, const MeshTopology& topology);

// This host's header for op `sequence` of `plan`, with its verdict.
WireHeader MakeHeader(const OpPlan& plan, const MeshTopology& topology, int64_t sequence,
                      size_t members, const HostMeshOptions& options, absl::string_view memory,
                      const absl::Status& verdict);

bool SameWireFormat(const WireHeader& a, const WireHeader& b);

// What differs between two headers ("" when nothing does).
std::string Differences(const WireHeader& a, const WireHeader& b);

// The op's outcome as every host computes it from every host's header
// (`headers[r]` from host `hosts[r]`): OK when all agree; FAILED_PRECONDITION
// naming the hosts that refused it, or the hosts whose ops differ from host
// 0's and what differs. `broken` when hosts are at different op counts or
// in another wire format: no later op could agree.
struct Verdict {
  absl::Status status;
  bool broken = false;
};
Verdict Judge(const std::vector<WireHeader>& headers, const std::vector<std::string>& hosts,
              int64_t sequence);

}  // namespace host_header
}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_HOST_OP_HEADER_H_
