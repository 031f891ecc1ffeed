// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/quarantine.hpp: the caching allocator's debug mode (see
// caching_allocator_debug_options): the checks of a free against the pool's books, the poisoning
// of freed blocks and their first-in first-out quarantine, and how debug mode settles the segment
// source at construction. Not public API.
//
// A free in debug mode stops here first: the block is checked (ours, allocated, the size it was
// allocated with), its NVTX region unregistered (a tool reports any later access), its bytes
// poisoned in the freeing stream's order, and it joins the quarantine. It returns to the pool
// through the ordinary free path only when the quarantine overflows, when its stream is flushed
// (forget_stream), or at release(); until then it stays "allocated" in the pool's books, so a
// second free of it is reported as a double free, however long ago the first one was.
//
// Owns: the quarantine (its entries in free order, the set of their pointers, their bytes) and the
// lock that guards it. That lock is taken before the allocator's pool lock, never while holding
// it (declared below with GPUKIT_ACQUIRED_BEFORE), since a free checks the pool's books under the
// pool lock while it holds the quarantine's. What it needs of the allocator comes as callables at
// the call: `admit` (the pool's side of a free) and `give_back` (the ordinary free of an entry
// that leaves the quarantine), which the quarantine calls without its lock. Invariants: `held_`
// holds exactly the pointers of `queue_`, and `held_bytes_` the sum of their sizes; the
// quarantine is within its bounds (quarantine_bytes, quarantine_blocks) but for entries whose
// give-back failed, which wait at its front for the next free or flush.
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <atomic>
#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace gpukit::detail::caching {

// compute-sanitizer (2025.3, seen on the H200) accepts NVTX heaps only over cudaMalloc memory: it
// rejects nvtxMemHeapRegister over cudaMallocAsync memory (default or own pool, even once the
// allocation has completed) and over virtual memory (the whole reservation, one mapped page, or
// two), and then every region in them, one reported error per call. So annotation describes
// synchronous segments only; in debug mode the allocator takes its segments from cudaMalloc
// whatever the source (`sanitizer_segments`), so that the tool sees every block.
//
// Guard pages need virtual memory, so they win over `sanitizer_segments` in growable allocators
// (annotation is off there: the tool rejects heaps over virtual memory anyway).

/// Debug mode's say in an allocator's settings, at its construction: `o` as the allocator will
/// use it, and where its segments come from (`stream_ordered`, `growable`: the source resolved).
/// Returns whether blocks get guard pages (detail/caching/guard_page_source.hpp).
/// @throws gpukit::logic_error when debug.guard_pages is asked of a source that is not growable
inline bool settle_debug_mode(caching_allocator_options& o, bool& stream_ordered, bool& growable)
{
  auto const source = [&] {
    switch (o.source) {
      case segment_source::automatic: return "automatic";
      case segment_source::stream_ordered: return "stream_ordered";
      case segment_source::synchronous: return "synchronous";
      default: return "growable";
    }
  };
  GPUKIT_EXPECTS(!o.debug.guard_pages || growable,
                 std::string{"caching_allocator_options: debug.guard_pages needs "
                             "segment_source::growable (guard pages are unmapped virtual memory), "
                             "but source is segment_source::"} +
                   source());
  bool const guard =
    growable && (o.debug.guard_pages || (o.debug.enabled && debug_guard_pages_requested()));
  if (guard) {
    o.debug.enabled       = true;
    o.debug.guard_pages   = true;
    o.nvtx_annotate       = false;
    o.growable_page_bytes = 1;  // rounded up to the granularity: the smallest page
  }
  if (o.nvtx_annotate && (stream_ordered || growable)) {
    if (o.debug.enabled && o.debug.sanitizer_segments) {
      stream_ordered = false;
      growable       = false;
    } else {
      o.nvtx_annotate = false;
    }
  }
  return guard;
}

/// Debug mode's quarantine of freed blocks; see the top of this file.
template <class Runtime, class Block>
class quarantine {
 public:
  using stream_type = typename Runtime::stream_type;

  /// A free the quarantine holds: what the ordinary free of it takes, and the block's size.
  struct entry {
    void* ptr;
    std::size_t bytes;
    bool check_size;
    stream_type stream;
    std::size_t size;
  };

