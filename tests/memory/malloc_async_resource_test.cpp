// SPDX-License-Identifier: Apache-2.0
// malloc_async_resource on the simulated GPU: round trips through every entry point, its
// equality, its refusals, and out of memory as gpukit::out_of_memory.
#include "memory/allocator_conformance.hpp"  // fill, holds
#include "support/sim_gpu.hpp"

#include <gpukit/memory/malloc_async_resource.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>

using namespace gpukit::test;  // sim_stream_fixture, one_device, mib, gib
using gpukit::sim_runtime;
using sim_resource = gpukit::basic_malloc_async_resource<sim_runtime>;

namespace {

struct sim_stream_ref {
  sim_runtime::stream_type stream;
  [[nodiscard]] sim_runtime::stream_type get() const noexcept { return stream; }
};

}  // namespace

TEST_SUITE("malloc_async_resource")
{
  TEST_CASE_FIXTURE(sim_stream_fixture,
                    "malloc_async_resource: blocks usable in stream order, through every name")
  {
    sim_resource mr{sim, 0};
    void* p = mr.allocate_async(mib, s);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % sim_resource::alignment == 0);
    fill(sim, p, mib, 0x3c, s);
    CHECK(holds(sim, p, mib, 0x3c, s));
    mr.deallocate_async(p, mib, s);
    void* a = mr.allocate(sim_stream_ref{s}, 1000, 256);
    void* b = mr.allocate_async(1000, 64, sim_stream_ref{s});
    void* c = mr.allocate_sync(1000, 8);
    void* d = mr.allocate(1000, 128);
    for (void* q : {a, b, c, d}) { CHECK(q != nullptr); }
    mr.deallocate(sim_stream_ref{s}, a, 1000, 256);
    mr.deallocate_async(b, 1000, 64, sim_stream_ref{s});
    mr.deallocate_sync(c, 1000, 8);
    mr.deallocate(d, 1000, 128);
    CHECK(mr.allocate_async(0, s) == nullptr);
    mr.deallocate_async(nullptr, 0, s);
    GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
    GPUKIT_CUDA_TRY(sim.stream_synchronize({}));  // c and d were freed on the default stream
    std::size_t free = 0, total = 0;
    GPUKIT_CUDA_TRY(sim.mem_get_info(free, total));
    CHECK(free == total);  // everything went back
  }

  TEST_CASE("malloc_async_resource: equal for the same runtime and device; copyable")
  {
    sim_runtime sim{devices(2)};
    sim_runtime other{one_device()};
    sim_resource const a{sim, 0};
    sim_resource b = a;
    CHECK(a == b);
    CHECK_FALSE(a != b);
    CHECK(a != sim_resource{sim, 1});
    CHECK(a != sim_resource{other, 0});
    CHECK(&b.runtime() == &sim);
    CHECK(b.device() == 0);
  }

  TEST_CASE("malloc_async_resource: a full device is out_of_memory; a bad alignment is refused")
  {
    sim_runtime sim{one_device(64 * mib)};
    sim_resource mr{sim, 0};
    void* held = mr.allocate(48 * mib);
    try {
      (void)mr.allocate(32 * mib);
      FAIL("the device was not full");
    } catch (gpukit::out_of_memory const& e) {
      CHECK(e.report().requested == 32 * mib);
      CHECK(e.report().device == 0);
      CHECK(e.report().device_total == 64 * mib);
    }
    CHECK_THROWS_AS((void)mr.allocate(64, 512), gpukit::logic_error);
    CHECK_THROWS_AS((void)mr.allocate_sync(64, 3), gpukit::logic_error);
    sim.inject_fault(gpukit::sim_op::free_async, 1, cudaErrorInvalidValue);
    CHECK_THROWS_AS(mr.deallocate(held, 48 * mib), gpukit::cuda_error);
    mr.deallocate(held, 48 * mib);
  }
}
