#include "daemon/memory/buffer_allocator.h"

#include <gtest/gtest.h>

#include <cstring>

namespace collectived {
namespace {

TEST(ParseDeviceTest, AcceptsTheDocumentedForms) {
  for (const char* cpu : {"", "cpu"}) {
    auto d = ParseDevice(cpu);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->kind, DeviceSpec::Kind::kCpu);
    EXPECT_EQ(d->ToString(), "cpu");
    EXPECT_EQ(d->buffer_kind(), "memfd");
  }
  auto d = ParseDevice("cuda:0");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, DeviceSpec::Kind::kCuda);
  EXPECT_EQ(d->ordinal, 0);
  EXPECT_TRUE(d->uuid.empty());
  EXPECT_EQ(d->ToString(), "cuda:0");
  EXPECT_EQ(d->buffer_kind(), "cuda");
  d = ParseDevice("cuda:17");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ordinal, 17);
  EXPECT_EQ(d->ToString(), "cuda:17");
  const std::string uuid = "GPU-5f8e3a1c-0b2d-4e6f-9a7b-1c2d3e4f5a6b";
  for (const std::string& text : {uuid, "cuda:" + uuid}) {
    d = ParseDevice(text);
    ASSERT_TRUE(d.ok()) << text << ": " << d.status();
    EXPECT_EQ(d->kind, DeviceSpec::Kind::kCuda);
    EXPECT_EQ(d->ordinal, -1);
    EXPECT_EQ(d->uuid, uuid);
    EXPECT_EQ(d->ToString(), "cuda:" + uuid);
  }
}

TEST(ParseDeviceTest, RefusesEverythingElseNamingTheAcceptedForms) {
  for (const char* bad :
       {"gpu7", "CPU", "cpu0", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:1 ",
        "cuda:1x", "cuda:0x1", "cuda:1234567890", "cuda:GPU-", "GPU-", "GPU-xyz",
        "cuda:GPU-12 34", "cuda:gpu-1234", "cuda:0:1", " cpu", "host"}) {
    auto d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << "'" << bad << "' was accepted";
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("accepted: \"\" or \"cpu\""), absl::string_view::npos)
        << d.status();
    EXPECT_NE(d.status().message().find("cuda:GPU-<uuid>"), absl::string_view::npos)
        << d.status();
  }
  EXPECT_EQ(ParseDevice(std::string(200, 'c')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemfdAllocatorTest, AllocatesZeroedHostMemoryOnCpuOnly) {
  auto alloc = MakeMemfdAllocator();
  EXPECT_EQ(alloc->kind(), "memfd");
  EXPECT_TRUE(alloc->Viable().ok());
  auto buf = alloc->Allocate(100, DeviceSpec{});
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ((*buf)->kind(), "memfd");
  EXPECT_EQ((*buf)->device(), "cpu");
  EXPECT_EQ((*buf)->device_ordinal(), -1);
  EXPECT_GE((*buf)->size(), 100u);
  EXPECT_EQ((*buf)->size() % PageSize(), 0u);
  EXPECT_GE((*buf)->fd(), 0);
  const auto* p = static_cast<const uint8_t*>((*buf)->data());
  for (size_t i = 0; i < (*buf)->size(); ++i) ASSERT_EQ(p[i], 0) << i;

  EXPECT_EQ(alloc->Allocate(0, DeviceSpec{}).status().code(), absl::StatusCode::kInvalidArgument);
  auto cuda = ParseDevice("cuda:0");
  ASSERT_TRUE(cuda.ok());
  auto refused = alloc->Allocate(4096, *cuda);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cuda:0"), absl::string_view::npos) << refused.status();
}

}  // namespace
}  // namespace collectived