  /// The quarantine of an allocator of `device` of `runtime`, with its settled `options` (its
  /// debug bounds, poison byte and annotation), which reads `captures_underway` (the count of
  /// graph captures under way) before it poisons, and whose lock is taken before `pool_mutex`.
  quarantine(Runtime& runtime, int device, caching_allocator_options const& options,
             std::atomic<int> const& captures_underway, annotated_mutex& pool_mutex)
      : runtime_{runtime}, device_{device}, options_{options},
        captures_underway_{captures_underway}, pool_mutex_{pool_mutex}
  {}
  ~quarantine()                            = default;
  quarantine(quarantine const&)            = delete;
  quarantine& operator=(quarantine const&) = delete;
  quarantine(quarantine&&)                 = delete;
  quarantine& operator=(quarantine&&)      = delete;

  /// The pointer the calling thread is handing back to the pool from a quarantine: its free takes
  /// the ordinary path (free() returns false for it).
  [[nodiscard]] static void const*& releasing() noexcept
  {
    static thread_local void const* releasing = nullptr;
    return releasing;
  }

  /// Takes the free of `ptr` (`bytes`, `check_size`, on `stream`): true when the quarantine took
  /// it (the caller returns), false for the entry the calling thread is giving back. Under the
  /// quarantine's lock: a pointer still in the quarantine is a double free; then `admit()` checks
  /// the free against the pool's books (it takes the pool lock) and returns the block's size, or
  /// std::nullopt when it completed the free itself (nothing is quarantined: a block with guard
  /// pages); the block is unregistered (annotation), poisoned (outside captures) and quarantined.
  /// The oldest entries beyond the bounds then go back through `give_back(entry)`, without the
  /// lock; a failure there is swallowed (the free happened: a retry would be a double free), and
  /// the entries not given back stay at the front of the quarantine.
  /// @throws gpukit::logic_error for a double free of a quarantined block, and what `admit` throws
  /// @throws gpukit::cuda_error when poisoning fails (nothing is quarantined)
  template <class Admit, class GiveBack>
  bool free(void* ptr, std::size_t bytes, bool check_size, stream_type stream, Admit&& admit,
            GiveBack&& give_back) GPUKIT_EXCLUDES(mutex_, pool_mutex_)
  {
    if (releasing() == ptr) { return false; }
    std::vector<entry> evicted;
    {
      pool_lock lock{mutex_};
      GPUKIT_EXPECTS(held_.count(ptr) == 0,
                     "deallocate: double free of " + detail::hex(ptr) +
                       " (freed before and still in the debug quarantine, device " +
                       std::to_string(device_) + ")");
      std::optional<std::size_t> const size = admit();
      if (!size) { return true; }
      if (options_.nvtx_annotate) { unregister_memory_region(ptr); }
      poison(ptr, *size, stream);
      hold({ptr, bytes, check_size, stream, *size}, evicted);
    }
    try {
      release(evicted, give_back);
    } catch (...) {}
    return true;
  }

  /// Gives back, through `give_back(entry)`, the quarantined frees made on `stream`, before the
  /// stream can go away.
  /// @throws what `give_back` throws (that entry and the later ones stay quarantined)
  template <class GiveBack>
  void flush(stream_type stream, GiveBack&& give_back) GPUKIT_EXCLUDES(mutex_, pool_mutex_)
  {
    release(take([&](entry const& e) { return e.stream == stream; }), give_back);
  }
  /// Gives back every quarantined free (the quarantine's blocks are free memory too).
  /// @throws what `give_back` throws (that entry and the later ones stay quarantined)
  template <class GiveBack>
  void flush_all(GiveBack&& give_back) GPUKIT_EXCLUDES(mutex_, pool_mutex_)
  {
    release(take([](entry const&) { return true; }), give_back);
  }

  /// Frees waiting in the quarantine.
  [[nodiscard]] std::size_t blocks() const GPUKIT_EXCLUDES(mutex_)
  {
    pool_lock lock{mutex_};
    return held_.size();
  }

