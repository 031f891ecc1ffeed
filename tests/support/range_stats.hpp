// SPDX-License-Identifier: Apache-2.0
// tests/support/range_stats.hpp: a range timer's statistics of one range, which the test expects.
//
//   CHECK(gpukit::test::stats_of(timer, "forward").count == 3);
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <string_view>

namespace gpukit::test {

/// The statistics of range `name` in `timer`; ends the case as failed (REQUIRE) when it has none.
template <class Timer>
auto stats_of(Timer& timer, std::string_view name)
{
  auto stats = timer.stats(name);
  REQUIRE_MESSAGE(stats.has_value(), "no range named " << std::string{name});
  return *stats;
}

}  // namespace gpukit::test
