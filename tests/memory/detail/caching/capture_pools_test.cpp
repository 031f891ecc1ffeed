// SPDX-License-Identifier: Apache-2.0
// detail::caching::capture_pools alone over the simulated GPU: pools begun, ended, resumed and
// released; windows; and which pool a stream allocates from, including a side stream joined to a
// capture (asked of the runtime with stream_capture_id only, which is legal during capture).
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/error.hpp>
#include <gpukit/memory/detail/caching/capture_pools.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

using gpukit::sim_runtime;
using block = gpukit::detail::caching_block<sim_runtime>;
using pools = gpukit::detail::caching::capture_pools<sim_runtime, block>;
using gpukit::test::stream_holder;

TEST_SUITE("capture_pools")
{
  TEST_CASE("a pool per capture: begun, ended, resumed, released")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    pools cp;
    auto const first = cp.begin(a);
    CHECK(first == 1);
    CHECK(cp.active_on(a) != nullptr);
    CHECK(cp.active_on(a)->id == first);
    CHECK(cp.active_on(b) == nullptr);
    CHECK_THROWS_AS(cp.begin(a), gpukit::logic_error);        // one capture per stream
    CHECK_THROWS_AS(cp.release(first), gpukit::logic_error);  // not ended
    cp.end(a);
    CHECK(cp.active_on(a) == nullptr);
    CHECK_THROWS_AS(cp.end(a), gpukit::logic_error);
    // Graphs that share a pool: the ended pool serves a capture on another stream.
    cp.resume(b, first);
    CHECK(cp.active_on(b) == &cp.at(first));
    CHECK_THROWS_AS(cp.resume(a, first), gpukit::logic_error);  // in use
    CHECK_THROWS_AS(cp.resume(a, 99), gpukit::logic_error);     // unknown
    cp.end(b);
    auto const second = cp.begin(a);
    CHECK(second == 2);
    cp.end(a);
    CHECK(cp.pools().size() == 2);
    CHECK(cp.release(first).empty());
    CHECK(cp.pools().size() == 1);
    CHECK_THROWS_AS(cp.release(first), gpukit::logic_error);  // gone
    CHECK_THROWS_AS((void)cp.at(first), gpukit::logic_error);
  }

  TEST_CASE("release hands back the pool's free blocks, out of its indices")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim};
    pools cp;
    auto const id = cp.begin(a);
    block small_block, large_block;
    small_block.size = 512;
    small_block.kind = 0;
    large_block.size = 4 << 20;
    large_block.kind = 1;
    cp.at(id).index[0].insert(&small_block);
    cp.at(id).index[1].insert(&large_block);
    cp.end(a);
    auto const blocks = cp.release(id);
    CHECK(blocks.size() == 2);
    CHECK(small_block.free_next == nullptr);
    CHECK(large_block.free_prev == nullptr);
  }

  TEST_CASE("windows nest, and closing one that is not open throws")
  {
    pools cp;
    cp.open_window();
    cp.open_window();
    CHECK(cp.windows() == 2);
    cp.close_window(0);
    cp.close_window(0);
    CHECK_THROWS_AS(cp.close_window(0), gpukit::logic_error);
    CHECK(cp.windows() == 0);
  }

  TEST_CASE("a side stream joined to a capture allocates from that capture's pool")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, side{sim}, other{sim};
    pools cp;
    GPUKIT_CUDA_TRY(sim.begin_capture(a));
    auto const id = cp.begin(a);
    sim_runtime::event_type e{};
    GPUKIT_CUDA_TRY(sim.event_create(e));
    GPUKIT_CUDA_TRY(sim.event_record(e, a));
    GPUKIT_CUDA_TRY(sim.stream_wait_event(side, e));  // side joins a's capture
    CHECK(cp.find_for(sim, a, true, false) == &cp.at(id));
    CHECK(cp.find_for(sim, side, true, false) == &cp.at(id));
    CHECK(cp.find_for(sim, other, true, false) == nullptr);
    CHECK(cp.find_for(sim, sim_runtime::stream_type{}, true, false) == nullptr);
    CHECK(cp.find_for(sim, side, false, false) == nullptr);  // nothing under way: not asked
    cp.end(a);
    GPUKIT_CUDA_TRY(sim.end_capture(a));
    GPUKIT_CUDA_TRY(sim.event_destroy(e));
    CHECK(cp.find_for(sim, side, true, false) == nullptr);
  }
}
