// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/growable_segments.inl: the growable (virtual memory) segments of
// basic_caching_allocator. Not public API; included by caching_allocator.hpp.
//
// A growable segment is a range of reserved addresses of one pool kind, first taken for one
// stream, cut into pages (the large pool's page is `growable_page_bytes`, the small pool's the
// device's granularity). Each page is mapped to its own physical allocation, or not at all. Its
// blocks tile the range as in any segment; free and allocated blocks lie on mapped pages only,
// and the unmapped pages form blocks of state `unmapped`, which are not in any free index but
// listed in `pages_.unmapped` per kind.
//
// Growth (grow_segment, when no free block fits): pick the unmapped block that needs the fewest new
// pages, counting the free block just before it when the requesting stream may use it; map that
// many pages at its start (physical pages held spare first, then cuMemCreate) in one transaction;
// the new pages become a free block that merges with the free block before them. Before creating
// pages, the allocator "harvests": it unmaps fully free pages elsewhere whose work has completed
// (blocks usable by every stream, or blocks of streams that are idle) and keeps their physical
// memory as spare pages, so that memory moves to where the pool grows instead of the pool
// growing.
//
// Release (release, trim, the out-of-memory ladder): synchronizes the streams that own free
// blocks (only those, on the allocator's device), unmaps every fully free page, releases spare
// pages, and returns address ranges that hold nothing.
//
// Sharing (share_pages, with growable_shareable): a page holding a shared block is exported once
// as a POSIX descriptor, kept in its segment until the page is unmapped (or the allocator
// destroyed), when it is closed: its physical memory may then hold another range's page, and a
// descriptor must never name memory other than the page it was exported for. Peers
// (grant_access) get access to every mapped page, and to each page when it is mapped.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <limits>

namespace gpukit {

// Makes b an unmapped block, merged with unmapped neighbours and listed once.
template <class Runtime>
void basic_caching_allocator<Runtime>::insert_unmapped(block* b)
{
  auto& list  = pages_.unmapped[b->kind];
  auto unlist = [&](block* x) {
    mutex_.assert_held();  // a lambda run under the lock
    auto it = std::find(list.begin(), list.end(), x);
    if (it != list.end()) {
      *it = list.back();
      list.pop_back();
    }
  };
  auto is_unmapped = [](block const* x) {
    return x != nullptr &&
           x->state.load(std::memory_order_relaxed) == detail::block_state::unmapped;
  };
  b->state.store(detail::block_state::unmapped, std::memory_order_relaxed);
  b->global       = false;
  b->stream       = stream_type{};
  b->capture_pool = 0;
  if (is_unmapped(b->prev)) {
    unlist(b);
    b = b->prev;
    blocks_.absorb_next(b);
  }
  if (is_unmapped(b->next)) {
    unlist(b->next);
    blocks_.absorb_next(b);
  }
  if (std::find(list.begin(), list.end(), b) == list.end()) { list.push_back(b); }
}

// Unmaps page i of seg and keeps its physical memory as a spare page. Returns the runtime's
// error (the page then stays mapped).
template <class Runtime>
typename Runtime::error_type basic_caching_allocator<Runtime>::unmap_page(segment& seg,
                                                                          std::size_t i)
{
  typename Runtime::error_type const e =
    runtime_.vm_unmap(static_cast<char*>(seg.ptr) + i * seg.page, seg.page);
  if (e != Runtime::success) { return e; }
  close_page_fd(seg, i);
  pages_.spare[spare_kind(seg.kind)].push_back(seg.handles[i]);
  stats_.count_reserved(seg.kind, -static_cast<std::int64_t>(seg.page));
  stats_.count_reserved(spare_kind(seg.kind), static_cast<std::int64_t>(seg.page));
  seg.handles[i] = physical_handle{};
  seg.mapped[i]  = 0;
  --seg.mapped_pages;
  stats_.count(&caching_allocator_stats::num_device_frees);
  return Runtime::success;
}

// Unmaps up to `wanted` fully free pages at the top of free block b (whose work has completed:
// the caller makes sure) and keeps their physical memory as spare pages. The unmapped pages
// become an unmapped block; what remains of b stays free. Stops at the first unmap that fails
// (that page stays mapped and free; the error is returned through `error`). Returns the pages
// unmapped.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::unmap_free_pages(block* b, std::size_t wanted,
                                                               typename Runtime::error_type& error)
{
  auto* seg                = static_cast<segment*>(b->segment);
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
    if (typename Runtime::error_type const e = unmap_page(*seg, i); e != Runtime::success) {
      error = e;
      break;
    }
    ++done;
  }
  if (done == 0) { return 0; }
  std::size_t const first = pe - done;
  recorder_.record_pool(memory_event::action::segment_free, va0 + first * page, done * page,
                        b->global ? stream_type{} : b->stream);
  unindex(b);
  block* mid = b;
  if (first * page > off) { mid = blocks_.split_off(b, first * page - off); }
  block* tail = nullptr;
  if (end > pe * page) { tail = blocks_.split_off(mid, done * page); }
  mid->state.store(detail::block_state::unmapped, std::memory_order_relaxed);  // no merge into it
  if (mid != b) { insert_free(b); }
  if (tail != nullptr) { insert_free(tail); }
  insert_unmapped(mid);
  return done;
}

