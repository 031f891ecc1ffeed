// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/block_index.hpp: the caching allocator's blocks, by address and by
// size: every block of every segment in an address map, the free blocks usable on any stream in a
// TLSF index per pool kind, the storage of block descriptors, and the operations that keep a
// segment tiled by its blocks (split, coalesce, carve, recycle). Not public API.
//
// Single-threaded: the allocator calls it under its pool lock. Knows no runtime and no stream
// semantics: where a free block is indexed (a stream's pool, a capture's pool, the global pool) is
// the caller's choice, passed as `index_of(block) -> tlsf_index<Block>&`, and which neighbours may
// merge is decided by the blocks' own fields (state, capture pool, stream, global).
//
// Invariants (checked by detail/allocator_invariants.hpp for the whole allocator):
// - the blocks of a segment tile it: prev/next link neighbours by address, sizes add up;
// - every live block is in the address map under its address, and no dead one is;
// - a free block is in exactly one index, and two mergeable free blocks are never neighbours;
// - a dead descriptor is on the spare list (descriptors are never freed while the index lives, so
//   another thread may read a stale one safely: its address and state are atomics).
#pragma once

#include <gpukit/memory/detail/address_map.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/detail/tlsf_index.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpukit::detail::caching {

/// Blocks by address and the global free indices; see the top of this file.
template <class Block>
class block_index {
 public:
  using block_type = Block;
  using index_type = tlsf_index<Block>;

  /// Descriptors are allocated this many at a time.
  static constexpr std::size_t chunk_blocks = 256;
  /// Blocks are split at this granularity: a tail smaller than this stays with the block.
  static constexpr std::size_t granularity = 256;

  block_index()                              = default;
  ~block_index()                             = default;
  block_index(block_index const&)            = delete;
  block_index& operator=(block_index const&) = delete;
  block_index(block_index&&)                 = delete;
  block_index& operator=(block_index&&)      = delete;

  // ---- descriptors ------------------------------------------------------------------------------

  /// A dead descriptor, unlinked, of no capture pool and no recorded streams.
  [[nodiscard]] Block* new_block()
  {
    if (spare_ == nullptr) { grow_spares(); }
    Block* b        = spare_;
    spare_          = b->free_next;
    b->free_next    = nullptr;
    b->capture_pool = 0;
    b->recorded.clear();
    return b;
  }
  /// Makes `b` dead and puts it on the spare list (it must not be in the map or an index).
  void recycle(Block* b) noexcept
  {
    b->state.store(block_state::dead, std::memory_order_relaxed);
    b->ptr.store(0, std::memory_order_relaxed);
    b->prev = b->next = nullptr;
    b->free_prev      = nullptr;
    b->free_next      = spare_;
    spare_            = b;
  }

  // ---- the address map --------------------------------------------------------------------------

  /// The block that starts at `address`, or nullptr.
  [[nodiscard]] Block* find(std::uintptr_t address) const noexcept { return map_.find(address); }
  [[nodiscard]] Block* find(void const* p) const noexcept
  {
    return map_.find(reinterpret_cast<std::uintptr_t>(p));
  }
  /// Calls f(address, block) for every block; f must not add or remove blocks.
  template <class F>
  void for_each(F&& f) const
  {
    map_.for_each(std::forward<F>(f));
  }
  /// Number of blocks, of every state but dead.
  [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }

  /// Makes `b` (from new_block) the one block of a segment of `bytes` at `address`, in the map; its
  /// state, kind, stream and index are the caller's to set.
  void add_segment(Block* b, void* address, std::size_t bytes, void* segment)
  {
    b->ptr.store(reinterpret_cast<std::uintptr_t>(address), std::memory_order_relaxed);
    b->size    = bytes;
    b->segment = segment;
    b->prev = b->next = nullptr;
    map_.insert(b->address(), b);
  }
  /// Removes `b` (unindexed) from the map and recycles it: its segment is gone, or `b` was merged.
  void remove(Block* b) noexcept
  {
    map_.erase(b->address());
    recycle(b);
  }

  // ---- the global free indices ------------------------------------------------------------------

  /// Free blocks usable on any stream, of pool kind `kind` (0 small, 1 large).
  [[nodiscard]] index_type& global(int kind) noexcept { return global_[index_of_kind(kind)]; }
  [[nodiscard]] index_type const& global(int kind) const noexcept
  {
    return global_[index_of_kind(kind)];
  }
  /// Both global indices, small pool first (for range-for).
  [[nodiscard]] std::array<index_type, 2>& globals() noexcept { return global_; }
  [[nodiscard]] std::array<index_type, 2> const& globals() const noexcept { return global_; }
  /// Bytes in the global indices.
  [[nodiscard]] std::size_t global_bytes() const noexcept
  {
    return global_[0].bytes() + global_[1].bytes();
  }

