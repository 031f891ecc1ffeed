// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/allocator_stats.hpp: the caching allocator's statistics at the pool
// level, for stats() and reset_peak(). Not public API.
//
// Owns the pool-level caching_allocator_stats: the reserved bytes and segments per pool kind (and
// so the segment count of the whole allocator), the event counters (device allocations and frees,
// pages, retries, out-of-memory recovery, ...), and the peaks and current values that stats()
// computes from the per-thread counters. Invariants: a peak is never below its current value; the
// reserved and segment peaks are raised where segments are counted (count_segment,
// raise_reserved_peak), the others by the operation that makes them (the thread caches' and the
// shared counters, which this class folds in when read); each pool's current reserved bytes and
// segments are its totals added less its totals taken.
//
// Single-threaded: the allocator holds its pool lock around every call. What the fast path writes
// without the lock stays outside: each thread cache's own counters (the caches are passed in), and
// the allocator's detail::pending_counts and detail::shared_counts (atomics, which this class is
// given by reference and reads or writes only where the allocator holds its lock; the fast path
// joins the shared counts through the static join_shared_counts, and folds into them itself).
#pragma once

#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/shared_counts.hpp>
#include <gpukit/stats.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gpukit::detail::caching {

/// The allocator's pool-level statistics; see the top of this file. `Block` is the allocator's
/// block descriptor (detail::caching_block), read when the blocks are scanned.
template <class Block>
class allocator_stats {
 public:
  /// What stats() finds by walking the blocks, per pool kind (0 small, 1 large): blocks whose
  /// frees wait on other streams' work (still active), and free blocks inside split segments.
  struct scanned_blocks {
    std::array<std::int64_t, 2> pending_bytes{}, pending_count{}, split_bytes{}, split_count{};
  };

  /// Counters over `shared` (once a second thread is in) and `pending` (frees waiting on other
  /// streams), both the allocator's and both outliving this object.
  allocator_stats(shared_counts& shared, pending_counts const& pending) noexcept
      : shared_{shared}, pending_{pending}
  {}
  ~allocator_stats()                                 = default;
  allocator_stats(allocator_stats const&)            = delete;
  allocator_stats& operator=(allocator_stats const&) = delete;
  allocator_stats(allocator_stats&&)                 = delete;
  allocator_stats& operator=(allocator_stats&&)      = delete;

  // ---- Counted where segments and pages are taken and given back ------------------------------

  /// `delta` bytes of pool `kind` reserved (> 0) or given back (< 0). The peak is raised by
  /// count_segment or raise_reserved_peak, once the whole change is counted.
  void count_reserved(int kind, std::int64_t delta) noexcept
  {
    stat_totals& r = pool(kind).reserved_bytes;
    r.current += delta;
    (delta > 0 ? r.allocated : r.freed) += delta > 0 ? delta : -delta;
  }
  /// `delta` segments of pool `kind` taken (> 0) or given back (< 0); raises the reserved and
  /// segment peaks.
  void count_segment(int kind, int delta) noexcept
  {
    stat_totals& s = pool(kind).segment_count;
    s.current += delta;
    (delta > 0 ? s.allocated : s.freed) += delta > 0 ? delta : -delta;
    raise_reserved_peak();
  }
  /// Raises the reserved and segment peaks (whole allocator and per pool kind) to their current
  /// values.
  void raise_reserved_peak() noexcept
  {
    auto raise                   = [](auto& s, std::int64_t v) { s.peak = std::max(s.peak, v); };
    caching_pool_stats const &sm = stats_.small_pool, &lg = stats_.large_pool;
    raise(stats_.reserved_bytes, sm.reserved_bytes.current + lg.reserved_bytes.current);
    raise(stats_.segment_count, static_cast<std::int64_t>(segments()));
    for (caching_pool_stats* p : {&stats_.small_pool, &stats_.large_pool}) {
      raise(p->reserved_bytes, p->reserved_bytes.current);
      raise(p->segment_count, p->segment_count.current);
    }
  }
  /// Adds `n` to one of the event counters, which only grow (num_device_allocs, num_ooms, ...).
  void count(std::uint64_t caching_allocator_stats::*counter, std::uint64_t n = 1) noexcept
  {
    stats_.*counter += n;
  }
  /// The out-of-memory ladder ran step `step` (see recovery_step_names), which made `reclaimed`
  /// bytes available.
  void count_recovery_step(std::size_t step, std::size_t reclaimed) noexcept
  {
    ++stats_.num_recovery_steps[step];
    stats_.recovery_bytes[step] += reclaimed;
  }

