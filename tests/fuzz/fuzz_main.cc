// Replays fuzz inputs without libFuzzer: `request_fuzz_replay FILE_OR_DIR...`.
// Used as a regression test over the checked-in corpus in every build.
#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int ran = 0;
  for (int a = 1; a < argc; ++a) {
    std::string path = argv[a];
    if (DIR* dir = opendir(path.c_str())) {
      while (dirent* e = readdir(dir)) {
        if (e->d_name[0] != '.') ran += RunFile(path + "/" + e->d_name);
      }
      closedir(dir);
    } else {
      ran += RunFile(path);
    }
  }
  std::printf("replayed %d inputs\n", ran);
  return ran > 0 ? 0 : 1;
}
