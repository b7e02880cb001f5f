// The collectived client SDK.
//
// A process connects to the host's collectived daemon, joins a mesh of named
// axes, allocates buffers that it shares with the daemon, and runs jax.lax
// collectives over the mesh's axes:
//
//   auto client = collectived::Client::Connect({.client_name = "worker"});
//   auto mesh = (*client)->JoinMesh({.name = "train", .axes = {{"batch", 4}}});
//   auto buf = (*client)->Allocate(1024 * sizeof(float));
//   auto x = collectived::Array::Of<float>(*buf, {1024});
//   ... fill buf->as<float>() ...
//   absl::Status st = (*mesh)->psum(x, "batch");  // in place, every member
//
// Errors are absl::Status values carrying the daemon's gRPC code and message
// (e.g. DEADLINE_EXCEEDED naming the members that never submitted).
//
// Thread-safety: Client and Mesh are safe to use from several threads; ops of
// one mesh are ordered by their submission order (as seen by the daemon), so a
// program that submits from several threads must order its submissions itself.
// Buffer is a move-only handle; the memory it maps may be read and written by
// any thread, but not while an op that uses it is in flight.
#ifndef COLLECTIVED_CLIENT_H_
#define COLLECTIVED_CLIENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collectived/dtype.h"

namespace collectived {

class ClientImpl;
namespace internal {
struct OpArgs;  // client/src/op_spec.h
}  // namespace internal
class OpState;

struct ClientOptions {
  // Control socket of the daemon. Empty: $COLLECTIVED_SOCKET, else
  // $XDG_RUNTIME_DIR/collectived/collectived.sock, else
  // /tmp/collectived-<uid>/collectived.sock (the daemon's default).
  std::string socket_path;
  // Shown in the daemon's diagnostics and error messages.
  std::string client_name;
  // How long Connect waits for the daemon to answer.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Deadline of each control RPC (allocate, free, ...).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long tearing down may wait for the daemon: Mesh::Leave (and ~Mesh)
  // and ~Client each wait at most this for its answer, and once it left one
  // of them unanswered, the others do not wait at all (until the daemon
  // answers a join, allocate or free). So destroying a client and its meshes
  // takes at most about this long even when the daemon hangs. Nothing is
  // lost by giving up: the daemon closes the session, breaking its meshes
  // and freeing its buffers, when the client's side socket closes.
  absl::Duration close_timeout = absl::Seconds(1);
  // Submit ops through the session's shared-memory queue (no gRPC round trip
  // per op; see DESIGN "fast path"). False, or a daemon without a fast path:
  // ops go over the gRPC Execute stream. Results and errors are the same.
  // COLLECTIVED_FAST_PATH=0 in the environment turns it off for every client.
  bool fast_path = true;
  // How long a thread waiting for a fast-path op polls before it sleeps on
  // the queue's futex. Polling costs a core; sleeping costs a wake-up (a few
  // microseconds) when the op completes.
  absl::Duration fast_path_spin = absl::Microseconds(200);
  // How long a thread waiting for an op on the gRPC Execute stream polls the
  // stream (yielding the CPU between looks) before it sleeps until the
  // answer; as on the fast path, only for ops of up to 4 MiB of input. Polling spares the wake-up of a sleeping thread when the answer
  // arrives (tens of microseconds on a VM whose CPU went idle); yielding lets
  // the daemon and the other members run on a machine with fewer cores than
  // threads that want one.
  absl::Duration grpc_spin = absl::Microseconds(200);
};

// A shared-memory region allocated by the daemon and mapped in this process.
// Move-only. Destroying it unmaps it here; the daemon frees it when the
// session ends or on Client::Free.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const std::string& id() const { return id_; }
  // Host memory: the buffer's address in this process. GPU memory: its
  // device address (a CUdeviceptr) on device_ordinal(), usable from CUDA
  // kernels and copies in this process, not dereferenceable on the host.
  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The device holding the memory, as the daemon names it: "cpu" for host
  // memory, "cuda:GPU-<uuid>" for a GPU (GPU buffers need the SDK built with
  // CUDA).
  const std::string& device() const { return device_; }
  // A GPU buffer's CUDA device ordinal in this process (found by the GPU's
  // UUID: ordinals differ between containers); -1 for host memory.
  int device_ordinal() const { return device_ordinal_; }
  // A buffer a mesh's members share (Mesh::AllocateShared).
  bool mesh_shared() const { return !shared_mesh_.empty(); }
  bool valid() const { return data_ != nullptr; }
  // The whole buffer as elements of T.
  template <typename T>
  std::span<T> as() const {
    return std::span<T>(static_cast<T*>(data_), size_ / sizeof(T));
  }

