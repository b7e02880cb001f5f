// collectivectl: the operator's view of a running collectived, over the same
// gRPC diagnostics a grpcurl user has (ListSessions, ListMeshes,
// ListPendingOps, GetStats, grpc.health.v1).
//
//   collectivectl [--socket=PATH] [--json] [--timeout-ms=N] COMMAND [ARGS]
//
// Commands:
//   status            the daemon: id, version, uptime, health, counts
//   sessions          one row per client session
//   meshes            one row per mesh (every generation the daemon still has)
//   pending [MESH]    ops waiting for members: who submitted, who did not,
//                     how long they have waited and how long they have left
//                     (MESH: a mesh's id or its name, as `meshes` shows them)
//   stats             ops and bytes per op kind, buffers per device
//   watch [--interval-ms=N] [--count=N]
//                     refreshes every interval: ops/s, bytes/s and failures/s
//                     since the last look, sessions, meshes, pending ops
//                     (--count: stop after N refreshes; default: until Ctrl-C)
//   health            exit 0 when the daemon reports SERVING, 1 otherwise
//
// The socket is found as the SDK finds it: --socket, else $COLLECTIVED_SOCKET,
// else $XDG_RUNTIME_DIR/collectived/collectived.sock, else
// /tmp/collectived-<uid>/collectived.sock. Human tables by default; --json
// prints the daemon's answer as JSON (one object per line for watch).
//
// Exit status: 0; 1 for an unhealthy daemon (health) or a failed call;
// 2 for bad usage; 3 when no daemon answers on the socket.
#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "common/socket_path.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace collectived {
namespace {

constexpr int kCallFailed = 1;
constexpr int kUsage = 2;
constexpr int kNoDaemon = 3;

constexpr char kHelp[] =
    "usage: collectivectl [--socket=PATH] [--json] [--timeout-ms=N] COMMAND [ARGS]\n"
    "commands:\n"
    "  status                 the daemon: id, version, uptime, health, counts\n"
    "  sessions               client sessions\n"
    "  meshes                 meshes and their members\n"
    "  pending [MESH]         ops waiting for members (who has and has not submitted);\n"
    "                         MESH: a mesh's id or name, as `meshes` shows them\n"
    "  stats                  ops and bytes per op kind, buffers per device\n"
    "  watch [--interval-ms=N] [--count=N]\n"
    "                         ops/s, bytes/s, failures/s, sessions, meshes, pending\n"
    "  health                 exit 0 when SERVING, 1 otherwise\n";

struct Options {
  std::string socket;
  bool json = false;
  int64_t timeout_ms = 3000;
  int64_t interval_ms = 1000;
  int64_t count = 0;  // watch: 0 = forever
  std::string command;
  std::vector<std::string> args;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "collectivectl: %s\n%s", why.c_str(), kHelp);
  std::exit(kUsage);
}

bool Flag(absl::string_view arg, absl::string_view name, std::string* value) {
  const std::string prefix = absl::StrCat("--", name, "=");
  if (!absl::StartsWith(arg, prefix)) return false;
  *value = std::string(arg.substr(prefix.size()));
  return true;
}

