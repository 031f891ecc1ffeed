// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/allocator_invariants.hpp: the invariant checker of basic_caching_allocator.
// Not public API: code outside include/ and tests/ calls it as
// gpukit::memory::testing::check_invariants (gpukit/memory/testing.hpp).
//
// It checks that the blocks tile each segment, that neighbours which could merge did, that
// growable segments' blocks lie on mapped pages (and unmapped ones are page-aligned and listed
// once), that every free block sits in the one index its owner names, and that the counters
// (reserved bytes, segments, in all and per pool kind) agree with the blocks. Then it reads stats()
// and checks that each statistic of the whole allocator is the sum of the small and large pools',
// and that a pool's current value is its allocated total less its freed total. It takes the pool
// lock and changes nothing.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

namespace gpukit::detail {

/// The checks, one function a step; a friend of basic_caching_allocator. Each appends what it
/// finds wrong to `err`.
template <class Runtime>
struct allocator_invariants {
  using allocator   = basic_caching_allocator<Runtime>;
  using block       = typename allocator::block;
  using segment     = typename allocator::segment;
  using stream_type = typename allocator::stream_type;

  /// Totals the segment walk finds, compared with the allocator's counters at the end.
  struct totals {
    std::size_t segment_bytes{0};
    std::size_t segments{0};
    std::size_t indexed_bytes{0};
    std::size_t kind_bytes[2]{0, 0};  // segment_bytes and segments per pool kind
    std::size_t kind_segments[2]{0, 0};
  };

  static std::string check(allocator const& a)
  {
    detail::pool_lock lock{a.mutex_};
    std::string err;
    totals t;
    a.blocks_.for_each([&](std::uintptr_t key, block* b) {
      a.mutex_.assert_held();  // for_each runs this under check()'s lock
      if (b->address() != key) { err += "block key mismatch; "; }
      if (b->prev == nullptr) { check_segment(a, b, t, err); }
    });
    check_indices(a, t, err);
    check_counters(a, t, err);
    return err;
  }

  static bool is(block const* b, block_state s)
  {
    return b->state.load(std::memory_order_relaxed) == s;
  }

  /// The blocks of the segment whose first block is `head` tile it.
  static void check_segment(allocator const& a, block* head, totals& t, std::string& err)
    GPUKIT_REQUIRES(a.mutex_)
  {
    auto* seg = static_cast<segment*>(head->segment);
    if (seg == nullptr || reinterpret_cast<std::uintptr_t>(seg->ptr) != head->address()) {
      err += "segment head mismatch; ";
      if (seg == nullptr) { return; }
    }
    std::size_t total = 0;
    for (block* x = head; x != nullptr; x = x->next) {
      check_block(a, *seg, head, x, err);
      if (seg->growable) { check_growable_block(a, *seg, x, err); }
      total += x->size;
    }
    if (total != seg->size) { err += "segment size mismatch; "; }
    if (seg->growable) {
      std::size_t n = 0;
      for (auto m : seg->mapped) { n += m; }
      if (n != seg->mapped_pages) { err += "mapped page count mismatch; "; }
      // A page's exported descriptor lives only while the page is mapped (it is closed when
      // the page is unmapped: its memory may then hold another page).
      for (std::size_t i = 0; i < seg->fds.size(); ++i) {
        if (seg->fds[i] >= 0 && (i >= seg->mapped.size() || seg->mapped[i] == 0)) {
          err += "descriptor of an unmapped page left open; ";
          break;
        }
      }
      t.segment_bytes += seg->mapped_pages * seg->page;
      t.kind_bytes[seg->kind] += seg->mapped_pages * seg->page;
    } else {
      t.segment_bytes += seg->size;
      t.kind_bytes[seg->kind] += seg->size;
    }
    ++t.segments;
    ++t.kind_segments[seg->kind];
  }

