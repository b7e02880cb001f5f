// The fast path (common/fast_queue.h, daemon/server/fast_path.cc, the SDK's
// FastQueue) with the real daemon binary and real client processes:
//   - fast-path and gRPC-path members in one mesh, and the switches that turn
//     the fast path off (ClientOptions, COLLECTIVED_FAST_PATH=0, --fast_path);
//   - ops too big for a queue slot fall back to gRPC without losing order;
//   - the daemon treats queue content as untrusted (a raw client here writes
//     whatever it likes into its mapped queue);
//   - an idle client and daemon use no CPU;
//   - SIGTERM fails a waiting fast-path op promptly;
//   - OpFuture::timing().
// Every wait has a deadline.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include <grpcpp/grpcpp.h>

#include "collectived/v1/collective.grpc.pb.h"
#include "common/fast_queue.h"
#include "common/socket_path.h"
#include "common/unix_socket.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/harness/harness.h"
#include "tests/harness/raw_session.h"

namespace collectived::testing {
namespace {

constexpr absl::Duration kStartup = absl::Seconds(30);
constexpr absl::Duration kFinish = absl::Seconds(60);

std::string WorkerBinary() { return COLLECTIVED_FASTPATH_WORKER_BIN; }

std::vector<std::string> WorkerArgs(const Daemon& d, const std::string& mesh, int members,
                                    int member, std::vector<std::string> extra) {
  return WorkerArgv(WorkerBinary(), d, mesh, members, member, std::move(extra));
}

std::string Field(const std::string& output, const std::string& tag, const std::string& key) {
  return OutputField(output, tag, key);
}

// The rest of the first line starting with `tag `, or "".
std::string Rest(const std::string& output, const std::string& tag) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(line, tag + " ")) return std::string(line.substr(tag.size() + 1));
  }
  return "";
}

int64_t Int(const std::string& s) {
  int64_t v = -1;
  if (!absl::SimpleAtoi(s, &v)) return -1;
  return v;
}

int64_t MonotonicNs() { return fastq::MonotonicNs(); }

// utime + stime of process `pid`, in clock ticks (/proc/<pid>/stat fields 14
// and 15), or -1.
int64_t CpuTicks(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  // f[0] is field 3 (state): utime is field 14 -> f[11], stime f[12].
  if (f.size() < 13) return -1;
  return Int(f[11]) + Int(f[12]);
}

// Whether ListSessions lists a session of `client_name` (it shows only a
// prefix of session ids: the tests give each session a unique name).
absl::StatusOr<bool> Listed(v1::Collective::Stub& stub, const std::string& client_name) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListSessionsResponse resp;
  grpc::Status st = stub.ListSessions(&ctx, v1::ListSessionsRequest(), &resp);
  if (!st.ok()) return absl::UnavailableError(st.error_message());
  for (const auto& s : resp.sessions()) {
    if (s.client_name() == client_name) return true;
  }
  return false;
}

bool HealthServing(const Daemon& d) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, req, &resp).ok() &&
         resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

// ---------------------------------------------------------------------------
// Mixed paths
// ---------------------------------------------------------------------------

// Member 0 on the fast path, member 1 on gRPC (ClientOptions::fast_path =
// false): every collective gives the same, correct result on both.
TEST(FastPathMixedTest, FastAndGrpcMembersShareAMesh) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto results = RunAll({WorkerArgs(**daemon, "mixed", 2, 0, {"--mode=ops", "--fast=1"}),
                         WorkerArgs(**daemon, "mixed", 2, 1, {"--mode=ops", "--fast=0"})},
                        kFinish);
  for (int i = 0; i < 2; ++i) {
    const auto& r = results[i];
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(Field(r.output, "FAST", "value"), i == 0 ? "1" : "0") << r.output;
    EXPECT_EQ(Field(r.output, "PSUM", "code"), "OK") << r.output;
    EXPECT_EQ(Field(r.output, "PSUM", "values"), "3,6,9,12,15,18,21,24") << r.output;
    EXPECT_EQ(Field(r.output, "GATHER", "code"), "OK") << r.output;
    EXPECT_EQ(Field(r.output, "GATHER", "values"), "0,1,2,3,100,101,102,103") << r.output;
    EXPECT_EQ(Field(r.output, "PPERMUTE", "code"), "OK") << r.output;
    EXPECT_EQ(Field(r.output, "PPERMUTE", "values"), i == 0 ? "10,11,12,13" : "0,1,2,3")
        << r.output;
  }
}

