# SPDX-License-Identifier: Apache-2.0
# The PyTorch backend's translation layer (bindings/torch/include) and PyTorch's allocator keys, on
# the simulated GPU: no PyTorch needed.
gpukit_add_test(torch_backend_test SOURCES torch_backend/backend_conf_test.cpp torch_backend/backend_test.cpp)
if(TARGET torch_backend_test)
  target_include_directories(torch_backend_test PRIVATE ${PROJECT_SOURCE_DIR}/bindings/torch/include)
  # The README whose table of PyTorch's keys backend_conf_test checks against gpukit_torch's.
  target_compile_definitions(torch_backend_test
    PRIVATE GPUKIT_TORCH_README="${PROJECT_SOURCE_DIR}/bindings/torch/README.md")
endif()