// Unmaps up to `wanted` free pages of pool `kind` whose work has completed, as spare pages.
// Never waits: a block qualifies when every stream may use it (its work is known complete) or
// when the stream that owns it is idle. The neighbours of `keep` (the unmapped range about to be
// mapped, whose free block before it becomes part of the new block) are left alone.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::harvest_pages(int kind, std::size_t wanted,
                                                            block const* keep)
{
  if (wanted == 0 || captures_underway_.load(std::memory_order_relaxed) != 0) { return 0; }
  device_guard<Runtime> guard{runtime_, device_};
  std::vector<block*> donors = page_donors(kind, keep);
  // Largest first: fewer blocks split for the same pages.
  std::sort(donors.begin(), donors.end(), [](block* a, block* b) { return a->size > b->size; });
  std::size_t got = 0;
  for (block* b : donors) {
    typename Runtime::error_type error = Runtime::success;
    got += unmap_free_pages(b, wanted - got, error);
    if (error != Runtime::success || got >= wanted) { break; }  // a failed unmap: grow instead
  }
  return got;
}

// The free growable blocks whose work is known complete (global, or of an idle stream) and that
// hold a whole page, of pool `kind` (and of the other kind when the pages have the same size);
// the neighbours of `keep` stay.
template <class Runtime>
std::vector<typename basic_caching_allocator<Runtime>::block*>
basic_caching_allocator<Runtime>::page_donors(int kind, block const* keep)
{
  std::vector<block*> donors;
  auto consider = [&](block* b) {
    if (b != keep->prev && b != keep->next && holds_free_page(b)) { donors.push_back(b); }
  };
  // Both pools' pages serve either pool when their pages have the same size.
  int const kinds[2] = {kind, 1 - kind};
  int const nkinds   = pages_.page_bytes[0] == pages_.page_bytes[1] ? 2 : 1;
  for (int k = 0; k < nkinds; ++k) { blocks_.global(kinds[k]).for_each(consider); }
  for (auto& sp : streams_.pools) {
    bool any = false;
    for (int k = 0; k < nkinds; ++k) { any = any || !sp->index[kinds[k]].empty(); }
    if (!any || is_capturing(sp->stream)) { continue; }  // a query would end its capture
    typename Runtime::error_type const q = runtime_.stream_query(sp->stream);
    // Busy, or destroyed (retired by the next migration or release): not a donor now.
    if (q == Runtime::not_ready || q == Runtime::invalid_resource_handle) { continue; }
    GPUKIT_CUDA_TRY(q, "stream_query");
    for (int k = 0; k < nkinds; ++k) { sp->index[kinds[k]].for_each(consider); }
  }
  return donors;
}

// Whether free block b of a growable segment (and of no capture) covers a whole page.
template <class Runtime>
bool basic_caching_allocator<Runtime>::holds_free_page(block const* b) noexcept
{
  auto const* seg = static_cast<segment const*>(b->segment);
  if (!seg->growable || b->capture_pool != 0) { return false; }
  std::size_t const off = b->address() - reinterpret_cast<std::uintptr_t>(seg->ptr);
  return (off + b->size) / seg->page > (off + seg->page - 1) / seg->page;
}

