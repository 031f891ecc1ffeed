// SPDX-License-Identifier: Apache-2.0
// detail::caching::stream_pools alone over the simulated GPU, with a pool of its own around it in
// place of the allocator's: a block freed on a stream is reusable there at once and elsewhere once
// an event recorded after the free has completed (one event per crossing, never per free);
// pending frees wait on their events, and those freed during a capture are armed once it ends;
// destroyed streams are retired (the device synchronized once); forget waits for the stream and
// makes its blocks every stream's. No call that would invalidate a capture is made on a capturing
// stream (the simulated GPU would fail end_capture).
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/stream_pools.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

using gpukit::sim_op;
using gpukit::sim_runtime;
using gpukit::test::mib;
using gpukit::test::stream_holder;
using block        = gpukit::detail::caching_block<sim_runtime>;
using layer        = gpukit::detail::caching::stream_pools<sim_runtime, block>;
using pending_free = layer::pending_free;
using sim_stream   = sim_runtime::stream_type;
using gpukit::detail::block_state;

/// The pool around the layer, in place of the allocator's (its stream_operations): a block index
/// whose free blocks go to the layer's stream pools or the global indices, and what the layer
/// tells it, kept for the checks.
struct fake_pool {
  explicit fake_pool(layer& l) : streams{l} {}

  layer& streams;
  gpukit::detail::caching::block_index<block> index;
  bool capture_underway{false};
  gpukit::caching_allocator_stats counters{};
  std::int64_t pending_bytes{0};
  std::int64_t pending_blocks{0};
  std::uint64_t capture{0};  // capture_of's answer
  std::uintptr_t next_address{0x10000000};

  // ---- the interface stream_pools asks for ----
  [[nodiscard]] bool capturing() const { return capture_underway; }
  block* insert_free(block* b)
  {
    return index.insert_free(
      b, [this](block const* x) -> auto& { return index_of(x); });
  }
  void free_to_pool(block* b, sim_stream s)
  {
    if (streams.forgotten(s)) {
      b->stream = sim_stream{};
      b->global = true;
    } else {
      b->stream   = s;
      b->global   = false;
      b->free_seq = streams.next_free_seq(s);
    }
    insert_free(b);
  }
  [[nodiscard]] std::size_t global_bytes() const { return index.global_bytes(); }
  void count(std::uint64_t gpukit::caching_allocator_stats::*counter, std::uint64_t n = 1)
  {
    counters.*counter += n;
  }
  void count_pending(int, std::int64_t bytes, std::int64_t blocks)
  {
    pending_bytes += bytes;
    pending_blocks += blocks;
  }
  [[nodiscard]] std::uint64_t capture_of(sim_stream) const { return capture; }

  // ---- what the tests do with it ----
  gpukit::detail::tlsf_index<block>& index_of(block const* b)
  {
    return b->global ? index.global(b->kind) : streams.pool_of(b->stream).index[b->kind];
  }
  /// An allocated block of a segment of its own, `size` bytes of pool kind `kind`, on `s`.
  block* allocated(std::size_t size, sim_stream s, int kind = 1)
  {
    block* b = index.new_block();
    index.add_segment(b, reinterpret_cast<void*>(next_address), size, nullptr);
    next_address += 64 * mib;
    b->kind   = kind;
    b->stream = s;
    b->state.store(block_state::allocated, std::memory_order_relaxed);
    return b;
  }
  /// A block of `size` bytes freed on `s` (in s's pool).
  block* freed(std::size_t size, sim_stream s)
  {
    block* b = allocated(size, s);
    free_to_pool(b, s);
    return b;
  }
  /// A pending free of `size` bytes allocated on `s`, used on `other` too, parked as the allocator
  /// parks it (counted first).
  block* pending_on(std::size_t size, sim_stream s, sim_stream other)
  {
    block* b = allocated(size, s);
    b->recorded.push_back(other);
    pending_free pf;
    pf.b      = b;
    pf.stream = s;
    streams.record_uses(b, s, pf, *this);
    count_pending(b->kind, static_cast<std::int64_t>(b->size), 1);
    streams.park(std::move(pf));
    return b;
  }
};

bool in_pool(layer& l, block const* b, sim_stream s)
{
  bool found = false;
  for (auto const& idx : l.pool_of(s).index) {
    idx.for_each([&](block* x) { found = found || x == b; });
  }
  return found;
}

sim_stream fake_handle(std::uintptr_t n) { return reinterpret_cast<sim_stream>(0x1000 + n); }

/// Counts teardown's runtime calls as the allocator's teardown_calls does.
struct counting_call {
  int calls{0};
  int failed{0};
  template <class F>
  void operator()(F&& f) noexcept
  {
    ++calls;
    if (f() != cudaSuccess) { ++failed; }
  }
};

}  // namespace

