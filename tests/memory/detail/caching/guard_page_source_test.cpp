// SPDX-License-Identifier: Apache-2.0
// detail::caching::guard_page_source alone: blocks placed at the end of their own runs of pages in
// fake growable segments (plain addresses, never dereferenced; reserving, mapping and indexing are
// callables that record what they are asked), the page after each run left unmapped, runs beyond
// the cursor and round the address space once, the room found again after reclaim, freed blocks
// reported as double frees until newer frees push them out or their address is reused; and the
// wait for a block's streams over the simulated GPU.
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/error.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/guard_page_source.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

using gpukit::sim_op;
using gpukit::sim_runtime;
using block  = gpukit::detail::caching_block<sim_runtime>;
using blocks = gpukit::detail::caching::block_index<block>;
using source = gpukit::detail::caching::guard_page_source<sim_runtime, block>;
using gpukit::detail::block_state;
using gpukit::test::sim_stream;
using gpukit::test::stream_holder;

namespace {

constexpr std::size_t page     = std::size_t{64} << 10;
constexpr std::uintptr_t low   = std::uintptr_t{1} << 36;  // fake segment addresses
constexpr std::uintptr_t high  = std::uintptr_t{2} << 36;
constexpr std::uintptr_t fresh = std::uintptr_t{3} << 36;  // where reserve() puts a new range

// One pool kind's growable segments, faked: the allocator's side of a placement.
struct fake_pages {
  blocks idx;
  std::vector<block*> unmapped;
  struct map_call {
    block* range;
    std::uintptr_t at;
    std::size_t pages;
  };
  std::vector<map_call> maps;
  std::vector<std::size_t> reserves;  // bytes asked of each reserve
  std::vector<block*> free_runs;      // blocks given to insert_free
  int reclaims{0};
  bool reserve_fails{false};
  bool map_fails{false};
  std::function<void()> on_reclaim{[] {}};

  // A segment of `bytes` at `at`, one unmapped range.
  block* segment(std::uintptr_t at, std::size_t bytes)
  {
    block* u = idx.new_block();
    idx.add_segment(u, reinterpret_cast<void*>(at), bytes, this);
    u->state.store(block_state::unmapped);
    unmapped.push_back(u);
    return u;
  }

  // guards.allocate over these segments.
  block* allocate(source& guards, std::size_t bytes, std::size_t size, sim_stream s = {})
  {
    return guards.allocate(
      bytes, size, s, page, unmapped,
      [&](std::size_t n, bool& oom) -> block* {
        reserves.push_back(n);
        if (reserve_fails) {
          oom = true;
          return nullptr;
        }
        return segment(fresh, n);
      },
      [&](block* u, std::uintptr_t at, std::size_t pages, bool& oom) -> block* {
        maps.push_back({u, at, pages});
        oom = map_fails;
        return map_fails ? nullptr : take_run(u, at, pages);
      },
      [&](block* run) {
        free_runs.push_back(run);
        run->state.store(block_state::free);
      },
      [&] {
        ++reclaims;
        on_reclaim();
      });
  }

  // The run of `pages` pages at `at` out of unmapped range `u`, as the growable segments' map_run
  // leaves it: the rest of `u` before and after the run stays unmapped and listed.
  block* take_run(block* u, std::uintptr_t at, std::size_t pages)
  {
    unmapped.erase(std::find(unmapped.begin(), unmapped.end(), u));
    block* run = u;
    if (at > u->address()) {
      run = idx.split_off(u, at - u->address());
      unmapped.push_back(u);
    }
    if (run->size > pages * page) { unmapped.push_back(idx.split_off(run, pages * page)); }
    return run;
  }

  // The pages of the segment that begins with `head` are unmapped again: one unmapped range, as
  // the allocator's unmapping leaves a segment whose blocks are all free.
  void unmap(block* head)
  {
    while (head->next != nullptr) {
      unmapped.erase(std::remove(unmapped.begin(), unmapped.end(), head->next), unmapped.end());
      idx.absorb_next(head);
    }
    head->state.store(block_state::unmapped);
    unmapped.push_back(head);
  }

  [[nodiscard]] bool is_unmapped(std::uintptr_t at, std::size_t bytes) const
  {
    return std::any_of(unmapped.begin(), unmapped.end(), [&](block const* u) {
      return u->address() == at && u->size == bytes && u->state.load() == block_state::unmapped;
    });
  }
};

// An enabled guard page source over `p`'s blocks.
struct guarded {
  fake_pages p;
  source guards{0, p.idx};
  guarded() { guards.enable(); }
};

}  // namespace