/// A page map_pages has mapped, until the transaction ends.
template <class Runtime>
struct basic_caching_allocator<Runtime>::mapped_page {
  std::size_t index{0};
  physical_handle handle{};
  bool fresh{false};  // created by this transaction
};

// Maps pages [first, first + count) of seg, in one transaction: physical memory from the spare
// pages, else new (cuMemCreate, within the limit); each page mapped, then the range made
// accessible. On any failure every page this call mapped is unmapped again and the physical memory
// it created released, so that the allocator is as it was (a page whose undo fails stays mapped
// but inaccessible inside its unmapped block, and is retried by release). Returns false with
// `oom` set when memory ran out; throws gpukit::cuda_error for other errors.
template <class Runtime>
bool basic_caching_allocator<Runtime>::map_pages(segment& seg, std::size_t first, std::size_t count,
                                                 bool& oom)
{
  std::size_t const page = seg.page;
  int const kind         = spare_kind(seg.kind);
  std::vector<mapped_page> now;
  now.reserve(count);
  device_guard<Runtime> guard{runtime_, device_};
  for (std::size_t i = first; i < first + count; ++i) {
    if (seg.mapped[i] != 0) { continue; }  // left mapped by an undo that failed: access only
    mapped_page m{i, physical_handle{}, false};
    if (typename Runtime::error_type const e = take_page(kind, page, m); e != Runtime::success) {
      return undo_map(seg, now, e, oom, "vm_create");
    }
    if (typename Runtime::error_type const e =
          runtime_.vm_map(page_address(seg, i), page, m.handle);
        e != Runtime::success) {
      give_back_page(kind, page, m);
      return undo_map(seg, now, e, oom, "vm_map");
    }
    now.push_back(m);
  }
  if (typename Runtime::error_type const e =
        runtime_.vm_set_access(page_address(seg, first), count * page, device_);
      e != Runtime::success) {
    // Pages left mapped by an earlier failed undo are in the range too: they stay as they were.
    return undo_map(seg, now, e, oom, "vm_set_access");
  }
  if (typename Runtime::error_type const e = grant_peers(page_address(seg, first), count * page);
      e != Runtime::success) {
    return undo_map(seg, now, e, oom, "vm_set_access for a peer device");
  }
  for (auto const& m : now) {
    seg.handles[m.index] = m.handle;
    seg.mapped[m.index]  = 1;
    ++seg.mapped_pages;
    stats_.count(&caching_allocator_stats::num_pages_reused, m.fresh ? 0 : 1);
    count_mapped_page(seg, m.fresh);
  }
  stats_.count(&caching_allocator_stats::num_device_allocs, now.size());
  stats_.raise_reserved_peak();
  recorder_.record_pool(memory_event::action::segment_alloc,
                        reinterpret_cast<std::uintptr_t>(page_address(seg, first)), count * page,
                        stream_type{});
  return true;
}

// A page now mapped in seg counts as its pool kind's reserved memory: a new one (`fresh`), or a
// spare one, which leaves its list's pool kind.
template <class Runtime>
void basic_caching_allocator<Runtime>::count_mapped_page(segment const& seg, bool fresh) noexcept
{
  if (!fresh) { stats_.count_reserved(spare_kind(seg.kind), -static_cast<std::int64_t>(seg.page)); }
  stats_.count_reserved(seg.kind, static_cast<std::int64_t>(seg.page));
}

template <class Runtime>
void* basic_caching_allocator<Runtime>::page_address(segment const& seg, std::size_t i) noexcept
{
  return static_cast<void*>(static_cast<char*>(seg.ptr) + i * seg.page);
}

// Physical memory for one page: a spare page, else a new one within the limit
// (cudaErrorMemoryAllocation beyond it).
template <class Runtime>
typename Runtime::error_type basic_caching_allocator<Runtime>::take_page(int kind, std::size_t page,
                                                                         mapped_page& m)
{
  if (!pages_.spare[kind].empty()) {
    m.handle = pages_.spare[kind].back();
    pages_.spare[kind].pop_back();
    return Runtime::success;
  }
  std::size_t const limit = limit_.load(std::memory_order_relaxed);
  if (limit != 0 && pool_.reserved + page > limit) { return Runtime::out_of_memory; }
  typename Runtime::error_type const e =
    runtime_.vm_create(m.handle, page, device_, options_.growable_shareable);
  if (e != Runtime::success) { return e; }
  m.fresh = true;
  pool_.reserved += page;
  stats_.count(&caching_allocator_stats::num_pages_created);
  return Runtime::success;
}

