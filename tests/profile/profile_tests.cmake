# SPDX-License-Identifier: Apache-2.0
# gpukit/profile's tests, included from tests/CMakeLists.txt (one line there).
#
# libgpukit_nvtx_injection.so is an NVTX tool (nvtx_injection.cpp) that records every range, mark,
# memory registration and counter; tests attach it through NVTX_INJECTION64_PATH, which they set
# themselves before their first NVTX call, and read what it recorded.
if(NOT doctest_FOUND)
  return()
endif()

add_library(gpukit_nvtx_injection MODULE profile/nvtx_injection.cpp)
target_link_libraries(gpukit_nvtx_injection PRIVATE CUDA::nvtx3)
target_compile_features(gpukit_nvtx_injection PRIVATE cxx_std_17)
target_compile_options(gpukit_nvtx_injection PRIVATE -Wall -Wextra -Werror)
set_target_properties(gpukit_nvtx_injection PROPERTIES
  PREFIX "lib" OUTPUT_NAME gpukit_nvtx_injection CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
if(GPUKIT_OUTPUT_DIRECTORY)
  # Next to the test binaries: the tests look there first (the h200 tree moves to another machine).
  set_target_properties(gpukit_nvtx_injection PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${GPUKIT_OUTPUT_DIRECTORY}/tests")
endif()

# A test that attaches the tool: it finds the library next to itself, else at its build path.
function(gpukit_profile_use_nvtx_tool name)
  if(NOT TARGET ${name})
    return()
  endif()
  target_link_libraries(${name} PRIVATE ${CMAKE_DL_LIBS})
  target_compile_definitions(${name} PRIVATE GPUKIT_NVTX_INJECTION_LIB="$<TARGET_FILE:gpukit_nvtx_injection>")
  add_dependencies(${name} gpukit_nvtx_injection)
endfunction()

gpukit_add_test(nvtx_ranges_test SOURCES profile/nvtx_ranges_test.cpp)
gpukit_profile_use_nvtx_tool(nvtx_ranges_test)
gpukit_add_test(nvtx_disabled_test SOURCES profile/nvtx_disabled_test.cpp profile/nvtx_disable_macro_test.cpp
                HEADER_ONLY)
gpukit_profile_use_nvtx_tool(nvtx_disabled_test)
gpukit_add_test(memory_annotation_test SOURCES profile/memory_annotation_test.cpp)
gpukit_profile_use_nvtx_tool(memory_annotation_test)
gpukit_add_test(range_timer_test SOURCES profile/range_timer_test.cpp)
gpukit_profile_use_nvtx_tool(range_timer_test)
gpukit_add_test(profile_gpu_test SOURCES profile/profile_gpu_test.cpp GPU)
gpukit_profile_use_nvtx_tool(profile_gpu_test)
if(TARGET profile_gpu_test)
  target_compile_definitions(profile_gpu_test PRIVATE "GPUKIT_CUDA_ARCHITECTURES=\"${CMAKE_CUDA_ARCHITECTURES}\"")
endif()
gpukit_add_test(pool_annotation_test SOURCES profile/pool_annotation_test.cpp)
gpukit_profile_use_nvtx_tool(pool_annotation_test)
# gpukit's own ranges around its slow paths; the same source built with them compiled out.
gpukit_add_test(slow_path_ranges_test SOURCES profile/slow_path_ranges_test.cpp)
gpukit_profile_use_nvtx_tool(slow_path_ranges_test)
gpukit_add_test(slow_path_ranges_off_test SOURCES profile/slow_path_ranges_test.cpp HEADER_ONLY)
gpukit_profile_use_nvtx_tool(slow_path_ranges_off_test)
if(TARGET slow_path_ranges_off_test)
  target_compile_definitions(slow_path_ranges_off_test PRIVATE GPUKIT_DISABLE_INTERNAL_NVTX)
endif()
