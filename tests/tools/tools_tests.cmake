# SPDX-License-Identifier: Apache-2.0
# gpukit's command-line tools (tools/) run end to end, included from tests/CMakeLists.txt (one line
# there) when they are built (GPUKIT_BUILD_TOOLS), and the benchmark program replay_trace when the
# benchmarks are (GPUKIT_BUILD_BENCHMARKS). Each script runs one program through its cases
# (cli_expect.cmake): output, error paths, exit codes.
if(GPUKIT_BUILD_BENCHMARKS)
  add_test(NAME tools.replay_trace_cli
           COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:replay_trace> -DOUT=${CMAKE_CURRENT_BINARY_DIR}/replay_trace_cli
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/tools/replay_trace_cli.cmake)
  set_tests_properties(tools.replay_trace_cli PROPERTIES LABELS tools)
endif()
if(NOT GPUKIT_BUILD_TOOLS)
  return()
endif()
add_test(NAME tools.gpukit_plan_cli
         COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:gpukit-plan> -DOUT=${CMAKE_CURRENT_BINARY_DIR}/gpukit_plan_cli
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/tools/gpukit_plan_cli.cmake)
add_test(NAME tools.gpukit_doctor_cli
         COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:gpukit-doctor> -P ${CMAKE_CURRENT_SOURCE_DIR}/tools/gpukit_doctor_cli.cmake)
set_tests_properties(tools.gpukit_plan_cli tools.gpukit_doctor_cli PROPERTIES LABELS tools)