// An unmapped page's memory: released if this transaction created it, else (or if that fails)
// held as a spare page, released by release().
template <class Runtime>
void basic_caching_allocator<Runtime>::give_back_page(int kind, std::size_t page,
                                                      mapped_page const& m)
{
  if (m.fresh && runtime_.vm_release(m.handle) == Runtime::success) {
    pool_.reserved -= page;
    stats_.count(&caching_allocator_stats::num_pages_released);
  } else {
    pages_.spare[kind].push_back(m.handle);
    if (m.fresh) { stats_.count_reserved(kind, static_cast<std::int64_t>(page)); }
  }
}

// Undoes a failed transaction (the pages in `now`, last first), then reports `e`: false with `oom`
// set when memory ran out, else throws gpukit::cuda_error naming `call`.
template <class Runtime>
bool basic_caching_allocator<Runtime>::undo_map(segment& seg, std::vector<mapped_page> const& now,
                                                typename Runtime::error_type e, bool& oom,
                                                char const* call)
{
  for (auto it = now.rbegin(); it != now.rend(); ++it) {
    if (runtime_.vm_unmap(page_address(seg, it->index), seg.page) != Runtime::success) {
      seg.handles[it->index] = it->handle;  // still mapped, never made accessible
      seg.mapped[it->index]  = 1;
      ++seg.mapped_pages;
      count_mapped_page(seg, it->fresh);
      continue;
    }
    give_back_page(spare_kind(seg.kind), seg.page, *it);
  }
  if (e == Runtime::out_of_memory) {
    oom = true;
    return false;
  }
  GPUKIT_CUDA_TRY(e, std::string{call} + " while mapping growable pages (the mapping was undone)");
  return false;
}

// Reserves a new growable segment for a request of `size` bytes: its whole range is one unmapped
// block. Returns that block, or nullptr with `oom` set when no address space is left.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::reserve_growable(std::size_t size, int kind, stream_type stream,
                                                   bool& oom)
{
  std::size_t const page         = pages_.page_bytes[kind];
  std::size_t reserve            = options_.growable_reserve_bytes != 0
                                     ? detail::round_up(options_.growable_reserve_bytes, page)
                                     : detail::round_up(device_total_ / 8 * 9, page);
  reserve                        = std::max(reserve, detail::round_up(size, page));
  auto seg                       = std::make_unique<segment>();
  block* b                       = blocks_.new_block();
  void* p                        = nullptr;
  typename Runtime::error_type e = Runtime::success;
  GPUKIT_DETAIL_SLOW_PATH_RANGEF(categories::allocator, "reserve growable segment %.1f MiB",
                                 detail::mib(reserve));
  {
    device_guard<Runtime> guard{runtime_, device_};
    e = runtime_.vm_reserve(&p, reserve, 0);
  }
  if (e != Runtime::success) {
    blocks_.recycle(b);
    if (e == Runtime::out_of_memory) {
      oom = true;
      return nullptr;
    }
    GPUKIT_CUDA_TRY(e, "vm_reserve of a growable segment");
  }
  seg->ptr      = p;
  seg->size     = reserve;
  seg->kind     = kind;
  seg->growable = true;
  seg->page     = page;
  seg->handles.assign(reserve / page, physical_handle{});
  seg->mapped.assign(reserve / page, 0);
  if (options_.growable_shareable) { seg->fds.assign(reserve / page, -1); }
  if (options_.nvtx_annotate) {
    seg->nvtx_heap = register_memory_heap(p, reserve, "gpukit caching allocator (growable)");
  }
  blocks_.add_segment(b, p, reserve, seg.get());
  b->kind   = kind;
  b->stream = stream;
  pages_.segments.push_back(seg.release());
  stats_.count_segment(kind, 1);
  insert_unmapped(b);
  return b;
}

