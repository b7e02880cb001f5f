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
#include "exec/spanning.h"

namespace collectived {
namespace {

constexpr uint32_t kMagic = 0x434f4c47;  // "COLG"
// 2: the chain schedule (its chunk size in the header). 3: the kind of
// memory (GPU ops across hosts). 4: the replication threshold. 5: the size
// after the version, a 4 KiB receive and one header slot for every op. 6:
// two Gloo contexts, one a direction. 7: the daemon's own authenticated
// transport (host_transport.h) instead of Gloo's; a host of version 6 or
// earlier fails the handshake (another magic), before any header.
constexpr uint32_t kVersion = 7;
constexpr int kSlotShift = 24;
// The header exchange's slot: the same for every op (data slots are
// (sequence << kSlotShift) | n), so that hosts at different op counts still
// meet there and learn that they differ. Ops of a mesh run one at a time and
// the transport matches a pair's messages of one slot in order.
constexpr uint64_t kHeaderSlot = uint64_t{1} << 63;
// The connections of a pair of hosts (HostMesh::LaneOf).
constexpr int kLanes = 2;
// Transfers of at least this many bytes go over the lane of their
// direction, smaller ones (and headers) over the first (LaneOf): a small
// transfer's time is its wakeups, and two I/O threads a host are more of
// them (over Gloo, 2-host psums of 1-16 KiB took a median of 260-300 us
// with every transfer directed against 130-270 us). Every host of a mesh
// runs the same build (the wire version), so both ends of a transfer pick
// the same lane.
constexpr uint64_t kDirectedMinBytes = 256 * 1024;
// How long before an op's deadline the hosts whose header has not come are
// asked what their members are doing (at most a quarter of the op's time),
// and how long past the deadline their answers are awaited when they have
// not come by then.
constexpr absl::Duration kQueryLead = absl::Milliseconds(150);
constexpr absl::Duration kAnswerGrace = absl::Milliseconds(50);

// The chain's chunk for an op of `bytes`: the configured one, but small
// enough for four chunks down to 1 MiB, since an op of one chunk crosses
// each link one way at a time (every host computes the same from the same
// configuration, which the header exchange checks).
uint64_t ChainChunkBytes(uint64_t configured, uint64_t bytes) {
  constexpr uint64_t kSmallest = uint64_t{1} << 20;
  return std::min(configured, std::max(std::min(configured, kSmallest), bytes / 4));
}

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

void CopyText(char* dst, size_t size, absl::string_view text) {
  const size_t n = std::min(size - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string Text(const char* s, size_t size) { return std::string(s, strnlen(s, size)); }

// What a host's header bytes say (`got` of them came): its header when
// magic, version and size are this build's; else a header that differs
// from every host's in its wire version (and names no op).
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

// What differs between two headers ("" when nothing does).
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

// Host memory that faults on any access: addresses for other hosts' regions.
class Placeholder {
 public:
  ~Placeholder() { Release(); }
  // At least `bytes` bytes of addresses; null when mmap fails.
  uint8_t* Get(uint64_t bytes) {
    bytes = std::max<uint64_t>(bytes, 1);
    if (bytes > size_) {
      Release();
      void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      base_ = static_cast<uint8_t*>(p);
      size_ = bytes;
    }
    return base_;
  }

 private:
  void Release() {
    if (base_ != nullptr) munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

// Host scratch kept from one op of a mesh to the next (only the mesh's
// worker uses it). Fresh memory costs a page fault and zeroing per page
// (for a 64 MiB op, a good part of its time); the blocks of the last ops
// are reused when big enough, up to `keep` bytes kept between ops.
// Free scratch kept by all the meshes of the process; past
// kScratchKeptPerProcess, a mesh that ends an op frees what it keeps, so idle
// meshes together never keep more than that.
std::atomic<uint64_t> g_scratch_kept{0};
constexpr uint64_t kScratchKeptPerProcess = uint64_t{1} << 30;

class ScratchPool {
 public:
  explicit ScratchPool(uint64_t keep) : keep_(keep) {}
  ~ScratchPool() {
    g_scratch_kept.fetch_sub(free_bytes_);
    for (const std::vector<Block>* blocks : {&used_, &free_, &held_}) {
      for (const Block& b : *blocks) std::free(b.p);
    }
  }
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // At least `bytes` bytes, 64-byte aligned, until Release; null when the
  // allocation fails.
  uint8_t* Get(uint64_t bytes) {
    const uint64_t size = std::max<uint64_t>(64, (bytes + 63) / 64 * 64);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size >= size && (best == free_.end() || it->size < best->size)) best = it;
    }
    Block b;
    if (best != free_.end()) {
      b = *best;
      free_.erase(best);
      free_bytes_ -= b.size;
      g_scratch_kept.fetch_sub(b.size);
    } else {
      b.p = std::aligned_alloc(64, size);
      if (b.p == nullptr) return nullptr;
      b.size = size;
    }
    used_.push_back(b);
    return static_cast<uint8_t*>(b.p);
  }

  // Every block is free again (`reuse`), the largest freed beyond `keep`
  // bytes (or while the process keeps more than kScratchKeptPerProcess);
  // or, after a failed op, whose transfers may still be posted into them
  // until the connections close, held until the pool goes.
  void Release(bool reuse) {
    if (!reuse) {
      held_.insert(held_.end(), used_.begin(), used_.end());
      used_.clear();
      return;
    }
    for (const Block& b : used_) {
      free_.push_back(b);
      free_bytes_ += b.size;
      g_scratch_kept.fetch_add(b.size);
    }
    used_.clear();
    while (!free_.empty() &&
           (free_bytes_ > keep_ || g_scratch_kept.load() > kScratchKeptPerProcess)) {
      auto largest = std::max_element(free_.begin(), free_.end(),
                                      [](const Block& a, const Block& b) { return a.size < b.size; });
      free_bytes_ -= largest->size;
      g_scratch_kept.fetch_sub(largest->size);
      std::free(largest->p);
      free_.erase(largest);
    }
  }

 private:
  struct Block {
    void* p = nullptr;
    uint64_t size = 0;
  };
  const uint64_t keep_;
  std::vector<Block> used_;
  std::vector<Block> free_;
  std::vector<Block> held_;  // of failed ops
  uint64_t free_bytes_ = 0;
};

class HostMesh;

// One posted send or receive of an op.
struct Posted {
  std::unique_ptr<HostTransfer> transfer;
  int rank = 0;
  bool send = false;
};

// What the transport reports before the engine's observer is installed is
// kept for it (the transport is connected before the mesh exists).
class ObserverRelay {
 public:
  void Broken(const absl::Status& why) {
    std::function<void(const absl::Status&)> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) return;
      broken_ = why;
      cb = observer_.on_broken;
    }
    if (cb) cb(why);
  }
  // Nothing while no observer is installed: the asking host then says this
  // host did not answer.
  std::optional<std::string> Query(int64_t sequence) {
    std::function<std::string(int64_t)> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cb = observer_.on_query;
    }
    if (!cb) return std::nullopt;
    return cb(sequence);
  }
  void Install(CrossHostObserver observer) {
    absl::Status earlier;
    std::function<void(const absl::Status&)> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      observer_ = std::move(observer);
      earlier = broken_;
      cb = observer_.on_broken;
    }
    if (!earlier.ok() && cb) cb(earlier);
  }
  // The engine's mesh is going: nothing more reaches it.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    observer_ = CrossHostObserver{};
  }

 private:
  std::mutex mu_;
  CrossHostObserver observer_;
  absl::Status broken_;
};

