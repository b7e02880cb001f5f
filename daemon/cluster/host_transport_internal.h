// HostTransport's internals shared by its two files: host_transport.cc
// (running: the I/O threads, transfers, breaks, queries) and
// host_transport_connect.cc (connecting a mesh generation's hosts). Not a
// public interface: only those two files include it.

#ifndef COLLECTIVED_DAEMON_CLUSTER_HOST_TRANSPORT_INTERNAL_H_
#define COLLECTIVED_DAEMON_CLUSTER_HOST_TRANSPORT_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/sync.h"
#include "daemon/cluster/host_transport.h"
#include "daemon/cluster/peer_stream.h"

namespace collectived {
namespace host_wire {

// Frames: a 32-byte header, little-endian, then `length` payload bytes.
enum FrameType : uint32_t {
  kReady = 1,   // slot: a receive was posted; total: its capacity
  kData = 2,    // slot; total: the transfer's bytes; offset: where this payload goes
  kBreak = 3,   // slot: the status code; payload: the reason
  kQuery = 4,   // slot: the op sequence asked about
  kAnswer = 5,  // slot: the op sequence; payload: the answer
};
constexpr size_t kFrameHeaderBytes = 32;

struct Frame {
  uint32_t type = 0;
  uint32_t length = 0;
  uint64_t slot = 0;
  uint64_t total = 0;
  uint64_t offset = 0;
};

}  // namespace host_wire

struct HostTransport::Connection {
  int rank = 0;
  int lane = 0;
  std::unique_ptr<PeerStream> stream;
  std::string peer;  // its address, for logs

  // Read side: the lane's I/O thread reads; posting threads add receives.
  // (The functions that run under these locks are HostTransport's, declared
  // where Connection is incomplete: they assert the lock, AssertHeld.)
  Mutex rx_mu;
  // Posted, READY sent; null: withdrawn.
  std::map<uint64_t, std::deque<HostTransfer*>> recvs ABSL_GUARDED_BY(rx_mu);
  char rx_hdr[host_wire::kFrameHeaderBytes] ABSL_GUARDED_BY(rx_mu);
  size_t rx_hdr_got ABSL_GUARDED_BY(rx_mu) = 0;
  bool rx_in_frame ABSL_GUARDED_BY(rx_mu) = false;
  host_wire::Frame rx_frame ABSL_GUARDED_BY(rx_mu);
  uint64_t rx_payload_got ABSL_GUARDED_BY(rx_mu) = 0;
  std::string rx_small ABSL_GUARDED_BY(rx_mu);  // a control frame's payload
  // The data transfer being received (its frames come in order).
  bool rx_active ABSL_GUARDED_BY(rx_mu) = false;
  HostTransfer* rx_target ABSL_GUARDED_BY(rx_mu) = nullptr;  // null while active: discarded
  uint64_t rx_total ABSL_GUARDED_BY(rx_mu) = 0;
  uint64_t rx_next ABSL_GUARDED_BY(rx_mu) = 0;
  std::unique_ptr<char[]> sink;  // set before the I/O threads start, then theirs
  std::atomic<bool> rx_done{false};  // the read side ended (end of stream, or error)
  bool rx_break ABSL_GUARDED_BY(rx_mu) = false;  // it ended with the peer's BREAK

  // What the lane's epoll watches of this connection (UpdateEvents).
  Mutex ev_mu;  // leaf
  bool ev_out ABSL_GUARDED_BY(ev_mu) = false;
  bool ev_registered ABSL_GUARDED_BY(ev_mu) = true;

  // Write side: any thread.
  Mutex tx_mu;
  std::deque<std::string> control ABSL_GUARDED_BY(tx_mu);
  size_t control_sent ABSL_GUARDED_BY(tx_mu) = 0;
  // Posted, no READY yet.
  std::map<uint64_t, std::deque<HostTransfer*>> sends ABSL_GUARDED_BY(tx_mu);
  // READYs (capacities) without a send yet.
  std::map<uint64_t, std::deque<uint64_t>> readies ABSL_GUARDED_BY(tx_mu);
  std::deque<HostTransfer*> outgoing ABSL_GUARDED_BY(tx_mu);  // matched, in order
  // The data frame being written.
  bool tx_in_frame ABSL_GUARDED_BY(tx_mu) = false;
  char tx_hdr[host_wire::kFrameHeaderBytes] ABSL_GUARDED_BY(tx_mu);
  size_t tx_hdr_sent ABSL_GUARDED_BY(tx_mu) = 0;
  const uint8_t* tx_src ABSL_GUARDED_BY(tx_mu) = nullptr;
  uint64_t tx_len ABSL_GUARDED_BY(tx_mu) = 0;
  uint64_t tx_sent ABSL_GUARDED_BY(tx_mu) = 0;
  // Null after Break: tx_copy holds the rest.
  HostTransfer* tx_owner ABSL_GUARDED_BY(tx_mu) = nullptr;
  std::string tx_copy ABSL_GUARDED_BY(tx_mu);
  bool closing ABSL_GUARDED_BY(tx_mu) = false;      // after Break: the BREAK, then shut down
  bool out_of_step ABSL_GUARDED_BY(tx_mu) = false;  // a send was withdrawn: no more sends
  bool shut ABSL_GUARDED_BY(tx_mu) = false;         // the write side is shut down
  bool tx_dead ABSL_GUARDED_BY(tx_mu) = false;      // a write failed
};

struct HostTransport::Lane {
  int index = 0;
  int epoll = -1;
  int wake = -1;
  std::thread thread;
  std::vector<Connection*> conns;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_HOST_TRANSPORT_INTERNAL_H_