// The unmapped block of pool `kind` that needs the fewest new pages for `size` bytes on `stream`
// (counting the free block before it when `stream` may use it; the lowest address on a tie), with
// that count in `pages`; nullptr when none has room.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::fewest_pages(
  std::size_t size, int kind, stream_type stream, std::size_t& pages)
{
  std::size_t const page = pages_.page_bytes[kind];
  block* best            = nullptr;
  pages                  = std::numeric_limits<std::size_t>::max();
  for (block* u : pages_.unmapped[kind]) {
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

// The bytes of the free block just before unmapped block u, when `stream` may use it (0 if none).
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::free_before(block const* u,
                                                          stream_type stream) noexcept
{
  block const* p = u->prev;
  if (p == nullptr || p->state.load(std::memory_order_relaxed) != detail::block_state::free ||
      p->capture_pool != 0 || !(p->global || p->stream == stream)) {
    return 0;
  }
  return p->size;
}

// No free block fits `size`: map pages where the fewest are needed (see the top of this file).
// Returns a free block of at least `size` bytes usable on `stream`, or nullptr with `oom` set.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::grow_segment(
  std::size_t size, int kind, stream_type stream, bool& oom)
{
  std::size_t const page = pages_.page_bytes[kind];
  std::size_t const most = (size + page - 1) / page;
  std::size_t best_pages = 0;
  block* best            = fewest_pages(size, kind, stream, best_pages);
  if (best == nullptr) {
    best = reserve_growable(size, kind, stream, oom);
    if (best == nullptr) { return nullptr; }
    best_pages = most;
  }
  GPUKIT_DETAIL_SLOW_PATH_RANGEF(
    categories::allocator, "grow segment %.1f MiB (%zu pages) stream %p",
    detail::mib(best_pages * page), best_pages, detail::stream_address(stream));
  // Physical memory of free pages elsewhere first, new memory only for the rest.
  auto const& spares = pages_.spare[spare_kind(kind)];
  if (spares.size() < best_pages) { harvest_pages(kind, best_pages - spares.size(), best); }
  auto* seg = static_cast<segment*>(best->segment);
  std::size_t const first =
    (best->address() - reinterpret_cast<std::uintptr_t>(seg->ptr)) / seg->page;
  if (!map_pages(*seg, first, best_pages, oom)) { return nullptr; }
  auto& list = pages_.unmapped[kind];
  list.erase(std::find(list.begin(), list.end(), best));
  if (best_pages * page < best->size) {
    list.push_back(blocks_.split_off(best, best_pages * page));
  }
  best->state.store(detail::block_state::free, std::memory_order_relaxed);
  best->stream   = stream;
  best->global   = false;
  best->free_seq = ++pool_of(stream).free_seq;
  block* merged  = insert_free(best);
  return merged->size >= size ? merged : find_free(size, kind, stream);
}

// Unmaps the free pages of growable segments (of `only_stream`'s blocks, or of every stream),
// releases spare and unmapped physical memory until at most `target` bytes are reserved, and
// (when releasing everything) returns address ranges that hold nothing. Waits only on the streams
// that own the free blocks it unmaps.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release_growable(std::size_t target,
                                                               stream_type const* only_stream)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator,
                                "trim growable segments: unmap free pages, release spare ones");
  std::size_t const before = pool_.reserved;
  device_guard<Runtime> guard{runtime_, device_};
  release_spare_pages(target);
  if (captures_underway_.load(std::memory_order_relaxed) != 0) {
    return before - pool_.reserved;  // no synchronization while a graph is being captured
  }
  unmap_stranded_pages();
  release_spare_pages(target);
  unmap_released_blocks(target, only_stream);
  if (only_stream == nullptr && target == 0) { free_empty_ranges(); }
  return before - pool_.reserved;
}

// Releases spare physical pages until at most `target` bytes are reserved.
template <class Runtime>
void basic_caching_allocator<Runtime>::release_spare_pages(std::size_t target)
{
  for (int k = 0; k < 2; ++k) {
    auto& spares = pages_.spare[k];
    while (!spares.empty() && pool_.reserved > target) {
      GPUKIT_CUDA_TRY(runtime_.vm_release(spares.back()));
      spares.pop_back();
      pool_.reserved -= pages_.page_bytes[k];
      stats_.count_reserved(k, -static_cast<std::int64_t>(pages_.page_bytes[k]));
      stats_.count(&caching_allocator_stats::num_pages_released);
    }
  }
}