 private:
  friend class ClientImpl;
  friend class Mesh;
  Buffer(std::string id, void* data, size_t size, std::string device)
      : id_(std::move(id)), data_(data), size_(size), device_(std::move(device)) {}
  void Reset();

  std::string id_;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string device_;
  int device_ordinal_ = -1;
  std::string shared_mesh_;  // the id of the mesh that shares it; empty: none
  const ClientImpl* owner_ = nullptr;  // the client whose session holds it
  // GPU buffers: the imported mapping (unmapped when the last owner drops
  // it); host buffers: empty, data_ is an mmap.
  std::shared_ptr<void> gpu_mapping_;
};

// A typed, shaped view of part of a buffer: what a collective reads or
// writes. Row-major, densely packed.
struct Array {
  const Buffer* buffer = nullptr;
  size_t offset = 0;  // bytes from the start of the buffer
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  template <typename T>
  static Array Of(const Buffer& buffer, std::vector<int64_t> shape, size_t offset = 0) {
    return Array{&buffer, offset, DTypeOf<T>(), std::move(shape)};
  }
  // The product of the dimensions; -1 when a dimension is negative or the
  // product of the non-zero dimensions overflows int64 (no daemon accepts
  // such a shape).
  int64_t num_elements() const;
  // num_elements() times the element size; SIZE_MAX when num_elements() is
  // -1 or the byte count overflows.
  size_t num_bytes() const;
  // Pointer to the first element in this process.
  template <typename T>
  T* data() const {
    return reinterpret_cast<T*>(static_cast<char*>(buffer->data()) + offset);
  }
};

