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
  std::mutex mutex;  // taken before the pool lock, never after it
  std::deque<entry> quarantine;
  std::unordered_set<void*> held;
  std::size_t held_bytes{0};
};

// compute-sanitizer (2025.3, seen on the H200) accepts NVTX heaps only over cudaMalloc memory: it
// rejects nvtxMemHeapRegister over cudaMallocAsync memory (default or own pool, even once the
// allocation has completed) and over virtual memory (the whole reservation, one mapped page, or
// two), and then every region in them, one reported error per call. So annotation describes
// synchronous segments only; in debug mode the allocator takes its segments from cudaMalloc
// whatever the source (`sanitizer_segments`), so that the tool sees every block.
template <class Runtime>
void basic_caching_allocator<Runtime>::debug_init()
{
  if (options_.nvtx_annotate && (stream_ordered_ || growable_)) {
    if (options_.debug.enabled && options_.debug.sanitizer_segments) {
      stream_ordered_ = false;
      growable_       = false;
    } else {
      options_.nvtx_annotate = false;
    }
  }
  if (options_.debug.enabled) { debug_ = std::make_unique<debug_state>(); }
}

// The pointer the calling thread is handing back to the pool from the quarantine: its free takes
// the ordinary path.
template <class Runtime>
void const*& basic_caching_allocator<Runtime>::debug_releasing() noexcept
{
  static thread_local void const* releasing = nullptr;
  return releasing;
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
    std::lock_guard<std::mutex> debug_lock{debug_->mutex};
    GPUKIT_EXPECTS(debug_->held.count(ptr) == 0,
                   "deallocate: double free of " + detail::hex(ptr) +
                     " (freed before and still in the debug quarantine, device " +
                     std::to_string(device_) + ")");
    std::size_t size = 0;
    {
      std::lock_guard<std::mutex> lock{mutex_};
      block const* b = pool_.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
      GPUKIT_EXPECTS(b != nullptr, "deallocate: pointer " + detail::hex(ptr) +
                                     " was not allocated by this allocator (device " +
                                     std::to_string(device_) + ")");
      GPUKIT_EXPECTS(b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
                     "deallocate: double free of " + detail::hex(ptr) + " (a block of " +
                       std::to_string(b->size) + " bytes that is already free, device " +
                       std::to_string(device_) + ")");
      GPUKIT_EXPECTS(!check_size || bytes == b->requested,
                     "deallocate: pointer " + detail::hex(ptr) + " was allocated with " +
                       std::to_string(b->requested) + " bytes but freed with " +
                       std::to_string(bytes));
      size = b->size;
    }
    if (options_.nvtx_annotate) { unregister_memory_region(ptr); }
    // Not while a graph is being captured: the memset would become a node of the user's graph.
    if (options_.debug.poison_byte >= 0 && capture_.underway.load(std::memory_order_relaxed) == 0) {
      device_guard<Runtime> guard{runtime_, device_};
      GPUKIT_CUDA_TRY(runtime_.memset_async(ptr, options_.debug.poison_byte & 0xff, size, stream));
    }
    debug_->quarantine.push_back({ptr, bytes, check_size, stream, size});
    debug_->held.insert(ptr);
    debug_->held_bytes += size;
    auto const& o = options_.debug;
    while (!debug_->quarantine.empty() &&
           (debug_->held_bytes > o.quarantine_bytes || debug_->held.size() > o.quarantine_blocks)) {
      evicted.push_back(debug_->quarantine.front());
      debug_->quarantine.pop_front();
      debug_->held.erase(evicted.back().ptr);
      debug_->held_bytes -= evicted.back().size;
    }
  }
  debug_release(evicted);
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
    std::lock_guard<std::mutex> debug_lock{debug_->mutex};
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
  for (auto const& e : evicted) {
    debug_releasing() = e.ptr;
    try {
      deallocate_impl(e.ptr, e.bytes, e.check_size, e.stream);
    } catch (...) {
      debug_releasing() = nullptr;
      throw;
    }
    debug_releasing() = nullptr;
  }
}

/// Blocks waiting in the debug quarantine (0 when debug mode is off).
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::debug_quarantined_blocks() const
{
  if (debug_ == nullptr) { return 0; }
  std::lock_guard<std::mutex> debug_lock{debug_->mutex};
  return debug_->held.size();
}

}  // namespace gpukit
