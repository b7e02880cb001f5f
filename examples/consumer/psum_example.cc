// The smallest collectived program: join a mesh and psum one value.
//   psum_example <members> <my index>   (run one process per member)
#include <cstdio>
#include <cstdlib>

#include "collectived/client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <members> <index>\n", argv[0]);
    return 2;
  }
  const int members = std::atoi(argv[1]);
  const int index = std::atoi(argv[2]);
  auto client = collectived::Client::Connect();  // $COLLECTIVED_SOCKET or the default
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto mesh = (*client)->JoinMesh(
      {.name = "psum-example", .axes = {{"i", members}}, .coordinate = {index}});
  if (!mesh.ok()) {
    std::fprintf(stderr, "%s\n", mesh.status().ToString().c_str());
    return 1;
  }
  auto buffer = (*client)->Allocate(sizeof(float));
  if (!buffer.ok()) {
    std::fprintf(stderr, "%s\n", buffer.status().ToString().c_str());
    return 1;
  }
  buffer->as<float>()[0] = static_cast<float>(index);
  absl::Status st = (*mesh)->psum(collectived::Array::Of<float>(*buffer, {}), "i");
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("member %d: psum = %g\n", index, buffer->as<float>()[0]);
  return 0;
}
