# SPDX-License-Identifier: Apache-2.0
# Renders memory_report's HTML in headless Chromium and checks that its script ran: the summary
# and the segment map at the peak are filled in. Leaves a screenshot, memory.png, to look at.
#   cmake -DREPORT=<memory_report> -DCHROMIUM=<chromium> -DOUT=<dir> -P html_report_chromium.cmake
file(MAKE_DIRECTORY "${OUT}")
execute_process(COMMAND "${REPORT}" --sim --out "${OUT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "memory_report failed: ${rc}")
endif()
set(flags --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
          --disable-component-update --disable-sync "--user-data-dir=${OUT}/chromium-profile")
execute_process(COMMAND "${CHROMIUM}" ${flags} --dump-dom "file://${OUT}/memory.html"
                OUTPUT_VARIABLE dom ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "chromium failed: ${rc}")
endif()
foreach(expected "events, " "segments now, peak allocated" "after event " "class=\"blk a\"")
  string(FIND "${dom}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the rendered report lacks '${expected}': its script did not run")
  endif()
endforeach()
execute_process(COMMAND "${CHROMIUM}" ${flags} --window-size=1100,1000 "--screenshot=${OUT}/memory.png"
                "file://${OUT}/memory.html" OUTPUT_QUIET ERROR_QUIET TIMEOUT 120)
message(STATUS "rendered: ${OUT}/memory.png")
