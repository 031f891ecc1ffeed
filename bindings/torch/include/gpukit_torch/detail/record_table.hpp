// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/detail/record_table.hpp: the backend's records of the blocks it handed out, by
// address, in one shard. Not public API.
//
// Open addressing over a power-of-two array of slots that hold the records themselves, so that an
// allocation and its free allocate nothing (std::unordered_map makes a node per block); linear
// probing, and on erase the entries after the hole move back into it when their home slot allows
// (no tombstones: a table that sees millions of allocations and frees never slows down). The table
// doubles when it is half full. Addresses are the keys (blocks are at least 512-byte aligned; null
// is never one). Not thread-safe: the backend holds the shard's records_lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace gpukit_torch::detail {

template <class Record>
class record_table {
 public:
  record_table() : slots_{std::make_unique<slot[]>(initial_slots)}, mask_{initial_slots - 1} {}

  /// The record of `p`, or nullptr; valid until the next insert or erase.
  [[nodiscard]] Record* find(void const* p) const noexcept
  {
    auto const key = reinterpret_cast<std::uintptr_t>(p);
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) { return &slots_[i].record; }
      if (slots_[i].key == 0) { return nullptr; }
    }
  }

  /// Records `p` (not recorded yet). Throws std::bad_alloc, the table unchanged, where it must
  /// grow and the host has no memory for it.
  void insert(void const* p, Record r)
  {
    if (2 * (size_ + 1) > mask_ + 1) { grow(); }
    place(reinterpret_cast<std::uintptr_t>(p), std::move(r));
    ++size_;
  }

  /// Removes the record of `p`, which find() gave.
  void erase(void const* p) noexcept
  {
    auto const key   = reinterpret_cast<std::uintptr_t>(p);
    std::size_t hole = home(key);
    while (slots_[hole].key != key) { hole = (hole + 1) & mask_; }
    for (std::size_t j = (hole + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      // Entry j may fill the hole when its home is not in (hole, j], cyclically: its probe from
      // home to j passed over the hole.
      std::size_t const h = home(slots_[j].key);
      bool const passes   = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
      if (passes) {
        slots_[hole] = std::move(slots_[j]);
        hole         = j;
      }
    }
    slots_[hole] = slot{};
    --size_;
  }

  /// Calls f(address, record) for every record.
  template <class F>
  void for_each(F&& f) const
  {
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (slots_[i].key != 0) {
        f(reinterpret_cast<void*>(slots_[i].key), static_cast<Record const&>(slots_[i].record));
      }
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::size_t initial_slots = 64;
  struct slot {
    std::uintptr_t key{0};
    Record record{};
  };

  // Fibonacci hashing of the address bits above the 512-byte alignment.
  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept
  {
    return static_cast<std::size_t>(
             (static_cast<std::uint64_t>(key >> 9) * 0x9E3779B97F4A7C15ull) >> 32) &
           mask_;
  }

  void place(std::uintptr_t key, Record&& r)
  {
    std::size_t i = home(key);
    while (slots_[i].key != 0) { i = (i + 1) & mask_; }
    slots_[i].key    = key;
    slots_[i].record = std::move(r);
  }

  // The new slots first: where they cannot be had (std::bad_alloc) the table stays as it was.
  __attribute__((noinline, cold)) void grow()
  {
    std::size_t const n           = mask_ + 1;
    std::unique_ptr<slot[]> fresh = std::make_unique<slot[]>(2 * n);
    std::unique_ptr<slot[]> old   = std::exchange(slots_, std::move(fresh));
    mask_                         = 2 * n - 1;
    for (std::size_t i = 0; i < n; ++i) {
      if (old[i].key != 0) { place(old[i].key, std::move(old[i].record)); }
    }
  }

  std::unique_ptr<slot[]> slots_;
  std::size_t mask_;
  std::size_t size_{0};
};

}  // namespace gpukit_torch::detail
