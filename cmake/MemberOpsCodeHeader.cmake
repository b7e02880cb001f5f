# The identity of the code the SDK shares with the daemon (plan/, exec/, the
# dtypes) and of the SDK's member-side protocol, for member-side ops (included
# by the top level before the SDK and the daemon): a header with
# COLLECTIVED_MEMBER_OPS_CODE
# (cmake/MemberOpsCode.cmake), regenerated when any of these sources
# changes. The daemon and the SDK compile it in; use
# collectived_use_member_ops_code(target) on a target that includes
# "collectived/member_ops_code.h".
file(GLOB _collectived_member_ops_sources CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/plan/*.h ${PROJECT_SOURCE_DIR}/plan/*.cc
  ${PROJECT_SOURCE_DIR}/exec/*.h ${PROJECT_SOURCE_DIR}/exec/*.cc
  ${PROJECT_SOURCE_DIR}/common/*.h ${PROJECT_SOURCE_DIR}/common/dtype.cc
  ${PROJECT_SOURCE_DIR}/client/include/collectived/dtype.h
  # The members' protocol (places per op, signatures, who writes a result).
  ${PROJECT_SOURCE_DIR}/client/src/member_ops.h
  ${PROJECT_SOURCE_DIR}/client/src/member_ops.cc
  ${PROJECT_SOURCE_DIR}/client/src/member_reads.cc)
list(FILTER _collectived_member_ops_sources EXCLUDE REGEX "_test\\.cc$")
list(JOIN _collectived_member_ops_sources "|" _collectived_member_ops_files)
set(_collectived_member_ops_dir ${CMAKE_BINARY_DIR}/generated)
set(_collectived_member_ops_header ${_collectived_member_ops_dir}/collectived/member_ops_code.h)
add_custom_command(
  OUTPUT ${_collectived_member_ops_header}
  COMMAND ${CMAKE_COMMAND} -DOUT=${_collectived_member_ops_header} -DVERSION=${PROJECT_VERSION}
          "-DCOMPILER=${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}"
          -DFILES=${_collectived_member_ops_files}
          -P ${PROJECT_SOURCE_DIR}/cmake/MemberOpsCode.cmake
  DEPENDS ${_collectived_member_ops_sources} ${PROJECT_SOURCE_DIR}/cmake/MemberOpsCode.cmake
  COMMENT "Hashing the member-side ops code"
  VERBATIM)
add_custom_target(collectived_member_ops_code DEPENDS ${_collectived_member_ops_header})
function(collectived_use_member_ops_code target)
  # CMAKE_BINARY_DIR, not a variable of this file: the function is called
  # from other directories.
  target_include_directories(${target} PRIVATE $<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/generated>)
  add_dependencies(${target} collectived_member_ops_code)
endfunction()
