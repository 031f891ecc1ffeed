// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/statistics.inl: stats() and its peaks. Counters of the fast path live in
// each thread's cache (one writer each) and are summed when read; pool-level counters live in
// stats_ under the pool lock. Not public API; included by caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <mutex>

namespace gpukit {

template <class Runtime>
void basic_caching_allocator<Runtime>::update_peaks_locked() const
{
  // Current values are the sums over threads. A peak is the highest of: the sums seen here (when
  // statistics are read, on every allocation that takes the pool lock, at out-of-memory and
  // reset_peak) and, while every block has been freed by the thread that allocated it, each
  // thread's own peak (exact when a single thread allocates, a lower bound otherwise). Once a
  // block is freed by another thread (as PyTorch's autograd threads do), a thread's own count can
  // exceed the total, so its peak is no longer used. Reserved and segment peaks are exact: they
  // are raised where segments are taken.
  std::int64_t allocated = 0, requested = 0, count = 0;
  std::int64_t allocated_peak = 0, requested_peak = 0, count_peak = 0;
  for (auto const& c : threads_.caches) {
    allocated += c->allocated_bytes.get();
    requested += c->requested_bytes.get();
    count += c->allocation_count.get();
    allocated_peak = std::max(allocated_peak, c->allocated_bytes.peak.get());
    requested_peak = std::max(requested_peak, c->requested_bytes.peak.get());
    count_peak     = std::max(count_peak, c->allocation_count.peak.get());
  }
  auto bump = [](stat_pair& s, std::int64_t v, std::int64_t thread_peak = 0) {
    s.current = v;
    s.peak    = std::max({s.peak, v, thread_peak});
  };
  if (threads_.freed_across) { allocated_peak = requested_peak = count_peak = 0; }
  bump(stats_.allocated_bytes, allocated, allocated_peak);
  bump(stats_.requested_bytes, requested, requested_peak);
  bump(stats_.allocation_count, count, count_peak);
  bump(stats_.reserved_bytes, static_cast<std::int64_t>(pool_.reserved));
  bump(stats_.segment_count, static_cast<std::int64_t>(pool_.segments));
}

template <class Runtime>
caching_allocator_stats basic_caching_allocator<Runtime>::stats() const
{
  std::lock_guard<std::mutex> lock{mutex_};
  update_peaks_locked();
  caching_allocator_stats s  = stats_;
  std::int64_t pending_bytes = 0, pending_count = 0, split_bytes = 0, split_count = 0;
  for (auto const& p : streams_.pending) {
    pending_bytes += static_cast<std::int64_t>(p.b->size);
    ++pending_count;
  }
  auto split = [&](block* b) {
    if (b->prev != nullptr || b->next != nullptr) {
      split_bytes += static_cast<std::int64_t>(b->size);
      ++split_count;
    }
  };
  for (auto const& sp : streams_.pools) {
    for (auto const& idx : sp->index) { idx.for_each(split); }
  }
  for (auto const& idx : pool_.global) { idx.for_each(split); }
  for (auto const& c : threads_.caches) {
    s.cached_bytes += c->cached_bytes.get();
    s.num_allocs += static_cast<std::uint64_t>(c->num_allocs.get());
    s.num_frees += static_cast<std::uint64_t>(c->num_frees.get());
    s.num_cache_hits += static_cast<std::uint64_t>(c->num_cache_hits.get());
  }
  auto bump = [](stat_pair& st, stat_pair& keep, std::int64_t v) {
    st.current = v;
    keep.peak  = std::max(keep.peak, v);
    st.peak    = keep.peak;
  };
  bump(s.active_bytes, stats_.active_bytes, s.allocated_bytes.current + pending_bytes);
  bump(s.active_count, stats_.active_count, s.allocation_count.current + pending_count);
  bump(s.inactive_split_bytes, stats_.inactive_split_bytes, split_bytes);
  bump(s.inactive_split_count, stats_.inactive_split_count, split_count);
  return s;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::reset_peak()
{
  std::lock_guard<std::mutex> lock{mutex_};
  update_peaks_locked();
  for (auto& c : threads_.caches) {  // the owners write these too: a relaxed store races benignly
    c->allocated_bytes.peak.v.store(c->allocated_bytes.get(), std::memory_order_relaxed);
    c->requested_bytes.peak.v.store(c->requested_bytes.get(), std::memory_order_relaxed);
    c->allocation_count.peak.v.store(c->allocation_count.get(), std::memory_order_relaxed);
  }
  for (stat_pair* p : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes,
                       &stats_.active_bytes, &stats_.inactive_split_bytes, &stats_.allocation_count,
                       &stats_.segment_count, &stats_.active_count, &stats_.inactive_split_count}) {
    p->peak = p->current;
  }
}

template <class Runtime>
void basic_caching_allocator<Runtime>::raise_reserved_peak_locked() noexcept
{
  stats_.reserved_bytes.peak =
    std::max(stats_.reserved_bytes.peak, static_cast<std::int64_t>(pool_.reserved));
}

}  // namespace gpukit
