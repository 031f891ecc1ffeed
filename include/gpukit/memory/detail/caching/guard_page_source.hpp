// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/guard_page_source.hpp: guard pages, the caching allocator's debug
// mode over growable segments (caching_allocator_debug_options::guard_pages): every block gets its
// own run of mapped pages and ENDS where the run ends; the page after the run stays reserved and
// unmapped, so an access past the block's end faults. A free waits for the block's streams and
// unmaps its pages (the allocator's part), so a later access faults too; new blocks take fresh
// addresses, going round the reservation before reusing any. Not public API.
//
// Single-threaded: the allocator calls it under its pool lock. Owns which blocks were placed with
// guard pages (allocated now), the addresses of those freed lately (so that a second free of one,
// whose pages are gone, is reported as a double free) and the cursor past the latest run. Carves
// the blocks with the block index it is given; the growable segments it places them in are the
// allocator's: their page size and unmapped ranges come as parameters, and the steps that reserve
// and map address space or index a free block come as callables at the call.
//
// Layout of one placement, in a growable segment's unmapped range u:
//   [u, unmapped][free block: any stream's][the block][the rest of u, unmapped: its first page
//   is the guard page]
// where the free block and the block fill a run of mapped pages that begins at least one
// unmapped page after a mapped page before it.
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <unordered_set>
#include <vector>

namespace gpukit::detail::caching {

/// Guard pages; see the top of this file.
template <class Runtime, class Block>
class guard_page_source {
 public:
  using stream_type = typename Runtime::stream_type;

  /// Guard pages (off until enable()) for an allocator of `device` whose blocks are in `blocks`.
  guard_page_source(int device, block_index<Block>& blocks) : device_{device}, blocks_{blocks} {}
  ~guard_page_source()                                   = default;
  guard_page_source(guard_page_source const&)            = delete;
  guard_page_source& operator=(guard_page_source const&) = delete;
  guard_page_source(guard_page_source&&)                 = delete;
  guard_page_source& operator=(guard_page_source&&)      = delete;

  /// Turns guard pages on (at the allocator's construction, once its segments are growable).
  void enable() noexcept { on_ = true; }
  /// Whether blocks get guard pages (outside graph captures).
  [[nodiscard]] bool on() const noexcept { return on_; }

  /// A block of `size` bytes for `bytes` requested, allocated on `stream`, placed on its own pages
  /// (place()); when there is no room, `reclaim()` runs once (it frees pages) and placing is tried
  /// again. nullptr when there is still no room. Growable segments of the request's pool kind:
  /// `page`, `unmapped`, `reserve`, `map_run`, `insert_free` as for place().
  /// @throws what the callables throw (the runtime failing otherwise)
  template <class Reserve, class MapRun, class InsertFree, class Reclaim>
  Block* allocate(std::size_t bytes, std::size_t size, stream_type stream, std::size_t page,
                  std::vector<Block*> const& unmapped, Reserve&& reserve, MapRun&& map_run,
                  InsertFree&& insert_free, Reclaim&& reclaim)
  {
    bool oom = false;
    Block* b = place(size, stream, page, unmapped, oom, reserve, map_run, insert_free);
    if (b == nullptr) {
      reclaim();
      oom = false;
      b   = place(size, stream, page, unmapped, oom, reserve, map_run, insert_free);
      if (b == nullptr) { return nullptr; }
    }
    b->requested = bytes;
    guarded_.insert(b->data());
    if (freed_.erase(b->data()) != 0) {  // the address is a new block's now
      freed_order_.erase(std::find(freed_order_.begin(), freed_order_.end(), b->data()));
    }
    return b;
  }

  /// Maps a run of pages for a block of `size` bytes and carves it: [unmapped][run][unmapped, at
  /// least one page]; within the run, the bytes before the block are a free block of every stream
  /// (given to `insert_free(block)`). The run goes in the unmapped range that range() finds, else
  /// in a new one from `reserve(bytes, oom)` (listed in `unmapped` by the segments' owner, or
  /// nullptr with `oom` set); `map_run(range, at, pages, oom)` maps `pages` pages of `range` from
  /// address `at` and takes them out of it, the rest staying unmapped and listed (it returns the
  /// run's block, or nullptr with `oom` set when out of memory). `page`, `unmapped`: the page size
  /// and the unmapped ranges of the pool kind. Returns the block (allocated, on `stream`), or
  /// nullptr.
  template <class Reserve, class MapRun, class InsertFree>
  Block* place(std::size_t size, stream_type stream, std::size_t page,
               std::vector<Block*> const& unmapped, bool& oom, Reserve&& reserve, MapRun&& map_run,
               InsertFree&& insert_free)
  {
    std::size_t const pages = (size + page - 1) / page;
    std::uintptr_t at       = 0;
    Block* u                = range(pages, page, unmapped, at);
    if (u == nullptr) {
      u = reserve(size + 2 * page, oom);
      if (u == nullptr) { return nullptr; }
      at = u->address();
    }
    Block* run = map_run(u, at, pages, oom);
    if (run == nullptr) { return nullptr; }
    cursor_  = at + pages * page;
    Block* b = run;
    if (pages * page > size) { b = blocks_.split_off(run, pages * page - size); }
    b->state.store(block_state::allocated, std::memory_order_relaxed);  // no merge into it
    if (b != run) {
      run->global   = true;  // never used: any stream's
      run->free_seq = 0;
      insert_free(run);
    }
    b->stream = stream;
    b->global = false;
    return b;
  }