TEST_SUITE("guard_page_source")
{
  TEST_CASE("a block ends where its run of pages ends and the page after the run stays unmapped")
  {
    guarded g;
    CHECK(g.guards.on());
    block* seg = g.p.segment(low, 16 * page);
    sim_stream const s{};
    block* b = g.p.allocate(g.guards, 1000, 1024, s);
    REQUIRE(b != nullptr);
    CHECK(b->address() == low + page - 1024);
    CHECK(b->size == 1024);
    CHECK(b->requested == 1000);
    CHECK(b->state.load() == block_state::allocated);
    CHECK(b->stream == s);
    CHECK_FALSE(b->global);
    REQUIRE(g.p.maps.size() == 1);
    CHECK(g.p.maps[0].range == seg);
    CHECK(g.p.maps[0].at == low);
    CHECK(g.p.maps[0].pages == 1);
    // The run's bytes before the block: a free block of every stream.
    REQUIRE(g.p.free_runs.size() == 1);
    block* run = g.p.free_runs[0];
    CHECK(run == seg);
    CHECK(run->address() == low);
    CHECK(run->size == page - 1024);
    CHECK(run->global);
    CHECK(run->free_seq == 0);
    CHECK(run->next == b);
    // After the block: the rest of the range, unmapped, its first page the guard page.
    REQUIRE(b->next != nullptr);
    CHECK(b->next->address() == low + page);
    CHECK(g.p.is_unmapped(low + page, 15 * page));
    CHECK(g.p.unmapped.size() == 1);
    CHECK(g.guards.holds(b->data()));
    CHECK(g.guards.cursor() == low + page);
    CHECK(g.p.reserves.empty());
    CHECK(g.p.reclaims == 0);

    // A block of whole pages has no free run before it, and one unmapped page before its run.
    block* whole = g.p.allocate(g.guards, page, page);
    REQUIRE(whole != nullptr);
    CHECK(whole->address() == low + 2 * page);
    CHECK(whole->size == page);
    CHECK(g.p.free_runs.size() == 1);
    CHECK(g.p.is_unmapped(low + page, page));
    CHECK(g.p.is_unmapped(low + 3 * page, 13 * page));
    CHECK(g.guards.cursor() == low + 3 * page);
  }

  TEST_CASE("runs go beyond the cursor and round the address space once before reusing any")
  {
    guarded g;
    g.p.segment(high, 16 * page);  // listed first: the order of the list does not matter
    g.p.segment(low, 16 * page);
    block* first = g.p.allocate(g.guards, 1024, 1024);
    CHECK(first->address() == low + page - 1024);  // the lowest at or beyond the cursor (0)
    // 14 pages do not fit in what `low` has left (a guard page, then 14 pages and one more).
    block* big = g.p.allocate(g.guards, 14 * page, 14 * page);
    CHECK(big->address() == high);
    CHECK(g.guards.cursor() == high + 14 * page);
    // Nothing beyond the cursor has room: round to the lowest.
    block* round = g.p.allocate(g.guards, 1024, 1024);
    CHECK(round->address() == low + 3 * page - 1024);
    CHECK(g.p.reserves.empty());
  }

  TEST_CASE("out of room: a new range else reclaim once else nothing")
  {
    guarded g;
    SUBCASE("a new range of the run and two pages")
    {
      block* b = g.p.allocate(g.guards, 3 * page, 3 * page);
      REQUIRE(b != nullptr);
      CHECK(g.p.reserves == std::vector<std::size_t>{5 * page});
      CHECK(b->address() == fresh);
      CHECK(g.p.is_unmapped(fresh + 3 * page, 2 * page));
      CHECK(g.p.reclaims == 0);
    }
    SUBCASE("no address space, even after reclaim")
    {
      g.p.reserve_fails = true;
      CHECK(g.p.allocate(g.guards, 1024, 1024) == nullptr);
      CHECK(g.p.reserves.size() == 2);
      CHECK(g.p.reclaims == 1);
      CHECK(g.guards.cursor() == 0);
    }
    SUBCASE("no memory to map until reclaim frees some")
    {
      block* seg     = g.p.segment(low, 4 * page);
      g.p.map_fails  = true;
      g.p.on_reclaim = [&] { g.p.map_fails = false; };
      block* b       = g.p.allocate(g.guards, 1024, 1024);
      REQUIRE(b != nullptr);
      CHECK(g.p.reclaims == 1);
      REQUIRE(g.p.maps.size() == 2);
      CHECK(g.p.maps[0].range == seg);  // the failed try left the range as it was
      CHECK(g.p.maps[1].range == seg);
      CHECK(b->address() == low + page - 1024);
      CHECK(g.guards.holds(b->data()));
    }
  }

  TEST_CASE("a freed block is a double free until newer frees push it out or its address is reused")
  {
    guarded g;
    block* low_seg = g.p.segment(low, 2 * page);
    g.p.segment(high, 2 * page);
    block* b1 = g.p.allocate(g.guards, 1000, 1024);
    REQUIRE(b1 != nullptr);
    void* const p1 = b1->data();
    b1->recorded.push_back(sim_stream{});
    CHECK_NOTHROW(g.guards.check_free(p1));
    CHECK(g.guards.retire(b1, 2) == b1);
    CHECK(b1->recorded.empty());
    CHECK(b1->global);
    CHECK(b1->stream == sim_stream{});
    CHECK_FALSE(g.guards.holds(p1));
    CHECK_THROWS_WITH_AS(g.guards.check_free(p1),
                         doctest::Contains("a block with guard pages, freed before: its pages are "
                                           "unmapped, device 0"),
                         gpukit::logic_error);
    g.p.unmap(low_seg);

    // The cursor is inside `low`: the next block goes to `high`.
    block* b2 = g.p.allocate(g.guards, 1000, 1024);
    REQUIRE(b2 != nullptr);
    void* const p2 = b2->data();
    CHECK(b2->address() == high + page - 1024);
    g.guards.retire(b2, 2);
    CHECK_THROWS_AS(g.guards.check_free(p1), gpukit::logic_error);  // the two newest are kept
    CHECK_THROWS_AS(g.guards.check_free(p2), gpukit::logic_error);

    // Round to `low` again: the new block has b1's address, whose free is no double free now.
    block* b3 = g.p.allocate(g.guards, 1000, 1024);
    REQUIRE(b3 != nullptr);
    CHECK(b3->data() == p1);
    CHECK(g.guards.holds(p1));
    CHECK_NOTHROW(g.guards.check_free(p1));
    g.guards.retire(b3, 1);  // keep only the newest
    CHECK_NOTHROW(g.guards.check_free(p2));
    CHECK_THROWS_AS(g.guards.check_free(p1), gpukit::logic_error);
  }

  TEST_CASE("a guarded block freed during a capture is an ordinary block from then on")
  {
    guarded g;
    g.p.segment(low, 4 * page);
    block* b = g.p.allocate(g.guards, 1000, 1024);
    REQUIRE(b != nullptr);
    g.guards.forget(b->data());
    CHECK_FALSE(g.guards.holds(b->data()));
    CHECK_NOTHROW(g.guards.check_free(b->data()));
  }

  TEST_CASE("guard pages are off until enabled")
  {
    fake_pages p;
    source guards{0, p.idx};
    CHECK_FALSE(guards.on());
  }

  TEST_CASE("wait_for_streams waits for each stream and for the device when one was destroyed")
  {
    sim_runtime sim{gpukit::test::one_device()};
    stream_holder<sim_runtime> a{sim}, b{sim};
    sim_stream gone{};
    GPUKIT_CUDA_TRY(sim.stream_create(gone));
    GPUKIT_CUDA_TRY(sim.stream_destroy(gone));

    source::wait_for_streams(sim, 0, {a, b});
    CHECK(sim.calls(sim_op::stream_synchronize) == 2);
    CHECK(sim.calls(sim_op::device_synchronize) == 0);

    source::wait_for_streams(sim, 0, {a, gone});
    CHECK(sim.calls(sim_op::stream_synchronize) == 4);
    CHECK(sim.calls(sim_op::device_synchronize) == 1);

    sim.inject_fault(sim_op::stream_synchronize, 2, sim.launch_failure);
    CHECK_THROWS_WITH_AS(source::wait_for_streams(sim, 0, {a, b, a}),
                         doctest::Contains("waiting for the work on a block with guard pages"),
                         gpukit::cuda_error);
    CHECK(sim.calls(sim_op::stream_synchronize) == 6);  // no wait after the one that failed
  }
}
