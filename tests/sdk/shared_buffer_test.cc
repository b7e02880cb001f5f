// Buffers a mesh's members share (Mesh::AllocateShared, AllocateBuffer with
// a mesh id) against a real daemon, each member its own SDK client:
//  - every member's k-th call maps the same memory; sizes that differ,
//    sessions that are not members and calls after every holder freed it
//    are refused saying why;
//  - psum, pmean, pmax, pmin, all_gather and broadcast into one region of
//    it give every member the result, and the daemon writes it once
//    (GetStats' bytes_written);
//  - ops whose results differ between members, members naming different
//    regions, inputs inside the region and other meshes' ops are refused on
//    every member with FAILED_PRECONDITION, and the mesh goes on;
// on the fast path and over gRPC (COLLECTIVED_FAST_PATH=0, ctest's
// grpc_path. prefix).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectived/client.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "tests/ctl/sdk_members.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

constexpr int kMembers = 4;
constexpr int64_t kElems = 1024;

class SharedBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = Daemon::Start();
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    ASSERT_TRUE(MakeSdkMembers(daemon_->socket(), "shared", kMembers, kElems * 4, &m_).ok());
    for (int i = 0; i < kMembers; ++i) {
      float* in = static_cast<float*>(m_.buffers[i].data());
      for (int64_t e = 0; e < kElems; ++e) in[e] = static_cast<float>(i + 1) * 0.5f + e;
    }
  }

  // Runs `op(i)` on every member at once; the statuses.
  std::vector<absl::Status> OnAll(const std::function<absl::Status(int)>& op) {
    std::vector<absl::Status> st(kMembers);
    std::vector<std::thread> threads;
    for (int i = 0; i < kMembers; ++i) threads.emplace_back([&, i] { st[i] = op(i); });
    for (auto& t : threads) t.join();
    return st;
  }

  // Every member's AllocateShared(bytes).
  std::vector<Buffer> SharedOnAll(size_t bytes) {
    std::vector<Buffer> out;
    for (int i = 0; i < kMembers; ++i) {
      auto b = m_.meshes[i]->AllocateShared(bytes);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) return {};
      out.push_back(*std::move(b));
    }
    return out;
  }

  Array In(int i) const { return Array::Of<float>(m_.buffers[i], {kElems}); }

  // GetStats' bytes_written for `kind` ("psum", ...).
  int64_t BytesWritten(const std::string& kind) {
    auto stub = v1::Collective::NewStub(
        grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetStatsResponse resp;
    grpc::Status st = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    for (const auto& k : resp.by_kind()) {
      if (k.kind() == kind) return k.bytes_written();
    }
    return 0;
  }

  std::unique_ptr<Daemon> daemon_;
  SdkMembers m_;
};

TEST_F(SharedBufferTest, EveryMembersCallMapsTheSameMemory) {
  std::vector<Buffer> a = SharedOnAll(10000);
  std::vector<Buffer> b = SharedOnAll(4096);
  ASSERT_EQ(a.size(), static_cast<size_t>(kMembers));
  ASSERT_EQ(b.size(), static_cast<size_t>(kMembers));
  for (int i = 0; i < kMembers; ++i) {
    EXPECT_EQ(a[i].id(), a[0].id());
    EXPECT_EQ(b[i].id(), b[0].id());
    EXPECT_GE(a[i].size(), 10000u);
    EXPECT_NE(a[i].id(), b[i].id());
  }
  // Zeroed, and what one member writes the others read.
  for (size_t k = 0; k < a[0].size(); ++k) ASSERT_EQ(static_cast<uint8_t*>(a[2].data())[k], 0);
  std::memcpy(a[1].data(), "written by member 1", 20);
  for (int i = 0; i < kMembers; ++i) {
    EXPECT_STREQ(static_cast<const char*>(a[i].data()), "written by member 1");
  }
  // Each member frees its own mapping (the buffer goes with the last one).
  for (int i = 0; i < kMembers; ++i) EXPECT_TRUE(m_.clients[i]->Free(a[i]).ok()) << i;
}

TEST_F(SharedBufferTest, ABufferEveryHolderFreedIsGoneForLaterMembers) {
  auto first = m_.meshes[0]->AllocateShared(4096);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string id = first->id();
  ASSERT_TRUE(m_.clients[0]->Free(*first).ok());
  auto late = m_.meshes[1]->AllocateShared(4096);
  ASSERT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("was freed by every member that held it"),
            std::string::npos)
      << late.status();
  // The numbering goes on: every member's next call shares a new buffer.
  auto next0 = m_.meshes[0]->AllocateShared(4096);
  auto next1 = m_.meshes[1]->AllocateShared(4096);
  ASSERT_TRUE(next0.ok() && next1.ok()) << next0.status() << " " << next1.status();
  EXPECT_EQ(next0->id(), next1->id());
  EXPECT_NE(next0->id(), id);
}