  /// The unmapped block of `unmapped` with room for a run of `pages` pages of `page` bytes (after
  /// an unmapped page when a mapped one precedes it, and before one more unmapped page), at `at`:
  /// the lowest address at or beyond the cursor, else (round the address space once) the lowest of
  /// all. nullptr when none has room.
  [[nodiscard]] Block* range(std::size_t pages, std::size_t page,
                             std::vector<Block*> const& unmapped, std::uintptr_t& at) const
  {
    Block* ahead            = nullptr;
    Block* lowest           = nullptr;
    std::uintptr_t ahead_at = std::numeric_limits<std::uintptr_t>::max(), lowest_at = ahead_at;
    for (Block* u : unmapped) {
      std::uintptr_t const lo = u->address(), hi = lo + u->size;
      std::uintptr_t start = lo + (u->prev != nullptr ? page : 0);
      if (cursor_ > lo && cursor_ < hi) { start = std::max(start, cursor_); }
      if (start >= hi || hi - start < (pages + 1) * page) { continue; }
      if (start >= cursor_ && start < ahead_at) {
        ahead    = u;
        ahead_at = start;
      }
      if (start < lowest_at) {
        lowest    = u;
        lowest_at = start;
      }
    }
    at = ahead != nullptr ? ahead_at : lowest_at;
    return ahead != nullptr ? ahead : lowest;
  }

  /// The end of the latest run: new runs go beyond it.
  [[nodiscard]] std::uintptr_t cursor() const noexcept { return cursor_; }

  /// Whether the block at `ptr` was placed with guard pages (and is allocated).
  [[nodiscard]] bool holds(void* ptr) const { return guarded_.count(ptr) != 0; }

  /// Checks a free of `ptr` against the blocks with guard pages freed lately.
  /// @throws gpukit::logic_error when `ptr` is one of them: a double free (its pages are unmapped)
  void check_free(void* ptr) const
  {
    GPUKIT_EXPECTS(freed_.count(ptr) == 0,
                   "deallocate: double free of " + detail::hex(ptr) +
                     " (a block with guard pages, freed before: its pages are unmapped, device " +
                     std::to_string(device_) + ")");
  }

  /// The block at `ptr`, freed while a graph is being captured (no waiting), takes the ordinary
  /// free path: it has guard pages no more.
  void forget(void* ptr) { guarded_.erase(ptr); }

  /// Waits for the work queued on `streams` (a block's: its free's and record_stream's) on
  /// `device` of `runtime`. A stream found destroyed costs a device synchronization.
  /// @throws gpukit::cuda_error when a wait fails
  static void wait_for_streams(Runtime& runtime, int device,
                               std::vector<stream_type> const& streams)
  {
    device_guard<Runtime> guard{runtime, device};
    for (stream_type s : streams) {
      typename Runtime::error_type e = runtime.stream_synchronize(s);
      if (e == Runtime::invalid_resource_handle) { e = runtime.device_synchronize(); }
      GPUKIT_CUDA_TRY(e, "deallocate: waiting for the work on a block with guard pages");
    }
  }

  /// Block b, with guard pages, is freed (its streams waited for): it is no longer held, its work
  /// is done (any stream's, nothing recorded), and its address is kept among the `keep` (at least
  /// 1) freed last, for check_free. Returns b, for the pool's free index.
  Block* retire(Block* b, std::size_t keep)
  {
    void* const ptr = b->data();
    b->recorded.clear();
    guarded_.erase(ptr);
    freed_.insert(ptr);
    freed_order_.push_back(ptr);
    while (freed_order_.size() > std::max<std::size_t>(keep, 1)) {
      freed_.erase(freed_order_.front());
      freed_order_.pop_front();
    }
    b->stream = stream_type{};
    b->global = true;
    return b;
  }

 private:
  int device_;
  block_index<Block>& blocks_;
  bool on_{false};                     // fixed at construction
  std::unordered_set<void*> guarded_;  // blocks placed with guard pages, allocated now
  std::deque<void*> freed_order_;      // guarded blocks freed lately, oldest first
  std::unordered_set<void*> freed_;    // the same, for lookups
  std::uintptr_t cursor_{0};           // the end of the latest run: new runs go beyond it
};

}  // namespace gpukit::detail::caching
