// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching_allocator_operations_impl.hpp: what the caching allocator's layers
// ask of the pool around them, as small structs the façade builds at each call and passes to a
// layer as a template parameter (static composition: no virtual call, no back pointer kept):
// oom_operations (detail/caching/oom_ladder.hpp), stream_operations (stream_pools.hpp),
// front_operations (thread_cache_front.hpp) and segment_pool (segment_source.hpp and
// growable_source.hpp). Each layer's header lists what it asks for. Not public API: included at
// the end of caching_allocator.hpp, which it does not include.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpukit {

// What the out-of-memory ladder (detail/caching/oom_ladder.hpp, which lists these operations) asks
// of the pool, for one allocation by the thread whose cache is `tc`. Every member runs under the
// pool lock, held by the ladder's caller; the analysis cannot follow it through the ladder, hence
// assert_held.
template <class Runtime>
struct basic_caching_allocator<Runtime>::oom_operations {
  basic_caching_allocator& a;
  thread_cache& tc;

  block* find_free(std::size_t size, int kind, stream_type stream)
  {
    a.mutex_.assert_held();
    return a.find_free(size, kind, stream);
  }
  block* new_segment(std::size_t size, int kind, stream_type stream)
  {
    a.mutex_.assert_held();
    bool oom = false;
    segment_pool pool{a};
    return a.growable_ ? a.pages_.grow(size, kind, stream, oom, pool)
                       : a.segments_.take(size, kind, stream, oom, pool);
  }
  std::size_t poll_pending(bool wait)
  {
    a.mutex_.assert_held();
    return a.streams_.poll_pending(wait, stream_operations{a});
  }
  std::size_t migrate(stream_type requester, bool wait)
  {
    a.mutex_.assert_held();
    return a.streams_.migrate(requester, wait, stream_operations{a});
  }
  void drain_cache()
  {
    a.mutex_.assert_held();
    front_type::drain(tc, front_operations{a});
  }
  void flush_other_caches()
  {
    a.mutex_.assert_held();
    a.threads_.request_flush_except(tc);
  }
  // Growable segments: the free pages of the streams released are unmapped first.
  std::size_t release_segments(std::vector<stream_type>& freed_on, stream_type const* only_stream)
  {
    a.mutex_.assert_held();
    return a.segments_.release(0, freed_on, -1, only_stream, segment_pool{a});
  }
  bool is_capturing(stream_type stream)
  {
    a.mutex_.assert_held();
    return a.streams_.is_capturing(stream);
  }
  void retire_dead_stream(stream_type stream)
  {
    a.mutex_.assert_held();
    a.streams_.retire_dead_stream(stream, stream_operations{a});
  }
  std::size_t reserved() const
  {
    a.mutex_.assert_held();
    return a.segments_.reserved();
  }
  std::size_t limit() const noexcept { return a.limit_.load(std::memory_order_relaxed); }
  // What users hold now: the threads' counts summed in (the one update_peaks of an OOM report).
  std::size_t allocated() const
  {
    a.mutex_.assert_held();
    return static_cast<std::size_t>(
      a.stats_.update_peaks(a.threads_.caches()).allocated_bytes.current);
  }
  oom_context callback_context(std::size_t size) const
  {
    return oom_context{size, a.device_, reserved(), limit()};
  }
  template <class F>
  void for_each_free_pool(F&& f) const
  {
    a.mutex_.assert_held();
    for (auto const& sp : a.streams_.pools()) { f(&sp->stream, sp->index[0], sp->index[1]); }
    f(static_cast<stream_type const*>(nullptr), a.blocks_.global(small_pool),
      a.blocks_.global(large_pool));
  }
  void count_step(int step, std::size_t reclaimed)
  {
    a.mutex_.assert_held();
    a.stats_.count_recovery_step(static_cast<std::size_t>(step), reclaimed);
  }
  void count_release_wait()
  {
    a.mutex_.assert_held();
    a.stats_.count(&caching_allocator_stats::num_release_waits);
  }
  void count_oom(std::size_t size)
  {
    a.mutex_.assert_held();
    a.stats_.count(&caching_allocator_stats::num_ooms);
    a.recorder_.record_pool(memory_event::action::oom, 0, size, stream_type{});
  }
};

// What the stream pools' layer (detail/caching/stream_pools.hpp, which lists these operations) asks
// of the pool around it. Built at each call, under the pool lock (each member asserts it for
// clang's analysis).
template <class Runtime>
struct basic_caching_allocator<Runtime>::stream_operations {
  basic_caching_allocator& a;

