// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/lifetime.hpp: whether a gpukit object that others refer to is still alive. Not
// public API.
//
// gpukit's RAII types refer to one another and must be safe whatever order the user destroys them
// in. An object that others refer to holds a `lifetime_registration`; those that refer to it keep
// its `lifetime_token`, 8 bytes that stay meaningful after the object is gone:
//
//   registered object      kept by, and what it does once the object is gone
//   caching allocator      owning stream (skips forget_stream), device_buffer / device_uvector /
//                          device_scalar (free nothing), prefetcher (on_expire: stops, frees)
//   owning stream's state  its views (is_destroyed: a buffer frees on the default stream)
//   pinned pool            pinned_buffer (returns nothing), transfer_pipeline (on_expire: waits
//                          for its transfers and copies)
//   transfer pipeline      prefetcher (on_expire: stops loading)
//
// - `token.alive()` is one acquire load of a word written only when an object is created or
//   destroyed: what a buffer's destructor asks before freeing (the allocator's hot path is
//   untouched). A single thread, or threads that joined, may destroy objects in any order.
//   Destroying an object while another thread is still destroying its dependents is a data race,
//   as with any object still in use; only the calls made under `with_alive` are ordered.
// - `token.with_alive(f)` calls f under the object's lock, only if it is alive: the object's
//   destructor takes the same lock first (`expire`), so it waits for f (what an owning stream uses
//   to make its allocators forget it: forgetting may take long, and may race a destructor).
// - `token.on_expire(key, f)`: f runs when the object starts its destruction (under its lock),
//   before it frees anything; `forget_on_expire(key)` takes f back. A pipeline uses it to wait for
//   the copies from its staging chunks before their pool frees them. f must not use the same
//   object's token again (its lock is held), nor wait for a thread that does.
//
// The data: a process-wide table of slots, one per live registration, in chunks that are never
// freed or moved (so a token can always be looked up without a lock). A slot holds a generation,
// bumped when its object expires; a token is (slot, generation) and is alive while they match.
// Slots are reused, their generations never (2^44 objects per slot before one would wrap).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace gpukit::detail {

/// One slot of the lifetime table: the generation of the object it serves now, and the lock that
/// orders that object's destruction after the dependents acting on it.
struct lifetime_slot {
  /// The generation of the slot's current object: a token is alive while it holds the same value.
  /// Bumped (under `mutex`) when that object expires; read without the lock.
  std::atomic<std::uint64_t> generation{1};
  /// Held by `with_alive` and `on_expire` callers and by `expire`: guards `on_expire`.
  std::mutex mutex;
  /// Run by `expire`, in order (key, callback). Guarded by `mutex`.
  std::vector<std::pair<void const*, std::function<void()>>> on_expire;
};

/// The process-wide lifetime table (see the top of this header). Never destroyed: objects may be
/// destroyed after static destructors have run.
class lifetime_table {
 public:
  static constexpr unsigned slot_bits   = 20;  // up to 2^20 live objects
  static constexpr unsigned chunk_bits  = 10;
  static constexpr std::uint32_t chunks = 1U << (slot_bits - chunk_bits);

  /// A free slot (taken under the table's lock; slots are reused, never freed).
  /// @throws std::bad_alloc when memory runs out; std::length_error when 2^20 objects are alive
  std::uint32_t acquire()
  {
    std::lock_guard<std::mutex> lock{mutex_};
    if (!free_.empty()) {
      std::uint32_t const s = free_.back();
      free_.pop_back();
      return s;
    }
    if (next_ == (1U << slot_bits)) { throw std::length_error{"gpukit: 2^20 live objects"}; }
    std::uint32_t const s = next_;
    if (free_.capacity() <= s) { free_.reserve(2 * std::size_t{s} + 64); }  // release: no alloc
    auto& chunk = chunks_[s >> chunk_bits];
    if (chunk.load(std::memory_order_relaxed) == nullptr) {
      chunk.store(new lifetime_slot[std::size_t{1} << chunk_bits], std::memory_order_release);
    }
    ++next_;
    return s;
  }
  /// Gives slot `s` back (its generation already bumped). Never throws: its place was reserved.
  void release(std::uint32_t s) noexcept
  {
    std::lock_guard<std::mutex> lock{mutex_};
    free_.push_back(s);
  }
  /// The slot `s` (lock-free: chunks never move).
  [[nodiscard]] lifetime_slot& at(std::uint32_t s) const noexcept
  {
    return chunks_[s >> chunk_bits].load(std::memory_order_acquire)[s & ((1U << chunk_bits) - 1)];
  }

 private:
  std::array<std::atomic<lifetime_slot*>, chunks> chunks_{};
  std::mutex mutex_;                 // guards free_ and next_
  std::vector<std::uint32_t> free_;  // capacity >= slots handed out
  std::uint32_t next_{0};
};

#if defined(__GNUC__)
#define GPUKIT_DETAIL_LIFETIME_EXPORT __attribute__((visibility("default")))
#else
#define GPUKIT_DETAIL_LIFETIME_EXPORT
#endif

