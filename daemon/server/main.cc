// collectived: the per-host collective-communication daemon.
#include <grp.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <climits>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fd_limit.h"
#include "common/socket_path.h"
#include "common/status_util.h"
#include "common/unix_socket.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_split.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/cluster_rendezvous.h"
#include "daemon/cluster/etcd_cluster.h"
#include "daemon/cluster/peer_stream.h"
#include "daemon/cluster/coordinator_service.h"
#include "daemon/cluster/in_memory_coordinator.h"
#include "daemon/core/engine.h"
#include "exec/cpu_executor.h"
#include "daemon/server/backends.h"
#include "daemon/server/health.h"
#include "daemon/server/metrics.h"
#include "daemon/server/service.h"
#include "daemon/server/fast_path.h"
#include "daemon/server/grpc_listener.h"
#include "daemon/server/side_channel.h"
#include "daemon/util/log.h"

ABSL_FLAG(std::string, socket, "",
          "Unix socket path for the gRPC control plane (default: $COLLECTIVED_SOCKET, else "
          "$XDG_RUNTIME_DIR/collectived/collectived.sock, else /tmp/collectived-<uid>/collectived.sock). "
          "The descriptor side socket is <socket>.fds.");
ABSL_FLAG(std::string, tcp, "",
          "Also listen for gRPC on this TCP address (e.g. 127.0.0.1:50051); off when empty. "
          "Plaintext is allowed on loopback only; other addresses need --tls-cert/--tls-key "
          "(or --tcp-insecure).");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for the TCP listener (enables TLS).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: when set, TCP clients must present a certificate it signs (mTLS).");
ABSL_FLAG(bool, tcp_insecure, false,
          "Allow a plaintext TCP listener on a non-loopback address (not recommended).");
ABSL_FLAG(std::string, socket_mode, "0660", "Permissions (octal) of the Unix sockets.");
ABSL_FLAG(std::string, socket_group, "",
          "Group (name or number) that owns the Unix sockets, so that its members may "
          "connect with --socket-mode=0660 (default: the daemon's group).");
ABSL_FLAG(std::string, metrics, "",
          "HOST:PORT to serve Prometheus metrics on (/metrics over HTTP, e.g. "
          "127.0.0.1:9464); empty: no metrics.");
ABSL_FLAG(std::string, log_level, "info", "Lowest log level printed: debug, info, warn, error.");
ABSL_FLAG(int, threads, 0, "Executor threads (0: one per CPU).");
ABSL_FLAG(int64_t, chunk_bytes, 256 * 1024, "Bytes per executor work item.");
ABSL_FLAG(int64_t, inline_op_bytes, 16 * 1024 * 1024,
          "Ops touching at most this many bytes (all members' inputs and outputs) run on "
          "the thread that completes them instead of a runner thread.");
ABSL_FLAG(int64_t, member_op_bytes, 64 * 1024,
          "Member-side small ops: the members of a mesh of this host run ops whose input "
          "is at most this many bytes among themselves, through a segment the daemon "
          "shares with them (0: every op goes through the daemon).");
ABSL_FLAG(int64_t, member_segment_total_bytes, int64_t{1} << 30,
          "The most bytes the member-side segments of all meshes take together; a mesh "
          "that forms past it gets none and runs every op through the daemon.");
ABSL_FLAG(bool, fast_path, true,
          "Serve the shared-memory op queues (the SDK's default path); gRPC Execute "
          "works either way.");
ABSL_FLAG(int64_t, fast_path_spin_us, 200,
          "Microseconds a fast-path queue thread polls for the next op before sleeping "
          "on its futex (0: sleep at once); only while one of the daemon's CPUs is free "
          "(not taken by members running member-side ops, nor by other polling threads).");
ABSL_FLAG(int64_t, join_timeout_ms, 60000, "Default deadline for a mesh to fill.");
ABSL_FLAG(int64_t, op_timeout_ms, 60000,
          "Default deadline for every member to submit an op, from the first submission.");
ABSL_FLAG(int64_t, token_hold_ms, 60000,
          "A mesh name's join token binds its next generations while any mesh of the name "
          "exists and for this long after the last one is gone.");
ABSL_FLAG(int64_t, attach_timeout_ms, 10000,
          "A session whose side socket is not attached within this time is closed.");
ABSL_FLAG(int, max_unattached_connections, 512,
          "Most side-socket connections waiting to attach a session at once (more wait in "
          "the listen backlog).");
ABSL_FLAG(int, max_unattached_connections_per_uid, 128,
          "Most side-socket connections of one uid waiting to attach at once (more are "
          "refused).");
ABSL_FLAG(int, fd_reserve, 64,
          "Descriptors kept free for the daemon itself: connections and buffers that would "
          "use them are refused (RESOURCE_EXHAUSTED). The soft RLIMIT_NOFILE is raised to "
          "the hard limit at start.");
