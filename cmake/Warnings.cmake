# collectived_warnings: an interface target carrying the project's warning flags.
add_library(collectived_warnings INTERFACE)
# Options structs are filled with designated initializers that skip fields
# on purpose; GCC would warn about each skipped field.
set(_collectived_host_warnings -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
target_compile_options(collectived_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:C,CXX>:${_collectived_host_warnings}>")
if(COLLECTIVED_WERROR)
  target_compile_options(collectived_warnings INTERFACE "$<$<COMPILE_LANGUAGE:C,CXX>:-Werror>")
endif()
# CUDA sources: the same flags for the host compiler, through nvcc.
if(COLLECTIVED_HAVE_CUDA)
  list(JOIN _collectived_host_warnings "," _collectived_xcompiler)
  target_compile_options(collectived_warnings INTERFACE
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_collectived_xcompiler}>")
  if(COLLECTIVED_WERROR)
    target_compile_options(collectived_warnings INTERFACE
      "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Werror>")
  endif()
endif()