  /// Debug mode's check of a free against the pool's books (the caller holds the pool lock): `b`,
  /// the block at `ptr` (nullptr when none), is allocated, and `bytes` is the size it was allocated
  /// with (when `check_size`). Returns its size.
  /// @throws gpukit::logic_error naming the pointer otherwise
  [[nodiscard]] std::size_t check_free(Block const* b, void const* ptr, std::size_t bytes,
                                       bool check_size) const
  {
    GPUKIT_EXPECTS(b != nullptr, "deallocate: pointer " + detail::hex(ptr) +
                                   " was not allocated by this allocator (device " +
                                   std::to_string(device_) + ")");
    GPUKIT_EXPECTS(b->state.load(std::memory_order_relaxed) == block_state::allocated,
                   "deallocate: double free of " + detail::hex(ptr) + " (a block of " +
                     std::to_string(b->size) + " bytes that is already free, device " +
                     std::to_string(device_) + ")");
    GPUKIT_EXPECTS(!check_size || bytes == b->requested,
                   "deallocate: pointer " + detail::hex(ptr) + " was allocated with " +
                     std::to_string(b->requested) + " bytes but freed with " +
                     std::to_string(bytes));
    return b->size;
  }

 private:
  // Writes the poison byte over the block in `stream` order. Not while a graph is being captured:
  // the memset would become a node of the user's graph.
  void poison(void* ptr, std::size_t size, stream_type stream)
  {
    if (options_.debug.poison_byte < 0 || captures_underway_.load(std::memory_order_relaxed) != 0) {
      return;
    }
    device_guard<Runtime> guard{runtime_, device_};
    GPUKIT_CUDA_TRY(runtime_.memset_async(ptr, options_.debug.poison_byte & 0xff, size, stream));
  }

  // Quarantines `e`; the oldest entries beyond the quarantine's bounds go to `evicted`.
  void hold(entry const& e, std::vector<entry>& evicted) GPUKIT_REQUIRES(mutex_)
  {
    queue_.push_back(e);
    held_.insert(e.ptr);
    held_bytes_ += e.size;
    while (!queue_.empty() && (held_bytes_ > options_.debug.quarantine_bytes ||
                               held_.size() > options_.debug.quarantine_blocks)) {
      evicted.push_back(queue_.front());
      queue_.pop_front();
      held_.erase(evicted.back().ptr);
      held_bytes_ -= evicted.back().size;
    }
  }

  // Takes the entries that `pick` chooses out of the quarantine, in quarantine order.
  template <class Pick>
  std::vector<entry> take(Pick&& pick) GPUKIT_EXCLUDES(mutex_)
  {
    std::vector<entry> taken;
    pool_lock lock{mutex_};
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (!pick(*it)) {
        ++it;
        continue;
      }
      taken.push_back(*it);
      held_.erase(it->ptr);
      held_bytes_ -= it->size;
      it = queue_.erase(it);
    }
    return taken;
  }

  // Gives `evicted` back in order; when one fails, it and the ones after it go back to the front
  // of the quarantine, in the same order, and the error is rethrown.
  template <class GiveBack>
  void release(std::vector<entry> const& evicted, GiveBack& give_back) GPUKIT_EXCLUDES(mutex_)
  {
    for (auto it = evicted.begin(); it != evicted.end(); ++it) {
      releasing() = it->ptr;
      try {
        give_back(*it);
      } catch (...) {
        releasing() = nullptr;
        pool_lock lock{mutex_};
        for (auto back = evicted.end(); back != it;) {
          --back;
          queue_.push_front(*back);
          held_.insert(back->ptr);
          held_bytes_ += back->size;
        }
        throw;
      }
      releasing() = nullptr;
    }
  }

  Runtime& runtime_;
  int device_;
  caching_allocator_options options_;
  std::atomic<int> const& captures_underway_;
  annotated_mutex& pool_mutex_;  // the allocator's pool lock (named for the lock order only)
  mutable annotated_mutex mutex_ GPUKIT_ACQUIRED_BEFORE(pool_mutex_);
  std::deque<entry> queue_ GPUKIT_GUARDED_BY(mutex_);  // oldest first
  std::unordered_set<void*> held_ GPUKIT_GUARDED_BY(mutex_);
  std::size_t held_bytes_ GPUKIT_GUARDED_BY(mutex_){0};
};

}  // namespace gpukit::detail::caching
