# Build options of collectived.
option(COLLECTIVED_BUILD_TESTS "Build the unit, integration and conformance tests" ON)
# The benchmarks (bench/): no test runs them; the sanitizer builds of
# scripts/test.sh leave them out.
option(COLLECTIVED_BUILD_BENCH "Build the benchmarks (bench/)" ON)
# COLLECTIVED_WITH_CUDA (AUTO|ON|OFF): GPU buffers; see cmake/Cuda.cmake.
set(COLLECTIVED_WITH_CUDA AUTO CACHE STRING
  "GPU (CUDA VMM) buffers and NCCL: AUTO (when the CUDA toolkit and NCCL are found), ON or OFF")
set_property(CACHE COLLECTIVED_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
# COLLECTIVED_PYTHON (AUTO|ON|OFF): the Python SDK's extension module
# (client/python); AUTO builds it when python3 has nanobind and no sanitizer
# is on (an instrumented module would need the sanitizer runtime preloaded
# into python).
set(COLLECTIVED_PYTHON AUTO CACHE STRING "The Python SDK (needs nanobind): AUTO, ON or OFF")
set_property(CACHE COLLECTIVED_PYTHON PROPERTY STRINGS AUTO ON OFF)
# Only the C++ SDK and the Python extension: what `pip install ./client/python`
# configures (no daemon, tests, CUDA, Gloo or Prometheus needed).
option(COLLECTIVED_PYTHON_ONLY "Build only the Python SDK's extension module" OFF)
if(COLLECTIVED_PYTHON_ONLY)
  set(COLLECTIVED_WITH_CUDA OFF CACHE STRING "" FORCE)
  set(COLLECTIVED_BUILD_TESTS OFF CACHE BOOL "" FORCE)
  set(COLLECTIVED_PYTHON ON CACHE STRING "" FORCE)
endif()
option(COLLECTIVED_WERROR "Treat warnings as errors" OFF)
set(COLLECTIVED_SANITIZE "" CACHE STRING "Sanitizers: '', 'address' (ASan+UBSan) or 'thread' (TSan)")
set_property(CACHE COLLECTIVED_SANITIZE PROPERTY STRINGS "" address thread)

if(COLLECTIVED_SANITIZE STREQUAL "address")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined;-fno-sanitize-recover=all;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
elseif(COLLECTIVED_SANITIZE STREQUAL "thread")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=thread;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(NOT COLLECTIVED_SANITIZE STREQUAL "")
  message(FATAL_ERROR "COLLECTIVED_SANITIZE must be '', 'address' or 'thread'")
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