// COLLECTIVED_FAST_PATH=0 turns the fast path off even when ClientOptions
// asks for it; a three-member mesh with one member of each kind works.
TEST(FastPathMixedTest, EnvironmentSwitchTurnsTheFastPathOff) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto results = RunAll(
      {WorkerArgs(**daemon, "env", 3, 0, {"--mode=ops", "--fast=1", "--env-fast-path=0"}),
       WorkerArgs(**daemon, "env", 3, 1, {"--mode=ops", "--fast=1"}),
       WorkerArgs(**daemon, "env", 3, 2, {"--mode=ops", "--fast=1", "--env-fast-path=1"})},
      kFinish);
  const std::vector<std::string> fast = {"0", "1", "1"};
  const std::vector<std::string> permuted = {"20,21,22,23", "0,1,2,3", "10,11,12,13"};
  for (int i = 0; i < 3; ++i) {
    const auto& r = results[i];
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAST", "value"), fast[i]) << r.output;
    EXPECT_EQ(Field(r.output, "PSUM", "values"), "6,12,18,24,30,36,42,48") << r.output;
    EXPECT_EQ(Field(r.output, "GATHER", "values"),
              "0,1,2,3,100,101,102,103,200,201,202,203")
        << r.output;
    EXPECT_EQ(Field(r.output, "PPERMUTE", "values"), permuted[i]) << r.output;
  }
}

