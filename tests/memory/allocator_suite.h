// One test suite for every buffer allocator (daemon/memory/buffer_allocator.h):
// the same cases run on each kind of memory (GoogleTest type-parameterized
// tests), so a new allocator is checked against the contract the engine
// relies on, as tests/exec/executor_suite.h checks executors.
//
// An allocator is a traits type:
//
//   struct MyAllocator {
//     static constexpr const char* kName = "...";   // shown in skip messages
//     static std::unique_ptr<BufferAllocator> Make();
//     static constexpr const char* kDevice = "...";  // a device it has
//     // A device of its kind it does not have ("": it has every one).
//     static constexpr const char* kMissingDevice = "...";
//     // data() and an mmap of fd() are host memory (false: device memory,
//     // reached through Read/Write only).
//     static constexpr bool kHostMapped = true;
//     // `n` bytes at `offset` of the buffer, to and from host memory.
//     static absl::Status Read(const SharedBuffer& b, size_t offset, void* out, size_t n);
//     static absl::Status Write(SharedBuffer& b, size_t offset, const void* in, size_t n);
//   };
//   INSTANTIATE_TYPED_TEST_SUITE_P(My, AllocatorSuite, MyAllocator);
//
// When the allocator is not Viable() here (the CUDA allocator on a host
// without a GPU) every case is skipped with its reason.
//
// The cases: the buffer's kind and device are the allocator's; every
// buffer is at least the size asked and zero-filled; 0 bytes is
// INVALID_ARGUMENT; a device it does not have is NOT_FOUND naming one it
// has; buffers never alias; fd() shares the memory (host kinds); a buffer
// outlives its allocator; concurrent allocations all succeed.
#ifndef COLLECTIVED_TESTS_MEMORY_ALLOCATOR_SUITE_H_
#define COLLECTIVED_TESTS_MEMORY_ALLOCATOR_SUITE_H_

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/device.h"
#include "daemon/memory/buffer_allocator.h"

namespace collectived::testing {

template <typename Traits>
class AllocatorSuite : public ::testing::Test {
 protected:
  void SetUp() override {
    allocator_ = Traits::Make();
    ASSERT_NE(allocator_, nullptr);
    if (absl::Status v = allocator_->Viable(); !v.ok()) {
      GTEST_SKIP() << Traits::kName << " allocator is not viable here: " << v;
    }
    auto d = ParseDevice(Traits::kDevice);
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = *d;
  }

