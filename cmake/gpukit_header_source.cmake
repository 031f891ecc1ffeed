# SPDX-License-Identifier: Apache-2.0
# gpukit_header_source(<var> <header> <content>): a generated translation unit about one public
# header (the header tests, the quick starts). Writes <content> into
# <current binary dir>/<header, / and . as _>.cpp, or .cu for a .cuh header, and sets <var> to its
# path; sets it empty, writing nothing, when the header needs nvcc and nvcc is off
# (GPUKIT_CUDA_ENABLED). The content is configured @ONLY, with the caller's variables; it is
# rewritten only when it changes, so rebuilds stay incremental.
include_guard(GLOBAL)

function(gpukit_header_source var header content)
  set(${var} "" PARENT_SCOPE)
  set(ext cpp)
  if(header MATCHES "\\.cuh$")
    if(NOT GPUKIT_CUDA_ENABLED)
      return()
    endif()
    set(ext cu)
  endif()
  string(REGEX REPLACE "[/.]" "_" stem "${header}")
  set(source "${CMAKE_CURRENT_BINARY_DIR}/${stem}.${ext}")
  file(CONFIGURE OUTPUT "${source}" CONTENT "${content}" @ONLY)
  set(${var} "${source}" PARENT_SCOPE)
endfunction()
