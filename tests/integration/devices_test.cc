// Buffer devices across processes: a daemon without a usable GPU (built
// without CUDA, or in the CUDA variant on a host with no GPU or driver), asked for
// GPU memory by a client process through the SDK and through plain gRPC,
// refuses it saying why, refuses malformed device names, and changes
// nothing; host memory on "cpu" works as before. The daemon logs at start
// which executors and allocators it runs and why it runs no other.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectived/client.h"
#include "collectived/v1/collective.grpc.pb.h"
#include "tests/harness/harness.h"

namespace collectived::testing {
namespace {

// Why the daemon has no CUDA allocator and executor: the build says it, or,
// in the CUDA variant, the driver does (whatever it says, the message gives it).
#if COLLECTIVED_DAEMON_HAS_CUDA
constexpr bool kCudaVariant = true;
#else
constexpr bool kCudaVariant = false;
#endif

// `message` refuses GPU memory on `device` for the reason of this variant.
void ExpectNoCudaAllocator(const std::string& message, const std::string& device) {
  const std::string prefix =
      absl::StrCat("device ", device, ": this daemon has no usable CUDA allocator: ");
  if (!kCudaVariant) {
    EXPECT_EQ(message, prefix + "built without CUDA");
  } else {
    EXPECT_TRUE(absl::StartsWith(message, prefix)) << message;
    EXPECT_GT(message.size(), prefix.size()) << message;
    EXPECT_FALSE(absl::StrContains(message, "built without CUDA")) << message;
  }
}

std::unique_ptr<v1::Collective::Stub> StubOf(const Daemon& d) {
  return v1::Collective::NewStub(
      grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials()));
}

// The session of client `name`, as ListSessions shows it.
v1::SessionInfo SessionNamed(v1::Collective::Stub& stub, const std::string& name) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListSessionsResponse resp;
  grpc::Status st = stub.ListSessions(&ctx, v1::ListSessionsRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  for (const auto& s : resp.sessions()) {
    if (s.client_name() == name) return s;
  }
  ADD_FAILURE() << "no session of client '" << name << "'";
  return {};
}

v1::GetStatsResponse Stats(v1::Collective::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetStatsResponse resp;
  grpc::Status st = stub.GetStats(&ctx, v1::GetStatsRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp;
}

TEST(DevicesTest, CpuOnlyDaemonRefusesGpuMemorySayingWhyAndChangesNothing) {
  auto daemon = Daemon::Start();
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto stub = StubOf(**daemon);
  {
    auto client = Client::Connect({.socket_path = (*daemon)->socket(), .client_name = "devices"});
    ASSERT_TRUE(client.ok()) << client.status();

    auto gpu = (*client)->Allocate(4096, "cuda:0");
    if (kCudaVariant && gpu.ok()) {
      GTEST_SKIP() << "this host has a usable GPU (" << gpu->device()
                   << "): the gpu-labelled tests cover it";
    }
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
    ExpectNoCudaAllocator(std::string(gpu.status().message()), "cuda:0");
    auto bad = (*client)->Allocate(4096, "gpu7");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "device 'gpu7' is not a device name"))
        << bad.status();
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "\"cuda:N\"")) << bad.status();

    // The failed calls changed nothing.
    v1::SessionInfo session = SessionNamed(*stub, "devices");
    EXPECT_EQ(session.buffers(), 0);
    EXPECT_EQ(session.buffer_bytes(), 0);
    EXPECT_EQ(session.buffers_by_device_size(), 0);
    EXPECT_EQ(Stats(*stub).buffers(), 0);

    // Host memory, named or not.
    auto host = (*client)->Allocate(4096, "cpu");
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(host->device(), "cpu");
    host->as<uint32_t>()[0] = 42;
    session = SessionNamed(*stub, "devices");
    EXPECT_EQ(session.buffers(), 1);
    ASSERT_EQ(session.buffers_by_device_size(), 1);
    EXPECT_EQ(session.buffers_by_device(0).device(), "cpu");
    EXPECT_EQ(session.buffers_by_device(0).kind(), "memfd");
    EXPECT_EQ(session.buffers_by_device(0).buffers(), 1);
    EXPECT_EQ(session.buffers_by_device(0).buffer_bytes(), 4096);
    v1::GetStatsResponse stats = Stats(*stub);
    EXPECT_EQ(stats.buffers(), 1);
    ASSERT_EQ(stats.buffers_by_device_size(), 1);
    EXPECT_EQ(stats.buffers_by_device(0).device(), "cpu");
  }

  // The same over plain gRPC, a GPU named by UUID.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::CreateSessionRequest create;
    create.set_client_name("grpc-devices");
    v1::CreateSessionResponse session;
    ASSERT_TRUE(stub->CreateSession(&ctx, create, &session).ok());
    for (const char* device : {"GPU-5f8e3a1c-0b2d-4e6f-9a7b-1c2d3e4f5a6b", "cuda:-1"}) {
      grpc::ClientContext alloc_ctx;
      alloc_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::AllocateBufferRequest req;
      req.set_session_id(session.session_id());
      req.set_size_bytes(4096);
      req.set_device(device);
      v1::AllocateBufferResponse resp;
      grpc::Status st = stub->AllocateBuffer(&alloc_ctx, req, &resp);
      if (std::string(device) == "cuda:-1") {
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
      } else {
        EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
        ExpectNoCudaAllocator(st.error_message(),
                              "cuda:GPU-5f8e3a1c-0b2d-4e6f-9a7b-1c2d3e4f5a6b");
      }
    }
    EXPECT_EQ(SessionNamed(*stub, "grpc-devices").buffers(), 0);
  }

  stub.reset();  // a channel left open makes the daemon's shutdown wait for it
  ChildResult stopped = (*daemon)->Stop();
  EXPECT_TRUE(absl::StrContains(stopped.output,
                                "event=executor name=cpu kind=memfd viable=true"))
      << stopped.output;
  EXPECT_TRUE(absl::StrContains(stopped.output, "event=allocator kind=memfd viable=true"))
      << stopped.output;
  if (!kCudaVariant) {
    EXPECT_TRUE(absl::StrContains(
        stopped.output, "event=executor kind=cuda viable=false reason=\"built without CUDA\""))
        << stopped.output;
    EXPECT_TRUE(absl::StrContains(
        stopped.output, "event=allocator kind=cuda viable=false reason=\"built without CUDA\""))
        << stopped.output;
  } else {
    // The CUDA candidates were tried and dropped, each saying why.
    EXPECT_TRUE(absl::StrContains(stopped.output,
                                  "event=executor name=cuda kind=cuda viable=false reason="))
        << stopped.output;
    EXPECT_TRUE(absl::StrContains(stopped.output, "event=allocator kind=cuda viable=false reason="))
        << stopped.output;
  }
}

}  // namespace
}  // namespace collectived::testing