  /// Segments held, of both pool kinds.
  [[nodiscard]] std::size_t segments() const noexcept
  {
    return static_cast<std::size_t>(stats_.small_pool.segment_count.current +
                                    stats_.large_pool.segment_count.current);
  }
  /// The statistics of pool `kind` (0 small, 1 large) as last computed.
  [[nodiscard]] caching_pool_stats const& pool_stats(int kind) const noexcept
  {
    return kind == 0 ? stats_.small_pool : stats_.large_pool;
  }

  // ---- Read: the thread caches' counters folded in --------------------------------------------

  /// The blocks `stats()` scans: the pending frees (`pending`, each with its block in `b`), and the
  /// free indices of the stream pools (`stream_pools`, each with an `index` per pool kind) and of
  /// the global pool (`globals`).
  template <class Pending, class StreamPools, class Globals>
  [[nodiscard]] static scanned_blocks scan(Pending const& pending, StreamPools const& stream_pools,
                                           Globals const& globals)
  {
    scanned_blocks s;
    for (auto const& p : pending) {
      s.pending_bytes[static_cast<std::size_t>(p.b->kind)] += static_cast<std::int64_t>(p.b->size);
      ++s.pending_count[static_cast<std::size_t>(p.b->kind)];
    }
    auto split = [&](Block* b) {
      if (b->prev != nullptr || b->next != nullptr) {
        s.split_bytes[static_cast<std::size_t>(b->kind)] += static_cast<std::int64_t>(b->size);
        ++s.split_count[static_cast<std::size_t>(b->kind)];
      }
    };
    for (auto const& sp : stream_pools) {
      for (auto const& idx : sp->index) { idx.for_each(split); }
    }
    for (auto const& idx : globals) { idx.for_each(split); }
    return s;
  }

  /// The current values of the flows (allocated, requested, allocations) summed over the thread
  /// `caches`, the reserved and segment ones, and the peaks the operations raised. Returns the
  /// statistics (the active and inactive ones as last scanned).
  template <class Caches>
  caching_allocator_stats const& update_peaks(Caches const& caches)
  {
    // Peaks are raised by the allocation that makes them: while one thread uses the allocator,
    // its own peaks are the allocator's; from the second thread on, the shared counts are.
    std::array<sums, 3> k{};  // small, large, both (peaks only)
    for (auto const& c : caches) { add_cache(k, *c); }
    if (shared_.on.load(std::memory_order_relaxed)) {
      for (std::size_t i = 0; i < 3; ++i) {
        k[i].peak_bytes     = shared_.peak_bytes[i].load(std::memory_order_relaxed);
        k[i].peak_requested = shared_.peak_requested[i].load(std::memory_order_relaxed);
        k[i].peak_count     = shared_.peak_count[i].load(std::memory_order_relaxed);
      }
    }
    for (std::size_t i = 0; i < 2; ++i) {
      caching_pool_stats& p = pool(static_cast<int>(i));
      set_flow(p.allocated_bytes, k[i].bytes_in, k[i].bytes_out, k[i].peak_bytes);
      set_flow(p.requested_bytes, k[i].requested_in, k[i].requested_out, k[i].peak_requested);
      set_flow(p.allocation_count, k[i].allocs, k[i].frees, k[i].peak_count);
      set_current(p.reserved_bytes, p.reserved_bytes.current);
      set_current(p.segment_count, p.segment_count.current);
    }
    caching_pool_stats const &s = stats_.small_pool, &l = stats_.large_pool;
    set_current(stats_.allocated_bytes, s.allocated_bytes.current + l.allocated_bytes.current,
                k[2].peak_bytes);
    set_current(stats_.requested_bytes, s.requested_bytes.current + l.requested_bytes.current,
                k[2].peak_requested);
    set_current(stats_.allocation_count, s.allocation_count.current + l.allocation_count.current,
                k[2].peak_count);
    set_current(stats_.reserved_bytes, s.reserved_bytes.current + l.reserved_bytes.current);
    set_current(stats_.segment_count, static_cast<std::int64_t>(segments()));
    return stats_;
  }

