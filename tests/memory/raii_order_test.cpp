// SPDX-License-Identifier: Apache-2.0
// Destruction order of gpukit's RAII types, on the simulated GPU: whatever order a user declares
// (and so destroys) them in, nothing touches freed memory and nothing leaks. Every pair of
// objects is destroyed in both orders (the rest after them, newest first). Run it under
// AddressSanitizer (the asan preset) to see a use after free; without it, the allocator's heap
// corruption usually aborts.
#include "memory/raii_order.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using sim_alloc   = gpukit::basic_caching_allocator<gpukit::sim_runtime>;
using sim_stream  = gpukit::basic_cuda_stream<gpukit::sim_runtime>;
using sim_streams = gpukit::basic_stream_pool<gpukit::sim_runtime>;
using sim_buffer  = gpukit::basic_device_buffer<sim_alloc>;
using sim_uvector = gpukit::device_uvector<int, sim_alloc>;
using sim_scalar  = gpukit::device_scalar<double, sim_alloc>;
using sim_pinned  = gpukit::basic_pinned_pool<gpukit::sim_runtime>;
using sim_pbuffer = gpukit::pinned_buffer<gpukit::sim_runtime>;
using sim_pipe    = gpukit::basic_transfer_pipeline<gpukit::sim_runtime>;
using sim_loader  = gpukit::basic_prefetcher<gpukit::sim_runtime>;

using gpukit::test::raii_order::kib;
namespace ro = gpukit::test::raii_order;

gpukit::sim_runtime make_sim()
{
  return gpukit::sim_runtime{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
}

/// On a fresh simulated GPU: the kit destroyed in `order`, then the checks only the simulator can
/// make: every byte of device memory back, and no call on a dead handle.
void destroy_in_order(std::vector<int> const& order)
{
  std::string const what = ro::describe(order);
  CAPTURE(what);
  auto sim = make_sim();
  ro::build_and_destroy(sim, order, [&] { REQUIRE(sim.used_bytes(0) > 0); });
  CHECK(sim.used_bytes(0) == 0);  // the allocator's destructor or the buffers gave it all back
  CHECK(sim.misuse_count() == 0);
  CHECK_MESSAGE(sim.last_misuse().empty(), sim.last_misuse());
}

}  // namespace

