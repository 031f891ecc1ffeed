// SPDX-License-Identifier: Apache-2.0
// statistics_resource_adaptor on the simulated GPU: exact current, peak and totals, peaks reset,
// failures uncounted, and totals exact under threads.
#include "memory/adaptors/mock_resource.hpp"
#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/memory/adaptors/statistics_resource_adaptor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <new>
#include <thread>
#include <vector>

using namespace gpukit::test;  // sim_allocator, one_device, mock_resource, mib
using gpukit::sim_runtime;

TEST_SUITE("resource_adaptors")
{
  TEST_CASE("statistics: current, peak and totals of bytes and allocations, and reset_peak")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::statistics_resource_adaptor counted{alloc};
    void* a = counted.allocate_async(100, {});
    void* b = counted.allocate_async(200, {});
    counted.deallocate_async(a, 100, {});
    gpukit::resource_stats s = counted.stats();
    CHECK(s.bytes.current == 200);
    CHECK(s.bytes.peak == 300);
    CHECK(s.bytes.allocated == 300);
    CHECK(s.bytes.freed == 100);
    CHECK(s.allocations.current == 1);
    CHECK(s.allocations.peak == 2);
    CHECK(s.allocations.allocated == 2);
    CHECK(s.allocations.freed == 1);
    counted.reset_peak();
    CHECK(counted.stats().bytes.peak == 200);
    CHECK(counted.stats().allocations.peak == 1);
    counted.deallocate_async(b, 200, {});
    s = counted.stats();
    CHECK(s.bytes.current == 0);
    CHECK(s.bytes.peak == 200);
    CHECK(s.bytes.allocated == s.bytes.freed);
  }

  TEST_CASE("statistics: a failed allocation or free counts nothing")
  {
    mock_resource mock;
    gpukit::statistics_resource_adaptor counted{mock};
    mock.fail_allocs = 1;
    CHECK_THROWS_AS((void)counted.allocate_async(64, {}), std::bad_alloc);
    CHECK(counted.stats().allocations.allocated == 0);
    void* p         = counted.allocate_async(64, {});
    mock.fail_frees = 1;
    CHECK_THROWS_AS(counted.deallocate_async(p, 64, {}), gpukit::logic_error);
    CHECK(counted.stats().bytes.current == 64);
    counted.deallocate_async(p, 64, {});
    CHECK(counted.stats().bytes.current == 0);
    CHECK(counted.stats().allocations.freed == 1);
  }
}

// Threads racing through the adaptor (also run under ThreadSanitizer: the tsan preset).
TEST_SUITE("sim_concurrency")
{
  TEST_CASE("statistics: totals are exact and the peak bounded under threads")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::statistics_resource_adaptor counted{alloc};
    int const threads = 4, pairs = 2000;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (int i = 0; i < pairs; ++i) {
          counted.deallocate_async(counted.allocate_async(512, {}), 512, {});
        }
      });
    }
    for (auto& th : pool) { th.join(); }
    gpukit::resource_stats const s = counted.stats();
    CHECK(s.allocations.allocated == threads * pairs);
    CHECK(s.allocations.freed == threads * pairs);
    CHECK(s.allocations.current == 0);
    CHECK(s.allocations.peak >= 1);
    CHECK(s.allocations.peak <= threads);  // each thread holds one block at a time
    CHECK(s.bytes.peak <= 512 * threads);
  }
}
