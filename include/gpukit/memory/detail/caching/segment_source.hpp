// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/segment_source.hpp: the caching allocator's fixed segments, taken
// from their source and given back to it. Not public API.
//
// The source is chosen once, by the allocator's constructors: the runtime's stream-ordered
// allocator (malloc_async on the requesting stream, free_async on the stream that used the
// segment last), its synchronous one (malloc / free, each free counted as synchronizing), or a
// user's resource (detail/caching/upstream_source.hpp). Growable segments are not this layer's
// (detail/caching/growable_source.hpp), but their pages are counted in the same reserved bytes.
//
// Taking (take): a segment of the size the request's class calls for (2 MiB small, 20 MiB medium,
// else the request rounded), or one just big enough when that would pass the limit or an upstream
// resource refuses the larger one; refused on a stream being captured when stream-ordered (the
// allocation would join the graph). During a capture (take_for_capture) segments come from a
// synchronous malloc in relaxed capture mode, into the capture's private pool.
// Giving back (release): the free blocks that span a whole fixed segment, largest first, until at
// most a target is reserved; stream-ordered frees go on the stream that used the segment last (no
// wait; the stream is reported, so that an allocation finding no memory waits for it), and a
// stream found destroyed is retired and the free goes to the null stream.
//
// Owns: the choice of source and the bytes reserved from the device (pool_state; growable pages
// included, which growable_source adds through reserved_counter()). Invariants:
// - reserved() is the sum of the sizes of the segments (and growable pages) held.
// - Host-side bookkeeping (descriptor, block) is made before the runtime call, so that a failure
//   after it cannot leak device memory; a failed take leaves nothing behind.
// - No free is issued on a stream being captured, nor a synchronous free during a capture.
//
// Single-threaded: the allocator calls it under its pool lock. It keeps the runtime, the device
// and the allocator's options; what else a call needs of the allocator around it comes as `pool`,
// which the allocator builds at the call (basic_caching_allocator::segment_pool), and which
// provides:
//   blocks()                          the block index (block_index<Block>&)
//   limit()                           the allocator's limit in bytes (0: none)
//   capturing()                       whether a graph capture or capture window is under way
//   capture_active_on(stream) -> bool whether a capture this allocator was told of runs on stream
//   streams()                         the stream pools: a range of pointers to objects with
//                                     `stream`, `free_seq` and `index[2]`
//   pool_of(stream)                   `stream`'s pool (created when it has none)
//   count(&caching_allocator_stats::num_x, n)  adds n to an event counter
//   count_reserved(kind, delta)       reserved bytes of a pool kind, in the statistics
//   count_segment(kind, delta)        segments of a pool kind, in the statistics (raises peaks)
//   record(action, address, bytes, stream)   a segment event for the recorder
//   unindex(b)                        takes free block b out of its index
//   retire_dead_stream(stream)        a destroyed stream's blocks go to every stream
//   release_growable(target, only_stream) -> bytes   the growable segments' release (0: none)
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/segment.hpp>
#include <gpukit/memory/detail/caching/upstream_source.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace gpukit::detail::caching {

/// The fixed segments of a caching allocator and where they come from; see the top of this file.
template <class Runtime, class Block>
class segment_source {
 public:
  using segment_type = segment<Runtime>;
  using stream_type  = typename Runtime::stream_type;
  using error_type   = typename Runtime::error_type;
  using capture_id   = std::uint64_t;

  static constexpr std::size_t alignment = 256;  ///< of every block

  /// What is held from the device (the blocks themselves are in the block index; the segments are
  /// counted in the statistics).
  struct pool_state {
    std::size_t reserved{0};  // bytes held from the device (growable: mapped and spare pages)
  };

  /// Segments of `device` of `runtime`, sized by `options` (kept by reference: the owner's,
  /// settled before the first segment). Stream-ordered until told otherwise.
  segment_source(Runtime& runtime, int device, caching_allocator_options const& options) noexcept
      : runtime_{runtime}, device_{device}, options_{options}
  {}
  ~segment_source()                                = default;
  segment_source(segment_source const&)            = delete;
  segment_source& operator=(segment_source const&) = delete;
  segment_source(segment_source&&)                 = delete;
  segment_source& operator=(segment_source&&)      = delete;

