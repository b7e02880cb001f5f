// Buffer and Array.
#include <sys/mman.h>

#include <cstdint>
#include <limits>

#include "collectived/client.h"
#ifdef COLLECTIVED_HAVE_CUDA
#include "client/src/cuda_import.h"
#endif

namespace collectived {

Buffer::~Buffer() { Reset(); }

Buffer::Buffer(Buffer&& other) noexcept
    : id_(std::move(other.id_)), data_(other.data_), size_(other.size_),
      device_(std::move(other.device_)), device_ordinal_(other.device_ordinal_),
      shared_mesh_(std::move(other.shared_mesh_)), owner_(other.owner_),
      gpu_mapping_(std::move(other.gpu_mapping_)) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.device_ordinal_ = -1;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    id_ = std::move(other.id_);
    data_ = other.data_;
    size_ = other.size_;
    device_ = std::move(other.device_);
    device_ordinal_ = other.device_ordinal_;
    shared_mesh_ = std::move(other.shared_mesh_);
    owner_ = other.owner_;
    gpu_mapping_ = std::move(other.gpu_mapping_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.device_ordinal_ = -1;
  }
  return *this;
}

void Buffer::Reset() {
  if (gpu_mapping_ != nullptr) {
    gpu_mapping_.reset();  // unmaps the GPU memory
  } else if (data_ != nullptr) {
    munmap(data_, size_);
  }
  data_ = nullptr;
  size_ = 0;
  device_ordinal_ = -1;
}

int64_t Array::num_elements() const {
  int64_t n = 1;  // the product of the non-zero dimensions
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(n, d, &n)) {
      return -1;
    }
  }
  return empty ? 0 : n;
}

size_t Array::num_bytes() const {
  const int64_t n = num_elements();
  size_t bytes;
  if (n < 0 || __builtin_mul_overflow(static_cast<uint64_t>(n), DTypeSize(dtype), &bytes)) {
    return std::numeric_limits<size_t>::max();
  }
  return bytes;
}

}  // namespace collectived
