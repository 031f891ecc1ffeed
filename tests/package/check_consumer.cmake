# SPDX-License-Identifier: Apache-2.0
# cmake -DBUILD_DIR=<consumer build> -DCUDART=static|shared [-DREADELF=<readelf>]
#       -P check_consumer.cmake
# Checks a consumer project's build (tests/package/CMakeLists.txt), then runs its program:
# - the CUDA runtime is linked as GPUKIT_CUDA_RUNTIME_LINK asked: libcudart.so is NEEDED by the
#   program for `shared`, and not for `static` (skipped without readelf);
# - gpukit's include folder reached the compiler as a SYSTEM folder (-isystem), never as -I.
set(program "${BUILD_DIR}/consumer")
if(NOT EXISTS "${program}")
  message(FATAL_ERROR "check_consumer: ${program} was not built")
endif()

if(READELF)
  execute_process(COMMAND "${READELF}" -d "${program}" OUTPUT_VARIABLE dynamic
    COMMAND_ERROR_IS_FATAL ANY)
  string(REGEX MATCH "NEEDED[^\n]*libcudart\\.so[^\n]*" needed "${dynamic}")
  if(CUDART STREQUAL "shared" AND NOT needed)
    message(FATAL_ERROR "check_consumer: GPUKIT_CUDA_RUNTIME_LINK=shared, yet the program does "
      "not need libcudart.so:\n${dynamic}")
  elseif(CUDART STREQUAL "static" AND needed)
    message(FATAL_ERROR "check_consumer: GPUKIT_CUDA_RUNTIME_LINK=static, yet the program needs "
      "libcudart.so (${needed})")
  endif()
  message(STATUS "check_consumer: CUDA runtime linked ${CUDART}: ok")
else()
  message(STATUS "check_consumer: no readelf: how the CUDA runtime is linked is not checked")
endif()

file(READ "${BUILD_DIR}/gpukit_include_dirs.txt" include_dirs)
file(READ "${BUILD_DIR}/compile_commands.json" commands)
foreach(dir IN LISTS include_dirs)
  if(NOT EXISTS "${dir}/gpukit/version.hpp")
    continue()  # a dependency's folder (CUDA, CCCL), not gpukit's
  endif()
  string(FIND "${commands}" "-isystem ${dir}" as_system)
  string(FIND "${commands}" "-I${dir}" as_plain)
  if(as_system EQUAL -1 OR NOT as_plain EQUAL -1)
    message(FATAL_ERROR "check_consumer: gpukit's include folder ${dir} is not a SYSTEM folder "
      "of the consumer:\n${commands}")
  endif()
  set(found_gpukit_dir TRUE)
endforeach()
if(NOT found_gpukit_dir)
  message(FATAL_ERROR "check_consumer: gpukit::gpukit names no folder holding gpukit/version.hpp "
    "(${include_dirs})")
endif()
message(STATUS "check_consumer: gpukit's headers are SYSTEM headers: ok")

execute_process(COMMAND "${program}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_consumer: ${program} failed (${rc})")
endif()
