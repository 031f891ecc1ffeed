// SPDX-License-Identifier: Apache-2.0
// doctest's main for test binaries whose cases need a real GPU (TEST_SUITE("gpu")).
//
// Without a usable GPU (no driver, or no device), the binary exits with 77, which CTest reports as
// skipped (SKIP_RETURN_CODE). It never does so when it is only asked to list its tests: test
// discovery runs the binary at build time, on machines that have no GPU. A case that needs more
// than one GPU skips itself (support/skip.hpp), and a run of only such cases exits 77 too.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

namespace {

bool only_listing(int argc, char** argv)
{
  for (int i = 1; i < argc; ++i) {
    char const* a = argv[i];
    while (*a == '-') { ++a; }
    if (std::strncmp(a, "dt-", 3) == 0) { a += 3; }
    for (char const* flag : {"list-test-cases", "ltc", "list-test-suites", "lts", "list-reporters",
                             "lr", "count", "c", "help", "h", "version", "v"}) {
      if (std::strcmp(a, flag) == 0) { return true; }
    }
    if (std::strncmp(a, "count=", 6) == 0 || std::strncmp(a, "c=", 2) == 0) { return true; }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv)
{
  if (!only_listing(argc, argv)) {
    int count           = 0;
    cudaError_t const e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      std::printf("no usable GPU (%s: %s): skipping GPU tests\n", cudaGetErrorName(e),
                  e == cudaSuccess ? "no devices" : cudaGetErrorString(e));
      (void)cudaGetLastError();
      return gpukit::test::skip_exit_code;
    }
  }
  return gpukit::test::run_cases(argc, argv);
}