// The axis names a collective runs over, as JAX's axis_name: one name
// ("batch"), a tuple ({"data", "model"}, linearized in the order given),
// AxisNames::None(): the empty tuple (JAX's axis_name=(): every member is a
// group of one by itself, so psum returns x), or AxisNames::All(): every axis
// of the mesh in mesh order.
//
// A default-constructed AxisNames (a bare {} or AxisNames{}) names nothing,
// and every op given one fails with INVALID_ARGUMENT without running: {}
// meant every axis in earlier releases, then briefly the empty tuple, and
// code written for either meaning must not compute the other silently
// (CHANGELOG.md). axis_index and axis_size give -1 for it.
class AxisNames {
 public:
  AxisNames() = default;  // names nothing: refused by every op
  AxisNames(const char* name) : names_{name}, kind_(Kind::kNames) {}                 // NOLINT
  AxisNames(std::string name) : names_{std::move(name)}, kind_(Kind::kNames) {}      // NOLINT
  AxisNames(absl::string_view name) : names_{std::string(name)}, kind_(Kind::kNames) {}  // NOLINT
  AxisNames(std::initializer_list<std::string> names) : names_(names), kind_(Kind::kNames) {}
  // A tuple of names; an empty vector is the empty tuple (as Python's ()).
  AxisNames(std::vector<std::string> names)  // NOLINT
      : names_(std::move(names)), kind_(Kind::kNames) {}
  // Every axis of the mesh, in mesh order.
  static AxisNames All() {
    AxisNames a;
    a.kind_ = Kind::kAll;
    return a;
  }
  // The empty tuple: no axes.
  static AxisNames None() { return AxisNames(std::vector<std::string>{}); }
  // Whether this is All(); names() is then empty.
  bool all() const { return kind_ == Kind::kAll; }
  // Whether this is the empty tuple (None()).
  bool none() const { return kind_ == Kind::kNames && names_.empty(); }
  // Whether this names nothing (default-constructed): ops refuse it.
  bool unset() const { return kind_ == Kind::kUnset; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  enum class Kind { kUnset, kNames, kAll };
  std::vector<std::string> names_;
  Kind kind_ = Kind::kUnset;
};

// The outcome of an asynchronous collective. Copyable; all copies share it.
// Where a fast-path op's time went: CLOCK_MONOTONIC nanoseconds (one clock
// for every process of the host). All 0 for ops sent over gRPC; the daemon's
// stamps are 0 when the op failed before reaching it.
// In the order an op reaches them: submitted, taken, matched, ready,
// started, launched, executed, completed, reaped (the later stages were
// added after the first five, at the end).
struct OpTiming {
  int64_t submitted_ns = 0;  // the SDK published the op in the queue
  int64_t taken_ns = 0;      // the daemon's queue thread took it
  int64_t started_ns = 0;    // a daemon thread began to run it
  int64_t completed_ns = 0;  // the daemon published the result
  int64_t reaped_ns = 0;     // this process saw the result
  // Its turn came: every member had submitted it and the mesh's op before
  // it was done.
  int64_t matched_ns = 0;
  // Its inputs were ready: the streams of stream-ordered members had
  // reached it (= matched_ns when no member orders it with a stream).
  int64_t ready_ns = 0;
  int64_t launched_ns = 0;   // a GPU op: all its kernels and copies were enqueued (else 0)
  int64_t executed_ns = 0;   // the daemon's executor returned: every output written
  // A duration, not a time (0 for a CPU op): a GPU op's span on the
  // daemon's stream, from an event recorded as its first kernel or copy was
  // about to be enqueued (the stream idle, so about started_ns) to one after
  // its last work ended. So the host's launching is inside it: started_ns +
  // device_ns is about when the GPU finished, and executed_ns minus that is
  // the daemon noticing.
  int64_t device_ns = 0;
};

// Memory the daemon's executor moved for a fast-path op, all members
// together: bytes read and written, and the least the op needs (every needed
// input byte read once, every output byte written once). All 0 for ops sent
// over gRPC (GetStats has the totals either way) and for ops that did not run.
struct OpTraffic {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t bytes_required = 0;
};

class OpFuture {
 public:
  OpFuture() = default;
  // Waits until the op completes and returns its status. Bounded: at most
  // `timeout`, and by default the mesh's op timeout plus a grace period (the
  // daemon fails ops that miss their deadline, so this only expires when the
  // daemon stops answering).
  absl::Status Wait(std::optional<absl::Duration> timeout = std::nullopt) const;
  // True once the op completed (successfully or not). Does not block: on
  // the fast path it reaps completions that arrived, so polling Ready() alone
  // sees the op complete.
  bool Ready() const;
  // How long Wait() waits when given no timeout: the mesh's op timeout plus a
  // grace period (zero for an empty future).
  absl::Duration default_timeout() const;
  // The op's sequence number on its mesh, once completed (-1 before).
  int64_t sequence() const;
  // Shape and dtype of the result, once completed.
  std::vector<int64_t> out_shape() const;
  DType out_dtype() const;
  // Valid once Ready().
  OpTiming timing() const;
  OpTraffic traffic() const;

