// GPU buffers: the CUDA driver loader, the CUDA VMM allocator and the SDK's
// import of its buffers in another process.
//
// CudaNoGpu*: run anywhere; where there is no driver they check that its
//   absence is reported precisely and that nothing crashes (on a host with a
//   driver they skip: what they check does not exist there).
// CudaGpu*: need a GPU; without one they skip with the reason (or fail, with
//   COLLECTIVED_REQUIRE_GPU=1, as the GPU machine's check script sets).
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/src/cuda_import.h"
#include "common/cuda/driver.h"
#include "daemon/memory/cuda_vmm_buffer.h"
#include "gtest/gtest.h"
#include "tests/cuda/pattern.h"
#include "tests/harness/require_gpu.h"

extern char** environ;

namespace collectived {
namespace {

using cuda::DriverApi;

constexpr char kNoDriver[] =
    "CUDA driver not found: libcuda.so.1 could not be loaded (no NVIDIA driver on this host)";

bool DriverLibraryPresent() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  return h != nullptr;  // kept open: harmless in a test
}

DeviceSpec CudaOrdinal(int ordinal) {
  DeviceSpec spec;
  spec.kind = DeviceSpec::Kind::kCuda;
  spec.ordinal = ordinal;
  return spec;
}

DeviceSpec CudaUuid(const std::string& uuid) {
  DeviceSpec spec;
  spec.kind = DeviceSpec::Kind::kCuda;
  spec.uuid = uuid;
  return spec;
}

#define SKIP_IF_DRIVER_PRESENT()                                                     \
  if (DriverLibraryPresent()) {                                                      \
    GTEST_SKIP() << "libcuda.so.1 is installed here: this checks a host without it"; \
  }

// A helper process (fork+exec) with `fd` as its descriptor 3 and pipes on
// its stdin and stdout.
struct Helper {
  pid_t pid = -1;
  int in = -1;   // its stdin
  int out = -1;  // its stdout

  static Helper Start(int fd, const std::vector<std::string>& args) {
    Helper h;
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return h;
    // Through a copy numbered above 3: dup2 onto itself would keep the
    // buffer descriptor's close-on-exec flag.
    const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    if (copy < 0) return h;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);  // before 3: a pipe may be 3
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, copy, 3);
    std::vector<std::string> argv = {COLLECTIVED_CUDA_IMPORT_HELPER};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (posix_spawn(&h.pid, cargv[0], &actions, nullptr, cargv.data(), environ) != 0) h.pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(copy);
    close(in[0]);
    close(out[1]);
    h.in = in[1];
    h.out = out[0];
    return h;
  }
  std::string ReadLine() {
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }
  int Wait() {
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    in = out = -1;
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// --- without a GPU ---------------------------------------------------------

TEST(CudaNoGpu, DriverReportsWhyItIsMissing) {
  SKIP_IF_DRIVER_PRESENT();
  absl::StatusOr<const DriverApi*> api = cuda::Driver();
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(api.status().message(), kNoDriver)) << api.status();
  // Loaded once: the same answer again, and from RequireDevices.
  EXPECT_EQ(cuda::Driver().status(), api.status());
  EXPECT_EQ(cuda::RequireDevices().status(), api.status());
  EXPECT_EQ(cuda::ListDevices().status(), api.status());
  EXPECT_EQ(cuda::SetCurrentDevice(0), api.status());
}

TEST(CudaNoGpu, AllocatorIsNotViableAndSaysWhy) {
  SKIP_IF_DRIVER_PRESENT();
  std::unique_ptr<BufferAllocator> allocator = MakeCudaVmmAllocator();
  EXPECT_EQ(allocator->kind(), "cuda");
  absl::Status viable = allocator->Viable();
  EXPECT_EQ(viable.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(viable.message(), kNoDriver)) << viable;
}

TEST(CudaNoGpu, AllocateFailsCleanly) {
  SKIP_IF_DRIVER_PRESENT();
  std::unique_ptr<BufferAllocator> allocator = MakeCudaVmmAllocator();
  for (const DeviceSpec& spec :
       {CudaOrdinal(0), CudaUuid("GPU-01234567-89ab-cdef-0123-456789abcdef")}) {
    absl::StatusOr<std::shared_ptr<SharedBuffer>> b = allocator->Allocate(1 << 20, spec);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StartsWith(b.status().message(), kNoDriver)) << b.status();
  }
}

TEST(CudaNoGpu, ImportFailsCleanlyAndClosesTheDescriptor) {
  SKIP_IF_DRIVER_PRESENT();
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  close(fds[1]);
  absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> b =
      ImportCudaBuffer(fds[0], 2 << 20, "cuda:GPU-01234567-89ab-cdef-0123-456789abcdef");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(b.status().message(), kNoDriver)) << b.status();
  errno = 0;
  EXPECT_EQ(fcntl(fds[0], F_GETFD), -1);  // closed by ImportCudaBuffer
  EXPECT_EQ(errno, EBADF);
}

