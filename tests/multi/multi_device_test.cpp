// SPDX-License-Identifier: Apache-2.0
// Several GPUs on the simulated GPU (sim_config::with_devices): every component acts on the device
// it was built for, whatever device the calling thread has current; pinned memory serves every
// device; peer copies move bytes between devices.
#include "support/caching_allocator.hpp"
#include "support/holders.hpp"
#include "support/pattern.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"
#include "support/transfer_fixture.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/allocator_invariants.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace gpukit::test;
using gpukit::sim_op;
using gpukit::sim_runtime;
using sim_allocator = gpukit::basic_caching_allocator<sim_runtime>;
using sim_pool      = gpukit::basic_pinned_pool<sim_runtime>;
using sim_pipeline  = gpukit::basic_transfer_pipeline<sim_runtime>;

namespace {

int current(sim_runtime& sim)
{
  int d = -1;
  REQUIRE(sim.get_device(d) == cudaSuccess);
  return d;
}

std::size_t used_elsewhere(sim_runtime const& sim, int n, int device)
{
  std::size_t sum = 0;
  for (int d = 0; d < n; ++d) { sum += d == device ? 0 : sim.used_bytes(d); }
  return sum;
}

char const* name_of(gpukit::segment_source s)
{
  switch (s) {
    case gpukit::segment_source::stream_ordered: return "stream_ordered";
    case gpukit::segment_source::synchronous: return "synchronous";
    case gpukit::segment_source::growable: return "growable";
    case gpukit::segment_source::upstream: return "upstream";
    default: return "automatic";
  }
}

}  // namespace