class HostMesh final : public CrossHostMesh {
 public:
  HostMesh(MeshTopology topology, std::unique_ptr<HostTransport> transport,
           std::shared_ptr<ObserverRelay> relay, const HostMeshOptions& options)
      : topology_(std::move(topology)), options_(options), transport_(std::move(transport)),
        relay_(std::move(relay)) {
    worker_ = std::thread([this] { Loop(); });
  }

  ~HostMesh() override {
    relay_->Detach();
    Abort(absl::AbortedError(
        absl::StrCat("the mesh was closed on host ", topology_.hosts[topology_.self])));
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // Transfers go before their transport.
    header_recvs_.clear();
    transport_.reset();
  }

  void Start(std::shared_ptr<const OpPlan> plan, int64_t sequence, std::vector<MemberIo> io,
             Executor* executor, absl::Status verdict, absl::Time deadline, Done done,
             absl::Duration timeout) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Op{std::move(plan), sequence, std::move(io), executor, std::move(verdict),
                          deadline, timeout, std::move(done)});
    }
    cv_.notify_all();
  }

  void Abort(const absl::Status& why_in) override {
    const absl::Status why = why_in.ok() ? absl::AbortedError("the mesh was aborted") : why_in;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_status_ = why;
      // An op on the link waits on the link's flag, not on the transport
      // (its watch may have received every fence already).
      if (stop_link_) stop_link_(why);
    }
    // Every transfer in flight fails with `why`, and the other hosts are
    // told.
    transport_->Break(why);
    cv_.notify_all();
  }

  void Observe(CrossHostObserver observer) override { relay_->Install(std::move(observer)); }

  // --- Used by the op in flight (the worker thread) ---

  int self() const { return topology_.self; }
  int size() const { return static_cast<int>(topology_.hosts.size()); }
  const std::string& host(int rank) const { return topology_.hosts[rank]; }

  // Posts a send of [p, p + bytes) to `rank` (or a receive into it from
  // `rank`) on `slot`, over the lane LaneOf picks.
  absl::Status Post(std::vector<Posted>& posted, bool send, int rank, uint8_t* p, uint64_t bytes,
                    uint64_t slot, bool directed = false) {
    const int lane = LaneOf(send ? self() : rank, send ? rank : self(), directed);
    auto t = send ? transport_->Send(rank, lane, slot, p, bytes)
                  : transport_->Recv(rank, lane, slot, p, bytes);
    if (!t.ok()) return Failure(t.status());
    posted.push_back(Posted{*std::move(t), rank, send});
    return absl::OkStatus();
  }

  // Waits for every posted transfer (receives first, in order, then sends)
  // until `deadline`, and forgets them: the first error.
  absl::Status WaitAll(std::vector<Posted>& posted, absl::Time deadline) {
    absl::Status status;
    for (bool sends : {false, true}) {
      for (Posted& x : posted) {
        if (!status.ok()) break;
        if (x.send == sends) status = WaitOne(x, deadline);
      }
    }
    return Forget(posted, status);
  }

  // Waits for one posted transfer until `deadline`.
  absl::Status WaitOne(Posted& x, absl::Time deadline) {
    absl::Status st = x.transfer->Wait(deadline);
    if (st.ok()) return st;
    if (absl::IsDeadlineExceeded(st) && transport_->broken().ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("op ", sequence_, " of the mesh: host ", host(x.rank),
                       " did not take part within the op timeout"));
    }
    return Failure(st);
  }

  // Forgets the posted transfers (without waiting for them); returns `status`.
  absl::Status Forget(std::vector<Posted>& posted, absl::Status status) {
    posted.clear();
    return status;
  }

  uint8_t* placeholder() const { return placeholder_base_; }
  ScratchPool& scratch() { return scratch_; }
  // Where the fence of an op on the link from `rank` lands (the mesh's, not
  // the op's).
  uint8_t* fence_in(int rank) { return &fence_in_[static_cast<size_t>(rank)]; }

 private:
  struct Op {
    std::shared_ptr<const OpPlan> plan;
    int64_t sequence = 0;
    std::vector<MemberIo> io;
    Executor* executor = nullptr;
    absl::Status verdict;
    absl::Time deadline;
    absl::Duration timeout;
    Done done;
  };
  struct Result {
    absl::Status status;
    bool broken = false;
    Traffic traffic;
  };

  // A transfer's failure: once the mesh is aborted here, its reason (the
  // transport fails every transfer with it); else what the transport says
  // (it names the cause).
  absl::Status Failure(const absl::Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_ ? abort_status_ : st;
  }

  void Loop() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        if (stop_) return;
        continue;
      }
      Op op = std::move(queue_.front());
      queue_.pop_front();
      const bool aborted = aborted_;
      const absl::Status abort_status = abort_status_;
      const absl::Status broken = broken_;
      lock.unlock();
      Result r;
      if (aborted) {
        r.status = abort_status;
        r.broken = true;
      } else if (!broken.ok()) {
        r.status = absl::AbortedError(
            absl::StrCat("the mesh broke in an earlier op: ", broken.message()));
        r.broken = true;
      } else {
        r = Run(op);
        if (r.broken) {
          {
            std::lock_guard<std::mutex> relock(mu_);
            broken_ = r.status;
          }
          // The other hosts learn why at once (they may be waiting on this
          // host), before the connections shut down; when the transport
          // broke first, it told them its cause already.
          transport_->Break(r.status);
        }
      }
      // An op of a mesh that broke: the header receives go now, before the
      // transport (their owner is this thread).
      if (r.broken) header_recvs_.clear();
      op.done(std::move(r.status), r.broken, r.traffic);
    }
  }

  Result Run(Op& op);
  Result ExchangeHeaders(const Op& op, absl::Status verdict);
  // The header exchange's wait: the headers of every other host, asking the
  // late ones what their members are doing shortly before the deadline.
  absl::Status WaitHeaders(const Op& op, std::vector<Posted>& sends);
  // The op's data phase over the executor's HostLink (memory the transport
  // cannot move), connecting it first if this is the mesh's first such op.
  Result RunOverLink(const Op& op, const std::vector<MemberIo>& io, int device);
  // Connects link_: rank 0 makes the id and sends it to the other hosts
  // over the transport; every host then connects on `device` (until the
  // deadline, or `abort`).
  absl::Status ConnectLink(const Op& op, int device, const std::atomic<bool>& abort);
  // The device of this host's members of `op` (on the link), or why the op
  // cannot run over the link.
  absl::Status LinkDevice(const Op& op, const std::vector<int>& rank_of, int* device) const;

  // The lane of a message from rank `from` to rank `to`: the first, or
  // when `directed`, the first for messages to a higher rank and the second
  // for those to a lower one, so that a host's large send to a peer and its
  // receive from that peer move at once, on an I/O thread each. Both ends
  // of a message pick the same lane, and the messages of one slot between
  // two hosts all go over one lane, which keeps them in order.
  static int LaneOf(int from, int to, bool directed) { return directed && from > to ? 1 : 0; }

  const MeshTopology topology_;
  const HostMeshOptions options_;
  std::unique_ptr<HostTransport> transport_;
  const std::shared_ptr<ObserverRelay> relay_;
  int64_t sequence_ = 0;  // of the op in flight
  Placeholder placeholder_;
  uint8_t* placeholder_base_ = nullptr;
  ScratchPool scratch_{options_.scratch_keep_bytes};  // the host ops' scratch
  std::vector<uint8_t> fence_in_ = std::vector<uint8_t>(topology_.hosts.size());
  // Set (under mu_) while an op runs over the link: stops its waits.
  std::function<void(const absl::Status&)> stop_link_;
  // The executor's link between the hosts (GPU ops), made by the first op
  // that needs it; only the worker uses it. Dropped when an op over it
  // fails.
  std::unique_ptr<HostLink> link_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool aborted_ = false;
  bool stop_ = false;
  absl::Status abort_status_;
  // Why an earlier op broke the connections (OK while they are fine).
  absl::Status broken_;
  // The receive of each other host's next header, posted as soon as the
  // last one came (so that a host's header goes out the moment it starts
  // the op). Only the worker uses them; header_in_ holds what they receive.
  std::vector<std::array<uint8_t, kHeaderCapacity>> header_in_;  // per rank
  std::vector<Posted> header_recvs_;
  // Why posting them again failed (the next op fails with it, broken).
  absl::Status next_headers_;
  std::thread worker_;
};

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
  // Every host computes the same verdict from the same headers. Hosts at
  // different op counts or in another wire format come first: no later op
  // could agree, so that (not a refusal) is the answer, and the mesh breaks.
  bool diverged = false;
  for (int rank = 1; rank < size; ++rank) {
    diverged = diverged || !SameWireFormat(headers[rank], headers[0]) ||
               headers[rank].sequence != headers[0].sequence;
  }
  std::vector<std::string> refusals;
  for (int rank = 0; rank < size; ++rank) {
    if (headers[rank].refused != 0) {
      refusals.push_back(absl::StrCat("host ", topology_.hosts[rank], " refused it: ",
                                      Text(headers[rank].text, sizeof(headers[rank].text))));
    }
  }
  if (!refusals.empty() && !diverged) {
    r.status = absl::FailedPreconditionError(
        absl::StrCat("op ", op.sequence, " of the mesh: ", absl::StrJoin(refusals, "; ")));
    return r;
  }
  std::vector<std::string> mismatches;
  const WireHeader& ref = headers[0];
  const std::string ref_sig = Text(ref.signature, sizeof(ref.signature));
  for (int rank = 1; rank < size; ++rank) {
    const std::string diff = Differences(headers[rank], ref);
    if (diff.empty()) continue;
    const std::string sig = Text(headers[rank].signature, sizeof(headers[rank].signature));
    std::string what = absl::StrCat("host ", topology_.hosts[rank], " submitted ", sig,
                                    " where host ", topology_.hosts[0], " submitted ", ref_sig);
    if (SameWireFormat(headers[rank], ref) && headers[rank].sequence != ref.sequence) {
      absl::StrAppend(&what, " (op ", headers[rank].sequence, " where op ", ref.sequence, ")");
    }
    absl::StrAppend(&what, " (", diff, " differ)");
    mismatches.push_back(std::move(what));
  }
  if (!mismatches.empty()) {
    r.status = absl::FailedPreconditionError(absl::StrCat(
        "op ", op.sequence, " of the mesh: the hosts submitted different ops: ",
        absl::StrJoin(mismatches, "; ")));
    // Hosts at different op counts (or wire formats) would differ at every
    // later op too: the mesh breaks, and its next generation starts afresh.
    r.broken = diverged;
    if (r.broken) {
      r.status = absl::FailedPreconditionError(absl::StrCat(
          r.status.message(), "; the hosts' op counts or wire formats differ, so the mesh "
                              "breaks (join again)"));
    }
  }
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