// A daemon started with --fast_path=false refuses QUEUE (UNIMPLEMENTED) and
// clients that ask for the fast path fall back to gRPC.
TEST(FastPathMixedTest, DaemonWithoutFastPathLeavesClientsOnGrpc) {
  auto daemon = Daemon::Start({"--fast_path=false"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto results = RunAll({WorkerArgs(**daemon, "nofast", 2, 0, {"--mode=ops", "--fast=1"}),
                         WorkerArgs(**daemon, "nofast", 2, 1, {"--mode=ops", "--fast=1"})},
                        kFinish);
  for (int i = 0; i < 2; ++i) {
    const auto& r = results[i];
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAST", "value"), "0") << r.output;
    EXPECT_EQ(Field(r.output, "PSUM", "values"), "3,6,9,12,15,18,21,24") << r.output;
    EXPECT_EQ(Field(r.output, "PPERMUTE", "values"), i == 0 ? "10,11,12,13" : "0,1,2,3")
        << r.output;
  }
  // And the side socket says why.
  auto stub = Stub(**daemon);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::CreateSessionResponse session;
  ASSERT_TRUE(stub->CreateSession(&ctx, v1::CreateSessionRequest(), &session).ok());
  auto side = ConnectSeqPacket(SideSocketPath((*daemon)->socket()));
  ASSERT_TRUE(side.ok()) << side.status();
  ASSERT_TRUE(
      SendPacket(*side, absl::StrCat("ATTACH ", session.session_id(), " ", session.attach_token()))
          .ok());
  auto reply = ReceivePacket(*side, absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->data, "OK");
  ASSERT_TRUE(SendPacket(*side, "QUEUE").ok());
  reply = ReceivePacket(*side, absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  const int unimplemented = static_cast<int>(absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StartsWith(reply->data, absl::StrCat("ERR ", unimplemented, " ")))
      << reply->data;
  EXPECT_FALSE(reply->fd.valid());
  close(*side);
}

// ---------------------------------------------------------------------------
// Ops bigger than a queue slot
// ---------------------------------------------------------------------------

// Axis names are limited to 64 characters and 8 axes (daemon/core/engine.cc),
// so only a ppermute with many pairs makes an OpSpec larger than a slot
// (fastq::kMaxOpBytes = 4072 bytes): with n = 560 members its n-1 pairs make
// a spec of about 4300 bytes (the workers print the exact size). Members 0 and 1 run in their own processes and report every op;
// the other 558 are threads of a third process (each its own session, all on
// the fast path) and check the same things.
TEST(FastPathLargeOpTest, OversizedOpsGoOverGrpcInOrder) {
  constexpr int kMembers = 560;
  // Quiet: nobody reads the daemon's log pipe until it stops, and 560
  // sessions' info lines would fill it (and block the daemon).
  auto daemon = Daemon::Start({"--log_level=error"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto results = RunAll(
      {WorkerArgs(**daemon, "big", kMembers, 0, {"--mode=big"}),
       WorkerArgs(**daemon, "big", kMembers, 1, {"--mode=big"}),
       WorkerArgs(**daemon, "big", kMembers, 2,
                  {"--mode=big", absl::StrCat("--sessions=", kMembers - 2)})},
      absl::Seconds(120));
  const int64_t n = kMembers, T = n * (n + 1) / 2, b = (n - 2) * (n - 1) * T;
  for (int i = 0; i < 2; ++i) {
    const auto& r = results[i];
    ASSERT_FALSE(r.timed_out) << r.output;
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAST", "value"), "1") << r.output;
    // The big ops really are bigger than a slot.
    EXPECT_EQ(Int(Field(r.output, "SPEC", "limit")),
              static_cast<int64_t>(fastq::kMaxOpBytes));
    EXPECT_GT(Int(Field(r.output, "SPEC", "big_bytes")),
              static_cast<int64_t>(fastq::kMaxOpBytes))
        << r.output;
    EXPECT_EQ(Rest(r.output, "SEQ"), "0,1,2,3,4,5,6,7") << r.output;
    EXPECT_EQ(Rest(r.output, "CODES"), "OK,OK,OK,OK,OK,OK,OK,OK") << r.output;
    EXPECT_EQ(Rest(r.output, "PATHS"), "fast,fast,grpc,fast,grpc,grpc,fast,fast") << r.output;
    EXPECT_EQ(Field(r.output, "VALUES", "a"), absl::StrCat(T)) << r.output;
    EXPECT_EQ(Field(r.output, "VALUES", "b"), absl::StrCat(b, ",", 2 * b, ",", 3 * b, ",", 4 * b))
        << r.output;
    EXPECT_EQ(Field(r.output, "VALUES", "gather"), absl::StrCat("0..", 3 * (n - 1)))
        << r.output;
    EXPECT_EQ(Field(r.output, "VALUES", "gather_ok"), "1") << r.output;
    EXPECT_EQ(Field(r.output, "MEMBERS", "ok"), "1") << r.output;
  }
  const auto& fill = results[2];
  ASSERT_FALSE(fill.timed_out) << fill.output.substr(0, 4000);
  ASSERT_EQ(fill.exit_code, 0) << fill.output.substr(0, 4000);
  EXPECT_EQ(Field(fill.output, "MEMBERS", "n"), absl::StrCat(kMembers - 2));
  EXPECT_EQ(Field(fill.output, "MEMBERS", "ok"), absl::StrCat(kMembers - 2))
      << fill.output.substr(0, 4000);
}

// Ops of two meshes submitted in different orders by two processes that are
// both members of both meshes (the order is only fixed per mesh). p submits
// A (a ppermute too big for a slot, on the 560-member mesh) and then B (a
// small psum on a 2-member mesh) with *_async, which "submit and return at
// once"; q waits for B before it submits A. On the gRPC path that works.
//
// With p on the fast path, p's psum_async(B) must not wait for A (a gRPC op
// on another mesh) to complete: A cannot complete before q submits it, which
// q does only after B. (The SDK orders a switch between its two paths per
// mesh: only earlier stream ops of the same mesh are waited for.)
class FastPathCrossMeshTest : public ::testing::TestWithParam<bool> {};

TEST_P(FastPathCrossMeshTest, AsyncSubmitDoesNotWaitForAnotherMeshsOp) {
  constexpr int kMembers = 560;
  const bool p_fast = GetParam();
  auto daemon = Daemon::Start({"--log_level=error"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto results = RunAll(
      {WorkerArgs(**daemon, "cross", kMembers, 0,
                  {"--mode=cross", "--role=p", absl::StrCat("--fast=", p_fast ? 1 : 0)}),
       WorkerArgs(**daemon, "cross", kMembers, 1, {"--mode=cross", "--role=q"}),
       WorkerArgs(**daemon, "cross", kMembers, 2,
                  {"--mode=cross", "--role=fill", absl::StrCat("--sessions=", kMembers - 2)})},
      absl::Seconds(120));
  for (const auto& r : results) {
    ASSERT_FALSE(r.timed_out) << r.output.substr(0, 4000);
    ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 4000);
  }
  const std::string& p = results[0].output;
  const std::string& q = results[1].output;
  EXPECT_EQ(Field(p, "FAST", "value"), p_fast ? "1" : "0") << p;
  EXPECT_EQ(Field(q, "FAST", "value"), "1") << q;
  EXPECT_LT(Int(Field(p, "B_SUBMITTED", "after_ms")), 1000) << "psum_async blocked:\n" << p;
  EXPECT_EQ(Field(p, "B", "code"), "OK") << p;
  EXPECT_EQ(Field(p, "B", "sum"), "2") << p;
  EXPECT_EQ(Field(q, "B", "code"), "OK") << q;
  EXPECT_EQ(Field(q, "B", "sum"), "2") << q;
  EXPECT_EQ(Field(p, "A", "code"), "OK") << p;
  EXPECT_EQ(Field(q, "A", "code"), "OK") << q;
  EXPECT_EQ(Field(results[2].output, "MEMBERS", "ok"), absl::StrCat(kMembers - 2))
      << results[2].output.substr(0, 4000);
}

INSTANTIATE_TEST_SUITE_P(GrpcSubmitter, FastPathCrossMeshTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(FastSubmitter, FastPathCrossMeshTest, ::testing::Values(true));

// ---------------------------------------------------------------------------
// Untrusted queue content: a raw client
// ---------------------------------------------------------------------------

std::string Message(const fastq::CqEntry& c) {
  return std::string(c.msg, std::min<size_t>(c.msg_len, sizeof(c.msg)));
}

constexpr int kInvalidArgument = static_cast<int>(absl::StatusCode::kInvalidArgument);
constexpr int kFailedPrecondition = static_cast<int>(absl::StatusCode::kFailedPrecondition);

// A valid op on the raw session completes OK with the expected sequence.
void ExpectValidOpWorks(RawSession& s, uint64_t tag, int64_t sequence) {
  s.Publish(tag, s.ValidOp());
  auto c = s.NextCompletion();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tag, tag);
  EXPECT_EQ(c->code, 0) << Message(*c);
  EXPECT_EQ(c->sequence, sequence);
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->out_shape[0], 4);
  EXPECT_EQ(c->out_dtype, static_cast<int32_t>(v1::FLOAT32));
  // The stages, in order (a solo mesh: matched once taken; no stream, so
  // ready at once; a CPU op: no launch and no device time).
  EXPECT_GT(c->taken_ns, 0);
  EXPECT_GE(c->matched_ns, c->taken_ns);
  EXPECT_EQ(c->ready_ns, c->matched_ns);
  EXPECT_GE(c->started_ns, c->ready_ns);
  EXPECT_GE(c->executed_ns, c->started_ns);
  EXPECT_GE(c->done_ns, c->executed_ns);
  EXPECT_EQ(c->launched_ns, 0);
  EXPECT_EQ(c->device_ns, 0);
}

TEST(FastPathUntrustedQueueTest, OversizedLengthIsInvalidArgumentAndTheSessionLives) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RawSession s(**daemon, "raw-len");
  ASSERT_OK(s.Attach());
  ASSERT_OK(s.MapQueue());
  ASSERT_OK(s.JoinSolo("raw-len"));
  ExpectValidOpWorks(s, 1, 0);

  const std::string valid = s.ValidOp();
  for (uint32_t len : {static_cast<uint32_t>(fastq::kMaxOpBytes) + 1, uint32_t{1} << 20,
                       UINT32_MAX}) {
    SCOPED_TRACE(absl::StrCat("len ", len));
    s.Publish(1000 + len, valid, len);  // valid bytes, impossible length
    auto c = s.NextCompletion();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->tag, 1000u + len);
    EXPECT_EQ(c->code, kInvalidArgument) << Message(*c);
    EXPECT_EQ(c->sequence, -1);
    EXPECT_EQ(c->started_ns, 0);
    EXPECT_EQ(c->matched_ns, 0);
    EXPECT_EQ(c->executed_ns, 0);
    EXPECT_NE(Message(*c).find(absl::StrCat("claims ", len, " bytes")), std::string::npos)
        << Message(*c);
  }
  // Exactly kMaxOpBytes is a legal length (trailing zero bytes are not a
  // valid OpSpec field, so it is refused as unparsable, not as too long).
  s.Publish(7, valid, static_cast<uint32_t>(fastq::kMaxOpBytes));
  auto c = s.NextCompletion();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tag, 7u);
  EXPECT_EQ(Message(*c).find("claims"), std::string::npos) << Message(*c);

  EXPECT_EQ(s.q().header->sq_head.v.load(), s.tail());
  EXPECT_EQ(s.q().header->closed.v.load(), 0u);
  auto listed = Listed(s.stub(), s.name());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(*listed) << "the session was closed for a bad entry";
  ExpectValidOpWorks(s, 2, 1);
}

TEST(FastPathUntrustedQueueTest, GarbageBytesAreInvalidArgument) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RawSession s(**daemon, "raw-garbage");
  ASSERT_OK(s.Attach());
  ASSERT_OK(s.MapQueue());
  ASSERT_OK(s.JoinSolo("raw-garbage"));
  // 0xff...: a varint tag that never ends; then an end-group tag that closes
  // nothing; then a length-delimited field longer than the entry.
  const std::vector<std::string> garbage = {std::string(100, '\xff'), std::string("\x0c", 1),
                                            std::string("\x0a\x7f" "abc", 5)};
  uint64_t tag = 50;
  for (const std::string& g : garbage) {
    s.Publish(tag, g);
    auto c = s.NextCompletion();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->tag, tag);
    EXPECT_EQ(c->code, kInvalidArgument) << Message(*c);
    EXPECT_EQ(c->sequence, -1);
    EXPECT_NE(Message(*c).find("not a serialized OpSpec"), std::string::npos) << Message(*c);
    ++tag;
  }
  // A well-formed OpSpec naming a mesh that does not exist: the engine's
  // error, as on the gRPC path.
  v1::OpSpec unknown;
  unknown.set_mesh_id("m-does-not-exist");
  unknown.set_kind(v1::BARRIER);
  s.Publish(tag, unknown.SerializeAsString());
  auto c = s.NextCompletion();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tag, tag);
  EXPECT_NE(c->code, 0);
  EXPECT_EQ(c->sequence, -1);

  EXPECT_EQ(s.q().header->closed.v.load(), 0u);
  auto listed = Listed(s.stub(), s.name());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(*listed);
  ExpectValidOpWorks(s, 99, 0);
}

