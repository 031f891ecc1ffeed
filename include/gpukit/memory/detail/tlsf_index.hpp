// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/tlsf_index.hpp: O(1) segregated-fit index of free blocks. Not public API.
//
// Two-level segregated fit (TLSF, Masmano et al. 2004): a size maps to a first level (its most
// significant bit) and a second level (the next kSlBits bits), i.e. 2^kSlBits classes per power of
// two. Bitmaps record which class lists are non-empty, so finding a class with a fitting block is a
// couple of bit scans. A search first looks a few entries into the request's own class (a block of
// exactly the right size is the commonest case in training loops and wastes nothing), then takes
// the first block of the next non-empty larger class, which always fits.
//
// Blocks are intrusive: the index links `Block::free_prev` / `Block::free_next` and reads
// `Block::size`. Not thread-safe: the owner serializes access.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace gpukit::detail {

inline constexpr int tlsf_sl_bits     = 4;
inline constexpr int tlsf_sl_count    = 1 << tlsf_sl_bits;
inline constexpr int tlsf_min_shift   = 8;   // sizes are multiples of 256 bytes
inline constexpr int tlsf_max_shift   = 48;  // 256 TiB: beyond any device
inline constexpr int tlsf_fl_count    = tlsf_max_shift - tlsf_min_shift + 1;
inline constexpr int tlsf_class_count = tlsf_fl_count * tlsf_sl_count;

[[nodiscard]] inline int msb(std::uint64_t x) noexcept { return 63 - __builtin_clzll(x); }

/// Class of a block of `size` bytes (size >= 256): the class whose range contains size.
[[nodiscard]] inline int tlsf_floor_class(std::size_t size) noexcept
{
  int const fl = msb(size);
  if (fl > tlsf_max_shift) { return tlsf_class_count - 1; }  // beyond any device: the last class
  int const sl = static_cast<int>((size >> (fl - tlsf_sl_bits)) & (tlsf_sl_count - 1));
  return (fl - tlsf_min_shift) * tlsf_sl_count + sl;
}

/// Smallest class all of whose blocks are >= size.
[[nodiscard]] inline int tlsf_ceil_class(std::size_t size) noexcept
{
  int const fl = msb(size);
  if (fl > tlsf_max_shift) { return tlsf_class_count; }  // no class holds only blocks this large
  std::size_t const ul = (std::size_t{1} << (fl - tlsf_sl_bits)) - 1;
  int const c          = tlsf_floor_class(size);
  return (size & ul) == 0 ? c : c + 1;
}

/// One T per class (or per first level), indexed by the int numbers above, which are never
/// negative.
template <class T, int N>
struct tlsf_table {
  std::array<T, static_cast<std::size_t>(N)> items{};

  [[nodiscard]] T& operator[](int i) noexcept { return items[static_cast<std::size_t>(i)]; }
  [[nodiscard]] T const& operator[](int i) const noexcept
  {
    return items[static_cast<std::size_t>(i)];
  }
  void fill(T const& value) noexcept { items.fill(value); }
  [[nodiscard]] auto begin() const noexcept { return items.begin(); }
  [[nodiscard]] auto end() const noexcept { return items.end(); }
};

template <class Block>
class tlsf_index {
 public:
  tlsf_index() noexcept
  {
    heads_.fill(nullptr);
    sl_bitmap_.fill(0);
  }

  void insert(Block* b) noexcept
  {
    int const c  = tlsf_floor_class(b->size);
    b->free_prev = nullptr;
    b->free_next = heads_[c];
    if (heads_[c] != nullptr) { heads_[c]->free_prev = b; }
    heads_[c] = b;
    mark(c);
    bytes_ += b->size;
    ++count_;
  }

  void remove(Block* b) noexcept
  {
    int const c = tlsf_floor_class(b->size);
    if (b->free_prev != nullptr) {
      b->free_prev->free_next = b->free_next;
    } else {
      heads_[c] = b->free_next;
      if (heads_[c] == nullptr) { unmark(c); }
    }
    if (b->free_next != nullptr) { b->free_next->free_prev = b->free_prev; }
    b->free_prev = b->free_next = nullptr;
    bytes_ -= b->size;
    --count_;
  }

