// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/growable_source.hpp: the growable (virtual memory) segments of the
// caching allocator. Not public API.
//
// A growable segment is a range of reserved addresses of one pool kind, first taken for one
// stream, cut into pages (the large pool's page is `growable_page_bytes`, the small pool's the
// device's granularity). Each page is mapped to its own physical allocation, or not at all. Its
// blocks tile the range as in any segment; free and allocated blocks lie on mapped pages only,
// and the unmapped pages form blocks of state `unmapped`, which are in no free index but listed
// here per kind.
//
// Growth (grow, when no free block fits): pick the unmapped block that needs the fewest new pages,
// counting the free block just before it when the requesting stream may use it; map that many
// pages at its start (physical pages held spare first, then new ones) in one transaction; the new
// pages become a free block that merges with the free block before them. Before creating pages,
// the layer "harvests": it unmaps fully free pages elsewhere whose work has completed (blocks
// usable by every stream, or blocks of streams that are idle) and keeps their physical memory as
// spare pages, so that memory moves to where the pool grows instead of the pool growing.
//
// Release (release: the allocator's release, trim and out-of-memory ladder): synchronizes the
// streams that own free blocks (only those, on the allocator's device), unmaps every fully free
// page, releases spare pages, and returns address ranges that hold nothing.
//
// Sharing (export_pages, with growable_shareable): a page holding a shared block is exported once
// as a POSIX descriptor, kept in its segment until the page is unmapped (or the allocator
// destroyed), when it is closed: its physical memory may then hold another range's page, and a
// descriptor must never name memory other than the page it was exported for. Peers (grant) get
// access to every mapped page, and to each page when it is mapped.
//
// Owns: the page size of each pool kind, the unmapped blocks of each kind, the spare physical
// pages (unmapped, held, counted as reserved), the growable segments' descriptors, and the peer
// devices granted access. Invariants:
// - A map is one transaction: when a step fails part-way, every page it mapped is unmapped again
//   and the physical memory it created released, so the pool is as it was and the next allocation
//   works (a page whose undo fails stays mapped but inaccessible inside its unmapped block, is
//   never mapped twice, and is unmapped by the next release).
// - Spare pages are mapped before new physical memory is created, and free pages whose work has
//   completed are unmapped into spare pages before new memory is created.
// - Unmapped blocks are page-aligned, listed once, and never next to another unmapped block.
// - A page's exported descriptor lives only while the page is mapped.
// - Every peer granted has access to every mapped page.
//
// Single-threaded: the allocator calls it under its pool lock. It keeps the runtime and the
// device; what else a call needs of the allocator around it comes as `pool`, which the allocator
// builds at the call (basic_caching_allocator::segment_pool), and which provides:
//   blocks()                          the block index (block_index<Block>&)
//   reserved()                        bytes held from the device (std::size_t&)
//   count(&caching_allocator_stats::num_x, n)  adds n to an event counter
//   limit()                           the allocator's limit in bytes (0: none)
//   capturing()                       whether a graph capture or capture window is under way
//   streams()                         the stream pools: a range of pointers to objects with
//                                     `stream` and `index[2]` (free blocks of pool kind 0 and 1)
//   count_reserved(kind, delta)       reserved bytes of a pool kind, in the statistics
//   count_segment(kind, delta)        segments of a pool kind, in the statistics (raises peaks)
//   raise_reserved_peak()             after pages were mapped
//   record(action, address, bytes, stream)   a segment event for the recorder
//   insert_free(b) -> Block*          indexes free block b where its fields say, merged with its
//                                     free neighbours; returns the block that holds its bytes
//   unindex(b)                        takes free block b out of its index
//   find_free(size, kind, stream) -> Block*   a free block for `size` bytes on `stream`
//   next_free_seq(stream)             the free sequence number of a block entering stream's pool
//   is_capturing(stream)              whether `stream` takes part in a graph capture
//   retire_dead_stream(stream)        a destroyed stream's blocks go to every stream
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/segment.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gpukit::detail::caching {

/// The growable segments, their pages and spare pages; see the top of this file.
template <class Runtime, class Block>
class growable_source {
 public:
  using segment_type    = segment<Runtime>;
  using stream_type     = typename Runtime::stream_type;
  using physical_handle = typename Runtime::physical_handle;
  using error_type      = typename Runtime::error_type;

  /// Growable segments of `device` of `runtime`; nothing is reserved yet, and no page size is set
  /// (set_up does it).
  growable_source(Runtime& runtime, int device) noexcept : runtime_{runtime}, device_{device} {}
  /// Deletes the descriptors; the memory is the owner's to give back first (teardown_*).
  ~growable_source()                                 = default;
  growable_source(growable_source const&)            = delete;
  growable_source& operator=(growable_source const&) = delete;
  growable_source(growable_source&&)                 = delete;
  growable_source& operator=(growable_source&&)      = delete;

  /// Takes the settings of `options` (the allocator's, settled): the small pool's page is the
  /// device's mapping granularity, the large pool's `growable_page_bytes` rounded up to it; ranges
  /// of `growable_reserve_bytes`, else 9/8 of `device_total`.
  /// @throws gpukit::cuda_error when the granularity cannot be read
  /// @throws gpukit::logic_error when it is 0 or not a multiple of `alignment`
  void set_up(caching_allocator_options const& options, std::size_t device_total,
              std::size_t alignment)
  {
    std::size_t granularity = 0;
    GPUKIT_CUDA_TRY(runtime_.vm_granularity(granularity, device_));
    GPUKIT_EXPECTS(granularity != 0 && granularity % alignment == 0,
                   "caching_allocator: the device reports a mapping granularity of " +
                     std::to_string(granularity) + " bytes");
    page_bytes_[0] = granularity;
    page_bytes_[1] = detail::round_up(options.growable_page_bytes, granularity);
    reserve_bytes_ = options.growable_reserve_bytes;
    device_total_  = device_total;
    shareable_     = options.growable_shareable;
    nvtx_annotate_ = options.nvtx_annotate;
  }

  // ---- what it holds ----------------------------------------------------------------------------

  /// The mapping unit of pool kind `kind` (0 small, 1 large).
  [[nodiscard]] std::size_t page_bytes(int kind) const noexcept { return page_bytes_[kind]; }
  /// The unmapped blocks of pool kind `kind`.
  [[nodiscard]] std::vector<Block*> const& unmapped(int kind) const noexcept
  {
    return unmapped_[kind];
  }
  /// Spare physical pages held on list `kind` (both kinds use list 0 when their pages have the
  /// same size), each of page_bytes(kind).
  [[nodiscard]] std::size_t spare_pages(int kind) const noexcept { return spare_[kind].size(); }
  /// The growable segments, oldest first (but for ranges given back).
  [[nodiscard]] std::vector<std::unique_ptr<segment_type>> const& segments() const noexcept
  {
    return segments_;
  }
  /// The devices grant() has granted, in the order granted.
  [[nodiscard]] std::vector<int> const& peers() const noexcept { return peers_; }

  // ---- growth -----------------------------------------------------------------------------------

  /// No free block fits `size`: maps pages where the fewest are needed (see the top of this file).
  /// Returns a free block of at least `size` bytes usable on `stream`, or nullptr with `oom` set.
  /// @throws gpukit::cuda_error when the runtime fails otherwise (the pool is as it was)
  template <class Pool>
  Block* grow(std::size_t size, int kind, stream_type stream, bool& oom, Pool&& pool)
  {
    std::size_t const page = page_bytes_[kind];
    std::size_t best_pages = 0;
    Block* best            = fewest_pages(size, kind, stream, best_pages);
    if (best == nullptr) {
      best = reserve_range(size, kind, stream, oom, pool);
      if (best == nullptr) { return nullptr; }
      best_pages = (size + page - 1) / page;
    }
    GPUKIT_DETAIL_SLOW_PATH_RANGEF(
      ::gpukit::categories::allocator, "grow segment %.1f MiB (%zu pages) stream %p",
      detail::mib(best_pages * page), best_pages, detail::stream_address(stream));
    // Physical memory of free pages elsewhere first, new memory only for the rest.
    auto const& spares = spare_[spare_kind(kind)];
    if (spares.size() < best_pages) { harvest_pages(kind, best_pages - spares.size(), best, pool); }
    best = map_run(best, best->address(), best_pages, oom, pool);
    if (best == nullptr) { return nullptr; }
    best->state.store(block_state::free, std::memory_order_relaxed);
    best->stream   = stream;
    best->global   = false;
    best->free_seq = pool.next_free_seq(stream);
    Block* merged  = pool.insert_free(best);
    return merged->size >= size ? merged : pool.find_free(size, kind, stream);
  }

  /// Reserves a new growable segment for a request of `size` bytes: its whole range is one unmapped
  /// block, returned; nullptr with `oom` set when no address space is left.
  /// @throws gpukit::cuda_error when the runtime fails otherwise
  template <class Pool>
  Block* reserve_range(std::size_t size, int kind, stream_type stream, bool& oom, Pool&& pool)
  {
    std::size_t const page = page_bytes_[kind];
    std::size_t bytes      = reserve_bytes_ != 0 ? detail::round_up(reserve_bytes_, page)
                                                 : detail::round_up(device_total_ / 8 * 9, page);
    bytes                  = std::max(bytes, detail::round_up(size, page));
    auto seg               = std::make_unique<segment_type>();
    Block* b               = pool.blocks().new_block();
    void* p                = nullptr;
    error_type e           = Runtime::success;
    GPUKIT_DETAIL_SLOW_PATH_RANGEF(::gpukit::categories::allocator,
                                   "reserve growable segment %.1f MiB", detail::mib(bytes));
    {
      device_guard<Runtime> guard{runtime_, device_};
      e = runtime_.vm_reserve(&p, bytes, 0);
    }
    if (e != Runtime::success) {
      pool.blocks().recycle(b);
      if (e == Runtime::out_of_memory) {
        oom = true;
        return nullptr;
      }
      GPUKIT_CUDA_TRY(e, "vm_reserve of a growable segment");
    }
    seg->ptr      = p;
    seg->size     = bytes;
    seg->kind     = kind;
    seg->growable = true;
    seg->page     = page;
    seg->handles.assign(bytes / page, physical_handle{});
    seg->mapped.assign(bytes / page, 0);
    if (shareable_) { seg->fds.assign(bytes / page, -1); }
    if (nvtx_annotate_) {
      seg->nvtx_heap = register_memory_heap(p, bytes, "gpukit caching allocator (growable)");
    }
    pool.blocks().add_segment(b, p, bytes, seg.get());
    b->kind   = kind;
    b->stream = stream;
    segments_.push_back(std::move(seg));
    pool.count_segment(kind, 1);
    insert_unmapped(b, pool.blocks());
    return b;
  }

  /// Maps `pages` pages at `at` inside unmapped block `u` (a page boundary), in one transaction
  /// (see map_pages), and takes them out of it: returns the block of the run (state unmapped
  /// still, listed nowhere: the caller makes it free or allocated); what remains of u before and
  /// after the run stays unmapped and listed. nullptr with `oom` set when memory ran out (nothing
  /// changed then).
  /// @throws gpukit::cuda_error for other errors (the mapping undone)
  template <class Pool>
  Block* map_run(Block* u, std::uintptr_t at, std::size_t pages, bool& oom, Pool&& pool)
  {
    auto* seg              = static_cast<segment_type*>(u->segment);
    std::size_t const page = seg->page;
    if (!map_pages(*seg, (at - reinterpret_cast<std::uintptr_t>(seg->ptr)) / page, pages, oom,
                   pool)) {
      return nullptr;
    }
    auto& list = unmapped_[u->kind];
    list.erase(std::find(list.begin(), list.end(), u));
    Block* run = u;
    if (at > u->address()) {
      run = pool.blocks().split_off(u, at - u->address());
      list.push_back(u);
    }
    if (pages * page < run->size) { list.push_back(pool.blocks().split_off(run, pages * page)); }
    return run;
  }

  // ---- giving back ------------------------------------------------------------------------------

  /// Unmaps up to `wanted` fully free pages at the top of free block b (whose work has completed:
  /// the caller makes sure) and keeps their physical memory as spare pages. The unmapped pages
  /// become an unmapped block; what remains of b stays free. Stops at the first unmap that fails
  /// (that page stays mapped and free; the error is returned through `error`). Returns the pages
  /// unmapped.
  template <class Pool>
  std::size_t unmap_free_pages(Block* b, std::size_t wanted, error_type& error, Pool&& pool)
  {
    auto* seg                = static_cast<segment_type*>(b->segment);
    std::size_t const page   = seg->page;
    std::uintptr_t const va0 = reinterpret_cast<std::uintptr_t>(seg->ptr);
    std::size_t const off    = b->address() - va0;
    std::size_t const end    = off + b->size;
    std::size_t const ps     = (off + page - 1) / page;  // first page wholly inside b
    std::size_t const pe     = end / page;               // one past the last
    if (pe <= ps || wanted == 0) { return 0; }
    std::size_t const lo = pe - std::min(pe - ps, wanted);
    std::size_t done     = 0;
    for (std::size_t i = pe; i-- > lo;) {
      if (error_type const e = unmap_page(*seg, i, pool); e != Runtime::success) {
        error = e;
        break;
      }
      ++done;
    }
    if (done == 0) { return 0; }
    std::size_t const first = pe - done;
    pool.record(memory_event::action::segment_free, va0 + first * page, done * page,
                b->global ? stream_type{} : b->stream);
    pool.unindex(b);
    Block* mid = b;
    if (first * page > off) { mid = pool.blocks().split_off(b, first * page - off); }
    Block* tail = nullptr;
    if (end > pe * page) { tail = pool.blocks().split_off(mid, done * page); }
    mid->state.store(block_state::unmapped, std::memory_order_relaxed);  // no merge into it
    if (mid != b) { pool.insert_free(b); }
    if (tail != nullptr) { pool.insert_free(tail); }
    insert_unmapped(mid, pool.blocks());
    return done;
  }

  /// Unmaps the free pages of growable segments (of `only_stream`'s blocks, or of every stream),
  /// releases spare and unmapped physical memory until at most `target` bytes are reserved, and
  /// (when releasing everything) returns address ranges that hold nothing. Waits only on the
  /// streams that own the free blocks it unmaps; while a graph is captured, releases spare pages
  /// only. Returns the bytes released.
  /// @throws gpukit::cuda_error when the runtime fails
  template <class Pool>
  std::size_t release(std::size_t target, stream_type const* only_stream, Pool&& pool)
  {
    GPUKIT_DETAIL_SLOW_PATH_RANGE(::gpukit::categories::allocator,
                                  "trim growable segments: unmap free pages, release spare ones");
    std::size_t const before = pool.reserved();
    device_guard<Runtime> guard{runtime_, device_};
    release_spare_pages(target, pool);
    if (pool.capturing()) {
      return before - pool.reserved();  // no synchronization while a graph is being captured
    }
    unmap_stranded_pages(pool);
    release_spare_pages(target, pool);
    unmap_released_blocks(target, only_stream, pool);
    if (only_stream == nullptr && target == 0) { free_empty_ranges(pool); }
    return before - pool.reserved();
  }

  // ---- sharing ----------------------------------------------------------------------------------

  /// The descriptors of pages [first, last] of `seg` (a growable segment of shareable pages), each
  /// exported (vm_export_shareable) at its first use and kept until the page is unmapped.
  /// @throws gpukit::cuda_error when the runtime refuses an export (those exported stay)
  std::vector<int> export_pages(segment_type& seg, std::size_t first, std::size_t last)
  {
    std::vector<int> fds;
    fds.reserve(last + 1 - first);
    device_guard<Runtime> guard{runtime_, device_};
    for (std::size_t i = first; i <= last; ++i) {
      if (seg.fds[i] < 0) {
        int fd = -1;
        GPUKIT_CUDA_TRY(
          runtime_.vm_export_shareable(fd, seg.handles[i]),
          "vm_export_shareable of page " + std::to_string(i) + " of a growable segment");
        seg.fds[i] = fd;
      }
      fds.push_back(seg.fds[i]);
    }
    return fds;
  }

  /// Grants device `peer` access to every page mapped now and to every page mapped later. The
  /// allocator's own device, or a peer granted before, changes nothing.
  /// @throws gpukit::cuda_error when the runtime refuses (what was granted stays; `peer` is not
  ///         remembered, so a later call tries again)
  void grant(int peer)
  {
    if (peer == device_ || std::find(peers_.begin(), peers_.end(), peer) != peers_.end()) {
      return;
    }
    device_guard<Runtime> guard{runtime_, device_};
    for (auto const& seg : segments_) {
      // Runs of adjacent mapped pages: vm_set_access takes whole adjacent mappings.
      std::size_t const n = seg->mapped.size();
      for (std::size_t i = 0; i < n;) {
        if (seg->mapped[i] == 0) {
          ++i;
          continue;
        }
        std::size_t j = i;
        while (j < n && seg->mapped[j] != 0) { ++j; }
        GPUKIT_CUDA_TRY(runtime_.vm_set_access(page_address(*seg, i), (j - i) * seg->page, peer),
                        "vm_set_access for peer device " + std::to_string(peer));
        i = j;
      }
    }
    peers_.push_back(peer);
  }

  // ---- teardown (never throws: each runtime call goes through `call`, which counts failures) ----

  /// Releases the spare pages.
  template <class Call>
  void teardown_spares(Call& call) noexcept
  {
    for (auto& spares : spare_) {
      for (physical_handle h : spares) {
        call([&] { return runtime_.vm_release(h); });
      }
    }
  }
  /// Unmaps and releases the mapped pages of growable segment `seg` (closing their descriptors)
  /// and frees its range. Its descriptor stays this layer's.
  template <class Call>
  void teardown_segment(segment_type& seg, Call& call) noexcept
  {
    for (std::size_t i = 0; i < seg.mapped.size(); ++i) {
      if (seg.mapped[i] == 0) { continue; }
      void* at = page_address(seg, i);
      close_page_fd(seg, i);
      call([&] { return runtime_.vm_unmap(at, seg.page); });
      call([&] { return runtime_.vm_release(seg.handles[i]); });
    }
    call([&] { return runtime_.vm_free(seg.ptr, seg.size); });
  }

 private:
  /// A page map_pages has mapped, until the transaction ends.
  struct mapped_page {
    std::size_t index{0};
    physical_handle handle{};
    bool fresh{false};  // created by this transaction
  };

  // The list of spare pages a pool kind uses: one for both when their pages have the same size.
  [[nodiscard]] int spare_kind(int kind) const noexcept
  {
    return page_bytes_[0] == page_bytes_[1] ? 0 : kind;
  }

  static void* page_address(segment_type const& seg, std::size_t i) noexcept
  {
    return static_cast<void*>(static_cast<char*>(seg.ptr) + i * seg.page);
  }

  // Makes b an unmapped block, merged with unmapped neighbours and listed once.
  void insert_unmapped(Block* b, block_index<Block>& blocks)
  {
    auto& list  = unmapped_[b->kind];
    auto unlist = [&](Block* x) {
      auto it = std::find(list.begin(), list.end(), x);
      if (it != list.end()) {
        *it = list.back();
        list.pop_back();
      }
    };
    auto is_unmapped = [](Block const* x) {
      return x != nullptr && x->state.load(std::memory_order_relaxed) == block_state::unmapped;
    };
    b->state.store(block_state::unmapped, std::memory_order_relaxed);
    b->global       = false;
    b->stream       = stream_type{};
    b->capture_pool = 0;
    if (is_unmapped(b->prev)) {
      unlist(b);
      b = b->prev;
      blocks.absorb_next(b);
    }
    if (is_unmapped(b->next)) {
      unlist(b->next);
      blocks.absorb_next(b);
    }
    if (std::find(list.begin(), list.end(), b) == list.end()) { list.push_back(b); }
  }

  // The unmapped block of pool `kind` that needs the fewest new pages for `size` bytes on `stream`
  // (counting the free block before it when `stream` may use it; the lowest address on a tie),
  // with that count in `pages`; nullptr when none has room.
  Block* fewest_pages(std::size_t size, int kind, stream_type stream, std::size_t& pages) const
  {
    std::size_t const page = page_bytes_[kind];
    Block* best            = nullptr;
    pages                  = std::numeric_limits<std::size_t>::max();
    for (Block* u : unmapped_[kind]) {
      std::size_t const have = free_before(u, stream);
      std::size_t const need = size > have ? size - have : 0;
      std::size_t const n    = std::max<std::size_t>(1, (need + page - 1) / page);
      if (n * page > u->size) { continue; }
      if (n < pages || (n == pages && u->address() < best->address())) {
        best  = u;
        pages = n;
      }
    }
    return best;
  }

  // The bytes of the free block just before unmapped block u, when `stream` may use it (0 if
  // none).
  static std::size_t free_before(Block const* u, stream_type stream) noexcept
  {
    Block const* p = u->prev;
    if (p == nullptr || p->state.load(std::memory_order_relaxed) != block_state::free ||
        p->capture_pool != 0 || !(p->global || p->stream == stream)) {
      return 0;
    }
    return p->size;
  }

  // Maps pages [first, first + count) of seg, in one transaction: physical memory from the spare
  // pages, else new (vm_create, within the limit); each page mapped, then the range made
  // accessible (to the device and to every peer). On any failure every page this call mapped is
  // unmapped again and the physical memory it created released, so that the pool is as it was (a
  // page whose undo fails stays mapped but inaccessible inside its unmapped block, and is retried
  // by release). Returns false with `oom` set when memory ran out; throws gpukit::cuda_error for
  // other errors.
  template <class Pool>
  bool map_pages(segment_type& seg, std::size_t first, std::size_t count, bool& oom, Pool& pool)
  {
    std::size_t const page = seg.page;
    int const kind         = spare_kind(seg.kind);
    std::vector<mapped_page> now;
    now.reserve(count);
    device_guard<Runtime> guard{runtime_, device_};
    for (std::size_t i = first; i < first + count; ++i) {
      if (seg.mapped[i] != 0) { continue; }  // left mapped by an undo that failed: access only
      mapped_page m{i, physical_handle{}, false};
      if (error_type const e = take_page(kind, page, m, pool); e != Runtime::success) {
        return undo_map(seg, now, e, oom, "vm_create", pool);
      }
      if (error_type const e = runtime_.vm_map(page_address(seg, i), page, m.handle);
          e != Runtime::success) {
        give_back_page(kind, page, m, pool);
        return undo_map(seg, now, e, oom, "vm_map", pool);
      }
      now.push_back(m);
    }
    if (error_type const e =
          runtime_.vm_set_access(page_address(seg, first), count * page, device_);
        e != Runtime::success) {
      // Pages left mapped by an earlier failed undo are in the range too: they stay as they were.
      return undo_map(seg, now, e, oom, "vm_set_access", pool);
    }
    if (error_type const e = grant_peers(page_address(seg, first), count * page);
        e != Runtime::success) {
      return undo_map(seg, now, e, oom, "vm_set_access for a peer device", pool);
    }
    for (auto const& m : now) {
      seg.handles[m.index] = m.handle;
      seg.mapped[m.index]  = 1;
      ++seg.mapped_pages;
      pool.count(&caching_allocator_stats::num_pages_reused, m.fresh ? 0 : 1);
      count_mapped_page(seg, m.fresh, pool);
    }
    pool.count(&caching_allocator_stats::num_device_allocs, now.size());
    pool.raise_reserved_peak();
    pool.record(memory_event::action::segment_alloc,
                reinterpret_cast<std::uintptr_t>(page_address(seg, first)), count * page,
                stream_type{});
    return true;
  }

  // A page now mapped in seg counts as its pool kind's reserved memory: a new one (`fresh`), or a
  // spare one, which leaves its list's pool kind.
  template <class Pool>
  void count_mapped_page(segment_type const& seg, bool fresh, Pool& pool)
  {
    if (!fresh) { pool.count_reserved(spare_kind(seg.kind), -static_cast<std::int64_t>(seg.page)); }
    pool.count_reserved(seg.kind, static_cast<std::int64_t>(seg.page));
  }

  // Physical memory for one page: a spare page, else a new one within the limit
  // (out_of_memory beyond it).
  template <class Pool>
  error_type take_page(int kind, std::size_t page, mapped_page& m, Pool& pool)
  {
    if (!spare_[kind].empty()) {
      m.handle = spare_[kind].back();
      spare_[kind].pop_back();
      return Runtime::success;
    }
    std::size_t const limit = pool.limit();
    if (limit != 0 && pool.reserved() + page > limit) { return Runtime::out_of_memory; }
    error_type const e = runtime_.vm_create(m.handle, page, device_, shareable_);
    if (e != Runtime::success) { return e; }
    m.fresh = true;
    pool.reserved() += page;
    pool.count(&caching_allocator_stats::num_pages_created);
    return Runtime::success;
  }

  // An unmapped page's memory: released if this transaction created it, else (or if that fails)
  // held as a spare page, released by release().
  template <class Pool>
  void give_back_page(int kind, std::size_t page, mapped_page const& m, Pool& pool)
  {
    if (m.fresh && runtime_.vm_release(m.handle) == Runtime::success) {
      pool.reserved() -= page;
      pool.count(&caching_allocator_stats::num_pages_released);
    } else {
      spare_[kind].push_back(m.handle);
      if (m.fresh) { pool.count_reserved(kind, static_cast<std::int64_t>(page)); }
    }
  }

  // Undoes a failed transaction (the pages in `now`, last first), then reports `e`: false with
  // `oom` set when memory ran out, else throws gpukit::cuda_error naming `call`.
  template <class Pool>
  bool undo_map(segment_type& seg, std::vector<mapped_page> const& now, error_type e, bool& oom,
                char const* call, Pool& pool)
  {
    for (auto it = now.rbegin(); it != now.rend(); ++it) {
      if (runtime_.vm_unmap(page_address(seg, it->index), seg.page) != Runtime::success) {
        seg.handles[it->index] = it->handle;  // still mapped, never made accessible
        seg.mapped[it->index]  = 1;
        ++seg.mapped_pages;
        count_mapped_page(seg, it->fresh, pool);
        continue;
      }
      give_back_page(spare_kind(seg.kind), seg.page, *it, pool);
    }
    if (e == Runtime::out_of_memory) {
      oom = true;
      return false;
    }
    GPUKIT_CUDA_TRY(e,
                    std::string{call} + " while mapping growable pages (the mapping was undone)");
    return false;
  }

  // Gives every peer device access to [va, va + bytes), whole mapped pages.
  error_type grant_peers(void* va, std::size_t bytes)
  {
    for (int peer : peers_) {
      if (error_type const e = runtime_.vm_set_access(va, bytes, peer); e != Runtime::success) {
        return e;
      }
    }
    return Runtime::success;
  }

  // Unmaps page i of seg and keeps its physical memory as a spare page. Returns the runtime's
  // error (the page then stays mapped).
  template <class Pool>
  error_type unmap_page(segment_type& seg, std::size_t i, Pool& pool)
  {
    error_type const e = runtime_.vm_unmap(page_address(seg, i), seg.page);
    if (e != Runtime::success) { return e; }
    close_page_fd(seg, i);
    spare_[spare_kind(seg.kind)].push_back(seg.handles[i]);
    pool.count_reserved(seg.kind, -static_cast<std::int64_t>(seg.page));
    pool.count_reserved(spare_kind(seg.kind), static_cast<std::int64_t>(seg.page));
    seg.handles[i] = physical_handle{};
    seg.mapped[i]  = 0;
    --seg.mapped_pages;
    pool.count(&caching_allocator_stats::num_device_frees);
    return Runtime::success;
  }

  // Closes the descriptor page i of seg was exported as, if any.
  static void close_page_fd(segment_type& seg, std::size_t i) noexcept
  {
    if (i < seg.fds.size() && seg.fds[i] >= 0) {
      ::close(seg.fds[i]);
      seg.fds[i] = -1;
    }
  }

  // Unmaps up to `wanted` free pages of pool `kind` whose work has completed, as spare pages.
  // Never waits: a block qualifies when every stream may use it (its work is known complete) or
  // when the stream that owns it is idle. The neighbours of `keep` (the unmapped range about to be
  // mapped, whose free block before it becomes part of the new block) are left alone.
  template <class Pool>
  std::size_t harvest_pages(int kind, std::size_t wanted, Block const* keep, Pool& pool)
  {
    if (wanted == 0 || pool.capturing()) { return 0; }
    device_guard<Runtime> guard{runtime_, device_};
    std::vector<Block*> donors = page_donors(kind, keep, pool);
    // Largest first: fewer blocks split for the same pages.
    std::sort(donors.begin(), donors.end(), [](Block* a, Block* b) { return a->size > b->size; });
    std::size_t got = 0;
    for (Block* b : donors) {
      error_type error = Runtime::success;
      got += unmap_free_pages(b, wanted - got, error, pool);
      if (error != Runtime::success || got >= wanted) { break; }  // a failed unmap: grow instead
    }
    return got;
  }

  // The free growable blocks whose work is known complete (global, or of an idle stream) and that
  // hold a whole page, of pool `kind` (and of the other kind when the pages have the same size);
  // the neighbours of `keep` stay.
  template <class Pool>
  std::vector<Block*> page_donors(int kind, Block const* keep, Pool& pool)
  {
    std::vector<Block*> donors;
    auto consider = [&](Block* b) {
      if (b != keep->prev && b != keep->next && holds_free_page(b)) { donors.push_back(b); }
    };
    // Both pools' pages serve either pool when their pages have the same size.
    int const kinds[2] = {kind, 1 - kind};
    int const nkinds   = page_bytes_[0] == page_bytes_[1] ? 2 : 1;
    for (int k = 0; k < nkinds; ++k) { pool.blocks().global(kinds[k]).for_each(consider); }
    for (auto& sp : pool.streams()) {
      bool any = false;
      for (int k = 0; k < nkinds; ++k) { any = any || !sp->index[kinds[k]].empty(); }
      if (!any || pool.is_capturing(sp->stream)) { continue; }  // a query would end its capture
      error_type const q = runtime_.stream_query(sp->stream);
      // Busy, or destroyed (retired by the next migration or release): not a donor now.
      if (q == Runtime::not_ready || q == Runtime::invalid_resource_handle) { continue; }
      GPUKIT_CUDA_TRY(q, "stream_query");
      for (int k = 0; k < nkinds; ++k) { sp->index[kinds[k]].for_each(consider); }
    }
    return donors;
  }

  // Whether free block b of a growable segment (and of no capture) covers a whole page.
  static bool holds_free_page(Block const* b) noexcept
  {
    auto const* seg = static_cast<segment_type const*>(b->segment);
    if (!seg->growable || b->capture_pool != 0) { return false; }
    std::size_t const off = b->address() - reinterpret_cast<std::uintptr_t>(seg->ptr);
    return (off + b->size) / seg->page > (off + seg->page - 1) / seg->page;
  }

  // Releases spare physical pages until at most `target` bytes are reserved.
  template <class Pool>
  void release_spare_pages(std::size_t target, Pool& pool)
  {
    for (int k = 0; k < 2; ++k) {
      auto& spares = spare_[k];
      while (!spares.empty() && pool.reserved() > target) {
        GPUKIT_CUDA_TRY(runtime_.vm_release(spares.back()));
        spares.pop_back();
        pool.reserved() -= page_bytes_[k];
        pool.count_reserved(k, -static_cast<std::int64_t>(page_bytes_[k]));
        pool.count(&caching_allocator_stats::num_pages_released);
      }
    }
  }

  // Pages left mapped (never accessible) inside unmapped blocks by a failed undo: unmapped now.
  template <class Pool>
  void unmap_stranded_pages(Pool& pool)
  {
    for (auto const& seg : segments_) {
      for (Block* u : unmapped_[seg->kind]) {
        if (u->segment != seg.get()) { continue; }
        std::size_t const p0 =
          (u->address() - reinterpret_cast<std::uintptr_t>(seg->ptr)) / seg->page;
        for (std::size_t i = p0; i < p0 + u->size / seg->page; ++i) {
          if (seg->mapped[i] != 0) { GPUKIT_CUDA_TRY(unmap_page(*seg, i, pool)); }
        }
      }
    }
  }

  // Unmaps the free pages of the free growable blocks of `only_stream` (or of every stream),
  // largest block first, until at most `target` bytes are reserved; each stream that owns such
  // blocks is synchronized first (the work that used those pages goes first).
  template <class Pool>
  void unmap_released_blocks(std::size_t target, stream_type const* only_stream, Pool& pool)
  {
    std::vector<stream_type> const capturing = wait_for_growable_streams(only_stream, pool);
    std::vector<Block*> blocks;
    auto collect = [&](Block* b) {
      if (static_cast<segment_type const*>(b->segment)->growable && b->capture_pool == 0) {
        blocks.push_back(b);
      }
    };
    for (auto& sp : pool.streams()) {
      if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
      if (std::find(capturing.begin(), capturing.end(), sp->stream) != capturing.end()) {
        continue;
      }
      for (auto& idx : sp->index) { idx.for_each(collect); }
    }
    if (only_stream == nullptr) {
      for (auto& idx : pool.blocks().globals()) { idx.for_each(collect); }
    }
    std::sort(blocks.begin(), blocks.end(), [](Block* a, Block* b) { return a->size > b->size; });
    for (Block* b : blocks) {
      if (pool.reserved() <= target) { break; }
      error_type error = Runtime::success;
      unmap_free_pages(b, std::numeric_limits<std::size_t>::max(), error, pool);
      release_spare_pages(target, pool);
      GPUKIT_CUDA_TRY(error, "vm_unmap (releasing growable segment pages)");
    }
  }

  // The streams whose growable pages unmap_released_blocks unmaps are waited for first;
  // destroyed ones are retired (their blocks join the global pool) before any block is collected,
  // as retiring merges blocks. Streams being captured (begun on the stream directly) are not
  // waited for: returned, their pages stay.
  template <class Pool>
  std::vector<stream_type> wait_for_growable_streams(stream_type const* only_stream, Pool& pool)
  {
    std::vector<stream_type> dead, capturing;
    for (auto& sp : pool.streams()) {
      if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
      if (!holds_growable_free(*sp)) { continue; }
      if (pool.is_capturing(sp->stream)) {
        capturing.push_back(sp->stream);
        continue;
      }
      error_type const e = runtime_.stream_synchronize(sp->stream);
      if (e == Runtime::invalid_resource_handle) {
        dead.push_back(sp->stream);
      } else {
        GPUKIT_CUDA_TRY(e, "stream_synchronize (releasing growable segments)");
      }
      pool.count(&caching_allocator_stats::num_release_waits);
    }
    for (stream_type d : dead) { pool.retire_dead_stream(d); }
    return capturing;
  }

  // Whether stream pool sp holds a free block of a growable segment (and of no capture).
  template <class StreamPool>
  static bool holds_growable_free(StreamPool const& sp)
  {
    bool found = false;
    for (auto const& idx : sp.index) {
      idx.for_each([&](Block* b) {
        found =
          found || (static_cast<segment_type const*>(b->segment)->growable && b->capture_pool == 0);
      });
    }
    return found;
  }

  // Address ranges with nothing left in them go back to the runtime.
  template <class Pool>
  void free_empty_ranges(Pool& pool)
  {
    for (std::size_t i = 0; i < segments_.size();) {
      segment_type* seg = segments_[i].get();
      Block* head       = pool.blocks().find(seg->ptr);
      if (seg->mapped_pages != 0 || head == nullptr || head->next != nullptr ||
          head->state.load(std::memory_order_relaxed) != block_state::unmapped) {
        ++i;
        continue;
      }
      if (nvtx_annotate_) { unregister_memory_heap(seg->nvtx_heap); }  // before the free
      GPUKIT_CUDA_TRY(runtime_.vm_free(seg->ptr, seg->size));
      auto& list = unmapped_[seg->kind];
      list.erase(std::find(list.begin(), list.end(), head));
      pool.blocks().remove(head);
      pool.count_segment(seg->kind, -1);
      std::swap(segments_[i], segments_.back());
      segments_.pop_back();  // deletes the descriptor
    }
  }

  Runtime& runtime_;
  int device_;
  std::size_t page_bytes_[2]{0, 0};        // mapping unit per pool kind
  std::size_t reserve_bytes_{0};           // growable_reserve_bytes (0: 9/8 of the device)
  std::size_t device_total_{0};            // the device's memory
  bool shareable_{false};                  // pages exportable (growable_shareable)
  bool nvtx_annotate_{false};              // segments registered as NVTX heaps
  std::vector<Block*> unmapped_[2];        // unmapped blocks, per pool kind
  std::vector<physical_handle> spare_[2];  // unmapped physical pages, held
  std::vector<std::unique_ptr<segment_type>> segments_;
  std::vector<int> peers_;  // devices granted access to every mapped page (grant)
};

}  // namespace gpukit::detail::caching
