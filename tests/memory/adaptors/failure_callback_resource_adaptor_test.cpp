// SPDX-License-Identifier: Apache-2.0
// failure_callback_resource_adaptor on the simulated GPU: the callback is called with what failed,
// the allocation tried again while it returns true, and the error rethrown once it returns false;
// over a limit, over the device's own out of memory, and with another error type.
#include "memory/adaptors/mock_resource.hpp"
#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/memory/adaptors/failure_callback_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <new>
#include <vector>

using namespace gpukit::test;  // sim_allocator, one_device, mock_resource, mib
using gpukit::sim_runtime;

TEST_SUITE("resource_adaptors")
{
  TEST_CASE("failure_callback: the callback frees memory and the allocation is tried again")
  {
    sim_runtime sim{one_device(gib)};
    sim_allocator alloc{sim, 0};
    gpukit::limiting_resource_adaptor limited{alloc, 4 * mib};
    std::vector<void*> cache;  // what the callback may spill
    for (int i = 0; i < 3; ++i) { cache.push_back(limited.allocate_async(mib, {})); }
    std::vector<gpukit::oom_context> seen;
    gpukit::failure_callback_resource_adaptor retrying{limited, [&](gpukit::oom_context const& c) {
                                                         seen.push_back(c);
                                                         if (cache.empty()) { return false; }
                                                         limited.deallocate_async(cache.back(), mib,
                                                                                  {});
                                                         cache.pop_back();
                                                         return true;
                                                       }};
    void* p = retrying.allocate_async(3 * mib, {});  // needs two of the three spilled
    REQUIRE(seen.size() == 2);
    CHECK(seen[0].requested == 3 * mib);
    CHECK(seen[0].limit == 4 * mib);
    CHECK(seen[0].device == 0);
    CHECK(cache.size() == 1);
    CHECK(limited.allocated_bytes() == 4 * mib);
    retrying.deallocate_async(p, 3 * mib, {});
    CHECK(limited.allocated_bytes() == mib);
    limited.deallocate_async(cache.back(), mib, {});
  }

  TEST_CASE("failure_callback: false rethrows the upstream's error; true retries until false")
  {
    sim_runtime sim{one_device(64 * mib)};
    sim_allocator alloc{sim, 0};
    void* held = alloc.allocate_async(48 * mib, {});  // 32 MiB more cannot fit
    int calls = 0, allowed = 1;
    gpukit::failure_callback_resource_adaptor retrying{alloc, [&](gpukit::oom_context const& c) {
                                                         ++calls;
                                                         CHECK(c.requested == 32 * mib);
                                                         CHECK(c.device == 0);
                                                         return calls < allowed;
                                                       }};
    CHECK_THROWS_AS((void)retrying.allocate_async(32 * mib, {}), gpukit::out_of_memory);
    CHECK(calls == 1);
    calls   = 0;
    allowed = 3;
    CHECK_THROWS_WITH_AS((void)retrying.allocate_async(32 * mib, {}),
                         doctest::Contains("out of memory on device 0"), gpukit::out_of_memory);
    CHECK(calls == 3);
    // Other errors pass through without the callback.
    calls = 0;
    CHECK_THROWS_AS((void)retrying.allocate_async(0, {}), gpukit::logic_error);
    CHECK(calls == 0);
    void* p = retrying.allocate_async(mib, {});
    retrying.deallocate_async(p, mib, {});
    CHECK(calls == 0);
    alloc.deallocate_async(held, 48 * mib, {});
  }

  TEST_CASE("failure_callback: another error type, for resources that throw std::bad_alloc")
  {
    mock_resource mock;
    int calls     = 0;
    auto callback = [&](gpukit::oom_context const& c) {
      ++calls;
      CHECK(c.requested == 64);
      CHECK(c.device == -1);  // the mock does not say
      return true;
    };
    gpukit::failure_callback_resource_adaptor<mock_resource, decltype(callback), std::bad_alloc>
      retrying{mock, callback};
    mock.fail_allocs = 2;
    void* p          = retrying.allocate_async(64, {});
    CHECK(calls == 2);
    CHECK(mock.allocations == 1);
    retrying.deallocate_async(p, 64, {});
    CHECK(mock.deallocations == 1);
    // With the default error type (gpukit::out_of_memory) a std::bad_alloc is no out of memory.
    gpukit::failure_callback_resource_adaptor plain{mock, callback};
    mock.fail_allocs = 1;
    calls            = 0;
    CHECK_THROWS_AS((void)plain.allocate_async(64, {}), std::bad_alloc);
    CHECK(calls == 0);
  }
}
