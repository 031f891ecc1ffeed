// SPDX-License-Identifier: Apache-2.0
// limiting_resource_adaptor on the simulated GPU: what it refuses and with what report, that a
// refusal or an upstream failure leaves its count as it was, and that racing requests never pass
// the limit together.
#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, one_device, kib, mib
using gpukit::sim_runtime;

TEST_SUITE("resource_adaptors")
{
  TEST_CASE("limiting: a request past the limit is refused with the request, limit and use")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::limiting_resource_adaptor limited{alloc, mib};
    void* held = limited.allocate_async(600 * kib, {});
    CHECK(limited.allocated_bytes() == 600 * kib);
    try {
      (void)limited.allocate_async(600 * kib, {});
      FAIL("the limit was passed");
    } catch (gpukit::out_of_memory const& e) {
      CHECK(e.report().requested == 600 * kib);
      CHECK(e.report().limit == mib);
      CHECK(e.report().allocated == 600 * kib);
      CHECK(e.report().device == 0);
      CHECK(e.report().device_total == gib);
    }
    // Nothing changed: the count, and the upstream was never asked.
    CHECK(limited.allocated_bytes() == 600 * kib);
    CHECK(alloc.stats().allocation_count.current == 1);
    // Exactly up to the limit fits.
    void* rest = limited.allocate_async(mib - 600 * kib, {});
    CHECK(limited.allocated_bytes() == mib);
    CHECK_THROWS_AS((void)limited.allocate_async(1, {}), gpukit::out_of_memory);
    limited.deallocate_async(rest, mib - 600 * kib, {});
    limited.deallocate_async(held, 600 * kib, {});
    CHECK(limited.allocated_bytes() == 0);
    // A request larger than the limit itself (no overflow of the count).
    CHECK_THROWS_AS((void)limited.allocate_async(~std::size_t{0}, {}), gpukit::out_of_memory);
    CHECK(limited.allocated_bytes() == 0);
  }

  TEST_CASE("limiting: an upstream failure gives the request's bytes back")
  {
    sim_runtime sim{one_device(64 * mib)};
    sim_allocator alloc{sim, 0};
    gpukit::limiting_resource_adaptor limited{alloc, gib};
    void* held = alloc.allocate_async(48 * mib, {});  // not through the adaptor
    CHECK_THROWS_AS((void)limited.allocate_async(32 * mib, {}), gpukit::out_of_memory);  // device
    CHECK_THROWS_AS((void)limited.allocate_async(128 * mib, {}), gpukit::bad_alloc);     // too big
    CHECK_THROWS_AS((void)limited.allocate_async(0, {}), gpukit::logic_error);  // the allocator's
    CHECK(limited.allocated_bytes() == 0);
    alloc.deallocate_async(held, 48 * mib, {});
    void* p = limited.allocate_async(32 * mib, {});
    CHECK(limited.allocated_bytes() == 32 * mib);
    limited.deallocate_async(p, 32 * mib, {});
  }

  TEST_CASE("limiting: set_limit applies to the next request; lowering it frees nothing")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::limiting_resource_adaptor limited{alloc, 4 * mib};
    void* p = limited.allocate_async(3 * mib, {});
    limited.set_limit(2 * mib);
    CHECK(limited.limit() == 2 * mib);
    CHECK(limited.allocated_bytes() == 3 * mib);
    CHECK_THROWS_AS((void)limited.allocate_async(256, {}), gpukit::out_of_memory);
    limited.deallocate_async(p, 3 * mib, {});
    void* q = limited.allocate_async(2 * mib, {});
    limited.deallocate_async(q, 2 * mib, {});
  }
}

// Threads racing through the adaptor (also run under ThreadSanitizer: the tsan preset).
TEST_SUITE("sim_concurrency")
{
  TEST_CASE("limiting: racing threads never hold more than the limit together")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    std::size_t const limit = 64 * kib;
    gpukit::limiting_resource_adaptor limited{alloc, limit};
    std::atomic<std::size_t> most{0};
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        std::vector<void*> held;
        for (int i = 0; i < 2000; ++i) {
          try {
            held.push_back(limited.allocate_async(4 * kib, {}));
          } catch (gpukit::out_of_memory const&) {
            refused.fetch_add(1);
          }
          std::size_t const now = limited.allocated_bytes();
          std::size_t seen      = most.load();
          while (seen < now && !most.compare_exchange_weak(seen, now)) {}
          if (held.size() == 24) {  // 96 KiB: one thread alone reaches the limit
            for (void* p : held) { limited.deallocate_async(p, 4 * kib, {}); }
            held.clear();
          }
        }
        for (void* p : held) { limited.deallocate_async(p, 4 * kib, {}); }
      });
    }
    for (auto& th : threads) { th.join(); }
    CHECK(refused.load() > 0);
    CHECK(most.load() <= limit);
    CHECK(alloc.stats().requested_bytes.peak <= static_cast<std::int64_t>(limit));
    CHECK(limited.allocated_bytes() == 0);
  }
}
