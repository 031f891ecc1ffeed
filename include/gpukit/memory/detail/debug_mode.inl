// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/debug_mode.inl: the caching allocator's debug mode (poisoning and the
// quarantine of freed blocks; see caching_allocator_debug_options). Not public API; included by
// caching_allocator.hpp.
//
// A free in debug mode stops here first: the block is checked (ours, allocated, the size it was
// allocated with), its NVTX region unregistered (a tool reports any later access), its bytes
// poisoned in the freeing stream's order, and it joins a first-in first-out quarantine. It
// returns to the pool through the ordinary free path only when the quarantine overflows, when its
// stream is forgotten, or when the allocator is destroyed; until then it stays "allocated" in
// the pool's books, so a second free of it is reported as a double free, however long ago the
// first one was.
#pragma once

#include <deque>
#include <unordered_set>

namespace gpukit {

template <class Runtime>
struct basic_caching_allocator<Runtime>::debug_state {
  struct entry {
    void* ptr;
    std::size_t bytes;
    bool check_size;
    stream_type stream;
    std::size_t size;
  };
  // Taken before the pool lock, never after it.
  detail::annotated_mutex mutex GPUKIT_ACQUIRED_BEFORE(basic_caching_allocator::mutex_);
  std::deque<entry> quarantine GPUKIT_GUARDED_BY(mutex);
  std::unordered_set<void*> held GPUKIT_GUARDED_BY(mutex);
  std::size_t held_bytes GPUKIT_GUARDED_BY(mutex){0};

