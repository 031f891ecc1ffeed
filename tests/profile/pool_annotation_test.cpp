// SPDX-License-Identifier: Apache-2.0
// The caching allocator and the pinned pool describe their memory to NVTX's memory API: each
// segment or pinned range is a heap, each block or buffer a region of the size asked for (what lets
// compute-sanitizer see an overflow inside a segment). Checked through the test NVTX tool.
#include "nvtx_test_support.hpp"

#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {
bool const tool_attached = gpukit_test::attach_nvtx_tool();

/// What the tool recorded but ranges: gpukit's own ranges around growth and release reach the tool
/// whatever nvtx_annotate says (slow_path_ranges_test).
std::vector<gpukit_nvtx_record> annotations()
{
  std::vector<gpukit_nvtx_record> out;
  for (auto const& r : gpukit_test::nvtx_records()) {
    if (r.kind != gpukit_nvtx_push && r.kind != gpukit_nvtx_pop) { out.push_back(r); }
  }
  return out;
}
}  // namespace

using namespace gpukit::test;
using namespace gpukit_test;

TEST_SUITE("profile")
{
  TEST_CASE_FIXTURE(
    sim_stream_fixture,
    "caching allocator segments are NVTX heaps and its blocks are regions of the requested size")
  {
    REQUIRE(tool_attached);
    {
      // compute-sanitizer takes NVTX heaps only over cudaMalloc memory: synchronous segments are
      // described; stream-ordered and growable ones only in debug mode (debug_mode_test).
      gpukit::caching_allocator_options sync;
      sync.source = gpukit::segment_source::synchronous;
      gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim, 0, sync};
      clear_nvtx_records();
      void* a = alloc.allocate_async(1000, s);  // a 2 MiB small segment, a 1024-byte block
      void* b = alloc.allocate_async(1000, s);  // the next block of the same segment
      alloc.deallocate_async(a, 1000, s);
      void* c = alloc.allocate_async(1000, s);  // a again, from the thread cache
      CHECK(c == a);
      auto const heaps = nvtx_records_of(gpukit_nvtx_heap_register);
      REQUIRE(heaps.size() == 1);
      CHECK(heaps[0].size == (2 * mib));
      auto const regions = nvtx_records_of(gpukit_nvtx_region_register);
      REQUIRE(regions.size() == 3);
      check_region(regions[0], a, 1000, heaps[0].heap);  // the size asked for: overruns show
      CHECK(regions[1].address == addr(b));
      CHECK(regions[2].address == addr(a));
      auto const freed = nvtx_records_of(gpukit_nvtx_region_unregister);
      REQUIRE(freed.size() == 1);
      CHECK(freed[0].address == addr(a));
      alloc.deallocate_async(b, 1000, s);
      alloc.deallocate_async(c, 1000, s);
      alloc.forget_stream(s);
      CHECK(alloc.release() == (2 * mib));
      CHECK(nvtx_records_of(gpukit_nvtx_heap_unregister).size() == 1);
      // Off: no annotation reaches the tool.
      gpukit::caching_allocator_options o;
      o.nvtx_annotate = false;
      gpukit::basic_caching_allocator<gpukit::sim_runtime> quiet{sim, 0, o};
      clear_nvtx_records();
      quiet.deallocate_async(quiet.allocate_async(1000, s), 1000, s);
      CHECK(annotations().empty());
      quiet.forget_stream(s);
    }
  }

  TEST_CASE_FIXTURE(
    sim_stream_fixture,
    "pinned pool ranges are NVTX heaps and its buffers are regions of the requested size")
  {
    REQUIRE(tool_attached);
    {
      gpukit::basic_pinned_pool<gpukit::sim_runtime> pool{sim};
      CHECK(pool.options().nvtx_annotate);  // on by default: NVTX_INJECTION64_PATH is set
      clear_nvtx_records();
      pool.reserve(4 * mib);
      void* a = pool.allocate(1000);  // carved from the reserved range
      void* b = pool.allocate(3000);
      void* c = pool.allocate(8 * mib);  // a range of its own
      pool.deallocate_async(a, s);
      pool.deallocate(c);
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
      void* a2 = pool.allocate(1000);  // a again, once the stream's work is done
      CHECK(a2 == a);

      auto const heaps = nvtx_records_of(gpukit_nvtx_heap_register);
      REQUIRE(heaps.size() == 2);
      CHECK(std::string{heaps[0].domain} == "gpukit");
      CHECK(std::string{heaps[0].message} == "gpukit pinned pool");
      CHECK(heaps[0].usage == NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR);
      CHECK(heaps[0].size == 4 * mib);
      CHECK(heaps[0].address == addr(a));  // the first buffer starts the range
      CHECK(heaps[1].size == 8 * mib);
      CHECK(heaps[1].address == addr(c));
      CHECK(heaps[0].heap != heaps[1].heap);

      auto const regions = nvtx_records_of(gpukit_nvtx_region_register);
      REQUIRE(regions.size() == 4);
      check_region(regions[0], a, 1000, heaps[0].heap);  // the size asked for: overruns show
      check_region(regions[1], b, 3000, heaps[0].heap);
      check_region(regions[2], c, 8 * mib, heaps[1].heap);
      CHECK(regions[3].address == addr(a));
      CHECK(regions[3].heap == heaps[0].heap);

      // Returned buffers stop being accessible at once, also while a stream still uses them.
      auto const freed = nvtx_records_of(gpukit_nvtx_region_unregister);
      REQUIRE(freed.size() == 2);
      CHECK(freed[0].address == addr(a));
      CHECK(freed[1].address == addr(c));

      pool.deallocate(a2);
      pool.deallocate(b);
      CHECK(pool.release_cached() == 12 * mib);
      auto const gone = nvtx_records_of(gpukit_nvtx_heap_unregister);
      REQUIRE(gone.size() == 2);
      std::vector<std::uint64_t> handles{gone[0].heap, gone[1].heap};
      CHECK(((handles[0] == heaps[0].heap && handles[1] == heaps[1].heap) ||
             (handles[0] == heaps[1].heap && handles[1] == heaps[0].heap)));
    }
    {
      // User memory added to the pool is a heap too; the destructor unregisters it.
      std::vector<unsigned char> mine(2 * mib);
      clear_nvtx_records();
      {
        gpukit::basic_pinned_pool<gpukit::sim_runtime> pool{sim};
        pool.add_host_memory(mine.data(), mine.size());
        pool.deallocate(pool.allocate(4096));
      }
      auto const heaps = nvtx_records_of(gpukit_nvtx_heap_register);
      REQUIRE(heaps.size() == 1);
      CHECK(heaps[0].address == addr(mine.data()));
      CHECK(heaps[0].size == mine.size());
      CHECK(nvtx_records_of(gpukit_nvtx_region_register).size() == 1);
      CHECK(nvtx_records_of(gpukit_nvtx_region_unregister).size() == 1);
      REQUIRE(nvtx_records_of(gpukit_nvtx_heap_unregister).size() == 1);
      CHECK(nvtx_records_of(gpukit_nvtx_heap_unregister)[0].heap == heaps[0].heap);
    }
    {
      // Off: no annotation reaches the tool.
      gpukit::pinned_pool_options o;
      o.nvtx_annotate = false;
      gpukit::basic_pinned_pool<gpukit::sim_runtime> quiet{sim, o};
      clear_nvtx_records();
      quiet.deallocate_async(quiet.allocate(1000), s);
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
      CHECK(quiet.release_cached() > 0);
      CHECK(annotations().empty());
    }
  }
}
