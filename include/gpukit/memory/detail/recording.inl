// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/recording.inl: the allocator's history: start_recording, stop_recording,
// the events each thread records into its own ring (and the pool's ring for segment and
// out-of-memory events), and snapshot(), which lists segments, blocks and events
// (memory_history.hpp exports it). Not public API; included by caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

namespace gpukit {

template <class Runtime>
void basic_caching_allocator<Runtime>::record(thread_cache& tc, memory_event::action what,
                                              block const* b, stream_type stream)
{
  tc.record(memory_event{what, now_ns(), b->address(), b->size, stream_id(stream)},
            recording_capacity_.load(std::memory_order_relaxed));
}

template <class Runtime>
void basic_caching_allocator<Runtime>::record_pool(memory_event::action what,
                                                   std::uintptr_t address, std::size_t bytes,
                                                   stream_type stream)
{
  if (!recording_on_.load(std::memory_order_relaxed)) { return; }
  recording_.push(memory_event{what, now_ns(), address, bytes, stream_id(stream)},
                  recording_capacity_.load(std::memory_order_relaxed));
}

template <class Runtime>
std::uint64_t basic_caching_allocator<Runtime>::now_ns() noexcept
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
}

template <class Runtime>
std::uintptr_t basic_caching_allocator<Runtime>::stream_id(stream_type stream) noexcept
{
  std::uintptr_t id = 0;
  std::memcpy(&id, &stream, std::min(sizeof id, sizeof stream));
  return id;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::start_recording(std::size_t events_per_thread)
{
  GPUKIT_EXPECTS(events_per_thread > 0, "start_recording: the ring must hold at least one event");
  detail::pool_lock lock{mutex_};
  recording_capacity_.store(events_per_thread, std::memory_order_relaxed);
  for (auto& c : threads_.caches) {
    std::lock_guard<typename thread_cache::spin_lock> ring_lock{c->ring_mutex};
    c->ring.clear();
  }
  recording_.clear();
  recording_on_.store(true, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::stop_recording()
{
  recording_on_.store(false, std::memory_order_relaxed);
}

template <class Runtime>
memory_snapshot basic_caching_allocator<Runtime>::snapshot() const
{
  detail::pool_lock lock{mutex_};
  memory_snapshot s;
  s.device = device_;
  blocks_.for_each([&](std::uintptr_t, block* head) {
    if (head->prev != nullptr) { return; }
    auto const* seg = static_cast<segment const*>(head->segment);
    // A growable segment appears as one segment per run of mapped blocks (as PyTorch shows its
    // expandable segments), so that the blocks of each segment tile it.
    memory_snapshot::segment g;
    auto flush = [&] {
      if (!g.blocks.empty()) { s.segments.push_back(std::move(g)); }
      g = memory_snapshot::segment{};
    };
    for (block const* b = head; b != nullptr; b = b->next) {
      auto const st = b->state.load(std::memory_order_relaxed);
      if (st == detail::block_state::unmapped) {
        flush();
        continue;
      }
      if (g.blocks.empty()) {
        g.address = b->address();
        g.size    = 0;
        g.stream  = stream_id(head->stream);
        g.small   = seg->kind == small_pool;
      }
      bool const allocated = st == detail::block_state::allocated;
      g.blocks.push_back({b->address(), b->size, allocated ? b->requested : 0, allocated});
      g.size += b->size;
    }
    flush();
  });
  std::sort(s.segments.begin(), s.segments.end(),
            [](auto const& a, auto const& b) { return a.address < b.address; });
  s.events         = recording_.events();
  s.dropped_events = recording_.dropped();
  for (auto const& c : threads_.caches) {
    std::lock_guard<typename thread_cache::spin_lock> ring_lock{c->ring_mutex};
    s.events.insert(s.events.end(), c->ring.events().begin(), c->ring.events().end());
    s.dropped_events += c->ring.dropped();
  }
  std::stable_sort(s.events.begin(), s.events.end(),
                   [](auto const& a, auto const& b) { return a.time_ns < b.time_ns; });
  return s;
}

}  // namespace gpukit
