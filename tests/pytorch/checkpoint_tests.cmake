# SPDX-License-Identifier: Apache-2.0
# gpukit_torch.checkpoint's CPU tests (bindings/torch/tests/test_checkpoint.py, pytest -m "not gpu"),
# included from tests/CMakeLists.txt (one line there). They need a Python with torch and pytest:
# GPUKIT_TORCH_PYTHON (default: the python3 found; CI's: scripts/torch-venv's, PyTorch 2.11 for the
# CPU with torchvision and transformers, so no case skips). Without torch or pytest the test exits
# 77 and CTest reports it skipped, with the reason; it never passes without running. The planner is
# compiled from bindings/torch/csrc/planner.cpp into the build folder on first use (ninja).
# The GPU cases of the same file run on a GPU machine (benchmarks/checkpoint/run_torch_h200.sh).
# The label is torch_binding, not gpukit_torch: `ctest -LE gpu` (the README's test command) takes a
# regular expression, which would leave out every label containing "gpu".
find_package(Python3 COMPONENTS Interpreter QUIET)
set(GPUKIT_TORCH_PYTHON "${Python3_EXECUTABLE}" CACHE FILEPATH
  "Python with torch and pytest for gpukit_torch.checkpoint's CPU tests")
if(NOT GPUKIT_TORCH_PYTHON)
  foreach(_gpukit_test gpukit_torch.checkpoint gpukit_torch.checkpoint_bench)
    gpukit_add_skipped_test(${_gpukit_test}
      "no python3 was found when this build was configured (set GPUKIT_TORCH_PYTHON to a Python with torch and pytest, and configure again)"
      LABELS torch_binding)
  endforeach()
  return()
endif()
# The headers for the planner's on-the-fly build, its build folder, and no GPU for the CPU cases.
set(_gpukit_torch_test_env
  "GPUKIT_INCLUDE_DIR=${PROJECT_SOURCE_DIR}/include;TORCH_EXTENSIONS_DIR=${CMAKE_CURRENT_BINARY_DIR}/torch_extensions;CUDA_VISIBLE_DEVICES=")
add_test(NAME gpukit_torch.checkpoint
         COMMAND ${GPUKIT_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/pytorch/checkpoint_pytest.py)
set_tests_properties(gpukit_torch.checkpoint PROPERTIES
  LABELS torch_binding SKIP_RETURN_CODE 77 TIMEOUT 900 COST 300
  ENVIRONMENT "${_gpukit_torch_test_env}")
# The checkpoint benchmark's own code (torch_checkpoint.py --smoke: anchors, torch.compile rows,
# gpukit on the compiled model) on the CPU with stand-in measurements: a script error shows here,
# not in a GPU call. About 20 s (transformers' Llama, a batch of 32 tokens, torch.compile with aot_eager).
add_test(NAME gpukit_torch.checkpoint_bench
         COMMAND ${GPUKIT_TORCH_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/pytorch/checkpoint_bench_smoke.py)
set_tests_properties(gpukit_torch.checkpoint_bench PROPERTIES
  LABELS torch_binding SKIP_RETURN_CODE 77 TIMEOUT 600 COST 50
  ENVIRONMENT "${_gpukit_torch_test_env}")
