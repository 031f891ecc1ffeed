// SPDX-License-Identifier: Apache-2.0
// detail::caching::event_recorder alone over the simulated GPU's stream type: the switch, the
// pool's ring and the threads' rings, what snapshot() gets from them (every ring, in time order,
// with the dropped counts), and how events are stamped. The thread caches are the allocator's own
// type (detail::caching_thread_cache, hence the allocator's header).
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/memory/caching_allocator.hpp>  // detail::caching_thread_cache
#include <gpukit/memory/detail/caching/event_recorder.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using gpukit::memory_event;
using gpukit::sim_runtime;
using recorder = gpukit::detail::caching::event_recorder<sim_runtime>;
using cache    = gpukit::detail::caching_thread_cache<sim_runtime>;
using block    = gpukit::detail::caching_block<sim_runtime>;
using gpukit::test::stream_holder;

using action = memory_event::action;

struct caches_of {
  std::vector<std::unique_ptr<cache>> caches;
  cache& add()
  {
    caches.push_back(std::make_unique<cache>());
    return *caches.back();
  }
};

}  // namespace

TEST_SUITE("event_recorder")
{
  TEST_CASE("nothing is recorded until start_recording, nor after the switch is turned off")
  {
    gpukit::detail::caching::recording_switch sw;
    recorder r{sw};
    caches_of c;
    r.record_pool(action::segment_alloc, 0x1000, 2 << 20, {});
    CHECK(r.pool_ring().events().empty());

    r.start_recording(c.caches, 8);
    CHECK(sw.on.load());
    CHECK(sw.capacity.load() == 8);
    r.record_pool(action::segment_alloc, 0x1000, 2 << 20, {});
    r.record_pool(action::oom, 0, 1 << 30, {});
    REQUIRE(r.pool_ring().events().size() == 2);
    memory_event const& e = r.pool_ring().events()[0];
    CHECK(e.what == action::segment_alloc);
    CHECK(e.address == 0x1000);
    CHECK(e.bytes == (2u << 20));
    CHECK(e.stream == 0);
    CHECK(e.time_ns <= r.pool_ring().events()[1].time_ns);

    sw.on.store(false);  // stop_recording
    r.record_pool(action::segment_free, 0x1000, 2 << 20, {});
    CHECK(r.pool_ring().events().size() == 2);  // kept for snapshot()
  }

  TEST_CASE("start_recording empties every ring and sets the capacity of each")
  {
    gpukit::detail::caching::recording_switch sw;
    recorder r{sw};
    caches_of c;
    cache& t = c.add();
    block b;
    b.ptr.store(0x4000);
    b.size = 512;
    r.start_recording(c.caches, 2);
    for (int i = 0; i < 3; ++i) { recorder::record(t, sw.capacity.load(), action::alloc, &b, {}); }
    for (int i = 0; i < 3; ++i) { r.record_pool(action::segment_alloc, 0x1000, 4096, {}); }
    CHECK(t.ring.events().size() == 2);
    CHECK(t.ring.dropped() == 1);
    CHECK(r.pool_ring().dropped() == 1);

    r.start_recording(c.caches, 4);
    CHECK(t.ring.events().empty());
    CHECK(t.ring.dropped() == 0);
    CHECK(r.pool_ring().events().empty());
    for (int i = 0; i < 3; ++i) { recorder::record(t, sw.capacity.load(), action::free, &b, {}); }
    CHECK(t.ring.events().size() == 3);
    CHECK(t.ring.dropped() == 0);
  }

  TEST_CASE("a thread's event names its block and stream, snapshot gets every ring in time order")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> s{sim};
    gpukit::detail::caching::recording_switch sw;
    recorder r{sw};
    caches_of c;
    cache& a = c.add();
    cache& t = c.add();
    block b;
    b.ptr.store(0x20000);
    b.size = 1024;
    r.start_recording(c.caches, 2);
    r.record_pool(action::segment_alloc, 0x20000, 2 << 20, s.s);
    recorder::record(a, sw.capacity.load(), action::alloc, &b, s.s);
    recorder::record(t, sw.capacity.load(), action::free, &b, s.s);
    recorder::record(t, sw.capacity.load(), action::alloc, &b, {});
    recorder::record(t, sw.capacity.load(), action::free, &b,
                     {});  // t's ring holds 2: its first is dropped

    REQUIRE(a.ring.events().size() == 1);
    memory_event const& e = a.ring.events()[0];
    CHECK(e.what == action::alloc);
    CHECK(e.address == 0x20000);
    CHECK(e.bytes == 1024);
    CHECK(e.stream == recorder::stream_id(s.s));
    CHECK(e.stream != 0);

    gpukit::memory_snapshot snap;
    r.fill_events(snap, c.caches);
    REQUIRE(snap.events.size() == 4);
    CHECK(snap.dropped_events == 1);
    for (std::size_t i = 1; i < snap.events.size(); ++i) {
      CHECK(snap.events[i - 1].time_ns <= snap.events[i].time_ns);
    }
    CHECK(snap.events.front().what == action::segment_alloc);  // the first recorded
    // t's first event (a free on s) was dropped: on s are the segment and a's allocation.
    std::size_t on_s = 0;
    for (auto const& x : snap.events) { on_s += x.stream == recorder::stream_id(s.s) ? 1 : 0; }
    CHECK(on_s == 2);
  }

  TEST_CASE("a stream's id is its handle's bits, time is the steady clock's, in nanoseconds")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> s{sim};
    std::uintptr_t bits = 0;
    std::memcpy(&bits, &s.s, sizeof s.s);
    CHECK(recorder::stream_id(s.s) == bits);
    CHECK(recorder::stream_id({}) == 0);
    std::uint64_t const t0 = recorder::now_ns();
    std::uint64_t const t1 = recorder::now_ns();
    CHECK(t0 > 0);
    CHECK(t1 >= t0);
  }
}