  // Whether `n` bytes at `offset` of `b` are all `value`.
  static ::testing::AssertionResult AllBytes(const SharedBuffer& b, size_t offset, size_t n,
                                             uint8_t value) {
    std::vector<uint8_t> host(n);
    if (absl::Status st = Traits::Read(b, offset, host.data(), n); !st.ok()) {
      return ::testing::AssertionFailure() << "read: " << st;
    }
    for (size_t i = 0; i < n; ++i) {
      if (host[i] != value) {
        return ::testing::AssertionFailure()
               << "byte " << offset + i << " is " << int{host[i]} << ", not " << int{value};
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::unique_ptr<BufferAllocator> allocator_;
  DeviceSpec device_;
};

TYPED_TEST_SUITE_P(AllocatorSuite);

TYPED_TEST_P(AllocatorSuite, BuffersHaveTheAllocatorsKindAndTheDevice) {
  auto b = this->allocator_->Allocate(4096, this->device_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->kind(), this->allocator_->kind());
  if (this->device_.kind == DeviceSpec::Kind::kCpu) {
    EXPECT_EQ((*b)->device(), "cpu");
    EXPECT_EQ((*b)->device_ordinal(), -1);
  } else {
    // The canonical form: by UUID, whatever form the request used.
    EXPECT_EQ((*b)->device().rfind("cuda:GPU-", 0), 0u) << (*b)->device();
    EXPECT_GE((*b)->device_ordinal(), 0);
  }
  EXPECT_GE((*b)->fd(), 0);
  EXPECT_NE((*b)->data(), nullptr);
}

TYPED_TEST_P(AllocatorSuite, EveryBufferIsAtLeastItsSizeAndZeroFilled) {
  for (size_t bytes : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097},
                       (size_t{3} << 20) + 5}) {
    auto b = this->allocator_->Allocate(bytes, this->device_);
    ASSERT_TRUE(b.ok()) << bytes << ": " << b.status();
    EXPECT_GE((*b)->size(), bytes);
    EXPECT_TRUE(this->AllBytes(**b, 0, (*b)->size(), 0)) << bytes << " bytes asked";
  }
}

TYPED_TEST_P(AllocatorSuite, ZeroBytesIsInvalidArgument) {
  EXPECT_EQ(this->allocator_->Allocate(0, this->device_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TYPED_TEST_P(AllocatorSuite, ADeviceItDoesNotHaveIsNotFoundNamingOneItHas) {
  if (std::string(TypeParam::kMissingDevice).empty()) {
    GTEST_SKIP() << TypeParam::kName << " has every device of its kind";
  }
  auto missing = ParseDevice(TypeParam::kMissingDevice);
  ASSERT_TRUE(missing.ok()) << missing.status();
  auto b = this->allocator_->Allocate(4096, *missing);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
  EXPECT_NE(b.status().message().find(TypeParam::kDevice), absl::string_view::npos)
      << b.status();
}

TYPED_TEST_P(AllocatorSuite, BuffersDoNotAlias) {
  auto a = this->allocator_->Allocate(8192, this->device_);
  auto b = this->allocator_->Allocate(8192, this->device_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->data(), (*b)->data());
  EXPECT_NE((*a)->fd(), (*b)->fd());
  std::vector<uint8_t> pattern(8192, 0xa5);
  ASSERT_TRUE(TypeParam::Write(**a, 0, pattern.data(), pattern.size()).ok());
  EXPECT_TRUE(this->AllBytes(**a, 0, 8192, 0xa5));
  EXPECT_TRUE(this->AllBytes(**b, 0, 8192, 0));
}

TYPED_TEST_P(AllocatorSuite, TheDescriptorSharesTheMemory) {
  if (!TypeParam::kHostMapped) {
    GTEST_SKIP() << TypeParam::kName << ": fd() is imported by clients through the driver";
  }
  auto b = this->allocator_->Allocate(8192, this->device_);
  ASSERT_TRUE(b.ok()) << b.status();
  void* m = mmap(nullptr, (*b)->size(), PROT_READ | PROT_WRITE, MAP_SHARED, (*b)->fd(), 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* other = static_cast<uint8_t*>(m);
  const uint8_t in = 0x3c;
  ASSERT_TRUE(TypeParam::Write(**b, 100, &in, 1).ok());
  EXPECT_EQ(other[100], 0x3c);  // written through data(), seen in the mapping
  other[8000] = 0x77;
  EXPECT_TRUE(this->AllBytes(**b, 8000, 1, 0x77));  // and the other way
  munmap(m, (*b)->size());
}

TYPED_TEST_P(AllocatorSuite, ABufferOutlivesItsAllocator) {
  auto b = this->allocator_->Allocate(4096, this->device_);
  ASSERT_TRUE(b.ok()) << b.status();
  this->allocator_.reset();
  const uint8_t in[4] = {1, 2, 3, 4};
  ASSERT_TRUE(TypeParam::Write(**b, 4092, in, 4).ok());
  uint8_t out[4] = {};
  ASSERT_TRUE(TypeParam::Read(**b, 4092, out, 4).ok());
  EXPECT_EQ(std::memcmp(in, out, 4), 0);
}

TYPED_TEST_P(AllocatorSuite, ConcurrentAllocationsAllSucceedAndDiffer) {
  constexpr int kThreads = 4, kEach = 8;
  std::vector<std::vector<std::shared_ptr<SharedBuffer>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto b = this->allocator_->Allocate(4096 * (1 + i % 3), this->device_);
        if (b.ok()) got[t].push_back(*std::move(b));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<const void*> addresses;
  for (const auto& list : got) {
    EXPECT_EQ(list.size(), static_cast<size_t>(kEach));
    for (const auto& b : list) addresses.insert(b->data());
  }
  EXPECT_EQ(addresses.size(), static_cast<size_t>(kThreads * kEach));
}

REGISTER_TYPED_TEST_SUITE_P(AllocatorSuite, BuffersHaveTheAllocatorsKindAndTheDevice,
                            EveryBufferIsAtLeastItsSizeAndZeroFilled, ZeroBytesIsInvalidArgument,
                            ADeviceItDoesNotHaveIsNotFoundNamingOneItHas, BuffersDoNotAlias,
                            TheDescriptorSharesTheMemory, ABufferOutlivesItsAllocator,
                            ConcurrentAllocationsAllSucceedAndDiffer);

// Host memory: data() is the bytes.
struct HostBytes {
  static absl::Status Read(const SharedBuffer& b, size_t offset, void* out, size_t n) {
    std::memcpy(out, static_cast<const uint8_t*>(b.data()) + offset, n);
    return absl::OkStatus();
  }
  static absl::Status Write(SharedBuffer& b, size_t offset, const void* in, size_t n) {
    std::memcpy(static_cast<uint8_t*>(b.data()) + offset, in, n);
    return absl::OkStatus();
  }
};

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_MEMORY_ALLOCATOR_SUITE_H_
