// SPDX-License-Identifier: Apache-2.0
// gpukit_torch::detail::record_table against std::map: random inserts and erases of 512-byte
// aligned addresses (long probe runs, erases across the wrap), growth, for_each; records that own
// memory are moved, never copied or lost.
#include <gpukit_torch/detail/record_table.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>

TEST_CASE("record_table agrees with std::map through random inserts and erases")
{
  gpukit_torch::detail::record_table<std::shared_ptr<int>> t;
  std::map<std::uintptr_t, int> m;
  std::mt19937_64 rng{3};
  std::uniform_int_distribution<std::uintptr_t> key{1, 5000};
  auto check = [&] {
    REQUIRE(t.size() == m.size());
    std::size_t seen = 0;
    t.for_each([&](void* p, std::shared_ptr<int> const& r) {
      auto it = m.find(reinterpret_cast<std::uintptr_t>(p));
      REQUIRE(it != m.end());
      CHECK(*r == it->second);
      CHECK(r.use_count() == 1);
      ++seen;
    });
    CHECK(seen == m.size());
  };
  for (int step = 0; step < 200000; ++step) {
    std::uintptr_t const k = key(rng) << 9;
    void const* p          = reinterpret_cast<void const*>(k);
    auto it                = m.find(k);
    if (it == m.end()) {
      CHECK(t.find(p) == nullptr);
      t.insert(p, std::make_shared<int>(step));
      m[k] = step;
    } else {
      REQUIRE(t.find(p) != nullptr);
      CHECK(**t.find(p) == it->second);
      t.erase(p);
      m.erase(it);
      CHECK(t.find(p) == nullptr);
    }
    if (step % 25000 == 0) { check(); }
  }
  check();
}