ABSL_FLAG(int, max_sessions, 1024, "Most sessions at once.");
ABSL_FLAG(int, max_meshes, 1024, "Most meshes at once.");
ABSL_FLAG(int, max_buffers_per_session, 4096, "Most buffers one session may hold.");
ABSL_FLAG(int64_t, max_buffer_bytes_per_session, int64_t{64} << 30,
          "Most host-memory buffer bytes one session may hold.");
ABSL_FLAG(int64_t, max_gpu_buffer_bytes_per_session, int64_t{64} << 30,
          "Most GPU-memory buffer bytes one session may hold (all GPUs together; counted "
          "apart from host memory).");
ABSL_FLAG(int64_t, max_buffer_bytes, int64_t{16} << 30, "Largest single buffer.");
ABSL_FLAG(bool, coordinator, false,
          "Serve the cluster coordinator (collectived.v1.Cluster: membership and the "
          "rendezvous key-value store) on the --tcp listener; this daemon joins it too.");
ABSL_FLAG(std::string, cluster, "",
          "Join the cluster of the coordinator at ADDR[,ADDR] (tried in order), or the "
          "cluster kept in etcd at etcd://HOST:PORT[,HOST:PORT...] (etcds:// for TLS; no "
          "daemon is then the coordinator). Needs --tcp, whose address is advertised to the "
          "other hosts (see --cluster-advertise).");
ABSL_FLAG(std::string, etcd_prefix, "/collectived/",
          "With --cluster=etcd://...: the prefix of every key the cluster keeps in etcd "
          "(clusters sharing an etcd need different ones); ends with '/'.");
ABSL_FLAG(std::string, etcd_user, "",
          "With --cluster=etcd://...: the etcd user (etcd authentication); its password is "
          "in --etcd-password-file.");
ABSL_FLAG(std::string, etcd_password_file, "",
          "File holding the password of --etcd-user (surrounding whitespace stripped). "
          "Never logged.");
ABSL_FLAG(std::string, etcd_ca, "",
          "With --cluster=etcds://...: PEM CA bundle that signs etcd's server certificates "
          "(default: --tls-client-ca). --tls-cert/--tls-key, when given, are the client "
          "certificate etcd sees.");
ABSL_FLAG(std::string, host_id, "",
          "This daemon's host id in the cluster, [A-Za-z0-9._-]{1,64} (default: the host name).");
ABSL_FLAG(std::string, cluster_advertise, "",
          "Address advertised to the cluster (default: the --tcp address with its bound port; "
          "the host name for a wildcard address).");
ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the cluster join token (surrounding whitespace stripped): the "
          "coordinator requires it of every call, members send it. Required by --coordinator "
          "on a non-loopback address. Never logged.");
ABSL_FLAG(bool, cluster_plaintext, false,
          "Allow plaintext to a non-loopback coordinator (without --tls-cert). Loopback "
          "coordinators are reached in plaintext anyway when TLS is not configured.");
ABSL_FLAG(int64_t, cluster_replicate_bytes, 64 * 1024,
          "Meshes across hosts: reductions whose input is smaller than this are replicated "
          "(each host gets every input it lacks and reduces them all: one exchange) instead "
          "of cut into lanes or chained (two exchanges or more); at least 0. Every daemon of "
          "a cluster must use the same value.");
ABSL_FLAG(int64_t, cluster_chunk_bytes, int64_t{4} << 20,
          "Meshes across hosts: the chunk in which a reduction's running result travels "
          "between hosts (smaller chunks overlap the hosts' work more, each costs a round "
          "trip); at least 4096.");
ABSL_FLAG(int64_t, cluster_lease_ms, 10000,
          "With --coordinator: a host that does not heartbeat for this long leaves the "
          "cluster (members heartbeat every third of it). With --cluster=etcd://...: this "
          "daemon's etcd lease (whole seconds, at least 1 s).");

