// SPDX-License-Identifier: Apache-2.0
// Destruction order of gpukit's RAII types, on the simulated GPU: whatever order a user declares
// (and so destroys) them in, nothing touches freed memory and nothing leaks. Every pair of
// objects is destroyed in both orders (the rest after them, newest first). Run it under
// AddressSanitizer (the asan preset) to see a use after free; without it, the allocator's heap
// corruption usually aborts.
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/cuda_stream.hpp>
#include <gpukit/memory/device_buffer.hpp>
#include <gpukit/memory/device_scalar.hpp>
#include <gpukit/memory/device_uvector.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstring>
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

constexpr std::size_t kib = 1024;

/// The objects, in the order a user may declare them (each after what it refers to).
enum object : int {
  allocator,
  stream,
  stream_pool,
  buffer,
  uvector,
  scalar,
  pinned_pool,
  pinned_buffer,
  pipeline,
  prefetcher,
  object_count
};

char const* name(int o)
{
  static constexpr std::array<char const*, object_count> names{
    "allocator",     "stream",      "stream_pool",   "device_buffer", "device_uvector",
    "device_scalar", "pinned_pool", "pinned_buffer", "pipeline",      "prefetcher"};
  return names[static_cast<std::size_t>(o)];
}

/// Every object, each using what it refers to the way a program does: the allocator served the
/// owning stream and a stream of the pool (so both must make it forget them), the buffers hold
/// its memory, the pinned buffer a pool's, and the pipeline staged a pageable copy through the
/// pool's chunks (so it holds them, each with an event); the prefetcher loads batches from it,
/// one of them handed out and not released.
struct kit {
  explicit kit(gpukit::sim_runtime& sim) : batches(4, std::vector<unsigned char>(96 * kib, 7))
  {
    alloc.emplace(sim, 0);
    s.emplace(sim);
    pool.emplace(2, sim);
    {
      sim_buffer on_pool{64 * kib, pool->get_stream(1), *alloc};  // freed on a pool stream
    }
    b.emplace(300 * kib, *s, *alloc);
    v.emplace(1000, pool->get_stream(0), *alloc);
    v->set_element_to_zero_async(7, pool->get_stream(0));
    x.emplace(2.5, *s, *alloc);
    pinned.emplace(sim);
    pb.emplace(pinned->acquire(10 * kib));
    std::memset(pb->data(), 0x5a, 10 * kib);
    gpukit::transfer_options o;
    o.chunk_bytes     = 64 * kib;
    o.staging_threads = 2;
    pipe.emplace(sim, *pinned, o);
    std::vector<unsigned char> host(b->size(), 0xa5);
    pipe->copy_to_device_async(b->data(), host.data(), host.size(), gpukit::host_memory::pageable,
                               s->value());
    loader.emplace(*pipe, *alloc, [this](std::size_t i) {
      if (i == batches.size()) { return gpukit::host_batch{}; }
      return gpukit::host_batch{batches[i].data(), batches[i].size()};
    });
    auto const first = loader->next(s->value());
    REQUIRE(first.has_value());  // handed out, never released: the prefetcher frees it
  }

  void destroy(int o)
  {
    switch (o) {
      case allocator: alloc.reset(); break;
      case stream: s.reset(); break;
      case stream_pool: pool.reset(); break;
      case buffer: b.reset(); break;
      case uvector: v.reset(); break;
      case scalar: x.reset(); break;
      case pinned_pool: pinned.reset(); break;
      case pinned_buffer: pb.reset(); break;
      case pipeline: pipe.reset(); break;
      case prefetcher: loader.reset(); break;
      default: FAIL("no object " << o);
    }
  }

  std::vector<std::vector<unsigned char>> batches;  // the prefetcher's source
  std::optional<sim_alloc> alloc;
  std::optional<sim_stream> s;
  std::optional<sim_streams> pool;
  std::optional<sim_buffer> b;
  std::optional<sim_uvector> v;
  std::optional<sim_scalar> x;
  std::optional<sim_pinned> pinned;
  std::optional<sim_pbuffer> pb;
  std::optional<sim_pipe> pipe;
  std::optional<sim_loader> loader;
};

gpukit::sim_runtime make_sim()
{
  return gpukit::sim_runtime{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
}

/// Builds a kit, destroys `order` first (in that order), then the rest newest first, and checks
/// that the simulated GPU got every byte back and saw no call on a dead object.
void destroy_in_order(std::vector<int> const& order)
{
  std::string what;
  for (int o : order) { what += std::string{what.empty() ? "" : ", "} + name(o); }
  CAPTURE(what);
  auto sim = make_sim();
  {
    kit k{sim};
    REQUIRE(sim.used_bytes(0) > 0);
    for (int o : order) { k.destroy(o); }
    for (int o = object_count - 1; o >= 0; --o) { k.destroy(o); }
  }
  REQUIRE(sim.device_synchronize() == cudaSuccess);  // stream-ordered frees have run
  CHECK(sim.used_bytes(0) == 0);  // the allocator's destructor or the buffers gave it all back
  CHECK(sim.misuse_count() == 0);
  CHECK_MESSAGE(sim.last_misuse().empty(), sim.last_misuse());
}

}  // namespace

TEST_SUITE("raii")
{
  TEST_CASE("destruction order: every pair of objects, in both orders")
  {
    // One subcase per ordered pair, so that one pair can be run alone:
    //   raii_order_test -sc="allocator before stream" (no commas: doctest splits filters on them)
    for (int first = 0; first < object_count; ++first) {
      for (int second = 0; second < object_count; ++second) {
        if (first == second) { continue; }
        std::string const pair = std::string{name(first)} + " before " + name(second);
        SUBCASE(pair.c_str()) { destroy_in_order({first, second}); }
      }
    }
  }

  TEST_CASE("destruction order: declaration order and its reverse")
  {
    std::vector<int> forward;
    for (int o = 0; o < object_count; ++o) { forward.push_back(o); }
    SUBCASE("declaration order") { destroy_in_order(forward); }  // each before what it uses
    SUBCASE("reverse declaration order") { destroy_in_order({forward.rbegin(), forward.rend()}); }
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