TEST_SUITE("stream_pools")
{
  TEST_CASE("a block freed on a stream is reusable there at once, elsewhere after an event")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    layer streams{sim, 0};
    fake_pool pool{streams};
    block* first = pool.freed(4 * mib, a);
    CHECK(streams.find(4 * mib, 1, a) == first);  // its own stream: at once
    CHECK(streams.find(4 * mib, 1, b) == nullptr);
    CHECK(pool.index.global(1).empty());

    REQUIRE(sim.stall(a) == cudaSuccess);  // a's work before the event stays pending
    CHECK(streams.migrate(b, false, pool) == 0);
    CHECK(pool.counters.num_cross_stream_events == 1);
    CHECK(streams.pool_of(a).migrating);
    CHECK(in_pool(streams, first, a));
    // Another free on a, and another allocation's search from b: the same event, not a new one.
    block* second = pool.freed(8 * mib, a);
    CHECK(streams.migrate(b, false, pool) == 0);
    CHECK(pool.counters.num_cross_stream_events == 1);
    CHECK(sim.calls(sim_op::event_record) == 1);
    // The requester's own pool is never migrated.
    CHECK(streams.migrate(a, false, pool) == 0);
    CHECK(sim.calls(sim_op::event_record) == 1);

    REQUIRE(sim.release(a) == cudaSuccess);
    // Only what a held before the event moves; the event goes back to the spare list.
    CHECK(streams.migrate(b, true, pool) == 4 * mib);
    CHECK(first->global);
    CHECK(pool.index.global(1).find(4 * mib) == first);
    CHECK(in_pool(streams, second, a));
    CHECK_FALSE(streams.pool_of(a).migrating);
    CHECK(streams.spare_events() == 1);
    // The next crossing takes a new event (the spare one): a is idle, so it completes at once.
    // (Its worker may still be finishing the task whose event the wait above saw complete.)
    REQUIRE(sim.stream_synchronize(a) == cudaSuccess);
    CHECK(streams.migrate(b, false, pool) == 8 * mib);
    CHECK(second->global);
    CHECK(pool.counters.num_cross_stream_events == 2);
    CHECK(sim.calls(sim_op::event_create) == 1);
    CHECK(streams.spare_events() == 1);
    // Nothing left on a: no event.
    CHECK(streams.migrate(b, false, pool) == 0);
    CHECK(sim.calls(sim_op::event_record) == 2);

    counting_call call;
    streams.teardown_events(call);
    CHECK(call.calls == 1);
    CHECK(call.failed == 0);
  }

  TEST_CASE("a stream being captured is asked nothing that would invalidate its capture")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim}, c{sim};
    layer streams{sim, 0};
    fake_pool pool{streams};
    block* x = pool.freed(4 * mib, a);
    REQUIRE(sim.begin_capture(a) == cudaSuccess);
    REQUIRE(sim.begin_capture(c) == cudaSuccess);
    // Migration leaves a alone: an event recorded there would be part of the graph.
    CHECK(streams.migrate(b, false, pool) == 0);
    CHECK(sim.calls(sim_op::event_record) == 0);
    CHECK(in_pool(streams, x, a));
    // A stream first met while capturing is only asked whether it is: taken on trust, unchecked.
    streams.check_stream(c, "allocate_async");
    CHECK(sim.calls(sim_op::stream_get_device) == 0);
    CHECK_FALSE(streams.checked(c));
    // forget refuses it (a synchronization would invalidate the capture), and changes nothing.
    CHECK_THROWS_AS(streams.forget(a, false, pool), gpukit::logic_error);
    CHECK(sim.calls(sim_op::stream_synchronize) == 0);
    CHECK(in_pool(streams, x, a));
    CHECK_FALSE(streams.forgotten(a));
    CHECK(sim.end_capture(a) == cudaSuccess);
    CHECK(sim.end_capture(c) == cudaSuccess);
    // After the capture: checked for real, once.
    streams.check_stream(c, "allocate_async");
    streams.check_stream(c, "allocate_async");
    CHECK(sim.calls(sim_op::stream_get_device) == 1);
    CHECK(streams.checked(c));
  }

  TEST_CASE("stream checks: another device's stream and a destroyed one are named")
  {
    sim_runtime sim{gpukit::test::devices(2)};
    stream_holder<sim_runtime> other{sim, 1};
    layer streams{sim, 0};
    fake_pool pool{streams};
    streams.check_stream(sim_stream{}, "allocate_async");  // the null stream: asked nothing
    CHECK(sim.calls(sim_op::stream_is_capturing) == 0);
    try {
      streams.check_stream(other, "allocate_async");
      FAIL("another device's stream was accepted");
    } catch (gpukit::logic_error const& e) {
      CHECK(std::string{e.what()}.find("allocate_async: the stream belongs to device 1") !=
            std::string::npos);
    }
    CHECK_FALSE(streams.checked(other));
    sim_stream dead{};
    REQUIRE(sim.stream_create(dead) == cudaSuccess);
    REQUIRE(sim.stream_destroy(dead) == cudaSuccess);
    try {
      streams.check_stream(dead, "record_stream");
      FAIL("a destroyed stream was accepted");
    } catch (gpukit::cuda_error const& e) {
      CHECK(std::string{e.what()}.find("is not a live stream of device 0") != std::string::npos);
    }
    CHECK(sim.calls(sim_op::device_synchronize) == 0);
    // Where a destroyed stream is expected (a free on it): retired instead.
    CHECK_FALSE(streams.check_live_stream(dead, "deallocate_async", pool));
    CHECK(sim.calls(sim_op::device_synchronize) == 1);
    CHECK(pool.counters.num_dead_streams == 1);
    CHECK(streams.forgotten(dead));
  }

  TEST_CASE("a destroyed stream is retired once: the device synchronized, its blocks global")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> b{sim};
    layer streams{sim, 0};
    fake_pool pool{streams};
    sim_stream dead{};
    REQUIRE(sim.stream_create(dead) == cudaSuccess);
    block* x = pool.freed(4 * mib, dead);
    REQUIRE(sim.stream_destroy(dead) == cudaSuccess);

    SUBCASE("found by a migration")
    {
      CHECK(streams.migrate(b, false, pool) == 4 * mib);
      CHECK(sim.calls(sim_op::device_synchronize) == 1);
      CHECK(pool.counters.num_dead_streams == 1);
      CHECK(pool.counters.num_cross_stream_events == 0);
      CHECK(x->global);
      CHECK(streams.pools().empty());  // its pool is gone: never asked again
      CHECK(streams.forgotten(dead));
      CHECK(streams.spare_events() == 1);  // the event its record refused
      CHECK(streams.migrate(b, false, pool) == 0);
      CHECK(sim.calls(sim_op::device_synchronize) == 1);
      // A later free on it goes to every stream.
      block* y = pool.allocated(2 * mib, dead);
      pool.free_to_pool(y, dead);
      CHECK(y->global);
    }
    SUBCASE("not during a capture: nothing changes")
    {
      pool.capture_underway = true;
      CHECK_THROWS_AS(streams.retire_dead_stream(dead, pool), gpukit::cuda_error);
      CHECK(sim.calls(sim_op::device_synchronize) == 0);
      CHECK(pool.counters.num_dead_streams == 0);
      CHECK(in_pool(streams, x, dead));
    }
  }

  TEST_CASE("pending frees wait on an event per other stream, then join their stream's pool")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim}, c{sim};
    layer streams{sim, 0};
    fake_pool pool{streams};
    REQUIRE(sim.stall(b) == cudaSuccess);
    block* x    = pool.allocated(4 * mib, a);
    x->recorded = {a, b, c};  // its own stream needs no event
    pending_free pf;
    pf.b      = x;
    pf.stream = a;
    streams.record_uses(x, a, pf, pool);
    CHECK(pf.events.size() == 2);
    CHECK(sim.calls(sim_op::event_record) == 2);
    pool.count_pending(x->kind, static_cast<std::int64_t>(x->size), 1);
    streams.park(std::move(pf));
    CHECK(x->state.load() == block_state::pending);
    CHECK(x->recorded.empty());
    REQUIRE(streams.pending().size() == 1);

    CHECK(streams.poll_pending(false, pool) == 0);  // b's work is still queued
    CHECK(streams.find(4 * mib, 1, a) == nullptr);
    CHECK(pool.pending_blocks == 1);
    REQUIRE(sim.release(b) == cudaSuccess);
    CHECK(streams.poll_pending(true, pool) == 4 * mib);
    CHECK(streams.pending().empty());
    CHECK(streams.find(4 * mib, 1, a) == x);  // reusable on a at once
    CHECK(x->state.load() == block_state::free);
    CHECK(pool.pending_blocks == 0);
    CHECK(pool.pending_bytes == 0);
    CHECK(streams.spare_events() == 2);
    // The next pending free reuses the spare events.
    pool.pending_on(2 * mib, a, c);
    CHECK(sim.calls(sim_op::event_create) == 2);
    CHECK(streams.spare_events() == 1);
    CHECK(streams.poll_pending(true, pool) == 2 * mib);
  }

  TEST_CASE("a free during a capture waits unarmed until the capture has ended")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    layer streams{sim, 0};
    fake_pool pool{streams};
    block* x = pool.allocated(4 * mib, a);
    x->recorded.push_back(b);
    pending_free pf;
    pf.b      = x;
    pf.stream = a;

    SUBCASE("no capture involved: not deferred")
    {
      CHECK_FALSE(streams.defer_in_capture(x, a, pf, pool));
      CHECK(pf.uses.empty());
      CHECK(x->capture_pool == 0);
    }
    SUBCASE("kept for the capture's pool")
    {
      pool.capture_underway = true;
      pool.capture          = 7;
      CHECK(streams.defer_in_capture(x, a, pf, pool));
      CHECK(pf.uses == std::vector<sim_stream>{b});
      CHECK(x->capture_pool == 7);
    }
    SUBCASE("armed once no capture is under way and none of its streams captures")
    {
      pool.capture_underway = true;
      REQUIRE(streams.defer_in_capture(x, a, pf, pool));
      streams.park(std::move(pf));
      CHECK(streams.poll_pending(false, pool) == 0);
      CHECK(sim.calls(sim_op::event_record) == 0);
      pool.capture_underway = false;
      REQUIRE(sim.begin_capture(b) == cudaSuccess);  // begun on b directly
      CHECK(streams.poll_pending(false, pool) == 0);
      CHECK(sim.calls(sim_op::event_record) == 0);
      CHECK(sim.end_capture(b) == cudaSuccess);  // not invalidated
      CHECK(streams.poll_pending(false, pool) == 4 * mib);
      CHECK(sim.calls(sim_op::event_record) == 1);
      CHECK(streams.find(4 * mib, 1, a) == x);
    }
  }

  TEST_CASE("forget waits for the stream, then its blocks and pending frees are every stream's")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    layer streams{sim, 0};
    fake_pool pool{streams};
    streams.check_stream(a, "allocate_async");
    block* x = pool.freed(4 * mib, a);
    REQUIRE(sim.stall(b) == cudaSuccess);
    block* y = pool.pending_on(2 * mib, a, b);
    REQUIRE(sim.stall(a) == cudaSuccess);
    CHECK(streams.migrate(b, false, pool) == 0);  // a migration under way: its event pending
    REQUIRE(sim.release(a) == cudaSuccess);

    streams.forget(a, false, pool);
    CHECK(sim.calls(sim_op::stream_synchronize) == 1);
    CHECK(x->global);
    CHECK(pool.index.global(1).find(4 * mib) == x);
    CHECK(streams.pools().empty());
    CHECK(streams.forgotten(a));
    CHECK_FALSE(streams.checked(a));     // a reused handle is checked again
    CHECK(streams.spare_events() == 1);  // the migration's event, complete now
    REQUIRE(streams.pending().size() == 1);
    CHECK(streams.pending().front().to_global);
    REQUIRE(sim.release(b) == cudaSuccess);
    CHECK(streams.poll_pending(true, pool) == 2 * mib);
    CHECK(y->global);
    // A block freed on it later goes to every stream; a user's free on it unforgets it.
    block* z = pool.freed(8 * mib, a);
    CHECK(z->global);
    streams.unforget(a);
    CHECK_FALSE(streams.forgotten(a));
    // A stream with nothing cached is remembered without a wait; the null stream never is.
    streams.forget(sim_stream{}, false, pool);
    CHECK_FALSE(streams.forgotten(sim_stream{}));
    CHECK(sim.calls(sim_op::stream_synchronize) == 1);

    counting_call call;
    streams.teardown_events(call);
    CHECK(sim.calls(sim_op::event_create) == 2);
    CHECK(call.calls == 2);  // every event made is destroyed once
    CHECK(call.failed == 0);
  }

  TEST_CASE("forget of a destroyed stream retires it; the oldest forgotten stream is dropped")
  {
    sim_runtime sim{gpukit::test::one_device()};
    layer streams{sim, 0};
    fake_pool pool{streams};
    sim_stream dead{};
    REQUIRE(sim.stream_create(dead) == cudaSuccess);
    block* x = pool.freed(4 * mib, dead);
    REQUIRE(sim.stream_destroy(dead) == cudaSuccess);
    streams.forget(dead, false, pool);
    CHECK(sim.calls(sim_op::device_synchronize) == 1);
    CHECK(pool.counters.num_dead_streams == 1);
    CHECK(x->global);
    CHECK(streams.forgotten(dead));
    CHECK(sim.calls(sim_op::stream_synchronize) == 1);  // refused: it was destroyed

    for (std::uintptr_t i = 0; i < layer::forgotten_capacity; ++i) {
      streams.forget(fake_handle(i), false, pool);  // nothing cached: no runtime call
    }
    CHECK_FALSE(streams.forgotten(dead));
    CHECK(streams.forgotten(fake_handle(0)));
    CHECK(streams.forgotten(fake_handle(layer::forgotten_capacity - 1)));
    CHECK(sim.calls(sim_op::stream_synchronize) == 1);
    CHECK(sim.calls(sim_op::device_synchronize) == 1);
  }
}
