// Member-side small ops (common/member_ops.h) against real daemons, each
// member its own SDK client:
//  - results are bit for bit the daemon path's (a daemon started with
//    --member_op_bytes=0), for every kind this path runs, several dtypes and
//    awkward values, groups over one axis of two; and the daemon ran none of
//    them (GetStats);
//  - small and big, synchronous and asynchronous ops interleave in one
//    program and keep its order;
//  - ops that differ fail on every member with the daemon's
//    FAILED_PRECONDITION and the mesh goes on; an invalid op is refused
//    without taking a place in the op order;
//  - a member that does not come is named (DEADLINE_EXCEEDED) and a member
//    that goes away breaks the mesh (ABORTED naming it), waking the waiters;
//  - an all_gather into a buffer the mesh shares is written by each member
//    once, at any size; a member naming another region sends every member
//    to the daemon, which refuses it before anything is written;
//  - a member that scribbles over its segment hurts only its own mesh;
//  - all_gathers and reductions whose members read each other's inputs
//    (member_reads.cc) equal the daemon path's, an owner's input is read
//    before its op returns (and a result in place waits until then), a
//    member's buffer goes read-only to the other members of its mesh only,
//    and COLLECTIVED_MEMBER_READS is obeyed.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectived/client.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "client/src/member_ops.h"
#include "common/cpu_mask.h"
#include "common/member_ops.h"
#include "tests/ctl/sdk_members.h"
#include "tests/harness/harness.h"
#include "tests/harness/raw_session.h"

namespace collectived::testing {
namespace {

// EXPECT_THAT(text, HasSubstr(part)) without gmock.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_TRUE(absl::StrContains(text, part)) << "'" << (text) << "' lacks '" << (part) << "'"

constexpr size_t kBufferBytes = 1 << 20;

// Runs `op(i)` on every member at once; the statuses.
std::vector<absl::Status> OnAll(int n, const std::function<absl::Status(int)>& op) {
  std::vector<absl::Status> st(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { st[i] = op(i); });
  for (auto& t : threads) t.join();
  return st;
}

void ExpectAllOk(const std::vector<absl::Status>& st) {
  for (size_t i = 0; i < st.size(); ++i) EXPECT_TRUE(st[i].ok()) << "member " << i << ": " << st[i];
}

v1::GetStatsResponse Stats(const Daemon& d) {
  return Ask(d, &v1::Collective::Stub::GetStats, v1::GetStatsRequest());
}

// Ops the daemon completed, all kinds together (GetStats).
int64_t DaemonOps(const Daemon& d) {
  const v1::GetStatsResponse s = Stats(d);
  return s.ops_completed() + s.ops_failed();
}

// The daemon's pending ops (every mesh: empty id).
v1::ListPendingOpsResponse Pending(const Daemon& d, const std::string& mesh_id = "") {
  v1::ListPendingOpsRequest req;
  req.set_mesh_id(mesh_id);
  return Ask(d, &v1::Collective::Stub::ListPendingOps, req);
}

// One mesh of `n` members on a daemon, with in/out buffers per member.
struct Members {
  std::unique_ptr<Daemon> daemon;
  SdkMembers m;
  std::vector<Buffer> out;

  static std::unique_ptr<Members> Start(int n, std::vector<std::string> flags,
                                        const std::string& name = "mops",
                                        size_t bytes = kBufferBytes) {
    auto r = std::make_unique<Members>();
    auto d = Daemon::Start(std::move(flags));
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    r->daemon = *std::move(d);
    absl::Status st = MakeSdkMembers(r->daemon->socket(), name, n, bytes, &r->m);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return nullptr;
    for (int i = 0; i < n; ++i) {
      auto b = r->m.clients[i]->Allocate(bytes);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) return nullptr;
      r->out.push_back(*std::move(b));
    }
    return r;
  }
  Mesh& mesh(int i) { return *m.meshes[i]; }
  uint8_t* in(int i) { return static_cast<uint8_t*>(m.buffers[i].data()); }
  uint8_t* out_data(int i) { return static_cast<uint8_t*>(out[i].data()); }
};

// Bytes that exercise a dtype: NaNs, signed zeros, subnormals, extremes,
// random patterns.
void Fill(uint8_t* p, size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(rng());
  if (bytes >= 16) {
    const float specials[4] = {-0.0f, std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::quiet_NaN(), 1e38f};
    std::memcpy(p, specials, sizeof(specials));
  }
}

struct Case {
  CollectiveKind kind;
  DType dtype;
  int64_t elems;
};

absl::Status RunCase(Mesh& mesh, const Buffer& in, const Buffer& out, const Case& c,
                     const AxisNames& axes) {
  Collective op;
  op.kind = c.kind;
  op.x = Array{&in, 0, c.dtype, {c.elems}};
  op.axes = axes;
  if (c.kind == CollectiveKind::kAllGather) {
    op.out = Array{&out, 0, c.dtype, {c.elems * mesh.axis_size(axes)}};
    op.tiled = true;
  } else if (c.kind != CollectiveKind::kBarrier) {
    // Big enough for every result dtype (pmean of integers widens).
    op.out = Array{&out, 0, DType::kU8, {c.elems * 8}};
  }
  return mesh.run(op);
}

// Four members on axes {a: 2, b: 2} (ops over one axis are groups of two),
// each with an input and an output buffer of `bytes`.
std::unique_ptr<Members> StartTwoByTwo(std::vector<std::string> flags,
                                       size_t bytes = kBufferBytes) {
  constexpr int kN = 4;
  auto r = std::make_unique<Members>();
  auto d = Daemon::Start(std::move(flags));
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  r->daemon = *std::move(d);
  for (int i = 0; i < kN; ++i) {
    auto c = Client::Connect({.socket_path = r->daemon->socket(),
                              .client_name = absl::StrCat("eq-", i)});
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    r->m.clients.push_back(*std::move(c));
  }
  std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> joined(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      joined[i] = r->m.clients[i]->JoinMesh(
          {.name = "eq", .axes = {{"a", 2}, {"b", 2}}, .coordinate = {i / 2, i % 2}});
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(joined[i].ok()) << joined[i].status();
    if (!joined[i].ok()) return nullptr;
    r->m.meshes.push_back(*std::move(joined[i]));
    r->m.buffers.push_back(*r->m.clients[i]->Allocate(bytes));
    r->out.push_back(*r->m.clients[i]->Allocate(bytes));
  }
  return r;
}

TEST(MemberOpsTest, ResultsEqualTheDaemonPathAndTheDaemonRunsNone) {
  constexpr int kN = 4;
  auto start = [](std::vector<std::string> flags) { return StartTwoByTwo(std::move(flags)); };
  auto member_side = start({});
  auto daemon_side = start({"--member_op_bytes=0"});
  ASSERT_NE(member_side, nullptr);
  ASSERT_NE(daemon_side, nullptr);
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(member_side->mesh(i).member_side().ok()) << member_side->mesh(i).member_side();
    EXPECT_EQ(daemon_side->mesh(i).member_side().code(), absl::StatusCode::kUnavailable);
    EXPECT_CONTAINS(daemon_side->mesh(i).member_side().message(), "--member_op_bytes=0");
  }

  std::vector<Case> cases;
  for (CollectiveKind k : {CollectiveKind::kPsum, CollectiveKind::kPmean, CollectiveKind::kPmax,
                           CollectiveKind::kPmin, CollectiveKind::kAllGather}) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI8,
                     DType::kF64}) {
      for (int64_t elems : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000}}) {
        cases.push_back({k, dt, elems});
      }
    }
  }
  cases.push_back({CollectiveKind::kBarrier, DType::kF32, 0});
  const std::vector<AxisNames> axes_list = {AxisNames::All(), AxisNames("b"), AxisNames::None()};
  const int64_t daemon_ops_before = DaemonOps(*member_side->daemon);
  uint32_t seed = 1;
  for (const Case& c : cases) {
    for (const AxisNames& axes : axes_list) {
      ++seed;
      for (Members* r : {member_side.get(), daemon_side.get()}) {
        for (int i = 0; i < kN; ++i) {
          Fill(r->in(i), kBufferBytes / 64, seed * 31 + i);
          std::memset(r->out_data(i), 0xAB, kBufferBytes / 8);
        }
        ExpectAllOk(OnAll(kN, [&](int i) {
          return RunCase(r->mesh(i), r->m.buffers[i], r->out[i], c, axes);
        }));
      }
      if (c.kind != CollectiveKind::kBarrier) {
        // The result is there (not the fill the outputs started with).
        const std::vector<uint8_t> fill(DTypeSize(c.dtype) * c.elems, 0xAB);
        for (int i = 0; i < kN; ++i) {
          ASSERT_NE(std::memcmp(member_side->out_data(i), fill.data(), fill.size()), 0)
              << "kind " << static_cast<int>(c.kind) << " member " << i << ": nothing written";
        }
      }
      for (int i = 0; i < kN; ++i) {
        ASSERT_EQ(std::memcmp(member_side->out_data(i), daemon_side->out_data(i), kBufferBytes / 8),
                  0)
            << "kind " << static_cast<int>(c.kind) << " dtype " << static_cast<int>(c.dtype)
            << " elems " << c.elems << " member " << i;
      }
    }
  }
  // Every member took its mesh's segment: the daemon's polling threads
  // leave their CPUs alone (FastPath's SpinBudget).
  EXPECT_EQ(Stats(*member_side->daemon).member_side_sessions(), kN);
  EXPECT_EQ(Stats(*daemon_side->daemon).member_side_sessions(), 0);
  // Every op above fits the default 64 KiB: none went through the daemon.
  EXPECT_EQ(DaemonOps(*member_side->daemon), daemon_ops_before);
  EXPECT_GT(DaemonOps(*daemon_side->daemon), 0);
  // The daemon shows what the members report: every op, on every member.
  const int64_t ran = static_cast<int64_t>(cases.size() * axes_list.size());
  EXPECT_EQ(Stats(*member_side->daemon).member_side_ops(), ran);
  {
    auto stub = Stub(*member_side->daemon);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::DescribeMeshRequest req;
    req.set_mesh_id(member_side->mesh(0).id());
    v1::MeshInfo info;
    ASSERT_TRUE(stub->DescribeMesh(&ctx, req, &info).ok());
    EXPECT_EQ(info.member_side_ops(), ran);
    ASSERT_EQ(info.members_size(), kN);
    for (const v1::Member& m : info.members()) EXPECT_EQ(m.member_side_ops(), ran) << m.index();
  }
}

// The daemon counts the sessions whose members poll member-side while they
// are open (GetStats.member_side_sessions; its queue threads poll only on
// the CPUs left).
TEST(MemberOpsTest, SessionsThatPollMemberSideAreCountedWhileOpen) {
  auto r = Members::Start(2, {}, "counted");
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->mesh(0).member_side().ok()) << r->mesh(0).member_side();
  ExpectAllOk(OnAll(2, [&](int i) { return r->mesh(i).barrier(); }));
  EXPECT_EQ(Stats(*r->daemon).member_side_sessions(), 2);
  r->out.pop_back();
  r->m.meshes.pop_back();
  r->m.buffers.pop_back();
  r->m.clients.pop_back();  // member 1's session closes
  int32_t counted = -1;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(5))) {
    counted = Stats(*r->daemon).member_side_sessions();
    if (counted == 1) break;
  }
  EXPECT_EQ(counted, 1) << "member 1's session closed";
}

TEST(MemberOpsLayoutTest, EverySegmentFitsItsLimitAndReadsBack) {
  std::vector<uint8_t> region(member_ops::kMaxSegmentBytes);
  for (uint32_t members : {1u, 2u, 3u, 17u, 255u, 1000u, 3404u, 4096u}) {
    for (uint64_t payload : {uint64_t{64}, uint64_t{4096}, uint64_t{16384}, uint64_t{65536},
                             uint64_t{1} << 24}) {
      const member_ops::Layout l = member_ops::Layout::For(members, payload);
      if (l.total_bytes == 0) continue;  // too many members for any payload
      EXPECT_LE(l.total_bytes, member_ops::kMaxSegmentBytes) << members << " x " << payload;
      EXPECT_GE(l.payload_bytes, member_ops::kMinPayload);
      EXPECT_LE(l.payload_bytes, payload);
      EXPECT_GE(l.entry_offset, l.slot_offset + members * sizeof(member_ops::Slot));
      std::fill(region.begin(), region.begin() + 4096, 0);
      member_ops::Init(region.data(), l, 1000, "code");
      const member_ops::Layout back = member_ops::ValidLayout(region.data(), l.total_bytes, members);
      EXPECT_EQ(back.total_bytes, l.total_bytes) << members << " x " << payload;
      // A header that claims another layout, or another mesh size, is refused.
      EXPECT_EQ(member_ops::ValidLayout(region.data(), l.total_bytes, members + 1).total_bytes, 0u);
      reinterpret_cast<member_ops::Header*>(region.data())->entry_offset += 64;
      EXPECT_EQ(member_ops::ValidLayout(region.data(), l.total_bytes, members).total_bytes, 0u);
    }
  }
  EXPECT_GT(member_ops::Layout::For(3404, 16384).total_bytes, 0u);
}

