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


# The identity of the code above and of the SDK's member-side protocol, for
# member-side ops: a header with COLLECTIVED_MEMBER_OPS_CODE
# (cmake/MemberOpsCode.cmake), regenerated when any of these sources
# changes. The daemon and the SDK compile it in; use
# collectived_use_member_ops_code(target) on a target that includes
# "collectived/member_ops_code.h".
file(GLOB _collectived_member_ops_sources CONFIGURE_DEPENDS
  ${_collectived_daemon_dir}/plan/*.h ${_collectived_daemon_dir}/plan/*.cc
  ${_collectived_daemon_dir}/exec/*.h ${_collectived_daemon_dir}/exec/*.cc
  ${_collectived_daemon_dir}/core/op_plan.h ${_collectived_daemon_dir}/core/op_plan.cc
  ${_collectived_daemon_dir}/../common/*.h
  # The members' protocol (places per op, signatures, who writes a result).
  ${_collectived_daemon_dir}/../client/src/member_ops.h
  ${_collectived_daemon_dir}/../client/src/member_ops.cc)
list(FILTER _collectived_member_ops_sources EXCLUDE REGEX "_test\\.cc$")
list(JOIN _collectived_member_ops_sources "|" _collectived_member_ops_files)
set(_collectived_member_ops_dir ${CMAKE_BINARY_DIR}/generated)
set(_collectived_member_ops_header ${_collectived_member_ops_dir}/collectived/member_ops_code.h)
add_custom_command(
  OUTPUT ${_collectived_member_ops_header}
  COMMAND ${CMAKE_COMMAND} -DOUT=${_collectived_member_ops_header} -DVERSION=${PROJECT_VERSION}
          "-DCOMPILER=${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}"
          -DFILES=${_collectived_member_ops_files}
          -P ${_collectived_daemon_dir}/../cmake/MemberOpsCode.cmake
  DEPENDS ${_collectived_member_ops_sources} ${_collectived_daemon_dir}/../cmake/MemberOpsCode.cmake
  COMMENT "Hashing the member-side ops code"
  VERBATIM)
add_custom_target(collectived_member_ops_code DEPENDS ${_collectived_member_ops_header})
function(collectived_use_member_ops_code target)
  # CMAKE_BINARY_DIR, not a variable of this file: the function is called
  # from other directories.
  target_include_directories(${target} PRIVATE $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated>)
  add_dependencies(${target} collectived_member_ops_code)
endfunction()
