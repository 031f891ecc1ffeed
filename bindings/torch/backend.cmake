# SPDX-License-Identifier: Apache-2.0
# The native PyTorch backend (bindings/torch/csrc), compiled against an installed PyTorch's headers
# as CI does on machines without a GPU: a compile check of the c10 CUDAAllocator subclass and the
# gpukit_torch._C module, with no link (the package itself is built by pip, see README.md).
#
#   include(bindings/torch/backend.cmake)     # after gpukit::gpukit exists
#   cmake -DGPUKIT_TORCH_ROOT=/path/to/site-packages/torch ...   (else found through Python)
#
# Defines the target gpukit_torch_backend_check (an object library, built by `all`) when PyTorch's
# headers are found; says why it is left out otherwise.

set(GPUKIT_TORCH_ROOT "" CACHE PATH "The torch package folder whose headers the backend compiles against")

if(NOT GPUKIT_TORCH_ROOT)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
      OUTPUT_VARIABLE _gpukit_torch_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
      RESULT_VARIABLE _gpukit_torch_rc)
    if(_gpukit_torch_rc EQUAL 0)
      set(GPUKIT_TORCH_ROOT "${_gpukit_torch_root}")
    endif()
  endif()
endif()

set(_gpukit_torch_header "${GPUKIT_TORCH_ROOT}/include/c10/cuda/CUDACachingAllocator.h")
if(NOT GPUKIT_TORCH_ROOT OR NOT EXISTS "${_gpukit_torch_header}")
  message(STATUS "gpukit: PyTorch's headers not found (set GPUKIT_TORCH_ROOT): "
                 "the native PyTorch backend's compile check is left out")
  return()
endif()

find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
set(_gpukit_torch_sources "${CMAKE_CURRENT_LIST_DIR}/csrc/cuda_allocator.cpp")
if(Python3_Development.Module_FOUND)
  list(APPEND _gpukit_torch_sources "${CMAKE_CURRENT_LIST_DIR}/csrc/module.cpp"
       "${CMAKE_CURRENT_LIST_DIR}/csrc/planner.cpp")
else()
  message(STATUS "gpukit: Python's headers not found: gpukit_torch._C's module file is not checked")
endif()

add_library(gpukit_torch_backend_check OBJECT ${_gpukit_torch_sources})
target_link_libraries(gpukit_torch_backend_check PRIVATE gpukit::gpukit)
target_include_directories(gpukit_torch_backend_check PRIVATE "${CMAKE_CURRENT_LIST_DIR}/include")
target_include_directories(gpukit_torch_backend_check SYSTEM PRIVATE
  "${GPUKIT_TORCH_ROOT}/include" "${GPUKIT_TORCH_ROOT}/include/torch/csrc/api/include")
if(Python3_Development.Module_FOUND)
  target_link_libraries(gpukit_torch_backend_check PRIVATE Python3::Module)
endif()
# PyTorch's wheels use the C++11 string ABI; the module's name as PyTorch's tooling defines it.
target_compile_definitions(gpukit_torch_backend_check PRIVATE
  _GLIBCXX_USE_CXX11_ABI=1 TORCH_EXTENSION_NAME=_C TORCH_API_INCLUDE_EXTENSION_H)
target_compile_features(gpukit_torch_backend_check PRIVATE cxx_std_17)
set_target_properties(gpukit_torch_backend_check PROPERTIES POSITION_INDEPENDENT_CODE ON
                                                            CXX_VISIBILITY_PRESET hidden)

# The loadable package, built here instead of by pip: gpukit_torch/ with _C linked against the
# PyTorch in GPUKIT_TORCH_ROOT (its lib/ must hold libtorch*.so and libc10*.so, as a wheel
# unpacked with `unzip` does) for the Python that find_package(Python3) finds (Python3_ROOT_DIR
# picks one). For machines where building with pip is slow or impossible: build the package on
# one machine, copy ${CMAKE_BINARY_DIR}/torch_package to one with the same PyTorch and Python, and
# put it on PYTHONPATH. Off by default; `cmake --build ... --target gpukit_torch_package`.
option(GPUKIT_TORCH_BUILD_PACKAGE "Link gpukit_torch._C against GPUKIT_TORCH_ROOT's libraries" OFF)
if(GPUKIT_TORCH_BUILD_PACKAGE AND Python3_Development.Module_FOUND)
  set(_gpukit_torch_package_dir "${CMAKE_BINARY_DIR}/torch_package/gpukit_torch")
  Python3_add_library(gpukit_torch_package MODULE WITH_SOABI
    "${CMAKE_CURRENT_LIST_DIR}/csrc/cuda_allocator.cpp" "${CMAKE_CURRENT_LIST_DIR}/csrc/module.cpp"
    "${CMAKE_CURRENT_LIST_DIR}/csrc/planner.cpp")
  target_link_libraries(gpukit_torch_package PRIVATE gpukit::gpukit CUDA::cudart)
  target_include_directories(gpukit_torch_package PRIVATE "${CMAKE_CURRENT_LIST_DIR}/include")
  target_include_directories(gpukit_torch_package SYSTEM PRIVATE
    "${GPUKIT_TORCH_ROOT}/include" "${GPUKIT_TORCH_ROOT}/include/torch/csrc/api/include")
  foreach(_lib IN ITEMS c10 c10_cuda torch torch_cpu torch_cuda torch_python)
    target_link_libraries(gpukit_torch_package PRIVATE "${GPUKIT_TORCH_ROOT}/lib/lib${_lib}.so")
  endforeach()
  target_compile_definitions(gpukit_torch_package PRIVATE
    _GLIBCXX_USE_CXX11_ABI=1 TORCH_EXTENSION_NAME=_C TORCH_API_INCLUDE_EXTENSION_H)
  target_compile_features(gpukit_torch_package PRIVATE cxx_std_17)
  set_target_properties(gpukit_torch_package PROPERTIES
    OUTPUT_NAME _C LIBRARY_OUTPUT_DIRECTORY "${_gpukit_torch_package_dir}"
    CXX_VISIBILITY_PRESET hidden BUILD_RPATH "" INSTALL_RPATH "")
  file(GLOB _gpukit_torch_py "${CMAKE_CURRENT_LIST_DIR}/gpukit_torch/*.py")
  foreach(_py IN LISTS _gpukit_torch_py)
    get_filename_component(_name "${_py}" NAME)
    add_custom_command(TARGET gpukit_torch_package POST_BUILD
      COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${_py}" "${_gpukit_torch_package_dir}/${_name}")
  endforeach()
endif()