  /// One block of a segment: linked to its neighbours, in the map, merged where it could be.
  static void check_block(allocator const& a, segment const&, block const* head, block* x,
                          std::string& err) GPUKIT_REQUIRES(a.mutex_)
  {
    if (x->next != nullptr && x->address() + x->size != x->next->address()) {
      err += "blocks do not tile; ";
    }
    if (x->next != nullptr && x->next->prev != x) { err += "broken prev link; "; }
    if (x->segment != head->segment) { err += "block in the wrong segment; "; }
    if (a.blocks_.find(x->address()) != x) { err += "block missing from the map; "; }
    if (is(x, block_state::free) && x->next != nullptr && is(x->next, block_state::free) &&
        (x->global || x->next->global || x->stream == x->next->stream)) {
      err += "mergeable neighbours left unmerged; ";
    }
    if (is(x, block_state::dead)) { err += "dead block in a segment; "; }
  }

  /// Blocks in use or free lie on mapped pages; unmapped ones are page-aligned, unindexed ranges,
  /// each listed once, never next to another.
  static void check_growable_block(allocator const& a, segment const& seg, block const* x,
                                   std::string& err) GPUKIT_REQUIRES(a.mutex_)
  {
    auto const off          = x->address() - reinterpret_cast<std::uintptr_t>(seg.ptr);
    std::size_t const first = off / seg.page, last = (off + x->size - 1) / seg.page;
    if (!is(x, block_state::unmapped)) {
      for (std::size_t i = first; i <= last && i < seg.mapped.size(); ++i) {
        if (seg.mapped[i] == 0) {
          err += "block on an unmapped page; ";
          break;
        }
      }
      return;
    }
    if (off % seg.page != 0 || x->size % seg.page != 0) {
      err += "unmapped block not page-aligned; ";
    }
    if (x->next != nullptr && is(x->next, block_state::unmapped)) {
      err += "unmapped neighbours left unmerged; ";
    }
    auto const& list = a.pages_.unmapped(x->kind);
    if (std::count(list.begin(), list.end(), x) != 1) { err += "unmapped block not listed once; "; }
  }

  /// Every indexed block is free and in the index its owner names; the free blocks are exactly
  /// the indexed ones.
  static void check_indices(allocator const& a, totals& t, std::string& err)
    GPUKIT_REQUIRES(a.mutex_)
  {
    auto count_index = [&](detail::tlsf_index<block> const& idx, bool global, stream_type s) {
      idx.for_each([&](block* b) {
        t.indexed_bytes += b->size;
        if (!is(b, block_state::free)) { err += "indexed block not free; "; }
        if (b->capture_pool != 0 || b->global != global || (!global && !(b->stream == s))) {
          err += "block in the wrong index; ";
        }
      });
    };
    for (auto const& sp : a.streams_.pools()) {
      for (auto const& idx : sp->index) { count_index(idx, false, sp->stream); }
    }
    for (auto const& idx : a.blocks_.globals()) { count_index(idx, true, stream_type{}); }
    for (auto const& cp : a.capture_.pools()) {
      for (auto const& idx : cp->index) {
        idx.for_each([&](block* b) {
          t.indexed_bytes += b->size;
          if (b->capture_pool != cp->id) { err += "block in the wrong capture pool; "; }
          if (!is(b, block_state::free)) { err += "indexed block not free; "; }
        });
      }
    }
    std::size_t free_blocks_bytes = 0;
    a.blocks_.for_each([&](std::uintptr_t, block* b) {
      if (is(b, block_state::free)) { free_blocks_bytes += b->size; }
    });
    if (free_blocks_bytes != t.indexed_bytes) { err += "free blocks and indices disagree; "; }
  }