namespace collectived {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool IsLoopback(const std::string& addr) {
  return absl::StartsWith(addr, "127.") || absl::StartsWith(addr, "localhost:") ||
         absl::StartsWith(addr, "[::1]:");
}

// Credentials of the TCP listener: TLS (mTLS with a client CA) when a
// certificate is given; plaintext only on loopback unless --tcp-insecure.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const std::string& tcp) {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), key = absl::GetFlag(FLAGS_tls_key),
                    ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (cert.empty()) {
    if (!ca.empty()) return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert");
    if (!IsLoopback(tcp) && !absl::GetFlag(FLAGS_tcp_insecure)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tcp=", tcp, " is not a loopback address: give --tls-cert and --tls-key, "
          "or --tcp-insecure to accept plaintext"));
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  auto cert_pem = ReadFile(cert);
  if (!cert_pem.ok()) return cert_pem.status();
  auto key_pem = ReadFile(key);
  if (!key_pem.ok()) return key_pem.status();
  ssl.pem_key_cert_pairs.push_back({*key_pem, *cert_pem});
  if (!ca.empty()) {
    auto ca_pem = ReadFile(ca);
    if (!ca_pem.ok()) return ca_pem.status();
    ssl.pem_root_certs = *ca_pem;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

bool AllLoopback(const std::vector<std::string>& addrs) {
  return std::all_of(addrs.begin(), addrs.end(), IsLoopback);
}

// TLS credentials for the cluster's calls: the daemon's own certificate
// (--tls-cert/--tls-key, when given) as its client certificate, and `ca`
// ("" for the system's roots) to verify the server with.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientTls(const std::string& ca) {
  grpc::SslCredentialsOptions ssl;
  if (!ca.empty()) {
    auto ca_pem = ReadFile(ca);
    if (!ca_pem.ok()) return ca_pem.status();
    ssl.pem_root_certs = *ca_pem;
  }
  if (const std::string cert = absl::GetFlag(FLAGS_tls_cert); !cert.empty()) {
    auto cert_pem = ReadFile(cert);
    if (!cert_pem.ok()) return cert_pem.status();
    auto key_pem = ReadFile(absl::GetFlag(FLAGS_tls_key));
    if (!key_pem.ok()) return key_pem.status();
    ssl.pem_cert_chain = *cert_pem;
    ssl.pem_private_key = *key_pem;
  }
  return grpc::SslCredentials(ssl);
}

// Plaintext to `addresses` (null credentials) is allowed on loopback, or
// with --cluster-plaintext; otherwise INVALID_ARGUMENT saying what to give.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Plaintext(
    const std::vector<std::string>& addresses, absl::string_view what, absl::string_view fix) {
  if (!AllLoopback(addresses) && !absl::GetFlag(FLAGS_cluster_plaintext)) {
    return absl::InvalidArgumentError(absl::StrCat(what, absl::StrJoin(addresses, ","),
                                                   " is not loopback: ", fix,
                                                   ", or --cluster-plaintext to accept plaintext"));
  }
  return std::shared_ptr<grpc::ChannelCredentials>();
}

// Credentials for calls to the coordinator: TLS with the daemon's own
// certificate (mTLS) and --tls-client-ca as the cluster's CA when
// --tls-cert is given; plaintext otherwise. Null means plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClusterCredentials(
    const std::vector<std::string>& coordinators) {
  if (absl::GetFlag(FLAGS_tls_cert).empty()) {
    return Plaintext(coordinators, "--cluster=",
                     "give --tls-cert and --tls-key (and --tls-client-ca, the cluster's CA)");
  }
  return ClientTls(absl::GetFlag(FLAGS_tls_client_ca));
}

// Credentials for etcd: TLS (etcds://) verifying etcd with --etcd-ca (or
// --tls-client-ca), presenting --tls-cert/--tls-key when given; plaintext
// (etcd://) otherwise. Null: plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> EtcdCredentials(
    const std::vector<std::string>& endpoints, bool tls) {
  if (!tls) return Plaintext(endpoints, "--cluster=etcd://", "use etcds:// (TLS, with --etcd-ca)");
  const std::string ca = absl::GetFlag(FLAGS_etcd_ca);
  return ClientTls(ca.empty() ? absl::GetFlag(FLAGS_tls_client_ca) : ca);
}

// The address this daemon advertises to the cluster: --cluster-advertise, or
// the --tcp address with its bound port (the host name for a wildcard).
// The host part of the --tcp address, or `for_wildcard` when it listens on
// every address.
std::string TcpHost(const std::string& tcp, const std::string& for_wildcard) {
  std::string h = tcp.substr(0, tcp.rfind(':'));
  return h.empty() || h == "0.0.0.0" || h == "[::]" ? for_wildcard : h;
}

std::string AdvertisedAddress(const std::string& tcp, int port, const std::string& host) {
  if (std::string a = absl::GetFlag(FLAGS_cluster_advertise); !a.empty()) return a;
  return absl::StrCat(TcpHost(tcp, host), ":", port);
}

// Largest request accepted (RESOURCE_EXHAUSTED beyond).
constexpr int kMaxRequestBytes = 1 << 20;

int Fail(const absl::Status& status) {
  LogEvent(LogLevel::kError, "startup_failed", {{"error", status.ToString()}});
  return 1;
}

// The usage text and help flags, then the command line parsed; --foo-bar
// is accepted as well as --foo_bar (absl flag names use underscores).
void ParseFlags(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return std::string("collectived " COLLECTIVED_VERSION "\n"); };
  // --help and --helpshort list the flags of the file that defines them all
  // (absl's default matches files named after the program: none here, so
  // --help printed "No flags matched"); --helpfull adds absl's own.
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "daemon/server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [](absl::string_view file) {  // no build machine's path
    const size_t at = file.rfind("daemon/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "runs JAX-style collectives (psum, pmean, all_gather, ppermute, ...) for the "
      "client processes of this host over shared memory.\nUsage: collectived [--socket=PATH] "
      "[--tcp=ADDR] [flags]");
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) {
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      for (size_t i = 2; i < a.size() && a[i] != '='; ++i) {
        if (a[i] == '-') a[i] = '_';
      }
    }
    arg_ptrs.push_back(a.data());
  }
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
}