absl::Status HostMesh::LinkDevice(const Op& op, const std::vector<int>& rank_of,
                                           int* device) const {
  const std::string where = absl::StrCat("op ", op.sequence, " of the mesh runs on ",
                                         op.executor->buffer_kind(), " memory");
  if (!op.executor->ConnectsHosts()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ", which the ", op.executor->name(), " executor cannot move between hosts"));
  }
  std::set<int> devices;
  for (size_t m = 0; m < op.io.size(); ++m) {
    if (rank_of[m] == topology_.self && op.io[m].in != nullptr) devices.insert(op.io[m].device);
  }
  if (devices.empty()) return absl::InternalError(absl::StrCat(where, " without local members"));
  if (devices.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ", and this host's members have their buffers on devices ",
        absl::StrJoin(devices, ", "),
        ": across hosts, every member on a host must have its buffers on one device"));
  }
  *device = *devices.begin();
  if (link_ != nullptr && link_->device() != *device) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " on device ", *device, " of this host, but the mesh's link between hosts is on ",
        "device ", link_->device(), " (its first op's): across hosts, a mesh's buffers must stay on ",
        "one device per host"));
  }
  return absl::OkStatus();
}

absl::Status HostMesh::ConnectLink(const Op& op, int device,
                                            const std::atomic<bool>& abort) {
  // What rank 0 sends every other host: the link's id, or why it has none.
  struct LinkId {
    int32_t ok;
    uint32_t size;
    char id[512];
    char error[200];
  };
  static_assert(std::is_trivially_copyable_v<LinkId>);
  LinkId msg;
  std::memset(&msg, 0, sizeof(msg));
  const int size = static_cast<int>(topology_.hosts.size());
  const uint64_t slot =
      (static_cast<uint64_t>(op.sequence) << kSlotShift) | ((uint64_t{1} << kSlotShift) - 1);
  std::vector<Posted> posted;
  absl::Status status;
  if (topology_.self == 0) {
    absl::StatusOr<std::string> id = op.executor->NewHostLinkId();
    if (id.ok() && id->size() > sizeof(msg.id)) {
      id = absl::InternalError(absl::StrCat("a link id of ", id->size(), " bytes"));
    }
    if (id.ok()) {
      msg.ok = 1;
      msg.size = static_cast<uint32_t>(id->size());
      std::memcpy(msg.id, id->data(), id->size());
    } else {
      CopyText(msg.error, sizeof(msg.error), id.status().message());
    }
    for (int rank = 1; rank < size && status.ok(); ++rank) {
      status = Post(posted, /*send=*/true, rank, reinterpret_cast<uint8_t*>(&msg), sizeof(msg),
                    slot);
    }
  } else {
    status = Post(posted, /*send=*/false, 0, reinterpret_cast<uint8_t*>(&msg), sizeof(msg), slot);
  }
  status = status.ok() ? WaitAll(posted, op.deadline) : Forget(posted, status);
  if (!status.ok()) return status;
  if (msg.ok == 0 || msg.size > sizeof(msg.id)) {
    return absl::AbortedError(absl::StrCat("host ", topology_.hosts[0],
                                           " could not make the link between hosts: ",
                                           Text(msg.error, sizeof(msg.error))));
  }
  absl::StatusOr<std::unique_ptr<HostLink>> link = op.executor->ConnectHosts(
      std::string(msg.id, msg.size), topology_.self, size, device, op.deadline, abort);
  if (!link.ok()) return link.status();
  link_ = *std::move(link);
  return absl::OkStatus();
}

