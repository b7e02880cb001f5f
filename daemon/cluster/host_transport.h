// HostTransport: the connections between the daemons (hosts) of one mesh
// generation, and the tagged messages a mesh's ops exchange over them.
//
// Why the daemon owns this transport instead of Gloo's: Debian's Gloo (a
// 2022 snapshot) listens on a kernel-picked port per pair and takes the
// first connection that arrives, cannot be handed a socket the daemon has
// authenticated, has no TLS, and ends the process (an exception on its
// device thread) on messages a peer controls (a message longer than its
// receive, an unexpected slot). Here every peer-controlled condition is an
// error value that breaks the mesh with a name, never the daemon.
//
// Connecting (Connect): each host listens on a kernel-picked port of its
// advertised address and publishes it in the cluster's store under the
// mesh generation's prefix; for each pair of hosts the higher rank connects
// to the lower one, `lanes` times. Every connection is authenticated before
// it carries anything (peer_auth.h: a keyed handshake bound to the mesh
// generation; inside TLS with certificates that must name the expected host
// when TLS is configured). A connection that fails the handshake is closed
// and logged with its peer address (event=cluster_connection_refused);
// strangers neither take a pair's place nor delay the others (handshakes run
// side by side, each for at most handshake_timeout, at most
// max_pending_handshakes at once). The listener closes once every expected
// connection is in: while the mesh runs nothing listens.
//
// Messages: a transfer is a send or a receive of bytes on (peer, lane,
// slot); a send and a receive of the same slot between two hosts match in
// the order they were posted. The receiver tells the sender when a receive
// is posted (READY, with its capacity); the sender's bytes then go straight
// from its memory to the receiver's, in frames of at most frame_bytes, so
// control messages (READY, BREAK) never wait behind a long transfer. A
// send longer than the receive it meets, data nobody asked for, or any
// malformed frame is a protocol error: the transport breaks.
//
// Failures: a host that breaks the mesh (Break, with a status) fails every
// transfer with it and sends every other host a BREAK carrying its code and
// reason before it shuts its connections down, so the hosts name the
// cause, not the connection that happened to close first. On the receiving
// host, a peer's BREAK, its connection ending without one (its daemon ended
// or was killed: the kernel closed its sockets; the host is named as
// gone), or anything malformed it sent ends that connection: its transfers
// fail with that cause, while the other connections go on until their own
// BREAK or end comes, after what the peer sent on them before. So an op
// that needs nothing more from a host can still finish (a barrier another
// host completed just before it broke the mesh does, whichever of its
// connections its BREAK reaches first). The first such failure is reported once through on_break; a host
// whose op fails breaks its own transport with the op's status, which
// carries the cause on to the others. A host whose peers stopped answering
// without closing (a cut link) is seen at the waits' deadlines; Query asks
// a peer what its members are doing (the engine's answer), so a late op
// names the members it waits for.
//
// Threads: one I/O thread per lane (epoll over the lane's connections).
// Posting threads write directly when the socket takes the bytes and leave
// the rest to the I/O thread. Each connection has a read lock (the
// receives and the frame being read) and a write lock (the sends, the
// READYs and the frame being written); a thread never holds a connection
// lock while it calls out (on_break, on_query) or breaks the transport.
#ifndef COLLECTIVED_DAEMON_CLUSTER_HOST_TRANSPORT_H_
#define COLLECTIVED_DAEMON_CLUSTER_HOST_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/cluster/peer_stream.h"

namespace collectived {

class TlsConfig;
class HostTransport;

// Where the hosts of a mesh generation publish and find their listening
// addresses: the cluster's key-value store.
class AddressBook {
 public:
  virtual ~AddressBook() = default;
  // Sets `key` (never set before) to `value`.
  virtual absl::Status Publish(const std::string& key, const std::string& value) = 0;
  // Waits until every key exists (at most until `deadline`): their values,
  // in order; DEADLINE_EXCEEDED naming the missing keys.
  virtual absl::StatusOr<std::vector<std::string>> Lookup(const std::vector<std::string>& keys,
                                                          absl::Time deadline) = 0;
};

// How the connections of one mesh generation prove themselves.
struct TransportSecurity {
  peer_auth::Key key{};
  peer_auth::Tag tag{};
  // Null: plaintext (authenticated by the key, not encrypted).
  std::shared_ptr<const TlsConfig> tls;
  // Names the mesh generation in logs ("mesh 'x' generation 3").
  std::string description;
};

struct TransportOptions {
  // Connections per pair of hosts.
  int lanes = 2;
  // Most payload bytes of one data frame.
  uint64_t frame_bytes = uint64_t{1} << 20;
  // A connection that has not completed its handshake in this time is
  // closed.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Connections handshaking at once beyond which new ones are closed.
  int max_pending_handshakes = 64;
  // How long Break waits for its BREAK messages to go out before the
  // connections close regardless.
  absl::Duration break_flush = absl::Milliseconds(500);
  // A peer broke the mesh (its BREAK: its code and reason), or is gone, or
  // sent what this host cannot accept: called once, on an I/O thread,
  // without the transport's locks, after the transport broke.
  std::function<void(int rank, const absl::Status& why)> on_break;
  // A peer asks what this host's members are doing at op `sequence` (its
  // answer goes back, at most kMaxQueryAnswerBytes): called on an I/O thread,
  // without the transport's locks.
  // Nothing (no answer goes back) when it cannot say.
  std::function<std::optional<std::string>(int64_t sequence)> on_query;
  // Polled while Connect runs, from its threads (every kCancelSlice while
  // it waits on sockets; while it waits for the address book, after each
  // call of 250 ms or more, as long as the book's store takes to answer):
  // once true, Connect stops waiting (for the address book, a dial, a
  // handshake, a connection) and fails with CANCELLED. Null: never. Not
  // kept past Connect.
  std::function<bool()> cancelled;
};

// How often a cancellable Connect looks at TransportOptions::cancelled.
inline constexpr absl::Duration kCancelSlice = absl::Milliseconds(50);

inline constexpr size_t kMaxBreakReasonBytes = 2048;
inline constexpr size_t kMaxQueryAnswerBytes = 2048;

// One posted send or receive. Owned by the thread that posted it.
class HostTransfer {
 public:
  // Withdraws a transfer that has not completed: a receive's data, when it
  // comes, is discarded; a send that has not completed cannot be taken back
  // from the peer, which expects it, so its connection takes no more sends
  // (the caller breaks the mesh, telling the peer why). Nothing refers to
  // the transfer's memory once the destructor returns.
  ~HostTransfer();
  HostTransfer(const HostTransfer&) = delete;
  HostTransfer& operator=(const HostTransfer&) = delete;

