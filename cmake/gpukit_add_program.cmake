# SPDX-License-Identifier: Apache-2.0
# gpukit_add_program: one of gpukit's own programs (a test, a benchmark, an example), the way every
# one of them is built.
#
#   gpukit_add_program(<name> SOURCES <files...> OUTPUT_SUBDIR <dir> [KIND <word>] [WERROR]
#                      [HEADER_ONLY] [LIBRARIES <targets...>])
#
# - Host-compiled unless a source ends in .cu: then nvcc builds that file, and when nvcc is off
#   (GPUKIT_ENABLE_CUDA_TARGETS=OFF, as in the sanitizer presets) the program is left out, with a
#   message naming it (KIND, e.g. "test", says what it is). Callers that go on configuring it
#   check `if(TARGET <name>)`.
# - Links gpukit::gpukit, Threads::Threads and LIBRARIES; with GPUKIT_PROGRAMS_USE_COMPILED,
#   gpukit::compiled instead of gpukit::gpukit (the instantiations compiled once, not in every
#   program), unless HEADER_ONLY: a program that defines a macro that changes the headers' bodies
#   (GPUKIT_DISABLE_NVTX, GPUKIT_DISABLE_INTERNAL_NVTX, GPUKIT_ERROR_LOCATIONS) must compile them
#   itself.
# - Host code is compiled with -Wall -Wextra, and -Werror with WERROR.
# - With GPUKIT_OUTPUT_DIRECTORY set, the binary goes to <GPUKIT_OUTPUT_DIRECTORY>/<OUTPUT_SUBDIR>.
include_guard(DIRECTORY)

find_package(Threads REQUIRED)

function(gpukit_add_program name)
  cmake_parse_arguments(arg "WERROR;HEADER_ONLY" "KIND;OUTPUT_SUBDIR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT arg_SOURCES OR NOT arg_OUTPUT_SUBDIR)
    message(FATAL_ERROR "gpukit_add_program(${name}): SOURCES and OUTPUT_SUBDIR are required")
  endif()
  if(NOT arg_KIND)
    set(arg_KIND "program")
  endif()
  foreach(src IN LISTS arg_SOURCES)
    if(src MATCHES "\\.cu$" AND NOT GPUKIT_CUDA_ENABLED)
      message(STATUS "gpukit: ${arg_KIND} ${name} needs nvcc (GPUKIT_ENABLE_CUDA_TARGETS is OFF): left out")
      return()
    endif()
  endforeach()

  add_executable(${name} ${arg_SOURCES})
  set(gpukit_target gpukit::gpukit)
  if(GPUKIT_PROGRAMS_USE_COMPILED AND NOT arg_HEADER_ONLY)
    set(gpukit_target gpukit::compiled)
  endif()
  target_link_libraries(${name} PRIVATE ${gpukit_target} Threads::Threads ${arg_LIBRARIES})
  set(warnings -Wall -Wextra)
  if(arg_WERROR)
    list(APPEND warnings -Werror)
  endif()
  target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${warnings}>")
  if(GPUKIT_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES
      RUNTIME_OUTPUT_DIRECTORY "${GPUKIT_OUTPUT_DIRECTORY}/${arg_OUTPUT_SUBDIR}")
  endif()
endfunction()