// The daemon names the op a member waits in from its entry's signature,
// whichever place of the op it is.
TEST(MemberOpsLayoutTest, PlaceSignaturesNameTheirOp) {
  using member_ops::NameOfPlace;
  const std::string op = "psum f32[1024] over (i)";
  const std::vector<std::pair<std::string, std::string>> places = {
      {op, ""},
      {absl::StrCat("read: ", op), "reading the members' buffers"},
      {absl::StrCat("done: read: ", op), "confirming the reads of the members' buffers"},
      {absl::StrCat("probe: ", op), "asking whether the members read each other's buffers"},
      {absl::StrCat("done: probe: ", op), "asking whether the members read each other's buffers"},
      {absl::StrCat("written: ", op), "confirming the result written"},
      {absl::StrCat("reduced: ", op), "confirming its share of the result reduced"},
      {absl::StrCat("done: ", op), "confirming"},
  };
  for (const auto& [signature, stage] : places) {
    EXPECT_EQ(NameOfPlace(signature).op, op) << signature;
    EXPECT_EQ(NameOfPlace(signature).stage, stage) << signature;
  }
  // A prefix alone, or a scribble, is shown as it is.
  EXPECT_EQ(NameOfPlace("read: ").op, "");
  EXPECT_EQ(NameOfPlace("reading").op, "reading");
  EXPECT_EQ(NameOfPlace("reading").stage, "");
}

// A segment whose code identity is not this SDK's (a daemon of another
// version or build) is not used: the member takes the daemon path, and says
// why, naming both.
TEST(MemberOpsLayoutTest, ASegmentOfOtherCodeIsNotUsed) {
  const member_ops::Layout l = member_ops::Layout::For(2, 4096);
  ASSERT_GT(l.total_bytes, 0u);
  const int fd = memfd_create("other-code", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(l.total_bytes)), 0);
  void* base = mmap(nullptr, l.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(base, MAP_FAILED);
  member_ops::Init(base, l, 1000, "0.0.0-someoneelse");
  munmap(base, l.total_bytes);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  MeshShape shape;
  shape.names = {"x"};
  shape.sizes = {2};
  auto ops = internal::MemberOps::Map(
      fd, l.total_bytes, shape, 0, absl::Seconds(1), pair[0],
      [](uint32_t, uint32_t) -> absl::StatusOr<bool> { return false; });
  close(pair[1]);
  ASSERT_FALSE(ops.ok());
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kFailedPrecondition) << ops.status();
  EXPECT_CONTAINS(ops.status().message(), "0.0.0-someoneelse");
  EXPECT_CONTAINS(ops.status().message(), "goes through the daemon");
}

TEST(MemberOpsTest, SmallBigSyncAndAsyncOpsKeepTheProgramOrder) {
  constexpr int kN = 3;
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  // Each step adds the members' inputs in place; the next reads the result.
  // Small (member-side), big (128 KiB: the daemon), and asynchronous ones
  // (always the daemon); member 1 makes some steps asynchronous where the
  // others do not, so at those places it goes to the daemon alone first.
  constexpr int kSteps = 40;
  for (int i = 0; i < kN; ++i) {
    float* x = reinterpret_cast<float*>(r->in(i));
    for (int e = 0; e < 32768; ++e) x[e] = 1.0f;
  }
  const std::vector<absl::Status> st = OnAll(kN, [&](int i) -> absl::Status {
    Array small = Array::Of<float>(r->m.buffers[i], {16});
    Array big = Array::Of<float>(r->m.buffers[i], {32768});
    for (int step = 0; step < kSteps; ++step) {
      const Array& x = step % 3 == 2 ? big : small;
      absl::Status s;
      if (step % 4 == 1 && (i == 1 || step % 8 == 1)) {
        OpFuture f = r->mesh(i).psum_async(x, "x");
        // A second op while the first is in flight: must go after it.
        if (step % 8 == 5) {
          s = r->mesh(i).psum(small, "x");
          if (!s.ok()) return s;
          s = f.Wait();
        } else {
          s = f.Wait();
        }
      } else {
        s = r->mesh(i).psum(x, "x");
        if (step % 8 == 5) {
          if (s.ok()) s = r->mesh(i).psum(small, "x");
        }
      }
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
    }
    return absl::OkStatus();
  });
  ExpectAllOk(st);
  EXPECT_GT(DaemonOps(*r->daemon), 0) << "the big and asynchronous ops went through the daemon";
  // The value every member holds is the same program's, computed here.
  std::vector<double> small(16, 1.0), big(32768, 1.0);
  for (int step = 0; step < kSteps; ++step) {
    if (step % 3 == 2) {
      for (double& v : big) v *= kN;
      for (int e = 0; e < 16; ++e) small[e] = big[e];
    } else {
      for (double& v : small) v *= kN;
      for (int e = 0; e < 16; ++e) big[e] = small[e];
    }
    if (step % 8 == 5) {
      for (double& v : small) v *= kN;
      for (int e = 0; e < 16; ++e) big[e] = small[e];
    }
  }
  for (int i = 0; i < kN; ++i) {
    const float* x = reinterpret_cast<const float*>(r->in(i));
    EXPECT_EQ(x[0], static_cast<float>(big[0])) << "member " << i;
    EXPECT_EQ(x[15], static_cast<float>(big[15])) << "member " << i;
    EXPECT_EQ(x[32767], static_cast<float>(big[32767])) << "member " << i;
  }
}

TEST(MemberOpsTest, DifferingOpsFailEverywhereAndTheMeshGoesOn) {
  constexpr int kN = 2;
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  // After a loop of agreeing ops (which leaves each entry's signature in
  // place, and each member's finding that the others' equal its own), one
  // member changes its op to one of the same size (so only the signatures
  // can tell them apart), at either parity of the place: 16 B go through
  // the segment (one place an op: 2 or 3 ops before), 1 KiB are read from
  // the members' buffers where each member has a CPU (two places an op:
  // one 16 B op before flips the parity).
  const bool reads = UsableCpus() >= kN;
  for (int64_t n : {4, 256}) {
    for (int agreeing : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(agreeing, " agreeing ops of ", n, " floats before"));
      if (n == 256 && agreeing == 3) {
        ExpectAllOk(OnAll(kN, [&](int i) {
          return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {4}), "x");
        }));
      }
      const uint64_t reads_before = r->mesh(0).member_side_paths().reads;
      for (int k = 0; k < agreeing; ++k) {
        ExpectAllOk(OnAll(kN, [&](int i) {
          return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {n}), "x");
        }));
      }
      if (n == 256 && reads) {
        EXPECT_EQ(r->mesh(0).member_side_paths().reads - reads_before,
                  static_cast<uint64_t>(agreeing))
            << "1 KiB psums read the members' buffers";
      }
      const std::vector<absl::Status> st = OnAll(kN, [&](int i) {
        const std::vector<int64_t> shape =
            i == 0 ? std::vector<int64_t>{n} : std::vector<int64_t>{n / 2, 2};
        return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], shape), "x");
      });
      for (int i = 0; i < kN; ++i) {
        EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << st[i];
        EXPECT_CONTAINS(st[i].message(), absl::StrCat("f32[", n, "]"));
        EXPECT_CONTAINS(st[i].message(), absl::StrCat("f32[", n / 2, ",2]"));
      }
    }
  }
  const std::vector<absl::Status> st = OnAll(kN, [&](int i) {
    return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {i == 0 ? 4 : 8}), "x");
  });
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << st[i];
    EXPECT_CONTAINS(st[i].message(), "f32[4]");
    EXPECT_CONTAINS(st[i].message(), "f32[8]");
  }
  // An invalid op is refused on its own member without taking a place.
  absl::Status bad = r->mesh(0).psum(Array::Of<float>(r->m.buffers[0], {4}), "no_such_axis");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  // So is an op on a buffer of another client's session (the daemon's
  // NOT_FOUND, not a member-side result).
  bad = r->mesh(0).psum(Array::Of<float>(r->m.buffers[1], {4}), "x");
  EXPECT_EQ(bad.code(), absl::StatusCode::kNotFound) << bad;
  const int64_t before = DaemonOps(*r->daemon);
  ExpectAllOk(OnAll(kN, [&](int i) {
    float* x = reinterpret_cast<float*>(r->in(i));
    for (int e = 0; e < 4; ++e) x[e] = static_cast<float>(i + 1);
    return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {4}), "x");
  }));
  EXPECT_EQ(reinterpret_cast<float*>(r->in(0))[3], 3.0f);
  EXPECT_EQ(reinterpret_cast<float*>(r->in(1))[0], 3.0f);
  EXPECT_EQ(DaemonOps(*r->daemon), before) << "the last psum ran member-side";
}

// An all_gather into a buffer the mesh shares runs member-side at any size
// (nothing goes through the segment): each member writes its own block, and
// every member's op returns once every block is written.
TEST(MemberOpsTest, AllGatherIntoASharedBufferIsWrittenByEachMemberOnce) {
  constexpr int kN = 4;
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  constexpr size_t kOffset = 64;  // the region starts inside the buffer
  constexpr size_t kSharedBytes = kOffset + kN * kBufferBytes + 4096;
  std::vector<Buffer> shared;
  for (int i = 0; i < kN; ++i) {
    auto b = r->mesh(i).AllocateShared(kSharedBytes);
    ASSERT_TRUE(b.ok()) << b.status();
    shared.push_back(*std::move(b));
  }
  auto shared_bytes = [&](int i) { return static_cast<const uint8_t*>(shared[i].data()); };
  // Whether the shared buffer holds only the fill outside [from, to).
  auto untouched_outside = [&](size_t from, size_t to) {
    for (size_t k = 0; k < kSharedBytes; ++k) {
      if ((k < from || k >= to) && shared_bytes(0)[k] != 0x5A) return false;
    }
    return true;
  };
  const int64_t daemon_ops_before = DaemonOps(*r->daemon);
  uint32_t seed = 7;
  // Up to the whole 1 MiB input: far past the segment's 64 KiB payload.
  int ops = 0;
  for (int64_t elems : {int64_t{1}, int64_t{1000}, int64_t{kBufferBytes / 4}}) {
    for (bool tiled : {true, false}) {
      for (int i = 0; i < kN; ++i) Fill(r->in(i), elems * 4, ++seed);
      std::memset(shared[0].data(), 0x5A, kSharedBytes);
      // What each member sees the moment its op returns: every block, even
      // the block of member 2, which comes last.
      std::vector<std::vector<uint8_t>> seen(kN);
      ExpectAllOk(OnAll(kN, [&](int i) {
        if (i == 2) absl::SleepFor(absl::Milliseconds(30));
        const std::vector<int64_t> shape =
            tiled ? std::vector<int64_t>{kN * elems} : std::vector<int64_t>{kN, elems};
        absl::Status st = r->mesh(i).all_gather(Array::Of<float>(r->m.buffers[i], {elems}),
                                                AxisNames::All(),
                                                Array{&shared[i], kOffset, DType::kF32, shape},
                                                {.axis = 0, .tiled = tiled});
        const uint8_t* region = shared_bytes(i) + kOffset;
        seen[i].assign(region, region + kN * elems * 4);
        return st;
      }));
      ++ops;
      // Bit for bit each owner's input.
      for (int reader = 0; reader < kN; ++reader) {
        for (int i = 0; i < kN; ++i) {
          ASSERT_EQ(std::memcmp(seen[reader].data() + i * elems * 4, r->in(i), elems * 4), 0)
              << "elems " << elems << " tiled " << tiled << " block " << i << " seen by "
              << reader;
        }
      }
      EXPECT_TRUE(untouched_outside(kOffset, kOffset + kN * elems * 4)) << elems;
    }
  }
  EXPECT_EQ(DaemonOps(*r->daemon), daemon_ops_before) << "the daemon ran some of them";
  // Each op counted once, though it took two places in the op order.
  EXPECT_EQ(Stats(*r->daemon).member_side_ops(), ops);

  // Member 3 names another region: every member goes to the daemon, which
  // refuses the op before anything is written.
  std::memset(shared[0].data(), 0x5A, kSharedBytes);
  const std::vector<absl::Status> st = OnAll(kN, [&](int i) {
    return r->mesh(i).all_gather(Array::Of<float>(r->m.buffers[i], {16}), AxisNames::All(),
                                 Array{&shared[i], i == 3 ? kOffset + 4096 : kOffset,
                                       DType::kF32, {kN * 16}},
                                 {.axis = 0, .tiled = true});
  });
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << st[i];
    EXPECT_CONTAINS(st[i].message(), "member 3 writes its result elsewhere");
  }
  EXPECT_TRUE(untouched_outside(0, 0));

  // Gathered along the second dimension, the blocks interleave: the daemon
  // writes it, as the result shows.
  for (int i = 0; i < kN; ++i) {
    float* x = reinterpret_cast<float*>(r->in(i));
    for (int e = 0; e < 6; ++e) x[e] = static_cast<float>(10 * i + e);
  }
  const int64_t before = DaemonOps(*r->daemon);
  ExpectAllOk(OnAll(kN, [&](int i) {
    return r->mesh(i).all_gather(Array::Of<float>(r->m.buffers[i], {2, 3}), AxisNames::All(),
                                 Array{&shared[i], kOffset, DType::kF32, {2, kN * 3}},
                                 {.axis = 1, .tiled = true});
  }));
  EXPECT_EQ(DaemonOps(*r->daemon), before + 1);
  const float* out = reinterpret_cast<const float*>(shared_bytes(2) + kOffset);
  for (int row = 0; row < 2; ++row) {
    for (int i = 0; i < kN; ++i) {
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(out[row * kN * 3 + i * 3 + c], static_cast<float>(10 * i + row * 3 + c));
      }
    }
  }
  // And the mesh goes on member-side.
  ExpectAllOk(OnAll(kN, [&](int i) {
    return r->mesh(i).all_gather(Array::Of<float>(r->m.buffers[i], {4}), AxisNames::All(),
                                 Array{&shared[i], 0, DType::kF32, {kN * 4}},
                                 {.axis = 0, .tiled = true});
  }));
  EXPECT_EQ(DaemonOps(*r->daemon), before + 1);
}