// Pages left mapped (never accessible) inside unmapped blocks by a failed undo: unmapped now.
template <class Runtime>
void basic_caching_allocator<Runtime>::unmap_stranded_pages()
{
  for (segment* seg : pages_.segments) {
    for (block* u : pages_.unmapped[seg->kind]) {
      if (u->segment != seg) { continue; }
      std::size_t const p0 =
        (u->address() - reinterpret_cast<std::uintptr_t>(seg->ptr)) / seg->page;
      for (std::size_t i = p0; i < p0 + u->size / seg->page; ++i) {
        if (seg->mapped[i] != 0) { GPUKIT_CUDA_TRY(unmap_page(*seg, i)); }
      }
    }
  }
}

// Unmaps the free pages of the free growable blocks of `only_stream` (or of every stream), largest
// block first, until at most `target` bytes are reserved; each stream that owns such blocks is
// synchronized first (the work that used those pages goes first).
template <class Runtime>
void basic_caching_allocator<Runtime>::unmap_released_blocks(std::size_t target,
                                                             stream_type const* only_stream)
{
  std::vector<stream_type> const capturing = wait_for_growable_streams(only_stream);
  std::vector<block*> blocks;
  auto collect = [&](block* b) {
    if (static_cast<segment const*>(b->segment)->growable && b->capture_pool == 0) {
      blocks.push_back(b);
    }
  };
  for (auto& sp : streams_.pools) {
    if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
    if (std::find(capturing.begin(), capturing.end(), sp->stream) != capturing.end()) { continue; }
    for (auto& idx : sp->index) { idx.for_each(collect); }
  }
  if (only_stream == nullptr) {
    for (auto& idx : blocks_.globals()) { idx.for_each(collect); }
  }
  std::sort(blocks.begin(), blocks.end(), [](block* a, block* b) { return a->size > b->size; });
  for (block* b : blocks) {
    if (pool_.reserved <= target) { break; }
    typename Runtime::error_type error = Runtime::success;
    unmap_free_pages(b, std::numeric_limits<std::size_t>::max(), error);
    release_spare_pages(target);
    GPUKIT_CUDA_TRY(error, "vm_unmap (releasing growable segment pages)");
  }
}

// The streams whose growable pages unmap_released_blocks unmaps are waited for first;
// destroyed ones are retired (their blocks join the global pool) before any block is collected,
// as retiring merges blocks. Streams being captured (begun on the stream directly) are not
// waited for: returned, their pages stay.
template <class Runtime>
std::vector<typename Runtime::stream_type>
basic_caching_allocator<Runtime>::wait_for_growable_streams(stream_type const* only_stream)
{
  std::vector<stream_type> dead, capturing;
  for (auto& sp : streams_.pools) {
    if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
    if (!holds_growable_free(*sp)) { continue; }
    if (is_capturing(sp->stream)) {
      capturing.push_back(sp->stream);
      continue;
    }
    typename Runtime::error_type const e = runtime_.stream_synchronize(sp->stream);
    if (e == Runtime::invalid_resource_handle) {
      dead.push_back(sp->stream);
    } else {
      GPUKIT_CUDA_TRY(e, "stream_synchronize (releasing growable segments)");
    }
    stats_.count(&caching_allocator_stats::num_release_waits);
  }
  for (stream_type d : dead) { retire_dead_stream(d); }
  return capturing;
}

// Whether stream pool sp holds a free block of a growable segment (and of no capture).
template <class Runtime>
bool basic_caching_allocator<Runtime>::holds_growable_free(stream_pool const& sp)
{
  bool found = false;
  for (auto const& idx : sp.index) {
    idx.for_each([&](block* b) {
      found = found || (static_cast<segment const*>(b->segment)->growable && b->capture_pool == 0);
    });
  }
  return found;
}

// Address ranges with nothing left in them go back to the runtime.
template <class Runtime>
void basic_caching_allocator<Runtime>::free_empty_ranges()
{
  for (std::size_t i = 0; i < pages_.segments.size();) {
    segment* seg = pages_.segments[i];
    block* head  = blocks_.find(seg->ptr);
    if (seg->mapped_pages != 0 || head == nullptr || head->next != nullptr ||
        head->state.load(std::memory_order_relaxed) != detail::block_state::unmapped) {
      ++i;
      continue;
    }
    if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }  // before the free
    GPUKIT_CUDA_TRY(runtime_.vm_free(seg->ptr, seg->size));
    auto& list = pages_.unmapped[seg->kind];
    list.erase(std::find(list.begin(), list.end(), head));
    blocks_.remove(head);
    stats_.count_segment(seg->kind, -1);
    delete seg;
    pages_.segments[i] = pages_.segments.back();
    pages_.segments.pop_back();
  }
}

