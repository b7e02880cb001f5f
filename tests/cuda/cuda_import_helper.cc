// A client process for the GPU tests: imports the GPU buffer whose exported
// descriptor it inherits as fd 3, as the SDK does, and works on it.
//   cuda_import_helper swap <size> <device> <seed_check> <seed_write>
//     checks the buffer holds pattern seed_check, writes pattern seed_write,
//     prints "ok" and exits (unmapping).
//   cuda_import_helper hold <size> <device> <seed_check> <seed_write>
//     imports, prints "mapped", waits for a line on stdin (the test drops its
//     own mapping meanwhile), then checks, writes and re-reads, prints "ok".
// Exit codes: 0 ok, 1 usage, 2 import failed, 3 wrong contents, 4 kernel error,
// 5 no descriptor 3.
#include <cuda_runtime_api.h>
#include <fcntl.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "client/src/cuda_import.h"
#include "tests/cuda/pattern.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s swap|hold <size> <device> <seed_check> <seed_write>\n", argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  const size_t size = std::strtoull(argv[2], nullptr, 10);
  const std::string device = argv[3];
  const auto seed_check = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
  const auto seed_write = static_cast<uint32_t>(std::strtoul(argv[5], nullptr, 10));

  if (fcntl(3, F_GETFD) < 0) {
    std::fprintf(stderr, "helper: no descriptor 3\n");
    return 5;
  }
  auto buffer = collectived::ImportCudaBuffer(3, size, device);
  if (!buffer.ok()) {
    std::fprintf(stderr, "helper: import failed: %s\n", buffer.status().ToString().c_str());
    return 2;
  }
  cudaSetDevice((*buffer)->device_ordinal());
  if (mode == "hold") {
    std::printf("mapped\n");
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);
  }
  std::string error;
  const long long bad = collectived::testing::CountMismatches((*buffer)->device_ptr(), size,
                                                              seed_check, &error);
  if (bad != 0) {
    std::fprintf(stderr, "helper: %lld words differ from pattern %u %s\n", bad, seed_check,
                 error.c_str());
    return bad < 0 ? 4 : 3;
  }
  error = collectived::testing::FillPattern((*buffer)->device_ptr(), size, seed_write);
  if (!error.empty()) {
    std::fprintf(stderr, "helper: %s\n", error.c_str());
    return 4;
  }
  if (mode == "hold" &&
      collectived::testing::CountMismatches((*buffer)->device_ptr(), size, seed_write, &error) != 0) {
    std::fprintf(stderr, "helper: the buffer did not keep what was written %s\n", error.c_str());
    return 3;
  }
  std::printf("ok\n");
  return 0;
}