 private:
  friend class ClientImpl;
  friend class Mesh;
  explicit OpFuture(std::shared_ptr<OpState> state) : state_(std::move(state)) {}
  std::shared_ptr<OpState> state_;
};

// Axes may be negative, counting from the end as in numpy and JAX (-1: the
// last).
struct AllGatherOptions {
  // Where the gathered dimension goes in the output; negative counts from
  // the end of the output (untiled, it has one more dimension than x).
  int axis = 0;
  bool tiled = false;  // concatenate along `axis` instead of stacking
};

struct PsumScatterOptions {
  int scatter_dimension = 0;  // a dimension of x
  bool tiled = false;
};

struct AllToAllOptions {
  int split_axis = 0;   // a dimension of x
  int concat_axis = 0;  // a position in the output (which has x's rank)
  bool tiled = false;
};

// Every collective as one value, for code that forwards ops rather than
// calling them (language bindings, the JAX handler): Mesh::submit(op) runs
// `op` exactly as the method of the same name would.
enum class CollectiveKind : int {
  kPsum = 0,
  kPmean = 1,
  kPmax = 2,
  kPmin = 3,
  kAllGather = 4,
  kPpermute = 5,
  kPsumScatter = 6,
  kAllToAll = 7,
  kBroadcast = 8,
  kBarrier = 9,
};

struct Collective {
  CollectiveKind kind = CollectiveKind::kPsum;
  Array x;                   // every kind but barrier
  std::optional<Array> out;  // absent: in place; all_gather and psum_scatter need one
  AxisNames axes;            // names nothing until set: every op refuses it
  std::vector<std::pair<int, int>> perm;  // ppermute
  // all_gather: axis; psum_scatter: scatter_dimension; all_to_all:
  // split_axis; broadcast: root.
  int axis = 0;
  int concat_axis = 0;  // all_to_all
  bool tiled = false;   // all_gather, psum_scatter, all_to_all
};

struct MeshOptions {
  // Name shared by every member; 1-128 characters of [A-Za-z0-9_.:/-].
  std::string name;
  // Axes, major to minor: {{"data", 2}, {"model", 4}}.
  std::vector<std::pair<std::string, int>> axes;
  // This member's coordinate on each axis; empty lets the daemon assign the
  // next free one (every member must choose the same way).
  std::vector<int> coordinate;
  // How long to wait for the other members to join.
  absl::Duration join_timeout = absl::Seconds(60);
  // Per-op deadline for every member to submit (zero: the daemon's default).
  absl::Duration op_timeout = absl::ZeroDuration();
  // The job or tenant the mesh belongs to: meshes are named within a scope.
  std::string scope;
  // Optional secret: the first member sets it, later members must match it.
  std::string join_token;
};

// One member's place in a joined mesh, and the collectives over its axes.
// Every member must call the same collectives in the same order (as under
// jax.pmap/shard_map). Obtained from Client::JoinMesh. It may outlive its
// Client (it shares the connection): once the Client is destroyed its
// session is closed, the mesh is broken for the other members, and this
// Mesh's ops fail with FAILED_PRECONDITION ("client is closed").
class Mesh {
 public:
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const std::string& id() const { return id_; }
  const std::string& name() const { return name_; }
  int64_t generation() const { return generation_; }
  // Linear (row-major) index of this member, and the number of members.
  int index() const { return index_; }
  int size() const { return static_cast<int>(members_); }
  // jax.lax.axis_index: this member's coordinate on `axis`; for several axes
  // the row-major index over them in the given order (0 for the empty tuple,
  // index() for AxisNames::All()). -1 for an unknown axis, or axes that name
  // nothing (a default-constructed AxisNames).
  int axis_index(const AxisNames& axes) const;
  // The number of members along `axis` (product for several: 1 for the
  // empty tuple, size() for AxisNames::All()); -1 if unknown or unset.
  int axis_size(const AxisNames& axes) const;
  const std::vector<std::pair<std::string, int>>& axes() const { return axes_; }
  const std::vector<int>& coordinate() const { return coordinate_; }
  // OK when this member can run small synchronous ops among the members
  // (member-side small ops, README "How an op travels"; whether an op does
  // depends on the op and on what the other members do); otherwise why
  // every op of this member goes through the daemon (the daemon offers no
  // segment for the mesh, or its member-side code is not this SDK's).
  const absl::Status& member_side() const { return member_side_status_; }
  // Whether this mesh's members read each other's buffers for their
  // synchronous all_gathers and reductions of the sizes README "All_gathers
  // and reductions that read the members' buffers" gives: "yes", "not
  // decided yet" (before the first such op), or "no: " and why
  // (COLLECTIVED_MEMBER_READS=0 in a member, members of different users, no
  // member-side ops).
  std::string member_reads() const;
  // How this member's member-side ops ran, counted since it joined the mesh
  // (its ops through the daemon are the daemon's to count): through the
  // segment, by reading the others' buffers (all_gathers, and reductions of
  // the whole result), split between the members (reductions of 2 - 32 MiB
  // over the group), or into a buffer the mesh shares. For diagnostics;
  // any thread.
  struct MemberSidePaths {
    uint64_t segment = 0;
    uint64_t reads = 0;
    uint64_t split = 0;
    uint64_t shared = 0;
  };
  MemberSidePaths member_side_paths() const;

