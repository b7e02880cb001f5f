// Host memory a mesh keeps between its ops across hosts (HostMesh):
// placeholder addresses for other hosts' regions, and scratch blocks reused
// from one op to the next. Each is used by one mesh's worker thread only.

#ifndef COLLECTIVED_DAEMON_CLUSTER_HOST_SCRATCH_H_
#define COLLECTIVED_DAEMON_CLUSTER_HOST_SCRATCH_H_

#include <cstdint>
#include <vector>

namespace collectived {

// Host memory that faults on any access: addresses for other hosts' regions.
class Placeholder {
 public:
  Placeholder() = default;
  ~Placeholder() { Release(); }
  Placeholder(const Placeholder&) = delete;
  Placeholder& operator=(const Placeholder&) = delete;

  // At least `bytes` bytes of addresses; null when mmap fails.
  uint8_t* Get(uint64_t bytes);

 private:
  void Release();
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

// Free scratch kept by all the meshes of the process; past it, a mesh that
// ends an op frees what it keeps, so idle meshes together never keep more.
inline constexpr uint64_t kScratchKeptPerProcess = uint64_t{1} << 30;

// Host scratch kept from one op of a mesh to the next. Fresh memory costs a
// page fault and zeroing per page (for a 64 MiB op, a good part of its
// time); the blocks of the last ops are reused when big enough, up to `keep`
// bytes kept between ops.
class ScratchPool {
 public:
  explicit ScratchPool(uint64_t keep) : keep_(keep) {}
  ~ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // At least `bytes` bytes, 64-byte aligned, until Release; null when the
  // allocation fails.
  uint8_t* Get(uint64_t bytes);

  // Every block is free again (`reuse`), the largest freed beyond `keep`
  // bytes (or while the process keeps more than kScratchKeptPerProcess);
  // or, after a failed op, whose transfers may still be posted into them
  // until the connections close, held until the pool goes.
  void Release(bool reuse);

 private:
  struct Block {
    void* p = nullptr;
    uint64_t size = 0;
  };
  const uint64_t keep_;
  std::vector<Block> used_;
  std::vector<Block> free_;
  std::vector<Block> held_;  // of failed ops
  uint64_t free_bytes_ = 0;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CLUSTER_HOST_SCRATCH_H_
