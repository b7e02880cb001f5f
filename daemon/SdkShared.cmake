# The daemon's libraries that the client SDK links as well (member-side
# small ops plan and run with the daemon's own code): included by
# daemon/CMakeLists.txt, and by the top level for the Python-only build,
# which has no daemon.
set(_collectived_daemon_dir ${CMAKE_CURRENT_LIST_DIR})

# plan/: the op plan, the contract between the core and the executors. No
# protobuf and no executor code: core and exec both depend on it, not on each
# other.
add_library(collectived_plan STATIC ${_collectived_daemon_dir}/plan/op_plan.cc)
target_link_libraries(collectived_plan
  PUBLIC collectived_common absl::strings PRIVATE collectived_warnings)

# exec/: reduction kernels, thread pool, CPU executor.
add_library(collectived_exec STATIC
  ${_collectived_daemon_dir}/exec/reduce.cc
  ${_collectived_daemon_dir}/exec/thread_pool.cc
  ${_collectived_daemon_dir}/exec/cpu_executor.cc
  ${_collectived_daemon_dir}/exec/spanning.cc)
target_compile_options(collectived_exec PRIVATE -O3)
target_link_libraries(collectived_exec
  PUBLIC collectived_plan absl::synchronization absl::inlined_vector
  PRIVATE collectived_warnings)

# core/op_plan: planning from the wire format (PlanOp); the SDK plans with it
# too, for the ops its members run among themselves (member-side small ops).
add_library(collectived_wire_plan STATIC ${_collectived_daemon_dir}/core/op_plan.cc)
target_link_libraries(collectived_wire_plan
  PUBLIC collectived_plan collectived_proto absl::statusor PRIVATE collectived_warnings)

