// UniqueFd: sole owner of one file descriptor, closed when the owner goes.
#ifndef COLLECTIVED_COMMON_UNIQUE_FD_H_
#define COLLECTIVED_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace collectived {

// Owns a descriptor (or none: -1). Move-only; not thread-safe (one owner).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing; returns the descriptor.
  int release() { return std::exchange(fd_, -1); }
  // Closes the owned descriptor (if any) and owns `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_UNIQUE_FD_H_
