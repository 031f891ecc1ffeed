# SPDX-License-Identifier: Apache-2.0
# gpukit_relocatable(<target>...): the binaries gpukit installs (the tools, gpukit::compiled) must
# not name the folders they were built in. Two things write them into a binary: the debug
# information (each file's path and the compiler's working folder, the build folder; gpukit builds
# RelWithDebInfo by default) and __FILE__ in the headers' error macros. -ffile-prefix-map rewrites
# both at compile time: the source folder becomes a relative path (include/gpukit/...), the build
# folder ".". A debugger finds the sources with `directory <gpukit checkout>`.
# tests/package/relocatable.cmake checks the installed tree in CTest.
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

check_cxx_compiler_flag("-ffile-prefix-map=/a=b" GPUKIT_HAVE_FILE_PREFIX_MAP)

function(gpukit_relocatable)
  if(NOT GPUKIT_HAVE_FILE_PREFIX_MAP)
    return()
  endif()
  # The build folder last: GCC and clang apply the last option that matches, and the build folder
  # often lies inside the source folder (build/dev). The source folder's trailing slash keeps it
  # from matching a sibling build folder that starts with the same name (gpukit-build).
  foreach(target IN LISTS ARGN)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CXX>:-ffile-prefix-map=${PROJECT_SOURCE_DIR}/=>"
      "$<$<COMPILE_LANGUAGE:CXX>:-ffile-prefix-map=${PROJECT_BINARY_DIR}=.>")
  endforeach()
endfunction()