// A small reduction into a buffer the mesh shares runs member-side too: the
// first member of the group writes the result, bit for bit the daemon's
// (the same op run asynchronously, through the daemon, into each member's
// own output), and every member's op returns once it is written.
TEST(MemberOpsTest, SmallReductionsIntoASharedBufferAreWrittenOnce) {
  constexpr int kN = 3;
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  constexpr size_t kOffset = 128;
  constexpr size_t kSharedBytes = 256 * 1024;
  std::vector<Buffer> shared;
  for (int i = 0; i < kN; ++i) {
    auto b = r->mesh(i).AllocateShared(kSharedBytes);
    ASSERT_TRUE(b.ok()) << b.status();
    shared.push_back(*std::move(b));
  }
  const uint8_t* region = static_cast<const uint8_t*>(shared[1].data());
  int64_t daemon_ops = DaemonOps(*r->daemon);
  uint32_t seed = 11;
  for (CollectiveKind k : {CollectiveKind::kPsum, CollectiveKind::kPmean, CollectiveKind::kPmax,
                           CollectiveKind::kPmin}) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
      // Up to 64 KiB of input: the segment's default payload.
      for (int64_t elems : {int64_t{1}, int64_t{333}, int64_t{16384}}) {
        // The result's bytes (pmean of int32 gives float32: the same size).
        const size_t out_bytes = DTypeSize(dt) * elems;
        for (int i = 0; i < kN; ++i) Fill(r->in(i), DTypeSize(dt) * elems, ++seed);
        std::memset(shared[0].data(), 0x5A, kSharedBytes);
        auto op = [&](int i, const Buffer& out, size_t offset) {
          Collective c;
          c.kind = k;
          c.x = Array{&r->m.buffers[i], 0, dt, {elems}};
          c.axes = AxisNames::All();
          c.out = Array{&out, offset, DType::kU8, {static_cast<int64_t>(out_bytes)}};
          return c;
        };
        // The first member, which writes the result, comes last: the others
        // must not return before it wrote it.
        std::vector<std::vector<uint8_t>> seen(kN);
        ExpectAllOk(OnAll(kN, [&](int i) {
          if (i == 0) absl::SleepFor(absl::Milliseconds(20));
          absl::Status st = r->mesh(i).run(op(i, shared[i], kOffset));
          const uint8_t* mine = static_cast<const uint8_t*>(shared[i].data()) + kOffset;
          seen[i].assign(mine, mine + out_bytes);
          return st;
        }));
        EXPECT_EQ(DaemonOps(*r->daemon), daemon_ops) << "the daemon ran it";
        // The daemon's result for the same inputs, into each member's own output.
        ExpectAllOk(OnAll(kN, [&](int i) { return r->mesh(i).submit(op(i, r->out[i], 0)).Wait(); }));
        daemon_ops = DaemonOps(*r->daemon);
        for (int i = 0; i < kN; ++i) {
          ASSERT_EQ(std::memcmp(seen[i].data(), r->out_data(0), out_bytes), 0)
              << "kind " << static_cast<int>(k) << " dtype " << static_cast<int>(dt) << " elems "
              << elems << " as member " << i << " saw it";
        }
        for (size_t b = 0; b < kSharedBytes; ++b) {
          if (b < kOffset || b >= kOffset + out_bytes) {
            ASSERT_EQ(region[b], 0x5A) << b;
          }
        }
      }
    }
  }
  // Bigger than the payload: the daemon writes it.
  ExpectAllOk(OnAll(kN, [&](int i) {
    return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {32768}), AxisNames::All(),
                           Array::Of<float>(shared[i], {32768}));
  }));
  EXPECT_EQ(DaemonOps(*r->daemon), daemon_ops + 1);
}

TEST(MemberOpsTest, AMemberThatDoesNotComeIsNamed) {
  constexpr int kN = 2;
  auto r = Members::Start(kN, {"--op_timeout_ms=400"});
  ASSERT_NE(r, nullptr);
  const absl::Time start = absl::Now();
  absl::Status st = r->mesh(0).psum(Array::Of<float>(r->m.buffers[0], {4}), "x");
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_CONTAINS(st.message(), "missing: 1 (1)");
  EXPECT_CONTAINS(st.message(), "'mops-1'");
  EXPECT_CONTAINS(st.message(), "psum f32[4]");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The mesh is broken for the latecomer too.
  absl::Status late = r->mesh(1).psum(Array::Of<float>(r->m.buffers[1], {4}), "x");
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_CONTAINS(late.message(), "timed out");
}

// A member-side op some members wait in is listed with the daemon's pending
// ops: who published it, who is missing; once every member came it is gone.
TEST(MemberOpsTest, AnOpSomeMembersWaitInIsListedWithWhoIsMissing) {
  constexpr int kN = 3;
  auto r = Members::Start(kN, {"--op_timeout_ms=30000"});
  ASSERT_NE(r, nullptr);
  // Two rounds: members 0 and 1 wait for 2, then 1 and 2 for 0 (the second
  // place's entries are in the other half of each member's pair).
  const std::vector<std::vector<int>> rounds = {{0, 1}, {1, 2}};
  for (size_t round = 0; round < rounds.size(); ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::vector<int>& early = rounds[round];
    std::vector<absl::Status> st(kN);
    std::vector<std::thread> waiters;
    for (int i : early) {
      waiters.emplace_back(
          [&, i] { st[i] = r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {4}), "x"); });
    }
    // Until both have published (at most 10 s).
    v1::PendingOp seen;
    for (absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
      const v1::ListPendingOpsResponse p = Pending(*r->daemon);
      if (p.ops_size() == 1 && p.ops(0).submitted_size() == 2) {
        seen = p.ops(0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(seen.member_side()) << seen.DebugString();
    EXPECT_EQ(seen.sequence(), -1);
    EXPECT_EQ(seen.member_op(), static_cast<int64_t>(round));
    EXPECT_EQ(seen.mesh_id(), r->mesh(0).id());
    EXPECT_EQ(seen.mesh_name(), "mops");
    EXPECT_CONTAINS(seen.description(), "psum f32[4]");
    EXPECT_EQ(seen.state(), "waiting");
    // (No ASSERT while the waiters run.)
    EXPECT_EQ(std::vector<int>(seen.submitted().begin(), seen.submitted().end()), early);
    const int late = 3 - early[0] - early[1];
    EXPECT_EQ(std::vector<int>(seen.missing().begin(), seen.missing().end()),
              std::vector<int>{late});
    EXPECT_GT(seen.deadline_ms(), 0);
    EXPECT_LE(seen.deadline_ms(), 30000);
    EXPECT_EQ(Pending(*r->daemon, r->mesh(0).id()).ops_size(), 1);
    // The latecomer: every member's op completes, and nothing is pending.
    st[late] = r->mesh(late).psum(Array::Of<float>(r->m.buffers[late], {4}), "x");
    for (auto& t : waiters) t.join();
    ExpectAllOk(st);
    EXPECT_EQ(Pending(*r->daemon).ops_size(), 0) << Pending(*r->daemon).DebugString();
  }
}

// The daemon's segments together stay within --member_segment_total_bytes:
// a mesh that forms past it runs every op through the daemon, and a mesh
// that is gone gives its bytes back.
TEST(MemberOpsTest, MeshesPastTheSegmentLimitGetNoneAndUseTheDaemon) {
  const uint64_t one = member_ops::Layout::For(2, 64 * 1024).total_bytes;
  ASSERT_GT(one, 0u);
  auto d = Daemon::Start({absl::StrCat("--member_segment_total_bytes=", one)});
  ASSERT_TRUE(d.ok()) << d.status();
  auto psum_all = [](SdkMembers& m) {
    return OnAll(2, [&](int i) {
      return m.meshes[i]->psum(Array::Of<float>(m.buffers[i], {4}), "x");
    });
  };
  SdkMembers first;
  ASSERT_OK(MakeSdkMembers((*d)->socket(), "first", 2, 4096, &first));
  EXPECT_TRUE(first.meshes[0]->member_side().ok()) << first.meshes[0]->member_side();
  EXPECT_EQ(Stats(**d).member_segment_bytes(), static_cast<int64_t>(one));

  SdkMembers second;
  ASSERT_OK(MakeSdkMembers((*d)->socket(), "second", 2, 4096, &second));
  for (int i = 0; i < 2; ++i) {
    const absl::Status side = second.meshes[i]->member_side();
    EXPECT_FALSE(side.ok());
    EXPECT_CONTAINS(side.message(), "--member_segment_total_bytes");
  }
  EXPECT_EQ(Stats(**d).member_segment_bytes(), static_cast<int64_t>(one));
  // Both meshes work: the first member-side, the second through the daemon.
  int64_t before = DaemonOps(**d);
  ExpectAllOk(psum_all(first));
  EXPECT_EQ(DaemonOps(**d), before);
  ExpectAllOk(psum_all(second));
  EXPECT_EQ(DaemonOps(**d), before + 1);

  // The first mesh goes (both members leave): its bytes are free again.
  first.meshes.clear();
  EXPECT_EQ(Stats(**d).member_segment_bytes(), 0);
  SdkMembers third;
  ASSERT_OK(MakeSdkMembers((*d)->socket(), "third", 2, 4096, &third));
  EXPECT_TRUE(third.meshes[0]->member_side().ok()) << third.meshes[0]->member_side();
  before = DaemonOps(**d);
  ExpectAllOk(psum_all(third));
  EXPECT_EQ(DaemonOps(**d), before);
}

// A member may write any key into the segment: a place per member, each
// listing most members as missing, would make the answer grow with the
// square of the mesh. At most 4 places of a mesh are listed.
TEST(MemberOpsTest, ScribbledKeysListAtMostFourPlacesOfAMesh) {
  constexpr int kN = 32;
  auto d = Daemon::Start({"--op_timeout_ms=30000"});
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<std::unique_ptr<RawSession>> raw;
  for (int i = 0; i < kN; ++i) {
    raw.push_back(std::make_unique<RawSession>(**d, absl::StrCat("raw-", i)));
    ASSERT_OK(raw.back()->Attach());
  }
  std::vector<absl::Status> joined(kN);
  {
    std::vector<std::thread> joiners;
    for (int i = 0; i < kN; ++i) {
      joiners.emplace_back([&, i] { joined[i] = raw[i]->Join("wide", kN, i); });
    }
    for (auto& t : joiners) t.join();
  }
  for (const absl::Status& st : joined) ASSERT_OK(st);
  auto reply = raw[0]->Request(absl::StrCat("SEGMENT ", raw[0]->mesh_id()));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->fd.valid()) << reply->data;
  const size_t bytes = std::stoul(reply->data.substr(3));
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
  ASSERT_NE(base, MAP_FAILED);
  const member_ops::View view{static_cast<uint8_t*>(base),
                              member_ops::ValidLayout(base, bytes, kN)};
  ASSERT_GT(view.layout.total_bytes, 0u);
  // Member m claims place (m, 0): at place j member j is there, the members
  // before it missing and the ones after it past (31 places with someone
  // missing, 527 members listed, were they all shown).
  for (uint32_t m = 0; m < kN; ++m) view.entry(m, 0)->key.store(member_ops::Key(m, 0));
  const v1::ListPendingOpsResponse p = Pending(**d);
  EXPECT_GE(p.ops_size(), 1);
  EXPECT_LE(p.ops_size(), 4);
  for (const v1::PendingOp& op : p.ops()) {
    EXPECT_TRUE(op.member_side());
    EXPECT_EQ(op.submitted_size(), 1);
    EXPECT_LE(op.missing_size(), kN - 1);
  }
  // Marked broken by a member: nothing is listed from it.
  const char reason[] = "gave up";
  member_ops::MarkBroken(view, 4, reason, sizeof(reason) - 1);
  EXPECT_EQ(Pending(**d).ops_size(), 0);
  munmap(base, bytes);
}

