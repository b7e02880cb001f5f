// The SDK against an in-process daemon whose engine has a fake GPU (host
// memory calling itself "cuda", tests/fakes/fake_gpu.h): what Client::Allocate
// does with a buffer it cannot map. A daemon built without CUDA never hands
// out such a buffer, so this path is reachable only this way.
//
// Not in collectived_unit_tests: it runs gRPC in-process, which TSan builds
// cannot check (Debian's gRPC is not instrumented).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "collectived/client.h"
#include "daemon/core/engine.h"
#include "daemon/server/grpc_listener.h"
#include "daemon/server/service.h"
#include "daemon/server/side_channel.h"
#include "tests/fakes/fake_gpu.h"

namespace collectived {
namespace {

class SdkDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/collectived-sdk-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/d.sock";
    EngineOptions options;
    options.side_socket_path = socket_ + ".fds";
    engine_ = std::make_unique<Engine>(options, HostAndFakeGpu(nullptr));
    side_ = std::make_unique<SideChannel>(engine_.get(), nullptr);
    ASSERT_TRUE(side_->Start(socket_ + ".fds").ok());
    ASSERT_TRUE(listener_.Bind(socket_, 0600, -1).ok());
    service_ = std::make_unique<CollectiveService>(engine_.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    listener_.Start(server_.get());
  }

