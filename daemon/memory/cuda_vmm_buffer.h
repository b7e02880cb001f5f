// GPU buffers: CUDA virtual memory management (VMM) allocations shared with
// clients through a POSIX file descriptor.
//
// The allocation is made with cuMemCreate (pinned device memory, exportable
// as a POSIX fd, GPUDirect RDMA capable where the device supports it with
// VMM), mapped read-write in the daemon, zero-filled, and exported with
// cuMemExportToShareableHandle. The client imports the descriptor
// (client/src/cuda_import.h) and maps the same physical memory. The driver
// reference-counts the allocation: it is freed when the daemon and every
// importer have released it, so a client that exits does not free memory the
// daemon still maps, nor the daemon memory a client still maps.
//
// Built only when COLLECTIVED_HAVE_CUDA.
#ifndef COLLECTIVED_DAEMON_MEMORY_CUDA_VMM_BUFFER_H_
#define COLLECTIVED_DAEMON_MEMORY_CUDA_VMM_BUFFER_H_

#include <memory>

#include "daemon/memory/buffer_allocator.h"

namespace collectived {

// The allocator of kind "cuda" (DeviceSpec::Kind::kCuda).
//   Viable(): OK when the CUDA driver loads and sees at least one GPU, else
//     FAILED_PRECONDITION with the reason (common/cuda/driver.h: no driver,
//     driver too old, no devices).
//   Allocate(bytes, device): a SharedBuffer whose data() is the device
//     pointer (valid on device_ordinal() in this process), size() the size
//     rounded up to the device's recommended VMM granularity (2 MiB on current
//     GPUs), fd() the exported descriptor (owned by the buffer, close-on-exec),
//     device() "cuda:GPU-<uuid>". Errors: INVALID_ARGUMENT for 0 bytes, an
//     overflowing size or a non-CUDA device; FAILED_PRECONDITION when not
//     Viable(); NOT_FOUND, listing the devices, for a device this host does
//     not have; RESOURCE_EXHAUSTED when the GPU is out of memory
//     (CUDA_ERROR_OUT_OF_MEMORY) or the daemon at its descriptor budget.
// Thread-safe.
std::unique_ptr<BufferAllocator> MakeCudaVmmAllocator();

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_MEMORY_CUDA_VMM_BUFFER_H_