// What this host's clients reach: the sockets, their mode and group, and the
// descriptor budget.
struct LocalSettings {
  std::string socket;
  std::string side_socket;
  int mode = 0;
  int gid = -1;  // -1: the daemon's own group
  FdLimits fd_limits;
};

// The log level, socket and descriptor flags checked and applied (log level,
// descriptor ceiling); the socket's directory made, and refused when another
// daemon listens on it.
absl::StatusOr<LocalSettings> LocalSettingsFromFlags() {
  LocalSettings out;
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return absl::InvalidArgumentError("--log_level must be debug, info, warn or error");
  }
  SetLogLevel(level);
  char* end = nullptr;
  const std::string mode_text = absl::GetFlag(FLAGS_socket_mode);
  const long mode = std::strtol(mode_text.c_str(), &end, 8);
  if (mode_text.empty() || *end != '\0' || mode < 0 || mode > 0777) {
    return absl::InvalidArgumentError("--socket_mode must be octal, e.g. 0660");
  }
  out.mode = static_cast<int>(mode);
  if (const std::string group = absl::GetFlag(FLAGS_socket_group); !group.empty()) {
    unsigned parsed = 0;
    if (absl::SimpleAtoi(group, &parsed)) {
      out.gid = static_cast<int>(parsed);
    } else if (const struct group* g = getgrnam(group.c_str())) {
      out.gid = static_cast<int>(g->gr_gid);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown group '", group, "'"));
    }
  }
  const int fd_reserve = absl::GetFlag(FLAGS_fd_reserve);
  if (fd_reserve < 16) return absl::InvalidArgumentError("--fd_reserve must be at least 16");
  out.fd_limits = RaiseFdLimit();
  const FdLimits& fd_limits = out.fd_limits;
  if (!fd_limits.raise_error.empty()) {
    LogEvent(LogLevel::kWarn, "open_files_limit_not_raised",
             {{"soft", absl::StrCat(fd_limits.soft)}, {"hard", absl::StrCat(fd_limits.hard)},
              {"error", fd_limits.raise_error}});
  }
  if (fd_limits.soft < static_cast<uint64_t>(2 * fd_reserve)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RLIMIT_NOFILE (", fd_limits.soft, ") leaves no room beside --fd_reserve=", fd_reserve));
  }
  SetFdCeiling(static_cast<int>(std::min<uint64_t>(fd_limits.soft, INT_MAX) - fd_reserve));

  out.socket = ResolveSocketPath(absl::GetFlag(FLAGS_socket));
  if (absl::Status st = EnsureSocketDir(out.socket); !st.ok()) return st;
  if (StreamSocketIsLive(out.socket)) {
    return absl::AlreadyExistsError(
        absl::StrCat("another daemon is already listening on ", out.socket));
  }
  out.side_socket = SideSocketPath(out.socket);
  return out;
}

// The cluster flags, checked before anything listens.
struct ClusterSettings {
  bool enabled = false;            // a coordinator is served or named
  bool serve_coordinator = false;  // --coordinator
  bool etcd = false;               // --cluster=etcd://... or etcds://...
  std::vector<std::string> addrs;  // coordinators or etcd endpoints
  std::string host_id;
  std::string token;
  std::shared_ptr<grpc::ChannelCredentials> creds;  // null: plaintext
  std::shared_ptr<const TlsConfig> tls;             // between hosts; null: none
};

