// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/testing.hpp: the public invariant check holds on an allocator in use and after it
// is emptied, over the simulated GPU, and says the same as the checker the library's own tests use.
#include "support/sim_gpu.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/memory/testing.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <utility>
#include <vector>

TEST_SUITE("memory")
{
  TEST_CASE("testing::check_invariants: empty on a fresh, a busy and a drained allocator")
  {
    gpukit::sim_runtime sim{gpukit::test::one_device()};
    gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim};
    CHECK(gpukit::memory::testing::check_invariants(alloc) == "");

    std::vector<std::pair<void*, std::size_t>> live;
    for (std::size_t i = 0; i < 64; ++i) {
      std::size_t const bytes =
        (i % 7 + 1) * (i % 2 == 0 ? 512 : 3 << 20);  // small and large pools
      live.emplace_back(alloc.allocate(bytes), bytes);
    }
    for (std::size_t i = 0; i < live.size(); i += 2) {  // every other block: free neighbours split
      alloc.deallocate(live[i].first, live[i].second);
    }
    std::string const busy = gpukit::memory::testing::check_invariants(alloc);
    CHECK(busy == "");
    CHECK(busy == gpukit::detail::check_invariants(alloc));

    for (std::size_t i = 1; i < live.size(); i += 2) {
      alloc.deallocate(live[i].first, live[i].second);
    }
    static_cast<void>(alloc.release());
    CHECK(gpukit::memory::testing::check_invariants(alloc) == "");
  }
}