  /// Quarantines `e`; the oldest entries beyond the quarantine's bounds go to `evicted`.
  void hold(entry const& e, caching_allocator_debug_options const& o, std::vector<entry>& evicted)
    GPUKIT_REQUIRES(mutex)
  {
    quarantine.push_back(e);
    held.insert(e.ptr);
    held_bytes += e.size;
    while (!quarantine.empty() &&
           (held_bytes > o.quarantine_bytes || held.size() > o.quarantine_blocks)) {
      evicted.push_back(quarantine.front());
      quarantine.pop_front();
      held.erase(evicted.back().ptr);
      held_bytes -= evicted.back().size;
    }
  }
  // Guard pages (fixed at construction); the members below are guarded by the pool lock.
  bool guard{false};
  std::unordered_set<void*> guarded;    // blocks placed with guard pages, allocated now
  std::deque<void*> guard_freed_order;  // guarded blocks freed lately (for double frees)
  std::unordered_set<void*> guard_freed;
  std::uintptr_t guard_cursor{0};  // the end of the latest run: new runs go beyond it
};

// compute-sanitizer (2025.3, seen on the H200) accepts NVTX heaps only over cudaMalloc memory: it
// rejects nvtxMemHeapRegister over cudaMallocAsync memory (default or own pool, even once the
// allocation has completed) and over virtual memory (the whole reservation, one mapped page, or
// two), and then every region in them, one reported error per call. So annotation describes
// synchronous segments only; in debug mode the allocator takes its segments from cudaMalloc
// whatever the source (`sanitizer_segments`), so that the tool sees every block.
//
// Guard pages need virtual memory, so they win over `sanitizer_segments` in growable allocators
// (annotation is off there: the tool rejects heaps over virtual memory anyway).
template <class Runtime>
void basic_caching_allocator<Runtime>::debug_init()
{
  auto const source = [&] {
    switch (options_.source) {
      case segment_source::automatic: return "automatic";
      case segment_source::stream_ordered: return "stream_ordered";
      case segment_source::synchronous: return "synchronous";
      default: return "growable";
    }
  };
  GPUKIT_EXPECTS(!options_.debug.guard_pages || growable_,
                 std::string{"caching_allocator_options: debug.guard_pages needs "
                             "segment_source::growable (guard pages are unmapped virtual memory), "
                             "but source is segment_source::"} +
                   source());
  bool const guard = growable_ && (options_.debug.guard_pages ||
                                   (options_.debug.enabled && debug_guard_pages_requested()));
  if (guard) {
    options_.debug.enabled       = true;
    options_.debug.guard_pages   = true;
    options_.nvtx_annotate       = false;
    options_.growable_page_bytes = 1;  // rounded up to the granularity: the smallest page
  }
  if (options_.nvtx_annotate && (stream_ordered_ || growable_)) {
    if (options_.debug.enabled && options_.debug.sanitizer_segments) {
      stream_ordered_ = false;
      growable_       = false;
    } else {
      options_.nvtx_annotate = false;
    }
  }
  if (options_.debug.enabled) {
    debug_        = std::make_unique<debug_state>();
    debug_->guard = guard;
  }
}

// The pointer the calling thread is handing back to the pool from the quarantine: its free takes
// the ordinary path.
template <class Runtime>
void const*& basic_caching_allocator<Runtime>::debug_releasing() noexcept
{
  static thread_local void const* releasing = nullptr;
  return releasing;
}

// debug_free's checks under the pool lock: `ptr` is a block this allocator handed out and has not
// taken back (nor unmapped, for a guarded block), freed with the size it was allocated with.
// Returns the block's size; `guarded` tells whether it has guard pages.
// @throws gpukit::logic_error naming the pointer otherwise
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::debug_check_free(void* ptr, std::size_t bytes,
                                                               bool check_size, bool& guarded)
{
  detail::pool_lock lock{mutex_};
  GPUKIT_EXPECTS(debug_->guard_freed.count(ptr) == 0,
                 "deallocate: double free of " + detail::hex(ptr) +
                   " (a block with guard pages, freed before: its pages are unmapped, device " +
                   std::to_string(device_) + ")");
  block const* b = blocks_.find(ptr);
  GPUKIT_EXPECTS(b != nullptr, "deallocate: pointer " + detail::hex(ptr) +
                                 " was not allocated by this allocator (device " +
                                 std::to_string(device_) + ")");
  GPUKIT_EXPECTS(b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
                 "deallocate: double free of " + detail::hex(ptr) + " (a block of " +
                   std::to_string(b->size) + " bytes that is already free, device " +
                   std::to_string(device_) + ")");
  GPUKIT_EXPECTS(!check_size || bytes == b->requested,
                 "deallocate: pointer " + detail::hex(ptr) + " was allocated with " +
                   std::to_string(b->requested) + " bytes but freed with " + std::to_string(bytes));
  guarded = debug_->guarded.count(ptr) != 0;
  return b->size;
}

// True when the free of `ptr` was taken into the quarantine (the caller returns).
// @throws gpukit::logic_error for a pointer this allocator did not hand out, a double free (also
// of a block still in quarantine) or a size that differs from the allocation's
template <class Runtime>
bool basic_caching_allocator<Runtime>::debug_free(void* ptr, std::size_t bytes, bool check_size,
                                                  stream_type stream)
{
  if (debug_releasing() == ptr) { return false; }
  std::vector<typename debug_state::entry> evicted;
  {
    detail::pool_lock debug_lock{debug_->mutex};
    GPUKIT_EXPECTS(debug_->held.count(ptr) == 0,
                   "deallocate: double free of " + detail::hex(ptr) +
                     " (freed before and still in the debug quarantine, device " +
                     std::to_string(device_) + ")");
    bool guarded           = false;
    std::size_t const size = debug_check_free(ptr, bytes, check_size, guarded);
    if (guarded && captures_underway_.load(std::memory_order_relaxed) == 0) {
      guard_free(ptr, bytes, check_size, stream);
      return true;
    }
    if (guarded) {  // freed while a graph is being captured (no waiting): an ordinary free
      detail::pool_lock lock{mutex_};
      debug_->guarded.erase(ptr);
    }
    if (options_.nvtx_annotate) { unregister_memory_region(ptr); }
    // Not while a graph is being captured: the memset would become a node of the user's graph.
    if (options_.debug.poison_byte >= 0 &&
        captures_underway_.load(std::memory_order_relaxed) == 0) {
      device_guard<Runtime> guard{runtime_, device_};
      GPUKIT_CUDA_TRY(runtime_.memset_async(ptr, options_.debug.poison_byte & 0xff, size, stream));
    }
    debug_->hold({ptr, bytes, check_size, stream, size}, options_.debug, evicted);
  }
  // The block is freed (quarantined) whatever happens now: a failure to release the blocks it
  // pushed out must not tell the caller otherwise (a retry would be a double free). Those blocks
  // are back in the quarantine (debug_release), for a later free or release() to try again.
  try {
    debug_release(evicted);
  } catch (...) {}
  return true;
}

// Frees the quarantined blocks freed on `stream` (every one when `all`), through the ordinary
// path, before the stream can go away.
template <class Runtime>
void basic_caching_allocator<Runtime>::debug_flush(stream_type stream, bool all)
{
  if (debug_ == nullptr) { return; }
  std::vector<typename debug_state::entry> evicted;
  {
    detail::pool_lock debug_lock{debug_->mutex};
    auto& q = debug_->quarantine;
    for (auto it = q.begin(); it != q.end();) {
      if (!all && it->stream != stream) {
        ++it;
        continue;
      }
      evicted.push_back(*it);
      debug_->held.erase(it->ptr);
      debug_->held_bytes -= it->size;
      it = q.erase(it);
    }
  }
  debug_release(evicted);
}

template <class Runtime>
template <class Entries>
void basic_caching_allocator<Runtime>::debug_release(Entries const& evicted)
{
  for (auto it = evicted.begin(); it != evicted.end(); ++it) {
    auto const& e     = *it;
    debug_releasing() = e.ptr;
    try {
      deallocate_impl(e.ptr, e.bytes, e.check_size, e.stream);
    } catch (...) {  // this entry and the ones after it go back to the front of the quarantine
      debug_releasing() = nullptr;
      detail::pool_lock debug_lock{debug_->mutex};
      for (auto back = evicted.end(); back != it;) {
        --back;
        debug_->quarantine.push_front(*back);
        debug_->held.insert(back->ptr);
        debug_->held_bytes += back->size;
      }
      throw;
    }
    debug_releasing() = nullptr;
  }
}

// Guard pages: a block of `size` bytes for `bytes` requested, on its own pages (see the top of
// this file). Out of memory, free pages are unmapped and spare pages released once before the
// out-of-memory error (the recovery ladder would place blocks the ordinary way).
// @throws gpukit::out_of_memory when the device or the limit has no room for the pages
// @throws gpukit::cuda_error when the runtime fails otherwise (the allocator is left as it was)
template <class Runtime>
void* basic_caching_allocator<Runtime>::guard_allocate(std::size_t bytes, std::size_t size,
                                                       int kind, stream_type stream,
                                                       thread_cache& tc)
{
  bool oom = false;
  block* b = guard_place(size, kind, stream, oom);
  if (b == nullptr) {
    stats_.count(&caching_allocator_stats::num_alloc_retries);
    release_growable(0, nullptr);
    oom = false;
    b   = guard_place(size, kind, stream, oom);
    if (b == nullptr) { throw_oom(bytes, size); }
  }
  b->requested = bytes;
  debug_->guarded.insert(b->data());
  if (debug_->guard_freed.erase(b->data()) != 0) {  // the address is a new block's now
    auto& order = debug_->guard_freed_order;
    order.erase(std::find(order.begin(), order.end(), b->data()));
  }
  return hand_out(tc, b, bytes, stream);
}

// Maps a run of pages for a block of `size` bytes and carves it: [unmapped][run][unmapped, at
// least one page]; within the run, the bytes before the block are a free block of every stream.
// Returns the block (allocated, on `stream`), or nullptr with `oom` set.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::guard_place(
  std::size_t size, int kind, stream_type stream, bool& oom)
{
  std::size_t const page  = pages_.page_bytes[kind];
  std::size_t const pages = (size + page - 1) / page;
  std::uintptr_t at       = 0;
  block* u                = guard_range(pages, kind, at);
  if (u == nullptr) {
    u = reserve_growable(size + 2 * page, kind, stream, oom);
    if (u == nullptr) { return nullptr; }
    at = u->address();
  }
  auto* seg = static_cast<segment*>(u->segment);
  if (!map_pages(*seg, (at - reinterpret_cast<std::uintptr_t>(seg->ptr)) / page, pages, oom)) {
    return nullptr;
  }
  auto& list = pages_.unmapped[kind];
  list.erase(std::find(list.begin(), list.end(), u));
  block* run = u;
  if (at > u->address()) {
    run = blocks_.split_off(u, at - u->address());
    list.push_back(u);
  }
  list.push_back(blocks_.split_off(run, pages * page));  // the guard page and beyond
  debug_->guard_cursor = at + pages * page;
  block* b             = run;
  if (pages * page > size) { b = blocks_.split_off(run, pages * page - size); }
  b->state.store(detail::block_state::allocated, std::memory_order_relaxed);  // no merge into it
  if (b != run) {
    run->global   = true;  // never used: any stream's
    run->free_seq = 0;
    insert_free(run);
  }
  b->stream = stream;
  b->global = false;
  return b;
}

