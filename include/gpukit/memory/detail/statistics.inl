// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/statistics.inl: stats() and its peaks. Counters of the fast path live in
// each thread's cache (one writer each, per pool kind) and are summed when read; pool-level
// counters (reserved bytes and segments, per pool kind) live in stats_ under the pool lock. Not
// public API; included by caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <array>
#include <mutex>

namespace gpukit {

namespace detail {

/// `current` now `v`; the peak the highest of itself, `v` and `floor` (for stat_pair and
/// stat_totals).
template <class Stat>
void set_current(Stat& s, std::int64_t v, std::int64_t floor = 0) noexcept
{
  s.current = v;
  s.peak    = std::max({s.peak, v, floor});
}

/// A statistic whose totals are `in` and `out`: current is their difference.
inline void set_flow(stat_totals& s, std::int64_t in, std::int64_t out, std::int64_t floor) noexcept
{
  s.allocated = in;
  s.freed     = out;
  set_current(s, in - out, floor);
}

}  // namespace detail

template <class Runtime>
caching_pool_stats& basic_caching_allocator<Runtime>::pool_stats(int kind) const noexcept
{
  return kind == small_pool ? stats_.small_pool : stats_.large_pool;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::update_peaks() const
{
  // Current values are the sums over threads. Peaks are raised by the allocation that makes
  // them: while one thread uses the allocator, its own peaks are the allocator's; from the second
  // thread on, the shared counts (detail::shared_counts) are. Reserved and segment peaks are
  // raised where segments are taken.
  struct sums {
    std::int64_t bytes_in{0}, bytes_out{0}, requested_in{0}, requested_out{0}, allocs{0}, frees{0};
    std::int64_t peak_bytes{0}, peak_requested{0}, peak_count{0};
  };
  std::array<sums, 3> k{};  // small, large, both (peaks only)
  auto top = [](std::int64_t& m, auto const& c) { m = std::max(m, c.get()); };
  for (auto const& c : threads_.caches) {
    for (std::size_t i = 0; i < 2; ++i) {
      auto const& f = c->pools[i];
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
    top(k[2].peak_bytes, c->peak_bytes);
    top(k[2].peak_requested, c->peak_requested);
    top(k[2].peak_count, c->peak_count);
  }
  if (shared_.on.load(std::memory_order_relaxed)) {
    for (std::size_t i = 0; i < 3; ++i) {
      k[i].peak_bytes     = shared_.peak_bytes[i].load(std::memory_order_relaxed);
      k[i].peak_requested = shared_.peak_requested[i].load(std::memory_order_relaxed);
      k[i].peak_count     = shared_.peak_count[i].load(std::memory_order_relaxed);
    }
  }
  for (std::size_t i = 0; i < 2; ++i) {
    caching_pool_stats& p = pool_stats(static_cast<int>(i));
    detail::set_flow(p.allocated_bytes, k[i].bytes_in, k[i].bytes_out, k[i].peak_bytes);
    detail::set_flow(p.requested_bytes, k[i].requested_in, k[i].requested_out, k[i].peak_requested);
    detail::set_flow(p.allocation_count, k[i].allocs, k[i].frees, k[i].peak_count);
    detail::set_current(p.reserved_bytes, p.reserved_bytes.current);
    detail::set_current(p.segment_count, p.segment_count.current);
  }
  caching_pool_stats const &s = stats_.small_pool, &l = stats_.large_pool;
  detail::set_current(stats_.allocated_bytes, s.allocated_bytes.current + l.allocated_bytes.current,
                      k[2].peak_bytes);
  detail::set_current(stats_.requested_bytes, s.requested_bytes.current + l.requested_bytes.current,
                      k[2].peak_requested);
  detail::set_current(stats_.allocation_count,
                      s.allocation_count.current + l.allocation_count.current, k[2].peak_count);
  detail::set_current(stats_.reserved_bytes, static_cast<std::int64_t>(pool_.reserved));
  detail::set_current(stats_.segment_count, static_cast<std::int64_t>(pool_.segments));
}

/// Active peaks per pool kind (0 small, 1 large) and in total (2).
template <class Runtime>
struct basic_caching_allocator<Runtime>::active_peaks {
  std::array<std::int64_t, 3> bytes{};
  std::array<std::int64_t, 3> count{};
};

// The active peaks, raised by the allocations that made them (as in update_peaks): the shared
// counters' once two threads are in, else the highest of the threads'; at least the allocated
// peaks (while no free is pending, active is allocated).
template <class Runtime>
typename basic_caching_allocator<Runtime>::active_peaks
basic_caching_allocator<Runtime>::peak_active() const
{
  active_peaks peaks;
  auto& peak_active_bytes = peaks.bytes;
  auto& peak_active_count = peaks.count;
  if (shared_.on.load(std::memory_order_relaxed)) {
    for (std::size_t i = 0; i < 3; ++i) {
      peak_active_bytes[i] = shared_.peak_active_bytes[i].load(std::memory_order_relaxed);
      peak_active_count[i] = shared_.peak_active_count[i].load(std::memory_order_relaxed);
    }
  } else {
    for (auto const& c : threads_.caches) {
      for (std::size_t i = 0; i < 2; ++i) {
        peak_active_bytes[i] = std::max(peak_active_bytes[i], c->pools[i].peak_active_bytes.get());
        peak_active_count[i] = std::max(peak_active_count[i], c->pools[i].peak_active_count.get());
      }
      peak_active_bytes[2] = std::max(peak_active_bytes[2], c->peak_active_bytes.get());
      peak_active_count[2] = std::max(peak_active_count[2], c->peak_active_count.get());
    }
  }
  // While no free is pending, active is allocated: its peak is at least the allocated one.
  for (std::size_t i = 0; i < 2; ++i) {
    caching_pool_stats const& p = pool_stats(static_cast<int>(i));
    peak_active_bytes[i]        = std::max(peak_active_bytes[i], p.allocated_bytes.peak);
    peak_active_count[i]        = std::max(peak_active_count[i], p.allocation_count.peak);
  }
  peak_active_bytes[2] = std::max(peak_active_bytes[2], stats_.allocated_bytes.peak);
  peak_active_count[2] = std::max(peak_active_count[2], stats_.allocation_count.peak);
  return peaks;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::update_scanned() const
{
  // Per pool kind: blocks waiting on other streams' work, and free blocks of split segments.
  std::array<std::int64_t, 2> pending_bytes{}, pending_count{}, split_bytes{}, split_count{};
  for (auto const& p : streams_.pending()) {
    pending_bytes[static_cast<std::size_t>(p.b->kind)] += static_cast<std::int64_t>(p.b->size);
    ++pending_count[static_cast<std::size_t>(p.b->kind)];
  }
  auto split = [&](block* b) {
    if (b->prev != nullptr || b->next != nullptr) {
      split_bytes[static_cast<std::size_t>(b->kind)] += static_cast<std::int64_t>(b->size);
      ++split_count[static_cast<std::size_t>(b->kind)];
    }
  };
  for (auto const& sp : streams_.pools()) {
    for (auto const& idx : sp->index) { idx.for_each(split); }
  }
  for (auto const& idx : blocks_.globals()) { idx.for_each(split); }
  active_peaks const peaks      = peak_active();
  auto const& peak_active_bytes = peaks.bytes;
  auto const& peak_active_count = peaks.count;
  for (std::size_t i = 0; i < 2; ++i) {
    caching_pool_stats& p = pool_stats(static_cast<int>(i));
    // Active: handed out, less the frees that have completed (pending frees are still active).
    detail::set_flow(p.active_bytes, p.allocated_bytes.allocated,
                     p.allocated_bytes.freed - pending_bytes[i], peak_active_bytes[i]);
    detail::set_flow(p.active_count, p.allocation_count.allocated,
                     p.allocation_count.freed - pending_count[i], peak_active_count[i]);
    detail::set_current(p.inactive_split_bytes, split_bytes[i]);
    detail::set_current(p.inactive_split_count, split_count[i]);
  }
  caching_pool_stats const &sm = stats_.small_pool, &lg = stats_.large_pool;
  auto sum = [](stat_totals const& a, stat_totals const& b) { return a.current + b.current; };
  detail::set_current(stats_.active_bytes, sum(sm.active_bytes, lg.active_bytes),
                      peak_active_bytes[2]);
  detail::set_current(stats_.active_count, sum(sm.active_count, lg.active_count),
                      peak_active_count[2]);
  detail::set_current(stats_.inactive_split_bytes,
                      sum(sm.inactive_split_bytes, lg.inactive_split_bytes));
  detail::set_current(stats_.inactive_split_count,
                      sum(sm.inactive_split_count, lg.inactive_split_count));
}

// A second thread is in: from now on every allocation and free also counts in shared_, which
// starts from the sums over the threads' counters and the peaks so far.
template <class Runtime>
void basic_caching_allocator<Runtime>::share_counts()
{
  update_peaks();
  update_scanned();
  // Each cache's counts as seen now wait in the unjoined sums until its thread's next operation
  // puts its own in (join_shared_counts): an operation racing this switch is then not lost.
  for (std::size_t i = 0; i < 2; ++i) {
    std::int64_t b = 0, r = 0, c = 0;
    for (auto const& tc : threads_.caches) {
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

// The shared peaks from stats_ (just updated by the caller): its peaks when the shared counts
// start, its current values when reset_peak sets every peak to its current value.
template <class Runtime>
void basic_caching_allocator<Runtime>::store_shared_peaks(bool from_current)
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

template <class Runtime>
caching_allocator_stats basic_caching_allocator<Runtime>::stats() const
{
  detail::pool_lock lock{mutex_};
  update_peaks();
  update_scanned();
  caching_pool_stats const &sm = stats_.small_pool, &lg = stats_.large_pool;
  caching_allocator_stats s = stats_;
  s.num_allocs =
    static_cast<std::uint64_t>(sm.allocation_count.allocated + lg.allocation_count.allocated);
  s.num_frees = static_cast<std::uint64_t>(sm.allocation_count.freed + lg.allocation_count.freed);
  for (auto const& c : threads_.caches) {
    s.cached_bytes += c->cached_bytes.get();
    s.num_cache_hits += static_cast<std::uint64_t>(c->num_cache_hits.get());
  }
  return s;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::reset_peak()
{
  detail::pool_lock lock{mutex_};
  update_peaks();
  update_scanned();
  for (auto& c : threads_.caches) {  // the owners write these too: a relaxed store races benignly
    auto reset = [](auto& peak, std::int64_t v) { peak.v.store(v, std::memory_order_relaxed); };
    for (auto& f : c->pools) {
      reset(f.peak_bytes, f.bytes());
      reset(f.peak_requested, f.requested());
      reset(f.peak_count, f.count());
    }
    reset(c->peak_bytes, c->pools[0].bytes() + c->pools[1].bytes());
    reset(c->peak_requested, c->pools[0].requested() + c->pools[1].requested());
    reset(c->peak_count, c->pools[0].count() + c->pools[1].count());
    for (std::size_t i = 0; i < 2; ++i) {
      auto& f = c->pools[i];
      reset(f.peak_active_bytes, f.bytes() + pending_.bytes[i].load(std::memory_order_relaxed));
      reset(f.peak_active_count, f.count() + pending_.count[i].load(std::memory_order_relaxed));
    }
    reset(c->peak_active_bytes,
          c->pools[0].peak_active_bytes.get() + c->pools[1].peak_active_bytes.get());
    reset(c->peak_active_count,
          c->pools[0].peak_active_count.get() + c->pools[1].peak_active_count.get());
  }
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
  for (stat_pair* p : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes,
                       &stats_.active_bytes, &stats_.inactive_split_bytes, &stats_.allocation_count,
                       &stats_.segment_count, &stats_.active_count, &stats_.inactive_split_count}) {
    p->peak = p->current;
  }
}

template <class Runtime>
void basic_caching_allocator<Runtime>::count_reserved(int kind, std::int64_t delta) noexcept
{
  stat_totals& r = pool_stats(kind).reserved_bytes;
  r.current += delta;
  (delta > 0 ? r.allocated : r.freed) += delta > 0 ? delta : -delta;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::count_segment(int kind, int delta) noexcept
{
  pool_.segments = static_cast<std::size_t>(static_cast<std::int64_t>(pool_.segments) + delta);
  stat_totals& s = pool_stats(kind).segment_count;
  s.current += delta;
  (delta > 0 ? s.allocated : s.freed) += delta > 0 ? delta : -delta;
  raise_reserved_peak();
}

template <class Runtime>
void basic_caching_allocator<Runtime>::raise_reserved_peak() noexcept
{
  auto raise = [](auto& s, std::int64_t v) { s.peak = std::max(s.peak, v); };
  raise(stats_.reserved_bytes, static_cast<std::int64_t>(pool_.reserved));
  raise(stats_.segment_count, static_cast<std::int64_t>(pool_.segments));
  for (caching_pool_stats* p : {&stats_.small_pool, &stats_.large_pool}) {
    raise(p->reserved_bytes, p->reserved_bytes.current);
    raise(p->segment_count, p->segment_count.current);
  }
}

}  // namespace gpukit