  /// Segments from the runtime: malloc_async when `stream_ordered`, else malloc.
  void use_runtime(bool stream_ordered) noexcept { stream_ordered_ = stream_ordered; }
  /// Segments from `resource` (which must outlive this source), in stream order when it has
  /// stream-ordered entry points.
  template <class Resource>
  void use_upstream(Resource& resource) noexcept
  {
    upstream_       = upstream_source<stream_type>{resource};
    stream_ordered_ = upstream_.stream_ordered();
  }
  /// Where fixed segments come from: upstream, stream_ordered or synchronous.
  [[nodiscard]] ::gpukit::segment_source source() const noexcept
  {
    if (upstream_.engaged()) { return ::gpukit::segment_source::upstream; }
    return stream_ordered_ ? ::gpukit::segment_source::stream_ordered
                           : ::gpukit::segment_source::synchronous;
  }

  /// Bytes held from the device.
  [[nodiscard]] std::size_t reserved() const noexcept { return pool_.reserved; }
  /// The same, for growable_source, which maps and unmaps pages of its own.
  [[nodiscard]] std::size_t& reserved_counter() noexcept { return pool_.reserved; }

  /// The size of the segment a request of `size` bytes (rounded) takes.
  [[nodiscard]] std::size_t size_for(std::size_t size) const noexcept
  {
    if (size <= options_.small_request_bytes) { return options_.small_segment_bytes; }
    if (size <= options_.medium_request_bytes) { return options_.medium_segment_bytes; }
    return round_up(size, options_.segment_rounding_bytes);
  }

  /// The NVTX heap of the segment block b lies in.
  [[nodiscard]] static memory_heap heap_of(Block const* b) noexcept
  {
    return static_cast<segment_type const*>(b->segment)->nvtx_heap;
  }

  /// A new segment for a request of `size` bytes (rounded) of pool kind `kind` on `stream`: its
  /// one free block, indexed in `stream`'s pool. nullptr with `oom` set when the limit or the
  /// device (or the upstream resource) refuses it.
  /// @throws gpukit::logic_error on a stream being captured, when stream-ordered
  /// @throws gpukit::cuda_error when the runtime fails otherwise; what the upstream throws but
  ///         std::bad_alloc
  template <class Pool>
  Block* take(std::size_t size, int kind, stream_type stream, bool& oom, Pool&& pool)
  {
    std::size_t seg_size = size_for(size);
    if (!within_limit(size, seg_size, pool.limit())) {
      oom = true;
      return nullptr;
    }
    if (stream_ordered_) { refuse_capturing(stream); }
    GPUKIT_DETAIL_SLOW_PATH_RANGEF(::gpukit::categories::allocator,
                                   "allocate segment %.1f MiB%s stream %p", detail::mib(seg_size),
                                   stream_ordered_ ? " (stream-ordered)" : "",
                                   detail::stream_address(stream));
    // Host-side bookkeeping first, so that a failure after the runtime call cannot leak memory.
    auto seg     = std::make_unique<segment_type>();
    Block* b     = pool.blocks().new_block();
    void* p      = nullptr;
    error_type e = memory_with_retry(b, p, seg_size, size, stream, pool);
    if (e != Runtime::success) {
      pool.blocks().recycle(b);
      if (e == Runtime::out_of_memory) {
        oom = true;
        return nullptr;
      }
      GPUKIT_CUDA_TRY(e, upstream_.engaged() ? "the upstream resource"
                         : stream_ordered_   ? "malloc_async"
                                             : "malloc");
    }
    adopt(b, std::move(seg), p, seg_size, kind, stream, stream_ordered_, 0, pool);
    // Indexed as a free block of `stream`, so take finds it where it expects it.
    auto& sp    = pool.pool_of(stream);
    b->free_seq = ++sp.free_seq;
    sp.index[kind].insert(b);
    return b;
  }