  // Collectives. `out` absent: the result replaces `x` in place (only when it
  // has x's byte size). Each returns when the op completed on this member.
  absl::Status psum(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  absl::Status pmean(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  absl::Status pmax(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  absl::Status pmin(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  absl::Status all_gather(const Array& x, const AxisNames& axes, const Array& out,
                          AllGatherOptions options = {});
  // perm: (source, dest) pairs of indices along `axes`; members that are no
  // dest receive zeros.
  absl::Status ppermute(const Array& x, const AxisNames& axes,
                        const std::vector<std::pair<int, int>>& perm,
                        std::optional<Array> out = {});
  absl::Status psum_scatter(const Array& x, const AxisNames& axes, const Array& out,
                            PsumScatterOptions options = {});
  absl::Status all_to_all(const Array& x, const AxisNames& axes, AllToAllOptions options,
                          std::optional<Array> out = {});
  // Every member of the group receives the input of group index `root`.
  absl::Status broadcast(const Array& x, const AxisNames& axes, int root,
                         std::optional<Array> out = {});
  // Returns when every member of the group reached the barrier (by default
  // every member of the mesh).
  absl::Status barrier(const AxisNames& axes = AxisNames::All());

  // Asynchronous forms: submit and return at once. Buffers must not be
  // touched until the future is ready.
  OpFuture psum_async(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  OpFuture pmean_async(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  OpFuture pmax_async(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  OpFuture pmin_async(const Array& x, const AxisNames& axes, std::optional<Array> out = {});
  OpFuture all_gather_async(const Array& x, const AxisNames& axes, const Array& out,
                            AllGatherOptions options = {});
  OpFuture ppermute_async(const Array& x, const AxisNames& axes,
                          const std::vector<std::pair<int, int>>& perm,
                          std::optional<Array> out = {});
  OpFuture psum_scatter_async(const Array& x, const AxisNames& axes, const Array& out,
                              PsumScatterOptions options = {});
  OpFuture all_to_all_async(const Array& x, const AxisNames& axes, AllToAllOptions options,
                            std::optional<Array> out = {});
  OpFuture broadcast_async(const Array& x, const AxisNames& axes, int root,
                           std::optional<Array> out = {});
  OpFuture barrier_async(const AxisNames& axes = AxisNames::All());

  // Any collective, given as a value (see Collective). A kind out of range,
  // or all_gather/psum_scatter without `out`: a future failed with
  // INVALID_ARGUMENT.
  OpFuture submit(const Collective& op);
  // The same op, waited for: submit(op).Wait(), except that a small op
  // (psum, pmean, pmax, pmin, all_gather, barrier with an input of at most
  // the mesh's member_op_bytes, in host memory) may run among the members
  // themselves, without a round trip through the daemon; results, errors
  // and failures are the daemon's (see README, "Member-side small ops").
  // The synchronous methods above (psum, ..., barrier) do the same.
  absl::Status run(const Collective& op);
  // run(op) for a caller that must be able to stop waiting (a language
  // binding's Ctrl-C), as a future: complete when the op ran among the
  // members (or was refused here), else the daemon's answer, to wait for as
  // the caller likes. While the op waits for the other members among
  // themselves, `interrupted` is called about every 10 ms (not during the
  // first fraction of a millisecond); once it returns true this member
  // gives the op up: the future fails with CANCELLED, and the mesh breaks
  // for every member (ABORTED, saying this member was interrupted), as it
  // does when a member gives up a member-side op (README, "Member-side
  // small ops"). Unless the others arrived at that very moment: the op then
  // completes (or goes to the daemon) as if never interrupted.
  // `interrupted` is called on this thread, only during this call, with
  // the mesh's member-side lock held: an op of this mesh started from it
  // fails with FAILED_PRECONDITION (it would wait for itself). If it
  // throws, the op is given up as above and the exception propagates. An
  // empty function is never called. A future of an op that ran member-side
  // carries its status only (no sequence, timing or traffic: the daemon
  // never saw it).
  OpFuture start(const Collective& op, const std::function<bool()>& interrupted);

  // The caller stops waiting for `op`, an op of this mesh that went to the
  // daemon (a language binding's Ctrl-C during a synchronous call): nobody
  // will read its result, and this member's next op would be matched with
  // the other members' next ones, one result behind. So unless `op` has
  // completed, the mesh breaks for every member: the op in flight runs to
  // its end, and from the next op of any member on, every op fails with
  // ABORTED giving `why` (a mesh without a member-side segment, e.g. across
  // hosts: this member leaves it, and the others' ops fail naming it).
  // Returns whether it broke the mesh (false: `op` had completed, or is
  // not valid).
  bool give_up(const OpFuture& op, absl::string_view why);

  // Stream-ordered submission, for GPU buffers (an SDK built with CUDA).
  // After set_stream(s), every op this Mesh submits is ordered with the CUDA
  // stream `s` (a cudaStream_t or CUstream; null would be the legacy default
  // stream, so pass one you created) instead of with the host:
  //  - the daemon reads the op's inputs only once `s` has reached the point
  //    where the op was submitted, so kernels that write the inputs may
  //    still be running on `s` when you submit (no cudaStreamSynchronize);
  //  - work you enqueue on `s` after the call runs after the op has written
  //    its result: the stream waits, the host does not;
  //  - the op's future still gives its outcome. An op that fails releases
  //    the stream too (the daemon, or this SDK when the daemon is gone), and
  //    the work after it then sees outputs that were not written: check the
  //    future before trusting them.
  // The daemon waits for `s` within the op's deadline (DEADLINE_EXCEEDED
  // naming the members whose streams did not get there). At most 256
  // stream-ordered ops of a Mesh may be outstanding: the next waits, on the
  // host, for the oldest. If enqueueing the stream's wait fails, the call
  // waits for the op on the host instead (the ordering holds either way).
  // set_stream(nullptr) returns to the simple contract (inputs complete at
  // submission). Every stream given here must stay valid until the Mesh is
  // destroyed: ~Mesh synchronizes them (their pending waits read the words).
  // Ops on a new stream are not ordered after those on the previous one.
  // Not concurrently with ops on this Mesh.
  // Errors: UNIMPLEMENTED from an SDK built without CUDA;
  // FAILED_PRECONDITION without a usable CUDA driver or GPU; the errors of
  // allocating the 4 KiB host buffer that holds the words.
  absl::Status set_stream(void* stream);
  // The stream set by set_stream (null: none).
  void* stream() const;
  // One op ordered with `stream` as set_stream(stream) orders ops, whatever
  // set_stream says and without changing it: for callers that share the
  // Mesh with threads whose ops are not ordered with that stream (other ops
  // may run concurrently). The stream's rules and the errors are
  // set_stream's and submit's; a null stream is submit(op).
  OpFuture submit(const Collective& op, void* stream);

  // A zeroed buffer of host memory that every member of this mesh maps:
  // results written once for the whole mesh. Every member calls it the same
  // number of times with the same sizes (it does not wait for the others);
  // each member's k-th call returns the same memory (the first caller's
  // allocates it; a different size is FAILED_PRECONDITION naming both, and
  // so is a call that comes after every member holding it freed it).
  // Use it as the output of every member of an op whose result is the same
  // for all: psum, pmean, pmax, pmin, all_gather or broadcast over every
  // axis of the mesh (AxisNames::All()), each member naming the same region,
  // no input inside it. The result is then written once instead of once
  // per member; any other op with it as output fails with
  // FAILED_PRECONDITION. Who writes it and when to read it: the op writes
  // the region while it runs (the daemon; for synchronous ops run among the
  // members, the group's first member for a small reduction, each member
  // its own block for an all_gather along the first dimension); every
  // member may read it once its own op is complete (the op completes for
  // all members at once), and until some member submits the next op writing
  // into it, so order reads before that (e.g. by a barrier, or by each
  // member reading before it submits its next op into the buffer, as the op
  // waits for every member).
  // Members may write it themselves like any shared memory; the daemon
  // never reads it unless it is an op's input. Free it like any Buffer
  // (Client::Free, or with the client); the memory goes when every member
  // freed it.
  absl::StatusOr<Buffer> AllocateShared(size_t bytes);

  // Leaves the mesh (it breaks for the other members). Also done by the
  // destructor. Waits at most ClientOptions::close_timeout (see there);
  // DEADLINE_EXCEEDED when the daemon did not answer in time, and then the
  // mesh breaks when the session ends.
  absl::Status Leave();

 private:
  friend class ClientImpl;
  Mesh() = default;
  struct OpRequest;  // defined in the implementation
  struct StreamOrder;  // set_stream's words and stream
  struct MemberSide;  // member-side small ops: the segment, ops in flight
  // Submits the op `args` describes (client/src/op_spec.h), or fails it at
  // once when CheckArgs refuses it.
  OpFuture Submit(const internal::OpArgs& args);
  OpFuture Submit(const OpRequest& request, void* stream = nullptr);
  // Sends `request` to the daemon, ordered with `stream` (null: the one
  // set_stream set, if any).
  OpFuture Dispatch(const OpRequest& request, void* stream = nullptr);
  OpFuture SubmitOnStream(const OpRequest& request, void* stream);
  // Creates stream_order_ once (the words' buffer, registered with CUDA).
  absl::Status EnsureStreamOrder();
  // Runs the op `args` describes and waits for it: member-side when it can,
  // else through the daemon.
  absl::Status Run(const internal::OpArgs& args);
  // Runs `args` member-side when it can (true; its outcome in *status),
  // else sends it to the daemon (false; its future in *future).
  // `interrupted`: see start (may be null).
  bool RunOrDispatch(const internal::OpArgs& args, const std::function<bool()>* interrupted,
                     absl::Status* status, OpFuture* future);
  // A future already completed with `status` (an op refused in this process,
  // or one that ran member-side: OK included).
  OpFuture FailedOp(absl::Status status) const;

  std::shared_ptr<ClientImpl> client_;
  std::string id_;
  std::string name_;
  int64_t generation_ = 0;
  int index_ = 0;
  int64_t members_ = 0;
  std::vector<std::pair<std::string, int>> axes_;
  std::vector<int> coordinate_;
  absl::Duration op_deadline_;
  std::atomic<bool> left_{false};
  // Shared with the failure hooks of stream-ordered ops still in flight.
  // Set once (EnsureStreamOrder), then stream_order_ready_: readers look
  // at that first.
  std::shared_ptr<StreamOrder> stream_order_;
  std::atomic<bool> stream_order_ready_{false};
  std::unique_ptr<MemberSide> member_side_;  // null: every op goes through the daemon
  absl::Status member_side_status_;          // why member_side_ is null
};

// A session with the daemon. Create with Connect.
class Client {
 public:
  // Opens a session on the daemon at options.socket_path (see ClientOptions)
  // and attaches its side socket. UNAVAILABLE if no daemon answers.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options = {});
  // Closes the session (meshes it is in break for their other members).
  // Waits for the daemon at most ClientOptions::close_timeout; no other call
  // on this client may be running. Ops still pending fail with CANCELLED.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Joins (or creates) a mesh; returns when every member joined, or fails at
  // options.join_timeout naming the missing coordinates.
  absl::StatusOr<std::unique_ptr<Mesh>> JoinMesh(const MeshOptions& options);
  // Allocates a zeroed shared buffer of at least `bytes` bytes of host
  // memory (device "cpu").
  absl::StatusOr<Buffer> Allocate(size_t bytes);
  // The same on `device`: "" or "cpu" (host memory), "cuda:N" (a GPU by the
  // daemon's ordinal), "cuda:GPU-<uuid>" or "GPU-<uuid>" (a GPU by UUID).
  // INVALID_ARGUMENT for another name, FAILED_PRECONDITION (saying why) when
  // the daemon cannot allocate that kind of memory. This SDK maps host memory
  // only: a GPU buffer is freed in the daemon again and the call returns
  // UNIMPLEMENTED ("mapping CUDA buffers needs the SDK built with CUDA").
  absl::StatusOr<Buffer> Allocate(size_t bytes, std::string_view device);
  // Frees a buffer in the daemon and unmaps it here.
  absl::Status Free(Buffer& buffer);

  const std::string& session_id() const;
  // The path of the control socket this client talks to.
  const std::string& socket_path() const;
  // Whether ops go through the shared-memory fast path (else gRPC).
  bool fast_path() const;

 private:
  explicit Client(std::shared_ptr<ClientImpl> impl);
  // Shared with the Meshes it joined.
  std::shared_ptr<ClientImpl> impl_;
};

}  // namespace collectived

#endif  // COLLECTIVED_CLIENT_H_