/// The table, one per process (a non-template exported inline function: its static local is bound
/// once across shared libraries, as default_allocator_registry's).
GPUKIT_DETAIL_LIFETIME_EXPORT inline lifetime_table& the_lifetime_table()
{
  static auto* t = new lifetime_table{};
  return *t;
}

#undef GPUKIT_DETAIL_LIFETIME_EXPORT

/// What refers to a registered object: (slot, generation) in one word. A value-initialized token
/// names no object and is never alive. Trivially copyable.
class lifetime_token {
 public:
  static constexpr unsigned slot_bits            = lifetime_table::slot_bits;
  static constexpr std::uint64_t generation_mask = (std::uint64_t{1} << (64 - slot_bits)) - 1;
  constexpr lifetime_token() noexcept            = default;
  constexpr lifetime_token(std::uint32_t slot, std::uint64_t generation) noexcept
      : bits_{(generation & generation_mask) << slot_bits | slot}
  {}

  /// True for a token of some object (alive or not).
  [[nodiscard]] constexpr bool is_set() const noexcept { return bits_ != 0; }
  /// True while the object lives (an acquire load, no lock). Never throws.
  [[nodiscard]] bool alive() const noexcept
  {
    return is_set() && matches(slot().generation.load(std::memory_order_acquire));
  }
  /// Calls f() if the object is alive, holding its lock: its destruction waits for f. Returns
  /// whether f ran. f must not destroy the object or use this token's slot again.
  template <class F>
  bool with_alive(F&& f) const
  {
    if (!is_set()) { return false; }
    lifetime_slot& s = slot();
    std::lock_guard<std::mutex> lock{s.mutex};
    if (!matches(s.generation.load(std::memory_order_relaxed))) { return false; }
    std::forward<F>(f)();
    return true;
  }
  /// Makes the object run `f` when its destruction starts (see the top of this header), under
  /// `key`. Returns false (and keeps nothing) when the object is gone already.
  /// @throws std::bad_alloc
  bool on_expire(void const* key, std::function<void()> f) const
  {
    return with_alive([&] { slot().on_expire.emplace_back(key, std::move(f)); });
  }
  /// Takes back what on_expire(key, ...) registered, if the object still lives. Never throws.
  void forget_on_expire(void const* key) const noexcept
  {
    (void)with_alive([&] {
      auto& v = slot().on_expire;
      for (auto it = v.begin(); it != v.end();) { it = it->first == key ? v.erase(it) : it + 1; }
    });
  }

  friend constexpr bool operator==(lifetime_token a, lifetime_token b) noexcept
  {
    return a.bits_ == b.bits_;
  }
  friend constexpr bool operator!=(lifetime_token a, lifetime_token b) noexcept
  {
    return a.bits_ != b.bits_;
  }
  /// The word itself (a key for a fast-path comparison).
  [[nodiscard]] constexpr std::uint64_t bits() const noexcept { return bits_; }

 private:
  [[nodiscard]] lifetime_slot& slot() const noexcept
  {
    return the_lifetime_table().at(static_cast<std::uint32_t>(bits_ & ((1U << slot_bits) - 1)));
  }
  [[nodiscard]] bool matches(std::uint64_t generation) const noexcept
  {
    return (generation & generation_mask) == (bits_ >> slot_bits);
  }

  std::uint64_t bits_{0};
};

/// Held by an object that others refer to: a slot of the lifetime table while it lives. Its owner
/// calls expire() first thing in its destructor (before freeing anything); the registration's own
/// destructor expires it too, and gives the slot back. Neither copyable nor movable.
class lifetime_registration {
 public:
  /// @throws std::bad_alloc, std::length_error (see lifetime_table::acquire)
  lifetime_registration() : slot_{the_lifetime_table().acquire()}
  {
    generation_ = the_lifetime_table().at(slot_).generation.load(std::memory_order_relaxed);
  }
  ~lifetime_registration()
  {
    expire();
    the_lifetime_table().release(slot_);
  }
  lifetime_registration(lifetime_registration const&)            = delete;
  lifetime_registration& operator=(lifetime_registration const&) = delete;
  lifetime_registration(lifetime_registration&&)                 = delete;
  lifetime_registration& operator=(lifetime_registration&&)      = delete;

  /// The token that dependents keep. Never throws.
  [[nodiscard]] lifetime_token token() const noexcept { return {slot_, generation_}; }

  /// Runs the on_expire callbacks, then makes every token dead: waits for the dependents inside
  /// with_alive. Idempotent; never throws (a callback that throws is skipped).
  void expire() noexcept
  {
    lifetime_slot& s = the_lifetime_table().at(slot_);
    std::lock_guard<std::mutex> lock{s.mutex};
    if (s.generation.load(std::memory_order_relaxed) != generation_) { return; }
    auto callbacks = std::move(s.on_expire);
    s.on_expire.clear();
    for (auto& [key, f] : callbacks) {
      try {
        f();
      } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor's helper never throws
      }
    }
    s.generation.store(generation_ + 1, std::memory_order_release);
  }

 private:
  std::uint32_t slot_;
  std::uint64_t generation_{0};
};

}  // namespace gpukit::detail
