// SPDX-License-Identifier: Apache-2.0
// detail::address_table and address_map against std::map, through inserts, replacements, erases
// (backward shifts across the table's wrap), growth, erase_if and for_each; values that own
// memory (shared_ptr) are moved, never copied or lost.
#include <gpukit/memory/detail/address_map.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>

namespace {

using gpukit::detail::address_map;
using gpukit::detail::address_table;

void check_same(address_table<std::shared_ptr<int>> const& t,
                std::map<std::uintptr_t, int> const& m)
{
  REQUIRE(t.size() == m.size());
  std::size_t seen = 0;
  t.for_each([&](std::uintptr_t k, std::shared_ptr<int> const& v) {
    auto it = m.find(k);
    REQUIRE(it != m.end());
    CHECK(*v == it->second);
    CHECK(v.use_count() == 1);  // moved in and around, never copied
    ++seen;
  });
  CHECK(seen == m.size());
}

}  // namespace

TEST_CASE("address_table agrees with std::map through random inserts, replacements and erases")
{
  address_table<std::shared_ptr<int>> t;
  std::map<std::uintptr_t, int> m;
  std::mt19937_64 rng{7};
  // Few distinct keys (256-byte aligned, as blocks are) so that runs collide and erases shift.
  std::uniform_int_distribution<std::uintptr_t> key{1, 3000};
  for (int step = 0; step < 200000; ++step) {
    std::uintptr_t const k = key(rng) << 8;
    int const v            = step;
    switch (rng() % 3) {
      case 0:
      case 1:
        t.insert(k, std::make_shared<int>(v));
        m[k] = v;
        break;
      default: CHECK(t.erase(k) == (m.erase(k) == 1)); break;
    }
    if (step % 20000 == 0) { check_same(t, m); }
    std::shared_ptr<int> const* found = t.find(k);
    auto it                           = m.find(k);
    REQUIRE((found != nullptr) == (it != m.end()));
    if (found != nullptr) { CHECK(**found == it->second); }
  }
  check_same(t, m);
  t.erase_if([](std::uintptr_t k, std::shared_ptr<int> const&) { return (k >> 8) % 2 == 0; });
  for (auto it = m.begin(); it != m.end();) {
    it = (it->first >> 8) % 2 == 0 ? m.erase(it) : std::next(it);
  }
  check_same(t, m);
  CHECK(t.find(std::uintptr_t{1} << 40) == nullptr);
  CHECK_FALSE(t.erase(std::uintptr_t{1} << 40));
}

TEST_CASE("address_map gives the pointer stored, or nullptr")
{
  int a = 1;
  int b = 2;
  address_map<int> m;
  CHECK(m.find(256) == nullptr);
  m.insert(256, &a);
  m.insert(512, &b);
  CHECK(m.find(256) == &a);
  m.insert(256, &b);  // replaces
  CHECK(m.find(256) == &b);
  CHECK(m.size() == 2);
  m.insert(768, &a);
  m.erase_if([&](std::uintptr_t, int* v) { return v == &b; });
  CHECK(m.find(768) == &a);
  CHECK(m.erase(768));
  CHECK(m.size() == 0);
}
