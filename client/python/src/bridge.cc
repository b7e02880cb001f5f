#include "bridge.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#ifdef COLLECTIVED_PYTHON_HAS_CUDA
#include "common/cuda/driver.h"
#endif

namespace collectived::python {

namespace {

struct MeshTable {
  absl::Mutex mu;
  int64_t next ABSL_GUARDED_BY(mu) = 1;
  std::map<int64_t, std::shared_ptr<MeshEntry>> entries ABSL_GUARDED_BY(mu);
};

MeshTable& Table() {
  static MeshTable* table = new MeshTable();  // never destroyed
  return *table;
}

}  // namespace

absl::Status GrowStaging(Client& client, Buffer& buffer, size_t bytes, std::string_view device) {
  if (buffer.valid() && buffer.size() >= bytes) return absl::OkStatus();
  size_t size = 4096;
  while (size < bytes) size *= 2;
  absl::StatusOr<Buffer> grown = client.Allocate(size, device);
  if (!grown.ok()) return grown.status();
  if (buffer.valid()) client.Free(buffer).IgnoreError();  // the session end frees it otherwise
  buffer = std::move(*grown);
  return absl::OkStatus();
}

absl::StatusOr<std::string> GpuName(int ordinal) {
#ifdef COLLECTIVED_PYTHON_HAS_CUDA
  static absl::Mutex mu(absl::kConstInit);
  static auto* names = new std::map<int, std::string>();  // never destroyed
  absl::MutexLock lock(&mu);
  auto it = names->find(ordinal);
  if (it != names->end()) return it->second;
  absl::StatusOr<std::vector<cuda::DeviceInfo>> devices = cuda::ListDevices();
  if (!devices.ok()) return devices.status();
  for (const cuda::DeviceInfo& d : *devices) {
    if (d.ordinal == ordinal) {
      return names->emplace(ordinal, absl::StrCat("cuda:", d.uuid)).first->second;
    }
  }
  return absl::NotFoundError(absl::StrCat("CUDA device ", ordinal, " is not one of this "
                                          "process's: ", cuda::DescribeDevices(*devices)));
#else
  return absl::UnimplementedError(absl::StrCat(
      "CUDA device ", ordinal, ": this Python module was built without CUDA (pip install "
      "./client/python builds it so; the project's CUDA build has it)"));
#endif
}

int64_t RegisterMesh(std::shared_ptr<MeshEntry> entry) {
  MeshTable& t = Table();
  absl::MutexLock lock(&t.mu);
  const int64_t handle = t.next++;
  t.entries[handle] = std::move(entry);
  return handle;
}

void UnregisterMesh(int64_t handle) {
  std::shared_ptr<MeshEntry> gone;  // destroyed outside the lock
  MeshTable& t = Table();
  absl::MutexLock lock(&t.mu);
  auto it = t.entries.find(handle);
  if (it == t.entries.end()) return;
  gone = std::move(it->second);
  t.entries.erase(it);
}

std::shared_ptr<MeshEntry> FindMesh(int64_t handle) {
  MeshTable& t = Table();
  absl::MutexLock lock(&t.mu);
  auto it = t.entries.find(handle);
  return it == t.entries.end() ? nullptr : it->second;
}

}  // namespace collectived::python