int64_t PositiveInt(absl::string_view name, const std::string& value) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v <= 0) {
    Usage(absl::StrCat("--", name, " wants a positive integer, got '", value, "'"));
  }
  return v;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    std::string value;
    if (arg == "-h" || arg == "--help" || arg == "help") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    } else if (arg == "--json") {
      o.json = true;
    } else if (Flag(arg, "socket", &value)) {
      o.socket = value;
    } else if (Flag(arg, "timeout-ms", &value)) {
      o.timeout_ms = PositiveInt("timeout-ms", value);
    } else if (Flag(arg, "interval-ms", &value)) {
      o.interval_ms = PositiveInt("interval-ms", value);
    } else if (Flag(arg, "count", &value)) {
      o.count = PositiveInt("count", value);
    } else if (absl::StartsWith(arg, "-")) {
      Usage(absl::StrCat("unknown flag ", arg));
    } else if (o.command.empty()) {
      o.command = std::string(arg);
    } else {
      o.args.emplace_back(arg);
    }
  }
  if (o.command.empty()) Usage("no command given");
  static const char* const kCommands[] = {"status", "sessions", "meshes", "pending",
                                          "stats",  "watch",    "health"};
  if (std::find(std::begin(kCommands), std::end(kCommands), o.command) == std::end(kCommands)) {
    Usage(absl::StrCat("unknown command '", o.command, "'"));
  }
  const size_t max_args = o.command == "pending" ? 1 : 0;
  if (o.args.size() > max_args) {
    Usage(absl::StrCat("'", o.command, "' takes ", max_args == 0 ? "no" : "at most one",
                       " argument"));
  }
  return o;
}

// A table printed with columns as wide as their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print() const {
    std::vector<size_t> width;
    for (const auto& r : rows_) {
      if (width.size() < r.size()) width.resize(r.size(), 0);
      for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    }
    for (const auto& r : rows_) {
      std::string line;
      for (size_t c = 0; c < r.size(); ++c) {
        absl::StrAppend(&line, r[c]);
        if (c + 1 < r.size()) line.append(width[c] - r[c].size() + 2, ' ');
      }
      std::printf("%s\n", line.c_str());
    }
    if (rows_.size() == 1) std::printf("(none)\n");
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string Bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string Duration(int64_t ms) {
  return absl::FormatDuration(absl::Milliseconds(ms < 0 ? 0 : ms));
}

std::string Ints(const google::protobuf::RepeatedField<int32_t>& v) {
  return v.empty() ? "-" : absl::StrJoin(v, ",");
}

class Ctl {
 public:
  explicit Ctl(Options o) : o_(std::move(o)) {
    socket_ = ResolveSocketPath(o_.socket);
    auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    stub_ = v1::Collective::NewStub(channel);
    health_ = grpc::health::v1::Health::NewStub(channel);
  }

  int Run() {
    if (o_.command == "health") return Health();
    if (o_.command == "status") return Status();
    if (o_.command == "sessions") return Sessions();
    if (o_.command == "meshes") return Meshes();
    if (o_.command == "pending") return Pending(o_.args.empty() ? "" : o_.args[0]);
    if (o_.command == "stats") return Stats();
    return Watch();
  }

