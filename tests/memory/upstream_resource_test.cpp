// SPDX-License-Identifier: Apache-2.0
// A caching allocator whose segments come from a user's resource (an adaptor stack over
// malloc_async_resource, on the simulated GPU): segments taken and given back through it, its
// refusal running the out-of-memory ladder, and the settings that cannot go with it refused.
#include "support/sim_gpu.hpp"

#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/statistics_resource_adaptor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/malloc_async_resource.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

using namespace gpukit::test;  // sim_stream_fixture, mib
using gpukit::sim_runtime;
using allocator  = gpukit::basic_caching_allocator<sim_runtime>;
using async_mr   = gpukit::basic_malloc_async_resource<sim_runtime>;
using counted_mr = gpukit::statistics_resource_adaptor<async_mr>;
using limited_mr = gpukit::limiting_resource_adaptor<counted_mr>;

TEST_SUITE("caching_allocator")
{
  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "upstream resource: segments come from it and go back to it")
  {
    async_mr device{sim, 0};
    counted_mr counted{device};
    {
      allocator a{sim, 0, counted};
      CHECK(a.segment_source_in_use() == gpukit::segment_source::upstream);
      void* small   = a.allocate_async(1000, s);
      void* large   = a.allocate_async(3 * mib, s);
      auto const st = a.stats();
      // Every reserved byte is a segment the upstream handed out, and nothing else.
      CHECK(counted.stats().bytes.current == st.reserved_bytes.current);
      CHECK(counted.stats().allocations.current == st.segment_count.current);
      CHECK(counted.stats().allocations.current == 2);
      a.deallocate_async(small, 1000, s);
      a.deallocate_async(large, 3 * mib, s);
      // Cached: a second round takes nothing more from the upstream.
      void* again = a.allocate_async(3 * mib, s);
      CHECK(again == large);
      CHECK(counted.stats().allocations.allocated == 2);
      a.deallocate_async(again, 3 * mib, s);
      CHECK(a.release() == static_cast<std::size_t>(st.reserved_bytes.current));
      CHECK(counted.stats().bytes.current == 0);
      (void)a.allocate_async(mib, s);  // still allocated when the allocator goes
      CHECK(counted.stats().allocations.current == 1);
    }
    CHECK(counted.stats().bytes.current == 0);  // the destructor gave it back too
    CHECK(counted.stats().allocations.freed == counted.stats().allocations.allocated);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
  }

  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "upstream resource: its refusal runs the ladder, then is out_of_memory")
  {
    async_mr device{sim, 0};
    counted_mr counted{device};
    limited_mr limited{counted, 8 * mib};
    allocator a{sim, 0, limited};
    void* p = a.allocate_async(5 * mib, s);
    void* q = a.allocate_async(mib / 2, s);  // a small segment (2 MiB): 7 MiB in all
    a.deallocate_async(q, mib / 2, s);
    // 4 MiB more does not fit under 8 MiB; the ladder gives the free small segment back to the
    // upstream, after which it still does not fit: out of memory, naming the request.
    bool refused = false;
    try {
      (void)a.allocate_async(4 * mib, s);
    } catch (gpukit::out_of_memory const& e) {
      refused = true;
      CHECK(e.report().requested == 4 * mib);
    }
    CHECK(refused);
    CHECK(counted.stats().bytes.current == static_cast<std::int64_t>(5 * mib));
    // The allocator is as it was: what fits is served.
    a.deallocate_async(p, 5 * mib, s);
    void* r = a.allocate_async(7 * mib, s);  // the ladder returns the 5 MiB segment first
    CHECK(r != nullptr);
    a.deallocate_async(r, 7 * mib, s);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
  }

  TEST_CASE_FIXTURE(sim_stream_fixture, "upstream resource: settings that cannot go with it")
  {
    async_mr device{sim, 0};
    gpukit::caching_allocator_options o;
    o.source = gpukit::segment_source::growable;
    CHECK_THROWS_WITH_AS(allocator(sim, 0, device, o),
                         doctest::Contains("options.source must be automatic, not growable"),
                         gpukit::logic_error);
    gpukit::caching_allocator_options g;
    g.debug.guard_pages = true;
    CHECK_THROWS_WITH_AS(allocator(sim, 0, device, g),
                         doctest::Contains("guard pages need growable segments"),
                         gpukit::logic_error);
    // The options alone still choose the runtime's segments.
    allocator plain{sim, 0, gpukit::caching_allocator_options{}};
    CHECK(plain.segment_source_in_use() != gpukit::segment_source::upstream);
  }
}