  /// During a capture: a new segment for a request of `size` bytes of kind `kind` from a
  /// synchronous malloc in relaxed capture mode (legal during capture, not part of the graph), its
  /// free block of capture pool `id` (the caller indexes it). nullptr with `oom` set when the
  /// limit or the device refuses it.
  /// @throws gpukit::cuda_error when the runtime fails otherwise
  template <class Pool>
  Block* take_for_capture(std::size_t size, int kind, stream_type stream, capture_id id, bool& oom,
                          Pool&& pool)
  {
    std::size_t const seg_size = size_for(size);
    std::size_t const limit    = pool.limit();
    if (limit != 0 && pool_.reserved + seg_size > limit) {
      oom = true;
      return nullptr;
    }
    auto seg     = std::make_unique<segment_type>();
    Block* b     = pool.blocks().new_block();
    void* p      = nullptr;
    error_type e = Runtime::success;
    {
      device_guard<Runtime> guard{runtime_, device_};
      int mode = cudaStreamCaptureModeRelaxed;
      GPUKIT_CUDA_TRY(runtime_.exchange_capture_mode(mode));
      e = runtime_.malloc(&p, seg_size);
      (void)runtime_.exchange_capture_mode(mode);
    }
    if (e != Runtime::success) {
      pool.blocks().recycle(b);
      if (e == Runtime::out_of_memory) {
        oom = true;
        return nullptr;
      }
      GPUKIT_CUDA_TRY(e, "malloc (a segment for a graph capture)");
    }
    adopt(b, std::move(seg), p, seg_size, kind, stream, false, id, pool);
    return b;
  }

  /// Returns fully free fixed segments, largest first, until at most `target` bytes are reserved
  /// (growable segments unmap their free pages first, through the pool); only those of pool kind
  /// `only_kind` (-1: both, and the growable ones) and of `only_stream`'s pool (nullptr: every
  /// pool). The streams of the stream-ordered frees issued go to `issued`, which an allocation
  /// that finds no memory waits for before reporting out of memory. Returns the bytes released.
  /// @throws gpukit::cuda_error when a free fails (that segment stays; those before are gone)
  template <class Pool>
  std::size_t release(std::size_t target, std::vector<stream_type>& issued, int only_kind,
                      stream_type const* only_stream, Pool&& pool)
  {
    GPUKIT_DETAIL_SLOW_PATH_RANGE(::gpukit::categories::allocator,
                                  "release free segments to the driver");
    std::size_t released = 0;
    if (only_kind < 0) { released += pool.release_growable(target, only_stream); }
    std::vector<Block*> const whole = whole_free_segments(only_kind, only_stream, pool);
    device_guard<Runtime> guard{runtime_, device_};
    capture_probe capturing{runtime_};
    for (Block* b : whole) {
      if (pool_.reserved <= target) { break; }
      if (capturing(b->global ? stream_type{} : b->stream)) { continue; }  // stays until it ends
      released += release_one(b, issued, pool);
    }
    return released;
  }

  /// Teardown: fixed segment `seg` back to its source, whatever it holds, and its descriptor
  /// deleted (its NVTX heap is the caller's to unregister first). Never throws: each runtime call
  /// goes through `call`, which retries and counts it; an upstream that throws counts as failed.
  template <class Call>
  void teardown(segment_type* seg, Call& call) noexcept
  {
    if (upstream_.engaged()) {
      try {
        upstream_.deallocate(seg->ptr, seg->size, stream_type{});
      } catch (...) {  // counted, as a runtime call that failed
        ++call.failed;
      }
    } else if (seg->stream_ordered) {
      if (runtime_.free_async(seg->ptr, stream_type{}) != Runtime::success) {
        call([&] { return runtime_.free(seg->ptr); });
      }
    } else {
      call([&] { return runtime_.free(seg->ptr); });
    }
    delete seg;
  }

 private:
  /// Whether streams are being captured into a CUDA graph, asked of the runtime once per stream
  /// (legal during capture). A capture the allocator was not told about (begun on the stream
  /// directly) shows only here: a free on such a stream would become a node of the graph.
  struct capture_probe {
    Runtime& runtime;
    std::vector<stream_type> capturing{};
    std::vector<stream_type> idle{};

