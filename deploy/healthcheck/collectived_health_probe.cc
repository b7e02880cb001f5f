// collectived_health_probe: a tiny grpc.health.v1.Health/Check client for
// container health checks (Docker HEALTHCHECK, Kubernetes exec probes,
// systemd ExecStartPost), so that images do not need grpcurl.
//
//   collectived_health_probe [--socket=PATH | --addr=TARGET] [--service=NAME]
//                            [--timeout_ms=N] [--quiet]
//
// --socket: the daemon's Unix control socket (default: as the daemon resolves
//   it: $COLLECTIVED_SOCKET, else $XDG_RUNTIME_DIR/collectived/collectived.sock,
//   else /tmp/collectived-<uid>/collectived.sock).
// --addr: any gRPC target instead (e.g. 127.0.0.1:50051 when the daemon runs
//   with --tcp).
// --service: the service to check ("" = the whole daemon; default
//   "collectived.v1.Collective").
//
// Exit status: 0 SERVING, 1 NOT_SERVING/UNKNOWN or the RPC failed, 2 usage.
//
// It uses the generic (ByteBuffer) stub and hand-encodes the two tiny health
// messages, so it needs only libgrpc++ (no generated code, no protobuf).
// Built by deploy/Dockerfile (deploy/healthcheck/CMakeLists.txt); by hand:
//   g++ -std=c++17 -O2 collectived_health_probe.cc $(pkg-config --cflags --libs grpc++)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

namespace {

std::string DefaultSocket() {
  if (const char* env = std::getenv("COLLECTIVED_SOCKET"); env != nullptr && *env != '\0') {
    return env;
  }
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run != nullptr && *run != '\0') {
    return std::string(run) + "/collectived/collectived.sock";
  }
  return "/tmp/collectived-" + std::to_string(getuid()) + "/collectived.sock";
}

// HealthCheckRequest { string service = 1; }
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);  // field 1, length-delimited
  size_t n = service.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  out += service;
  return out;
}

// HealthCheckResponse { ServingStatus status = 1; } -> status, or -1 when the
// bytes do not parse. Unknown fields are skipped.
int DecodeStatus(const std::string& in) {
  int status = 0;  // proto3 default: UNKNOWN
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= in.size()) return false;
      uint8_t b = static_cast<uint8_t>(in[i++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < in.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(&key)) return -1;
    switch (key & 7) {
      case 0:
        if (!varint(&v)) return -1;
        if ((key >> 3) == 1) status = static_cast<int>(v);
        break;
      case 1: i += 8; break;
      case 2:
        if (!varint(&v) || v > in.size() - i) return -1;
        i += v;
        break;
      case 5: i += 4; break;
      default: return -1;
    }
    if (i > in.size()) return -1;
  }
  return status;
}

const char* StatusName(int s) {
  switch (s) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "INVALID";
  }
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--socket=PATH | --addr=TARGET] [--service=NAME] [--timeout_ms=N] "
               "[--quiet]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, addr, service = "collectived.v1.Collective";
  long timeout_ms = 3000;
  bool quiet = false;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto value = [&](const char* prefix, std::string* out) {
      const size_t n = std::strlen(prefix);
      if (arg.compare(0, n, prefix) != 0) return false;
      *out = arg.substr(n);
      return true;
    };
    std::string v;
    if (value("--socket=", &socket) || value("--addr=", &addr) || value("--service=", &service)) {
      continue;
    } else if (value("--timeout_ms=", &v)) {
      timeout_ms = std::atol(v.c_str());
      if (timeout_ms <= 0) return Usage(argv[0]);
    } else if (arg == "--quiet" || arg == "-q") {
      quiet = true;
    } else {
      return Usage(argv[0]);
    }
  }
  if (!socket.empty() && !addr.empty()) return Usage(argv[0]);
  const std::string target = !addr.empty() ? addr : "unix:" + (socket.empty() ? DefaultSocket() : socket);

  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  ctx.set_wait_for_ready(false);

  const std::string req_bytes = EncodeRequest(service);
  grpc::Slice slice(req_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) {
    if (!quiet) std::fprintf(stderr, "%s: health check failed: completion queue error\n", target.c_str());
    return 1;
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    if (!quiet) {
      std::fprintf(stderr, "%s: health check of '%s' failed: code %d: %s\n", target.c_str(),
                   service.c_str(), static_cast<int>(status.error_code()),
                   status.error_message().c_str());
    }
    return 1;
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    if (!quiet) std::fprintf(stderr, "%s: cannot read the health response\n", target.c_str());
    return 1;
  }
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  const int serving = DecodeStatus(bytes);
  if (!quiet) {
    std::printf("%s: service '%s' is %s\n", target.c_str(), service.c_str(), StatusName(serving));
  }
  return serving == 1 ? 0 : 1;
}