TEST(MemberOpsTest, AMemberThatGoesAwayWakesTheWaitersNamingIt) {
  constexpr int kN = 3;
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  std::vector<absl::Status> st(2);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back(
        [&, i] { st[i] = r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {4}), "x"); });
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time gone = absl::Now();
  r->m.meshes[2].reset();  // leaves the mesh
  for (auto& t : waiters) t.join();
  EXPECT_LT(absl::Now() - gone, absl::Seconds(2));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i].code(), absl::StatusCode::kAborted) << st[i];
    EXPECT_CONTAINS(st[i].message(), "'mops-2'");
  }
}

// A mesh of two members: member 0 a raw session of the test, which maps the
// mesh's segment and may write anything there; member 1 an SDK client.
struct RawAndSdk {
  explicit RawAndSdk(const Daemon& d) : daemon(d), raw(d, "raw") {}
  ~RawAndSdk() {
    if (base != nullptr) munmap(base, bytes);
  }
  RawAndSdk(const RawAndSdk&) = delete;
  RawAndSdk& operator=(const RawAndSdk&) = delete;

  // Joins mesh `name` (axis "i" of 2), the raw member with a buffer of
  // `raw_bytes`, and maps its segment.
  absl::Status Join(const std::string& name, int64_t raw_bytes = 4096) {
    if (absl::Status st = raw.Attach(); !st.ok()) return st;
    auto c = Client::Connect({.socket_path = daemon.socket(), .client_name = "sdk"});
    if (!c.ok()) return c.status();
    sdk = *std::move(c);
    absl::StatusOr<std::unique_ptr<Mesh>> m;
    std::thread joiner([&] {
      m = sdk->JoinMesh({.name = name, .axes = {{"i", 2}}, .coordinate = {1}});
    });
    const absl::Status joined = raw.Join(name, 2, 0, raw_bytes);
    joiner.join();
    if (!joined.ok()) return joined;
    if (!m.ok()) return m.status();
    mesh = *std::move(m);
    auto reply = raw.Request(absl::StrCat("SEGMENT ", raw.mesh_id()));
    if (!reply.ok()) return reply.status();
    if (!reply->fd.valid()) return absl::InternalError(absl::StrCat("SEGMENT: ", reply->data));
    bytes = std::stoul(reply->data.substr(3));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, reply->fd.get(), 0);
    if (p == MAP_FAILED) return absl::InternalError("mapping the segment failed");
    base = p;
    view = member_ops::View{static_cast<uint8_t*>(base), member_ops::ValidLayout(base, bytes, 2)};
    if (view.layout.total_bytes == 0) return absl::InternalError("the segment's layout is invalid");
    return absl::OkStatus();
  }

  const Daemon& daemon;
  RawSession raw;
  std::unique_ptr<Client> sdk;
  std::unique_ptr<Mesh> mesh;
  void* base = nullptr;
  size_t bytes = 0;
  member_ops::View view;
};

TEST(MemberOpsTest, ASegmentOnlyItsMembersMapAndCorruptOnlyHurtsItsMesh) {
  auto d = Daemon::Start({"--op_timeout_ms=500"});
  ASSERT_TRUE(d.ok()) << d.status();
  // A raw member and an SDK member of one mesh.
  RawAndSdk members(**d);
  ASSERT_OK(members.Join("scribbled"));
  RawSession& raw = members.raw;
  void* const base = members.base;
  const size_t bytes = members.bytes;
  const member_ops::View& view = members.view;
  // A session that is not a member gets nothing.
  RawSession stranger(**d, "stranger");
  ASSERT_OK(stranger.Attach());
  auto refused = stranger.Request(absl::StrCat("SEGMENT ", raw.mesh_id()));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_CONTAINS(refused->data, "ERR");
  EXPECT_FALSE(refused->fd.valid());

  // Garbage everywhere, then questions about it.
  std::mt19937 rng(7);
  for (size_t i = 0; i < bytes; ++i) static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(rng());
  // Listing pending ops reads the garbage (as member-side waits) and lives.
  Pending(**d);
  for (int k = 0; k < 100; ++k) {
    // Keys that decode to places (in either half of a member's pair, the
    // rest of the entry garbage).
    view.entry(rng() % 2, rng() % 2)->key.store(member_ops::Key(rng() % 4, rng() % 4));
    Pending(**d);
  }
  for (const char* q : {"EXPIRED %s 0 0", "EXPIRED %s 4294967295 16777215", "EXPIRED %s 1 x"}) {
    std::string text = q;
    text.replace(text.find("%s"), 2, raw.mesh_id());
    auto answer = raw.Request(text);
    ASSERT_TRUE(answer.ok()) << answer.status();
  }
  // The SDK member ends within its deadline, whatever the segment says.
  Buffer b = *members.sdk->Allocate(64);
  const absl::Time start = absl::Now();
  absl::Status st = members.mesh->psum(Array::Of<float>(b, {4}), "i");
  EXPECT_FALSE(st.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  // The daemon and other meshes are unharmed.
  auto r = Members::Start(2, {}, "fine");
  ASSERT_NE(r, nullptr);
  ExpectAllOk(OnAll(2, [&](int i) {
    return r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {4}), "x");
  }));
  SdkMembers others;
  ASSERT_OK(MakeSdkMembers((*d)->socket(), "other", 2, 4096, &others));
  ExpectAllOk(OnAll(2, [&](int i) {
    return others.meshes[i]->psum(Array::Of<float>(others.buffers[i], {4}), "x");
  }));
}

// Mesh::start: a small op runs among the members (the future is complete
// when start returns, nothing went through the daemon); a waiter whose
// `interrupted` says so gives the op up, and the mesh breaks for everyone.
TEST(MemberOpsTest, StartRunsMemberSideAndAnInterruptedWaiterGivesTheOpUp) {
  auto r = Members::Start(2, {});
  ASSERT_NE(r, nullptr);
  const int64_t daemon_ops_before = DaemonOps(*r->daemon);
  const std::function<bool()> never = [] { return false; };
  for (int i = 0; i < 2; ++i) {
    float* x = reinterpret_cast<float*>(r->in(i));
    for (int e = 0; e < 4; ++e) x[e] = static_cast<float>(i + 1);
  }
  std::vector<OpFuture> ran(2);
  std::vector<char> complete(2);  // not vector<bool>: each thread writes its own element
  ExpectAllOk(OnAll(2, [&](int i) {
    ran[i] = r->mesh(i).start({.kind = CollectiveKind::kPsum,
                               .x = Array::Of<float>(r->m.buffers[i], {4}),
                               .axes = AxisNames("x")},
                              never);
    complete[i] = ran[i].Ready();
    return ran[i].Wait();
  }));
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(complete[i]) << "member " << i << ": start returned before the op completed";
    EXPECT_EQ(reinterpret_cast<float*>(r->in(i))[3], 3.0f) << "member " << i;
  }
  EXPECT_EQ(DaemonOps(*r->daemon), daemon_ops_before);

  // Member 0 waits for member 1, which is not coming; 300 ms in, member 0
  // is interrupted.
  const absl::Time start = absl::Now();
  std::atomic<int> asked{0};
  // An op of this mesh started from the check (as a signal handler might)
  // is refused: it would wait for the lock the waiting thread holds.
  absl::Status nested_sync, nested_async;
  const std::function<bool()> after_300ms = [&] {
    if (asked++ == 0) {
      nested_sync = r->mesh(0).psum(Array::Of<float>(r->out[0], {4}), "x");
      nested_async = r->mesh(0).psum_async(Array::Of<float>(r->out[0], {4}), "x").Wait();
    }
    return absl::Now() - start > absl::Milliseconds(300);
  };
  OpFuture given_up = r->mesh(0).start(
      {.kind = CollectiveKind::kPsum, .x = Array::Of<float>(r->m.buffers[0], {4}),
       .axes = AxisNames("x")},
      after_300ms);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_TRUE(given_up.Ready());
  const absl::Status st0 = given_up.Wait();
  EXPECT_EQ(st0.code(), absl::StatusCode::kCancelled) << st0;
  EXPECT_CONTAINS(st0.message(), "member 0 was interrupted");
  EXPECT_GE(asked.load(), 2) << "asked only when the wait was long";
  for (const absl::Status& nested : {nested_sync, nested_async}) {
    EXPECT_EQ(nested.code(), absl::StatusCode::kFailedPrecondition) << nested;
    EXPECT_CONTAINS(nested.message(), "it would wait for itself");
  }
  // Member 1 learns why at its op, and the mesh stays broken.
  const absl::Status st1 =
      r->mesh(1).psum(Array::Of<float>(r->m.buffers[1], {4}), "x");
  EXPECT_EQ(st1.code(), absl::StatusCode::kAborted) << st1;
  EXPECT_CONTAINS(st1.message(), "member 0 was interrupted");
  const absl::Status again = r->mesh(0).psum(Array::Of<float>(r->m.buffers[0], {4}), "x");
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
}

// A member that gives up on an op it published takes its entry back before
// it marks the mesh broken: a member that passed the broken check just
// before and publishes after must not find every entry there and complete
// the op the other gave up (MemberOps::Abandon). Member 0 is a raw session
// that never publishes; the SDK's member 1 is interrupted while it waits.
TEST(MemberOpsTest, AMemberThatGivesUpTakesItsEntryBack) {
  auto d = Daemon::Start({"--op_timeout_ms=5000"});
  ASSERT_TRUE(d.ok()) << d.status();
  RawAndSdk members(**d);
  ASSERT_OK(members.Join("gives-up"));
  absl::StatusOr<Buffer> b = members.sdk->Allocate(4096);
  ASSERT_TRUE(b.ok()) << b.status();
  const member_ops::View& view = members.view;
  const absl::Time start = absl::Now();
  uint64_t key_while_waiting = 0;
  const std::function<bool()> after_100ms = [&] {
    key_while_waiting = view.entry(1, 0)->key.load();
    return absl::Now() - start > absl::Milliseconds(100);
  };
  OpFuture op = members.mesh->start(
      {.kind = CollectiveKind::kPsum, .x = Array::Of<float>(*b, {4}), .axes = AxisNames("i")},
      after_100ms);
  const absl::Status st = op.Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_NE(key_while_waiting, 0u) << "member 1 waited with its entry published";
  EXPECT_EQ(view.entry(1, 0)->key.load(), 0u) << "and took it back when it gave up";
  EXPECT_NE(view.header()->broken.v.load(), 0u);
}

// A member that gives up on a member-side op marks the segment broken and
// takes the daemon path from then on, as every member does; a member that
// had not reached that op would send it to the daemon too, to be matched
// with the others' next ops. The daemon breaks the mesh instead, for the
// reason the member gave, at the first op that reaches it.
TEST(MemberOpsTest, AMemberThatGaveUpBreaksTheMeshForEveryMember) {
  auto d = Daemon::Start({"--op_timeout_ms=2000"});
  ASSERT_TRUE(d.ok()) << d.status();
  // A raw member (the one that gives up) and an SDK member.
  RawAndSdk members(**d);
  ASSERT_OK(members.Join("gave-up"));
  // As MemberOps::Abandon writes it (a control byte included: the daemon
  // shows member-written text printable only).
  const std::string reason = "a member gave up on a member-side op: test\x01";
  member_ops::MarkBroken(members.view, static_cast<uint32_t>(absl::StatusCode::kAborted),
                         reason.data(), reason.size());

  // The SDK member's next op goes to the daemon, which breaks the mesh
  // rather than wait for the raw member's op there (the op timeout).
  Buffer b = *members.sdk->Allocate(64);
  const absl::Time start = absl::Now();
  const absl::Status st = members.mesh->psum(Array::Of<float>(b, {4}), "i");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_CONTAINS(st.message(), "is broken: a member gave up on a member-side op: test?");
  // Every later op of either member fails the same way.
  const absl::Status again = members.mesh->psum(Array::Of<float>(b, {4}), "i");
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  auto stub = Stub(**d);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::DescribeMeshRequest req;
  req.set_mesh_id(members.raw.mesh_id());
  v1::MeshInfo info;
  ASSERT_TRUE(stub->DescribeMesh(&ctx, req, &info).ok());
  EXPECT_EQ(info.state(), "BROKEN");
}

