# SPDX-License-Identifier: Apache-2.0
# The replay_trace program (benchmarks/memory/replay_trace.cpp) end to end on the simulated GPU:
# a replay's JSON line, and the exit status and message of bad command lines and traces (2 for
# usage, naming the option, the value and what is allowed).
#   cmake -DTOOL=<replay_trace> -DOUT=<scratch dir> -P replay_trace_cli.cmake
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY "${OUT}")
include(${CMAKE_CURRENT_LIST_DIR}/cli_expect.cmake)

file(WRITE "${OUT}/small.trace" "# two streams\na 1 1024 0\na 2 4096 0\nf 1\na 3 100 1\nf 2\nf 3\n")
file(WRITE "${OUT}/bad.trace" "a 1 1024 0\nx 2\n")
set(trace "${OUT}/small.trace")
set(most 281474976710656)  # 2^48

expect(replay EXIT 0
  LAST "^{\"trace\": \"small.trace\", \"runtime\": \"sim\", \"allocator\": \"gpukit\", \"events\": 6, \"peak_live_bytes\": 5120, .*\"repeat\": 2}$"
  ARGS --trace "${trace}" --repeat 2)
expect(replay-vmm-page-one EXIT 0 LAST "\"allocator\": \"gpukit_vmm\", \"events\": 6,"
  ARGS --trace "${trace}" --allocator gpukit_vmm --page-bytes 1 --repeat 1)
expect(replay-busy-streams EXIT 0 LAST "\"busy_streams\": true, \"catch_up_every\": 0, \"repeat\": 1}$"
  ARGS --trace "${trace}" --allocator gpukit_vmm --busy-streams --repeat 1)
expect(replay-busy-catching-up EXIT 0 LAST "\"busy_streams\": true, \"catch_up_every\": 2, \"repeat\": 1}$"
  ARGS --trace "${trace}" --allocator gpukit_vmm --busy-streams --catch-up-every 2 --repeat 1)
expect(catch-up-needs-busy EXIT 2 STDERR "--catch-up-every needs --busy-streams"
  ARGS --trace "${trace}" --catch-up-every 2)
expect(catch-up-zero EXIT 2 STDERR "--catch-up-every takes a whole number from 1 to ${most}, not '0'"
  ARGS --trace "${trace}" --busy-streams --catch-up-every 0)
expect(busy-streams-needs-sim EXIT 2 STDERR "--busy-streams needs --runtime sim"
  ARGS --trace "${trace}" --runtime cuda --busy-streams)
expect(help EXIT 0 STDOUT "^usage: replay_trace --trace FILE" "--medium-segment N" ARGS --help)

# ---- bad command lines (exit 2) -----------------------------------------------------------------
expect(page-bytes-zero EXIT 2
  STDERR "^replay_trace: --page-bytes takes a whole number from 1 to ${most}, not '0'\n$"
  ARGS --trace "${trace}" --page-bytes 0)
expect(medium-segment-zero EXIT 2
  STDERR "^replay_trace: --medium-segment takes a multiple of 256 from 10485760 to ${most}, not '0'\n$"
  ARGS --trace "${trace}" --medium-segment 0)
expect(medium-segment-not-a-multiple EXIT 2
  STDERR "--medium-segment takes a multiple of 256 from 10485760 to ${most}, not '10485761'"
  ARGS --trace "${trace}" --medium-segment 10485761)
expect(medium-segment-below-requests EXIT 2
  STDERR "--medium-segment takes a multiple of 256 from 10485760 to ${most}, not '1048576'"
  ARGS --trace "${trace}" --medium-segment 1048576)
expect(page-bytes-twenty-digits EXIT 2
  STDERR "--page-bytes takes a whole number from 1 to ${most}, not '99999999999999999999'"
  ARGS --trace "${trace}" --page-bytes 99999999999999999999)
expect(thread-cache-beyond-2-48 EXIT 2
  STDERR "--thread-cache-bytes takes a whole number from 0 to ${most}, not '281474976710657'"
  ARGS --trace "${trace}" --thread-cache-bytes 281474976710657)
expect(repeat-beyond-int EXIT 2
  STDERR "--repeat takes a whole number from 1 to 1000000, not '2147483648'"
  ARGS --trace "${trace}" --repeat 2147483648)
expect(repeat-negative EXIT 2 STDERR "--repeat takes a whole number from 1 to 1000000, not '-1'"
  ARGS --trace "${trace}" --repeat -1)
expect(repeat-zero EXIT 2 STDERR "--repeat takes a whole number from 1 to 1000000, not '0'"
  ARGS --trace "${trace}" --repeat 0)
expect(repeat-plus EXIT 2 STDERR "--repeat takes a whole number from 1 to 1000000, not '\\+3'"
  ARGS --trace "${trace}" --repeat +3)
expect(no-value EXIT 2 STDERR "--page-bytes needs a value" ARGS --trace "${trace}" --page-bytes)
expect(unknown-argument EXIT 2 STDERR "unknown argument '--bogus'" ARGS --trace "${trace}" --bogus)
expect(no-trace EXIT 2 STDERR "--trace FILE is required" ARGS --repeat 1)
expect(bad-runtime EXIT 2 STDERR "--runtime must be sim or cuda, not 'gpu'"
  ARGS --trace "${trace}" --runtime gpu)
expect(anchor-needs-cuda EXIT 2 STDERR "--allocator cub needs --runtime cuda"
  ARGS --trace "${trace}" --allocator cub)
expect(missing-trace EXIT 2 STDERR "cannot open trace '${OUT}/nope.trace'" ARGS --trace "${OUT}/nope.trace")
# A malformed trace names the line, with one prefix (not "replay_trace: gpukit: ").
expect(malformed-trace EXIT 2 STDERR "^replay_trace: [^\n]*bad.trace:2: unknown event 'x'"
  ARGS --trace "${OUT}/bad.trace")

expect_summary()
