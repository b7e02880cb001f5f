# The targets the GPU check needs (sourced by scripts/gpu-check.sh and
# scripts/gpu-bundle.sh): the daemon, the SDK, every gpu-labelled test binary
# with its helpers, and what bench/gpu_bench.sh runs.
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
