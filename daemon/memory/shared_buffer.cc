#include "daemon/memory/shared_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/fd_limit.h"
#include "common/status_util.h"

namespace collectived {
namespace {

class MemfdBuffer final : public SharedBuffer {
 public:
  MemfdBuffer(int fd, void* data, size_t size)
      : fd_(fd), data_(data), size_(size) {}
  ~MemfdBuffer() override {
    munmap(data_, size_);
    close(fd_);
  }
  MemfdBuffer(const MemfdBuffer&) = delete;
  MemfdBuffer& operator=(const MemfdBuffer&) = delete;

  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  int fd() const override { return fd_; }
  absl::string_view kind() const override { return "memfd"; }

 private:
  const int fd_;
  void* const data_;
  const size_t size_;
};

}  // namespace

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<std::shared_ptr<SharedBuffer>> CreateMemfdBuffer(size_t size) {
  if (size == 0) return absl::InvalidArgumentError("buffer size must be > 0");
  const size_t page = PageSize();
  if (size > SIZE_MAX - page) {
    return absl::InvalidArgumentError(absl::StrCat("buffer size ", size, " overflows"));
  }
  size = (size + page - 1) / page * page;
  int fd = memfd_create("collectived-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(errno, "memfd_create");
  if (!FdAdmitted(fd)) {
    close(fd);
    return FdExhaustedError("a shared buffer");
  }
  // fallocate reserves the pages now, so running out of memory is an error
  // here rather than a SIGBUS when the client first touches the page.
  if (fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("allocating ", size, " bytes of shared memory"));
  }
  // The client gets this descriptor: seal its size, so that no client can
  // shrink the file under the daemon's mapping (a SIGBUS in the daemon) or
  // grow it, and seal the seals.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, "sealing the shared buffer's size");
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("mmap(", size, ")"));
  }
  return std::shared_ptr<SharedBuffer>(new MemfdBuffer(fd, data, size));
}

}  // namespace collectived
