# SPDX-License-Identifier: Apache-2.0
# The gpukit-doctor executable end to end, on the simulated GPU (a device of compute capability
# 9.0): --help, the text and JSON reports, the architecture check that --arch sets, and the exit
# codes of a failed check and of a bad command line (--arch values that are not architectures
# among them).
#   cmake -DTOOL=<gpukit-doctor> -P gpukit_doctor_cli.cmake
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/cli_expect.cmake)

expect(help EXIT 0 STDOUT "^usage: gpukit-doctor " "--arch LIST" ARGS --help)
expect(help-short EXIT 0 STDOUT "^usage: gpukit-doctor " ARGS -h)
expect(sim EXIT 0 STDOUT "^gpukit doctor: SIMULATED GPU" "\n\\[ ok \\] copy " "\nverdict: ok"
  ARGS --sim --arch 90)
expect(sim-json EXIT 0 LINES 1
  LAST "^{\"simulated\":true,.*\"exit_code\":0,\"checks\":\\[{\"id\":\"driver\",.*}\\]}$"
  ARGS --sim --json --arch 90)
expect(arch-native EXIT 0 STDOUT "\n\\[ ok \\] arch\\.0 +kernel architectures: built for \"90\": native code sm_90"
  ARGS --sim --arch 90)
expect(arch-jit EXIT 0 STDOUT "\n\\[warn\\] arch\\.0 .*JIT-compiles compute_80" ARGS --sim --arch=80)
expect(arch-mismatch EXIT 14 STDOUT "\n\\[FAIL\\] arch\\.0 " "verdict: FAIL \\(exit 14\\)"
  ARGS --sim --arch 100-real)
expect(arch-none EXIT 0 STDOUT "\n\\[skip\\] arch\\.0 .*not told which architectures" ARGS --sim --arch=)
expect(arch-no-value EXIT 2 STDERR "gpukit-doctor: error: --arch needs a value" "usage:"
  ARGS --sim --arch)
# --arch values that are not architectures (numbers beyond int, out of range, words) are usage
# errors naming the entry and what is allowed, never an abort.
set(arch_allowed "expected a number from 10 to 999 .*or all, all-major or native")
expect(arch-beyond-int EXIT 2
  STDERR "gpukit-doctor: error: --arch \"2147483648\" is not a CUDA architecture: ${arch_allowed}"
  "usage: gpukit-doctor" ARGS --sim --arch 2147483648)
expect(arch-twenty-digits EXIT 2
  STDERR "--arch \"99999999999999999999\" is not a CUDA architecture: ${arch_allowed}"
  ARGS --sim --arch 99999999999999999999)
# (A list separated by ',' here: CMake would split one separated by ';' into two arguments;
# doctor_test.cpp checks the ';' spelling.)
expect(arch-list-beyond-int EXIT 2
  STDERR "--arch \"90,2147483648\": \"2147483648\" is not a CUDA architecture: ${arch_allowed}"
  ARGS --sim --arch=90,2147483648)
expect(arch-too-small EXIT 2 STDERR "--arch \"9\" is not a CUDA architecture" ARGS --sim --arch 9)
expect(arch-word EXIT 2 STDERR "--arch \"90,sm90\": \"sm90\" is not a CUDA architecture"
  ARGS --sim --arch 90,sm90)
expect(arch-largest EXIT 14 STDOUT "\n\\[FAIL\\] arch\\.0 .*built for \"999-real\""
  ARGS --sim --arch 999-real)
expect(unknown-option EXIT 2 STDERR "unknown option \"--bogus\"" "usage: gpukit-doctor"
  ARGS --bogus)

# A malformed GPUKIT_SIM_* value is a usage error naming the variable, not an abort.
set(ENV{GPUKIT_SIM_DEVICES} "abc")
expect(sim-bad-devices EXIT 2 STDERR "gpukit-doctor: error: GPUKIT_SIM_DEVICES=abc: expected a number of devices" ARGS --sim)
unset(ENV{GPUKIT_SIM_DEVICES})
set(ENV{GPUKIT_SIM_CAPACITY} "12Q")
expect(sim-bad-capacity EXIT 2 STDERR "GPUKIT_SIM_CAPACITY=12Q: expected a number of bytes" ARGS --sim)
unset(ENV{GPUKIT_SIM_CAPACITY})

expect_summary()