 private:
  // The call's deadline.
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(o_.timeout_ms));
  }

  // Prints why a call failed; the exit status for it.
  int Failed(absl::string_view what, const grpc::Status& st) const {
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
        st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::fprintf(stderr,
                   "collectivectl: no daemon answers on %s (%s: %s). Start collectived, or "
                   "point --socket or $COLLECTIVED_SOCKET at its socket.\n",
                   socket_.c_str(), std::string(what).c_str(), st.error_message().c_str());
      return kNoDaemon;
    }
    std::fprintf(stderr, "collectivectl: %s failed: %s: %s\n", std::string(what).c_str(),
                 absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())).c_str(),
                 st.error_message().c_str());
    return kCallFailed;
  }

  void PrintJson(const google::protobuf::Message& m) const {
    std::string out;
    google::protobuf::util::JsonPrintOptions opts;
    opts.always_print_primitive_fields = true;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
    std::printf("%s\n", out.c_str());
  }

  // One diagnostics call with the deadline.
  template <typename Request, typename Response>
  grpc::Status Ask(grpc::Status (v1::Collective::Stub::*rpc)(grpc::ClientContext*,
                                                            const Request&, Response*),
                   const Request& req, Response* resp) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return (stub_.get()->*rpc)(&ctx, req, resp);
  }
  grpc::Status GetStats(v1::GetStatsResponse* r) {
    return Ask(&v1::Collective::Stub::GetStats, v1::GetStatsRequest(), r);
  }

  // grpc.health.v1.Health/Check of the whole daemon, with the deadline.
  grpc::Status CheckHealth(grpc::health::v1::HealthCheckResponse* r) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return health_->Check(&ctx, grpc::health::v1::HealthCheckRequest(), r);
  }

  int Health() {
    grpc::health::v1::HealthCheckResponse r;
    const grpc::Status st = CheckHealth(&r);
    if (!st.ok()) return Failed("Health/Check", st);
    if (o_.json) {
      PrintJson(r);
    } else {
      std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(r.status()).c_str());
    }
    return r.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }

  int Status() {
    v1::GetStatsResponse s;
    if (grpc::Status st = GetStats(&s); !st.ok()) return Failed("GetStats", st);
    if (o_.json) {
      PrintJson(s);
      return 0;
    }
    grpc::health::v1::HealthCheckResponse h;
    const grpc::Status hs = CheckHealth(&h);
    Table t({"field", "value"});
    t.Add({"socket", socket_});
    t.Add({"daemon", s.daemon_id()});
    t.Add({"version", s.version()});
    t.Add({"uptime", Duration(s.uptime_ms())});
    t.Add({"health", hs.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(h.status())
                             : absl::StrCat("unknown (", hs.error_message(), ")")});
    t.Add({"sessions", absl::StrCat(s.sessions())});
    t.Add({"meshes", absl::StrCat(s.meshes())});
    t.Add({"buffers", absl::StrCat(s.buffers(), " (", Bytes(s.buffer_bytes()), ")")});
    t.Add({"ops completed", absl::StrCat(s.ops_completed())});
    t.Add({"ops failed", absl::StrCat(s.ops_failed())});
    t.Add({"member-side ops", absl::StrCat(s.member_side_ops(), " (reported by the members)")});
    t.Add({"submitted by path",
           absl::StrCat("fast path ", s.submitted_fast_path(), ", Execute stream ",
                        s.submitted_execute(), ", Submit RPC ", s.submitted_unary())});
    t.Add({"executor threads", absl::StrCat(s.executor_threads())});
    if (s.has_cluster()) {
      const v1::ClusterStats& c = s.cluster();
      std::string cluster = absl::StrCat(c.state(), ", host ", c.host_id());
      if (c.serves_coordinator()) absl::StrAppend(&cluster, ", serves the coordinator");
      if (!c.coordinator().empty()) absl::StrAppend(&cluster, ", coordinator ", c.coordinator());
      t.Add({"cluster", cluster});
      if (!c.last_error().empty()) t.Add({"cluster error", c.last_error()});
      t.Add({"meshes across hosts", absl::StrCat(c.meshes_across_hosts())});
      t.Add({"ops across hosts", absl::StrCat(c.ops_across_hosts(), " completed, ",
                                              c.ops_across_hosts_failed(), " failed")});
    }
    t.Print();
    return 0;
  }

  int Sessions() {
    v1::ListSessionsResponse r;
    if (grpc::Status st = Ask(&v1::Collective::Stub::ListSessions, v1::ListSessionsRequest(), &r);
        !st.ok()) {
      return Failed("ListSessions", st);
    }
    if (o_.json) {
      PrintJson(r);
      return 0;
    }
    Table t({"session", "client", "pid", "uid", "attached", "buffers", "bytes", "meshes", "ops"});
    for (const auto& s : r.sessions()) {
      t.Add({s.session_id(), s.client_name().empty() ? "-" : s.client_name(),
             absl::StrCat(s.pid()), absl::StrCat(s.uid()), s.attached() ? "yes" : "no",
             absl::StrCat(s.buffers()), Bytes(s.buffer_bytes()),
             absl::StrCat(s.mesh_ids_size()), absl::StrCat(s.ops_submitted())});
    }
    t.Print();
    return 0;
  }

  int Meshes() {
    v1::ListMeshesResponse r;
    if (grpc::Status st = Ask(&v1::Collective::Stub::ListMeshes, v1::ListMeshesRequest(), &r);
        !st.ok()) {
      return Failed("ListMeshes", st);
    }
    if (o_.json) {
      PrintJson(r);
      return 0;
    }
    Table t({"mesh", "scope", "id", "axes", "gen", "state", "members", "ops done", "member-side",
             "op timeout"});
    for (const auto& m : r.meshes()) {
      std::vector<std::string> axes, members;
      for (const auto& a : m.axes()) axes.push_back(absl::StrCat(a.name(), "=", a.size()));
      for (const auto& mem : m.members()) {
        members.push_back(mem.pid() > 0 ? absl::StrCat(mem.index(), ":", mem.pid())
                                        : absl::StrCat(mem.index(), ":-"));
      }
      t.Add({m.name(), m.scope().empty() ? "-" : m.scope(), m.mesh_id(),
             absl::StrJoin(axes, ","), absl::StrCat(m.generation()), m.state(),
             members.empty() ? "-" : absl::StrJoin(members, " "),
             absl::StrCat(m.completed_ops()),
             m.member_op_bytes() > 0 ? absl::StrCat(m.member_side_ops()) : "off",
             Duration(m.op_timeout_ms())});
    }
    t.Print();
    return 0;
  }

  // `mesh`: empty (every mesh), a mesh's id, or its name as `meshes` shows
  // it (every generation the daemon has of that name).
  int Pending(const std::string& mesh) {
    v1::ListPendingOpsRequest req;
    std::set<std::string> named;  // ids of the meshes called `mesh`
    if (!mesh.empty()) {
      v1::ListMeshesResponse meshes;
      if (grpc::Status st =
              Ask(&v1::Collective::Stub::ListMeshes, v1::ListMeshesRequest(), &meshes);
          !st.ok()) {
        return Failed("ListMeshes", st);
      }
      bool is_id = false;
      for (const auto& m : meshes.meshes()) {
        is_id |= m.mesh_id() == mesh;
        if (m.name() == mesh) named.insert(m.mesh_id());
      }
      if (is_id) {
        req.set_mesh_id(mesh);
        named.clear();
      } else if (named.empty()) {
        std::fprintf(stderr,
                     "collectivectl: no mesh has the id or name '%s' (`collectivectl meshes` "
                     "lists them)\n",
                     mesh.c_str());
        return kCallFailed;
      }
    }
    v1::ListPendingOpsResponse r;
    if (grpc::Status st = Ask(&v1::Collective::Stub::ListPendingOps, req, &r); !st.ok()) {
      return Failed("ListPendingOps", st);
    }
    if (!named.empty()) {  // by name: that name's meshes only
      auto* ops = r.mutable_ops();
      for (int i = ops->size() - 1; i >= 0; --i) {
        if (named.count(ops->Get(i).mesh_id()) == 0) ops->DeleteSubrange(i, 1);
      }
    }
    if (o_.json) {
      PrintJson(r);
      return 0;
    }
    Table t({"mesh", "seq", "op", "state", "waiting", "left", "submitted", "missing"});
    for (const auto& p : r.ops()) {
      std::string missing = Ints(p.missing());
      if (p.elsewhere_size() > 0) {
        // A mesh across hosts: those members' hosts list them.
        absl::StrAppend(&missing, " (on other hosts: ", Ints(p.elsewhere()), ")");
      }
      // A member-side op has no daemon sequence: its place among the
      // mesh's member-side ops instead.
      t.Add({p.mesh_name(),
             p.member_side() ? absl::StrCat("m", p.member_op()) : absl::StrCat(p.sequence()),
             p.description(), p.member_side() ? p.state() + " (member-side)" : p.state(),
             Duration(p.age_ms()), Duration(p.deadline_ms()), Ints(p.submitted()), missing});
    }
    t.Print();
    return 0;
  }

  int Stats() {
    v1::GetStatsResponse s;
    if (grpc::Status st = GetStats(&s); !st.ok()) return Failed("GetStats", st);
    if (o_.json) {
      PrintJson(s);
      return 0;
    }
    Table t({"op", "completed", "failed", "bytes", "read", "written", "required"});
    for (const auto& k : s.by_kind()) {
      t.Add({k.kind(), absl::StrCat(k.completed()), absl::StrCat(k.failed()),
             Bytes(k.bytes()), Bytes(k.bytes_read()), Bytes(k.bytes_written()),
             Bytes(k.bytes_required())});
    }
    t.Print();
    std::printf("\n");
    Table d({"device", "kind", "buffers", "bytes"});
    for (const auto& b : s.buffers_by_device()) {
      d.Add({b.device(), b.kind(), absl::StrCat(b.buffers()), Bytes(b.buffer_bytes())});
    }
    d.Print();
    return 0;
  }

  int Watch() {
    const bool tty = isatty(STDOUT_FILENO) != 0 && !o_.json;
    v1::GetStatsResponse last;
    absl::Time last_at;
    for (int64_t n = 0; o_.count == 0 || n < o_.count; ++n) {
      if (n > 0) absl::SleepFor(absl::Milliseconds(o_.interval_ms));
      v1::GetStatsResponse s;
      if (grpc::Status st = GetStats(&s); !st.ok()) return Failed("GetStats", st);
      const absl::Time now = absl::Now();
      v1::ListPendingOpsResponse pending;
      if (grpc::Status st =
              Ask(&v1::Collective::Stub::ListPendingOps, v1::ListPendingOpsRequest(), &pending);
          !st.ok()) {
        return Failed("ListPendingOps", st);
      }
      int64_t bytes = 0, last_bytes = 0;
      for (const auto& k : s.by_kind()) bytes += k.bytes();
      for (const auto& k : last.by_kind()) last_bytes += k.bytes();
      const double secs = n == 0 ? 0 : absl::ToDoubleSeconds(now - last_at);
      auto rate = [&](int64_t now_v, int64_t then_v) {
        return secs > 0 ? static_cast<double>(now_v - then_v) / secs : 0.0;
      };
      const double ops = rate(s.ops_completed(), last.ops_completed());
      const double failures = rate(s.ops_failed(), last.ops_failed());
      const double bps = rate(bytes, last_bytes);
      if (o_.json) {
        std::printf(
            "{\"ops_per_s\": %.1f, \"bytes_per_s\": %.0f, \"failures_per_s\": %.1f, "
            "\"sessions\": %d, \"meshes\": %d, \"pending_ops\": %d, \"ops_completed\": %lld, "
            "\"ops_failed\": %lld}\n",
            ops, bps, failures, s.sessions(), s.meshes(), pending.ops_size(),
            static_cast<long long>(s.ops_completed()), static_cast<long long>(s.ops_failed()));
      } else {
        if (tty) std::printf("\033[H\033[2J");
        std::printf("%s  %s  up %s\n", s.daemon_id().c_str(), socket_.c_str(),
                    Duration(s.uptime_ms()).c_str());
        Table t({"ops/s", "bytes/s", "failures/s", "sessions", "meshes", "pending", "ops done",
                 "ops failed"});
        t.Add({absl::StrFormat("%.1f", ops), absl::StrCat(Bytes(static_cast<int64_t>(bps))),
               absl::StrFormat("%.1f", failures), absl::StrCat(s.sessions()),
               absl::StrCat(s.meshes()), absl::StrCat(pending.ops_size()),
               absl::StrCat(s.ops_completed()), absl::StrCat(s.ops_failed())});
        t.Print();
        if (!tty) std::printf("\n");
      }
      std::fflush(stdout);
      last = s;
      last_at = now;
    }
    return 0;
  }

  const Options o_;
  std::string socket_;
  std::unique_ptr<v1::Collective::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  collectived::Options o = collectived::Parse(argc, argv);
  return collectived::Ctl(std::move(o)).Run();
}
