# SPDX-License-Identifier: Apache-2.0
# gpukit's compiled mode ({fmt}'s FMT_HEADER_ONLY the other way round): with -DGPUKIT_COMPILED=ON,
# gpukit::compiled, a small static library, holds the instantiations over both runtimes,
# cuda_runtime and sim_runtime, of the caching allocator, the pinned pool, the transfer pipeline,
# the prefetcher and the checkpoint executor, and the bodies of sim_runtime and of the checkpoint
# planners (src/). Linking it instead of gpukit::gpukit defines GPUKIT_COMPILED_LIBRARY, under which
# the headers declare those instantiations `extern template`, and sim_runtime.hpp and planners.hpp
# leave out their body files, so a consumer's translation units no longer compile them (scripts/compile-time measures what that saves; the
# README's "Compiled mode" has the figure). Header-only (gpukit::gpukit) stays the default.
#
#   find_package(gpukit CONFIG REQUIRED)   # of a gpukit installed with -DGPUKIT_COMPILED=ON
#   target_link_libraries(my_app PRIVATE gpukit::compiled)
#
# The library is compiled with the flags of gpukit's build: a consumer must agree with it on the
# macros that change the headers' bodies (GPUKIT_DISABLE_NVTX, NVTX_DISABLE), as with any library.
# Included from the top-level CMakeLists.txt, after gpukit::gpukit and its install rules.
option(GPUKIT_COMPILED
  "Also build and install gpukit::compiled, the instantiations over both runtimes in a static library"
  OFF)
if(NOT GPUKIT_COMPILED)
  return()
endif()

add_library(gpukit_compiled STATIC
  src/caching_allocator.cpp
  src/checkpoint_executor.cpp
  src/pinned_pool.cpp
  src/planners.cpp
  src/prefetcher.cpp
  src/sim_runtime.cpp
  src/transfer_pipeline.cpp)
add_library(gpukit::compiled ALIAS gpukit_compiled)
# Position independent: it may be linked into a consumer's shared library.
set_target_properties(gpukit_compiled PROPERTIES
  EXPORT_NAME compiled
  POSITION_INDEPENDENT_CODE ON)
target_link_libraries(gpukit_compiled PUBLIC gpukit::gpukit)
target_compile_definitions(gpukit_compiled PUBLIC GPUKIT_COMPILED_LIBRARY)
if(PROJECT_IS_TOP_LEVEL)
  message(STATUS "gpukit: compiled mode on (gpukit::compiled)")
endif()

if(GPUKIT_INSTALL)
  include(${CMAKE_CURRENT_LIST_DIR}/gpukit_relocatable.cmake)
  gpukit_relocatable(gpukit_compiled)  # installed: no build or source folder inside
  install(TARGETS gpukit_compiled EXPORT gpukitTargets
    ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  # With a library inside, the package is no longer architecture independent: the version file is
  # written again without ARCH_INDEPENDENT, so that a 32-bit consumer does not take a 64-bit build.
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/gpukitConfigVersion.cmake"
    COMPATIBILITY SameMinorVersion)
endif()