struct Corruption {
  const char* name;
  void (*apply)(RawSession&);
};

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

class FastPathCorruptQueueTest : public ::testing::TestWithParam<Corruption> {};

// Impossible counters: the daemon closes that session (and only it); the
// daemon and its other sessions go on.
TEST_P(FastPathCorruptQueueTest, ClosesThatSessionOnly) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // Closed before the daemon is stopped (a connected client that never
  // hangs up holds the daemon's gRPC shutdown for its 5 s grace period).
  auto bad_owner = std::make_unique<RawSession>(**daemon, "raw-bad");
  auto good_owner = std::make_unique<RawSession>(**daemon, "raw-good");
  RawSession& bad = *bad_owner;
  RawSession& good = *good_owner;
  for (RawSession* s : {&bad, &good}) {
    ASSERT_OK(s->Attach());
    ASSERT_OK(s->MapQueue());
  }
  ASSERT_OK(bad.JoinSolo("raw-bad"));
  ASSERT_OK(good.JoinSolo("raw-good"));
  ExpectValidOpWorks(bad, 1, 0);
  ExpectValidOpWorks(good, 1, 0);

  GetParam().apply(bad);

  // Gone from ListSessions within a deadline.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool listed = true;
  while (listed && absl::Now() < deadline) {
    auto l = Listed(good.stub(), bad.name());
    ASSERT_TRUE(l.ok()) << l.status();
    listed = *l;
    if (listed) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(listed) << "the daemon kept serving a session with impossible counters";
  // The other session and the daemon are fine.
  auto good_listed = Listed(good.stub(), good.name());
  ASSERT_TRUE(good_listed.ok());
  EXPECT_TRUE(*good_listed);
  EXPECT_EQ(good.q().header->closed.v.load(), 0u);
  ExpectValidOpWorks(good, 2, 1);
  EXPECT_TRUE(HealthServing(**daemon));
  // A fresh SDK client on the fast path works too.
  auto results = RunAll({WorkerArgs(**daemon, "after", 2, 0, {"--mode=ops"}),
                         WorkerArgs(**daemon, "after", 2, 1, {"--mode=ops"})},
                        kFinish);
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "FAST", "value"), "1") << r.output;
    EXPECT_EQ(Field(r.output, "PSUM", "values"), "3,6,9,12,15,18,21,24") << r.output;
  }
  bad_owner.reset();
  good_owner.reset();
  ChildResult stop = (*daemon)->Stop();
  EXPECT_FALSE(stop.timed_out) << stop.output;
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  EXPECT_NE(stop.output.find("fast_path_corrupt"), std::string::npos) << stop.output;
}

