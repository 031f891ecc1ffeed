// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// The CCCL memory-resource interface of gpukit's resources, called the way CCCL calls it:
// CCCL 3.0's names (allocate/deallocate with an alignment, allocate_async) and CCCL 3.1's
// (allocate_sync, allocate(stream, bytes, align)) reach the same allocations, on the simulated GPU.
// The concepts themselves are checked at compile time in the header tests, against every CCCL
// release.
#include <gpukit/detail/cccl_compat.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

namespace {

using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;
using sim_pool      = gpukit::basic_pinned_pool<sim_runtime>;

// What cuda::stream_ref is to cuda_runtime: a value whose get() is the runtime's stream.
struct sim_stream_ref {
  sim_runtime::stream_type stream;
  [[nodiscard]] sim_runtime::stream_type get() const noexcept { return stream; }
};

gpukit::sim_config one_device()
{
  return gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30);
}

}  // namespace

TEST_SUITE("cccl")
{
  TEST_CASE("cccl: the caching allocator's 3.1 names allocate and free on the stream given")
  {
    sim_runtime sim{one_device()};
    sim_allocator alloc{sim, 0};
    sim_runtime::stream_type s{};
    GPUKIT_CUDA_TRY(sim.stream_create(s));
    {
      void* p = alloc.allocate(sim_stream_ref{s}, 1000, 256);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
      CHECK(alloc.stats().allocation_count.current == 1);
      CHECK(alloc.stats().requested_bytes.current == 1000);
      alloc.deallocate(sim_stream_ref{s}, p, 1000, 256);
      CHECK(alloc.stats().allocation_count.current == 0);
      // Freed in the order of `s`: the next request of the size on `s` reuses the block.
      void* q = alloc.allocate_async(1000, s);
      CHECK(q == p);
      alloc.deallocate_async(q, 1000, s);
    }
    {
      void* p = alloc.allocate_sync(4096, 64);
      REQUIRE(p != nullptr);
      CHECK(alloc.stats().allocation_count.current == 1);
      alloc.deallocate_sync(p, 4096, 64);
      CHECK(alloc.stats().allocation_count.current == 0);
    }
    // The size is checked on the way back, as for deallocate_async; the alignment on both ways.
    void* p = alloc.allocate(sim_stream_ref{s}, 512, 8);
    CHECK_THROWS_AS(alloc.deallocate(sim_stream_ref{s}, p, 4096, 8), gpukit::logic_error);
    CHECK_THROWS_AS((void)alloc.allocate(sim_stream_ref{s}, 512, 512), gpukit::logic_error);
    CHECK_THROWS_AS((void)alloc.allocate_sync(512, 3), gpukit::logic_error);
    alloc.deallocate(sim_stream_ref{s}, p, 512, 8);
    CHECK(alloc.stats().allocation_count.current == 0);
    GPUKIT_CUDA_TRY(sim.stream_destroy(s));
  }

  TEST_CASE("cccl: the pinned pool's 3.1 names allocate and return a buffer")
  {
    sim_runtime sim{one_device()};
    sim_pool pool{sim};
    void* p = pool.allocate_sync(10000, 4096);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
    CHECK(pool.owns(p, 10000));
    CHECK(pool.stats().allocation_count.current == 1);
    pool.deallocate_sync(p, 10000, 4096);
    CHECK(pool.stats().allocation_count.current == 0);
    CHECK_THROWS_AS((void)pool.allocate_sync(64, 8192), gpukit::logic_error);
  }

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
  TEST_CASE("cccl: the CUDA resources satisfy this CCCL's concepts")
  {
    CHECK(gpukit::detail::is_device_async_resource_v<gpukit::caching_allocator>);
    CHECK(gpukit::detail::is_host_device_sync_resource_v<gpukit::pinned_pool>);
    // A type without the interface does not: the traits can fail.
    CHECK_FALSE(gpukit::detail::is_device_async_resource_v<int>);
    CHECK_FALSE(gpukit::detail::is_host_device_sync_resource_v<sim_stream_ref>);
  }
#endif
}
