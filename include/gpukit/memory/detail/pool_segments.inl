// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/pool_segments.inl: the shared pool of basic_caching_allocator: segments
// taken from the runtime (fixed ones here; growable ones in growable_segments.inl), block
// descriptors and their spare list, splitting and coalescing, the free indices (per stream, global,
// per capture) and the extent of a block (gpukit/memory/ipc.hpp). Every function here runs under
// the pool lock. Not public API; included by caching_allocator.hpp.
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <memory>
#include <string>

namespace gpukit {

template <class Runtime>
struct basic_caching_allocator<Runtime>::segment {
  void* ptr{nullptr};
  std::size_t size{0};
  int kind{0};
  bool stream_ordered{true};  // from malloc_async (else malloc)
  memory_heap nvtx_heap{};    // the segment as an NVTX heap (memory annotation)
  // Growable segments: `size` bytes of reserved addresses, mapped a page at a time. A page is
  // mapped when it holds a handle; free and allocated blocks lie on mapped pages only, unmapped
  // blocks on pages that are unmapped (or mapped but not yet accessible, after a failed undo).
  bool growable{false};
  std::size_t page{0};
  std::vector<physical_handle> handles;  // per page
  std::vector<std::uint8_t> mapped;      // per page
  std::vector<int> fds;                  // per page: its exported descriptor, or -1 (shareable)
  std::size_t mapped_pages{0};
};

template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::find_free(
  std::size_t size, int kind, stream_type stream)
{
  for (auto& sp : streams_.pools) {
    if (sp->stream == stream) {
      if (block* b = sp->index[kind].find(size)) { return b; }
      break;
    }
  }
  return blocks_.global(kind).find(size);
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::segment_size_for(std::size_t size) const noexcept
{
  if (size <= options_.small_request_bytes) { return options_.small_segment_bytes; }
  if (size <= options_.medium_request_bytes) { return options_.medium_segment_bytes; }
  return detail::round_up(size, options_.segment_rounding_bytes);
}

// Makes `b` the one free block of a new segment [p, p + seg_size) and counts the segment; the
// caller indexes it.
template <class Runtime>
void basic_caching_allocator<Runtime>::adopt_segment(block* b, std::unique_ptr<segment> seg,
                                                     void* p, std::size_t seg_size, int kind,
                                                     stream_type stream, bool stream_ordered,
                                                     capture_id pool)
{
  seg->ptr            = p;
  seg->size           = seg_size;
  seg->kind           = kind;
  seg->stream_ordered = stream_ordered;
  if (options_.nvtx_annotate) {
    seg->nvtx_heap = register_memory_heap(p, seg_size, "gpukit caching allocator");
  }
  blocks_.add_segment(b, p, seg_size, seg.release());
  b->kind         = kind;
  b->stream       = stream;
  b->global       = false;
  b->capture_pool = pool;
  b->state.store(detail::block_state::free, std::memory_order_relaxed);
  pool_.reserved += seg_size;
  stats_.count_reserved(kind, static_cast<std::int64_t>(seg_size));
  stats_.count_segment(kind, 1);  // raises the reserved and segment peaks
  stats_.count(&caching_allocator_stats::num_device_allocs);
  recorder_.record_pool(memory_event::action::segment_alloc, b->address(), seg_size, stream);
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::new_segment(
  std::size_t size, int kind, stream_type stream, bool& oom)
{
  std::size_t seg_size    = segment_size_for(size);
  std::size_t const limit = limit_.load(std::memory_order_relaxed);
  if (limit != 0 && pool_.reserved + seg_size > limit) {
    // Within the limit, a segment just big enough may still fit.
    seg_size = detail::round_up(size, alignment);
    if (pool_.reserved + seg_size > limit) {
      oom = true;
      return nullptr;
    }
  }
  if (stream_ordered_) {
    // On a stream being captured, malloc_async would become a node of the graph: refuse clearly.
    bool capturing = false;
    GPUKIT_CUDA_TRY(runtime_.stream_is_capturing(stream, capturing));
    GPUKIT_EXPECTS(!capturing,
                   "allocate_async: the stream is being captured into a CUDA graph; call "
                   "begin_capture(stream) on the allocator before allocating during capture");
  }
  GPUKIT_DETAIL_SLOW_PATH_RANGEF(categories::allocator, "allocate segment %.1f MiB%s stream %p",
                                 detail::mib(seg_size), stream_ordered_ ? " (stream-ordered)" : "",
                                 detail::stream_address(stream));
  // Host-side bookkeeping first, so that a failure after the runtime call cannot leak memory.
  auto seg                       = std::make_unique<segment>();
  block* b                       = blocks_.new_block();
  void* p                        = nullptr;
  typename Runtime::error_type e = Runtime::success;
  {
    device_guard<Runtime> guard{runtime_, device_};
    e =
      stream_ordered_ ? runtime_.malloc_async(&p, seg_size, stream) : runtime_.malloc(&p, seg_size);
  }
  if (e != Runtime::success) {
    blocks_.recycle(b);
    if (e == Runtime::out_of_memory) {
      oom = true;
      return nullptr;
    }
    GPUKIT_CUDA_TRY(e, stream_ordered_ ? "malloc_async" : "malloc");
  }
  adopt_segment(b, std::move(seg), p, seg_size, kind, stream, stream_ordered_, 0);
  // Indexed as a free block of `stream`, so take finds it where it expects it.
  auto& sp    = pool_of(stream);
  b->free_seq = ++sp.free_seq;
  sp.index[kind].insert(b);
  return b;
}

// Takes free block b for an allocation of `size` bytes (`bytes` asked) on `stream`; the tail goes
// back free to b's pool (detail/caching/block_index.hpp).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::take(
  block* b, std::size_t size, std::size_t bytes, stream_type stream)
{
  blocks_.carve(b, size, [this](block const* x) -> detail::tlsf_index<block>& {
    mutex_.assert_held();  // a lambda run under the lock
    return index_for(x);
  });
  b->state.store(detail::block_state::allocated, std::memory_order_relaxed);
  b->requested = bytes;
  b->stream    = stream;
  b->global    = false;
  return b;
}

template <class Runtime>
detail::tlsf_index<typename basic_caching_allocator<Runtime>::block>&
basic_caching_allocator<Runtime>::index_for(block const* b)
{
  if (b->capture_pool != 0) { return capture_.at(b->capture_pool).index[b->kind]; }
  if (b->global) { return blocks_.global(b->kind); }
  return pool_of(b->stream).index[b->kind];
}

// Inserts free block b (state free, owner set) into its index, merging free neighbours first.
// Returns the block that holds b's bytes now (b, or the free block before it that absorbed it).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::insert_free(
  block* b)
{
  return blocks_.insert_free(b, [this](block const* x) -> detail::tlsf_index<block>& {
    mutex_.assert_held();  // a lambda run under the lock
    return index_for(x);
  });
}

template <class Runtime>
void basic_caching_allocator<Runtime>::free_to_pool(block* b, stream_type stream)
{
  if (b->capture_pool == 0 && captures_underway_.load(std::memory_order_relaxed) != 0) {
    // Freed on a stream being captured: the graph may use the block when it replays, so it is
    // kept for that capture's pool (reusable within it) until release_capture_pool.
    if (capture_pool* cp = capture_for(stream, true)) { b->capture_pool = cp->id; }
  }
  if (b->capture_pool != 0) {
    b->stream = stream;
    b->global = false;
    insert_free(b);
    return;
  }
  if (!streams_.forgotten.empty() && std::find(streams_.forgotten.begin(), streams_.forgotten.end(),
                                               stream) != streams_.forgotten.end()) {
    // Freed on a stream forget_stream has synchronized (a pending free completing, another
    // thread's cache flushing): its work is done, and the stream may be gone: any stream's now.
    b->stream = stream_type{};
    b->global = true;
    insert_free(b);
    if (recovery_.waiters != 0) { recovery_.frees_cv.notify_all(); }
    return;
  }
  b->stream   = stream;
  b->global   = false;
  b->free_seq = ++pool_of(stream).free_seq;
  insert_free(b);
  if (recovery_.waiters != 0) { recovery_.frees_cv.notify_all(); }
}

template <class Runtime>
memory_heap basic_caching_allocator<Runtime>::segment_heap(block const* b) noexcept
{
  return static_cast<segment const*>(b->segment)->nvtx_heap;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::block_extent basic_caching_allocator<Runtime>::extent(
  void const* ptr) const
{
  detail::pool_lock lock{mutex_};
  block const* b = blocks_.find(ptr);
  GPUKIT_EXPECTS(
    b != nullptr && b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
    "caching_allocator::extent: " + detail::hex(ptr) +
      " is not a block this allocator has handed out (device " + std::to_string(device_) + ")");
  auto const* seg = static_cast<segment const*>(b->segment);
  block_extent x;
  x.segment_base   = seg->ptr;
  x.segment_bytes  = seg->size;
  x.offset         = b->address() - reinterpret_cast<std::uintptr_t>(seg->ptr);
  x.bytes          = b->size;
  x.stream_ordered = seg->stream_ordered && !seg->growable;
  x.growable       = seg->growable;
  if (seg->growable) {
    x.page_bytes           = seg->page;
    x.first_page           = x.offset / seg->page;
    std::size_t const last = (x.offset + b->size - 1) / seg->page;
    x.pages.assign(seg->handles.begin() + static_cast<std::ptrdiff_t>(x.first_page),
                   seg->handles.begin() + static_cast<std::ptrdiff_t>(last + 1));
  }
  return x;
}

}  // namespace gpukit
