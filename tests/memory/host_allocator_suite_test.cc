// The allocator suite (allocator_suite.h) on host memory (memfd) and on the
// tests' fake GPU (host memory calling itself "cuda", tests/fakes/fake_gpu.h).
#include "tests/memory/allocator_suite.h"

#include "tests/fakes/fake_gpu.h"

namespace collectived::testing {
namespace {

struct Memfd : HostBytes {
  static constexpr const char* kName = "memfd";
  static std::unique_ptr<BufferAllocator> Make() { return MakeMemfdAllocator(); }
  static constexpr const char* kDevice = "cpu";
  static constexpr const char* kMissingDevice = "";
  static constexpr bool kHostMapped = true;
};

struct FakeGpu : HostBytes {
  static constexpr const char* kName = "fake GPU";
  static std::unique_ptr<BufferAllocator> Make() { return std::make_unique<FakeGpuAllocator>(); }
  static constexpr const char* kDevice = "cuda:1";
  static constexpr const char* kMissingDevice = "cuda:2";
  static constexpr bool kHostMapped = true;
};

INSTANTIATE_TYPED_TEST_SUITE_P(Memfd, AllocatorSuite, Memfd);
INSTANTIATE_TYPED_TEST_SUITE_P(FakeGpu, AllocatorSuite, FakeGpu);

}  // namespace
}  // namespace collectived::testing
