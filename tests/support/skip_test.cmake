# SPDX-License-Identifier: Apache-2.0
# Checks the exit codes of a test binary whose case skips itself (tests/support/skip.hpp): CTest
# reports a test skipped only when its process exits 77 (SKIP_RETURN_CODE).
#
#   cmake -DPROBE=<support_skip_probe> -P skip_test.cmake
if(NOT PROBE)
  message(FATAL_ERROR "skip_test.cmake: pass -DPROBE=<path of support_skip_probe>")
endif()

function(expect_exit code)
  execute_process(COMMAND ${PROBE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL code)
    message(FATAL_ERROR "support_skip_probe ${ARGN}: exit ${rc}, expected ${code}\n${out}")
  endif()
  message(STATUS "support_skip_probe ${ARGN}: exit ${rc}, as expected")
endfunction()

expect_exit(77 "--test-case=probe: skips")         # every case that ran skipped: skipped
expect_exit(0 "--test-case=probe: runs")           # an ordinary pass
expect_exit(0)                                     # one ran, one skipped: the run passed
expect_exit(0 --list-test-cases)                   # listing (discovery) is never skipped
expect_exit(0 "--test-case=no such case")          # nothing ran: not a skip