INSTANTIATE_TEST_SUITE_P(
    Counters, FastPathCorruptQueueTest,
    ::testing::Values(
        Corruption{"SqTailFarAhead",
                   [](RawSession& s) {
                     auto& h = *s.q().header;
                     h.sq_tail.v.store(h.sq_head.v.load() + 1000);
                     fastq::Ring(h.daemon_bell, h.daemon_sleeping);
                   }},
        Corruption{"SqTailBehindHead",
                   [](RawSession& s) {
                     auto& h = *s.q().header;
                     h.sq_tail.v.store(h.sq_head.v.load() - 1);
                     fastq::Ring(h.daemon_bell, h.daemon_sleeping);
                   }},
        Corruption{"CqHeadAheadOfCompletions",
                   [](RawSession& s) {
                     auto& h = *s.q().header;
                     h.cq_head.v.store(h.cq_tail.v.load() + 1000);
                     fastq::Ring(h.daemon_bell, h.daemon_sleeping);
                   }}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

// When the daemon stops serving a queue whose counters are impossible, it
// sets the header's `closed` word and rings the client's bell, so a waiting
// client learns at once.
TEST(FastPathUntrustedQueueTest, AQueueTheDaemonStopsServingIsMarkedClosed) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RawSession s(**daemon, "raw-closed");
  ASSERT_OK(s.Attach());
  ASSERT_OK(s.MapQueue());
  auto& h = *s.q().header;
  const uint32_t bell = h.client_bell.v.load();
  h.sq_tail.v.store(h.sq_head.v.load() + 1000);
  fastq::Ring(h.daemon_bell, h.daemon_sleeping);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (h.closed.v.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  auto listed = Listed(s.stub(), s.name());
  ASSERT_TRUE(listed.ok());
  EXPECT_FALSE(*listed) << "the session should have been closed";
  EXPECT_EQ(h.closed.v.load(), 1u) << "the daemon stopped serving but did not say so";
  EXPECT_NE(h.client_bell.v.load(), bell) << "a sleeping client was not woken";
}

TEST(FastPathSideChannelTest, QueueNeedsAttachAndIsGivenOnce) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  RawSession s(**daemon, "raw-side");
  // QUEUE before ATTACH.
  auto reply = s.Request("QUEUE");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(absl::StartsWith(reply->data, absl::StrCat("ERR ", kFailedPrecondition, " ")))
      << reply->data;
  EXPECT_FALSE(reply->fd.valid());
  // The connection is still usable: attach, then QUEUE works once.
  ASSERT_OK(s.Attach());
  ASSERT_OK(s.MapQueue());
  reply = s.Request("QUEUE");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(absl::StartsWith(reply->data, absl::StrCat("ERR ", kFailedPrecondition, " ")))
      << reply->data;
  EXPECT_FALSE(reply->fd.valid());
  // Malformed variants are refused as such.
  reply = s.Request("QUEUE now");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(absl::StartsWith(reply->data, absl::StrCat("ERR ", kInvalidArgument, " ")))
      << reply->data;
  // The first queue still serves.
  ASSERT_OK(s.JoinSolo("raw-side"));
  ExpectValidOpWorks(s, 5, 0);
}

// ---------------------------------------------------------------------------
// Idle costs no CPU
// ---------------------------------------------------------------------------

TEST(FastPathIdleTest, IdleClientsAndDaemonUseNoCpu) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  std::vector<std::unique_ptr<Child>> members;
  for (int i = 0; i < 2; ++i) {
    auto c = Child::Start(WorkerArgs(**daemon, "idle", 2, i, {"--mode=idle", "--idle-ms=1800"}));
    ASSERT_TRUE(c.ok()) << c.status();
    members.push_back(*std::move(c));
  }
  const double tick_ms = 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  // Measures `pids`' CPU over ~1 s; returns each one's share of the wall time.
  auto measure = [&](const std::vector<pid_t>& pids) {
    std::vector<int64_t> before;
    for (pid_t p : pids) before.push_back(CpuTicks(p));
    const absl::Time t0 = absl::Now();
    absl::SleepFor(absl::Seconds(1));
    std::vector<double> share;
    const double wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    for (size_t k = 0; k < pids.size(); ++k) {
      const int64_t after = CpuTicks(pids[k]);
      EXPECT_GE(before[k], 0);
      EXPECT_GE(after, before[k]);
      share.push_back(static_cast<double>(after - before[k]) * tick_ms / wall_ms);
    }
    return share;
  };
  // Phase 1: connected, 20 ops done, nobody submits.
  for (auto& m : members) {
    ASSERT_TRUE(m->WaitForOutput("IDLE_BEGIN", kStartup)) << m->output();
  }
  std::vector<double> idle =
      measure({(*daemon)->pid(), members[0]->pid(), members[1]->pid()});
  EXPECT_LT(idle[0], 0.2) << "the daemon burns CPU with idle fast-path sessions";
  EXPECT_LT(idle[1], 0.2) << "an idle client burns CPU";
  EXPECT_LT(idle[2], 0.2) << "an idle client burns CPU";
  // Phase 2: member 0 waits in a psum that member 1 submits late.
  ASSERT_TRUE(members[1]->WaitForOutput("DELAY_BEGIN", kStartup)) << members[1]->output();
  std::vector<double> waiting = measure({(*daemon)->pid(), members[0]->pid()});
  EXPECT_LT(waiting[0], 0.2) << "the daemon burns CPU while an op waits for a member";
  EXPECT_LT(waiting[1], 0.2) << "a client waiting for an op burns CPU";
  for (auto& m : members) {
    ChildResult r = m->Wait(kFinish);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "WAITED", "code"), "OK") << r.output;
  }
  const std::string out0 = members[0]->output();
  const int64_t wall_ms = Int(Field(out0, "WAITED", "wall_ms"));
  const int64_t cpu_ms = Int(Field(out0, "WAITED", "cpu_ms"));
  EXPECT_GE(wall_ms, 1000) << out0;  // it really waited
  EXPECT_GE(cpu_ms, 0) << out0;
  EXPECT_LT(static_cast<double>(cpu_ms), 0.2 * static_cast<double>(wall_ms)) << out0;
  std::printf("idle: daemon %.1f%%, clients %.1f%% %.1f%%; waiting: daemon %.1f%%, client "
              "%.1f%%; waiter's own CPU %lld ms in %lld ms\n",
              100 * idle[0], 100 * idle[1], 100 * idle[2], 100 * waiting[0], 100 * waiting[1],
              static_cast<long long>(cpu_ms), static_cast<long long>(wall_ms));
}

