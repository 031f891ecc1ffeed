# SPDX-License-Identifier: Apache-2.0
# cmake -DBUILD_DIR=<gpukit build> -DPREFIX=<dir> -DINCLUDEDIR=include -DCMAKEDIR=share/cmake/gpukit
#       -DDOCDIR=share/doc/gpukit [-DCONFIG=<config>] [-DBINDIR=bin -DTOOLS=<tool>,<tool>...]
#       -P install.cmake
# Installs gpukit into a fresh PREFIX and checks the layout a find_package consumer relies on.
file(REMOVE_RECURSE "${PREFIX}")
set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}" ${config_args}
  COMMAND_ERROR_IS_FATAL ANY)

foreach(file IN ITEMS
    ${INCLUDEDIR}/gpukit/error.hpp
    ${INCLUDEDIR}/gpukit/error_macros.hpp
    ${INCLUDEDIR}/gpukit/gpukit.hpp
    ${INCLUDEDIR}/gpukit/version.hpp
    ${INCLUDEDIR}/gpukit/detail/cccl_compat.hpp
    ${INCLUDEDIR}/gpukit/detail/error_macros.hpp
    ${INCLUDEDIR}/gpukit/runtime/runtime.hpp
    ${INCLUDEDIR}/gpukit/runtime/cuda_runtime.hpp
    ${INCLUDEDIR}/gpukit/runtime/sim_runtime.hpp
    ${INCLUDEDIR}/gpukit/runtime/detail/sim_runtime_impl.hpp
    ${CMAKEDIR}/gpukitConfig.cmake
    ${CMAKEDIR}/gpukitConfigVersion.cmake
    ${CMAKEDIR}/gpukitTargets.cmake
    ${DOCDIR}/LICENSE)
  if(NOT EXISTS "${PREFIX}/${file}")
    message(FATAL_ERROR "gpukit install: ${file} is missing under ${PREFIX}")
  endif()
endforeach()
string(REPLACE "," ";" tools "${TOOLS}")
foreach(tool IN LISTS tools)  # the command-line tools, when the build has them: each answers --help
  if(NOT EXISTS "${PREFIX}/${BINDIR}/${tool}" OR IS_DIRECTORY "${PREFIX}/${BINDIR}/${tool}")
    message(FATAL_ERROR "gpukit install: the tool ${BINDIR}/${tool} is missing under ${PREFIX}")
  endif()
  execute_process(COMMAND "${PREFIX}/${BINDIR}/${tool}" --help
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "${tool}")
    message(FATAL_ERROR "gpukit install: `${BINDIR}/${tool} --help` exited with ${rc} (expected 0 "
      "and a usage naming the tool):\n${out}${err}")
  endif()
endforeach()
file(GLOB_RECURSE installed_libraries "${PREFIX}/*.a" "${PREFIX}/*.so")
list(FILTER installed_libraries EXCLUDE REGEX "/libgpukit_compiled\\.a$")  # -DGPUKIT_COMPILED=ON
if(installed_libraries)
  message(FATAL_ERROR "gpukit is header-only, yet the install holds: ${installed_libraries}")
endif()
message(STATUS "gpukit installed into ${PREFIX}")
