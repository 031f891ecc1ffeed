// SPDX-License-Identifier: Apache-2.0
// A doctest binary for tests/support/skip_test.cmake: one case that runs and one that skips
// itself, to check the exit codes gpukit's mains give (77 only when every case that ran skipped).
#include "support/skip.hpp"

#include <doctest/doctest.h>

TEST_SUITE("support")
{
  TEST_CASE("probe: runs") { CHECK(1 + 1 == 2); }

  TEST_CASE("probe: skips")
  {
    GPUKIT_TEST_SKIP_UNLESS(1 + 1 == 3, "the probe's condition never holds");
    FAIL("a skipped case must not go on");
  }
}
