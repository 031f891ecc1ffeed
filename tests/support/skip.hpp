// SPDX-License-Identifier: Apache-2.0
// tests/support/skip.hpp: a case that cannot run here says so and is reported skipped.
//
//   TEST_CASE("two GPUs: peer copies")
//   {
//     GPUKIT_TEST_SKIP_UNLESS(gpu_count() >= 2, "fewer than 2 GPUs");
//     ...
//   }
//
// When the condition is false the case prints why and returns. A test binary run by gpukit's
// mains (support/doctest_main.hpp) whose every case that ran skipped itself, none failing, exits
// 77, which CTest reports as skipped (SKIP_RETURN_CODE 77 on every doctest test): CTest runs one
// case per process, so each such case shows as skipped. A run of several cases in which some
// ran exits as usual, with the skipped cases' messages in its output.
#pragma once

#include <doctest/doctest.h>

#include <atomic>

namespace gpukit::test {

/// The cases of this run that skipped themselves.
inline std::atomic<int>& skipped_cases()
{
  static std::atomic<int> count{0};
  return count;
}

/// Counts the running case skipped and says why (the case returns right after).
inline void note_skipped(char const* why)
{
  MESSAGE("skipped: " << why);
  skipped_cases().fetch_add(1);
}

}  // namespace gpukit::test

/// Ends the running case as skipped, saying `why`, unless `condition` holds.
#define GPUKIT_TEST_SKIP_UNLESS(condition, why) \
  do {                                          \
    if (!(condition)) {                         \
      ::gpukit::test::note_skipped(why);        \
      return;                                   \
    }                                           \
  } while (false)