// The CPUs the calling thread may run on, in order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

// Makes `cpus` the calling thread's mask.
void SetMask(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
}

// Runs the calling thread on `cpu` and gives it its mask back: it stays on
// `cpu` until the scheduler moves it.
void PutOn(int cpu, const std::vector<int>& allowed) {
  SetMask({cpu});
  SetMask(allowed);
}

TEST(MoveToLeastUsedCpuTest, MovesOffTheBusyCpusAndKeepsTheMask) {
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs; this thread may use " << allowed.size();
  std::thread t([&] {
    PutOn(allowed[0], allowed);
    // Used: the CPU it is on ("1 +", as the segment stores CPUs) and an
    // unknown one (0).
    const uint32_t moved =
        internal::MoveToLeastUsedCpu({static_cast<uint32_t>(allowed[0] + 1), 0}, 1);
    ASSERT_NE(moved, 0u);
    EXPECT_NE(static_cast<int>(moved) - 1, allowed[0]);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), static_cast<int>(moved) - 1),
              allowed.end());
    EXPECT_EQ(AllowedCpus(), allowed);  // the mask is given back whole
  });
  t.join();
}

TEST(MoveToLeastUsedCpuTest, WithEveryCpuBusyItStaysAndKeepsTheMask) {
  const std::vector<int> allowed = AllowedCpus();
  std::thread t([&] {
    std::vector<uint32_t> busy;
    for (int c : allowed) busy.push_back(static_cast<uint32_t>(c + 1));
    EXPECT_EQ(internal::MoveToLeastUsedCpu(busy, 1), 0u);
    EXPECT_EQ(AllowedCpus(), allowed);
  });
  t.join();
}

// More members than CPUs: it goes to the CPU fewest of them use, and only
// when fewer than `below` use it. CPUs outside the mask, beyond any mask
// (above CpuMask::kMaxCpus) and 0 (unknown) count for nothing. Where it does
// not move, only the answer and the mask are checked: the scheduler may
// move the thread at any time.
TEST(MoveToLeastUsedCpuTest, GoesWhereFewestAreAndOnlyBelowTheBound) {
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs; this thread may use " << allowed.size();
  const std::vector<int> two = {allowed[0], allowed[1]};
  std::thread t([&] {
    SetMask(two);
    const auto on = [](int cpu) { return static_cast<uint32_t>(cpu + 1); };
    PutOn(two[0], two);
    // Three on the first CPU, one on the second: bound 2 sends it there.
    const std::vector<uint32_t> three_one = {on(two[0]), on(two[0]), on(two[0]), on(two[1]), 0};
    EXPECT_EQ(internal::MoveToLeastUsedCpu(three_one, 2), on(two[1]));
    EXPECT_EQ(AllowedCpus(), two);
    // Bound 1: no CPU of the mask is free, it stays.
    EXPECT_EQ(internal::MoveToLeastUsedCpu(three_one, 1), 0u);
    EXPECT_EQ(AllowedCpus(), two);
    // Two and two: already as even as it gets.
    const std::vector<uint32_t> two_two = {on(two[0]), on(two[0]), on(two[1]), on(two[1])};
    EXPECT_EQ(internal::MoveToLeastUsedCpu(two_two, 2), 0u);
    EXPECT_EQ(AllowedCpus(), two);
    // CPUs no mask can hold name nothing: the second CPU is free.
    PutOn(two[0], two);
    const std::vector<uint32_t> beyond = {on(two[0]), 0xFFFFFFFFu,
                                          static_cast<uint32_t>(CpuMask::kMaxCpus + 1)};
    EXPECT_EQ(internal::MoveToLeastUsedCpu(beyond, 1), on(two[1]));
    EXPECT_EQ(AllowedCpus(), two);
    // A CPU outside the mask, named by nobody, is not a place to go; the
    // second CPU, named once, is.
    if (allowed.size() >= 3) {
      PutOn(two[0], two);
      const std::vector<uint32_t> outside = {on(two[0]), on(two[0]), on(two[1]),
                                             on(allowed[2]), on(allowed[2])};
      EXPECT_EQ(internal::MoveToLeastUsedCpu(outside, 2), on(two[1]));
    }
    EXPECT_EQ(AllowedCpus(), two);
  });
  t.join();
}

// Who moves: ceil(members / CPUs) may share a CPU, the lowest indexes stay.
TEST(SpreadOverCpusTest, TheMembersPastTheirCpusShareMove) {
  EXPECT_EQ(internal::MembersPerCpu(2, 2), 1u);
  EXPECT_EQ(internal::MembersPerCpu(2, 8), 1u);
  EXPECT_EQ(internal::MembersPerCpu(3, 2), 2u);
  EXPECT_EQ(internal::MembersPerCpu(4, 2), 2u);
  EXPECT_EQ(internal::MembersPerCpu(5, 2), 3u);
  EXPECT_EQ(internal::MembersPerCpu(4, 1), 4u);  // one CPU: nobody is past it
  EXPECT_EQ(internal::MembersPerCpu(4, 0), 4u);  // unknown: as one
  // Members 0-3 on CPUs (1 +) 5, 5, 5, 7.
  const std::vector<uint32_t> cpus = {5, 5, 5, 7};
  const auto cpu_of = [&](uint32_t m) { return cpus[m]; };
  const auto over = [&](uint32_t index, uint32_t most) {
    return internal::OverCpuShare(index, cpus[index], most, cpu_of);
  };
  // Two per CPU: only member 2, the third on CPU 5, moves.
  EXPECT_FALSE(over(0, 2));
  EXPECT_FALSE(over(1, 2));
  EXPECT_TRUE(over(2, 2));
  EXPECT_FALSE(over(3, 2));
  // One per CPU: members 1 and 2.
  EXPECT_FALSE(over(0, 1));
  EXPECT_TRUE(over(1, 1));
  EXPECT_TRUE(over(2, 1));
  EXPECT_FALSE(over(3, 1));
  // Four per CPU (one CPU): nobody.
  for (uint32_t m = 0; m < 4; ++m) EXPECT_FALSE(over(m, 4)) << m;
  // A member whose CPU is unknown (0) never moves, whoever shares 0.
  const std::vector<uint32_t> unknown = {0, 0, 0};
  EXPECT_FALSE(internal::OverCpuShare(2, 0, 1, [&](uint32_t m) { return unknown[m]; }));
}

// `n` members on a daemon, each starting on the first of `cpus` (its mask),
// run `ops` psums: every one exact and member-side, and each member's mask
// is `cpus` after every op, whatever the members did to part.
void PsumsFromOneCpu(int n, int ops, const std::vector<int>& cpus) {
  auto r = Members::Start(n, {});
  ASSERT_NE(r, nullptr);
  std::vector<int> wrong(n, 0);
  const std::vector<absl::Status> st = OnAll(n, [&](int i) -> absl::Status {
    PutOn(cpus[0], cpus);
    float* x = reinterpret_cast<float*>(r->in(i));
    Array a = Array::Of<float>(r->m.buffers[i], {2});
    for (int op = 0; op < ops; ++op) {
      x[0] = static_cast<float>(i + op);
      x[1] = 1.0f;
      if (absl::Status s = r->mesh(i).psum(a, "x"); !s.ok()) return s;
      // 0 + 1 + ... + (n - 1) + n * op
      if (x[0] != static_cast<float>(n * (n - 1) / 2 + n * op) || x[1] != static_cast<float>(n)) {
        ++wrong[i];
      }
      if (AllowedCpus() != cpus) return absl::InternalError("the member's mask was not given back");
    }
    return absl::OkStatus();
  });
  ExpectAllOk(st);
  EXPECT_EQ(wrong, std::vector<int>(n, 0));
  EXPECT_EQ(DaemonOps(*r->daemon), 0) << "every op ran member-side";
}

// Two members that start on one CPU, on a machine where each can have its
// own.
TEST(MemberOpsTest, MembersThatStartOnOneCpuStayExact) {
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs; this thread may use " << allowed.size();
  PsumsFromOneCpu(2, 3000, allowed);
}

// Four members on two CPUs, all starting on one: they spread themselves
// (at most two on a CPU) while their ops run.
TEST(MemberOpsTest, MoreMembersThanCpusSpreadAndStayExact) {
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs; this thread may use " << allowed.size();
  const std::vector<int> two = {allowed[0], allowed[1]};
  // The meshes read the CPUs they may use when they are made: two.
  SetMask(two);
  absl::Cleanup restore = [&] { SetMask(allowed); };
  PsumsFromOneCpu(4, 2000, two);
}

// A member thread that rounds upward gets the daemon's bits (round to
// nearest) from a member-side psum, and its own rounding back afterwards,
// whether or not its environment differed from the daemon's.
TEST(MemberOpsTest, TheCallersRoundingModeChangesNoBitAndIsKept) {
  auto r = Members::Start(2, {});
  ASSERT_NE(r, nullptr);
  // 1 + 2^-25: a quarter of float32's step at 1, which rounding to nearest
  // drops and rounding upward does not.
  const float tiny = std::ldexp(1.0f, -25);
  for (const int mode : {FE_UPWARD, FE_TONEAREST}) {
    std::vector<int> modes_after(2, -1);
    const std::vector<absl::Status> st = OnAll(2, [&](int i) -> absl::Status {
      float* x = reinterpret_cast<float*>(r->in(i));
      x[0] = i == 0 ? 1.0f : tiny;
      std::fesetround(mode);
      absl::Status s = r->mesh(i).psum(Array::Of<float>(r->m.buffers[i], {1}), "x");
      modes_after[i] = std::fegetround();
      std::fesetround(FE_TONEAREST);
      return s;
    });
    ExpectAllOk(st);
    for (int i = 0; i < 2; ++i) {
      const float got = reinterpret_cast<const float*>(r->in(i))[0];
      EXPECT_EQ(got, 1.0f) << "member " << i << " got " << std::hexfloat << got;
      EXPECT_EQ(modes_after[i], mode) << "member " << i;
    }
  }
  EXPECT_EQ(DaemonOps(*r->daemon), 0) << "every op ran member-side";
}

// A bare {} for the axes (a default-constructed AxisNames) meant every axis,
// then for a while the empty tuple: now every way of giving it is refused in
// this process, naming both spellings, before anything is sent or changed,
// small ops (member-side) and large (daemon path) alike; the mesh goes on.
TEST(AxisNamesTest, ABareBraceIsRefusedNamingAllAndNone) {
  auto r = Members::Start(2, {});
  ASSERT_NE(r, nullptr);
  Mesh& m0 = r->mesh(0);
  EXPECT_EQ(m0.axis_index({}), -1);
  EXPECT_EQ(m0.axis_size({}), -1);
  EXPECT_EQ(m0.axis_size(AxisNames::None()), 1);
  EXPECT_EQ(m0.axis_size(AxisNames::All()), 2);
  const int64_t before = DaemonOps(*r->daemon);
  for (int64_t elems : {int64_t{4}, int64_t{64 * 1024}}) {  // 16 B, 256 KiB of float32
    for (int i = 0; i < 2; ++i) {
      float* in = reinterpret_cast<float*>(r->in(i));
      for (int64_t k = 0; k < elems; ++k) in[k] = static_cast<float>(i + 1);
    }
    const Array x{&r->m.buffers[0], 0, DType::kF32, {elems}};
    const Array gathered{&r->out[0], 0, DType::kF32, {2 * elems}};
    Collective unset;  // axes never set
    unset.x = x;
    std::vector<std::pair<std::string, absl::Status>> refused = {
        {"psum", m0.psum(x, {})},
        {"pmean", m0.pmean(x, AxisNames{})},
        {"psum_async", m0.psum_async(x, {}).Wait()},
        {"all_gather", m0.all_gather(x, {}, gathered, {0, true})},
        {"ppermute", m0.ppermute(x, {}, {{0, 1}, {1, 0}})},
        {"broadcast", m0.broadcast(x, {}, 0)},
        {"barrier", m0.barrier({})},
        {"barrier_async", m0.barrier_async({}).Wait()},
        {"run", m0.run(unset)},
        {"submit", m0.submit(unset).Wait()},
        {"start", m0.start(unset, [] { return false; }).Wait()},
    };
    for (const auto& [what, st] : refused) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
      EXPECT_CONTAINS(st.message(), "AxisNames::All()");
      EXPECT_CONTAINS(st.message(), "AxisNames::None()");
    }
    const float* in0 = reinterpret_cast<const float*>(r->in(0));
    EXPECT_EQ(in0[0], 1.0f);
    EXPECT_EQ(in0[elems - 1], 1.0f);
    // The mesh goes on: both spellings mean what they say.
    ExpectAllOk(OnAll(2, [&](int i) {
      return r->mesh(i).psum(Array{&r->m.buffers[i], 0, DType::kF32, {elems}},
                             AxisNames::None());
    }));
    EXPECT_EQ(in0[elems - 1], 1.0f);  // the empty tuple: its own input
    ExpectAllOk(OnAll(2, [&](int i) {
      return r->mesh(i).psum(Array{&r->m.buffers[i], 0, DType::kF32, {elems}},
                             AxisNames::All());
    }));
    EXPECT_EQ(in0[0], 3.0f);
    EXPECT_EQ(in0[elems - 1], 3.0f);
  }
  // Nothing refused above reached the daemon: at most the two large psums
  // that ran (one per spelling, counted per member) did.
  EXPECT_LE(DaemonOps(*r->daemon) - before, 4);
}