// While an op runs over the executor's link (NCCL), nothing of it is posted
// on the transport, and NCCL itself notices a host that went away late or
// never (a connect in progress waits for it): the op would wait for its
// deadline. So each host posts a receive of every other host's fence for
// the op, a thread waits for them, and a failure of the transport (another
// host gone, or its BREAK) stops the link's waits at once. A host sends its
// fence when its part of the op is done; every host then waits for the
// others' fences, so every posted receive is matched before the op ends.
class LinkWatch {
 public:
  LinkWatch(HostMesh* mesh, int64_t sequence, absl::Time deadline)
      : mesh_(mesh),
        slot_((static_cast<uint64_t>(sequence) << kSlotShift) | ((uint64_t{1} << kSlotShift) - 2)),
        deadline_(deadline) {
    absl::Status status;
    for (int rank = 0; rank < mesh_->size() && status.ok(); ++rank) {
      if (rank == mesh_->self()) continue;
      status = mesh_->Post(recvs_, /*send=*/false, rank, mesh_->fence_in(rank), 1, slot_);
    }
    if (!status.ok()) {
      StopFor(std::move(status));
      return;
    }
    try {
      thread_ = std::thread([this] { Watch(); });
    } catch (const std::system_error& e) {
      StopFor(absl::ResourceExhaustedError(
          absl::StrCat("cannot start a thread to watch the connections between the hosts: ",
                       e.what())));
    }
  }
  ~LinkWatch() { Stop(); }
  LinkWatch(const LinkWatch&) = delete;
  LinkWatch& operator=(const LinkWatch&) = delete;