// ---------------------------------------------------------------------------
// Daemon shutdown while a fast-path op waits
// ---------------------------------------------------------------------------

TEST(FastPathShutdownTest, SigtermFailsAWaitingFastPathOpPromptly) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto waiter = Child::Start(WorkerArgs(**daemon, "shutdown", 2, 0, {"--mode=wait"}));
  auto staller =
      Child::Start(WorkerArgs(**daemon, "shutdown", 2, 1, {"--mode=stall", "--idle-ms=60000"}));
  ASSERT_TRUE(waiter.ok() && staller.ok());
  ASSERT_TRUE((*staller)->WaitForOutput("READY", kStartup)) << (*staller)->output();
  ASSERT_TRUE((*waiter)->WaitForOutput("SUBMITTED", kStartup)) << (*waiter)->output();
  EXPECT_EQ(Field((*waiter)->output(), "READY", "fast"), "1") << (*waiter)->output();
  // The daemon takes it and waits for member 1: no result.
  EXPECT_FALSE((*waiter)->WaitForOutput("RESULT", absl::Milliseconds(300)))
      << (*waiter)->output();

  const absl::Time t0 = absl::Now();
  ASSERT_EQ(kill((*daemon)->pid(), SIGTERM), 0);
  ASSERT_TRUE((*waiter)->WaitForOutput("AFTER", absl::Seconds(20))) << (*waiter)->output();
  const absl::Duration told = absl::Now() - t0;
  EXPECT_LT(told, absl::Seconds(5)) << "the waiting client was not told promptly";
  ChildResult r = (*waiter)->Wait(kFinish);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Field(r.output, "RESULT", "code"), "UNAVAILABLE") << r.output;
  EXPECT_NE(Field(r.output, "RESULT", "msg").find("SIGTERM"), std::string::npos) << r.output;
  // The next op fails at once too, instead of waiting for its deadline.
  EXPECT_EQ(Field(r.output, "AFTER", "code"), "UNAVAILABLE") << r.output;
  EXPECT_LT(Int(Field(r.output, "AFTER", "after_ms")), 2000) << r.output;
  // The daemon exits cleanly (once its last client is gone: a connected
  // client holds its gRPC shutdown for a grace period).
  (*staller)->Signal(SIGKILL);
  (*staller)->Wait(kFinish);
  ChildResult stop = (*daemon)->Stop();
  EXPECT_FALSE(stop.timed_out) << stop.output;
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  std::printf("SIGTERM: waiting fast-path client told after %lld ms\n",
              static_cast<long long>(absl::ToInt64Milliseconds(told)));
}

