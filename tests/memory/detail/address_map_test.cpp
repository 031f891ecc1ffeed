// SPDX-License-Identifier: Apache-2.0
// detail::address_map against std::map, through inserts, replacements, erases (backward shifts
// across the table's wrap), growth, erase_if and for_each.
#include <gpukit/memory/detail/address_map.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <vector>

namespace {

using gpukit::detail::address_map;

void check_same(address_map<int> const& t, std::map<std::uintptr_t, int*> const& m)
{
  REQUIRE(t.size() == m.size());
  std::size_t seen = 0;
  t.for_each([&](std::uintptr_t k, int* v) {
    auto it = m.find(k);
    REQUIRE(it != m.end());
    CHECK(v == it->second);
    ++seen;
  });
  CHECK(seen == m.size());
}

}  // namespace

TEST_CASE("address_map agrees with std::map through random inserts, replacements and erases")
{
  std::vector<int> values(64);
  address_map<int> t;
  std::map<std::uintptr_t, int*> m;
  std::mt19937_64 rng{7};
  // Few distinct keys (256-byte aligned, as blocks are) so that runs collide and erases shift.
  std::uniform_int_distribution<std::uintptr_t> key{1, 3000};
  for (int step = 0; step < 200000; ++step) {
    std::uintptr_t const k = key(rng) << 8;
    int* const v           = &values[rng() % values.size()];
    if (rng() % 3 != 0) {
      t.insert(k, v);
      m[k] = v;
    } else {
      CHECK(t.erase(k) == (m.erase(k) == 1));
    }
    if (step % 20000 == 0) { check_same(t, m); }
    auto it = m.find(k);
    CHECK(t.find(k) == (it == m.end() ? nullptr : it->second));
  }
  check_same(t, m);
  t.erase_if([](std::uintptr_t k, int*) { return (k >> 8) % 2 == 0; });
  for (auto it = m.begin(); it != m.end();) {
    it = (it->first >> 8) % 2 == 0 ? m.erase(it) : std::next(it);
  }
  check_same(t, m);
  CHECK(t.find(std::uintptr_t{1} << 40) == nullptr);
  CHECK_FALSE(t.erase(std::uintptr_t{1} << 40));
}
