// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/address_map.hpp: address -> pointer hash map. Not public API.
//
// Open addressing with linear probing and backward-shift deletion (no tombstones, so a map that
// sees millions of inserts and erases never degrades). Keys are block addresses (256-byte aligned,
// never 0). Not thread-safe: the caching allocator keeps one under its pool mutex (every block it
// owns) and one per thread cache (the blocks that thread handed out), which its owner alone
// touches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gpukit::detail {

template <class Value>
class address_map {
 public:
  address_map() : slots_{new slot[initial_capacity]}, capacity_{initial_capacity} {}
  address_map(address_map const&)            = delete;
  address_map& operator=(address_map const&) = delete;
  address_map(address_map&&)                 = delete;
  address_map& operator=(address_map&&)      = delete;
  ~address_map()                             = default;

  /// The value stored for `key`, or nullptr.
  [[nodiscard]] Value* find(std::uintptr_t key) const noexcept
  {
    std::size_t const mask = capacity_ - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == key) { return slots_[i].value; }
      if (slots_[i].key == 0) { return nullptr; }
    }
  }

  /// Inserts, or replaces the value of an existing key.
  void insert(std::uintptr_t key, Value* v)
  {
    if ((size_ + 1) * 2 > capacity_) { grow(); }
    std::size_t const mask = capacity_ - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == key) {
        slots_[i].value = v;
        return;
      }
      if (slots_[i].key == 0) {
        slots_[i] = slot{key, v};
        ++size_;
        return;
      }
    }
  }

  /// Removes `key`; returns whether it was present.
  bool erase(std::uintptr_t key) noexcept
  {
    std::size_t const mask = capacity_ - 1;
    std::size_t i          = hash(key) & mask;
    for (;; i = (i + 1) & mask) {
      if (slots_[i].key == key) { break; }
      if (slots_[i].key == 0) { return false; }
    }
    // Backward-shift: move later entries of the probe run into the hole.
    for (std::size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
      if (slots_[j].key == 0) { break; }
      std::size_t const home = hash(slots_[j].key) & mask;
      // Entry j may move to i when i lies cyclically in [home, j).
      bool const movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
      if (movable) {
        slots_[i] = slots_[j];
        i         = j;
      }
    }
    slots_[i] = slot{};
    --size_;
    return true;
  }

  /// Removes every entry for which pred(key, value) is true.
  template <class Pred>
  void erase_if(Pred&& pred)
  {
    std::unique_ptr<slot[]> old = std::move(slots_);
    std::size_t const cap       = capacity_;
    slots_.reset(new slot[cap]);
    size_ = 0;
    for (std::size_t i = 0; i < cap; ++i) {
      if (old[i].key != 0 && !pred(old[i].key, old[i].value)) { insert(old[i].key, old[i].value); }
    }
  }

  template <class F>
  void for_each(F&& f) const
  {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key != 0) { f(slots_[i].key, slots_[i].value); }
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::size_t initial_capacity = 64;
  struct slot {
    std::uintptr_t key{0};
    Value* value{nullptr};
  };

  static std::size_t hash(std::uintptr_t key) noexcept
  {
    std::uint64_t x = static_cast<std::uint64_t>(key) >> 8;
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;
    return static_cast<std::size_t>(x);
  }

  // Out of line and cold, so that insert stays small enough to be inlined into the allocator's
  // hot path (which otherwise pays a call and the saving of registers rehash needs).
  __attribute__((noinline, cold)) void grow() { rehash(capacity_ * 2); }

  void rehash(std::size_t cap)
  {
    std::unique_ptr<slot[]> old = std::move(slots_);
    std::size_t const old_cap   = capacity_;
    slots_.reset(new slot[cap]);
    capacity_ = cap;
    size_     = 0;
    for (std::size_t i = 0; i < old_cap; ++i) {
      if (old[i].key != 0) { insert(old[i].key, old[i].value); }
    }
  }

  std::unique_ptr<slot[]> slots_;
  std::size_t capacity_;
  std::size_t size_{0};
};

}  // namespace gpukit::detail
