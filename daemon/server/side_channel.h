// SideChannel: the Unix SOCK_SEQPACKET socket that carries file descriptors.
//
// gRPC cannot pass descriptors, so a client opens one side connection per
// session and speaks a tiny text protocol on it (one request per packet):
//   "ATTACH <session_id> <attach_token>"  ->  "OK"            (once, first)
//   "FD <buffer_id>"                      ->  "OK <size>" + the descriptor
//   "QUEUE"                               ->  "OK <size> <version>" + the
//                                             descriptor of the session's
//                                             fast-path queue (at most once)
//   "SEGMENT", "EXPIRED", "PEERFD"        ->  member-side ops
//                                             (common/side_protocol.h)
// Errors answer "ERR <grpc code number> <message>". The peer's credentials
// come from SO_PEERCRED. When the connection closes (the process exited or
// crashed) the session closes at once: that is how member death is noticed.
//
// Any local process that may open the socket can connect, so connections are
// untrusted until they attach: a packet that carries descriptors, is
// oversized or cannot be read closes its connection (descriptors never enter
// the daemon's table); a connection that has not attached within
// `attach_timeout` is closed; at most `max_unattached` connections wait to
// attach (more stay in the listen backlog), and at most
// `max_unattached_per_uid` of one uid (more are refused). A connection that
// would take the daemon past its descriptor budget (FdAdmitted) is refused
// with RESOURCE_EXHAUSTED.
//
// Thread model: one thread runs an epoll loop over the listener and all
// connections; Start/Stop are called from the main thread.
#ifndef COLLECTIVED_DAEMON_SERVER_SIDE_CHANNEL_H_
#define COLLECTIVED_DAEMON_SERVER_SIDE_CHANNEL_H_

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/core/engine.h"
#include "daemon/server/fast_path.h"

namespace collectived {

struct SideChannelOptions {
  int mode = 0660;  // permissions of the socket file
  int gid = -1;     // group of the socket file (-1: the daemon's)
  absl::Duration attach_timeout = absl::Seconds(10);
  int max_unattached = 512;
  int max_unattached_per_uid = 128;
};

class SideChannel {
 public:
  // `fast_path` (may be null: no fast path) serves the QUEUE request.
  SideChannel(Engine* engine, FastPath* fast_path, SideChannelOptions options = {})
      : engine_(engine), fast_path_(fast_path), options_(options) {}
  ~SideChannel() { Stop(); }
  SideChannel(const SideChannel&) = delete;
  SideChannel& operator=(const SideChannel&) = delete;

  // Binds `path` (replacing a stale socket file; see ListenUnix) and starts
  // the loop thread.
  absl::Status Start(const std::string& path);
  // Stops the loop and closes every connection (sessions are left to the
  // engine's shutdown). Idempotent.
  void Stop();

 private:
  struct Conn {
    std::string session_id;  // empty until attached
    int pid = 0;
    int uid = -1;
    absl::Time attach_deadline;  // while unattached
  };
  void Loop();
  // Accepts what the limits allow from the listen backlog.
  void AcceptAll();
  // Closes unattached connections past their deadline; returns the time
  // until the next deadline (infinite if none).
  absl::Duration ExpireUnattached();
  // Takes a connection of `uid` out of the unattached counts (it attached
  // or closed).
  void NoLongerUnattached(int uid);
  // Watches the listener for new connections only while below
  // max_unattached.
  void UpdateListening();
  void HandleRequest(int fd, Conn& conn, const std::string& request);
  void CloseConn(int fd);
  // Sends a reply without blocking; on failure the connection is closed after
  // this round of events. Returns whether it was sent.
  bool Reply(int fd, const std::string& data, int pass_fd = -1);
  // "PEERFD <mesh id> <member> <buffer id>" (common/side_protocol.h).
  void HandlePeerFd(int fd, const Conn& conn, const std::vector<std::string>& words);

  Engine* const engine_;
  FastPath* const fast_path_;
  const SideChannelOptions options_;
  std::string path_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  // Loop thread only:
  std::map<int, Conn> conns_;
  std::vector<int> doomed_;           // connections to close
  int unattached_ = 0;                // conns_ without a session
  std::map<int, int> unattached_by_uid_;
  bool listening_ = false;            // listener registered with epoll
  absl::Time next_refusal_log_;       // refusals are logged at most once a second
  int refusals_unlogged_ = 0;
  std::thread thread_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_SIDE_CHANNEL_H_
