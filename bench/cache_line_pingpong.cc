// cache_line_pingpong: how long one cache line takes to go from one CPU to
// another and back, the floor under every small op between two processes
// (collectived's member-side ops, Open MPI's shared-memory transport).
//
//   cache_line_pingpong [--cpus=A,B] [--windows=N] [--iters=N]
//
// Two threads, pinned to CPUs A and B (default: the first two this process
// may use), hand a counter back and forth through two cache lines; every
// window of `iters` round trips prints its mean round trip in microseconds.
// On a virtual machine the round trip depends on where the host runs the two
// virtual CPUs at the time (bench/README, "Two speeds").
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/int_flag.h"

namespace {

using collectived::bench::IntFlag;

struct alignas(64) Line {
  std::atomic<int64_t> v{0};
};

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

int Usage(const char* why) {
  std::fprintf(stderr, "cache_line_pingpong: %s\nusage: cache_line_pingpong [--cpus=A,B] "
               "[--windows=N (1..100000, default 10)] [--iters=N (1..10000000, default 10000)]\n",
               why);
  return 2;
}


// The first two CPUs this process may run on, into cpus; false with fewer.
bool FirstTwoCpus(int cpus[2]) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  for (int cpu = 0, k = 0; cpu < CPU_SETSIZE && k < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus[k++] = cpu;
  }
  return cpus[1] >= 0;
}

struct Config {
  long windows = 10, iters = 10000;
  int cpus[2] = {-1, -1};
};

// The flags into `c`; 0, or the exit status of a refusal (said on stderr).
int Parse(int argc, char** argv, Config& c) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--windows=", 10) == 0) {
      if ((c.windows = IntFlag(argv[i], "--windows", 1, 100000)) < 0) return Usage("bad --windows");
    } else if (std::strncmp(argv[i], "--iters=", 8) == 0) {
      if ((c.iters = IntFlag(argv[i], "--iters", 1, 10000000)) < 0) return Usage("bad --iters");
    } else if (std::sscanf(argv[i], "--cpus=%d,%d", &c.cpus[0], &c.cpus[1]) == 2) {
      if (c.cpus[0] < 0 || c.cpus[1] < 0 || c.cpus[0] == c.cpus[1]) return Usage("bad --cpus");
    } else {
      return Usage(("unknown argument " + std::string(argv[i])).c_str());
    }
  }
  if (c.cpus[0] < 0 && !FirstTwoCpus(c.cpus)) {
    return Usage("needs two CPUs; this process may use one");
  }
  return 0;
}

// Runs the windows, this thread on c.cpus[0] and an echoing one on
// c.cpus[1]; 0, or 1 when a thread cannot run on its CPU.
int Measure(const Config& c) {
  if (!Pin(c.cpus[0])) {
    std::fprintf(stderr, "cache_line_pingpong: cannot run on CPU %d\n", c.cpus[0]);
    return 1;
  }
  Line ping, pong;
  std::atomic<int> echo_state{0};  // 1: pinned, 2: could not pin
  const int64_t total = c.windows * c.iters;
  std::thread echo([&] {
    echo_state.store(Pin(c.cpus[1]) ? 1 : 2);
    if (echo_state.load() != 1) return;
    for (int64_t i = 1; i <= total; ++i) {
      while (ping.v.load(std::memory_order_acquire) != i) {
      }
      pong.v.store(i, std::memory_order_release);
    }
  });
  while (echo_state.load() == 0) {
  }
  if (echo_state.load() != 1) {
    echo.join();
    std::fprintf(stderr, "cache_line_pingpong: cannot run on CPU %d\n", c.cpus[1]);
    return 1;
  }
  std::printf("# CPUs %d and %d; mean round trip per window of %ld, us\n", c.cpus[0], c.cpus[1],
              c.iters);
  int64_t i = 1;
  for (long w = 0; w < c.windows; ++w) {
    const auto start = std::chrono::steady_clock::now();
    for (long k = 0; k < c.iters; ++k, ++i) {
      ping.v.store(i, std::memory_order_release);
      while (pong.v.load(std::memory_order_acquire) != i) {
      }
    }
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    std::printf("%.3f\n", took.count() / static_cast<double>(c.iters));
  }
  echo.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (const int refused = Parse(argc, argv, c); refused != 0) return refused;
  return Measure(c);
}
