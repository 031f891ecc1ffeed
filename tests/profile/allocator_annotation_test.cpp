// The caching allocator describes its segments and blocks to NVTX's memory API (what lets
// compute-sanitizer see an overflow inside a segment), checked through the test NVTX tool.
#include "nvtx_test_support.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>

namespace {
bool const tool_attached = gpukit_test::attach_nvtx_tool();
std::uintptr_t addr(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }
}  // namespace

TEST_SUITE("profile")
{
  TEST_CASE(
    "caching allocator segments are NVTX heaps and its blocks are regions of the requested size")
  {
    REQUIRE(tool_attached);
    gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
    gpukit::sim_runtime::stream_type s{};
    GPUKIT_CUDA_TRY(sim.stream_create(s));
    {
      gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim, 0};
      gpukit_test::clear_nvtx_records();
      void* a = alloc.allocate_async(1000, s);  // a 2 MiB small segment, a 1024-byte block
      void* b = alloc.allocate_async(1000, s);  // the next block of the same segment
      alloc.deallocate_async(a, 1000, s);
      void* c = alloc.allocate_async(1000, s);  // a again, from the thread cache
      CHECK(c == a);
      auto const heaps = gpukit_test::nvtx_records_of(gpukit_nvtx_heap_register);
      REQUIRE(heaps.size() == 1);
      CHECK(heaps[0].size == (std::size_t{2} << 20));
      auto const regions = gpukit_test::nvtx_records_of(gpukit_nvtx_region_register);
      REQUIRE(regions.size() == 3);
      CHECK(regions[0].address == addr(a));
      CHECK(regions[0].size == 1000);  // the bytes asked for: an overflow into the padding shows
      CHECK(regions[0].heap == heaps[0].heap);
      CHECK(regions[1].address == addr(b));
      CHECK(regions[2].address == addr(a));
      auto const freed = gpukit_test::nvtx_records_of(gpukit_nvtx_region_unregister);
      REQUIRE(freed.size() == 1);
      CHECK(freed[0].address == addr(a));
      alloc.deallocate_async(b, 1000, s);
      alloc.deallocate_async(c, 1000, s);
      alloc.forget_stream(s);
      CHECK(alloc.release() == (std::size_t{2} << 20));
      CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_heap_unregister).size() == 1);
      // Off: nothing reaches the tool.
      gpukit::caching_allocator_options o;
      o.nvtx_annotate = false;
      gpukit::basic_caching_allocator<gpukit::sim_runtime> quiet{sim, 0, o};
      gpukit_test::clear_nvtx_records();
      quiet.deallocate_async(quiet.allocate_async(1000, s), 1000, s);
      CHECK(gpukit_test::nvtx_records().empty());
      quiet.forget_stream(s);
    }
    GPUKIT_CUDA_TRY(sim.stream_destroy(s));
  }
}
