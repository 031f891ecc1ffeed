// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/event_recorder.hpp: the caching allocator's history, for
// start_recording, stop_recording and snapshot() (gpukit/memory/memory_history.hpp exports it).
// Not public API.
//
// Owns the pool's ring of events (segments taken and given back, allocations that failed) and
// how events are stamped (a steady-clock time, a stream as a number). Each thread's allocations
// and frees go to that thread's own ring, in its thread cache (record, static: no lock), and
// snapshot() gathers every ring into one list in time order. Invariants: while recording is off
// nothing is added; start_recording empties every ring before events are recorded again.
//
// Single-threaded: the allocator holds its pool lock around every call but record(). The switch
// the fast path reads without the lock (on, and the events a ring holds) is a recording_switch of
// the allocator's, outside the lock, which this class is given by reference and writes only where
// the allocator holds its lock (stop_recording, a single store, takes none).
#pragma once

#include <gpukit/memory/detail/caching/event_ring.hpp>
#include <gpukit/memory/memory_history.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace gpukit::detail::caching {

/// What the allocator's fast path reads, without its lock, to record an event: whether recording
/// is on, and how many events a ring holds. Written under the lock (stop_recording: anywhere).
struct recording_switch {
  std::atomic<bool> on{false};
  std::atomic<std::size_t> capacity{0};
};

/// The recorded events of one allocator; see the top of this file.
template <class Runtime>
class event_recorder {
 public:
  using stream_type = typename Runtime::stream_type;

  /// A recorder switched by `recording` (the allocator's, outliving this object).
  explicit event_recorder(recording_switch& recording) noexcept : switch_{recording} {}
  ~event_recorder()                                = default;
  event_recorder(event_recorder const&)            = delete;
  event_recorder& operator=(event_recorder const&) = delete;
  event_recorder(event_recorder&&)                 = delete;
  event_recorder& operator=(event_recorder&&)      = delete;

  /// Empties the pool's ring and each of the thread `caches`' (under its ring lock), then records
  /// up to `events_per_thread` events per ring from now on.
  template <class Caches>
  void start_recording(Caches const& caches, std::size_t events_per_thread)
  {
    switch_.capacity.store(events_per_thread, std::memory_order_relaxed);
    for (auto const& c : caches) {
      std::lock_guard ring_lock{c->ring_mutex};
      c->ring.clear();
    }
    ring_.clear();
    switch_.on.store(true, std::memory_order_relaxed);
  }

  /// Records a pool event (a segment, an out-of-memory) into the pool's ring while recording.
  void record_pool(memory_event::action what, std::uintptr_t address, std::size_t bytes,
                   stream_type stream)
  {
    if (!switch_.on.load(std::memory_order_relaxed)) { return; }
    ring_.push(memory_event{what, now_ns(), address, bytes, stream_id(stream)},
               switch_.capacity.load(std::memory_order_relaxed));
  }

  /// Records block `b` handed out or taken back (`what`) on `stream` into thread cache `tc`'s own
  /// ring of `capacity` events (the switch's, which the caller has seen on). Static and without
  /// the pool lock: the fast path calls it.
  template <class Cache, class Block>
  static void record(Cache& tc, std::size_t capacity, memory_event::action what, Block const* b,
                     stream_type stream)
  {
    tc.record(memory_event{what, now_ns(), b->address(), b->size, stream_id(stream)}, capacity);
  }

  /// Puts every event held (the pool's and the thread `caches`', each read under its ring lock)
  /// into `s.events` in time order, and the events the rings dropped into `s.dropped_events`.
  template <class Caches>
  void fill_events(memory_snapshot& s, Caches const& caches) const
  {
    s.events         = ring_.events();
    s.dropped_events = ring_.dropped();
    for (auto const& c : caches) {
      std::lock_guard ring_lock{c->ring_mutex};
      s.events.insert(s.events.end(), c->ring.events().begin(), c->ring.events().end());
      s.dropped_events += c->ring.dropped();
    }
    std::stable_sort(s.events.begin(), s.events.end(),
                     [](auto const& a, auto const& b) { return a.time_ns < b.time_ns; });
  }

  /// The pool's ring.
  [[nodiscard]] event_ring const& pool_ring() const noexcept { return ring_; }

  /// Now, on the steady clock, in nanoseconds.
  static std::uint64_t now_ns() noexcept
  {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
  }
  /// `stream` as a number (its handle's bits), as events and messages show it.
  static std::uintptr_t stream_id(stream_type stream) noexcept
  {
    std::uintptr_t id = 0;
    std::memcpy(&id, &stream, std::min(sizeof id, sizeof stream));
    return id;
  }

 private:
  recording_switch& switch_;  // the allocator's
  event_ring ring_;           // segment and out-of-memory events
};

}  // namespace gpukit::detail::caching