// How ReduceBySplitReads writes its shares follows the measured times: after
// a warm-up that counts for nothing, a block of each way (the least of each
// counts), then the faster, and from time to time a block of the other way,
// which takes over when its least beats the way in use; per size class. The
// machine below is the one measured: a cached op after a streamed one is
// slow, and cached ops get faster, op by op, over the ones in a row.
TEST(ShareStoresTest, PicksTheFasterWayByBlocksAndTriesTheOtherLessOften) {
  using internal::member_reads::ShareStores;
  constexpr uint64_t kMiB = 1 << 20;
  EXPECT_EQ(ShareStores::ClassOf(2 * kMiB + 1), 0);
  EXPECT_EQ(ShareStores::ClassOf(4 * kMiB), 0);
  EXPECT_EQ(ShareStores::ClassOf(4 * kMiB + 1), 1);
  EXPECT_EQ(ShareStores::ClassOf(8 * kMiB + 1), 2);
  EXPECT_EQ(ShareStores::ClassOf(16 * kMiB), 2);
  EXPECT_EQ(ShareStores::ClassOf(16 * kMiB + 1), 3);
  EXPECT_EQ(ShareStores::ClassOf(32 * kMiB), 3);
  ShareStores stores;
  // ns per op of 1 MiB: streamed `streamed`; cached `cached` once it has
  // run kRamp ops in a row, 3x that right after a streamed op.
  int64_t streamed = 300, cached = 100;
  int cached_in_a_row = 0;
  constexpr int kRamp = 6;
  auto cost = [&](bool stream) -> int64_t {
    if (stream) {
      cached_in_a_row = 0;
      return streamed;
    }
    ++cached_in_a_row;
    const int64_t slow = 3 * cached;  // as slow as a streamed op, at first
    if (cached_in_a_row >= kRamp) return cached;
    return slow - (slow - cached) * (cached_in_a_row - 1) / (kRamp - 1);
  };
  std::vector<bool> ways;
  uint32_t op = 0;
  // Runs `ops` ops of class `cls`; the ops that went the way `in_use` does
  // not, by number.
  auto run = [&](int cls, int ops, bool in_use) {
    ways.clear();
    std::vector<uint32_t> others;
    for (int i = 0; i < ops; ++i, ++op) {
      const bool stream = stores.Next(cls);
      ways.push_back(stream);
      if (stream != in_use) others.push_back(op);
      stores.Record(cls, stream, cost(stream), kMiB);
    }
    return others;
  };
  // The warm-up alternates; none of it counts (streamed warm-up ops far
  // faster than any later op would make streaming win, counted).
  for (uint32_t i = 0; i < ShareStores::kWarmUp; ++i, ++op) {
    const bool stream = stores.Next(0);
    EXPECT_EQ(stream, i % 2 == 1) << "op " << op;
    stores.Record(0, stream, stream ? 10 : 5000, kMiB);
  }
  // A block streamed, then a block cached (slow at first, as after a
  // streamed op; alternating one op each way, cached would never look
  // faster here).
  run(0, ShareStores::kBlock, true);
  EXPECT_EQ(ways, std::vector<bool>(ShareStores::kBlock, true));
  run(0, ShareStores::kBlock, false);
  EXPECT_EQ(ways, std::vector<bool>(ShareStores::kBlock, false));
  ASSERT_EQ(op, ShareStores::kFirstOps);
  // Cached wins. Streaming is tried in blocks, kExplore ops after the
  // trial, then twice as long after each try that lost, at most
  // kMaxExplore: ops 24 + 64 = 88, 96 + 128 = 224, 232 + 256 = 488, ...
  std::vector<uint32_t> tried = run(0, 3000, false);
  std::vector<uint32_t> starts;
  for (size_t i = 0; i < tried.size(); ++i) {
    if (i == 0 || tried[i] != tried[i - 1] + 1) starts.push_back(tried[i]);
  }
  EXPECT_EQ(starts, (std::vector<uint32_t>{88, 224, 488, 1008, 2040}));
  EXPECT_EQ(tried.size(), starts.size() * ShareStores::kBlock);
  // 2040 + 8 + 1024 is the next: the wait stays at kMaxExplore.
  ASSERT_EQ(op, ShareStores::kFirstOps + 3000);  // 3024
  EXPECT_EQ(run(0, 3072 - 3024, false), std::vector<uint32_t>{});
  tried = run(0, ShareStores::kBlock, false);
  EXPECT_EQ(tried.size(), ShareStores::kBlock);
  // The machine changes: streaming now costs less than caching does even
  // in a row. The next try of streaming (the wait went back to the most)
  // takes over, and caching is then tried kExplore ops later.
  cached = 250;
  streamed = 150;
  tried = run(0, ShareStores::kMaxExplore + ShareStores::kBlock + ShareStores::kExplore, false);
  ASSERT_GE(tried.size(), ShareStores::kBlock);
  EXPECT_EQ(tried[0], 3080u + ShareStores::kMaxExplore);  // 4104
  EXPECT_TRUE(ways.back()) << "streaming took over";
  EXPECT_EQ(run(0, ShareStores::kBlock + 2, true).size(), ShareStores::kBlock)
      << "caching is tried again from op 4104 + 8 + 64 = 4176";
  // Another class decides for itself, from the start (its own warm-up).
  cached = 100;
  streamed = 150;
  run(1, ShareStores::kFirstOps, true);
  EXPECT_FALSE(stores.Next(1)) << "cached in a row was faster in class 1 (100 against 150)";
  // Times below zero are not counted (a clock gone back): counted, they
  // would make streaming win class 2.
  run(2, ShareStores::kWarmUp, true);
  for (uint32_t i = 0; i < ShareStores::kBlock; ++i) {
    EXPECT_TRUE(stores.Next(2));
    stores.Record(2, true, -5, kMiB);
  }
  run(2, ShareStores::kBlock, false);
  EXPECT_FALSE(stores.Next(2)) << "streaming was never timed: caching";
}

// Sets an environment variable for the test's scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name); old != nullptr) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// An all_gather of `elems` elements along the first dimension of each
// member's input into its output buffer (tiled: [n * elems]; else [n, elems]).
absl::Status Gather(Members& r, int i, DType dtype, int64_t elems, const AxisNames& axes,
                    bool tiled) {
  Mesh& m = r.mesh(i);
  const int64_t n = m.axis_size(axes);
  const Array out = tiled ? Array{&r.out[i], 0, dtype, {n * elems}}
                          : Array{&r.out[i], 0, dtype, {n, elems}};
  return m.all_gather(Array{&r.m.buffers[i], 0, dtype, {elems}}, axes, out, {.tiled = tiled});
}

