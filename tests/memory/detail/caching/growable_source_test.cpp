// SPDX-License-Identifier: Apache-2.0
// detail::caching::growable_source alone over the simulated GPU (virtual memory, fault injection),
// with a pool of its own around it in place of the allocator's: growth maps pages at the end of
// the free space; a map that fails part-way undoes itself; spare pages (and free pages whose work
// has completed) are mapped before new memory is created; release unmaps free pages, releases
// spare ones and gives back empty ranges; peers and exported pages follow the mapping.
#include "support/holders.hpp"
#include "support/sim_gpu.hpp"
#include "support/sizes.hpp"

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/growable_source.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace {

using gpukit::sim_op;
using gpukit::sim_runtime;
using gpukit::test::mib;
using gpukit::test::stream_holder;
using block      = gpukit::detail::caching_block<sim_runtime>;
using source     = gpukit::detail::caching::growable_source<sim_runtime, block>;
using sim_stream = sim_runtime::stream_type;
using gpukit::detail::block_state;

/// A stream's free blocks, as the allocator's stream pools hold them.
struct stream_pool {
  sim_stream stream{};
  gpukit::detail::tlsf_index<block> index[2];
  std::uint64_t free_seq{0};
};

/// The pool around the layer, in place of the allocator's (its segment_pool): a block index,
/// stream pools, counters, and what the layer tells it, kept for the checks. No captures.
struct fake_pool {
  explicit fake_pool(sim_runtime& s) : sim{s} {}

  sim_runtime& sim;
  gpukit::detail::caching::block_index<block> index;
  std::size_t held{0};  // reserved()
  gpukit::caching_allocator_stats counters{};
  std::vector<std::unique_ptr<stream_pool>> pools;
  std::size_t limit_bytes{0};
  std::int64_t reserved_of[2]{0, 0};  // count_reserved
  int segment_count{0};               // count_segment
  std::vector<gpukit::memory_event::action> events;
  std::vector<sim_stream> retired;

  // ---- the interface growable_source asks for ----
  gpukit::detail::caching::block_index<block>& blocks() { return index; }
  std::size_t& reserved() { return held; }
  void count(std::uint64_t gpukit::caching_allocator_stats::*counter, std::uint64_t n = 1)
  {
    counters.*counter += n;
  }
  std::size_t limit() const { return limit_bytes; }
  static bool capturing() { return false; }
  std::vector<std::unique_ptr<stream_pool>>& streams() { return pools; }
  void count_reserved(int kind, std::int64_t delta) { reserved_of[kind] += delta; }
  void count_segment(int, int delta) { segment_count += delta; }
  static void raise_reserved_peak() {}
  void record(gpukit::memory_event::action what, std::uintptr_t, std::size_t, sim_stream)
  {
    events.push_back(what);
  }
  block* insert_free(block* b)
  {
    return index.insert_free(
      b, [this](block const* x) -> auto& { return index_of(x); });
  }
  void unindex(block* b) { index_of(b).remove(b); }
  block* find_free(std::size_t size, int kind, sim_stream s)
  {
    if (block* b = pool_of(s).index[kind].find(size)) { return b; }
    return index.global(kind).find(size);
  }
  std::uint64_t next_free_seq(sim_stream s) { return ++pool_of(s).free_seq; }
  bool is_capturing(sim_stream s)
  {
    bool capturing = false;
    return s != sim_stream{} && sim.stream_is_capturing(s, capturing) == cudaSuccess && capturing;
  }
  void retire_dead_stream(sim_stream s) { retired.push_back(s); }

  // ---- what the tests do with it ----
  stream_pool& pool_of(sim_stream s)
  {
    for (auto& sp : pools) {
      if (sp->stream == s) { return *sp; }
    }
    pools.push_back(std::make_unique<stream_pool>());
    pools.back()->stream = s;
    return *pools.back();
  }
  gpukit::detail::tlsf_index<block>& index_of(block const* b)
  {
    return b->global ? index.global(b->kind) : pool_of(b->stream).index[b->kind];
  }
  /// A block of `size` bytes on `s`: a free one, else from grown pages (nullptr when out of
  /// memory).
  block* allocate(source& src, std::size_t size, sim_stream s, int kind = 1)
  {
    block* b = find_free(size, kind, s);
    if (b == nullptr) {
      bool oom = false;
      b        = src.grow(size, kind, s, oom, *this);
      if (b == nullptr) { return nullptr; }
    }
    index.carve(
      b, size, [this](block const* x) -> auto& { return index_of(x); });
    b->stream = s;
    return b;
  }
  /// Frees b into `s`'s pool, or into the global pool (usable on every stream) for the null stream.
  void free(block* b, sim_stream s)
  {
    b->global = s == sim_stream{};
    b->stream = s;
    insert_free(b);
  }
  /// Bytes of pool kind `kind` reserved as the statistics count them.
  [[nodiscard]] std::size_t reserved_bytes_of(int kind) const
  {
    return static_cast<std::size_t>(reserved_of[kind]);
  }
};

/// Pages of 2 MiB in both pool kinds (the simulated granularity), ranges of 64 MiB.
gpukit::caching_allocator_options options(bool shareable = false)
{
  gpukit::caching_allocator_options o;
  o.source                 = gpukit::segment_source::growable;
  o.growable_page_bytes    = 2 * mib;
  o.growable_reserve_bytes = 64 * mib;
  o.growable_shareable     = shareable;
  return o;
}

std::uintptr_t base_of(source const& src)
{
  return reinterpret_cast<std::uintptr_t>(src.segments().front()->ptr);
}

}  // namespace

