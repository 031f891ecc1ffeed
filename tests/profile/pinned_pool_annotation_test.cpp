// The pinned pool describes its pinned ranges and buffers to NVTX's memory API (as the caching
// allocator does for device segments), checked through the test NVTX tool.
#include "nvtx_test_support.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {
bool const tool_attached = gpukit_test::attach_nvtx_tool();
std::uintptr_t addr(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }
constexpr std::size_t mib = std::size_t{1} << 20;
}  // namespace

TEST_SUITE("profile")
{
  TEST_CASE("pinned pool ranges are NVTX heaps and its buffers are regions of the requested size")
  {
    REQUIRE(tool_attached);
    gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
    gpukit::sim_runtime::stream_type s{};
    GPUKIT_CUDA_TRY(sim.stream_create(s));
    {
      gpukit::basic_pinned_pool<gpukit::sim_runtime> pool{sim};
      CHECK(pool.options().nvtx_annotate);  // on by default: NVTX_INJECTION64_PATH is set
      gpukit_test::clear_nvtx_records();
      pool.reserve(4 * mib);
      void* a = pool.allocate(1000);  // carved from the reserved range
      void* b = pool.allocate(3000);
      void* c = pool.allocate(8 * mib);  // a range of its own
      pool.deallocate_async(a, s);
      pool.deallocate(c);
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
      void* a2 = pool.allocate(1000);  // a again, once the stream's work is done
      CHECK(a2 == a);

      auto const heaps = gpukit_test::nvtx_records_of(gpukit_nvtx_heap_register);
      REQUIRE(heaps.size() == 2);
      CHECK(std::string{heaps[0].domain} == "gpukit");
      CHECK(std::string{heaps[0].message} == "gpukit pinned pool");
      CHECK(heaps[0].usage == NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR);
      CHECK(heaps[0].size == 4 * mib);
      CHECK(heaps[0].address == addr(a));  // the first buffer starts the range
      CHECK(heaps[1].size == 8 * mib);
      CHECK(heaps[1].address == addr(c));
      CHECK(heaps[0].heap != heaps[1].heap);

      auto const regions = gpukit_test::nvtx_records_of(gpukit_nvtx_region_register);
      REQUIRE(regions.size() == 4);
      CHECK(regions[0].address == addr(a));
      CHECK(regions[0].size == 1000);  // the bytes asked for: an overrun into the class shows
      CHECK(regions[0].heap == heaps[0].heap);
      CHECK(regions[1].address == addr(b));
      CHECK(regions[1].size == 3000);
      CHECK(regions[1].heap == heaps[0].heap);
      CHECK(regions[2].address == addr(c));
      CHECK(regions[2].size == 8 * mib);
      CHECK(regions[2].heap == heaps[1].heap);
      CHECK(regions[3].address == addr(a));
      CHECK(regions[3].heap == heaps[0].heap);

      // Returned buffers stop being accessible at once, also while a stream still uses them.
      auto const freed = gpukit_test::nvtx_records_of(gpukit_nvtx_region_unregister);
      REQUIRE(freed.size() == 2);
      CHECK(freed[0].address == addr(a));
      CHECK(freed[1].address == addr(c));

      pool.deallocate(a2);
      pool.deallocate(b);
      CHECK(pool.release_cached() == 12 * mib);
      auto const gone = gpukit_test::nvtx_records_of(gpukit_nvtx_heap_unregister);
      REQUIRE(gone.size() == 2);
      std::vector<std::uint64_t> handles{gone[0].heap, gone[1].heap};
      CHECK(((handles[0] == heaps[0].heap && handles[1] == heaps[1].heap) ||
             (handles[0] == heaps[1].heap && handles[1] == heaps[0].heap)));
    }
    {
      // User memory added to the pool is a heap too; the destructor unregisters it.
      std::vector<unsigned char> mine(2 * mib);
      gpukit_test::clear_nvtx_records();
      {
        gpukit::basic_pinned_pool<gpukit::sim_runtime> pool{sim};
        pool.add_host_memory(mine.data(), mine.size());
        pool.deallocate(pool.allocate(4096));
      }
      auto const heaps = gpukit_test::nvtx_records_of(gpukit_nvtx_heap_register);
      REQUIRE(heaps.size() == 1);
      CHECK(heaps[0].address == addr(mine.data()));
      CHECK(heaps[0].size == mine.size());
      CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_region_register).size() == 1);
      CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_region_unregister).size() == 1);
      REQUIRE(gpukit_test::nvtx_records_of(gpukit_nvtx_heap_unregister).size() == 1);
      CHECK(gpukit_test::nvtx_records_of(gpukit_nvtx_heap_unregister)[0].heap == heaps[0].heap);
    }
    {
      // Off: nothing reaches the tool.
      gpukit::pinned_pool_options o;
      o.nvtx_annotate = false;
      gpukit::basic_pinned_pool<gpukit::sim_runtime> quiet{sim, o};
      gpukit_test::clear_nvtx_records();
      quiet.deallocate_async(quiet.allocate(1000), s);
      GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
      CHECK(quiet.release_cached() > 0);
      CHECK(gpukit_test::nvtx_records().empty());
    }
    GPUKIT_CUDA_TRY(sim.stream_destroy(s));
  }
}