TEST(MemberReadsTest, AllGathersThatReadTheMembersEqualTheDaemonPath) {
  constexpr size_t kBytes = (16 << 20) + 4096;  // the largest output, and its guard
  auto reads = StartTwoByTwo({}, kBytes);
  auto daemon_side = StartTwoByTwo({"--member_op_bytes=0"}, kBytes);
  ASSERT_NE(reads, nullptr);
  ASSERT_NE(daemon_side, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(reads->mesh(i).member_reads(), "not decided yet");
  struct G {
    DType dtype;
    int64_t elems;
    AxisNames axes;
    bool tiled;
  };
  const std::vector<G> cases = {
      // 1 KiB each: the least that reads with a CPU per member (with fewer
      // CPUs, as on 2, 8 KiB is, and smaller ones copy through the segment).
      {DType::kF32, 256, AxisNames::All(), true},
      {DType::kI8, 40001, AxisNames("b"), false},       // odd, groups of two
      {DType::kF64, 524288, AxisNames::All(), true},    // 16 MiB out, the most
      {DType::kBF16, 262147, AxisNames("a"), true},     // groups of two
      {DType::kF32, 10000, AxisNames::None(), false},   // groups of one
      {DType::kF32, 255, AxisNames::All(), true},       // 1020 B: the segment
      {DType::kF32, 16384, AxisNames::All(), true},     // 64 KiB each
      {DType::kF64, 524289, AxisNames::All(), true},    // past 16 MiB: the daemon
  };
  // The least input per member that reads: 1 KiB when every member has a
  // CPU of its own, else 8 KiB.
  const uint64_t least = UsableCpus() >= 4 ? 1024 : 8192;
  uint32_t seed = 7;
  for (const G& c : cases) {
    ++seed;
    const int64_t before = DaemonOps(*reads->daemon);
    std::vector<Mesh::MemberSidePaths> paths_before;
    for (int i = 0; i < 4; ++i) paths_before.push_back(reads->mesh(i).member_side_paths());
    const uint64_t in_bytes = DTypeSize(c.dtype) * c.elems;
    const uint64_t out_bytes =
        DTypeSize(c.dtype) * c.elems * reads->mesh(0).axis_size(c.axes);
    for (Members* r : {reads.get(), daemon_side.get()}) {
      for (int i = 0; i < 4; ++i) {
        Fill(r->in(i), DTypeSize(c.dtype) * c.elems, seed * 31 + i);
        std::memset(r->out_data(i), 0xAB, out_bytes + 64);
      }
      ExpectAllOk(OnAll(4, [&](int i) { return Gather(*r, i, c.dtype, c.elems, c.axes, c.tiled); }));
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(std::memcmp(reads->out_data(i), daemon_side->out_data(i), out_bytes + 64), 0)
          << "dtype " << static_cast<int>(c.dtype) << " elems " << c.elems << " member " << i;
      // Each block is its owner's input.
      const int64_t block = DTypeSize(c.dtype) * c.elems;
      ASSERT_EQ(std::memcmp(reads->out_data(i) + reads->mesh(i).axis_index(c.axes) * block,
                            reads->in(i), block),
                0);
    }
    // Member-side either way but past 16 MiB of output (one op for the daemon).
    const bool daemon = out_bytes > (16 << 20);
    EXPECT_EQ(DaemonOps(*reads->daemon) - before, daemon ? 1 : 0) << c.elems;
    const bool read = !daemon && in_bytes >= least;
    for (int i = 0; i < 4; ++i) {
      const Mesh::MemberSidePaths now = reads->mesh(i).member_side_paths();
      EXPECT_EQ(now.reads - paths_before[i].reads, read ? 1u : 0u) << c.elems << " member " << i;
      EXPECT_EQ(now.segment - paths_before[i].segment, !read && !daemon ? 1u : 0u)
          << c.elems << " member " << i;
    }
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(reads->mesh(i).member_reads(), "yes");
}

TEST(MemberReadsTest, AnOwnerKeepsItsInputUntilEveryMemberReadIt) {
  constexpr int kN = 3;
  constexpr int64_t kElems = 16384;  // 64 KiB each
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  const int64_t before = DaemonOps(*r->daemon);
  // Each member changes its input the moment its op returns: a reader still
  // reading it would get 0xFF bytes (a NaN), never the values below.
  ExpectAllOk(OnAll(kN, [&](int i) -> absl::Status {
    float* in = reinterpret_cast<float*>(r->in(i));
    const float* out = reinterpret_cast<const float*>(r->out_data(i));
    for (int it = 0; it < 300; ++it) {
      std::fill(in, in + kElems, static_cast<float>(it * kN + i));
      if (absl::Status st = Gather(*r, i, DType::kF32, kElems, AxisNames::All(), true);
          !st.ok()) {
        return st;
      }
      std::memset(in, 0xFF, kElems * sizeof(float));
      for (int m = 0; m < kN; ++m) {
        for (int64_t e : {int64_t{0}, kElems / 2, kElems - 1}) {
          if (out[m * kElems + e] != static_cast<float>(it * kN + m)) {
            return absl::InternalError(absl::StrCat("op ", it, ": member ", m, "'s block at ", e,
                                                    " is ", out[m * kElems + e]));
          }
        }
      }
    }
    return absl::OkStatus();
  }));
  EXPECT_EQ(DaemonOps(*r->daemon), before);
  EXPECT_EQ(r->mesh(0).member_reads(), "yes");
}

// A reduction of `elems` elements of each member's input (at offset 0),
// into its own input (in place) or its output buffer at `out_offset`.
absl::Status Reduce(Members& r, int i, CollectiveKind kind, DType dtype, int64_t elems,
                    bool in_place, uint64_t out_offset) {
  Collective op;
  op.kind = kind;
  op.x = Array{&r.m.buffers[i], 0, dtype, {elems}};
  op.axes = AxisNames::All();
  if (!in_place) op.out = Array{&r.out[i], out_offset, DType::kU8, {elems * 8}};
  return r.mesh(i).run(op);
}

TEST(MemberReadsTest, ReductionsThatReadTheMembersEqualTheDaemonPath) {
  constexpr int kN = 2;
  constexpr size_t kBytes = 17 << 20;
  if (UsableCpus() < kN) GTEST_SKIP() << "the paths below are those of members with a CPU each";
  auto reads = Members::Start(kN, {}, "rr", kBytes);
  auto daemon_side = Members::Start(kN, {"--member_op_bytes=0"}, "rd", kBytes);
  ASSERT_NE(reads, nullptr);
  ASSERT_NE(daemon_side, nullptr);
  // The path each member's op takes (the daemon's: none of them).
  enum class Path { kSegment, kReads, kSplit, kDaemon };
  struct R {
    CollectiveKind kind;
    DType dtype;
    int64_t elems;
    bool in_place;
    Path path;
  };
  using K = CollectiveKind;
  const std::vector<R> cases = {
      {K::kPsum, DType::kF32, 256, false, Path::kReads},       // 1 KiB each, the least
      {K::kPsum, DType::kF32, 255, false, Path::kSegment},     // 1020 B
      {K::kPmean, DType::kBF16, 40001, true, Path::kReads},    // odd, in place
      {K::kPmax, DType::kF64, 8193, true, Path::kReads},       // past the segment's 64 KiB
      {K::kPmin, DType::kI8, 100003, false, Path::kReads},
      {K::kPmean, DType::kI32, 30000, false, Path::kReads},    // to float32
      {K::kPsum, DType::kF16, 65536, true, Path::kReads},
      {K::kPsum, DType::kF32, 262144, true, Path::kReads},     // 2 MiB over the group, the most
      // Past it, each member reduces a share (ReduceBySplitReads).
      {K::kPsum, DType::kF32, 262145, false, Path::kSplit},
      {K::kPmean, DType::kI8, 1100001, false, Path::kSplit},   // widens: 4-byte results
      {K::kPsum, DType::kBool, 1100003, false, Path::kSplit},  // widens: int32 sums
      {K::kPmax, DType::kBF16, 1500007, true, Path::kSplit},   // in place
      {K::kPmin, DType::kI8, 1100001, false, Path::kSplit},
      {K::kPsum, DType::kF32, 4194304, true, Path::kSplit},    // 32 MiB over the group, the most
      {K::kPsum, DType::kF32, 4194305, true, Path::kDaemon},   // past it
  };
  uint32_t seed = 11;
  for (const R& c : cases) {
    ++seed;
    SCOPED_TRACE(absl::StrCat("kind ", static_cast<int>(c.kind), " dtype ",
                              static_cast<int>(c.dtype), " elems ", c.elems,
                              c.in_place ? " in place" : ""));
    const int64_t before = DaemonOps(*reads->daemon);
    std::vector<Mesh::MemberSidePaths> paths_before;
    for (int i = 0; i < kN; ++i) paths_before.push_back(reads->mesh(i).member_side_paths());
    const size_t in_bytes = DTypeSize(c.dtype) * c.elems;
    const size_t out_bytes = c.in_place ? in_bytes : static_cast<size_t>(c.elems) * 8;
    for (Members* r : {reads.get(), daemon_side.get()}) {
      for (int i = 0; i < kN; ++i) {
        Fill(r->in(i), in_bytes, seed * 31 + i);
        std::memset(r->out_data(i), 0xAB, out_bytes + 64);
      }
      ExpectAllOk(OnAll(kN, [&](int i) {
        return Reduce(*r, i, c.kind, c.dtype, c.elems, c.in_place, 0);
      }));
    }
    for (int i = 0; i < kN; ++i) {
      const uint8_t* got = c.in_place ? reads->in(i) : reads->out_data(i);
      const uint8_t* want = c.in_place ? daemon_side->in(i) : daemon_side->out_data(i);
      ASSERT_EQ(std::memcmp(got, want, out_bytes), 0) << "member " << i;
      if (!c.in_place) {
        ASSERT_EQ(std::memcmp(reads->out_data(i) + out_bytes, daemon_side->out_data(i) + out_bytes,
                              64),
                  0)
            << "member " << i << ": written past the output";
      }
    }
    EXPECT_EQ(DaemonOps(*reads->daemon) - before, c.path == Path::kDaemon ? 1 : 0);
    for (int i = 0; i < kN; ++i) {
      const Mesh::MemberSidePaths now = reads->mesh(i).member_side_paths();
      EXPECT_EQ(now.segment - paths_before[i].segment, c.path == Path::kSegment ? 1u : 0u) << i;
      EXPECT_EQ(now.reads - paths_before[i].reads, c.path == Path::kReads ? 1u : 0u) << i;
      EXPECT_EQ(now.split - paths_before[i].split, c.path == Path::kSplit ? 1u : 0u) << i;
      EXPECT_EQ(now.shared, 0u) << i;
    }
  }
  // A known sum, in place: the comparisons above would pass on an output
  // both sides left untouched; this one would not.
  for (int i = 0; i < kN; ++i) {
    std::fill_n(reinterpret_cast<float*>(reads->in(i)), 4096, static_cast<float>(i + 1));
  }
  ExpectAllOk(OnAll(kN, [&](int i) {
    return Reduce(*reads, i, CollectiveKind::kPsum, DType::kF32, 4096, true, 0);
  }));
  EXPECT_EQ(reinterpret_cast<const float*>(reads->in(0))[4095], 3.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(reads->in(1))[0], 3.0f);
  EXPECT_EQ(reads->mesh(0).member_reads(), "yes");
}

// Each member changes its input the moment its op returns: a member still
// reading it would get 0xFF bytes (NaN) into its sum. In place, the result
// must also not reach the buffer before the others read the input there.
// A reduction that splits its result: the same for the output, from which
// the others copy this member's share.
TEST(MemberReadsTest, AReductionsOwnerKeepsItsInputUntilEveryMemberReadIt) {
  constexpr int kN = 2;
  if (UsableCpus() < kN) GTEST_SKIP() << "its sizes take the paths of members with a CPU each";
  auto r = Members::Start(kN, {}, "mops", 4 << 20);
  ASSERT_NE(r, nullptr);
  const int64_t before = DaemonOps(*r->daemon);
  struct Size {
    int64_t elems;
    int ops;
  };
  // 64 KiB each (ReduceByReads), and 1.5 MiB (ReduceBySplitReads).
  for (const Size size : {Size{16384, 300}, Size{393216, 30}}) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(absl::StrCat(size.elems, in_place ? " in place" : " into the output buffer"));
      ExpectAllOk(OnAll(kN, [&](int i) -> absl::Status {
        float* in = reinterpret_cast<float*>(r->in(i));
        float* out = in_place ? in : reinterpret_cast<float*>(r->out_data(i) + 128);
        for (int it = 0; it < size.ops; ++it) {
          for (int64_t e = 0; e < size.elems; ++e) {
            in[e] = static_cast<float>(it * 4 + i + (e & 7));
          }
          if (absl::Status st =
                  Reduce(*r, i, CollectiveKind::kPsum, DType::kF32, size.elems, in_place, 128);
              !st.ok()) {
            return st;
          }
          // A split result: this member's share (its half: the shares are
          // whole pages) is what the other copies. It changes at once, and
          // only the other half is checked.
          int64_t check_from = 0, check_to = size.elems;
          if (size.elems * 4 * kN > (2 << 20)) {
            const int64_t half = size.elems / 2;
            std::memset(out + i * half, 0xFF, half * sizeof(float));
            check_from = i == 0 ? half : 0;
            check_to = check_from + half;
          }
          for (int64_t e = check_from; e < check_to; ++e) {
            const float want = static_cast<float>(2 * (it * 4 + (e & 7)) + 1);
            if (out[e] != want) {
              return absl::InternalError(
                  absl::StrCat("op ", it, ": element ", e, " is ", out[e], ", not ", want));
            }
          }
          std::memset(in, 0xFF, size.elems * sizeof(float));
          std::memset(out, 0xFF, size.elems * sizeof(float));
        }
        return absl::OkStatus();
      }));
    }
  }
  EXPECT_EQ(DaemonOps(*r->daemon), before);
  EXPECT_EQ(r->mesh(0).member_reads(), "yes");
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(r->mesh(i).member_side_paths().reads, 600u);
    EXPECT_EQ(r->mesh(i).member_side_paths().split, 60u);
  }
}