    bool operator()(stream_type s)
    {
      if (s == stream_type{}) { return false; }  // the null stream is never captured
      if (std::find(idle.begin(), idle.end(), s) != idle.end()) { return false; }
      if (std::find(capturing.begin(), capturing.end(), s) != capturing.end()) { return true; }
      bool now           = false;
      error_type const e = runtime.stream_is_capturing(s, now);
      // Destroyed: no capture (a capturing stream cannot be destroyed); the free finds it dead and
      // retires it.
      if (e == Runtime::invalid_resource_handle) { return false; }
      GPUKIT_CUDA_TRY(e, "stream_is_capturing (releasing cached memory)");
      (now ? capturing : idle).push_back(s);
      return now;
    }
  };

  // Whether a segment for `size` bytes fits under `limit` (0: none): `seg_size` becomes one just
  // big enough when the usual one would pass it.
  bool within_limit(std::size_t size, std::size_t& seg_size, std::size_t limit) const noexcept
  {
    if (limit == 0 || pool_.reserved + seg_size <= limit) { return true; }
    // Within the limit, a segment just big enough may still fit.
    seg_size = round_up(size, alignment);
    return pool_.reserved + seg_size <= limit;
  }

  // On a stream being captured, malloc_async would become a node of the graph: refuse clearly.
  void refuse_capturing(stream_type stream)
  {
    bool capturing = false;
    GPUKIT_CUDA_TRY(runtime_.stream_is_capturing(stream, capturing));
    GPUKIT_EXPECTS(!capturing,
                   "allocate_async: the stream is being captured into a CUDA graph; call "
                   "begin_capture(stream) on the allocator before allocating during capture");
  }

  // The memory of a segment of `seg_size` bytes (for `size` asked); an upstream resource may have
  // a limit of its own: a segment just big enough may still fit. Block b goes back to the index's
  // spares when the upstream throws otherwise (its error, nothing kept).
  template <class Pool>
  error_type memory_with_retry(Block* b, void*& p, std::size_t& seg_size, std::size_t size,
                               stream_type stream, Pool& pool)
  {
    try {
      error_type e = memory(p, seg_size, stream);
      if (upstream_.engaged() && e == Runtime::out_of_memory &&
          seg_size > round_up(size, alignment)) {
        seg_size = round_up(size, alignment);
        e        = memory(p, seg_size, stream);
      }
      return e;
    } catch (...) {
      pool.blocks().recycle(b);
      throw;
    }
  }

  // A segment's memory from the upstream resource (its std::bad_alloc is out of memory), else
  // from the runtime: malloc_async on `stream`, or malloc.
  error_type memory(void*& p, std::size_t bytes, stream_type stream)
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

  // Makes `b` the one free block of a new segment [p, p + seg_size) and counts the segment; the
  // caller indexes it.
  template <class Pool>
  void adopt(Block* b, std::unique_ptr<segment_type> seg, void* p, std::size_t seg_size, int kind,
             stream_type stream, bool stream_ordered, capture_id id, Pool& pool)
  {
    seg->ptr            = p;
    seg->size           = seg_size;
    seg->kind           = kind;
    seg->stream_ordered = stream_ordered;
    if (options_.nvtx_annotate) {
      seg->nvtx_heap = register_memory_heap(p, seg_size, "gpukit caching allocator");
    }
    smallest_fixed_ = std::min(smallest_fixed_, seg_size);  // adopt makes only fixed segments
    pool.blocks().add_segment(b, p, seg_size, seg.release());
    b->kind         = kind;
    b->stream       = stream;
    b->global       = false;
    b->capture_pool = id;
    b->state.store(block_state::free, std::memory_order_relaxed);
    pool_.reserved += seg_size;
    pool.count_reserved(kind, static_cast<std::int64_t>(seg_size));
    pool.count_segment(kind, 1);  // raises the reserved and segment peaks
    pool.count(&caching_allocator_stats::num_device_allocs);
    pool.record(memory_event::action::segment_alloc, b->address(), seg_size, stream);
  }