// Argument checks come before the driver: same answers with or without one.
TEST(CudaNoGpu, BadArgumentsAreInvalidEverywhere) {
  std::unique_ptr<BufferAllocator> allocator = MakeCudaVmmAllocator();
  EXPECT_EQ(allocator->Allocate(0, CudaOrdinal(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator->Allocate(4096, DeviceSpec{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ImportCudaBuffer(-1, 2 << 20, "GPU-x").status().code(),
            absl::StatusCode::kInvalidArgument);
  int fd = dup(2);
  EXPECT_EQ(ImportCudaBuffer(fd, 0, "GPU-x").status().code(), absl::StatusCode::kInvalidArgument);
  errno = 0;
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(cuda::ResolveUuid("cuda:3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::ResolveDevice(DeviceSpec{}).status().code(), absl::StatusCode::kInvalidArgument);
}

// The GPU tests' client process gets the buffer's descriptor as its fd 3 and
// fails cleanly where there is no driver.
TEST(CudaNoGpu, ClientProcessGetsTheDescriptorAndFailsCleanly) {
  SKIP_IF_DRIVER_PRESENT();
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  Helper h = Helper::Start(
      fds[0], {"swap", "2097152", "cuda:GPU-01234567-89ab-cdef-0123-456789abcdef", "1", "2"});
  ASSERT_GT(h.pid, 0);
  EXPECT_EQ(h.ReadLine(), "");
  EXPECT_EQ(h.Wait(), 2);  // import failed (no driver), not 5 (no descriptor 3)
  close(fds[0]);
  close(fds[1]);
}

TEST(CudaNoGpu, UuidIsFormattedAsNvidiaSmiDoes) {
  CUuuid uuid;
  const unsigned char bytes[16] = {0x5f, 0x3e, 0x8a, 0x01, 0xc2, 0x7d, 0x4b, 0x90,
                                   0xaa, 0x0b, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc};
  for (int i = 0; i < 16; ++i) uuid.bytes[i] = static_cast<char>(bytes[i]);
  EXPECT_EQ(cuda::FormatUuid(uuid), "GPU-5f3e8a01-c27d-4b90-aa0b-123456789abc");
}

TEST(CudaNoGpu, CuResultsBecomeStatuses) {
  EXPECT_TRUE(cuda::CuStatus(CUDA_SUCCESS, "cuInit").ok());
  absl::Status oom = cuda::CuStatus(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(oom.message(), "cuMemCreate failed: ")) << oom;
  if (!DriverLibraryPresent()) {
    // No driver to name it: the number.
    EXPECT_EQ(oom.message(), "cuMemCreate failed: CUresult 2");
  } else {
    EXPECT_TRUE(absl::StrContains(oom.message(), "CUDA_ERROR_OUT_OF_MEMORY")) << oom;
  }
  EXPECT_EQ(cuda::CuStatus(CUDA_ERROR_NO_DEVICE, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cuda::CuStatus(CUDA_ERROR_INVALID_DEVICE, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cuda::CuStatus(CUDA_ERROR_INVALID_VALUE, "x").code(), absl::StatusCode::kInternal);
}

// --- with a GPU ------------------------------------------------------------

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const DriverApi*> api = cuda::RequireDevices();
    if (!api.ok()) COLLECTIVED_SKIP_OR_FAIL_WITHOUT_GPU(api.status().message());
    api_ = *api;
    absl::StatusOr<std::vector<cuda::DeviceInfo>> devices = cuda::ListDevices();
    ASSERT_TRUE(devices.ok()) << devices.status();
    device_ = devices->front();
    ASSERT_TRUE(cuda::SetCurrentDevice(device_.ordinal).ok());
    allocator_ = MakeCudaVmmAllocator();
    ASSERT_TRUE(allocator_->Viable().ok()) << allocator_->Viable();
  }

  size_t FreeBytes() {
    EXPECT_TRUE(cuda::SetCurrentDevice(device_.ordinal).ok());
    size_t free = 0, total = 0;
    EXPECT_EQ(api_->cuMemGetInfo(&free, &total), CUDA_SUCCESS);
    return free;
  }

  std::shared_ptr<SharedBuffer> Allocate(size_t bytes) {
    absl::StatusOr<std::shared_ptr<SharedBuffer>> b =
        allocator_->Allocate(bytes, CudaUuid(device_.uuid));
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *b : nullptr;
  }

  void Fill(const SharedBuffer& b, uint32_t seed) {
    ASSERT_TRUE(cuda::SetCurrentDevice(b.device_ordinal()).ok());
    ASSERT_EQ(testing::FillPattern(b.data(), b.size(), seed), "");
  }
  long long Mismatches(const SharedBuffer& b, uint32_t seed) {
    EXPECT_TRUE(cuda::SetCurrentDevice(b.device_ordinal()).ok());
    std::string error;
    long long bad = testing::CountMismatches(b.data(), b.size(), seed, &error);
    EXPECT_EQ(error, "");
    return bad;
  }

  const DriverApi* api_ = nullptr;
  cuda::DeviceInfo device_;
  std::unique_ptr<BufferAllocator> allocator_;
};

TEST_F(CudaGpu, AllocatesZeroedRoundedBuffersNamedByUuid) {
  const size_t free_before = FreeBytes();
  {
    std::shared_ptr<SharedBuffer> b = Allocate(1000);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->kind(), "cuda");
    EXPECT_EQ(b->device(), "cuda:" + device_.uuid);
    EXPECT_EQ(b->device_ordinal(), device_.ordinal);
    EXPECT_GE(b->size(), 1000u);
    EXPECT_EQ(b->size() % (2u << 20), 0u) << b->size();  // recommended granularity
    EXPECT_GE(b->fd(), 0);
    EXPECT_NE(fcntl(b->fd(), F_GETFD) & FD_CLOEXEC, 0);
    std::vector<unsigned char> host(b->size(), 0xff);
    ASSERT_EQ(api_->cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(b->data()), b->size()),
              CUDA_SUCCESS);
    EXPECT_EQ(std::count(host.begin(), host.end(), 0), static_cast<long>(host.size()));
    // By ordinal too.
    absl::StatusOr<std::shared_ptr<SharedBuffer>> by_ordinal =
        allocator_->Allocate(1, CudaOrdinal(device_.ordinal));
    ASSERT_TRUE(by_ordinal.ok()) << by_ordinal.status();
    EXPECT_EQ((*by_ordinal)->device(), b->device());
  }
  EXPECT_GE(FreeBytes() + (64u << 20), free_before);
}

TEST_F(CudaGpu, UnknownDevicesAreNotFoundAndListTheOthers) {
  for (const DeviceSpec& spec :
       {CudaOrdinal(4096), CudaUuid("GPU-00000000-0000-0000-0000-000000000000")}) {
    absl::StatusOr<std::shared_ptr<SharedBuffer>> b = allocator_->Allocate(1, spec);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(absl::StrContains(b.status().message(), device_.uuid)) << b.status();
  }
}

TEST_F(CudaGpu, OutOfMemoryIsResourceExhausted) {
  size_t free = 0, total = 0;
  ASSERT_EQ(api_->cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  absl::StatusOr<std::shared_ptr<SharedBuffer>> b =
      allocator_->Allocate(total + (1u << 30), CudaOrdinal(device_.ordinal));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "CUDA_ERROR_OUT_OF_MEMORY")) << b.status();
}

TEST_F(CudaGpu, AnotherProcessImportsReadsAndWrites) {
  std::shared_ptr<SharedBuffer> b = Allocate(64u << 20);
  ASSERT_NE(b, nullptr);
  Fill(*b, 11);
  Helper h = Helper::Start(b->fd(), {"swap", std::to_string(b->size()), b->device(), "11", "22"});
  ASSERT_GT(h.pid, 0);
  EXPECT_EQ(h.ReadLine(), "ok");
  EXPECT_EQ(h.Wait(), 0);
  // The client wrote and exited: its writes are here, and the memory is still
  // the daemon's to use (the client's release did not free it).
  EXPECT_EQ(Mismatches(*b, 22), 0);
  Fill(*b, 33);
  EXPECT_EQ(Mismatches(*b, 33), 0);
}

TEST_F(CudaGpu, ImportByAnyUuidSpelling) {
  std::shared_ptr<SharedBuffer> b = Allocate(1);
  ASSERT_NE(b, nullptr);
  for (const std::string& device : {b->device(), device_.uuid}) {
    absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> imported =
        ImportCudaBuffer(dup(b->fd()), b->size(), device);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ((*imported)->uuid(), device_.uuid);
    EXPECT_EQ((*imported)->size(), b->size());
  }
  absl::StatusOr<std::unique_ptr<ImportedCudaBuffer>> elsewhere =
      ImportCudaBuffer(dup(b->fd()), b->size(), "GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kNotFound) << elsewhere.status();
}

// The allocation is reference-counted: the client keeps its mapping after the
// daemon drops the buffer, and the memory goes back when both have let go.
TEST_F(CudaGpu, MemoryLivesUntilTheLastMappingAndIsThenFreed) {
  constexpr size_t kBytes = 256u << 20;
  const size_t free_before = FreeBytes();
  Helper h;
  {
    std::shared_ptr<SharedBuffer> b = Allocate(kBytes);
    ASSERT_NE(b, nullptr);
    EXPECT_LE(FreeBytes() + kBytes * 9 / 10, free_before) << "the allocation used no memory?";
    Fill(*b, 44);
    h = Helper::Start(b->fd(), {"hold", std::to_string(b->size()), b->device(), "44", "55"});
    ASSERT_GT(h.pid, 0);
    ASSERT_EQ(h.ReadLine(), "mapped");
  }  // the daemon's mapping, handle and descriptor are gone
  EXPECT_LE(FreeBytes() + kBytes * 9 / 10, free_before) << "freed while the client maps it";
  ASSERT_EQ(write(h.in, "go\n", 3), 3);
  EXPECT_EQ(h.ReadLine(), "ok");  // checked 44, wrote and re-read 55
  EXPECT_EQ(h.Wait(), 0);
  // Both gone: the memory is back (within what other users of the GPU may
  // have taken meanwhile).
  EXPECT_GE(FreeBytes() + kBytes / 4, free_before) << "leaked";
}

}  // namespace
}  // namespace collectived
