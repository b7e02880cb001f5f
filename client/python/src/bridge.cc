#include "bridge.h"

#include <map>

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