  void TearDown() override {
    if (engine_) engine_->Shutdown("test over");
    listener_.Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (side_) side_->Stop();
    server_.reset();
    side_.reset();
    engine_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_, socket_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SideChannel> side_;
  GrpcUnixListener listener_;
  std::unique_ptr<CollectiveService> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(SdkDeviceTest, GpuBufferIsFreedInTheDaemonAndRefusedAsUnimplemented) {
  auto client = Client::Connect({.socket_path = socket_, .client_name = "sdk", .fast_path = false});
  ASSERT_TRUE(client.ok()) << client.status();
  auto gpu = (*client)->Allocate(4096, "cuda:1");
  ASSERT_FALSE(gpu.ok());
#if COLLECTIVED_SDK_HAS_CUDA
  // The CUDA SDK tries to import it: the stand-in GPU's descriptor is host
  // memory on a GPU no driver knows, so the import fails (no driver here;
  // no such UUID on a GPU host), and the buffer is freed all the same.
  EXPECT_TRUE(gpu.status().code() == absl::StatusCode::kFailedPrecondition ||
              gpu.status().code() == absl::StatusCode::kNotFound)
      << gpu.status();
#else
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(std::string(gpu.status().message()),
            absl::StrCat("mapping CUDA buffers needs the SDK built with CUDA (device ",
                         FakeGpuBuffer::FakeDevice(1), ")"));
#endif
  // Nothing is left behind in the daemon.
  auto sessions = engine_->ListSessions();
  ASSERT_EQ(sessions.size(), 1);
  EXPECT_EQ(sessions[0].buffers, 0);
  EXPECT_EQ(engine_->GetStats().buffers_by_device.size(), 0);

  // Host memory maps as before, with either spelling, and says where it is.
  for (const char* device : {"", "cpu"}) {
    auto host = (*client)->Allocate(100, device);
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(host->device(), "cpu");
    EXPECT_GE(host->size(), 100u);
    host->as<uint8_t>()[99] = 7;
    ASSERT_TRUE((*client)->Free(*host).ok());
  }
  auto plain = (*client)->Allocate(8);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->device(), "cpu");
  Buffer moved = std::move(*plain);
  EXPECT_EQ(moved.device(), "cpu");

  // Bad names and a GPU the daemon does not have: the daemon's answer.
  EXPECT_EQ((*client)->Allocate(8, "gpu7").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->Allocate(8, "cuda:9").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->ListSessions()[0].buffers, 1);
}

// Python (and any garbage-collected binding) frees objects in no fixed order:
// a Mesh and a Buffer that outlive their Client fail cleanly, and free
// nothing twice (ASan checks the latter).
TEST_F(SdkDeviceTest, AMeshThatOutlivesItsClientFailsItsOpsCleanly) {
  auto client = Client::Connect({.socket_path = socket_, .client_name = "sdk"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto mesh = (*client)->JoinMesh({.name = "outlives", .axes = {{"i", 1}}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto buf = (*client)->Allocate(64);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const Array x = Array::Of<float>(*buf, {4});
  ASSERT_TRUE((*mesh)->psum(x, "i").ok());
  client->reset();  // the Client goes first
  EXPECT_EQ(engine_->ListSessions().size(), 0) << "the session outlived its Client";
  const absl::Status st = (*mesh)->psum(x, "i");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE((*mesh)->Leave().ok());
  mesh->reset();
  *buf = Buffer();  // unmapped once
}

// Mesh::submit(Collective) runs each kind as its method does, and refuses a
// kind out of range or a gather/scatter without an output, without sending.
TEST_F(SdkDeviceTest, SubmitRunsACollectiveGivenAsAValue) {
  auto client = Client::Connect({.socket_path = socket_, .client_name = "sdk"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto mesh = (*client)->JoinMesh({.name = "submit", .axes = {{"i", 1}}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto buf = (*client)->Allocate(64);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto out = (*client)->Allocate(64);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 4; ++i) buf->as<float>()[i] = static_cast<float>(i + 1);
  const Array x = Array::Of<float>(*buf, {4});

  // One member: psum is x; all_gather stacks it into [1, 4].
  EXPECT_TRUE((*mesh)->submit({.kind = CollectiveKind::kPsum, .x = x, .axes = "i"}).Wait().ok());
  EXPECT_EQ(buf->as<float>()[3], 4.0f);
  OpFuture gathered = (*mesh)->submit({.kind = CollectiveKind::kAllGather,
                                       .x = x,
                                       .out = Array::Of<float>(*out, {1, 4}),
                                       .axes = "i"});
  ASSERT_TRUE(gathered.Wait().ok());
  EXPECT_EQ(gathered.out_shape(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(out->as<float>()[2], 3.0f);
  EXPECT_TRUE((*mesh)->submit({.kind = CollectiveKind::kBarrier, .axes = "i"}).Wait().ok());

  auto submitted = [this] {
    const EngineStats s = engine_->GetStats();
    return s.submitted_fast_path + s.submitted_execute + s.submitted_unary;
  };
  const int64_t ops = submitted();
  EXPECT_GE(ops, 3);
  absl::Status st =
      (*mesh)->submit({.kind = CollectiveKind::kPsumScatter, .x = x, .axes = "i"}).Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("psum_scatter needs an output array"), std::string::npos) << st;
  st = (*mesh)->submit({.kind = static_cast<CollectiveKind>(42), .x = x, .axes = "i"}).Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("unknown collective kind 42"), std::string::npos) << st;
  EXPECT_EQ(submitted(), ops) << "a refused op reached the daemon";
  // The mesh is still usable.
  EXPECT_TRUE((*mesh)->submit({.kind = CollectiveKind::kPmax, .x = x, .axes = "i"}).Wait().ok());
}

// Stream-ordered submission needs the SDK built with CUDA and a usable GPU;
// without either, set_stream says which and leaves the mesh as it was (on the
// simple contract, its buffer for the words given back).
TEST_F(SdkDeviceTest, SetStreamWithoutAUsableGpuSaysWhyAndChangesNothing) {
  auto client = Client::Connect({.socket_path = socket_, .client_name = "sdk", .fast_path = false});
  ASSERT_TRUE(client.ok()) << client.status();
  auto mesh = (*client)->JoinMesh({.name = "streams", .axes = {{"i", 1}}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_TRUE((*mesh)->set_stream(nullptr).ok());
  // Any non-null handle: it is refused before it is used.
  void* stream = reinterpret_cast<void*>(uintptr_t{0x1000});
  absl::Status st = (*mesh)->set_stream(stream);
#if COLLECTIVED_SDK_HAS_CUDA
  if (st.ok()) GTEST_SKIP() << "this host has a usable GPU (the GPU tests cover set_stream)";
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
#else
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_EQ(std::string(st.message()), "stream-ordered submission needs the SDK built with CUDA");
#endif
  EXPECT_EQ((*mesh)->stream(), nullptr);
  EXPECT_EQ(engine_->ListSessions()[0].buffers, 0) << "the words' buffer was kept";
  // Ops run as before.
  auto buf = (*client)->Allocate(16);
  ASSERT_TRUE(buf.ok()) << buf.status();
  buf->as<float>()[0] = 2.5f;
  EXPECT_TRUE((*mesh)->psum(Array::Of<float>(*buf, {4}), "i").ok());
  EXPECT_EQ(buf->as<float>()[0], 2.5f);
}

// submit(op, stream) orders one op the same way, with the same refusals; a
// null stream is submit(op), and the mesh's own setting is never touched.
TEST_F(SdkDeviceTest, SubmitOnAStreamWithoutAUsableGpuSaysWhyAndChangesNothing) {
  auto client = Client::Connect({.socket_path = socket_, .client_name = "sdk", .fast_path = false});
  ASSERT_TRUE(client.ok()) << client.status();
  auto mesh = (*client)->JoinMesh({.name = "one-op", .axes = {{"i", 1}}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto buf = (*client)->Allocate(16);
  ASSERT_TRUE(buf.ok()) << buf.status();
  buf->as<float>()[0] = 1.5f;
  const Collective op{.kind = CollectiveKind::kPsum, .x = Array::Of<float>(*buf, {4}), .axes = "i"};
  absl::Status st = (*mesh)->submit(op, reinterpret_cast<void*>(uintptr_t{0x1000})).Wait();
#if COLLECTIVED_SDK_HAS_CUDA
  if (st.ok()) GTEST_SKIP() << "this host has a usable GPU (the GPU tests cover streams)";
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
#else
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
#endif
  EXPECT_EQ((*mesh)->stream(), nullptr);
  EXPECT_EQ(engine_->ListSessions()[0].buffers, 1) << "the words' buffer was kept";
  // An op the SDK refuses is refused as submit refuses it, before any stream work.
  Collective bad = op;
  bad.kind = static_cast<CollectiveKind>(42);
  st = (*mesh)->submit(bad, reinterpret_cast<void*>(uintptr_t{0x1000})).Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("unknown collective kind 42"), std::string::npos) << st;
  // A null stream is the plain op.
  EXPECT_TRUE((*mesh)->submit(op, nullptr).Wait().ok());
  EXPECT_EQ(buf->as<float>()[0], 1.5f);
}

}  // namespace
}  // namespace collectived