  bool capturing() const noexcept
  {
    return a.captures_underway_.load(std::memory_order_relaxed) != 0;
  }
  block* insert_free(block* b) const
  {
    a.mutex_.assert_held();
    return a.insert_free(b);
  }
  void free_to_pool(block* b, stream_type stream) const
  {
    a.mutex_.assert_held();
    a.free_to_pool(b, stream);
  }
  std::size_t global_bytes() const
  {
    a.mutex_.assert_held();
    return a.blocks_.global_bytes();
  }
  void count(std::uint64_t caching_allocator_stats::*counter) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count(counter);
  }
  void count_pending(int kind, std::int64_t bytes, std::int64_t blocks) const noexcept
  {
    a.pending_.add(kind, bytes, blocks);
  }
  capture_id capture_of(stream_type stream) const
  {
    a.mutex_.assert_held();
    capture_pool const* cp = a.capture_for(stream);
    return cp != nullptr ? cp->id : 0;
  }
};

// What the thread caches' front (detail/caching/thread_cache_front.hpp, which lists these
// operations) asks of the pool around it. Built at each call; locked() takes the pool lock, and
// the other members run under it (each asserts it for clang's analysis).
template <class Runtime>
struct basic_caching_allocator<Runtime>::front_operations {
  basic_caching_allocator& a;

  static front_operations of(void* context)
  {
    return front_operations{*static_cast<basic_caching_allocator*>(context)};
  }
  void* context() const noexcept { return &a; }
  template <class F>
  void locked(F&& f) const
  {
    detail::pool_lock lock{a.mutex_};
    f();
  }
  void free_to_pool(block* b, stream_type stream) const
  {
    a.mutex_.assert_held();
    a.free_to_pool(b, stream);
  }
  void wake_waiters() const
  {
    a.mutex_.assert_held();
    a.oom_.wake_waiters();
  }
  void share_counts(typename front_type::cache_list const& caches) const
  {
    a.mutex_.assert_held();
    if (a.shared_.on.load(std::memory_order_relaxed)) { return; }
    a.stats_.share_counts(
      caches, stats_type::scan(a.streams_.pending(), a.streams_.pools(), a.blocks_.globals()));
  }
  void join_counts(thread_cache& tc) const
  {
    a.mutex_.assert_held();
    if (a.shared_.on.load(std::memory_order_relaxed)) {
      stats_type::fold_exiting(a.shared_, tc, a.pending_);
    }
  }
};

// What the segments' layers (detail/caching/segment_source.hpp, growable_source.hpp) ask of the
// pool around them: the allocator's state they work on, and the steps that stay the allocator's.
// Built at each call, under the pool lock (each member asserts it for clang's analysis).
template <class Runtime>
struct basic_caching_allocator<Runtime>::segment_pool {
  basic_caching_allocator& a;

  detail::caching::block_index<block>& blocks() const
  {
    a.mutex_.assert_held();
    return a.blocks_;
  }
  std::size_t& reserved() const
  {
    a.mutex_.assert_held();
    return a.segments_.reserved_counter();
  }
  void count(std::uint64_t caching_allocator_stats::*counter, std::uint64_t n = 1) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count(counter, n);
  }
  std::size_t limit() const noexcept { return a.limit_.load(std::memory_order_relaxed); }
  bool capturing() const noexcept
  {
    return a.captures_underway_.load(std::memory_order_relaxed) != 0;
  }
  std::vector<std::unique_ptr<stream_pool>>& streams() const
  {
    a.mutex_.assert_held();
    return a.streams_.pools();
  }
  stream_pool& pool_of(stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.streams_.pool_of(stream);
  }
  bool capture_active_on(stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.capture_.active_on(stream) != nullptr;
  }
  void count_reserved(int kind, std::int64_t delta) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count_reserved(kind, delta);
  }
  void count_segment(int kind, int delta) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count_segment(kind, delta);
  }
  void raise_reserved_peak() const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.raise_reserved_peak();
  }
  void record(memory_event::action what, std::uintptr_t address, std::size_t bytes,
              stream_type stream) const
  {
    a.mutex_.assert_held();
    a.recorder_.record_pool(what, address, bytes, stream);
  }
  block* insert_free(block* b) const
  {
    a.mutex_.assert_held();
    return a.insert_free(b);
  }
  void unindex(block* b) const
  {
    a.mutex_.assert_held();
    a.unindex(b);
  }
  block* find_free(std::size_t size, int kind, stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.find_free(size, kind, stream);
  }
  std::uint64_t next_free_seq(stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.streams_.next_free_seq(stream);
  }
  bool is_capturing(stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.streams_.is_capturing(stream);
  }
  void retire_dead_stream(stream_type stream) const
  {
    a.mutex_.assert_held();
    a.streams_.retire_dead_stream(stream, stream_operations{a});
  }
  // Growable segments unmap their free pages (none of the other modes).
  std::size_t release_growable(std::size_t target, stream_type const* only_stream) const
  {
    a.mutex_.assert_held();
    return a.growable_ ? a.pages_.release(target, only_stream, segment_pool{a}) : 0;
  }
};

}  // namespace gpukit