  /// The statistics found by scanning the blocks (`scanned`): active (handed out, less the frees
  /// that have completed) and inactive split, with their peaks (see peak_active).
  template <class Caches>
  void update_scanned(Caches const& caches, scanned_blocks const& scanned)
  {
    active_peaks const peaks = peak_active(caches);
    for (std::size_t i = 0; i < 2; ++i) {
      caching_pool_stats& p = pool(static_cast<int>(i));
      // Pending frees are still active.
      set_flow(p.active_bytes, p.allocated_bytes.allocated,
               p.allocated_bytes.freed - scanned.pending_bytes[i], peaks.bytes[i]);
      set_flow(p.active_count, p.allocation_count.allocated,
               p.allocation_count.freed - scanned.pending_count[i], peaks.count[i]);
      set_current(p.inactive_split_bytes, scanned.split_bytes[i]);
      set_current(p.inactive_split_count, scanned.split_count[i]);
    }
    caching_pool_stats const &sm = stats_.small_pool, &lg = stats_.large_pool;
    auto sum = [](stat_totals const& a, stat_totals const& b) { return a.current + b.current; };
    set_current(stats_.active_bytes, sum(sm.active_bytes, lg.active_bytes), peaks.bytes[2]);
    set_current(stats_.active_count, sum(sm.active_count, lg.active_count), peaks.count[2]);
    set_current(stats_.inactive_split_bytes, sum(sm.inactive_split_bytes, lg.inactive_split_bytes));
    set_current(stats_.inactive_split_count, sum(sm.inactive_split_count, lg.inactive_split_count));
  }

  /// Every statistic, as stats() returns it: update_peaks and update_scanned, then the totals of
  /// calls and the thread caches' cached bytes and hits.
  template <class Caches>
  [[nodiscard]] caching_allocator_stats read(Caches const& caches, scanned_blocks const& scanned)
  {
    update_peaks(caches);
    update_scanned(caches, scanned);
    caching_pool_stats const &sm = stats_.small_pool, &lg = stats_.large_pool;
    caching_allocator_stats s = stats_;
    s.num_allocs =
      static_cast<std::uint64_t>(sm.allocation_count.allocated + lg.allocation_count.allocated);
    s.num_frees = static_cast<std::uint64_t>(sm.allocation_count.freed + lg.allocation_count.freed);
    for (auto const& c : caches) {
      s.cached_bytes += c->cached_bytes.get();
      s.num_cache_hits += static_cast<std::uint64_t>(c->num_cache_hits.get());
    }
    return s;
  }

  /// Sets every peak to its current value: this object's, the thread `caches`' and, once they are
  /// on, the shared counts'.
  template <class Caches>
  void reset_peak(Caches const& caches, scanned_blocks const& scanned)
  {
    update_peaks(caches);
    update_scanned(caches, scanned);
    for (auto const& c : caches) { reset_cache_peaks(*c); }
    if (shared_.on.load(std::memory_order_relaxed)) { store_shared_peaks(true); }
    auto reset_pool = [](caching_pool_stats& p) {
      for (stat_totals* t : {&p.allocated_bytes, &p.requested_bytes, &p.reserved_bytes,
                             &p.active_bytes, &p.inactive_split_bytes, &p.allocation_count,
                             &p.segment_count, &p.active_count, &p.inactive_split_count}) {
        t->peak = t->current;
      }
    };
    reset_pool(stats_.small_pool);
    reset_pool(stats_.large_pool);
    for (stat_pair* p :
         {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes,
          &stats_.active_bytes, &stats_.inactive_split_bytes, &stats_.allocation_count,
          &stats_.segment_count, &stats_.active_count, &stats_.inactive_split_count}) {
      p->peak = p->current;
    }
  }

  /// A second thread is in: from now on every allocation and free also counts in the shared
  /// counts, which start from the sums over the thread `caches`' counters and the peaks so far.
  template <class Caches>
  void share_counts(Caches const& caches, scanned_blocks const& scanned)
  {
    update_peaks(caches);
    update_scanned(caches, scanned);
    // Each cache's counts as seen now wait in the unjoined sums until its thread's next operation
    // puts its own in (join_shared_counts): an operation racing this switch is then not lost.
    for (std::size_t i = 0; i < 2; ++i) {
      std::int64_t b = 0, r = 0, c = 0;
      for (auto const& tc : caches) {
        tc->join_bytes[i]     = tc->pools[i].bytes();
        tc->join_requested[i] = tc->pools[i].requested();
        tc->join_count[i]     = tc->pools[i].count();
        b += tc->join_bytes[i];
        r += tc->join_requested[i];
        c += tc->join_count[i];
      }
      shared_.unjoined_bytes[i].store(b, std::memory_order_relaxed);
      shared_.unjoined_requested[i].store(r, std::memory_order_relaxed);
      shared_.unjoined_count[i].store(c, std::memory_order_relaxed);
    }
    store_shared_peaks(false);
    shared_.on.store(true, std::memory_order_release);
  }

