// GrpcUnixListener: accepts the gRPC Unix socket's connections itself and
// hands each to the gRPC server (grpc::AddInsecureChannelFromFd).
//
// gRPC's own listener gives up for good when accept() fails with EMFILE, so a
// local process that exhausts the daemon's descriptors would lock every later
// client out. This listener instead refuses (closes at once) a connection
// that would take the daemon past its descriptor budget (FdAdmitted), backs
// off on EMFILE/ENFILE, and serves again as soon as descriptors are free.
//
// Thread model: one thread accepts; Start/Stop are called from the main
// thread, Stop before the server shuts down.
#ifndef COLLECTIVED_DAEMON_SERVER_GRPC_LISTENER_H_
#define COLLECTIVED_DAEMON_SERVER_GRPC_LISTENER_H_

#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace collectived {

class GrpcUnixListener {
 public:
  GrpcUnixListener() = default;
  ~GrpcUnixListener() { Stop(); }
  GrpcUnixListener(const GrpcUnixListener&) = delete;
  GrpcUnixListener& operator=(const GrpcUnixListener&) = delete;

  // Binds `path` (see ListenUnix for mode, group and a stale socket file).
  // Nothing is accepted before Start.
  absl::Status Bind(const std::string& path, int mode, int gid);
  // Starts accepting for `server`, which must outlive Stop.
  void Start(grpc::Server* server);
  // Stops accepting, closes the listener and removes the socket file.
  // Connections already handed over stay with the server. Idempotent.
  void Stop();

 private:
  void Loop(grpc::Server* server);

  std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;
  std::thread thread_;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_GRPC_LISTENER_H_