  /// Reserved bytes and the segment count agree with the segments (and spare pages) found.
  static void check_counters(allocator const& a, totals& t, std::string& err)
    GPUKIT_REQUIRES(a.mutex_)
  {
    for (int k = 0; k < 2; ++k) {
      t.segment_bytes += a.pages_.spare_pages(k) * a.pages_.page_bytes(k);
      t.kind_bytes[k] += a.pages_.spare_pages(k) * a.pages_.page_bytes(k);
      caching_pool_stats const& p = a.stats_.pool_stats(k);
      if (p.reserved_bytes.current != static_cast<std::int64_t>(t.kind_bytes[k])) {
        err += "pool " + std::to_string(k) + " reserved " +
               std::to_string(p.reserved_bytes.current) + " != its segments " +
               std::to_string(t.kind_bytes[k]) + "; ";
      }
      if (p.segment_count.current != static_cast<std::int64_t>(t.kind_segments[k])) {
        err += "pool " + std::to_string(k) + " segment count mismatch; ";
      }
    }
    if (t.segment_bytes != a.segments_.reserved()) {
      err += "reserved " + std::to_string(a.segments_.reserved()) + " != segments " +
             std::to_string(t.segment_bytes) + "; ";
    }
    if (t.segments != a.stats_.segments()) { err += "segment count mismatch; "; }
  }
};

/// The statistics of `s` agree with each other: every statistic of the whole allocator is the sum
/// of the two pools' (current values), no peak is below its current value, a pool's current value
/// is its allocated total less its freed total (for the statistics with totals), and the call
/// counts are the pools' totals. Returns what is wrong, or an empty string.
[[nodiscard]] inline std::string check_stats(caching_allocator_stats const& s)
{
  std::string err;
  auto check = [&](char const* name, stat_pair const& all, stat_totals caching_pool_stats::*member,
                   bool totals) {
    stat_totals const& sm = s.small_pool.*member;
    stat_totals const& lg = s.large_pool.*member;
    std::string const n{name};
    if (all.current != sm.current + lg.current) {
      err += n + ": all " + std::to_string(all.current) + " != small " +
             std::to_string(sm.current) + " + large " + std::to_string(lg.current) + "; ";
    }
    if (all.peak < all.current || sm.peak < sm.current || lg.peak < lg.current) {
      err += n + ": a peak below its current value; ";
    }
    if (all.peak > sm.peak + lg.peak) { err += n + ": all's peak above the pools' together; "; }
    for (stat_totals const* p : {&sm, &lg}) {
      if (totals && p->current != p->allocated - p->freed) {
        err += n + ": current != allocated - freed; ";
      }
    }
  };
  using p = caching_pool_stats;
  check("allocated_bytes", s.allocated_bytes, &p::allocated_bytes, true);
  check("requested_bytes", s.requested_bytes, &p::requested_bytes, true);
  check("reserved_bytes", s.reserved_bytes, &p::reserved_bytes, true);
  check("active_bytes", s.active_bytes, &p::active_bytes, true);
  check("inactive_split_bytes", s.inactive_split_bytes, &p::inactive_split_bytes, false);
  check("allocation_count", s.allocation_count, &p::allocation_count, true);
  check("segment_count", s.segment_count, &p::segment_count, true);
  check("active_count", s.active_count, &p::active_count, true);
  check("inactive_split_count", s.inactive_split_count, &p::inactive_split_count, false);
  if (static_cast<std::int64_t>(s.num_allocs) !=
        s.small_pool.allocation_count.allocated + s.large_pool.allocation_count.allocated ||
      static_cast<std::int64_t>(s.num_frees) !=
        s.small_pool.allocation_count.freed + s.large_pool.allocation_count.freed) {
    err += "num_allocs or num_frees != the pools' allocation totals; ";
  }
  return err;
}

/// Checks the invariants of `allocator` (see the top of this file). Takes the pool lock. Returns
/// an empty string when they hold, else what is wrong.
template <class Runtime>
[[nodiscard]] std::string check_invariants(basic_caching_allocator<Runtime> const& allocator)
{
  return allocator_invariants<Runtime>::check(allocator) + check_stats(allocator.stats());
}

}  // namespace gpukit::detail