  /// A free block of at least `size` bytes, or nullptr. Does not remove it.
  [[nodiscard]] Block* find(std::size_t size) const noexcept
  {
    // Exact-ish fit first: a few blocks of the request's own class.
    int const fc = tlsf_floor_class(size);
    int scanned  = 0;
    for (Block* b = heads_[fc]; b != nullptr && scanned < 8; b = b->free_next, ++scanned) {
      if (b->size >= size) { return b; }
    }
    int const c = tlsf_ceil_class(size);
    if (c >= tlsf_class_count) { return nullptr; }
    int fl                     = c / tlsf_sl_count;
    int const sl               = c % tlsf_sl_count;
    std::uint32_t const sl_map = sl_bitmap_[fl] & (~std::uint32_t{0} << sl);
    if (sl_map != 0) { return heads_[fl * tlsf_sl_count + __builtin_ctz(sl_map)]; }
    std::uint64_t const fl_map = fl + 1 < 64 ? fl_bitmap_ & (~std::uint64_t{0} << (fl + 1)) : 0;
    if (fl_map == 0) { return nullptr; }
    fl = __builtin_ctzll(fl_map);
    return heads_[fl * tlsf_sl_count + __builtin_ctz(sl_bitmap_[fl])];
  }

  /// Calls f(Block*) for every block; f must not modify the index.
  template <class F>
  void for_each(F&& f) const
  {
    for_each_from(0, f);
  }

  /// Calls f(Block*) for every block of the class that holds `size` and of the classes above it
  /// (so for every block of at least `size` bytes, and for some smaller ones of that class): the
  /// classes that hold none are skipped through the bitmaps, not visited. f must not modify the
  /// index.
  template <class F>
  void for_each_from(std::size_t size, F&& f) const
  {
    int const first      = size < (std::size_t{1} << tlsf_min_shift) ? 0 : tlsf_floor_class(size);
    int const first_fl   = first / tlsf_sl_count;
    std::uint64_t fl_map = fl_bitmap_ & (~std::uint64_t{0} << first_fl);
    while (fl_map != 0) {
      int const fl = __builtin_ctzll(fl_map);
      fl_map &= fl_map - 1;
      std::uint32_t sl_map = sl_bitmap_[fl];
      if (fl == first_fl) { sl_map &= ~std::uint32_t{0} << (first % tlsf_sl_count); }
      while (sl_map != 0) {
        int const sl = __builtin_ctz(sl_map);
        sl_map &= sl_map - 1;
        for (Block* b = heads_[fl * tlsf_sl_count + sl]; b != nullptr; b = b->free_next) { f(b); }
      }
    }
  }

  /// The largest free block (0 when empty).
  [[nodiscard]] std::size_t largest() const noexcept
  {
    if (fl_bitmap_ == 0) { return 0; }
    int const fl     = msb(fl_bitmap_);
    int const sl     = msb(sl_bitmap_[fl]);
    std::size_t best = 0;
    for (Block* b = heads_[fl * tlsf_sl_count + sl]; b != nullptr; b = b->free_next) {
      best = b->size > best ? b->size : best;
    }
    return best;
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }

 private:
  void mark(int c) noexcept
  {
    sl_bitmap_[c / tlsf_sl_count] |= std::uint32_t{1} << (c % tlsf_sl_count);
    fl_bitmap_ |= std::uint64_t{1} << (c / tlsf_sl_count);
  }
  void unmark(int c) noexcept
  {
    int const fl = c / tlsf_sl_count;
    sl_bitmap_[fl] &= ~(std::uint32_t{1} << (c % tlsf_sl_count));
    if (sl_bitmap_[fl] == 0) { fl_bitmap_ &= ~(std::uint64_t{1} << fl); }
  }

  std::uint64_t fl_bitmap_{0};
  tlsf_table<std::uint32_t, tlsf_fl_count> sl_bitmap_{};
  tlsf_table<Block*, tlsf_class_count> heads_{};
  std::size_t bytes_{0};
  std::size_t count_{0};
};

}  // namespace gpukit::detail
