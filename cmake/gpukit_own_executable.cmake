# gpukit_own_executable(<name> <folder> SOURCES <files...>): one of gpukit's own programs (an
# example, a tool), never a consumer's: linked to gpukit::gpukit and Threads, built with warnings,
# written to <GPUKIT_OUTPUT_DIRECTORY>/<folder> when that is set. A source ending in .cu needs nvcc:
# without it (GPUKIT_ENABLE_CUDA_TARGETS OFF) the program is left out, with a message, and no
# target exists.
include_guard(GLOBAL)
find_package(Threads REQUIRED)

function(gpukit_own_executable name folder)
  cmake_parse_arguments(arg "" "" "SOURCES" ${ARGN})
  foreach(src IN LISTS arg_SOURCES)
    if(src MATCHES "\\.cu$" AND NOT GPUKIT_CUDA_ENABLED)
      message(STATUS "gpukit: ${name} needs nvcc (GPUKIT_ENABLE_CUDA_TARGETS is OFF): left out")
      return()
    endif()
  endforeach()
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE gpukit::gpukit Threads::Threads)
  target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra>")
  if(GPUKIT_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${GPUKIT_OUTPUT_DIRECTORY}/${folder}")
  endif()
endfunction()