// The unmapped block with room for a run of `pages` pages (after an unmapped page when a mapped
// one precedes it, and before one more unmapped page), at `at`: the lowest address at or beyond
// the cursor, else (round the address space once) the lowest of all. nullptr when none has room.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::guard_range(
  std::size_t pages, int kind, std::uintptr_t& at)
{
  std::size_t const page      = pages_.page_bytes[kind];
  std::uintptr_t const cursor = debug_->guard_cursor;
  block* ahead                = nullptr;
  block* lowest               = nullptr;
  std::uintptr_t ahead_at = std::numeric_limits<std::uintptr_t>::max(), lowest_at = ahead_at;
  for (block* u : pages_.unmapped[kind]) {
    std::uintptr_t const lo = u->address(), hi = lo + u->size;
    std::uintptr_t start = lo + (u->prev != nullptr ? page : 0);
    if (cursor > lo && cursor < hi) { start = std::max(start, cursor); }
    if (start >= hi || hi - start < (pages + 1) * page) { continue; }
    if (start >= cursor && start < ahead_at) {
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

// Guard pages: the free of a guarded block, checked by debug_free (debug lock held). Waits for
// the block's streams, then unmaps its run (the pages become spare pages). A stream found
// destroyed costs a device synchronization.
// @throws gpukit::cuda_error when a wait fails (the block stays allocated) or an unmap fails (the
//         block is free; its pages stay mapped until release)
template <class Runtime>
void basic_caching_allocator<Runtime>::guard_free(void* ptr, std::size_t bytes, bool check_size,
                                                  stream_type stream)
{
  thread_cache& tc = local_cache();
  void* owner      = nullptr;
  block* b         = claim_foreign(ptr, bytes, check_size, owner);
  std::vector<stream_type> streams{stream};
  {
    detail::pool_lock lock{mutex_};
    streams.insert(streams.end(), b->recorded.begin(), b->recorded.end());
  }
  try {
    device_guard<Runtime> guard{runtime_, device_};
    for (stream_type s : streams) {
      typename Runtime::error_type e = runtime_.stream_synchronize(s);
      if (e == Runtime::invalid_resource_handle) { e = runtime_.device_synchronize(); }
      GPUKIT_CUDA_TRY(e, "deallocate: waiting for the work on a block with guard pages");
    }
  } catch (...) {
    b->owner.store(owner, std::memory_order_release);  // as if this free had not been made
    throw;
  }
  count_free(tc, b, ptr, stream);
  detail::pool_lock lock{mutex_};
  b->recorded.clear();
  debug_->guarded.erase(ptr);
  debug_->guard_freed.insert(ptr);
  debug_->guard_freed_order.push_back(ptr);
  while (debug_->guard_freed_order.size() >
         std::max<std::size_t>(options_.debug.quarantine_blocks, 1)) {
    debug_->guard_freed.erase(debug_->guard_freed_order.front());
    debug_->guard_freed_order.pop_front();
  }
  b->stream     = stream_type{};  // its work is done: any stream's
  b->global     = true;
  block* merged = insert_free(b);
  if (recovery_.waiters != 0) { recovery_.frees_cv.notify_all(); }
  // The free has happened: from here nothing throws (a caller told of an error would free the
  // block again). Pages that cannot be unmapped now stay mapped until release() unmaps them.
  try {
    typename Runtime::error_type error = Runtime::success;
    device_guard<Runtime> guard{runtime_, device_};
    unmap_free_pages(merged, std::numeric_limits<std::size_t>::max(), error);
    if (error != Runtime::success) {
      stats_.count(&caching_allocator_stats::num_guard_unmap_failures);
    }
  } catch (...) {
    stats_.count(&caching_allocator_stats::num_guard_unmap_failures);
  }
}

/// Blocks waiting in the debug quarantine (0 when debug mode is off).
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::debug_quarantined_blocks() const
{
  if (debug_ == nullptr) { return 0; }
  detail::pool_lock debug_lock{debug_->mutex};
  return debug_->held.size();
}

}  // namespace gpukit