  // True once a connection is lost, the mesh is aborted, or the deadline
  // passed: what the link's waits watch.
  const std::atomic<bool>& stop() const { return stop_; }

  // Stops the link's waits, for `why` (the first reason stands).
  void StopFor(absl::Status why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (why_.ok()) why_ = std::move(why);
    }
    stop_.store(true, std::memory_order_release);
  }

  // Ends the watch: after this host's part of the op ended with `status`.
  // OK: sends the fence to every other host and waits for theirs (until the
  // deadline), and returns why the watch stopped, if it did. Not OK: why the
  // watch had stopped the link before it returned, if it had (a lost
  // connection names its host; the link's error then only says it was
  // stopped), else the link's own error.
  absl::Status Finish(absl::Status status) {
    const bool stopped_first = stop_.load(std::memory_order_acquire);
    if (status.ok() && !stopped_first) {
      // Static, so that a send withdrawn after a failure never reads freed
      // memory.
      static uint8_t fence = 1;
      std::vector<Posted> sends;
      for (int rank = 0; rank < mesh_->size() && status.ok(); ++rank) {
        if (rank == mesh_->self()) continue;
        status = mesh_->Post(sends, /*send=*/true, rank, &fence, 1, slot_);
      }
      status = status.ok() ? mesh_->WaitAll(sends, deadline_) : mesh_->Forget(sends, status);
      // Every fence came (or the watch stopped): the thread is done.
      if (status.ok() && thread_.joinable()) thread_.join();
    }
    Stop();
    std::lock_guard<std::mutex> lock(mu_);
    if (why_.ok()) return status;
    // The link failed on its own before the watch stopped it: its error.
    if (!status.ok() && !stopped_first && !absl::IsAborted(status)) return status;
    return why_;
  }

 private:
  // Waits for every other host's fence (all at once: any one failing stops
  // the link), in slices so that Stop is seen.
  void Watch() {
    for (;;) {
      if (stopping_.load(std::memory_order_acquire)) return;
      Posted* pending = nullptr;
      std::vector<std::string> late;
      for (Posted& x : recvs_) {
        if (!x.transfer->done()) {
          if (pending == nullptr) pending = &x;
          late.push_back(mesh_->host(x.rank));
          continue;
        }
        // Done: its outcome is there at once.
        const absl::Status st = mesh_->WaitOne(x, absl::InfinitePast());
        if (!st.ok()) {
          StopFor(st);
          return;
        }
      }
      if (pending == nullptr) return;
      if (absl::Now() >= deadline_) {
        StopFor(absl::DeadlineExceededError(absl::StrCat(
            late.size() == 1 ? "host " : "hosts ", absl::StrJoin(late, ", "),
            late.size() == 1 ? " did not finish its part" : " did not finish their parts",
            " within the op timeout")));
        return;
      }
      // Any transfer's completion wakes this wait.
      (void)pending->transfer->Wait(std::min(deadline_, absl::Now() + absl::Milliseconds(20)));
    }
  }

  // Stops the thread and forgets the receives.
  void Stop() {
    stopping_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    mesh_->Forget(recvs_, absl::OkStatus()).IgnoreError();
  }

  HostMesh* const mesh_;
  const uint64_t slot_;
  const absl::Time deadline_;
  std::vector<Posted> recvs_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stopping_{false};  // Stop() is ending the thread
  std::mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);  // why the watch stopped
};