  // Waits until the transfer completed (OK), failed (the transport's
  // failure), or `deadline` passed (DEADLINE_EXCEEDED; the transfer stays
  // posted and may be waited for again).
  absl::Status Wait(absl::Time deadline);
  bool done() const;
  // The bytes sent, or received (at most the receive's capacity), once done.
  uint64_t bytes() const { return bytes_; }
  int rank() const { return rank_; }

 private:
  friend class HostTransport;
  HostTransfer(HostTransport* transport, int rank, int lane, bool send, uint64_t slot, uint8_t* p,
           uint64_t size)
      : transport_(transport), rank_(rank), lane_(lane), send_(send), slot_(slot), p_(p),
        size_(size) {}

  HostTransport* const transport_;
  const int rank_;
  const int lane_;
  const bool send_;
  const uint64_t slot_;
  uint8_t* const p_;
  const uint64_t size_;  // a send's bytes, a receive's capacity
  // Progress, under the connection's read (receive) or write (send) lock.
  uint64_t moved_ = 0;
  uint64_t bytes_ = 0;  // a receive: the sender's count, once known
  // 0 pending, 1 done, 2 failed; set under the transport's done_mu_.
  std::atomic<int> state_{0};
  absl::Status status_;  // under done_mu_
};

class HostTransport {
 public:
  // Connects `hosts.size()` hosts (ranks by position, this host `self`):
  // listens on `bind_host` (an address or name of this host), publishes
  // "<prefix>/addr/<rank>" in `book`, connects and authenticates every
  // connection, all before `deadline`. Errors name the hosts:
  // DEADLINE_EXCEEDED (a host that did not connect in time, or whose
  // address never appeared), UNAVAILABLE (cannot listen, or connect),
  // PERMISSION_DENIED (a host that does not hold the key, or whose
  // certificate does not name it), INVALID_ARGUMENT (a bad rank).
  static absl::StatusOr<std::unique_ptr<HostTransport>> Connect(
      AddressBook& book, const std::string& prefix, const std::vector<std::string>& hosts,
      int self, const std::string& bind_host, TransportSecurity security, absl::Time deadline,
      TransportOptions options = {});
  // Breaks the transport (if it is not broken: "the mesh was closed on
  // host <self>"), lets the BREAKs go out (at most break_flush) and closes
  // every connection. Every transfer must be gone first.
  ~HostTransport();
  HostTransport(const HostTransport&) = delete;
  HostTransport& operator=(const HostTransport&) = delete;

  int self() const { return self_; }
  int size() const { return static_cast<int>(hosts_.size()); }
  int lanes() const { return options_.lanes; }
  const std::string& host(int rank) const { return hosts_[rank]; }

  // Posts a send of [p, p + bytes) to `rank` on `slot` over `lane`. The
  // memory must stay valid until the transfer is done or destroyed.
  // Fails at once when the transport is broken (its failure) or the
  // arguments are bad (INVALID_ARGUMENT).
  absl::StatusOr<std::unique_ptr<HostTransfer>> Send(int rank, int lane, uint64_t slot,
                                                 const void* p, uint64_t bytes);
  // Posts a receive of at most `capacity` bytes into `p` from `rank` on
  // `slot` over `lane`.
  absl::StatusOr<std::unique_ptr<HostTransfer>> Recv(int rank, int lane, uint64_t slot, void* p,
                                                 uint64_t capacity);