  // The free blocks that span a fixed segment of their own, in the pools release names, largest
  // first. While a graph is captured: none of a capturing stream (a free there would join the
  // graph) and no synchronous segment (its free is illegal then).
  template <class Pool>
  std::vector<Block*> whole_free_segments(int only_kind, stream_type const* only_stream, Pool& pool)
  {
    bool const capture = pool.capturing();
    std::vector<Block*> whole;
    auto collect = [&](Block* b) {
      auto const* seg = static_cast<segment_type const*>(b->segment);
      bool const alone =
        b->prev == nullptr && b->next == nullptr && b->capture_pool == 0 && !seg->growable;
      if (!alone || (only_kind >= 0 && b->kind != only_kind)) { return; }
      if (capture && (!seg->stream_ordered || (!b->global && pool.capture_active_on(b->stream)))) {
        return;
      }
      whole.push_back(b);
    };
    // A block that spans a whole fixed segment is no smaller than the smallest one ever made: the
    // many smaller free blocks (the splits) are not visited.
    for_each_free_index(only_stream, pool, [&](tlsf_index<Block>& idx) {
      idx.for_each_from(smallest_fixed_, collect);
    });
    std::sort(whole.begin(), whole.end(), [](Block* a, Block* b) { return a->size > b->size; });
    return whole;
  }

  // Calls f(index) for the free indices of `only_stream`'s pool (nullptr: every stream's pool,
  // then the global ones).
  template <class Pool, class F>
  static void for_each_free_index(stream_type const* only_stream, Pool& pool, F&& f)
  {
    for (auto& sp : pool.streams()) {
      if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
      for (auto& idx : sp->index) { f(idx); }
    }
    if (only_stream != nullptr) { return; }
    for (auto& idx : pool.blocks().globals()) { f(idx); }
  }

  // Frees the segment that free block b spans: stream-ordered in the order of the stream that
  // used it last (no wait; that stream goes to `issued`), else synchronously. Returns its bytes.
  template <class Pool>
  std::size_t release_one(Block* b, std::vector<stream_type>& issued, Pool& pool)
  {
    auto* seg = static_cast<segment_type*>(b->segment);
    if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }  // before the free
    stream_type const on = free_memory(*seg, b->global ? stream_type{} : b->stream, pool);
    if (seg->stream_ordered && std::find(issued.begin(), issued.end(), on) == issued.end()) {
      issued.push_back(on);
    }
    if (!seg->stream_ordered) { pool.count(&caching_allocator_stats::synchronizing_frees); }
    pool.record(memory_event::action::segment_free, b->address(), seg->size, on);
    pool.unindex(b);
    pool.blocks().remove(b);
    std::size_t const bytes = seg->size;
    pool_.reserved -= bytes;
    pool.count_reserved(seg->kind, -static_cast<std::int64_t>(bytes));
    pool.count_segment(seg->kind, -1);
    pool.count(&caching_allocator_stats::num_device_frees);
    delete seg;
    return bytes;
  }

  // The runtime's free of a fixed segment last used on `on`; a stream found destroyed is retired
  // (the device waited for) and the free goes to the null stream. Returns the stream it went to.
  // @throws gpukit::cuda_error when the free fails (the segment stays)
  template <class Pool>
  stream_type free_memory(segment_type& seg, stream_type on, Pool& pool)
  {
    if (upstream_.engaged()) {
      upstream_.deallocate(seg.ptr, seg.size, seg.stream_ordered ? on : stream_type{});
      return on;
    }
    if (!seg.stream_ordered) {
      GPUKIT_CUDA_TRY(runtime_.free(seg.ptr), "free (releasing a segment)");
      return on;
    }
    error_type e = runtime_.free_async(seg.ptr, on);
    if (e == Runtime::invalid_resource_handle && !pool.capturing()) {
      pool.retire_dead_stream(on);
      on = stream_type{};
      e  = runtime_.free_async(seg.ptr, on);
    }
    GPUKIT_CUDA_TRY(e, "free_async (releasing a segment)");
    return on;
  }

  Runtime& runtime_;
  int device_;
  caching_allocator_options const& options_;
  bool stream_ordered_{true};
  upstream_source<stream_type> upstream_;  // engaged: segments from a user's resource
  pool_state pool_;
  std::size_t smallest_fixed_{~std::size_t{0}};  // the smallest fixed segment made so far
};

}  // namespace gpukit::detail::caching