// The cluster is kept in etcd (etcd:// or etcds://), or by a daemon's
// coordinator (host:port addresses).
absl::StatusOr<ClusterSettings> ClusterSettingsFromFlags(const std::string& tcp,
                                                         const std::string& hostname) {
  ClusterSettings c;
  c.serve_coordinator = absl::GetFlag(FLAGS_coordinator);
  const std::string cluster_flag = absl::GetFlag(FLAGS_cluster);
  c.etcd = absl::StartsWith(cluster_flag, "etcd://") || absl::StartsWith(cluster_flag, "etcds://");
  bool etcd_tls = false;
  if (c.etcd) {
    auto endpoints = ParseEtcdAddress(cluster_flag, &etcd_tls);
    if (!endpoints.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster: ", endpoints.status().message()));
    }
    c.addrs = *endpoints;
    if (c.serve_coordinator) {
      return absl::InvalidArgumentError(
          "--coordinator and --cluster=etcd://... name two coordinators: with etcd, no daemon "
          "serves one (drop --coordinator)");
    }
  } else {
    c.addrs = absl::StrSplit(cluster_flag, ',', absl::SkipWhitespace());
  }
  c.host_id = absl::GetFlag(FLAGS_host_id);
  if (c.host_id.empty()) c.host_id = hostname;
  c.enabled = c.serve_coordinator || !c.addrs.empty();
  if (!c.enabled) return c;
  if (tcp.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator and --cluster need --tcp: the cluster talks to the daemon over TCP");
  }
  if (absl::Status st = ValidateHostId(c.host_id); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-id (default: the host name): ", st.message()));
  }
  // NCCL's idea of a host is the cluster's: GPU ops across hosts connect
  // the daemons as separate hosts even where two share a machine (as in
  // tests), and NCCL never sees one GPU twice on "one host". Set before
  // any NCCL call; a value the operator set is kept.
  setenv("NCCL_HOSTID", absl::StrCat("collectived-", c.host_id).c_str(), /*overwrite=*/0);
  if (const std::string f = absl::GetFlag(FLAGS_cluster_token_file); !f.empty()) {
    auto t = ReadFile(f);
    if (!t.ok()) return t.status();
    c.token = std::string(absl::StripAsciiWhitespace(*t));
    if (c.token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster-token-file ", f, " is empty"));
    }
  }
  if (const std::string a = absl::GetFlag(FLAGS_cluster_advertise); !a.empty()) {
    if (absl::Status st = ValidateAddress(a); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster-advertise: ", st.message()));
    }
  }
  if (c.etcd) {
    auto creds = EtcdCredentials(c.addrs, etcd_tls);
    if (!creds.ok()) return creds.status();
    c.creds = *creds;
  } else if (!c.addrs.empty()) {
    auto creds = ClusterCredentials(c.addrs);
    if (!creds.ok()) return creds.status();
    c.creds = *creds;
  }
  // With certificates, the connections between hosts are mutual TLS too,
  // and each host's certificate must name its host id: the other hosts
  // check it, so a daemon whose certificate does not is refused now.
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    if (absl::GetFlag(FLAGS_tls_client_ca).empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert in a cluster needs --tls-client-ca (the cluster's CA): the daemons "
          "verify each other's certificates");
    }
    auto tls = TlsConfig::Load({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                absl::GetFlag(FLAGS_tls_client_ca)});
    if (!tls.ok()) return tls.status();
    if (absl::Status st = (*tls)->NamesHost(c.host_id); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--host-id: ", st.message()));
    }
    c.tls = *std::move(tls);
  }
  return c;
}

// The coordinator this daemon serves (--coordinator) and its service.
struct Coordinator {
  std::unique_ptr<InMemoryCoordinator> state;
  std::unique_ptr<CoordinatorService> service;
};

absl::StatusOr<Coordinator> MakeCoordinator(const ClusterSettings& c, const std::string& tcp) {
  const int64_t lease_ms = absl::GetFlag(FLAGS_cluster_lease_ms);
  if (lease_ms < 100) return absl::InvalidArgumentError("--cluster-lease-ms must be >= 100");
  if (c.token.empty() && !IsLoopback(tcp)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator on --tcp=", tcp, " (not loopback) needs --cluster-token-file"));
  }
  if (c.token.empty()) {
    // Loopback is not a boundary between the users of one host: any local
    // process can reach the port, whatever --socket-mode says.
    LogEvent(LogLevel::kWarn, "coordinator_without_token",
             {{"tcp", tcp},
              {"msg", "every local process can call the coordinator (join, keys, meshes); "
                      "set --cluster-token-file on a host other users share"}});
  }
  InMemoryCoordinatorOptions co;
  co.lease_ttl = absl::Milliseconds(lease_ms);
  Coordinator out;
  out.state = std::make_unique<InMemoryCoordinator>(co);
  out.service = std::make_unique<CoordinatorService>(out.state.get(), c.token);
  return out;
}

// Meshes across hosts: the engine asks the rendezvous, which reaches the
// cluster once the cluster client exists (StartClusterClient).
absl::StatusOr<std::unique_ptr<ClusterRendezvous>> MakeRendezvous(const ClusterSettings& c) {
  ClusterRendezvousOptions ro;
  ro.host_id = c.host_id;
  const int64_t chunk = absl::GetFlag(FLAGS_cluster_chunk_bytes);
  if (chunk < 4096) return absl::InvalidArgumentError("--cluster-chunk-bytes must be >= 4096");
  ro.mesh.chunk_bytes = static_cast<uint64_t>(chunk);
  const int64_t replicate = absl::GetFlag(FLAGS_cluster_replicate_bytes);
  if (replicate < 0) return absl::InvalidArgumentError("--cluster-replicate-bytes must be >= 0");
  ro.mesh.replicate_below_bytes = static_cast<uint64_t>(replicate);
  ro.serves_coordinator = c.serve_coordinator;
  ro.cluster_token = c.token;
  ro.tls = c.tls;
  return std::make_unique<ClusterRendezvous>(ro);
}

