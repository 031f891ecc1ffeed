# SPDX-License-Identifier: Apache-2.0
# cmake -DINCLUDE_DIR=<gpukit>/include -P umbrella_check.cmake
# Fails when a public header (under gpukit/, outside detail/) is not included by gpukit/gpukit.hpp:
# .hpp headers directly, .cuh headers inside its `#ifdef __CUDACC__` block.
file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/gpukit/*.hpp"
  "${INCLUDE_DIR}/gpukit/*.cuh")
list(FILTER headers EXCLUDE REGEX "(^|/)detail/")
list(REMOVE_ITEM headers gpukit/gpukit.hpp)
file(READ "${INCLUDE_DIR}/gpukit/gpukit.hpp" umbrella)
string(FIND "${umbrella}" "#ifdef __CUDACC__" cuda_block)
set(missing "")
foreach(header IN LISTS headers)
  string(FIND "${umbrella}" "#include <${header}>" at)
  if(at EQUAL -1)
    list(APPEND missing "${header}")
  elseif(header MATCHES "\\.cuh$" AND (cuda_block EQUAL -1 OR at LESS cuda_block))
    list(APPEND missing "${header} (outside the #ifdef __CUDACC__ block)")
  elseif(header MATCHES "\\.hpp$" AND NOT cuda_block EQUAL -1 AND at GREATER cuda_block)
    list(APPEND missing "${header} (inside the #ifdef __CUDACC__ block)")
  endif()
endforeach()
if(missing)
  list(JOIN missing "\n  " text)
  message(FATAL_ERROR "gpukit/gpukit.hpp does not include these public headers:\n  ${text}")
endif()
list(LENGTH headers count)
message(STATUS "gpukit/gpukit.hpp includes all ${count} public headers")
