// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/event_ring.hpp: a ring of recorded allocator events, the newest
// `capacity` kept: the pool's (segment and out-of-memory events) and each thread cache's (its
// allocations and frees) for snapshot() (gpukit/memory/memory_history.hpp). Not public API.
//
// Single-threaded: the allocator holds its pool lock around the pool's ring, and a thread cache
// its spin lock around its own (snapshot() reads it from another thread).
#pragma once

#include <gpukit/memory/memory_history.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpukit::detail::caching {

/// The newest events, up to a capacity given at each push; see the top of this file.
class event_ring {
 public:
  /// Keeps `e`: appended while fewer than `capacity` events are held, else in place of the oldest,
  /// which counts as dropped. A capacity of 0 keeps nothing (and drops nothing).
  void push(memory_event const& e, std::size_t capacity)
  {
    if (events_.size() < capacity) {
      events_.push_back(e);
    } else if (capacity != 0) {
      events_[next_] = e;
      next_          = (next_ + 1) % capacity;
      ++dropped_;
    }
  }
  /// Forgets every event and the dropped count.
  void clear() noexcept
  {
    events_.clear();
    next_    = 0;
    dropped_ = 0;
  }
  /// The events held, in ring order (the oldest at next_ once the ring has wrapped).
  [[nodiscard]] std::vector<memory_event> const& events() const noexcept { return events_; }
  /// Events overwritten since the last clear().
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  std::vector<memory_event> events_;
  std::size_t next_{0};  // where the next event goes once the ring is full
  std::uint64_t dropped_{0};
};

}  // namespace gpukit::detail::caching