// ---------------------------------------------------------------------------
// OpFuture::timing()
// ---------------------------------------------------------------------------

struct Stamps {
  int64_t submitted, taken, matched, ready, started, launched, executed, completed, reaped,
      device;
};

Stamps ParseStamps(const std::string& out, const std::string& tag) {
  return Stamps{Int(Field(out, tag, "submitted")), Int(Field(out, tag, "taken")),
                Int(Field(out, tag, "matched")),   Int(Field(out, tag, "ready")),
                Int(Field(out, tag, "started")),   Int(Field(out, tag, "launched")),
                Int(Field(out, tag, "executed")),  Int(Field(out, tag, "completed")),
                Int(Field(out, tag, "reaped")),    Int(Field(out, tag, "device"))};
}

TEST(FastPathTimingTest, FastPathOpsAreStampedInOrderGrpcOpsNot) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const int64_t begin_ns = MonotonicNs();
  auto results = RunAll({WorkerArgs(**daemon, "timing", 2, 0, {"--mode=timing", "--fast=1"}),
                         WorkerArgs(**daemon, "timing", 2, 1, {"--mode=timing", "--fast=0"})},
                        kFinish);
  const int64_t end_ns = MonotonicNs();
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Field(r.output, "BARRIER", "code"), "OK") << r.output;
  }
  {
    const std::string& out = results[0].output;
    ASSERT_EQ(Field(out, "FAST", "value"), "1") << out;
    EXPECT_EQ(Field(out, "TIMING", "code"), "OK") << out;
    const Stamps t = ParseStamps(out, "TIMING");
    EXPECT_GT(t.submitted, 0) << out;
    EXPECT_GE(t.submitted, begin_ns) << out;  // CLOCK_MONOTONIC, shared by the processes
    EXPECT_LE(t.submitted, t.taken) << out;
    // Its turn came once the other member's op was there too; no member
    // orders it with a stream, so its inputs were ready then.
    EXPECT_LE(t.taken, t.matched) << out;
    EXPECT_EQ(t.ready, t.matched) << out;
    EXPECT_LE(t.ready, t.started) << out;
    EXPECT_LE(t.started, t.executed) << out;
    EXPECT_LE(t.executed, t.completed) << out;
    EXPECT_LE(t.completed, t.reaped) << out;
    // A CPU op: nothing launched on a GPU.
    EXPECT_EQ(t.launched, 0) << out;
    EXPECT_EQ(t.device, 0) << out;
    EXPECT_LE(t.reaped, end_ns) << out;
    // An op the daemon refused when it took it: never started.
    EXPECT_EQ(Field(out, "BAD_TIMING", "code"), "INVALID_ARGUMENT") << out;
    const Stamps b = ParseStamps(out, "BAD_TIMING");
    EXPECT_GT(b.submitted, t.reaped) << out;
    EXPECT_LE(b.submitted, b.taken) << out;
    EXPECT_EQ(b.started, 0) << out;
    EXPECT_EQ(b.matched, 0) << out;
    EXPECT_EQ(b.executed, 0) << out;
    EXPECT_LE(b.taken, b.completed) << out;
    EXPECT_LE(b.completed, b.reaped) << out;
    EXPECT_LE(b.reaped, end_ns) << out;
  }
  {
    const std::string& out = results[1].output;
    ASSERT_EQ(Field(out, "FAST", "value"), "0") << out;
    EXPECT_EQ(Field(out, "TIMING", "code"), "OK") << out;
    EXPECT_EQ(Rest(out, "TIMING"),
              "code=OK submitted=0 taken=0 matched=0 ready=0 started=0 launched=0 executed=0 "
              "completed=0 reaped=0 device=0")
        << out;
    EXPECT_EQ(Rest(out, "BAD_TIMING"),
              "code=INVALID_ARGUMENT submitted=0 taken=0 matched=0 ready=0 started=0 launched=0 "
              "executed=0 completed=0 reaped=0 device=0")
        << out;
  }
}

}  // namespace
}  // namespace collectived::testing
