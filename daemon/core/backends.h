// The backends an engine runs on: buffer allocators and executors, one of
// each per buffer kind ("memfd" for host memory, "cuda" for GPU memory).
//
// The daemon builds a list of candidates at start (daemon/server/backends.h:
// the CPU executor and the memfd allocator always, the CUDA ones when built
// with CUDA), asks each whether it can run here, and hands the engine the
// viable ones with the reasons of those it dropped. The engine picks the
// allocator of a buffer by the kind of its device (DeviceSpec::buffer_kind())
// and the executor of an op by the kind of its members' buffers
// (Executor::buffer_kind() == SharedBuffer::kind()).
#ifndef COLLECTIVED_DAEMON_CORE_BACKENDS_H_
#define COLLECTIVED_DAEMON_CORE_BACKENDS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "daemon/memory/buffer_allocator.h"

namespace collectived {

struct Backends {
  // At most one per kind is used: the first of each kind.
  std::vector<std::unique_ptr<BufferAllocator>> allocators;
  std::vector<std::unique_ptr<Executor>> executors;
  // Buffer kind -> why no allocator / executor of that kind is usable here
  // (what a dropped candidate said, or e.g. "built without CUDA"). Shown in
  // the FAILED_PRECONDITION of requests that need one.
  std::map<std::string, std::string> unusable_allocators;
  std::map<std::string, std::string> unusable_executors;
};

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_CORE_BACKENDS_H_