HostMesh::Result HostMesh::RunOverLink(const Op& op,
                                                         const std::vector<MemberIo>& io,
                                                         int device) {
  Result r;
  LinkWatch watch(this, op.sequence, op.deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) watch.StopFor(abort_status_);
    stop_link_ = [&watch](const absl::Status& why) { watch.StopFor(why); };
  }
  absl::Status status;
  if (watch.stop().load(std::memory_order_acquire)) {
    status = absl::AbortedError("the link's op was stopped before it started");
  }
  if (status.ok() && link_ == nullptr) status = ConnectLink(op, device, watch.stop());
  if (status.ok()) {
    // Lanes and replication: the CUDA kernels do not continue a fold from a
    // partial result, which the chain needs.
    SpanningOptions options;
    options.chain = false;
    status = link_->Run(*op.plan, io, options, placeholder_base_, op.deadline, watch.stop(),
                        &r.traffic);
  }
  status = watch.Finish(std::move(status));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_link_ = nullptr;
  }
  if (status.ok()) return r;
  // The hosts may be at different points of the schedule: the link and the
  // connections cannot be trusted any more.
  link_.reset();
  r.broken = true;
  std::vector<std::string> others;
  for (int rank = 0; rank < static_cast<int>(topology_.hosts.size()); ++rank) {
    if (rank != topology_.self) others.push_back(topology_.hosts[rank]);
  }
  const std::string with = absl::StrCat(others.size() == 1 ? "host " : "hosts ",
                                        absl::StrJoin(others, ", "));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) {
      r.status = abort_status_;
      return r;
    }
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    r.status = absl::DeadlineExceededError(
        absl::StrCat("op ", op.sequence, " of the mesh: the exchange with ", with, " over the ",
                     op.executor->name(), " executor's link did not finish within the op timeout (",
                     status.message(), ")"));
  } else if (status.code() == absl::StatusCode::kAborted ||
             status.code() == absl::StatusCode::kInternal ||
             status.code() == absl::StatusCode::kUnavailable) {
    r.status = absl::AbortedError(absl::StrCat("op ", op.sequence, " of the mesh: the exchange with ",
                                               with, " over the ", op.executor->name(),
                                               " executor's link failed (", status.message(), ")"));
  } else {
    r.status = status;
  }
  return r;
}

}  // namespace

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
