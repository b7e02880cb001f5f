// The calling thread's CPU affinity mask, for hosts of any size.
#ifndef COLLECTIVED_COMMON_CPU_MASK_H_
#define COLLECTIVED_COMMON_CPU_MASK_H_

#include <sched.h>

#include <cstddef>

namespace collectived {

// A CPU affinity mask, sized for hosts with more CPUs than cpu_set_t's 1024.
class CpuMask {
 public:
  static constexpr int kMaxCpus = 8192;
  CpuMask() : set_(CPU_ALLOC(kMaxCpus)), bytes_(CPU_ALLOC_SIZE(kMaxCpus)) {
    if (set_ != nullptr) CPU_ZERO_S(bytes_, set_);
  }
  ~CpuMask() {
    if (set_ != nullptr) CPU_FREE(set_);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  // The calling thread's mask; false when it cannot be read.
  bool ReadThisThread() { return set_ != nullptr && sched_getaffinity(0, bytes_, set_) == 0; }
  // Makes this the calling thread's mask; false when the kernel refuses.
  bool ApplyToThisThread() const {
    return set_ != nullptr && sched_setaffinity(0, bytes_, set_) == 0;
  }
  int Count() const { return CPU_COUNT_S(bytes_, set_); }
  void Remove(int cpu) { CPU_CLR_S(cpu, bytes_, set_); }
  bool Has(int cpu) const { return CPU_ISSET_S(cpu, bytes_, set_) != 0; }

 private:
  cpu_set_t* set_;
  size_t bytes_;
};

// The CPUs the calling thread may run on (1 when its mask cannot be read).
inline int UsableCpus() {
  CpuMask mask;
  return mask.ReadThisThread() ? mask.Count() : 1;
}

}  // namespace collectived

#endif  // COLLECTIVED_COMMON_CPU_MASK_H_