// The engine's limits and timeouts from the flags.
EngineOptions EngineOptionsFromFlags(const std::string& host, const std::string& side_socket) {
  EngineOptions options;
  options.host = host;
  options.daemon_id = absl::StrCat(host, "/", getpid());
  options.side_socket_path = side_socket;
  options.join_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_join_timeout_ms));
  options.op_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_op_timeout_ms));
  options.attach_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_attach_timeout_ms));
  options.token_hold =
      absl::Milliseconds(std::max<int64_t>(0, absl::GetFlag(FLAGS_token_hold_ms)));
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_meshes = absl::GetFlag(FLAGS_max_meshes);
  options.max_buffers_per_session = absl::GetFlag(FLAGS_max_buffers_per_session);
  options.max_buffer_bytes_per_session =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_buffer_bytes_per_session));
  options.max_gpu_buffer_bytes_per_session =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_max_gpu_buffer_bytes_per_session));
  options.max_buffer_size = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_buffer_bytes));
  options.inline_op_bytes =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_inline_op_bytes)));
  options.member_op_bytes =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_member_op_bytes)));
  options.member_segment_total_bytes = static_cast<uint64_t>(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_member_segment_total_bytes)));
  return options;
}

// The executors and allocators that can run here (each says at start whether
// it can, one log line each; the unviable ones are dropped).
Backends ViableBackendsFromFlags() {
  CpuExecutorOptions exec_options;
  exec_options.threads = absl::GetFlag(FLAGS_threads);
  exec_options.chunk_bytes =
      static_cast<size_t>(std::max<int64_t>(64, absl::GetFlag(FLAGS_chunk_bytes)));
  Backends candidates;
  AddCpuBackends(candidates, exec_options);
  AddCudaBackends(candidates);
  return SelectViable(std::move(candidates));
}

// Cluster membership, joined in the background (a coordinator that is down
// is retried, never fatal), and the rendezvous attached to it.
absl::StatusOr<std::unique_ptr<Cluster>> StartClusterClient(ClusterSettings c,
                                                            const std::string& tcp, int tcp_port,
                                                            const std::string& host,
                                                            const std::string& socket,
                                                            ClusterRendezvous& rendezvous) {
  const std::string advertised = AdvertisedAddress(tcp, tcp_port, host);
  // Beside the socket: a daemon restarted on the same socket takes its host
  // id back at once; another daemon claiming it is refused.
  const std::string lease_file = socket + ".lease";
  std::unique_ptr<Cluster> client;
  std::string coordinator_text;
  if (c.etcd) {
    EtcdClusterOptions eo;
    eo.etcd.endpoints = c.addrs;
    eo.etcd.credentials = c.creds;
    eo.etcd.username = absl::GetFlag(FLAGS_etcd_user);
    if (const std::string f = absl::GetFlag(FLAGS_etcd_password_file); !f.empty()) {
      auto pw = ReadFile(f);
      if (!pw.ok()) return pw.status();
      eo.etcd.password = std::string(absl::StripAsciiWhitespace(*pw));
    }
    // An attempt that hangs on a dead leader fails over after this.
    eo.etcd.rpc_timeout = absl::Seconds(2);
    eo.prefix = absl::GetFlag(FLAGS_etcd_prefix);
    eo.host_id = c.host_id;
    eo.address = advertised;
    eo.lease_ttl = absl::Milliseconds(absl::GetFlag(FLAGS_cluster_lease_ms));
    eo.lease_file = lease_file;
    auto cluster = EtcdCluster::Create(std::move(eo));
    if (!cluster.ok()) return cluster.status();
    client = *std::move(cluster);
    LogEvent(LogLevel::kInfo, "cluster_starting",
             {{"host_id", c.host_id}, {"address", advertised},
              {"coordinator", client->description()},
              {"lease_ms", absl::StrCat(absl::GetFlag(FLAGS_cluster_lease_ms))},
              {"token", c.token.empty() ? "none" : "set"},
              {"security", c.creds ? "tls" : "plaintext"}});
  } else {
    ClusterClientOptions cc;
    cc.coordinators = c.addrs;
    if (cc.coordinators.empty()) {
      // The coordinator joins itself: by its advertised name with TLS (the
      // name its certificate carries), else in plaintext at the address it
      // listens on (loopback for a wildcard), which never leaves this host.
      if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
        cc.coordinators.push_back(advertised);
        auto creds = ClusterCredentials(cc.coordinators);
        if (!creds.ok()) return creds.status();
        c.creds = *creds;
      } else {
        cc.coordinators.push_back(absl::StrCat(TcpHost(tcp, "127.0.0.1"), ":", tcp_port));
        c.creds = nullptr;
      }
    }
    cc.credentials = c.creds;
    cc.host_id = c.host_id;
    cc.address = advertised;
    cc.token = c.token;
    cc.lease_file = lease_file;
    auto created = ClusterClient::Create(std::move(cc));
    if (!created.ok()) return created.status();
    client = *std::move(created);
    LogEvent(LogLevel::kInfo, "cluster_starting",
             {{"host_id", c.host_id}, {"address", advertised},
              {"coordinator", c.serve_coordinator ? "this daemon" : "remote"},
              {"coordinators", absl::StrJoin(c.addrs.empty() ? std::vector<std::string>{"self"}
                                                             : c.addrs, ",")},
              {"lease_ms", c.serve_coordinator
                               ? absl::StrCat(absl::GetFlag(FLAGS_cluster_lease_ms))
                               : "coordinator's"},
              {"token", c.token.empty() ? "none" : "set"},
              {"security", c.creds ? "tls" : "plaintext"}});
  }
  client->Start();
  rendezvous.Attach(client.get(), AddressHost(advertised));
  return client;
}

