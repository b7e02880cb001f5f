# Gloo (the gloo_perf peer benchmark: bare Gloo's ring, what collectived's
# meshes across hosts are compared with). Debian's libgloo-dev ships a CMake package
# (GlooConfig.cmake, imported target `gloo`); elsewhere fall back to looking
# for the header and library. Sets COLLECTIVED_GLOO_TARGET (empty when Gloo
# is not found) and COLLECTIVED_GLOO_WHAT (for STATUS lines).
#
# Third-party headers come in through imported targets, whose include
# directories CMake marks SYSTEM, so their warnings do not reach
# collectived_warnings (-Werror with COLLECTIVED_WERROR).
set(COLLECTIVED_GLOO_TARGET "")
set(COLLECTIVED_GLOO_WHAT "")
find_package(Gloo CONFIG QUIET)
if(Gloo_FOUND AND TARGET gloo)
  set(COLLECTIVED_GLOO_TARGET gloo)
  set(COLLECTIVED_GLOO_WHAT "Gloo ${Gloo_VERSION}")
else()
  find_path(COLLECTIVED_GLOO_INCLUDE_DIR gloo/allreduce.h)
  find_library(COLLECTIVED_GLOO_LIBRARY gloo)
  if(COLLECTIVED_GLOO_INCLUDE_DIR AND COLLECTIVED_GLOO_LIBRARY)
    add_library(collectived_gloo_imported UNKNOWN IMPORTED)
    set_target_properties(collectived_gloo_imported PROPERTIES
      IMPORTED_LOCATION "${COLLECTIVED_GLOO_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${COLLECTIVED_GLOO_INCLUDE_DIR}")
    set(COLLECTIVED_GLOO_TARGET collectived_gloo_imported)
    set(COLLECTIVED_GLOO_WHAT "${COLLECTIVED_GLOO_LIBRARY}")
  endif()
endif()