TEST_F(SharedBufferTest, AnotherMeshsOpCannotWriteIntoIt) {
  std::vector<Buffer> shared = SharedOnAll(kElems * 4);
  ASSERT_EQ(shared.size(), static_cast<size_t>(kMembers));
  // Members 0 and 1 also form a mesh of two, and name mesh "shared"'s buffer.
  std::vector<std::unique_ptr<Mesh>> pair(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto m = m_.clients[i]->JoinMesh({.name = "pair", .axes = {{"y", 2}}, .coordinate = {i}});
      if (m.ok()) pair[i] = *std::move(m);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(pair[0] && pair[1]);
  std::vector<absl::Status> st(2);
  threads.clear();
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      st[i] = pair[i]->psum(In(i), AxisNames::All(), Array::Of<float>(shared[i], {kElems}));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << st[i];
    EXPECT_NE(st[i].message().find("a buffer shared by another mesh"), std::string::npos)
        << st[i];
  }
}

TEST_F(SharedBufferTest, ADifferentSizeOrANonMemberIsRefused) {
  auto first = m_.meshes[0]->AllocateShared(8192);
  ASSERT_TRUE(first.ok()) << first.status();
  // Rounded to the same pages, but not the same request.
  auto near = m_.meshes[2]->AllocateShared(8000);
  ASSERT_EQ(near.status().code(), absl::StatusCode::kFailedPrecondition) << near.status();
  auto other = m_.meshes[1]->AllocateShared(65536);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  EXPECT_NE(other.status().message().find("member 0 asked first"), std::string::npos)
      << other.status();
  EXPECT_NE(other.status().message().find("member 1 asks for 65536 bytes"), std::string::npos)
      << other.status();
  // Nothing changed: member 1's next call (the right size) gets the buffer.
  auto right = m_.meshes[1]->AllocateShared(8192);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->id(), first->id());

  // A session that is no member of the mesh, over gRPC.
  auto outsider = Client::Connect({.socket_path = daemon_->socket(), .client_name = "outsider"});
  ASSERT_TRUE(outsider.ok());
  auto stub = v1::Collective::NewStub(
      grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::AllocateBufferRequest req;
  req.set_session_id((*outsider)->session_id());
  req.set_size_bytes(8192);
  req.set_mesh_id(m_.meshes[0]->id());
  v1::AllocateBufferResponse resp;
  grpc::Status st = stub->AllocateBuffer(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("not a member"), std::string::npos) << st.error_message();
  // GPU memory is not shared yet.
  grpc::ClientContext ctx2;
  req.set_session_id(m_.clients[0]->session_id());
  req.set_device("cuda:0");
  st = stub->AllocateBuffer(&ctx2, req, &resp);
  EXPECT_TRUE(st.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
              st.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
      << st.error_message();
}

TEST_F(SharedBufferTest, ReductionsIntoASharedRegionAreWrittenOnce) {
  std::vector<Buffer> shared = SharedOnAll(kElems * 4 * 2);
  ASSERT_EQ(shared.size(), static_cast<size_t>(kMembers));
  struct Case {
    std::string kind;
    std::function<absl::Status(Mesh&, const Array&, const Array&)> op;
    std::function<float(int64_t)> expect;
  };
  auto value = [](int i, int64_t e) { return static_cast<float>(i + 1) * 0.5f + e; };
  // Asynchronous: the daemon writes them (synchronous small reductions run
  // member-side, the first member writing the result; member_ops_test).
  const std::vector<Case> cases = {
      {"psum",
       [](Mesh& m, const Array& x, const Array& o) {
         return m.psum_async(x, AxisNames::All(), o).Wait();
       },
       [&](int64_t e) {
         float s = 0;
         for (int i = 0; i < kMembers; ++i) s += value(i, e);
         return s;
       }},
      {"pmax",
       [](Mesh& m, const Array& x, const Array& o) {
         return m.pmax_async(x, AxisNames::All(), o).Wait();
       },
       [&](int64_t e) { return value(kMembers - 1, e); }},
      {"pmin",
       [](Mesh& m, const Array& x, const Array& o) {
         return m.pmin_async(x, AxisNames::All(), o).Wait();
       },
       [&](int64_t e) { return value(0, e); }},
      {"broadcast",
       [](Mesh& m, const Array& x, const Array& o) { return m.broadcast(x, AxisNames::All(), 2, o); },
       [&](int64_t e) { return value(2, e); }},
  };
  for (const Case& c : cases) {
    const int64_t before = BytesWritten(c.kind);
    // The second half of the buffer: an offset other than 0.
    for (const absl::Status& st : OnAll([&](int i) {
           return c.op(*m_.meshes[i], In(i), Array::Of<float>(shared[i], {kElems}, kElems * 4));
         })) {
      ASSERT_TRUE(st.ok()) << c.kind << ": " << st;
    }
    for (int i = 0; i < kMembers; ++i) {
      const float* out = static_cast<const float*>(shared[i].data()) + kElems;
      for (int64_t e = 0; e < kElems; ++e) {
        ASSERT_EQ(out[e], c.expect(e)) << c.kind << " member " << i << " element " << e;
      }
    }
    EXPECT_EQ(BytesWritten(c.kind) - before, kElems * 4) << c.kind << ": written once";
  }
  // pmean: float results of the same shape.
  for (const absl::Status& st : OnAll([&](int i) {
         return m_.meshes[i]->pmean(In(i), AxisNames::All(), Array::Of<float>(shared[i], {kElems}));
       })) {
    ASSERT_TRUE(st.ok()) << st;
  }
  const float* mean = static_cast<const float*>(shared[0].data());
  EXPECT_EQ(mean[3], (value(0, 3) + value(1, 3) + value(2, 3) + value(3, 3)) / kMembers);
}

TEST_F(SharedBufferTest, AllGatherIntoASharedRegionIsWrittenOnce) {
  std::vector<Buffer> shared = SharedOnAll(kElems * 4 * kMembers);
  ASSERT_EQ(shared.size(), static_cast<size_t>(kMembers));
  const int64_t before = BytesWritten("all_gather");
  for (const absl::Status& st : OnAll([&](int i) {
         // Asynchronous: the daemon writes it (a synchronous one would run
         // member-side, each member writing its block; member_ops_test).
         return m_.meshes[i]
             ->all_gather_async(In(i), AxisNames::All(),
                                Array::Of<float>(shared[i], {kMembers, kElems}))
             .Wait();
       })) {
    ASSERT_TRUE(st.ok()) << st;
  }
  const float* out = static_cast<const float*>(shared[3].data());
  for (int i = 0; i < kMembers; ++i) {
    for (int64_t e = 0; e < kElems; e += 97) {
      ASSERT_EQ(out[i * kElems + e], static_cast<float>(i + 1) * 0.5f + e) << i << "," << e;
    }
  }
  EXPECT_EQ(BytesWritten("all_gather") - before, kElems * 4 * kMembers);
}

TEST_F(SharedBufferTest, OpsThatBreakTheRuleAreRefusedOnEveryMemberAndTheMeshGoesOn) {
  std::vector<Buffer> shared = SharedOnAll(kElems * 4 * 2);
  ASSERT_EQ(shared.size(), static_cast<size_t>(kMembers));
  auto region = [&](int i, size_t offset) { return Array::Of<float>(shared[i], {kElems}, offset); };
  auto expect_refused = [&](const std::vector<absl::Status>& st, const std::string& why) {
    for (int i = 0; i < kMembers; ++i) {
      EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << i << ": " << st[i];
      EXPECT_NE(st[i].message().find(why), std::string::npos) << i << ": " << st[i];
    }
  };
  std::memset(shared[0].data(), 0x5A, shared[0].size());
  // A ppermute gives each member its own result.
  expect_refused(OnAll([&](int i) {
                   return m_.meshes[i]->ppermute(In(i), AxisNames::All(), {{0, 1}, {1, 0}},
                                                 region(i, 0));
                 }),
                 "ppermute gives members different results");
  // Member 3 names the other half.
  expect_refused(OnAll([&](int i) {
                   return m_.meshes[i]->psum(In(i), AxisNames::All(),
                                             region(i, i == 3 ? kElems * 4 : 0));
                 }),
                 "member 3 writes its result elsewhere");
  // Member 1's input is the region itself (in place).
  expect_refused(OnAll([&](int i) {
                   return i == 1 ? m_.meshes[i]->psum(region(i, 0), AxisNames::All())
                                 : m_.meshes[i]->psum(In(i), AxisNames::All(), region(i, 0));
                 }),
                 "the input of member 1 overlaps it");
  // Nothing was written, and the mesh goes on.
  for (size_t k = 0; k < shared[0].size(); ++k) {
    ASSERT_EQ(static_cast<uint8_t*>(shared[2].data())[k], 0x5A) << k;
  }
  for (const absl::Status& st :
       OnAll([&](int i) { return m_.meshes[i]->psum(In(i), AxisNames::All(), region(i, 0)); })) {
    EXPECT_TRUE(st.ok()) << st;
  }
}

TEST_F(SharedBufferTest, AnInputInsideTheSharedOutputIsRefused) {
  std::vector<Buffer> shared = SharedOnAll(kElems * 4 * 2);
  ASSERT_EQ(shared.size(), static_cast<size_t>(kMembers));
  // Member 2 reads its input from the first half, which every member names
  // as the output.
  std::vector<absl::Status> st = OnAll([&](int i) {
    const Array x = i == 2 ? Array::Of<float>(shared[i], {kElems}, 0) : In(i);
    return m_.meshes[i]->psum(x, AxisNames::All(), Array::Of<float>(shared[i], {kElems}, 0));
  });
  for (int i = 0; i < kMembers; ++i) {
    EXPECT_EQ(st[i].code(), absl::StatusCode::kFailedPrecondition) << i << ": " << st[i];
    EXPECT_NE(st[i].message().find("the input of member 2 overlaps it"), std::string::npos)
        << i << ": " << st[i];
  }
}

}  // namespace
}  // namespace collectived::testing