TEST_SUITE("growable_source")
{
  TEST_CASE("set_up takes the device's granularity as the small page and rounds the large one up")
  {
    sim_runtime sim{gpukit::test::one_device()};
    source src{sim, 0};
    auto o                = options();
    o.growable_page_bytes = 3 * mib;
    src.set_up(o, 16 * gpukit::test::gib, 256);
    CHECK(src.page_bytes(0) == 2 * mib);
    CHECK(src.page_bytes(1) == 4 * mib);
    CHECK(src.segments().empty());
    CHECK(sim.calls(sim_op::vm_reserve) == 0);  // nothing reserved before the first growth
    source odd{sim, 0};
    CHECK_THROWS_AS(odd.set_up(o, 16 * gpukit::test::gib, 3 * mib), gpukit::logic_error);
  }

  TEST_CASE("growth maps pages at the end of the free space, merged with the free block before")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 3 * mib, s);  // two pages of a new range; 1 MiB stays free
    REQUIRE(a != nullptr);
    REQUIRE(src.segments().size() == 1);
    std::uintptr_t const base = base_of(src);
    CHECK(a->address() == base);
    CHECK(sim.calls(sim_op::vm_reserve) == 1);
    CHECK(sim.calls(sim_op::vm_create) == 2);
    CHECK(sim.calls(sim_op::vm_map) == 2);
    CHECK(sim.calls(sim_op::vm_set_access) == 1);  // one call for the run
    CHECK(pool.held == 4 * mib);
    CHECK(pool.reserved_bytes_of(1) == 4 * mib);
    CHECK(pool.segment_count == 1);
    CHECK(pool.counters.num_device_allocs == 2);
    CHECK(pool.counters.num_pages_created == 2);
    CHECK(sim.vm_accessible(a->data(), 0));
    REQUIRE(src.unmapped(1).size() == 1);
    CHECK(src.unmapped(1).front()->address() == base + 4 * mib);
    CHECK(src.unmapped(1).front()->size == 60 * mib);
    // 2 MiB more on the same stream: the free 1 MiB before the unmapped pages counts, so one
    // page is enough, and the new block starts where the free one did.
    block* b = pool.allocate(src, 2 * mib, s);
    REQUIRE(b != nullptr);
    CHECK(b->address() == base + 3 * mib);
    CHECK(sim.calls(sim_op::vm_create) == 3);
    CHECK(pool.held == 6 * mib);
    CHECK(src.segments().front()->mapped_pages == 3);
    CHECK(src.unmapped(1).front()->address() == base + 6 * mib);
    // Another stream may not use that free block: it counts for nothing there.
    stream_holder<sim_runtime> t{sim};
    block* c = pool.allocate(src, 1 * mib, t);
    REQUIRE(c != nullptr);
    CHECK(c->address() == base + 6 * mib);
    CHECK(sim.calls(sim_op::vm_reserve) == 1);  // still the one range
    CHECK(std::count(pool.events.begin(), pool.events.end(),
                     gpukit::memory_event::action::segment_alloc) == 3);
  }

  TEST_CASE("a map that fails part-way undoes itself, and the next growth works")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* first = pool.allocate(src, 2 * mib, s);
    REQUIRE(first != nullptr);
    std::size_t const used     = sim.used_bytes(0);
    std::size_t const unmapped = src.unmapped(1).front()->size;

    SUBCASE("out of memory at the third new page: nullptr with oom set, nothing changed")
    {
      sim.inject_fault(sim_op::vm_create, 3, cudaErrorMemoryAllocation);
      bool oom = false;
      CHECK(src.grow(6 * mib, 1, s, oom, pool) == nullptr);
      CHECK(oom);
      CHECK(sim.calls(sim_op::vm_unmap) == 2);  // the two pages mapped before, last first
      CHECK(pool.counters.num_pages_released == 2);
    }
    SUBCASE("a map refused at the third page: the error is thrown, nothing changed")
    {
      sim.inject_fault(sim_op::vm_map, 3, cudaErrorInvalidValue);
      bool oom = false;
      CHECK_THROWS_AS((void)src.grow(6 * mib, 1, s, oom, pool), gpukit::cuda_error);
      CHECK(!oom);
      CHECK(sim.calls(sim_op::vm_unmap) == 2);
      CHECK(pool.counters.num_pages_released == 3);  // the page whose map failed too
    }
    SUBCASE("access refused for the run: every page of it unmapped again")
    {
      sim.inject_fault(sim_op::vm_set_access, 1, cudaErrorInvalidValue);
      bool oom = false;
      CHECK_THROWS_AS((void)src.grow(6 * mib, 1, s, oom, pool), gpukit::cuda_error);
      CHECK(sim.calls(sim_op::vm_unmap) == 3);
    }
    CHECK(sim.used_bytes(0) == used);
    CHECK(pool.held == 2 * mib);
    CHECK(pool.reserved_bytes_of(1) == 2 * mib);
    CHECK(src.spare_pages(0) == 0);
    CHECK(src.segments().front()->mapped_pages == 1);
    REQUIRE(src.unmapped(1).size() == 1);
    CHECK(src.unmapped(1).front()->size == unmapped);
    CHECK(pool.counters.num_device_allocs == 1);
    CHECK(sim.misuse_count() == 0);
    block* next = pool.allocate(src, 6 * mib, s);
    REQUIRE(next != nullptr);
    CHECK(next->address() == first->address() + 2 * mib);
    CHECK(pool.held == 8 * mib);
  }

  TEST_CASE("a page whose undo fails stays mapped, is not mapped twice, and release unmaps it")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    sim.inject_fault(sim_op::vm_set_access, 1, cudaErrorInvalidValue);
    sim.inject_fault(sim_op::vm_unmap, 1, cudaErrorInvalidValue);  // the undo of the second page
    bool oom = false;
    CHECK_THROWS_AS((void)src.grow(4 * mib, 1, s, oom, pool), gpukit::cuda_error);
    auto const& seg = *src.segments().front();
    CHECK(seg.mapped_pages == 1);
    CHECK(seg.mapped[1] == 1);
    CHECK(!sim.vm_accessible(reinterpret_cast<char*>(seg.ptr) + 2 * mib, 0));
    CHECK(pool.held == 2 * mib);  // still held, counted as the pool's
    CHECK(pool.reserved_bytes_of(1) == 2 * mib);
    // The same two pages again: only the one unmapped is created and mapped.
    block* b = pool.allocate(src, 4 * mib, s);
    REQUIRE(b != nullptr);
    CHECK(sim.calls(sim_op::vm_create) == 3);
    CHECK(sim.calls(sim_op::vm_map) == 3);
    CHECK(sim.vm_accessible(reinterpret_cast<char*>(seg.ptr) + 2 * mib, 0));
    CHECK(pool.held == 4 * mib);
    pool.free(b, sim_stream{});
    CHECK(src.release(0, nullptr, pool) == 4 * mib);
    CHECK(src.segments().empty());
    CHECK(sim.used_bytes(0) == 0);
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("free pages whose work has completed become spare pages, used before new memory")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 4 * mib, s);
    block* b = pool.allocate(src, 4 * mib, s);
    REQUIRE((a != nullptr && b != nullptr));
    std::uintptr_t const at = a->address();
    pool.free(a, sim_stream{});  // usable on every stream: its work is known complete
    block* c = pool.allocate(src, 6 * mib, s);
    REQUIRE(c != nullptr);
    CHECK(c->address() == b->address() + 4 * mib);
    CHECK(pool.counters.num_pages_reused == 2);  // a's two pages, unmapped and mapped again
    CHECK(pool.counters.num_pages_created == 5);
    CHECK(sim.calls(sim_op::vm_create) == 5);
    CHECK(pool.counters.num_device_frees == 2);
    CHECK(pool.held == 10 * mib);  // b and c: a's memory moved, the pool did not grow
    CHECK(pool.reserved_bytes_of(1) == 10 * mib);
    CHECK(src.spare_pages(0) == 0);
    bool listed = false;
    for (block* u : src.unmapped(1)) { listed = listed || u->address() == at; }
    CHECK(listed);
    CHECK(std::count(pool.events.begin(), pool.events.end(),
                     gpukit::memory_event::action::segment_free) == 1);
  }

  TEST_CASE("free pages of a busy stream are left mapped; new memory is created instead")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim}, busy{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 4 * mib, busy);
    block* b = pool.allocate(src, 4 * mib, s);
    REQUIRE((a != nullptr && b != nullptr));
    GPUKIT_CUDA_TRY(sim.stall(busy));
    GPUKIT_CUDA_TRY(sim.memset_async(a->data(), 0x11, 4 * mib, busy));  // a is in use until then
    pool.free(a, busy);
    block* c = pool.allocate(src, 4 * mib, s);
    REQUIRE(c != nullptr);
    CHECK(pool.counters.num_pages_reused == 0);
    CHECK(pool.counters.num_pages_created == 6);
    CHECK((a->state.load() == block_state::free));  // still mapped, still busy's
    GPUKIT_CUDA_TRY(sim.release(busy));
    GPUKIT_CUDA_TRY(sim.stream_synchronize(busy));
    CHECK(sim.misuse_count() == 0);
  }

  TEST_CASE("release waits for the streams that own free pages, unmaps them and frees the range")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim}, t{sim}, idle{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 4 * mib, s);
    block* b = pool.allocate(src, 6 * mib, t);
    REQUIRE((a != nullptr && b != nullptr));
    pool.free(a, s);
    pool.free(b, t);
    (void)pool.pool_of(idle);  // a stream pool without growable free blocks: not waited for
    sim.reset_counters();
    // Only s's pages: s is waited for, t is not, and the range stays.
    sim_stream const only = s;
    CHECK(src.release(0, &only, pool) == 4 * mib);
    CHECK(sim.calls(sim_op::stream_synchronize) == 1);
    CHECK(pool.counters.num_release_waits == 1);
    CHECK(pool.held == 6 * mib);
    CHECK(src.segments().size() == 1);
    // Everything: t's pages go too, then the spare pages, then the empty range.
    CHECK(src.release(0, nullptr, pool) == 6 * mib);
    CHECK(sim.calls(sim_op::stream_synchronize) == 2);
    CHECK(pool.held == 0);
    CHECK(pool.reserved_bytes_of(0) == 0);
    CHECK(pool.reserved_bytes_of(1) == 0);
    CHECK(pool.counters.num_pages_released == 5);
    CHECK(src.spare_pages(0) == 0);
    CHECK(src.segments().empty());
    CHECK(src.unmapped(1).empty());
    CHECK(pool.segment_count == 0);
    CHECK(pool.index.size() == 0);
    CHECK(sim.calls(sim_op::vm_free) == 1);
    CHECK(sim.used_bytes(0) == 0);
    CHECK(pool.retired.empty());
  }

  TEST_CASE("release down to a target keeps what fits under it")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 8 * mib, s);
    block* b = pool.allocate(src, 2 * mib, s);
    REQUIRE((a != nullptr && b != nullptr));
    pool.free(a, s);
    CHECK(src.release(4 * mib, nullptr, pool) == 6 * mib);  // 10 MiB held, 4 MiB may stay
    CHECK(pool.held == 4 * mib);
    CHECK(src.segments().size() == 1);  // a target above 0 keeps the ranges
    CHECK(src.segments().front()->mapped_pages == 1);
    CHECK(src.spare_pages(0) == 1);  // a page unmapped beyond the target stays spare
  }

  TEST_CASE("a peer granted access has it to every page, mapped now or later")
  {
    sim_runtime sim{gpukit::test::devices(2, gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 4 * mib, s);
    REQUIRE(a != nullptr);
    CHECK(!sim.vm_accessible(a->data(), 1));
    src.grant(0);  // the layer's own device: nothing to do
    CHECK(src.peers().empty());
    src.grant(1);
    src.grant(1);  // granted before: nothing to do
    CHECK(src.peers() == std::vector<int>{1});
    CHECK(sim.vm_accessible(a->data(), 1));
    block* b = pool.allocate(src, 4 * mib, s);
    REQUIRE(b != nullptr);
    CHECK(sim.vm_accessible(b->data(), 1));
  }

  TEST_CASE("a page is exported once, and its descriptor closed when the page is unmapped")
  {
    sim_runtime sim{gpukit::test::one_device(gpukit::test::gib)};
    stream_holder<sim_runtime> s{sim};
    source src{sim, 0};
    src.set_up(options(true), gpukit::test::gib, 256);
    fake_pool pool{sim};
    block* a = pool.allocate(src, 4 * mib, s);
    REQUIRE(a != nullptr);
    auto& seg                    = *src.segments().front();
    std::vector<int> const fds   = src.export_pages(seg, 0, 1);
    std::vector<int> const again = src.export_pages(seg, 0, 1);
    REQUIRE(fds.size() == 2);
    CHECK(fds == again);
    CHECK(sim.calls(sim_op::vm_export_shareable) == 2);
    CHECK(::fcntl(fds[0], F_GETFD) != -1);
    pool.free(a, sim_stream{});
    sim_runtime::error_type error = sim_runtime::success;
    CHECK(src.unmap_free_pages(a, 8, error, pool) == 2);
    CHECK(error == sim_runtime::success);
    CHECK(seg.fds[0] == -1);
    CHECK(seg.fds[1] == -1);
    CHECK(::fcntl(fds[0], F_GETFD) == -1);  // closed, not just forgotten
    CHECK(src.spare_pages(0) == 2);
  }
}