  // Breaks the transport for `why` (its first cause stands): every transfer
  // fails with it, every peer is sent a BREAK with its code and message,
  // then the connections shut down. Idempotent; never blocks on the peers.
  void Break(const absl::Status& why);
  // Why the transport broke; OK while it works.
  absl::Status broken() const;

  // Asks `rank` what its members are doing at op `sequence`; the answer
  // comes back through Answers.
  void Query(int rank, int64_t sequence);
  // Waits (until `deadline`) for the answers of `ranks` to the queries for
  // `sequence`: the answers that came, by rank.
  std::map<int, std::string> Answers(const std::vector<int>& ranks, int64_t sequence,
                                     absl::Time deadline);

 private:
  friend class HostTransfer;
  struct Connection;  // host_transport_internal.h
  struct Lane;
  class Acceptor;  // host_transport_connect.cc
  HostTransport(std::vector<std::string> hosts, int self, TransportSecurity security,
                TransportOptions options);

  Connection& conn(int rank, int lane);
  // Connect's dialing side: one authenticated connection per lower rank and
  // lane, into conns_ (the acceptor fills the higher ranks' slots).
  absl::Status ConnectLowerRanks(AddressBook& book, const std::string& prefix,
                                 absl::Time deadline, const std::function<bool()>& cancelled);
  absl::StatusOr<std::unique_ptr<Connection>> ConnectLane(
      int rank, int lane, const std::string& address, absl::Time deadline,
      const std::function<bool()>& cancelled) const;
  absl::StatusOr<std::unique_ptr<HostTransfer>> Post(bool send, int rank, int lane, uint64_t slot,
                                                 uint8_t* p, uint64_t size);
  void Start();  // the I/O threads
  void Loop(Lane& lane);
  // Reads what `c` has (I/O thread, under c's read lock). Returns the
  // failure it met (not OK: the caller breaks the transport with it,
  // outside the locks); the queries that came go to `queries`.
  absl::Status ReadSome(Connection& c, std::vector<int64_t>* queries);
  // ReadSome's steps: the next bytes into where they go; a frame's header
  // checked (and a message's first frame matched to its receive); a whole
  // frame acted on; a READY matched to a send.
  size_t ReadChunk(Connection& c, bool broken, size_t budget, PeerStream::Io* io,
                   std::string* error);
  absl::Status StartFrame(Connection& c);
  absl::Status StartData(Connection& c);
  absl::Status EndFrame(Connection& c, std::vector<int64_t>* queries);
  absl::Status OnReady(Connection& c);
  // Breaks `c`'s read side: what the peer sent cannot be accepted.
  absl::Status ProtocolError(Connection& c, absl::string_view what);
  // Writes what `c` has queued, until the socket takes no more (any thread,
  // under c's write lock).
  absl::Status Flush(Connection& c);
  void BeginDataFrame(Connection& c);     // under c.tx_mu
  void DataWritten(Connection& c, size_t n);  // under c.tx_mu
  void ArmWrite(Connection& c, bool on);
  // Makes the lane's epoll watch what `c` needs (under c.ev_mu).
  void UpdateEvents(Connection& c);
  // Marks `t` done or failed and wakes its waiters.
  void Complete(HostTransfer& t, const absl::Status& status);
  // A peer-caused failure on `c` (its BREAK, its end, what it sent, a write
  // it no longer takes): the connection ends, its transfers fail with why
  // (the peer's BREAK when one is waiting unread, else `failure`); the first
  // such failure is reported (on_break). Takes c's read lock: call it with
  // none of c's locks held.
  void PeerFailed(Connection& c, const absl::Status& failure);
  // Fails `c`'s transfers with `why`, sends the peer a BREAK with it and
  // shuts the connection down.
  void Detach(Connection& c, const absl::Status& why);
  // Why `c` can carry nothing more (the transport broke, or its host
  // failed); OK while it works.
  absl::Status Failed(const Connection& c) const;
  void Withdraw(HostTransfer& t);
  void Wake(Lane& lane);

  const std::vector<std::string> hosts_;
  const int self_;
  const TransportSecurity security_;
  const TransportOptions options_;
  // conns_[rank * lanes + lane]; null for rank == self.
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::atomic<bool> stopping_{false};

  mutable Mutex state_mu_;  // leaf
  absl::Status broken_ ABSL_GUARDED_BY(state_mu_);
  // Why each connection ended (OK while it works; by rank * lanes + lane).
  std::vector<absl::Status> dead_ ABSL_GUARDED_BY(state_mu_);
  absl::Time broken_at_ ABSL_GUARDED_BY(state_mu_) = absl::InfinitePast();
  bool reported_ ABSL_GUARDED_BY(state_mu_) = false;  // on_break called
  std::map<std::pair<int, int64_t>, std::string> answers_ ABSL_GUARDED_BY(state_mu_);
  CondVar answers_cv_;  // an answer came, a connection died, or the mesh broke

  // Leaf: transfers' states (HostTransfer::status_; the analysis cannot
  // name another object's lock there).
  Mutex done_mu_;
  CondVar done_cv_;  // a transfer completed
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_HOST_TRANSPORT_H_