  // ---- splitting and coalescing -----------------------------------------------------------------

  /// Splits b at `offset` (0 < offset < size): b keeps the head; the tail, returned, gets b's
  /// state, owner and pool and is linked after b. Neither is (re)indexed here.
  [[nodiscard]] Block* split_off(Block* b, std::size_t offset)
  {
    Block* t = new_block();
    t->ptr.store(b->address() + offset, std::memory_order_relaxed);
    t->size         = b->size - offset;
    t->kind         = b->kind;
    t->stream       = b->stream;
    t->global       = b->global;
    t->segment      = b->segment;
    t->free_seq     = b->free_seq;
    t->capture_pool = b->capture_pool;
    t->prev         = b;
    t->next         = b->next;
    if (b->next != nullptr) { b->next->prev = t; }
    b->next = t;
    b->size = offset;
    t->state.store(b->state.load(std::memory_order_relaxed), std::memory_order_relaxed);
    map_.insert(t->address(), t);
    return t;
  }

  /// `b` takes in its next neighbour (unindexed), which is recycled.
  void absorb_next(Block* b) noexcept
  {
    Block* n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) { n->next->prev = b; }
    remove(n);
  }

  /// Whether free block `n` may merge with `b`: the same capture pool, and usable on the same
  /// stream (or one of them on any stream).
  [[nodiscard]] static bool mergeable(Block const* b, Block const* n) noexcept
  {
    if (n == nullptr || n->state.load(std::memory_order_relaxed) != block_state::free) {
      return false;
    }
    if (n->capture_pool != b->capture_pool) { return false; }
    return b->capture_pool != 0 || n->global || b->global || n->stream == b->stream;
  }

  /// Makes `b` free and indexes it in `index_of(b)`, merged first with mergeable free neighbours
  /// (taken out of their indices). Returns the block that holds b's bytes now: b, or the free
  /// block before it, which keeps its address and takes b's pool.
  template <class IndexOf>
  Block* insert_free(Block* b, IndexOf&& index_of)
  {
    if (mergeable(b, b->prev)) { b = merge_into_prev(b, index_of); }
    if (mergeable(b, b->next)) {
      Block* n = b->next;
      index_of(n).remove(n);
      absorb_owner(b, n);
      absorb_next(b);
    }
    b->state.store(block_state::free, std::memory_order_relaxed);
    index_of(b).insert(b);
    return b;
  }

  /// Takes free block `b` out of its index for an allocation of `size` bytes: b keeps `size`
  /// bytes (state allocated); a tail of at least `granularity` bytes is split off and goes back
  /// free (merged with a free next neighbour). Returns b.
  template <class IndexOf>
  Block* carve(Block* b, std::size_t size, IndexOf&& index_of)
  {
    index_of(b).remove(b);
    b->state.store(block_state::allocated, std::memory_order_relaxed);  // before the tail merges
    if (b->size - size >= granularity) {
      Block* rest = split_off(b, size);
      rest->state.store(block_state::free, std::memory_order_relaxed);
      insert_free(rest, index_of);
    }
    return b;
  }

 private:
  static std::size_t index_of_kind(int kind) noexcept { return kind == 0 ? 0 : 1; }

  // `b` takes the pool of `n` it absorbs when b's was any stream's; the later free sequence wins.
  static void absorb_owner(Block* b, Block const* n) noexcept
  {
    if (b->global && !n->global) {
      b->global = false;
      b->stream = n->stream;
    }
    b->free_seq = std::max(b->free_seq, n->free_seq);
  }

  // The free block before b absorbs b: it keeps its address and takes b's pool (after the owner
  // rule above). Returns it.
  template <class IndexOf>
  Block* merge_into_prev(Block* b, IndexOf& index_of)
  {
    Block* p = b->prev;
    index_of(p).remove(p);
    absorb_owner(b, p);
    p->stream   = b->stream;
    p->global   = b->global;
    p->free_seq = b->free_seq;
    absorb_next(p);
    return p;
  }

  void grow_spares()
  {
    auto chunk    = std::make_unique<Block[]>(chunk_blocks);
    Block* blocks = chunk.get();
    chunks_.push_back(std::move(chunk));
    for (std::size_t i = 0; i < chunk_blocks; ++i) {
      blocks[i].free_next = spare_;
      spare_              = &blocks[i];
    }
  }

  address_map<Block> map_;                        // every block, by address
  std::array<index_type, 2> global_;              // free blocks usable on any stream, per pool kind
  std::vector<std::unique_ptr<Block[]>> chunks_;  // descriptor storage
  Block* spare_{nullptr};                         // dead descriptors
};

}  // namespace gpukit::detail::caching
