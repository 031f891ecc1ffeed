# SPDX-License-Identifier: Apache-2.0
# The PyTorch backend's translation layer (bindings/torch/include) and PyTorch's allocator keys, on
# the simulated GPU: no PyTorch needed.
gpukit_add_test(torch_backend_test SOURCES torch_backend/backend_conf_test.cpp torch_backend/backend_test.cpp
                torch_backend/record_table_test.cpp)
if(TARGET torch_backend_test)
  target_include_directories(torch_backend_test PRIVATE ${PROJECT_SOURCE_DIR}/bindings/torch/include)
  # The README whose table of PyTorch's keys backend_conf_test checks against gpukit_torch's.
  target_compile_definitions(torch_backend_test
    PRIVATE GPUKIT_TORCH_README="${PROJECT_SOURCE_DIR}/bindings/torch/README.md")
endif()

# clang's thread-safety analysis over the backend's headers (and the allocator under them), as an
# error: the strict consumer (tests/headers) covers gpukit's own headers, this one the binding's.
find_program(GPUKIT_CLANGXX NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15
                                  clang++-14)
if(GPUKIT_CLANGXX AND TARGET torch_backend_test)
  set(gpukit_torch_clang_includes "")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND gpukit_torch_clang_includes "-I${dir}" "-I${dir}/cccl")
  endforeach()
  add_test(NAME torch_backend.thread_safety_clang
    COMMAND "${GPUKIT_CLANGXX}" -std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety
      "-I${PROJECT_SOURCE_DIR}/include" "-I${PROJECT_SOURCE_DIR}/bindings/torch/include"
      "-I${CMAKE_CURRENT_SOURCE_DIR}" ${gpukit_torch_clang_includes}
      "${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/backend_test.cpp")
  set_tests_properties(torch_backend.thread_safety_clang PROPERTIES LABELS "torch_backend;headers")
endif()
