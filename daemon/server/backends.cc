#include "daemon/server/backends.h"

#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/util/log.h"
#ifdef COLLECTIVED_HAVE_CUDA
#include "exec/cuda/cuda_executor.h"
#include "daemon/memory/cuda_vmm_buffer.h"
#endif

namespace collectived {

void AddCpuBackends(Backends& candidates, const CpuExecutorOptions& options) {
  candidates.allocators.push_back(MakeMemfdAllocator());
  candidates.executors.push_back(std::make_unique<CpuExecutor>(options));
}

void AddCudaBackends(Backends& candidates) {
#ifdef COLLECTIVED_HAVE_CUDA
  // Both report themselves unviable, saying why, on a host without a GPU or
  // driver; SelectViable then drops them and keeps the reason.
  candidates.allocators.push_back(MakeCudaVmmAllocator());
  candidates.executors.push_back(MakeCudaExecutor());
#else
  candidates.unusable_allocators.emplace("cuda", "built without CUDA");
  candidates.unusable_executors.emplace("cuda", "built without CUDA");
#endif
}

Backends SelectViable(Backends candidates) {
  Backends chosen;
  chosen.unusable_allocators = std::move(candidates.unusable_allocators);
  chosen.unusable_executors = std::move(candidates.unusable_executors);
  // Kinds with a viable candidate, and kinds whose reason a dropped
  // candidate gave (the first one's reason is kept; it replaces a reason
  // recorded before, e.g. by a hook).
  std::set<std::string> kinds, explained;
  for (auto& a : candidates.allocators) {
    const std::string kind(a->kind());
    absl::Status viable = a->Viable();
    if (viable.ok() && kinds.count(kind)) {
      viable = absl::AlreadyExistsError(
          absl::StrCat("another allocator of kind ", kind, " comes first"));
    }
    if (viable.ok()) {
      LogEvent(LogLevel::kInfo, "allocator", {{"kind", kind}, {"viable", "true"}});
      kinds.insert(kind);
      chosen.unusable_allocators.erase(kind);
      chosen.allocators.push_back(std::move(a));
    } else {
      const std::string reason(viable.message());
      LogEvent(LogLevel::kInfo, "allocator",
               {{"kind", kind}, {"viable", "false"}, {"reason", reason}});
      if (!kinds.count(kind) && explained.insert(kind).second) {
        chosen.unusable_allocators[kind] = reason;
      }
    }
  }
  // Kinds a hook explained without a candidate (e.g. built without CUDA).
  for (const auto& [kind, reason] : chosen.unusable_allocators) {
    if (!explained.count(kind)) {
      LogEvent(LogLevel::kInfo, "allocator", {{"kind", kind}, {"viable", "false"}, {"reason", reason}});
    }
  }
  kinds.clear();
  explained.clear();
  for (auto& e : candidates.executors) {
    const std::string kind(e->buffer_kind());
    bool viable = e->IsViable();
    std::string reason = viable ? "" : e->WhyNotViable();
    if (!viable && reason.empty()) reason = "unviable (no reason given)";
    if (viable && kinds.count(kind)) {
      viable = false;
      reason = absl::StrCat("another executor of kind ", kind, " comes first");
    }
    if (viable) {
      LogEvent(LogLevel::kInfo, "executor",
               {{"name", std::string(e->name())}, {"kind", kind}, {"viable", "true"},
                {"threads", absl::StrCat(e->threads())}});
      kinds.insert(kind);
      chosen.unusable_executors.erase(kind);
      chosen.executors.push_back(std::move(e));
    } else {
      LogEvent(LogLevel::kInfo, "executor",
               {{"name", std::string(e->name())}, {"kind", kind}, {"viable", "false"},
                {"reason", reason}});
      if (!kinds.count(kind) && explained.insert(kind).second) {
        chosen.unusable_executors[kind] = reason;
      }
    }
  }
  for (const auto& [kind, reason] : chosen.unusable_executors) {
    if (!explained.count(kind)) {
      LogEvent(LogLevel::kInfo, "executor", {{"kind", kind}, {"viable", "false"}, {"reason", reason}});
    }
  }
  return chosen;
}

}  // namespace collectived
