// SPDX-License-Identifier: Apache-2.0
// doctest's main for host-only test binaries. A case that cannot run here skips itself
// (support/skip.hpp); a run of only such cases exits 77, which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

int main(int argc, char** argv) { return gpukit::test::run_cases(argc, argv); }