  /// The first operation of thread cache `tc` since the shared counts were switched on: its counts
  /// enter `shared` now (folded whole: its delta starts at 0), replacing the ones the switch saw
  /// (which an operation of its thread racing the switch may have missed), taken out of the
  /// unjoined sums first so that no instant counts them twice. Static and lock-free: the fast path
  /// calls it without the pool lock, once per thread; out of line, to keep it off the inlined fast
  /// path.
  template <class Cache>
  __attribute__((noinline)) static void join_shared_counts(shared_counts& shared, Cache& tc,
                                                           pending_counts const& pending) noexcept
  {
    // Reads the switch (set once, with release) again with acquire: the snapshot of this cache the
    // switch wrote before it is visible now. (Not a fence: ThreadSanitizer does not model those.)
    (void)shared.on.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < 2; ++i) {
      shared.unjoined_bytes[i].fetch_sub(tc.join_bytes[i], std::memory_order_relaxed);
      shared.unjoined_requested[i].fetch_sub(tc.join_requested[i], std::memory_order_relaxed);
      shared.unjoined_count[i].fetch_sub(tc.join_count[i], std::memory_order_relaxed);
      tc.folded[i] = kind_counts{};
      shared.fold(static_cast<int>(i), tc.pools[i].net(), tc.folded[i], shared_counts::none,
                  pending);
    }
    tc.joined = true;
  }

  /// Thread cache `tc`'s thread exits while the shared counts are on: it joins them if it has not
  /// yet, and folds its whole delta, so that none waits in a cache no thread runs.
  template <class Cache>
  static void fold_exiting(shared_counts& shared, Cache& tc, pending_counts const& pending) noexcept
  {
    if (!tc.joined) {
      join_shared_counts(shared, tc, pending);  // leaves no delta
      return;
    }
    for (std::size_t i = 0; i < 2; ++i) {
      shared.fold(static_cast<int>(i), tc.pools[i].net(), tc.folded[i], shared_counts::none,
                  pending);
    }
  }

 private:
  /// Sums over the thread caches of one pool kind (or, for the peaks only, of both).
  struct sums {
    std::int64_t bytes_in{0}, bytes_out{0}, requested_in{0}, requested_out{0}, allocs{0}, frees{0};
    std::int64_t peak_bytes{0}, peak_requested{0}, peak_count{0};
  };
  /// Active peaks per pool kind (0 small, 1 large) and in total (2).
  struct active_peaks {
    std::array<std::int64_t, 3> bytes{};
    std::array<std::int64_t, 3> count{};
  };

  /// `current` now `v`; the peak the highest of itself, `v` and `floor` (stat_pair, stat_totals).
  template <class Stat>
  static void set_current(Stat& s, std::int64_t v, std::int64_t floor = 0) noexcept
  {
    s.current = v;
    s.peak    = std::max({s.peak, v, floor});
  }
  /// A statistic whose totals are `in` and `out`: current is their difference.
  static void set_flow(stat_totals& s, std::int64_t in, std::int64_t out,
                       std::int64_t floor) noexcept
  {
    s.allocated = in;
    s.freed     = out;
    set_current(s, in - out, floor);
  }

  caching_pool_stats& pool(int kind) noexcept
  {
    return kind == 0 ? stats_.small_pool : stats_.large_pool;
  }

  /// Adds thread cache `c`'s flows to `k` and raises `k`'s peaks to its own.
  template <class Cache>
  static void add_cache(std::array<sums, 3>& k, Cache const& c) noexcept
  {
    auto top = [](std::int64_t& m, auto const& counter) { m = std::max(m, counter.get()); };
    for (std::size_t i = 0; i < 2; ++i) {
      auto const& f = c.pools[i];
      k[i].bytes_in += f.bytes_in.get();
      k[i].bytes_out += f.bytes_out.get();
      k[i].requested_in += f.requested_in.get();
      k[i].requested_out += f.requested_out.get();
      k[i].allocs += f.allocs.get();
      k[i].frees += f.frees.get();
      top(k[i].peak_bytes, f.peak_bytes);
      top(k[i].peak_requested, f.peak_requested);
      top(k[i].peak_count, f.peak_count);
    }
    top(k[2].peak_bytes, c.peak_bytes);
    top(k[2].peak_requested, c.peak_requested);
    top(k[2].peak_count, c.peak_count);
  }

  /// The active peaks, raised by the allocations that made them (as in update_peaks): the shared
  /// counters' once two threads are in, else the highest of the threads'; at least the allocated
  /// peaks (while no free is pending, active is allocated).
  template <class Caches>
  active_peaks peak_active(Caches const& caches) const noexcept
  {
    active_peaks peaks;
    if (shared_.on.load(std::memory_order_relaxed)) {
      for (std::size_t i = 0; i < 3; ++i) {
        peaks.bytes[i] = shared_.peak_active_bytes[i].load(std::memory_order_relaxed);
        peaks.count[i] = shared_.peak_active_count[i].load(std::memory_order_relaxed);
      }
    } else {
      for (auto const& c : caches) {
        for (std::size_t i = 0; i < 2; ++i) {
          peaks.bytes[i] = std::max(peaks.bytes[i], c->pools[i].peak_active_bytes.get());
          peaks.count[i] = std::max(peaks.count[i], c->pools[i].peak_active_count.get());
        }
        peaks.bytes[2] = std::max(peaks.bytes[2], c->peak_active_bytes.get());
        peaks.count[2] = std::max(peaks.count[2], c->peak_active_count.get());
      }
    }
    for (std::size_t i = 0; i < 2; ++i) {
      caching_pool_stats const& p = pool_stats(static_cast<int>(i));
      peaks.bytes[i]              = std::max(peaks.bytes[i], p.allocated_bytes.peak);
      peaks.count[i]              = std::max(peaks.count[i], p.allocation_count.peak);
    }
    peaks.bytes[2] = std::max(peaks.bytes[2], stats_.allocated_bytes.peak);
    peaks.count[2] = std::max(peaks.count[2], stats_.allocation_count.peak);
    return peaks;
  }

  /// Sets thread cache `c`'s peaks to its current values (its owner writes them too: a relaxed
  /// store races benignly), the active ones with the frees pending now.
  template <class Cache>
  void reset_cache_peaks(Cache& c) const noexcept
  {
    auto reset = [](auto& peak, std::int64_t v) { peak.v.store(v, std::memory_order_relaxed); };
    for (auto& f : c.pools) {
      reset(f.peak_bytes, f.bytes());
      reset(f.peak_requested, f.requested());
      reset(f.peak_count, f.count());
    }
    reset(c.peak_bytes, c.pools[0].bytes() + c.pools[1].bytes());
    reset(c.peak_requested, c.pools[0].requested() + c.pools[1].requested());
    reset(c.peak_count, c.pools[0].count() + c.pools[1].count());
    for (std::size_t i = 0; i < 2; ++i) {
      auto& f = c.pools[i];
      reset(f.peak_active_bytes, f.bytes() + pending_.bytes[i].load(std::memory_order_relaxed));
      reset(f.peak_active_count, f.count() + pending_.count[i].load(std::memory_order_relaxed));
    }
    reset(c.peak_active_bytes,
          c.pools[0].peak_active_bytes.get() + c.pools[1].peak_active_bytes.get());
    reset(c.peak_active_count,
          c.pools[0].peak_active_count.get() + c.pools[1].peak_active_count.get());
  }

  /// The shared peaks from the statistics (just updated by the caller): their peaks when the shared
  /// counts start, their current values when reset_peak sets every peak to its current value.
  void store_shared_peaks(bool from_current) noexcept
  {
    auto store = [&](std::size_t i, auto const& bytes, auto const& requested, auto const& count,
                     auto const& active_bytes, auto const& active_count) {
      auto v = [&](auto const& stat) { return from_current ? stat.current : stat.peak; };
      shared_.peak_bytes[i].store(v(bytes), std::memory_order_relaxed);
      shared_.peak_requested[i].store(v(requested), std::memory_order_relaxed);
      shared_.peak_count[i].store(v(count), std::memory_order_relaxed);
      shared_.peak_active_bytes[i].store(v(active_bytes), std::memory_order_relaxed);
      shared_.peak_active_count[i].store(v(active_count), std::memory_order_relaxed);
    };
    auto store_pool = [&](std::size_t i, caching_pool_stats const& p) {
      store(i, p.allocated_bytes, p.requested_bytes, p.allocation_count, p.active_bytes,
            p.active_count);
    };
    store_pool(0, stats_.small_pool);
    store_pool(1, stats_.large_pool);
    store(2, stats_.allocated_bytes, stats_.requested_bytes, stats_.allocation_count,
          stats_.active_bytes, stats_.active_count);
  }

  caching_allocator_stats stats_{};  // the pool-level statistics, as last computed
  shared_counts& shared_;            // the allocator's, written by the fast path once shared
  pending_counts const& pending_;    // the allocator's, written under its lock
};

}  // namespace gpukit::detail::caching
