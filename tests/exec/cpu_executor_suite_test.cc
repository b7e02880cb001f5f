// The executor suite (executor_suite.h) on the CPU executor, in host memory,
// in three configurations: small work items on the pool (every op crosses
// many chunks, no serial shortcut), the same writing every result with
// streaming stores, and the daemon's defaults.
#include "exec/cpu_executor.h"
#include "tests/exec/executor_suite.h"

namespace collectived::executor_suite {
namespace {

template <size_t kChunk, size_t kSerial, size_t kStream>
struct CpuBackend : HostMemoryBackend {
  static constexpr const char* kName = "cpu";
  static std::unique_ptr<Executor> MakeExecutor() {
    return std::make_unique<CpuExecutor>(CpuExecutorOptions{
        .threads = 3, .chunk_bytes = kChunk, .serial_bytes = kSerial, .stream_bytes = kStream});
  }
};

constexpr size_t kDefaultChunk = CpuExecutorOptions{}.chunk_bytes;
constexpr size_t kDefaultSerial = CpuExecutorOptions{}.serial_bytes;
constexpr size_t kDefaultStream = CpuExecutorOptions{}.stream_bytes;

using CpuChunked = CpuBackend<64, 0, kDefaultStream>;
using CpuStreaming = CpuBackend<64, 0, 0>;
using CpuDefaults = CpuBackend<kDefaultChunk, kDefaultSerial, kDefaultStream>;

INSTANTIATE_TYPED_TEST_SUITE_P(CpuChunked, ExecutorSuite, CpuChunked);
INSTANTIATE_TYPED_TEST_SUITE_P(CpuStreaming, ExecutorSuite, CpuStreaming);
INSTANTIATE_TYPED_TEST_SUITE_P(CpuDefaults, ExecutorSuite, CpuDefaults);

}  // namespace
}  // namespace collectived::executor_suite
