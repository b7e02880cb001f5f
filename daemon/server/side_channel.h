// SideChannel: the Unix SOCK_SEQPACKET socket that carries file descriptors.
//
// gRPC cannot pass descriptors, so a client opens one side connection per
// session and speaks a tiny text protocol on it (one request per packet):
//   "ATTACH <session_id> <attach_token>"  ->  "OK"            (once, first)
//   "FD <buffer_id>"                      ->  "OK <size>" + the descriptor
//   "QUEUE"                               ->  "OK <size> <version>" + the
//                                             descriptor of the session's
//                                             fast-path queue (at most once)
// Errors answer "ERR <grpc code number> <message>". The peer's credentials
// come from SO_PEERCRED. When the connection closes (the process exited or
// crashed) the session closes at once: that is how member death is noticed.
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
#include "daemon/core/engine.h"
#include "daemon/server/fast_path.h"

namespace collectived {

class SideChannel {
 public:
  // `fast_path` (may be null: no fast path) serves the QUEUE request.
  SideChannel(Engine* engine, FastPath* fast_path) : engine_(engine), fast_path_(fast_path) {}
  ~SideChannel() { Stop(); }
  SideChannel(const SideChannel&) = delete;
  SideChannel& operator=(const SideChannel&) = delete;

  // Binds `path` (replacing a stale socket file) with permissions `mode` and
  // starts the loop thread.
  absl::Status Start(const std::string& path, int mode);
  // Stops the loop and closes every connection (sessions are left to the
  // engine's shutdown). Idempotent.
  void Stop();

 private:
  struct Conn {
    std::string session_id;  // empty until attached
    int pid = 0;
    int uid = -1;
  };
  void Loop();
  void HandleRequest(int fd, Conn& conn, const std::string& request);
  void CloseConn(int fd);
  // Sends a reply without blocking; on failure the connection is closed after
  // this round of events. Returns whether it was sent.
  bool Reply(int fd, const std::string& data, int pass_fd = -1);

  Engine* const engine_;
  FastPath* const fast_path_;
  std::string path_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::map<int, Conn> conns_;  // loop thread only
  std::vector<int> doomed_;    // loop thread only: connections to close
  std::thread thread_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_SIDE_CHANNEL_H_