// Member 0 is the test, playing the protocol by hand against an SDK member
// that runs a psum whose members read each other's buffers: a member whose
// entry names a buffer that is not its own, or an input not at a multiple
// of its element size, and a member that leaves between the op's places,
// fail the op on the other member naming them. The same for the output of
// a psum that splits its result (ReduceBySplitReads), a member that leaves
// at its last place, and one that gives up there once it came (its program
// may then change its output while the other still copies from it; it
// takes its entry back, then marks the mesh broken). A member that left
// once it published its last place does not fail the op: the other had
// finished its reads when it found every member there.
TEST(MemberReadsTest, AReductionsReaderFailsNamingAMemberWhoseInputIsNotThereOrWhoLeft) {
  enum class Fault {
    kNoBuffer,
    kUnaligned,
    kLeaves,
    kNoOutput,
    kLeavesAfterShares,
    kGivesUp,
    kLeavesOnceDone
  };
  for (Fault fault : {Fault::kNoBuffer, Fault::kUnaligned, Fault::kLeaves, Fault::kNoOutput,
                      Fault::kLeavesAfterShares, Fault::kGivesUp, Fault::kLeavesOnceDone}) {
    SCOPED_TRACE(static_cast<int>(fault));
    const bool split = fault == Fault::kNoOutput || fault == Fault::kLeavesAfterShares ||
                       fault == Fault::kGivesUp || fault == Fault::kLeavesOnceDone;
    // 1 KiB, the least that reads; past 1 MiB each, the result splits.
    const int64_t elems = split ? 262145 : 256;
    const std::string op = absl::StrCat("psum f32[", elems, "] over (i)");
    auto d = Daemon::Start({"--op_timeout_ms=5000"});
    ASSERT_TRUE(d.ok()) << d.status();
    RawAndSdk members(**d);
    ASSERT_OK(members.Join(absl::StrCat("reads-fault-", static_cast<int>(fault)), 2 << 20));
    const member_ops::View& view = members.view;
    // Member 0's entry at place (0, s), once member 1 is done with the
    // place before it (its entry at s - 1 is there: this one reuses s - 2's).
    auto wait_for_member1 = [&](uint64_t s) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (view.entry(1, s)->key.load() != member_ops::Key(0, s) && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      return view.entry(1, s)->key.load() == member_ops::Key(0, s);
    };
    auto publish = [&](uint64_t s, const std::string& signature, const std::string& buffer = "",
                       uint64_t offset = 0, const std::string& out_buffer = "") {
      if (s > 0) wait_for_member1(s - 1);
      member_ops::Entry& e = *view.entry(0, s);
      e.in_bytes = 0;
      e.sig_len = static_cast<uint32_t>(signature.size());
      std::memcpy(e.signature, signature.data(), signature.size());
      ++e.sig_gen;  // new text (Entry::sig_gen)
      e.in_id_len = static_cast<uint32_t>(buffer.size());
      std::memcpy(view.payload(0, s), buffer.data(), buffer.size());
      e.in_offset = offset;
      e.out_id_len = static_cast<uint32_t>(out_buffer.size());
      std::memcpy(view.payload(0, s) + buffer.size(), out_buffer.data(), out_buffer.size());
      e.out_offset = 0;
      e.read_failed = 0;
      e.uid = static_cast<uint32_t>(getuid());
      e.key.store(member_ops::Key(0, s));
      member_ops::RingAll(view, 0);
    };
    Buffer b = *members.sdk->Allocate(static_cast<uint64_t>(elems) * 4);
    absl::Status st;
    std::thread member1([&] { st = members.mesh->psum(Array::Of<float>(b, {elems}), "i"); });
    publish(0, "probe: " + op);
    publish(1, "done: probe: " + op);
    const std::string& own = members.raw.buffer_id();
    publish(2, "read: " + op, fault == Fault::kNoBuffer ? std::string("b-nothing") : own,
            fault == Fault::kUnaligned ? 2 : 0,
            fault == Fault::kNoOutput ? std::string("b-nothing") : own);
    // The place member 1 waits at when member 0 leaves.
    uint64_t leave_at = 0;
    if (fault == Fault::kLeaves) leave_at = 3;
    if (fault == Fault::kLeavesOnceDone) {
      // Its last place before the one between (member 1 finds it there
      // when it comes: it no longer reads this entry), then the one
      // between, then the mesh breaks, as when a member that finished the
      // op leaves while member 1 still copies its share.
      publish(4, "done: read: " + op);
      publish(3, "reduced: " + op);
      const std::string why = "raw left";
      member_ops::MarkBroken(view, static_cast<uint32_t>(absl::StatusCode::kAborted), why.data(),
                             why.size());
    } else if (split && fault != Fault::kNoOutput) {
      publish(3, "reduced: " + op);
    }
    if (fault == Fault::kLeavesAfterShares) leave_at = 4;
    if (fault == Fault::kGivesUp) {
      // As MemberOps::Abandon leaves it at the last place: the entry taken
      // back (member 1 cannot have seen it there: see kLeavesOnceDone), the
      // mesh marked broken.
      ASSERT_TRUE(wait_for_member1(3));
      const std::string why = "raw gave up";
      member_ops::MarkBroken(view, static_cast<uint32_t>(absl::StatusCode::kAborted), why.data(),
                             why.size());
    }
    absl::Time gone = absl::Now();
    if (leave_at > 0) {
      // Member 1 read this member's buffer and waits at that place.
      ASSERT_TRUE(wait_for_member1(leave_at));
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::LeaveMeshRequest req;
      req.set_session_id(members.raw.id());
      req.set_mesh_id(members.raw.mesh_id());
      v1::LeaveMeshResponse resp;
      gone = absl::Now();
      ASSERT_TRUE(members.raw.stub().LeaveMesh(&ctx, req, &resp).ok());
    }
    member1.join();
    EXPECT_LT(absl::Now() - gone, absl::Seconds(2)) << "long before the 5 s op timeout";
    if (fault == Fault::kLeavesOnceDone) {
      EXPECT_TRUE(st.ok()) << st;
      continue;
    }
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    if (fault == Fault::kGivesUp) {
      EXPECT_CONTAINS(st.message(), "raw gave up");
    } else if (leave_at > 0) {
      EXPECT_CONTAINS(st.message(), "'raw'");
      EXPECT_CONTAINS(st.message(), "left the mesh");
    } else {
      EXPECT_CONTAINS(st.message(), fault == Fault::kNoOutput
                                        ? "member 1 cannot read member 0's output"
                                        : "member 1 cannot read member 0's input");
      EXPECT_CONTAINS(st.message(), fault == Fault::kUnaligned
                                        ? "offset 2 is not a multiple of its element size 4"
                                        : "'b-nothing' not found");
    }
  }
}

// A member whose process may use fewer CPUs than the mesh has members makes
// every member's reductions split their result from a smaller size (two
// members computing the whole result on one CPU cost more): the probe makes
// the choice common. Were each member to choose for itself, they would
// publish different places, and every such op would go to the daemon.
TEST(MemberReadsTest, AMemberWithoutACpuOfItsOwnMakesEveryMembersReductionsSplitSooner) {
  constexpr int kN = 2;
  // 256 KiB each: 512 KiB over the group, whole by each member with a CPU
  // each (up to 2 MiB), split without (above 256 KiB).
  constexpr int64_t kElems = 65536;
  if (UsableCpus() < kN) GTEST_SKIP() << "needs a CPU per member for member 0";
  auto d = Daemon::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  SdkMembers m;
  for (int i = 0; i < kN; ++i) {
    auto c = Client::Connect({.socket_path = (*d)->socket(), .client_name = absl::StrCat("cpu-", i)});
    ASSERT_TRUE(c.ok()) << c.status();
    m.clients.push_back(*std::move(c));
  }
  std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> joined(kN);
  std::vector<std::thread> joiners;
  for (int i = 0; i < kN; ++i) {
    joiners.emplace_back([&, i] {
      if (i == 1) {
        // Member 1 joins from a thread that may run on one CPU only.
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        EXPECT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
      }
      joined[i] = m.clients[i]->JoinMesh({.name = "cpus", .axes = {{"x", kN}}, .coordinate = {i}});
    });
  }
  for (auto& t : joiners) t.join();
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(joined[i].ok()) << joined[i].status();
    m.meshes.push_back(*std::move(joined[i]));
    m.buffers.push_back(*m.clients[i]->Allocate(kElems * 4));
  }
  const int64_t before = DaemonOps(**d);
  // 64 KiB (128 KiB over the group) then 256 KiB, 10 ops each.
  ExpectAllOk(OnAll(kN, [&](int i) -> absl::Status {
    float* x = static_cast<float*>(m.buffers[i].data());
    for (const int64_t elems : {kElems / 4, kElems}) {
      for (int it = 0; it < 10; ++it) {
        std::fill_n(x, elems, static_cast<float>(it + i));
        if (absl::Status st = m.meshes[i]->psum(Array::Of<float>(m.buffers[i], {elems}), "x");
            !st.ok()) {
          return st;
        }
        const float want = static_cast<float>(2 * it + 1);
        if (x[0] != want || x[elems - 1] != want) {
          return absl::InternalError(absl::StrCat(elems, " floats, op ", it, ": ", x[elems - 1]));
        }
      }
    }
    return absl::OkStatus();
  }));
  // Read, every op: none went to the daemon or through the segment.
  EXPECT_EQ(DaemonOps(**d), before);
  for (int i = 0; i < kN; ++i) {
    const Mesh::MemberSidePaths paths = m.meshes[i]->member_side_paths();
    EXPECT_EQ(paths.reads, 10u) << "member " << i;
    EXPECT_EQ(paths.split, 10u) << "member " << i;
    EXPECT_EQ(paths.segment, 0u) << "member " << i;
  }
  EXPECT_EQ(m.meshes[0]->member_reads(), "yes");
}

TEST(MemberReadsTest, InputsFromMoreBuffersThanAReaderKeepsMappedStayExact) {
  constexpr int kN = 2;
  constexpr int kBuffers = 12;  // more than kMappedPerMember: some are unmapped, mapped again
  static_assert(kBuffers > internal::member_reads::kMappedPerMember);
  auto r = Members::Start(kN, {});
  ASSERT_NE(r, nullptr);
  std::vector<std::vector<Buffer>> inputs(kN);
  for (int i = 0; i < kN; ++i) {
    for (int k = 0; k < kBuffers; ++k) inputs[i].push_back(*r->m.clients[i]->Allocate(8192 + k * 64));
  }
  ExpectAllOk(OnAll(kN, [&](int i) -> absl::Status {
    for (int round = 0; round < 2; ++round) {
      for (int k = 0; k < kBuffers; ++k) {
        std::memset(inputs[i][k].data(), 16 * k + i + round, 8192);
        absl::Status st = r->mesh(i).all_gather(Array{&inputs[i][k], 64, DType::kU8, {4096}},
                                                AxisNames::All(),
                                                Array{&r->out[i], 0, DType::kU8, {kN * 4096}},
                                                {.tiled = true});
        if (!st.ok()) return st;
        for (int m = 0; m < kN; ++m) {
          const uint8_t got = r->out_data(i)[m * 4096 + 4095];
          if (got != 16 * k + m + round) {
            return absl::InternalError(absl::StrCat("buffer ", k, " round ", round, ": member ",
                                                    m, "'s block ends with ", got));
          }
        }
      }
    }
    return absl::OkStatus();
  }));
  EXPECT_EQ(r->mesh(0).member_reads(), "yes");
}

TEST(MemberReadsTest, AMembersBufferGoesToTheOtherMembersOnlyAndReadOnly) {
  auto d = Daemon::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  RawAndSdk members(**d);  // raw: member 0, sdk: member 1
  ASSERT_OK(members.Join("peers"));
  RawSession& raw = members.raw;
  Buffer b = *members.sdk->Allocate(8192);
  std::memset(b.data(), 0x5A, 8192);
  const std::string ask = absl::StrCat("PEERFD ", raw.mesh_id(), " 1 ", b.id());
  auto given = raw.Request(ask);
  ASSERT_TRUE(given.ok()) << given.status();
  ASSERT_TRUE(given->fd.valid()) << given->data;
  EXPECT_EQ(given->data, "OK 8192");
  void* ro = mmap(nullptr, 8192, PROT_READ, MAP_SHARED, given->fd.get(), 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(static_cast<const uint8_t*>(ro)[8191], 0x5A);
  munmap(ro, 8192);
  // Read-only: no writable mapping, no resizing.
  EXPECT_EQ(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, given->fd.get(), 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  EXPECT_NE(ftruncate(given->fd.get(), 1), 0);
  EXPECT_EQ(b.size(), 8192u);

  RawSession stranger(**d, "stranger");
  auto unattached = stranger.Request(ask);
  ASSERT_TRUE(unattached.ok()) << unattached.status();
  EXPECT_CONTAINS(unattached->data, "attach the session");
  ASSERT_OK(stranger.Attach());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {ask, "not found among this session's meshes"},  // asked by a non-member
      {absl::StrCat("PEERFD ", raw.mesh_id(), " 0 ", b.id()), "not another member"},
      {absl::StrCat("PEERFD ", raw.mesh_id(), " 2 ", b.id()), "not another member"},
      {absl::StrCat("PEERFD ", raw.mesh_id(), " -1 ", b.id()), "not another member"},
      {absl::StrCat("PEERFD ", raw.mesh_id(), " x ", b.id()), "PEERFD needs"},
      {absl::StrCat("PEERFD ", raw.mesh_id(), " 1 b-nothing"), "not found among member 1's"},
      {absl::StrCat("PEERFD nomesh 1 ", b.id()), "not found among this session's meshes"},
  };
  for (size_t i = 0; i < refused.size(); ++i) {
    RawSession& who = i == 0 ? stranger : raw;
    auto reply = who.Request(refused[i].first);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_FALSE(reply->fd.valid()) << refused[i].first;
    EXPECT_CONTAINS(reply->data, "ERR");
    EXPECT_CONTAINS(reply->data, refused[i].second);
  }
  // A buffer its owner freed is gone for the others too.
  ASSERT_OK(members.sdk->Free(b));
  auto freed = raw.Request(ask);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_CONTAINS(freed->data, "not found among member 1's");
}

TEST(MemberReadsTest, TheEnvironmentTurnsReadsOffAndAnUnknownValueIsRefused) {
  {
    ScopedEnv off("COLLECTIVED_MEMBER_READS", "0");
    auto r = Members::Start(2, {});
    ASSERT_NE(r, nullptr);
    const int64_t before = DaemonOps(*r->daemon);
    for (int i = 0; i < 2; ++i) Fill(r->in(i), 65536, 5 + i);
    ExpectAllOk(OnAll(2, [&](int i) {
      return Gather(*r, i, DType::kF32, 16384, AxisNames::All(), true);
    }));
    EXPECT_EQ(std::memcmp(r->out_data(0) + 65536, r->in(1), 65536), 0);
    EXPECT_EQ(DaemonOps(*r->daemon), before);  // through the segment
    EXPECT_EQ(r->mesh(0).member_reads(), "no: COLLECTIVED_MEMBER_READS=0");
  }
  {
    ScopedEnv on("COLLECTIVED_MEMBER_READS", "1");
    auto r = Members::Start(2, {});
    ASSERT_NE(r, nullptr);
    ExpectAllOk(OnAll(2, [&](int i) {
      return Gather(*r, i, DType::kF32, 1024, AxisNames::All(), true);
    }));
    EXPECT_EQ(r->mesh(1).member_reads(), "yes");
  }
  ScopedEnv bad("COLLECTIVED_MEMBER_READS", "sometimes");
  auto d = Daemon::Start({});
  ASSERT_TRUE(d.ok()) << d.status();
  auto c = Client::Connect({.socket_path = (*d)->socket(), .client_name = "bad-env"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(c.status().message(), "COLLECTIVED_MEMBER_READS='sometimes'");
}

}  // namespace
}  // namespace collectived::testing
