# GPU support: decides COLLECTIVED_HAVE_CUDA from COLLECTIVED_WITH_CUDA
# (AUTO|ON|OFF, cmake/Options.cmake) and what this machine has.
#
#   AUTO  on when the CUDA toolkit (a working nvcc and cudart) and NCCL (nccl.h
#         and libnccl, in the toolkit or under NCCL_ROOT) are found
#   ON    the same, but a missing piece is a configuration error naming it
#   OFF   never
#
# When on: the CUDA language is enabled (C++20, CMAKE_CUDA_ARCHITECTURES
# defaulting to "80-real;90": A100 as machine code, H100/H200 as sm_90 machine
# code plus compute_90 PTX), and the targets CUDA::cudart_static and
# collectived_nccl exist.
#
# The driver (libcuda) is never linked: it comes with the NVIDIA driver, not
# the toolkit, so a binary that needed it would not start on a host without a
# GPU. The runtime is linked statically (CUDA::cudart_static, which loads
# libcuda itself when asked) and driver functions are reached through
# cudaGetDriverEntryPointByVersion (common/cuda/driver.h): the same binary
# serves host buffers anywhere and GPU buffers where there is a driver.

# A build directory made when this was a BOOL option keeps its value (OFF);
# scripts/test.sh passes AUTO explicitly for that reason.
get_property(_cuda_type CACHE COLLECTIVED_WITH_CUDA PROPERTY TYPE)
if(_cuda_type STREQUAL "BOOL")
  set_property(CACHE COLLECTIVED_WITH_CUDA PROPERTY TYPE STRING)
endif()

string(TOUPPER "${COLLECTIVED_WITH_CUDA}" _cuda_mode)
if(_cuda_mode MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(_cuda_mode ON)
elseif(_cuda_mode MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(_cuda_mode OFF)
elseif(NOT _cuda_mode STREQUAL "AUTO")
  message(FATAL_ERROR "COLLECTIVED_WITH_CUDA must be AUTO, ON or OFF (got '${COLLECTIVED_WITH_CUDA}')")
endif()

set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "Where NCCL is installed, if not in the CUDA toolkit")

set(COLLECTIVED_HAVE_CUDA OFF)
set(_cuda_missing "")
if(_cuda_mode STREQUAL "OFF")
  set(_cuda_why "COLLECTIVED_WITH_CUDA=OFF")
else()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND _cuda_missing "the CUDA toolkit (find_package(CUDAToolkit), see CUDAToolkit_ROOT)")
  elseif(NOT TARGET CUDA::cudart_static)
    list(APPEND _cuda_missing "the static CUDA runtime (libcudart_static.a) in ${CUDAToolkit_LIBRARY_DIR}")
  endif()

  if(CUDAToolkit_FOUND)
    # nvcc is often not on PATH (/usr/local/cuda/bin): point check_language at
    # the toolkit's own.
    if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE)
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}" CACHE FILEPATH "CUDA compiler")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      list(APPEND _cuda_missing "a working CUDA compiler (nvcc, check_language(CUDA) failed)")
    endif()
  endif()

  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl
    HINTS ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR}
    PATH_SUFFIXES lib lib64)
  if(NOT NCCL_INCLUDE_DIR)
    list(APPEND _cuda_missing "NCCL's header nccl.h (in the toolkit's include or NCCL_ROOT/include)")
  endif()
  if(NOT NCCL_LIBRARY)
    list(APPEND _cuda_missing "NCCL's library libnccl (in the toolkit's lib/lib64 or NCCL_ROOT/lib)")
  endif()

  if(_cuda_missing STREQUAL "")
    set(COLLECTIVED_HAVE_CUDA ON)
    set(_cuda_why "CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), NCCL ${NCCL_LIBRARY}")
  else()
    list(JOIN _cuda_missing "; " _cuda_why)
    set(_cuda_why "missing ${_cuda_why}")
    if(_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "COLLECTIVED_WITH_CUDA=ON, but this machine is ${_cuda_why}. "
        "Install them, point CUDAToolkit_ROOT / NCCL_ROOT at them, or use AUTO or OFF.")
    endif()
  endif()
endif()

if(COLLECTIVED_HAVE_CUDA)
  message(STATUS "collectived: GPU buffers ON (COLLECTIVED_WITH_CUDA=${_cuda_mode}): ${_cuda_why}")
else()
  message(STATUS "collectived: GPU buffers OFF (COLLECTIVED_WITH_CUDA=${_cuda_mode}): ${_cuda_why}")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES "80-real;90" CACHE STRING "CUDA architectures to compile for")
endif()
enable_language(CUDA)
# CMake before 3.26 does not know nvcc's -std=c++20 (nvcc has it since 12.0).
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

# NCCL is linked dynamically (libnccl.so.2), so a CUDA build of anything that
# links collectived_nccl needs libnccl at run time. Unlike libcuda, libnccl is
# an ordinary user-space library shipped with the toolkit (and in every CUDA
# image we deploy), not something a GPU-less host lacks by nature; loading it
# with dlopen would mean keeping our own table of NCCL's entry points and their
# types in step with nccl.h for no gain. A host without NCCL runs the build
# made with COLLECTIVED_WITH_CUDA=OFF. (The driver is the exception, see above.)
add_library(collectived_nccl SHARED IMPORTED GLOBAL)
set_target_properties(collectived_nccl PROPERTIES
  IMPORTED_LOCATION "${NCCL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
target_link_libraries(collectived_nccl INTERFACE CUDA::cudart_static)

# collectived_cuda_target(TARGET): a target with .cu sources gets C++20 for
# nvcc, and the directory-wide compile options (the sanitizers'
# -fsanitize=...) only for the host compiler, never on nvcc's command line.
function(collectived_cuda_target target)
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
    CUDA_EXTENSIONS OFF)
  get_target_property(_opts ${target} COMPILE_OPTIONS)
  if(_opts)
    set(_wrapped)
    foreach(_opt IN LISTS _opts)
      list(APPEND _wrapped "$<$<COMPILE_LANGUAGE:CXX>:${_opt}>")
    endforeach()
    set_property(TARGET ${target} PROPERTY COMPILE_OPTIONS ${_wrapped})
  endif()
endfunction()
