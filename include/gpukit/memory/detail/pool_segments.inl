// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/pool_segments.inl: the shared pool of basic_caching_allocator: segments
// taken from the runtime (fixed ones here; growable ones in detail/caching/growable_source.hpp,
// which growable_pool below serves), block descriptors and their spare list, splitting and
// coalescing, the free indices (per stream, global, per capture), the extent of a block, the
// export of growable pages (gpukit/memory/ipc.hpp) and the peers granted access to them. Every
// function here runs under the pool lock. Not public API; included by caching_allocator.hpp.
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <memory>
#include <string>

namespace gpukit {

// What the growable segments' layer (detail/caching/growable_source.hpp) asks of the pool around
// it: the allocator's state it works on, and the steps that stay the allocator's. Built at each
// call, under the pool lock (each member asserts it for clang's analysis).
template <class Runtime>
struct basic_caching_allocator<Runtime>::growable_pool {
  basic_caching_allocator& a;

  detail::caching::block_index<block>& blocks() const
  {
    a.mutex_.assert_held();
    return a.blocks_;
  }
  std::size_t& reserved() const
  {
    a.mutex_.assert_held();
    return a.pool_.reserved;
  }
  void count(std::uint64_t caching_allocator_stats::*counter, std::uint64_t n = 1) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count(counter, n);
  }
  std::size_t limit() const noexcept { return a.limit_.load(std::memory_order_relaxed); }
  bool capturing() const noexcept
  {
    return a.captures_underway_.load(std::memory_order_relaxed) != 0;
  }
  std::vector<std::unique_ptr<stream_pool>>& streams() const
  {
    a.mutex_.assert_held();
    return a.streams_.pools();
  }
  void count_reserved(int kind, std::int64_t delta) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count_reserved(kind, delta);
  }
  void count_segment(int kind, int delta) const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.count_segment(kind, delta);
  }
  void raise_reserved_peak() const noexcept
  {
    a.mutex_.assert_held();
    a.stats_.raise_reserved_peak();
  }
  void record(memory_event::action what, std::uintptr_t address, std::size_t bytes,
              stream_type stream) const
  {
    a.mutex_.assert_held();
    a.recorder_.record_pool(what, address, bytes, stream);
  }
  block* insert_free(block* b) const
  {
    a.mutex_.assert_held();
    return a.insert_free(b);
  }
  void unindex(block* b) const
  {
    a.mutex_.assert_held();
    a.unindex(b);
  }
  block* find_free(std::size_t size, int kind, stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.find_free(size, kind, stream);
  }
  std::uint64_t next_free_seq(stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.streams_.next_free_seq(stream);
  }
  bool is_capturing(stream_type stream) const
  {
    a.mutex_.assert_held();
    return a.streams_.is_capturing(stream);
  }
  void retire_dead_stream(stream_type stream) const
  {
    a.mutex_.assert_held();
    a.streams_.retire_dead_stream(stream, stream_operations{a});
  }
};

template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::find_free(
  std::size_t size, int kind, stream_type stream)
{
  if (block* b = streams_.find(size, kind, stream)) { return b; }
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
  try {
    e = segment_memory(p, seg_size, stream);
    // An upstream resource may have a limit of its own: a segment just big enough may still fit.
    if (upstream_.engaged() && e == Runtime::out_of_memory &&
        seg_size > detail::round_up(size, alignment)) {
      seg_size = detail::round_up(size, alignment);
      e        = segment_memory(p, seg_size, stream);
    }
  } catch (...) {  // the upstream resource failed otherwise: its error, nothing kept
    blocks_.recycle(b);
    throw;
  }
  if (e != Runtime::success) {
    blocks_.recycle(b);
    if (e == Runtime::out_of_memory) {
      oom = true;
      return nullptr;
    }
    GPUKIT_CUDA_TRY(e, upstream_.engaged() ? "the upstream resource"
                       : stream_ordered_   ? "malloc_async"
                                           : "malloc");
  }
  adopt_segment(b, std::move(seg), p, seg_size, kind, stream, stream_ordered_, 0);
  // Indexed as a free block of `stream`, so take finds it where it expects it.
  auto& sp    = streams_.pool_of(stream);
  b->free_seq = ++sp.free_seq;
  sp.index[kind].insert(b);
  return b;
}

// A segment's memory from the upstream resource (its std::bad_alloc is out of memory), else from
// the runtime: malloc_async on `stream`, or malloc.
template <class Runtime>
typename Runtime::error_type basic_caching_allocator<Runtime>::segment_memory(void*& p,
                                                                              std::size_t bytes,
                                                                              stream_type stream)
{
  if (upstream_.engaged()) {
    try {
      p = upstream_.allocate(bytes, stream);
    } catch (std::bad_alloc const&) {
      return Runtime::out_of_memory;
    }
    return Runtime::success;
  }
  device_guard<Runtime> guard{runtime_, device_};
  return stream_ordered_ ? runtime_.malloc_async(&p, bytes, stream) : runtime_.malloc(&p, bytes);
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
  return streams_.pool_of(b->stream).index[b->kind];
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
  if (streams_.forgotten(stream)) {
    // Freed on a stream forget_stream has synchronized (a pending free completing, another
    // thread's cache flushing): its work is done, and the stream may be gone: any stream's now.
    b->stream = stream_type{};
    b->global = true;
    insert_free(b);
    oom_.wake_waiters();
    return;
  }
  b->stream   = stream;
  b->global   = false;
  b->free_seq = streams_.next_free_seq(stream);
  insert_free(b);
  oom_.wake_waiters();
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
  for (int fd : pages_.export_pages(*seg, first, last)) {
    out.pages.push_back(shared_page{fd, seg->page});
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
  pages_.grant(peer_device);
}

template <class Runtime>
std::vector<int> basic_caching_allocator<Runtime>::peers() const
{
  detail::pool_lock lock{mutex_};
  return pages_.peers();
}

}  // namespace gpukit