TEST_SUITE("raii")
{
  TEST_CASE("destruction order: every pair of objects in both orders, and all in either order")
  {
    ro::every_order([](std::vector<int> const& o) { destroy_in_order(o); });
  }

  TEST_CASE("destruction order: what outlives its allocator or pool refuses to use it")
  {
    auto sim = make_sim();
    std::optional<sim_alloc> alloc{std::in_place, sim, 0};
    sim_stream s{sim};
    sim_buffer b{100 * kib, s, *alloc};
    sim_uvector v{10, s, *alloc};
    sim_buffer empty{0, s, *alloc};
    std::optional<sim_pinned> pinned{std::in_place, sim};
    sim_pbuffer pb = pinned->acquire(4 * kib);
    std::optional<sim_pipe> pipe{std::in_place, sim, *pinned};
    std::vector<unsigned char> batch(8 * kib, 3);
    sim_loader loader{
      *pipe, *alloc, [&](std::size_t i) {
        return i < 3 ? gpukit::host_batch{batch.data(), batch.size()} : gpukit::host_batch{};
      }};
    auto const held = loader.next();
    REQUIRE(held.has_value());

    alloc.reset();  // stops the loader, frees every batch
    CHECK_THROWS_AS(loader.release(*held, s.value()), gpukit::logic_error);
    CHECK_FALSE(loader.next().has_value());  // what was loading went with the allocator
    CHECK_THROWS_AS(b.resize(200 * kib, s), gpukit::logic_error);
    CHECK_THROWS_AS(b.set_stream(s), gpukit::logic_error);
    CHECK_THROWS_AS(v.resize(100, s), gpukit::logic_error);
    CHECK_THROWS_AS(empty.reserve(kib, s), gpukit::logic_error);
    sim_buffer moved{std::move(b)};  // moving needs no allocator
    b = std::move(moved);            // nor does assigning over an empty buffer

    pinned.reset();
    CHECK_THROWS_AS(pb.record_stream(s.value()), gpukit::logic_error);
    std::vector<unsigned char> host(64 * kib, 1);
    CHECK_THROWS_AS(pipe->copy_to_device_async(host.data(), host.data(), host.size(),
                                               gpukit::host_memory::pageable, s.value()),
                    gpukit::logic_error);
    CHECK_THROWS_AS(pipe->prewarm(), gpukit::logic_error);
    pb.reset();  // returns nothing: the pool is gone
    CHECK_FALSE(pb);
    pipe.reset();
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("destruction order: a buffer frees on the default stream once its stream is gone")
  {
    auto sim = make_sim();
    sim_alloc alloc{sim, 0};
    std::optional<sim_stream> s{std::in_place, sim};
    auto const view = s->view();
    CHECK_FALSE(view.is_destroyed());
    CHECK_FALSE(gpukit::basic_cuda_stream_view<gpukit::sim_runtime>{}.is_destroyed());
    std::optional<sim_buffer> b{std::in_place, 256 * kib, view, alloc};
    void* const p = b->data();
    s.reset();
    CHECK(view.is_destroyed());
    CHECK(b->stream().is_destroyed());
    b.reset();  // no call with the dead handle
    CHECK(sim.misuse_count() == 0);
    CHECK(alloc.stats().allocated_bytes.current == 0);
    // The block went back on the default stream: reused there without an event.
    auto const events = alloc.stats().num_cross_stream_events;
    sim_buffer again{256 * kib, {}, alloc};
    CHECK(again.data() == p);
    CHECK(alloc.stats().num_cross_stream_events == events);
  }

  TEST_CASE("destruction order: a new allocator at a dead one's address is made to forget too")
  {
    // The owning stream's fast path remembers the allocator noted last: by its lifetime token, not
    // its address, which the next allocator may reuse.
    auto sim = make_sim();
    gpukit::sim_runtime::stream_type other{};
    REQUIRE(sim.stream_create(other) == cudaSuccess);
    std::optional<sim_alloc> alloc{std::in_place, sim, 0};
    void* p = nullptr;
    {
      sim_stream s{sim};
      {
        sim_buffer b{256 * kib, s, *alloc};
      }
      void const* const first_address = &*alloc;
      alloc.reset();
      alloc.emplace(sim, 0);
      REQUIRE(static_cast<void const*>(&*alloc) == first_address);
      sim_buffer b{256 * kib, s, *alloc};
      p = b.data();
    }  // b freed on s; s makes the new allocator forget it
    auto const events = alloc->stats().num_cross_stream_events;
    {
      sim_buffer reuse{256 * kib, other, *alloc};
      CHECK(reuse.data() == p);  // the block moved to every stream's pool when s was forgotten
    }
    CHECK(alloc->stats().num_cross_stream_events == events);  // no event on the dead stream
    alloc->forget_stream(other);
    alloc.reset();
    REQUIRE(sim.stream_destroy(other) == cudaSuccess);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("destruction order: an allocator and a stream destroyed by two threads at once")
  {
    // The stream forgets itself in the allocator under the allocator's lifetime lock, which the
    // allocator's destructor takes first: either the stream finds it gone, or the destructor waits.
    auto sim = make_sim();
    for (int round = 0; round < 50; ++round) {
      std::optional<sim_alloc> alloc{std::in_place, sim, 0};
      std::optional<sim_stream> s{std::in_place, sim};
      {
        sim_buffer b{64 * kib, *s, *alloc};
      }
      std::thread t{[&] { s.reset(); }};
      alloc.reset();
      t.join();
    }
    CHECK(sim.misuse_count() == 0);
  }
}
