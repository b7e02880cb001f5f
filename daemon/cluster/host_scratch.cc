#include "daemon/cluster/host_scratch.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace collectived {
namespace {

// Free scratch kept by all the meshes of the process.
std::atomic<uint64_t> g_scratch_kept{0};

}  // namespace

uint8_t* Placeholder::Get(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 1);
  if (bytes > size_) {
    Release();
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    base_ = static_cast<uint8_t*>(p);
    size_ = bytes;
  }
  return base_;
}

void Placeholder::Release() {
  if (base_ != nullptr) munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
}

ScratchPool::~ScratchPool() {
  g_scratch_kept.fetch_sub(free_bytes_);
  for (const std::vector<Block>* blocks : {&used_, &free_, &held_}) {
    for (const Block& b : *blocks) std::free(b.p);
  }
}

uint8_t* ScratchPool::Get(uint64_t bytes) {
  const uint64_t size = std::max<uint64_t>(64, (bytes + 63) / 64 * 64);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->size >= size && (best == free_.end() || it->size < best->size)) best = it;
  }
  Block b;
  if (best != free_.end()) {
    b = *best;
    free_.erase(best);
    free_bytes_ -= b.size;
    g_scratch_kept.fetch_sub(b.size);
  } else {
    b.p = std::aligned_alloc(64, size);
    if (b.p == nullptr) return nullptr;
    b.size = size;
  }
  used_.push_back(b);
  return static_cast<uint8_t*>(b.p);
}

void ScratchPool::Release(bool reuse) {
  if (!reuse) {
    held_.insert(held_.end(), used_.begin(), used_.end());
    used_.clear();
    return;
  }
  for (const Block& b : used_) {
    free_.push_back(b);
    free_bytes_ += b.size;
    g_scratch_kept.fetch_add(b.size);
  }
  used_.clear();
  while (!free_.empty() &&
         (free_bytes_ > keep_ || g_scratch_kept.load() > kScratchKeptPerProcess)) {
    auto largest = std::max_element(free_.begin(), free_.end(),
                                    [](const Block& a, const Block& b) { return a.size < b.size; });
    free_bytes_ -= largest->size;
    g_scratch_kept.fetch_sub(largest->size);
    std::free(largest->p);
    free_.erase(largest);
  }
}

}  // namespace collectived
