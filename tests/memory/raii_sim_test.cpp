// SPDX-License-Identifier: Apache-2.0
// The RAII conformance suite on the simulated GPU (host-only: runs in CI without a GPU), plus what
// only the simulator can show: no misuse reaches the runtime, and the failure the owning stream
// prevents.
#include "memory/raii_conformance.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <type_traits>

namespace {

/// A fresh simulated GPU per case: one device of 8 GiB.
gpukit::sim_runtime make_sim()
{
  return gpukit::sim_runtime{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
}

using sim_alloc = gpukit::basic_caching_allocator<gpukit::sim_runtime>;
using gpukit::test::kib;

}  // namespace

TEST_SUITE("raii")
{
  GPUKIT_RAII_CONFORMANCE_CASES(make_sim(), "sim_runtime")

  TEST_CASE("sim_runtime: the RAII types make no call the runtime calls misuse")
  {
    auto sim = make_sim();
    {
      sim_alloc alloc{sim, 0};
      gpukit::basic_stream_pool<gpukit::sim_runtime> pool{2, sim};
      gpukit::basic_cuda_stream<gpukit::sim_runtime> s{sim};
      gpukit::basic_device_buffer<sim_alloc> b{100 * kib, s, alloc};
      b.resize(300 * kib, pool.get_stream());
      b.shrink_to_fit(s);
      gpukit::device_uvector<int, sim_alloc> v{10, pool.get_stream(), alloc};
      v.set_element_to_zero_async(3, pool.get_stream(0));
      CHECK(v.element(3, pool.get_stream(0)) == 0);
      gpukit::device_scalar<double, sim_alloc> x{1.5, s, alloc};
      CHECK(x.value(s) == 1.5);
    }  // everything freed, streams forgotten and destroyed
    CHECK(sim.misuse_count() == 0);
    CHECK(sim.last_misuse().empty());
  }

  TEST_CASE("sim_runtime: a raw stream destroyed without forget_stream reaches the allocator")
  {
    // The failure check_owning_stream guards against: a raw stream destroyed without
    // forget_stream leaves its blocks in its pool, and a later allocation on another stream records
    // an event on the dead stream to move them.
    auto sim = make_sim();
    sim_alloc alloc{sim, 0};
    gpukit::sim_runtime::stream_type dead{};
    gpukit::sim_runtime::stream_type live{};
    REQUIRE(sim.stream_create(dead) == cudaSuccess);
    REQUIRE(sim.stream_create(live) == cudaSuccess);
    void* p = alloc.allocate_async(256 * kib, dead);
    alloc.deallocate_async(p, 256 * kib, dead);
    REQUIRE(sim.stream_destroy(dead) == cudaSuccess);
    auto const events = alloc.stats().num_cross_stream_events;
    auto const misuse = sim.misuse_count();
    void* q           = nullptr;
    try {
      q = alloc.allocate_async(256 * kib, live);
    } catch (gpukit::cuda_error const&) {}
    bool const reached =
      alloc.stats().num_cross_stream_events != events || sim.misuse_count() != misuse || q != p;
    CHECK(reached);
    if (q != nullptr) { alloc.deallocate_async(q, 256 * kib, live); }
    alloc.forget_stream(live);
    REQUIRE(sim.stream_destroy(live) == cudaSuccess);
  }

  TEST_CASE("sim_runtime: destructors report errors instead of throwing")
  {
    auto sim = make_sim();
    sim_alloc alloc{sim, 0};
    {
      // A buffer whose memory was freed behind its back: its destructor's free is refused (a
      // double free), reported on stderr, and the allocator stays consistent.
      gpukit::basic_device_buffer<sim_alloc> b{4 * kib, {}, alloc};
      alloc.deallocate_async(b.data(), b.capacity(), {});
    }
    CHECK(alloc.stats().allocated_bytes.current == 0);
    CHECK(gpukit::detail::check_invariants(alloc).empty());
    {
      // A stream destroyed behind the owning stream's back: forgetting it and destroying it fail,
      // and are reported.
      gpukit::basic_cuda_stream<gpukit::sim_runtime> s{sim};
      {
        gpukit::basic_device_buffer<sim_alloc> b{4 * kib, s, alloc};
      }
      REQUIRE(sim.stream_destroy(s.value()) == cudaSuccess);
    }
    CHECK(sim.misuse_count() > 0);  // the runtime saw the dead handle
    CHECK(gpukit::detail::check_invariants(alloc).empty());
  }

  TEST_CASE("sim_runtime: the device_buffer quick start")
  {
    gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
    gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim, 0};
    {
      gpukit::basic_device_buffer<decltype(alloc)> on_sim{4096, {}, alloc};
      CHECK(on_sim.size() == 4096);
      CHECK(on_sim.stream().is_default());
      CHECK_FALSE(on_sim.stream().is_owned());
    }
    CHECK(alloc.stats().allocated_bytes.current == 0);
  }

  TEST_CASE("sim_runtime: the public aliases name the CUDA runtime's types")
  {
    CHECK(std::is_same_v<gpukit::device_buffer,
                         gpukit::basic_device_buffer<gpukit::caching_allocator>>);
    CHECK(std::is_same_v<gpukit::device_uvector<float>::allocator_type, gpukit::caching_allocator>);
    CHECK(std::is_same_v<gpukit::device_scalar<int>::allocator_type, gpukit::caching_allocator>);
    CHECK(std::is_same_v<gpukit::cuda_stream, gpukit::basic_cuda_stream<gpukit::cuda_runtime>>);
    CHECK(std::is_same_v<gpukit::stream_pool, gpukit::basic_stream_pool<gpukit::cuda_runtime>>);
    CHECK(std::is_trivially_copyable_v<gpukit::cuda_stream_view>);
    CHECK_FALSE(std::is_copy_constructible_v<gpukit::device_buffer>);
    CHECK(std::is_nothrow_move_constructible_v<gpukit::device_buffer>);
    CHECK(std::is_nothrow_move_assignable_v<gpukit::device_uvector<float>>);
    CHECK(std::is_nothrow_move_constructible_v<gpukit::cuda_stream>);
  }
}
