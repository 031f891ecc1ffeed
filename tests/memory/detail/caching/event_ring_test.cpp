// SPDX-License-Identifier: Apache-2.0
// detail::caching::event_ring alone: the newest events kept, the oldest overwritten and counted.
#include <gpukit/memory/detail/caching/event_ring.hpp>

#include <doctest/doctest.h>

#include <cstdint>

namespace {
gpukit::memory_event event(std::uint64_t t)
{
  gpukit::memory_event e{};
  e.what    = gpukit::memory_event::action::alloc;
  e.time_ns = t;
  return e;
}
}  // namespace

TEST_SUITE("event_ring")
{
  TEST_CASE("keeps every event up to its capacity")
  {
    gpukit::detail::caching::event_ring r;
    for (std::uint64_t t = 1; t <= 3; ++t) { r.push(event(t), 4); }
    REQUIRE(r.events().size() == 3);
    CHECK(r.events()[0].time_ns == 1);
    CHECK(r.events()[2].time_ns == 3);
    CHECK(r.dropped() == 0);
  }

  TEST_CASE("beyond its capacity, each event replaces the oldest, which counts as dropped")
  {
    gpukit::detail::caching::event_ring r;
    for (std::uint64_t t = 1; t <= 7; ++t) { r.push(event(t), 3); }
    REQUIRE(r.events().size() == 3);
    // 1 2 3, then 4 over 1, 5 over 2, 6 over 3, 7 over 4: ring order 7 5 6.
    CHECK(r.events()[0].time_ns == 7);
    CHECK(r.events()[1].time_ns == 5);
    CHECK(r.events()[2].time_ns == 6);
    CHECK(r.dropped() == 4);
  }

  TEST_CASE("a capacity of 0 keeps and drops nothing; clear forgets everything")
  {
    gpukit::detail::caching::event_ring r;
    r.push(event(1), 0);
    CHECK(r.events().empty());
    CHECK(r.dropped() == 0);
    r.push(event(2), 1);
    r.push(event(3), 1);
    CHECK(r.dropped() == 1);
    r.clear();
    CHECK(r.events().empty());
    CHECK(r.dropped() == 0);
    r.push(event(4), 2);
    CHECK(r.events().size() == 1);
  }
}
