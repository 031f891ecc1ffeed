# SPDX-License-Identifier: Apache-2.0
# cmake -DBUILD_DIR=<a build with GPUKIT_COMPILED=ON> -DPREFIX=<dir> -DCMAKEDIR=share/cmake/gpukit
#       [-DCONFIG=<config>] -P install.cmake
# Installs that build into a fresh PREFIX and checks that the library and its export are there.
file(REMOVE_RECURSE "${PREFIX}")
set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}" ${config_args}
  OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
file(GLOB_RECURSE library "${PREFIX}/*/libgpukit_compiled.a")
if(NOT library)
  message(FATAL_ERROR "gpukit install: libgpukit_compiled.a is missing under ${PREFIX}")
endif()
file(READ "${PREFIX}/${CMAKEDIR}/gpukitTargets.cmake" targets)
if(NOT targets MATCHES "gpukit::compiled")
  message(FATAL_ERROR "gpukit install: gpukitTargets.cmake does not export gpukit::compiled")
endif()
message(STATUS "gpukit, compiled mode, installed into ${PREFIX}")
