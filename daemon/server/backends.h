// The daemon's candidate backends and the choice among them at start.
//
//   Backends candidates;
//   AddCpuBackends(candidates, cpu_options);  // memfd allocator + CPU executor
//   AddCudaBackends(candidates);              // CUDA VMM allocator + CUDA executor
//   Engine engine(options, SelectViable(std::move(candidates)));
#ifndef COLLECTIVED_DAEMON_SERVER_BACKENDS_H_
#define COLLECTIVED_DAEMON_SERVER_BACKENDS_H_

#include "daemon/core/backends.h"
#include "exec/cpu_executor.h"

namespace collectived {

// Host memory: the memfd allocator and the CPU executor; always there.
void AddCpuBackends(Backends& candidates, const CpuExecutorOptions& options);

// GPU memory: THE HOOK FOR THE CUDA BACKENDS. A daemon built with CUDA
// (COLLECTIVED_HAVE_CUDA) adds its CUDA VMM allocator and CUDA executor
// here; they say themselves, through Viable() / IsViable(), whether this host
// can run them. Built without CUDA it adds none and records "built without
// CUDA" as the reason, which requests for GPU memory are told.
void AddCudaBackends(Backends& candidates);

// Asks every candidate allocator (Viable()) and executor (IsViable()) whether
// it can run here, logs each answer as one line (event=allocator kind=...
// viable=true|false reason=..., event=executor name=... kind=... viable=...
// reason=...), and returns the viable ones; the reasons of those dropped are
// recorded by kind (unusable_allocators / unusable_executors): of a kind
// without a viable candidate, the first dropped candidate's reason, which
// replaces a reason recorded before (by a hook); else the one recorded
// before stays. Of several viable candidates of one kind the first is kept
// (the others are logged as viable=false, "another ... of kind ... comes
// first").
Backends SelectViable(Backends candidates);

}  // namespace collectived

#endif  // COLLECTIVED_DAEMON_SERVER_BACKENDS_H_
