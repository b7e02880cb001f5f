# shellcheck shell=bash
# The targets the GPU check needs (sourced by scripts/gpu-check.sh and
# scripts/gpu-bundle.sh): the daemon, the SDK, every gpu-labelled test binary
# with its helpers, and what bench/gpu_bench.sh runs. And which shared
# libraries a bundle leaves to the GPU machine (also sourced by
# tests/gpu_bundle/check_bundle.sh).
# shellcheck disable=SC2034
gpu_targets=(
  collectived collectived_client
  collectived_cuda_tests collectived_cuda_import_helper
  collectived_cuda_exec_tests collectived_cuda_executor_suite collectived_cuda_allocator_suite
  collectived_gpu_e2e_tests collectived_gpu_e2e_worker
  collectived_integration_tests collectived_test_worker
  collectived_conformance_tests collectived_conformance_worker
  collectived_perf nccl_perf cuda_copy_perf
)

# Whether the library named $1 (as ldd names it) is one the GPU machine brings
# itself: the C library and the loader, the CUDA driver and NCCL. (A bundle
# carries the C++ runtime, but only as a fallback for an older one.)
gpu_machine_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|librt.so.*|libdl.so.*|\
    libutil.so.*|libresolv.so.*|libcuda.so.*|libnvidia*|libnccl.so.*) return 0 ;;
  esac
  return 1
}
