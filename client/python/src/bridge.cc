#include "bridge.h"

#include <map>

namespace collectived::python {

std::optional<OpFuture> Dispatch(Mesh& mesh, const OpArgs& args) {
  const Array& x = args.x;
  const AxisNames& names = args.axes;
  const Array out = args.out.value_or(Array{});
  switch (args.kind) {
    case kPsum: return mesh.psum_async(x, names, args.out);
    case kPmean: return mesh.pmean_async(x, names, args.out);
    case kPmax: return mesh.pmax_async(x, names, args.out);
    case kPmin: return mesh.pmin_async(x, names, args.out);
    case kAllGather: return mesh.all_gather_async(x, names, out, {args.a, args.tiled});
    case kPpermute: return mesh.ppermute_async(x, names, args.perm, args.out);
    case kPsumScatter: return mesh.psum_scatter_async(x, names, out, {args.a, args.tiled});
    case kAllToAll:
      return mesh.all_to_all_async(x, names, {args.a, args.b, args.tiled}, args.out);
    case kBroadcast: return mesh.broadcast_async(x, names, args.a, args.out);
    case kBarrier: return mesh.barrier_async(names);
    default: return std::nullopt;
  }
}

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