// How the daemon's gRPC listens on --tcp: "off", "plaintext", "tls" or
// "mtls".
std::string TcpSecurity(const std::string& tcp) {
  if (tcp.empty()) return "off";
  if (absl::GetFlag(FLAGS_tls_cert).empty()) return "plaintext";
  return absl::GetFlag(FLAGS_tls_client_ca).empty() ? "tls" : "mtls";
}

// What the clients talk to: the shared-memory fast path and the side
// channel (descriptors), and the gRPC server on the Unix socket and --tcp
// (with the coordinator's service, when this daemon serves one). Destroyed
// in reverse: the server first.
struct Listeners {
  std::unique_ptr<FastPath> fast_path;
  std::unique_ptr<SideChannel> side;
  GrpcUnixListener unix_listener;
  std::unique_ptr<CollectiveService> service;
  HealthService health;
  std::unique_ptr<grpc::Server> server;
  int tcp_port = 0;  // bound to --tcp (0: no --tcp)
};

absl::Status StartListeners(Engine& engine, const LocalSettings& local, const std::string& tcp,
                            absl::Duration attach_timeout, CoordinatorService* coordinator,
                            Listeners& out) {
  FastPathOptions fast_options;
  fast_options.spin =
      absl::Microseconds(std::max<int64_t>(0, absl::GetFlag(FLAGS_fast_path_spin_us)));
  out.fast_path = std::make_unique<FastPath>(&engine, fast_options);
  SideChannelOptions side_options;
  side_options.mode = local.mode;
  side_options.gid = local.gid;
  side_options.attach_timeout = attach_timeout;
  side_options.max_unattached = std::max(1, absl::GetFlag(FLAGS_max_unattached_connections));
  side_options.max_unattached_per_uid =
      std::max(1, absl::GetFlag(FLAGS_max_unattached_connections_per_uid));
  out.side = std::make_unique<SideChannel>(
      &engine, absl::GetFlag(FLAGS_fast_path) ? out.fast_path.get() : nullptr, side_options);
  if (absl::Status st = out.side->Start(local.side_socket); !st.ok()) return st;
  if (absl::Status st = out.unix_listener.Bind(local.socket, local.mode, local.gid); !st.ok()) {
    return st;
  }
  out.service = std::make_unique<CollectiveService>(&engine);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!tcp.empty()) {
    auto creds = TcpCredentials(tcp);
    if (!creds.ok()) return creds.status();
    builder.AddListeningPort(tcp, *creds, &out.tcp_port);
  }
  // No payload travels over gRPC, so requests are small; refuse big ones.
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.RegisterService(out.service.get());
  builder.RegisterService(&out.health);
  if (coordinator != nullptr) {
    builder.RegisterService(coordinator);
    out.health.AddService("collectived.v1.Cluster");
  }
  out.server = builder.BuildAndStart();
  if (!out.server) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server", tcp.empty() ? "" : " on " + tcp));
  }
  if (!tcp.empty() && out.tcp_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on TCP address ", tcp));
  }
  out.unix_listener.Start(out.server.get());
  return absl::OkStatus();
}

