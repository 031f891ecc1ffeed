# SPDX-License-Identifier: Apache-2.0
# gpukit_add_torch_library(<name> SOURCES <files...> [SIM] [OUTPUT_DIRECTORY <dir>])
#
# A shared library with PyTorch's pluggable-allocator ABI: hidden visibility except the C functions
# it exports, the static CUDA runtime kept private, no undefined symbols left (so CI's link proves
# it loads). SIM builds gpukit_torch.cpp over the simulated GPU (GPUKIT_TORCH_SIM=1), for tests.
# Included by bindings/torch/CMakeLists.txt and tests/pytorch/pytorch_tests.cmake.
include_guard(GLOBAL)
find_package(Threads REQUIRED)

function(gpukit_add_torch_library name)
  cmake_parse_arguments(arg "SIM" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  add_library(${name} SHARED ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE gpukit::gpukit Threads::Threads)
  target_include_directories(${name} PRIVATE "${PROJECT_SOURCE_DIR}/bindings/torch")
  target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra>")
  target_link_options(${name} PRIVATE "LINKER:--exclude-libs,ALL")
  if(NOT GPUKIT_SANITIZE)
    target_link_options(${name} PRIVATE "LINKER:--no-undefined")
  endif()
  set_target_properties(${name} PROPERTIES
    PREFIX "lib" CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(arg_SIM)
    target_compile_definitions(${name} PRIVATE GPUKIT_TORCH_SIM=1)
  endif()
  if(arg_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${arg_OUTPUT_DIRECTORY}")
  elseif(GPUKIT_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${GPUKIT_OUTPUT_DIRECTORY}/bindings")
  endif()
endfunction()
