# SPDX-License-Identifier: Apache-2.0
# libgpukit_torch (bindings/torch) tested without a GPU, included from tests/CMakeLists.txt (one
# line there). libgpukit_torch_sim.so is the same source over the simulated GPU
# (GPUKIT_TORCH_SIM=1); two tests load it as PyTorch and CuPy would:
#   gpukit_torch_abi_test  doctest: dlopen + dlsym, every C function, OOM, bad frees, snapshots
#   gpukit_torch.python    gpukit_torch.pluggable's ctypes layer (stats, empty_cache, snapshot, the CuPy
#                          allocator's malloc and free); no torch needed. Reported skipped, with
#                          the reason, in sanitizer builds and without python3 or its ctypes
#   gpukit_torch.sharing   gpukit_torch._sharing: a tensor that cannot be shared, put on an mp.Queue,
#                          raises in the receiver and warns the sender; pure Python
gpukit_test_wanted(wanted gpukit_torch_abi_test pytorch/gpukit_torch_abi_test.cpp)
if(NOT wanted)
  return()
endif()
include(${PROJECT_SOURCE_DIR}/bindings/torch/torch_library.cmake)
set(gpukit_torch_sim_dir "${CMAKE_CURRENT_BINARY_DIR}/pytorch")
if(GPUKIT_OUTPUT_DIRECTORY)
  set(gpukit_torch_sim_dir "${GPUKIT_OUTPUT_DIRECTORY}/tests")  # next to the test binaries
endif()
gpukit_add_torch_library(gpukit_torch_sim SIM OUTPUT_DIRECTORY "${gpukit_torch_sim_dir}"
  SOURCES ${PROJECT_SOURCE_DIR}/bindings/torch/gpukit_torch.cpp)

gpukit_add_test(gpukit_torch_abi_test SOURCES pytorch/gpukit_torch_abi_test.cpp)
if(TARGET gpukit_torch_abi_test)
  target_link_libraries(gpukit_torch_abi_test PRIVATE ${CMAKE_DL_LIBS})
  target_include_directories(gpukit_torch_abi_test PRIVATE "${PROJECT_SOURCE_DIR}/bindings/torch")
  target_compile_definitions(gpukit_torch_abi_test PRIVATE
    GPUKIT_TORCH_SIM_LIB="$<TARGET_FILE:gpukit_torch_sim>")
  add_dependencies(gpukit_torch_abi_test gpukit_torch_sim)
endif()

# The ctypes test runs wherever python3 with ctypes is; elsewhere it is reported skipped, saying
# why (the test itself exits 77 when ctypes is missing).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(GPUKIT_SANITIZE)
  gpukit_add_skipped_test(gpukit_torch.python
    "a sanitizer build (GPUKIT_SANITIZE=${GPUKIT_SANITIZE}): Python loads libgpukit_torch_sim.so into an interpreter that the sanitizer runtime does not come first in (it must be the first library loaded), so the library cannot run instrumented there; the build without GPUKIT_SANITIZE runs this test"
    LABELS torch_binding)
elseif(NOT Python3_Interpreter_FOUND)
  gpukit_add_skipped_test(gpukit_torch.python
    "python3 was not found when this build was configured (install it, or set Python3_EXECUTABLE, and configure again)"
    LABELS torch_binding)
else()
  add_test(NAME gpukit_torch.python
           COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/pytorch/gpukit_torch_ctypes_test.py
                   $<TARGET_FILE:gpukit_torch_sim>)
  set_tests_properties(gpukit_torch.python PROPERTIES LABELS torch_binding SKIP_RETURN_CODE 77
    ENVIRONMENT "GPUKIT_SIM_DEVICES=2;GPUKIT_SIM_CAPACITY=1G")
endif()
# gpukit_torch._sharing (what torch.multiprocessing's tensor reducer does when sharing fails in a
# queue's feeder thread), pure Python: no torch, no library.
if(Python3_Interpreter_FOUND)
  add_test(NAME gpukit_torch.sharing
           COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/pytorch/sharing_test.py)
  set_tests_properties(gpukit_torch.sharing PROPERTIES LABELS torch_binding TIMEOUT 300)
else()
  gpukit_add_skipped_test(gpukit_torch.sharing
    "python3 was not found when this build was configured (install it, or set Python3_EXECUTABLE, and configure again)"
    LABELS torch_binding)
endif()
