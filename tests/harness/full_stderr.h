// FullStderr: for tests of what a process does when its stderr stops
// draining. While it lives, fd 2 is a pipe that is already full and that
// nobody reads, so a write to stderr blocks until DrainFiller or Restore.
#ifndef COLLECTIVED_TESTS_HARNESS_FULL_STDERR_H_
#define COLLECTIVED_TESTS_HARNESS_FULL_STDERR_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

namespace collectived::testing {

class FullStderr {
 public:
  // ok() is false when the pipe could not be set up (stderr is then as it was).
  FullStderr() {
    if (pipe2(fds_, O_CLOEXEC) != 0) return;
    if (fcntl(fds_[1], F_SETFL, O_NONBLOCK) == 0) {
      const char filler[4096] = {};
      for (ssize_t n; (n = write(fds_[1], filler, sizeof(filler))) > 0 || errno == EINTR;) {
        if (n > 0) filled_ += n;
      }
      std::fflush(stderr);
      if (errno == EAGAIN && fcntl(fds_[1], F_SETFL, 0) == 0 && (saved_ = dup(2)) >= 0) {
        if (dup2(fds_[1], 2) == 2) {
          ok_ = true;
          return;
        }
        close(saved_);
      }
    }
    close(fds_[0]);
    close(fds_[1]);
  }
  ~FullStderr() { Restore(); }
  FullStderr(const FullStderr&) = delete;
  FullStderr& operator=(const FullStderr&) = delete;

  bool ok() const { return ok_; }

  // Reads the filler back: a writer waiting for room goes on, and later
  // writes land in the pipe (Restore returns them).
  void DrainFiller() {
    if (!ok_) return;
    char buf[4096];
    while (filled_ > 0) {
      const ssize_t n =
          read(fds_[0], buf, static_cast<size_t>(std::min<int64_t>(filled_, sizeof(buf))));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      filled_ -= n;
    }
  }

  // Gives stderr back and returns what was written to the pipe after the
  // filler, reading until every writer is done (one blocked on the pipe
  // finishes its write as the pipe drains). Once only; "" afterwards.
  std::string Restore() {
    if (!ok_) return "";
    ok_ = false;
    dup2(saved_, 2);
    close(saved_);
    close(fds_[1]);
    std::string all;
    char buf[4096];
    for (ssize_t n; (n = read(fds_[0], buf, sizeof(buf))) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      all.append(buf, static_cast<size_t>(n));
    }
    close(fds_[0]);
    return all.substr(std::min(all.size(), static_cast<size_t>(filled_)));
  }

 private:
  int fds_[2] = {-1, -1};
  int saved_ = -1;
  int64_t filled_ = 0;  // filler bytes still in the pipe
  bool ok_ = false;
};

}  // namespace collectived::testing

#endif  // COLLECTIVED_TESTS_HARNESS_FULL_STDERR_H_
