# Build options of collectived.
option(COLLECTIVED_BUILD_TESTS "Build the unit, integration and conformance tests" ON)
option(COLLECTIVED_WITH_CUDA "Build the CUDA/NCCL executor (needs the CUDA toolkit)" OFF)
option(COLLECTIVED_WERROR "Treat warnings as errors" OFF)
set(COLLECTIVED_SANITIZE "" CACHE STRING "Sanitizers: '', 'address' (ASan+UBSan) or 'thread' (TSan)")
set_property(CACHE COLLECTIVED_SANITIZE PROPERTY STRINGS "" address thread)

if(COLLECTIVED_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(COLLECTIVED_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT COLLECTIVED_SANITIZE STREQUAL "")
  message(FATAL_ERROR "COLLECTIVED_SANITIZE must be '', 'address' or 'thread'")
endif()

if(COLLECTIVED_WITH_CUDA)
  message(FATAL_ERROR "COLLECTIVED_WITH_CUDA: the CUDA executor is not part of this release yet; build with -DCOLLECTIVED_WITH_CUDA=OFF")
endif()

# libFuzzer targets (clang only): instrument everything for coverage and
# address errors; scripts/fuzz.sh configures this.
option(COLLECTIVED_FUZZ "Build the libFuzzer targets (needs clang)" OFF)
if(COLLECTIVED_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "COLLECTIVED_FUZZ needs clang (CXX=clang++)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
