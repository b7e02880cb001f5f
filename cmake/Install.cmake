# Installation: the daemon, the demo, and the SDK as a CMake package:
#   find_package(collectived CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE collectived::client)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/collectived
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(_collectived_sdk_targets collectived_client collectived_common collectived_proto collectived_warnings
    collectived_wire_plan collectived_plan collectived_exec)
if(COLLECTIVED_HAVE_CUDA)
  # The SDK links it (GPU buffer import); it links CUDA::cudart_static.
  list(APPEND _collectived_sdk_targets collectived_cuda_driver)
endif()
install(TARGETS ${_collectived_sdk_targets}
        EXPORT collectivedTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT collectivedTargets
        NAMESPACE collectived::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/collectived)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/collectivedConfig.cmake.in
  ${PROJECT_BINARY_DIR}/collectivedConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/collectived)
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/collectivedConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/collectivedConfig.cmake
              ${PROJECT_BINARY_DIR}/collectivedConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/collectived)