TEST_SUITE("multi")
{
  TEST_CASE("multi: the simulated GPU ties events to devices as CUDA does")
  {
    sim_runtime sim{devices(2)};
    stream_holder<sim_runtime> s1{sim, 1};
    int d = -1;
    CHECK(sim.stream_get_device(s1, d) == cudaSuccess);
    CHECK(d == 1);
    CHECK(sim.stream_get_device(sim_stream{}, d) == cudaSuccess);
    CHECK(d == 0);  // the null stream: the current device's
    gpukit::sim_runtime::event_type e0{};
    REQUIRE(sim.event_create(e0) == cudaSuccess);  // device 0 is current
    CHECK(sim.event_record(e0, s1) == cudaErrorInvalidResourceHandle);
    CHECK(sim.last_misuse().find("belongs to device 0 and the stream to device 1") !=
          std::string::npos);
    CHECK(sim.event_record(e0, sim_stream{}) == cudaSuccess);
    CHECK(sim.stream_wait_event(s1, e0) == cudaSuccess);  // waiting across devices is fine
    CHECK(sim.event_synchronize(e0) == cudaSuccess);
    CHECK(sim.event_destroy(e0) == cudaSuccess);
  }

  TEST_CASE("multi: allocations land on the allocator's device while another device is current")
  {
    for (auto const src : {gpukit::segment_source::stream_ordered,
                           gpukit::segment_source::synchronous, gpukit::segment_source::growable}) {
      CAPTURE(name_of(src));
      constexpr int n = 4;
      sim_runtime sim{devices(n)};
      REQUIRE(sim.set_device(3) == cudaSuccess);
      sim_allocator alloc{sim, 2, segments_from(src)};
      stream_holder<sim_runtime> s2{sim, 2};
      CHECK(current(sim) == 3);

      // The null stream means the allocator's device's, not the current device's.
      void* a = alloc.allocate_async(3 * mib, sim_stream{});
      void* b = alloc.allocate_async(64 * kib, s2);
      void* c = alloc.allocate_async(40 * mib, s2);
      CHECK(current(sim) == 3);
      CHECK(sim.used_bytes(2) >= 43 * mib);
      CHECK(used_elsewhere(sim, n, 2) == 0);
      // The memory works on device 2: memset and read it back through device 2's stream.
      REQUIRE(sim.memset_async(c, 0x5a, 40 * mib, s2) == cudaSuccess);
      std::vector<unsigned char> back(40 * mib);
      REQUIRE(sim.memcpy_async(back.data(), c, back.size(), gpukit::memcpy_kind::device_to_host,
                               s2) == cudaSuccess);
      REQUIRE(sim.stream_synchronize(s2) == cudaSuccess);
      CHECK(back.front() == 0x5a);
      CHECK(back.back() == 0x5a);

      // Cross-stream reuse records events: they must be device 2's to record on s2.
      alloc.deallocate_async(c, 40 * mib, s2);
      void* d = alloc.allocate_async(40 * mib, sim_stream{});
      alloc.record_stream(d, s2);
      alloc.deallocate_async(d, 40 * mib, sim_stream{});
      alloc.deallocate_async(a, 3 * mib, sim_stream{});
      alloc.deallocate_async(b, 64 * kib, s2);
      CHECK(current(sim) == 3);

      // Giving memory back also acts on device 2 (free_async on its streams, vm_unmap, ...).
      alloc.forget_stream(s2);
      alloc.release();
      CHECK(current(sim) == 3);
      REQUIRE(sim.stream_synchronize(s2) == cudaSuccess);
      {
        gpukit::device_guard<sim_runtime> guard{sim, 2};
        REQUIRE(sim.device_synchronize() == cudaSuccess);
      }
      CHECK(sim.used_bytes(2) == 0);
      CHECK(used_elsewhere(sim, n, 2) == 0);
      CHECK(gpukit::detail::check_invariants(alloc).empty());
    }
  }

  TEST_CASE("multi: a stream of another device is refused by the allocator and nothing changes")
  {
    sim_runtime sim{devices(2)};
    REQUIRE(sim.set_device(0) == cudaSuccess);
    sim_stream s0{};
    REQUIRE(sim.stream_create(s0) == cudaSuccess);  // a stream of device 0
    REQUIRE(sim.set_device(1) == cudaSuccess);
    sim_stream s1{};
    REQUIRE(sim.stream_create(s1) == cudaSuccess);
    for (auto source : {gpukit::segment_source::stream_ordered, gpukit::segment_source::growable}) {
      sim_allocator alloc{sim, 1, segments_from(source)};
      void* p = alloc.allocate_async(4 * mib, s1);
      CHECK_THROWS_WITH_AS(
        (void)alloc.allocate_async(4 * mib, s0),
        doctest::Contains("belongs to device 0 but this allocator serves device 1"),
        gpukit::logic_error);
      CHECK_THROWS_WITH_AS(alloc.record_stream(p, s0), doctest::Contains("belongs to device 0"),
                           gpukit::logic_error);
      CHECK(sim.used_bytes(0) == 0);  // nothing was taken from device 0
      CHECK(alloc.stats().allocation_count.current == 1);
      CHECK(gpukit::detail::check_invariants(alloc) == "");
      alloc.deallocate_async(p, 4 * mib, s1);
      alloc.forget_stream(s1);
    }
    REQUIRE(sim.stream_destroy(s0) == cudaSuccess);
    REQUIRE(sim.stream_destroy(s1) == cudaSuccess);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("multi: one allocator per device from threads with any device current")
  {
    constexpr int n = 4;
    sim_runtime sim{devices(n)};
    std::vector<std::unique_ptr<sim_allocator>> allocs;
    for (int d = 0; d < n; ++d) {
      allocs.push_back(std::make_unique<sim_allocator>(
        sim, d,
        segments_from(d % 2 == 0 ? gpukit::segment_source::growable
                                 : gpukit::segment_source::stream_ordered)));
    }
    std::vector<std::thread> threads;
    std::vector<int> bad(n, 0);
    for (int t = 0; t < n; ++t) {
      threads.emplace_back([&, t] {
        (void)sim.set_device((t + 1) % n);  // never the device it allocates on
        for (int i = 0; i < 50; ++i) {
          std::size_t const bytes = (std::size_t{1} + static_cast<std::size_t>(i % 7)) * mib;
          void* p                 = allocs[t]->allocate_async(bytes, sim_stream{});
          std::memset(p, t + 1, bytes);  // simulated device memory is host memory
          if (static_cast<unsigned char const*>(p)[bytes - 1] != t + 1) { ++bad[t]; }
          allocs[t]->deallocate_async(p, bytes, sim_stream{});
        }
        int d = -1;
        (void)sim.get_device(d);
        if (d != (t + 1) % n) { ++bad[t]; }
      });
    }
    for (auto& th : threads) { th.join(); }
    for (int d = 0; d < n; ++d) {
      CAPTURE(d);
      CHECK(bad[d] == 0);
      CHECK(sim.used_bytes(d) == allocs[d]->stats().reserved_bytes.current);
      CHECK(sim.used_bytes(d) > 0);
    }
  }

  TEST_CASE("multi: default_caching_allocator routes by device")
  {
    // sim_runtime::instance() is built from the environment on first use (in this process only:
    // CTest runs each case in a process of its own).
    ::setenv("GPUKIT_SIM_DEVICES", "4", 1);
    ::setenv("GPUKIT_SIM_CAPACITY", "2G", 1);
    auto& sim = sim_runtime::instance();
    int count = 0;
    REQUIRE(sim.device_count(count) == cudaSuccess);
    REQUIRE(count == 4);
    REQUIRE(sim.set_device(0) == cudaSuccess);
    auto& a1 = gpukit::default_caching_allocator<sim_runtime>(1);
    auto& a3 = gpukit::default_caching_allocator<sim_runtime>(3);
    CHECK(a1.device() == 1);
    CHECK(a3.device() == 3);
    CHECK(&gpukit::default_caching_allocator<sim_runtime>(1) == &a1);
    CHECK(&a1 != &a3);
    void* p1 = a1.allocate(5 * mib);
    void* p3 = a3.allocate(7 * mib);
    CHECK(sim.used_bytes(0) == 0);
    CHECK(sim.used_bytes(1) >= 5 * mib);
    CHECK(sim.used_bytes(2) == 0);
    CHECK(sim.used_bytes(3) >= 7 * mib);
    CHECK(current(sim) == 0);
    // No device given: the calling thread's current device.
    REQUIRE(sim.set_device(3) == cudaSuccess);
    CHECK(&gpukit::default_caching_allocator<sim_runtime>() == &a3);
    REQUIRE(sim.set_device(2) == cudaSuccess);
    auto& a2 = gpukit::default_caching_allocator<sim_runtime>();
    CHECK(a2.device() == 2);
    CHECK_THROWS_WITH_AS(gpukit::default_caching_allocator<sim_runtime>(4),
                         doctest::Contains("device 4 does not exist"), gpukit::logic_error);
    a1.deallocate(p1, 5 * mib);
    a3.deallocate(p3, 7 * mib);
  }

  TEST_CASE("multi: the pinned pool records each event on its stream's device")
  {
    sim_runtime sim{devices(2)};
    sim_pool pool{sim};
    stream_holder<sim_runtime> s0{sim, 0};
    stream_holder<sim_runtime> s1{sim, 1};
    REQUIRE(sim.set_device(0) == cudaSuccess);
    void* p = pool.allocate(64 * kib);
    pool.record_stream(p, s1);
    REQUIRE(sim.stall(s1) == cudaSuccess);
    pool.deallocate_async(p, s0);  // an event on s0 (device 0) and one on s1 (device 1)
    CHECK(pool.stats().num_events_recorded == 2);
    void* q = pool.allocate(64 * kib);  // s1 has not run: p is not reused
    CHECK(q != p);
    REQUIRE(sim.release(s1) == cudaSuccess);
    REQUIRE(sim.stream_synchronize(s1) == cudaSuccess);
    REQUIRE(sim.stream_synchronize(s0) == cudaSuccess);
    pool.deallocate(q);
    void* r = pool.allocate(64 * kib);
    void* t = pool.allocate(64 * kib);
    CHECK((r == p || t == p));
    // With device 1 current, the events of device 1 are reused for s1, device 0's for s0.
    REQUIRE(sim.set_device(1) == cudaSuccess);
    pool.deallocate_async(r, s0);
    pool.deallocate_async(t, s1);
    CHECK(pool.stats().num_events_recorded == 4);
    CHECK(sim.calls(sim_op::event_create) == 2);
  }

  TEST_CASE("multi: a transfer pipeline acts on its device whatever device is current")
  {
    sim_runtime sim{devices(2)};
    sim_pool pool{sim};
    gpukit::transfer_options o;
    o.chunk_bytes     = 64 * kib;
    o.staging_threads = 3;
    o.device          = 1;
    sim_pipeline pipe{sim, pool, o};
    stream_holder<sim_runtime> s1{sim, 1};
    REQUIRE(sim.set_device(0) == cudaSuccess);
    void* dev = nullptr;
    {
      gpukit::device_guard<sim_runtime> guard{sim, 1};
      REQUIRE(sim.malloc(&dev, 3 * mib) == cudaSuccess);
    }
    std::vector<char> src(3 * mib), back(3 * mib);
    fill_pattern(src.data(), src.size(), 7);
    pipe.copy_to_device_async(dev, src.data(), src.size(), gpukit::host_memory::pageable, s1);
    pipe.copy_to_host_async(back.data(), dev, back.size(), gpukit::host_memory::pageable, s1);
    CHECK(first_mismatch(back.data(), back.size(), 7) == back.size());
    CHECK(current(sim) == 0);
    CHECK(pipe.stats().staged_bytes == 6 * mib);
    // The null stream is the pipeline's device's.
    fill_pattern(src.data(), src.size(), 8);
    pipe.copy_to_device_async(dev, src.data(), src.size(), gpukit::host_memory::pageable,
                              sim_stream{});
    pipe.copy_to_host_async(back.data(), dev, back.size(), gpukit::host_memory::pageable,
                            sim_stream{});
    CHECK(first_mismatch(back.data(), back.size(), 8) == back.size());
    // A stream of another device is refused, naming both devices.
    stream_holder<sim_runtime> s0{sim, 0};
    CHECK_THROWS_WITH_AS(pipe.copy_to_device_async(dev, src.data(), src.size(), s0),
                         doctest::Contains("belongs to device 0, this pipeline to device 1"),
                         gpukit::logic_error);
    REQUIRE(sim.stream_synchronize(s1) == cudaSuccess);
    CHECK(sim.free(dev) == cudaSuccess);
  }

  TEST_CASE("multi: one pinned buffer feeds two devices")
  {
    for (auto const growth :
         {gpukit::pinned_growth::map_and_register, gpukit::pinned_growth::host_alloc}) {
      CAPTURE(static_cast<int>(growth));
      sim_runtime sim{devices(2)};
      gpukit::pinned_pool_options po;
      po.growth      = growth;
      po.pin_threads = 2;
      sim_pool pool{sim, po};
      REQUIRE(sim.set_device(0) == cudaSuccess);  // pinned with device 0 current ...
      constexpr std::size_t bytes = 2 * mib + 123;
      auto buf                    = pool.acquire(bytes);
      CHECK(sim.host_pinned_for(buf.data(), bytes, 0));
      CHECK(sim.host_pinned_for(buf.data(), bytes, 1));  // ... and pinned for device 1 too
      fill_pattern(buf.data(), bytes, 11);

      // The same buffer, copied to both devices on streams of each, and through a pipeline per
      // device sharing the pool (pool memory: copied directly, no staging).
      gpukit::transfer_options o;
      o.staging_threads = 1;
      per_device_transfers<sim_runtime> t{sim, pool, 2, bytes, o};
      device_buffer<sim_runtime> second0{sim, bytes, 0}, second1{sim, bytes, 1};
      void* dev2[2]{second0.p, second1.p};
      for (int d = 0; d < 2; ++d) {
        REQUIRE(sim.memcpy_async(t.buffer(d), buf.data(), bytes,
                                 gpukit::memcpy_kind::host_to_device, t.stream(d)) == cudaSuccess);
        t.pipe(d).copy_to_device_async(dev2[d], buf.data(), bytes, t.stream(d));
        buf.record_stream(t.stream(d));
      }
      for (int d = 0; d < 2; ++d) {
        CAPTURE(d);
        REQUIRE(sim.stream_synchronize(t.stream(d)) == cudaSuccess);
        CHECK(t.pipe(d).stats().direct_bytes == bytes);
        CHECK(t.pipe(d).stats().staged_bytes == 0);
        for (void* p : {t.buffer(d), dev2[d]}) {
          std::vector<char> back(bytes);
          t.pipe(d).copy_to_host_async(back.data(), p, bytes, t.stream(d));  // pageable: complete
          CHECK(first_mismatch(back.data(), bytes, 11) == bytes);
        }
      }
      buf.reset();
    }
  }

  TEST_CASE("multi: without the portable flags pinned memory serves only the current device")
  {
    sim_runtime sim{devices(2)};
    for (auto const growth :
         {gpukit::pinned_growth::map_and_register, gpukit::pinned_growth::host_alloc}) {
      gpukit::pinned_pool_options po;
      po.growth         = growth;
      po.pin_threads    = 1;
      po.alloc_flags    = gpukit::host_alloc_flags::none;
      po.register_flags = gpukit::host_register_flags::none;
      sim_pool pool{sim, po};
      REQUIRE(sim.set_device(1) == cudaSuccess);
      void* p = pool.allocate(64 * kib);
      CHECK(sim.host_pinned_for(p, 64 * kib, 1));
      CHECK_FALSE(sim.host_pinned_for(p, 64 * kib, 0));
      pool.deallocate(p);
      REQUIRE(sim.set_device(0) == cudaSuccess);
    }
    // And the default options pin for every device.
    sim_pool pool{sim};
    void* p = pool.allocate(64 * kib);
    CHECK(sim.host_pinned_for(p, 64 * kib, 0));
    CHECK(sim.host_pinned_for(p, 64 * kib, 1));
    CHECK_FALSE(sim.host_pinned_for(p, 64 * kib, 2));  // no such device
    std::vector<char> pageable(64 * kib);
    CHECK_FALSE(sim.host_pinned_for(pageable.data(), pageable.size(), 0));
    pool.deallocate(p);
  }

  TEST_CASE("multi: peer access on the simulated GPU")
  {
    sim_runtime sim{devices(3)};
    int can = -1;
    CHECK(sim.device_can_access_peer(can, 0, 2) == cudaSuccess);
    CHECK(can == 1);
    CHECK(sim.device_can_access_peer(can, 1, 1) == cudaSuccess);
    CHECK(can == 0);
    CHECK(sim.device_can_access_peer(can, 0, 3) == cudaErrorInvalidDevice);
    REQUIRE(sim.set_device(2) == cudaSuccess);
    CHECK(sim.device_enable_peer_access(0) == cudaSuccess);
    CHECK(sim.device_enable_peer_access(0) == cudaErrorPeerAccessAlreadyEnabled);
    CHECK(sim.device_enable_peer_access(2) == cudaErrorInvalidDevice);
    CHECK(sim.peer_access_enabled(2, 0));
    CHECK_FALSE(sim.peer_access_enabled(0, 2));  // one direction only, as on CUDA

    sim_runtime isolated{devices(2).with_peer_access(false)};
    CHECK(isolated.device_can_access_peer(can, 0, 1) == cudaSuccess);
    CHECK(can == 0);
    CHECK(isolated.device_enable_peer_access(1) == cudaErrorPeerAccessUnsupported);
  }

  TEST_CASE("multi: peer copies through the transfer pipeline move the bytes")
  {
    for (bool const peer : {true, false}) {
      CAPTURE(peer);
      sim_runtime sim{devices(2).with_peer_access(peer)};
      sim_pool pool{sim};
      gpukit::transfer_options o;
      o.staging_threads           = 2;
      o.chunk_bytes               = 256 * kib;
      constexpr std::size_t bytes = 5 * mib + 17;
      per_device_transfers<sim_runtime> t{sim, pool, 2, bytes, o};
      REQUIRE(sim.set_device(1) == cudaSuccess);  // not the device of pipes[0], which copies first
      std::vector<char> host(bytes), back(bytes);
      fill_pattern(host.data(), bytes, 21);
      t.pipe(0).copy_to_device_async(t.buffer(0), host.data(), bytes, t.stream(0));
      // Device 0 pushes to device 1, in t.stream(0)'s order (after the upload above).
      t.pipe(0).copy_peer_async(t.buffer(1), 1, t.buffer(0), 0, bytes, t.stream(0));
      REQUIRE(sim.stream_synchronize(t.stream(0)) == cudaSuccess);
      t.pipe(1).copy_to_host_async(back.data(), t.buffer(1), bytes, t.stream(1));
      CHECK(first_mismatch(back.data(), bytes, 21) == bytes);
      CHECK(t.pipe(0).stats().peer_bytes == bytes);
      CHECK(t.pipe(0).stats().peer_copies == 1);
      CHECK(sim.peer_access_enabled(0, 1) == peer);
      CHECK(sim.staged_peer_copies() == (peer ? 0u : 1u));

      // Device 1 pulls a slice back from device 0 into the middle of its buffer, in t.stream(1)'s
      // order.
      fill_pattern(host.data(), bytes, 22);
      t.pipe(0).copy_to_device_async(t.buffer(0), host.data(), bytes, t.stream(0));
      REQUIRE(sim.stream_synchronize(t.stream(0)) == cudaSuccess);
      t.pipe(1).copy_peer_async(static_cast<char*>(t.buffer(1)) + 4096, 1,
                                static_cast<char*>(t.buffer(0)) + 4096, 0, mib, t.stream(1));
      t.pipe(1).copy_to_host_async(back.data(), t.buffer(1), bytes, t.stream(1));
      std::vector<char> want(bytes);
      fill_pattern(want.data(), bytes, 21);
      std::memcpy(want.data() + 4096, host.data() + 4096, mib);
      CHECK(std::memcmp(back.data(), want.data(), bytes) == 0);
      CHECK(sim.peer_access_enabled(1, 0) == peer);

      // Bad input: clear errors, nothing copied.
      auto& p0 = t.pipe(0);
      void *b0 = t.buffer(0), *b1 = t.buffer(1);
      auto const s0 = t.stream(0), s1 = t.stream(1);
      CHECK_THROWS_WITH_AS(
        p0.copy_peer_async(b1, 1, b0, 0, bytes, s1),
        doctest::Contains("stream belongs to device 1, this pipeline to device 0"),
        gpukit::logic_error);
      CHECK_THROWS_WITH_AS(p0.copy_peer_async(b1, 1, b0, 2, bytes, s0),
                           doctest::Contains("device 2 does not exist"), gpukit::logic_error);
      CHECK_THROWS_WITH_AS(p0.copy_peer_async(b1, 1, b1, 1, 8, s0),
                           doctest::Contains("neither the source's (1) nor the destination's (1)"),
                           gpukit::logic_error);
      CHECK_THROWS_WITH_AS(p0.copy_peer_async(b0, 0, b0, 0, bytes, s0),
                           doctest::Contains("overlap"), gpukit::logic_error);
      CHECK_THROWS_WITH_AS(p0.copy_peer_async(b1, 1, b0, 0, 0, s0), doctest::Contains("0 bytes"),
                           gpukit::logic_error);
      // A pointer that is not memory of the device named for it: the runtime refuses the copy.
      CHECK_THROWS_AS(p0.copy_peer_async(b0, 1, b1, 0, bytes, s0), gpukit::cuda_error);
      CHECK(t.pipe(0).stats().peer_copies == 1);

      for (int d = 0; d < 2; ++d) { REQUIRE(sim.stream_synchronize(t.stream(d)) == cudaSuccess); }
    }
  }
}