// Closes the descriptor page i of seg was exported as, if any.
template <class Runtime>
void basic_caching_allocator<Runtime>::close_page_fd(segment& seg, std::size_t i) noexcept
{
  if (i < seg.fds.size() && seg.fds[i] >= 0) {
    ::close(seg.fds[i]);
    seg.fds[i] = -1;
  }
}

// Gives every peer device access to [va, va + bytes), whole mapped pages.
template <class Runtime>
typename Runtime::error_type basic_caching_allocator<Runtime>::grant_peers(void* va,
                                                                           std::size_t bytes)
{
  for (int peer : pages_.peers) {
    if (typename Runtime::error_type const e = runtime_.vm_set_access(va, bytes, peer);
        e != Runtime::success) {
      return e;
    }
  }
  return Runtime::success;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::shared_pages
basic_caching_allocator<Runtime>::share_pages(void const* ptr)
{
  detail::pool_lock lock{mutex_};
  block const* b = blocks_.find(ptr);
  GPUKIT_EXPECTS(
    b != nullptr && b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
    "caching_allocator::share_pages: " + detail::hex(ptr) +
      " is not a block this allocator has handed out (device " + std::to_string(device_) + ")");
  auto* seg = static_cast<segment*>(b->segment);
  GPUKIT_EXPECTS(seg->growable, "caching_allocator::share_pages: " + detail::hex(ptr) +
                                  " lies in a " +
                                  (seg->stream_ordered ? "cudaMallocAsync" : "cudaMalloc") +
                                  " segment, not a growable one (export_block shares it)");
  GPUKIT_EXPECTS(!seg->fds.empty(),
                 "caching_allocator::share_pages: " + detail::hex(ptr) +
                   " lies in a growable segment whose pages are not shareable: set "
                   "caching_allocator_options::growable_shareable");
  std::size_t const off   = b->address() - reinterpret_cast<std::uintptr_t>(seg->ptr);
  std::size_t const first = off / seg->page;
  std::size_t const last  = (off + b->size - 1) / seg->page;
  shared_pages out;
  out.offset = off - first * seg->page;
  out.bytes  = b->size;
  out.pages.reserve(last + 1 - first);
  device_guard<Runtime> guard{runtime_, device_};
  for (std::size_t i = first; i <= last; ++i) {
    if (seg->fds[i] < 0) {
      int fd = -1;
      GPUKIT_CUDA_TRY(
        runtime_.vm_export_shareable(fd, seg->handles[i]),
        "vm_export_shareable of page " + std::to_string(i) + " of a growable segment");
      seg->fds[i] = fd;
    }
    out.pages.push_back(shared_page{seg->fds[i], seg->page});
  }
  return out;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::grant_access(int peer_device)
{
  GPUKIT_EXPECTS(
    peer_device >= 0 && peer_device < 64,
    "caching_allocator::grant_access: device " + std::to_string(peer_device) + " is out of range");
  detail::pool_lock lock{mutex_};
  auto& peers = pages_.peers;
  if (peer_device == device_ || std::find(peers.begin(), peers.end(), peer_device) != peers.end()) {
    return;
  }
  device_guard<Runtime> guard{runtime_, device_};
  for (segment const* seg : pages_.segments) {
    // Runs of adjacent mapped pages: vm_set_access takes whole adjacent mappings.
    std::size_t const n = seg->mapped.size();
    for (std::size_t i = 0; i < n;) {
      if (seg->mapped[i] == 0) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < n && seg->mapped[j] != 0) { ++j; }
      GPUKIT_CUDA_TRY(
        runtime_.vm_set_access(page_address(*seg, i), (j - i) * seg->page, peer_device),
        "vm_set_access for peer device " + std::to_string(peer_device));
      i = j;
    }
  }
  peers.push_back(peer_device);
}

template <class Runtime>
std::vector<int> basic_caching_allocator<Runtime>::peers() const
{
  detail::pool_lock lock{mutex_};
  return pages_.peers;
}

}  // namespace gpukit
