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
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  std::mutex rx_mu;
  std::map<uint64_t, std::deque<HostTransfer*>> recvs;  // posted, READY sent; null: withdrawn
  char rx_hdr[host_wire::kFrameHeaderBytes];
  size_t rx_hdr_got = 0;
  bool rx_in_frame = false;
  host_wire::Frame rx_frame;
  uint64_t rx_payload_got = 0;
  std::string rx_small;  // a control frame's payload
  // The data transfer being received (its frames come in order).
  bool rx_active = false;
  HostTransfer* rx_target = nullptr;  // null while active: discarded
  uint64_t rx_total = 0;
  uint64_t rx_next = 0;
  std::unique_ptr<char[]> sink;
  std::atomic<bool> rx_done{false};  // the read side ended (end of stream, or error)

  // What the lane's epoll watches of this connection (UpdateEvents).
  std::mutex ev_mu;  // leaf
  bool ev_out = false;
  bool ev_registered = true;

  // Write side: any thread, under tx_mu.
  std::mutex tx_mu;
  std::deque<std::string> control;
  size_t control_sent = 0;
  std::map<uint64_t, std::deque<HostTransfer*>> sends;    // posted, no READY yet
  std::map<uint64_t, std::deque<uint64_t>> readies;   // READYs (capacities) without a send yet
  std::deque<HostTransfer*> outgoing;                     // matched, in order
  // The data frame being written.
  bool tx_in_frame = false;
  char tx_hdr[host_wire::kFrameHeaderBytes];
  size_t tx_hdr_sent = 0;
  const uint8_t* tx_src = nullptr;
  uint64_t tx_len = 0;
  uint64_t tx_sent = 0;
  HostTransfer* tx_owner = nullptr;  // null after Break: tx_copy holds the rest
  std::string tx_copy;
  bool closing = false;    // after Break: the BREAK, then shut down
  bool out_of_step = false;  // a send was withdrawn: no more sends
  bool shut = false;       // the write side is shut down
  bool tx_dead = false;    // a write failed
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