// Waits for SIGTERM or SIGINT (blocked in every thread); which one came.
int WaitForStopSignal(const sigset_t& stop_signals) {
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  LogEvent(LogLevel::kInfo, "stopping", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  return sig;
}

// Stops serving, in the order that lets every open call finish: the
// cluster left, the coordinator's waiting calls released, the engine's
// pending work failed, then the listeners stopped.
void Stop(const std::string& why, Listeners& listeners, Cluster* cluster_client,
          InMemoryCoordinator* coordinator, Engine& engine, ClusterRendezvous* rendezvous) {
  listeners.health.Shutdown();
  // Leave the cluster (a bounded RPC), then release the coordinator's
  // waiting calls so that the server can finish them.
  if (cluster_client != nullptr) cluster_client->Stop(/*leave=*/true);
  if (coordinator != nullptr) coordinator->Shutdown();
  // Fail what is pending first, so every open RPC can finish, then stop.
  engine.Shutdown(why);
  // Its queued calls answer the engine (UNAVAILABLE) before the engine goes.
  if (rendezvous != nullptr) rendezvous->Stop();
  listeners.unix_listener.Stop();
  listeners.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  listeners.side->Stop();
  listeners.fast_path->Stop();
}

// Blocks the stop signals in every thread (the main thread waits for them)
// and ignores SIGPIPE; returns the stop signals.
sigset_t SetUpProcess() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // An Abseil built without NDEBUG (Debian's) records every absl::Mutex
  // acquisition (gRPC's locks; the daemon's own Mutex is std::mutex,
  // common/sync.h) in one process-wide lock-order graph, under one global
  // lock: a shared cost on every RPC and op, to check locks that are not
  // this project's.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return stop_signals;
}

// The daemon's one line of what it serves, once it serves it.
void LogListening(const LocalSettings& local, const std::string& tcp, int tcp_port,
                  const std::string& metrics, Engine& engine) {
  LogEvent(LogLevel::kInfo, "listening",
           {{"socket", local.socket}, {"side_socket", local.side_socket},
            {"tcp", tcp.empty() ? "off" : absl::StrCat(tcp, " (port ", tcp_port, ")")},
            {"tcp_security", TcpSecurity(tcp)},
            {"metrics", metrics},
            {"executor_threads", absl::StrCat(engine.GetStats().executor_threads)},
            {"open_files_limit", absl::StrCat(local.fd_limits.soft)},
            {"open_files_limit_at_start", absl::StrCat(local.fd_limits.soft_before)},
            {"pid", absl::StrCat(getpid())}, {"version", COLLECTIVED_VERSION}});
}

int Main(int argc, char** argv) {
  ParseFlags(argc, argv);
  auto local = LocalSettingsFromFlags();
  if (!local.ok()) return Fail(local.status());
  const std::string& socket = local->socket;
  const std::string& side_socket = local->side_socket;

  const sigset_t stop_signals = SetUpProcess();

  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string tcp = absl::GetFlag(FLAGS_tcp);
  auto cluster = ClusterSettingsFromFlags(tcp, host);
  if (!cluster.ok()) return Fail(cluster.status());
  Coordinator coordinator;
  if (cluster->serve_coordinator) {
    auto made = MakeCoordinator(*cluster, tcp);
    if (!made.ok()) return Fail(made.status());
    coordinator = *std::move(made);
  }
  EngineOptions options = EngineOptionsFromFlags(host, side_socket);
  std::unique_ptr<ClusterRendezvous> rendezvous;
  if (cluster->enabled) {
    auto made = MakeRendezvous(*cluster);
    if (!made.ok()) return Fail(made.status());
    rendezvous = *std::move(made);
    options.rendezvous = rendezvous.get();
  }
  std::unique_ptr<Metrics> metrics;
  const std::string metrics_address = absl::GetFlag(FLAGS_metrics);
  if (!metrics_address.empty()) {
    metrics = std::make_unique<Metrics>();
    options.op_observer = metrics->Observer();
  }
  auto engine = std::make_unique<Engine>(options, ViableBackendsFromFlags());
  // On every way out (an early failure included) the rendezvous stops
  // before the engine goes: its queued calls answer into the engine.
  absl::Cleanup stop_rendezvous = [&rendezvous] {
    if (rendezvous) rendezvous->Stop();
  };
  if (metrics != nullptr) {
    if (absl::Status st = metrics->Serve(metrics_address, engine.get()); !st.ok()) return Fail(st);
  }

  Listeners listeners;
  if (absl::Status st = StartListeners(*engine, *local, tcp, options.attach_timeout,
                                       coordinator.service.get(), listeners);
      !st.ok()) {
    return Fail(st);
  }
  const int tcp_port = listeners.tcp_port;
  LogListening(*local, tcp, tcp_port,
               metrics == nullptr ? "off"
                                  : absl::StrCat(metrics_address, " (port ", metrics->port(), ")"),
               *engine);

  std::unique_ptr<Cluster> cluster_client;
  if (cluster->enabled) {
    auto started = StartClusterClient(*cluster, tcp, tcp_port, host, socket, *rendezvous);
    if (!started.ok()) return Fail(started.status());
    cluster_client = *std::move(started);
  }

  const int sig = WaitForStopSignal(stop_signals);
  const std::string why = sig == SIGTERM ? "received SIGTERM" : "received SIGINT";
  Stop(why, listeners, cluster_client.get(), coordinator.state.get(), *engine, rendezvous.get());
  metrics.reset();  // scrapes read the engine
  engine.reset();
  LogEvent(LogLevel::kInfo, "stopped");
  return 0;
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) { return collectived::Main(argc, argv); }
