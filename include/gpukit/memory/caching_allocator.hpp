// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/caching_allocator.hpp: a stream-ordered caching device allocator.
//
// Quick start:
//
//   #include <gpukit/memory/caching_allocator.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   void step(std::size_t bytes, cudaStream_t stream)
//   {
//     gpukit::caching_allocator& alloc = gpukit::default_caching_allocator(0);  // device 0
//     void* p = alloc.allocate_async(bytes, stream);  // usable in `stream` order at once
//     // launch_kernel<<<grid, block, 0, stream>>>(p);
//     alloc.deallocate_async(p, bytes, stream);       // reusable on `stream` at once, on other
//                                                     // streams once this work has completed
//     auto s = alloc.stats();                         // PyTorch's vocabulary: allocated,
//     (void)s.reserved_bytes;                         // reserved, active, inactive split, ...
//   }
//
//   // Over any memory resource: segments from `upstream`, here capped at 8 GiB and counted.
//   //   gpukit::malloc_async_resource device{gpukit::cuda_runtime::instance(), 0};
//   //   gpukit::limiting_resource_adaptor capped{device, std::size_t{8} << 30};
//   //   gpukit::caching_allocator over{gpukit::cuda_runtime::instance(), 0, capped};
//
//   void in_ci()  // the same allocator on a simulated GPU (CI without a GPU)
//   {
//     gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{16} << 30)};
//     gpukit::basic_caching_allocator<gpukit::sim_runtime> sim_alloc{sim, 0};
//     void* p = sim_alloc.allocate_async(1 << 20, {});
//     sim_alloc.deallocate_async(p, 1 << 20, {});
//   }
//
// ## Design (why it is fast, and frugal)
//
// - Per-thread caches in front of a shared pool. Each thread keeps, per allocator and per stream,
//   short LIFO lists of recently freed blocks by size class, and a private map of the blocks it
//   handed out. Reusing a block on the stream it was freed on (the common case in a training loop)
//   takes no lock, makes no runtime call and writes no cache line another thread writes; the
//   statistics are counted per thread and summed when read (peaks from the second thread on:
//   batched into shared counters, within a documented bound; see stats()).
// - The shared pool (one mutex) indexes free blocks with two-level segregated fit (TLSF: O(1),
//   16 classes per power of two, exact fits preferred), splits blocks at 256-byte granularity and
//   coalesces neighbours within a segment. Small requests (<= 1 MiB) are carved from 2 MiB
//   segments and larger ones from their own segments, as PyTorch does, so small blocks never pin
//   large segments.
// - Stream semantics: a block freed on stream S is reusable on S at once. Another stream gets it
//   only after the work queued on S before the free has completed: when a stream runs out of
//   blocks, the allocator records one event on each other stream that holds free blocks (an event
//   per crossing, never per free) and moves those blocks to a stream-less pool once it completes.
//   `record_stream(p, s)` marks a block as used on another stream too; its free then waits for an
//   event on each such stream.
// - Segments come from the runtime's stream-ordered allocator (`cudaMallocAsync` on the
//   requesting stream) when the device supports memory pools, so that giving memory back
//   (`release`, `trim`, the OOM path) is itself stream-ordered and never synchronizes the device.
//   With `segment_source::synchronous` they come from `cudaMalloc`/`cudaFree`, and every
//   `cudaFree` is counted in `stats().synchronizing_frees`.
// - Growable segments (`segment_source::growable`): each stream and pool kind gets a large range
//   of virtual addresses; pages of physical memory (`cuMemCreate`) are mapped into it on demand,
//   at the end of the free space a request needs, so the free block before the end of the mapped
//   region and the new pages form one block: a segment never "ends" under a block, and peak
//   reserved memory tracks peak live memory. Free pages whose work has completed (their stream is
//   idle, or an event shows it) are unmapped and their physical memory mapped again where the
//   pool grows, before any new memory is taken from the device. A map that fails part-way undoes
//   itself (pages unmapped, new handles released), so the allocator stays as it was and the next
//   allocation works. Unmapping waits only on the stream whose work used those pages (a stream
//   synchronize on the allocator's device), never on the device. Statistics count mapped (and
//   held) physical memory as reserved, and each page mapped or unmapped as a device alloc or free.
// - Ownership: a free is accepted exactly once, whichever threads race (one compare-exchange on
//   the block); the loser gets a double-free error and changes nothing. A double free is caught
//   whenever the block has not been handed out again since, from any thread. Once it has, the
//   stale free cannot be told from a legitimate free, by another thread, of the new owner's block
//   (a pointer-based allocator sees only the address; PyTorch's, RMM's and cudaMallocAsync's
//   share this): it is accepted as that, and the new owner's own free is then the one reported.
// - Streams: frees check their stream as allocations do (device, liveness). A stream found
//   destroyed (a free or record_stream naming it, or blocks still cached for it) costs one device
//   synchronization (its queued work still runs on CUDA, and no event can be recorded on it), after
//   which its blocks are usable on every stream; it never makes later operations fail.
//
// ## Destruction order
//
// gpukit's RAII types may outlive the allocator they used, whatever order they are declared in.
// The destructor returns every segment to the runtime, blocks still allocated included; an owning
// stream (gpukit/memory/cuda_stream.hpp) destroyed later no longer makes it forget the stream, and
// a device_buffer, device_uvector or device_scalar destroyed later frees nothing (its memory went
// back with the segments): both check `lifetime()`, never the allocator's memory. Work still
// queued on the device that uses such memory must have completed before the allocator goes, as
// always. Destroying the allocator while another thread uses it, or its buffers, is a data race.
//
// Thread-safe. One instance serves one device: the hot path never asks which device is current.
#pragma once

#include <gpukit/detail/alignment_check.hpp>
#include <gpukit/detail/cccl_compat.hpp>  // <cuda/memory_resource>, whichever CCCL
#include <gpukit/detail/lifetime.hpp>
#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/memory/alloc_conf.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/memory/detail/address_map.hpp>
#include <gpukit/memory/detail/caching/allocator_stats.hpp>
#include <gpukit/memory/detail/caching/block_index.hpp>
#include <gpukit/memory/detail/caching/capture_pools.hpp>
#include <gpukit/memory/detail/caching/event_recorder.hpp>
#include <gpukit/memory/detail/caching/event_ring.hpp>
#include <gpukit/memory/detail/caching/growable_source.hpp>
#include <gpukit/memory/detail/caching/guard_page_source.hpp>
#include <gpukit/memory/detail/caching/oom_ladder.hpp>
#include <gpukit/memory/detail/caching/quarantine.hpp>
#include <gpukit/memory/detail/caching/segment.hpp>
#include <gpukit/memory/detail/caching/segment_source.hpp>
#include <gpukit/memory/detail/caching/stream_pools.hpp>
#include <gpukit/memory/detail/caching/thread_cache_front.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/detail/cccl_entry_points.hpp>
#include <gpukit/memory/detail/debug_options.hpp>
#include <gpukit/memory/detail/shared_counts.hpp>
#include <gpukit/memory/detail/tlsf_index.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/detail/compiled_runtimes.hpp>
#include <gpukit/runtime/runtime.hpp>
#include <gpukit/stats.hpp>
#include <gpukit/version.hpp>

#include <cuda/stream_ref>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace gpukit {

/// What an out-of-memory callback is told.
struct oom_context {
  std::size_t requested{0};  ///< bytes of the allocation that failed (rounded to 256)
  int device{0};
  std::size_t reserved{0};  ///< bytes the allocator holds from the device
  std::size_t limit{0};     ///< the allocator's limit (0: none)
};

/// Called, without the allocator's lock, when an allocation fails: free what you can (spill a
/// cache, drop activations) and return true to have the allocation tried again.
using oom_callback = std::function<bool(oom_context const&)>;

/// Runtime calls that failed while caching allocators were being destroyed, in this process
/// (destructors never throw: each failure is counted here and the first is written to stderr).
[[nodiscard]] std::uint64_t caching_allocator_teardown_failures() noexcept;

namespace detail {
template <class Runtime>
struct allocator_invariants;
}  // namespace detail

/// A stream-ordered caching device allocator over a Runtime (see the top of this header).
///
/// All allocations are 256-byte aligned. Every member is thread-safe.
template <class Runtime>
class basic_caching_allocator final
    : public detail::cccl_entry_points<basic_caching_allocator<Runtime>> {
 public:
  using runtime_type    = Runtime;
  using stream_type     = typename Runtime::stream_type;
  using event_type      = typename Runtime::event_type;
  using physical_handle = typename Runtime::physical_handle;

  static constexpr std::size_t alignment = 256;

  /// An allocator for `device` of `runtime`. Does not allocate device memory yet.
  /// @throws gpukit::cuda_error if the device's properties cannot be read
  explicit basic_caching_allocator(Runtime& runtime, int device = 0,
                                   caching_allocator_options options = {});
  /// An allocator for `device` of `runtime` whose segments come from `upstream`: any gpukit
  /// resource, or any CCCL memory resource (an RMM resource, an adaptor stack,
  /// malloc_async_resource), through its stream-ordered entry points when it has them (segments
  /// then go back on the stream that last used them), else its synchronous ones. `upstream` must
  /// outlive the allocator. Everything else is as with the runtime's segments: the caching, the
  /// statistics (a segment is reserved memory), release/trim (segments go back to `upstream`) and
  /// the out-of-memory ladder, which runs when `upstream` throws std::bad_alloc (gpukit::bad_alloc
  /// and gpukit::out_of_memory are such). `segment_source_in_use()` is segment_source::upstream.
  /// @throws gpukit::logic_error if `options.source` is not automatic (the upstream is the source)
  ///         or guard pages are asked for (they need growable segments)
  template <
    class Upstream,
    std::enable_if_t<!std::is_same_v<std::decay_t<Upstream>, caching_allocator_options>, int> = 0>
  basic_caching_allocator(Runtime& runtime, int device, Upstream& upstream,
                          caching_allocator_options options = {})
      : basic_caching_allocator(runtime, device, upstream_checked(options))
  {
    segments_.use_upstream(upstream);
  }
  /// Returns every segment to the runtime (blocks still allocated are freed with them).
  ~basic_caching_allocator();

  basic_caching_allocator(basic_caching_allocator const&)            = delete;
  basic_caching_allocator& operator=(basic_caching_allocator const&) = delete;
  basic_caching_allocator(basic_caching_allocator&&)                 = delete;
  basic_caching_allocator& operator=(basic_caching_allocator&&)      = delete;

  /// Allocates `bytes` usable in `stream` order. Does not synchronize.
  /// The first use of a stream checks that it belongs to this allocator's device
  /// (cudaStreamGetDevice); a stream first used while it is being captured into a CUDA graph is
  /// checked at its first use after the capture instead, since that query would invalidate the
  /// capture.
  /// @throws gpukit::logic_error if bytes is 0, or for another device's stream
  /// @throws gpukit::bad_alloc if bytes exceeds the device or the limit
  /// @throws gpukit::out_of_memory if the device is full after recovery
  /// @throws gpukit::cuda_error if the runtime fails otherwise
  [[nodiscard]] void* allocate_async(std::size_t bytes, stream_type stream);

  /// Frees `ptr` (of `bytes`, as allocated) in `stream` order: reusable on `stream` at once, on
  /// other streams once the work queued on `stream` before this call has completed. A null ptr is
  /// ignored. Does not synchronize.
  /// A stream this thread has not freed on before is checked first: another device's stream is an
  /// error; a destroyed one synchronizes the device once and the block goes to every stream.
  /// @throws gpukit::logic_error for a pointer this allocator did not hand out, a double free, a
  ///         size other than the one allocated or another device's stream; the allocator is left
  ///         unchanged
  void deallocate_async(void* ptr, std::size_t bytes, stream_type stream);

  /// As deallocate_async, without checking the size (for interfaces that do not pass it).
  void deallocate_async(void* ptr, stream_type stream);

  /// allocate_async on the device's default stream (the RMM convention; does not synchronize).
  [[nodiscard]] void* allocate(std::size_t bytes) { return allocate_async(bytes, stream_type{}); }
  /// deallocate_async on the device's default stream.
  void deallocate(void* ptr, std::size_t bytes) { deallocate_async(ptr, bytes, stream_type{}); }

  /// Marks `ptr` as used on `stream` as well as on the stream it is freed on: its memory is not
  /// reused until the work queued on `stream` up to its free has completed (PyTorch's
  /// `record_stream`). Does not synchronize.
  /// @throws gpukit::logic_error for a pointer not currently allocated by this allocator
  void record_stream(void* ptr, stream_type stream);

  /// Tells the allocator that `stream` is about to be destroyed: waits for the work queued on it so
  /// far, then makes its free blocks usable on every stream. Call it before `stream_destroy` on
  /// any stream this allocator has served (the allocator may otherwise record events on, or free
  /// segments in the order of, that stream later), from the thread that freed blocks on it last
  /// (other threads' cached blocks for it return to the pool at their next call). Synchronizes
  /// with `stream`. Called after the stream was destroyed, it synchronizes the device instead.
  /// @throws gpukit::logic_error naming the stream while it is being captured into a CUDA graph
  ///         (waiting for it would invalidate the capture); nothing changes then
  void forget_stream(stream_type stream);

  /// Registers a callback for the out-of-memory ladder (step 2), after those registered before.
  /// Callbacks run without the allocator's lock, so they may free memory through it.
  /// @throws gpukit::logic_error for an empty callback
  void add_oom_callback(oom_callback callback);

  /// Identifies the private pool of one CUDA graph capture.
  using capture_id = std::uint64_t;

  /// Call when a CUDA graph capture begins on `stream` (right after cudaStreamBeginCapture, before
  /// allocating on it). Until end_capture, allocations on `stream` come from a private pool: its
  /// segments come from `malloc` in relaxed capture mode (legal during capture, outside the
  /// graph), and blocks freed on `stream` meanwhile are kept in that pool, so no block the graph
  /// uses is handed to other work while the graph can replay. Streams joined to the same capture
  /// (side streams that waited on an event recorded in it, told apart by the runtime's
  /// stream_capture_id) allocate and free through the same pool. While any capture is under way,
  /// the allocator makes no event query or synchronization (illegal in global capture mode),
  /// skips its per-thread caches, never calls on a capturing stream what would invalidate the
  /// capture (asking its device, querying or synchronizing it), and keeps blocks freed with uses
  /// on other streams (record_stream) until the capture has ended. Returns the pool's id, for
  /// release_capture_pool.
  /// @throws gpukit::logic_error if a capture is already under way on `stream`
  capture_id begin_capture(stream_type stream);
  /// begin_capture into the ended pool `id` instead of a new one: its free blocks serve this
  /// capture too (graphs that share a pool, replayed in capture order, as PyTorch allows).
  /// @throws gpukit::logic_error for an unknown id, a pool under way, or a capture on `stream`
  void resume_capture(stream_type stream, capture_id id);
  /// Call when the capture on `stream` ends (after cudaStreamEndCapture). The pool stays private.
  /// @throws gpukit::logic_error if no capture is under way on `stream`
  void end_capture(stream_type stream);
  /// Call before a CUDA graph capture begins on streams the allocator is not told of yet (PyTorch
  /// registers a private pool before cudaStreamBeginCapture, and learns the capture's streams at
  /// their first allocation). Until the matching end_capture_window the allocator behaves as while
  /// a capture is under way (no event query or synchronization, which a capture in global mode
  /// refuses from any thread; no per-thread caches), so that no allocation or free elsewhere
  /// invalidates the capture before begin_capture is called for its streams. Windows nest.
  void begin_capture_window();
  /// Ends a window begun by begin_capture_window.
  /// @throws gpukit::logic_error without a window open
  void end_capture_window();
  /// Gives the pool of capture `id` back to everyone: call once the graph is destroyed and its
  /// launches have completed. Blocks still allocated from it become ordinary blocks.
  /// @throws gpukit::logic_error for an unknown id or a capture that has not ended
  void release_capture_pool(capture_id id);

  /// Returns every fully free segment to the runtime, after returning the calling thread's cached
  /// blocks to the pool (other threads return theirs at their next call). Stream-ordered segments
  /// are freed on the stream that last used them, so this waits on no other work; synchronous
  /// segments go through `free`, which may synchronize the device. Returns the bytes released.
  /// An allocation that finds no memory waits for these frees before reporting out of memory.
  /// During a graph capture, segments of capturing streams and synchronous segments stay; so do
  /// the segments of a stream being captured without begin_capture (asked of the stream: a free
  /// there would join the graph). Debug mode's quarantine is given back first.
  std::size_t release();

  /// Returns fully free segments until at most `target_reserved_bytes` are reserved (largest
  /// first). Returns the bytes released.
  std::size_t trim(std::size_t target_reserved_bytes);

  // The CCCL memory-resource interface: a stream-ordered, device-accessible resource
  // (detail::is_device_async_resource_v; cuda::mr::async_resource_with<R, device_accessible> in
  // CCCL 3.0, cuda::mr::resource_with<R, device_accessible> from CCCL 3.1 on, which names the
  // members differently). detail::cccl_entry_points writes both sets from allocate_async and
  // deallocate_async: allocate / deallocate(bytes, align), allocate_async /
  // deallocate_async(bytes, align, stream_ref), allocate_sync / deallocate_sync(bytes, align) and
  // allocate / deallocate(stream_ref, bytes, align). `align` may be any power of two up to 256
  // (else gpukit::logic_error).
  friend detail::cccl_entry_points<basic_caching_allocator>;  // check_alignment
  using detail::cccl_entry_points<basic_caching_allocator>::allocate;
  using detail::cccl_entry_points<basic_caching_allocator>::allocate_async;
  using detail::cccl_entry_points<basic_caching_allocator>::deallocate;
  using detail::cccl_entry_points<basic_caching_allocator>::deallocate_async;
  /// The memory is device accessible (for CCCL's property queries).
  friend void get_property(basic_caching_allocator const&, detail::cccl_device_accessible) noexcept
  {}

  /// Starts recording allocator events (alloc, free, segment alloc and free, out-of-memory) into a
  /// ring of `events_per_thread` per thread (and one for segment events), clearing earlier ones.
  /// Costs a clock read and an uncontended lock per event while on; a relaxed load when off.
  /// @throws gpukit::logic_error when events_per_thread is 0
  void start_recording(std::size_t events_per_thread = std::size_t{1} << 16);
  /// Stops recording; what was recorded stays for snapshot().
  void stop_recording();
  /// The segments and blocks now, and the events recorded (see memory_history.hpp for exports).
  /// Takes the pool lock; does not synchronize.
  [[nodiscard]] memory_snapshot snapshot() const;

  /// Statistics, summed over threads when read. Current values are exact whenever no operation
  /// is in flight. Peaks: while one thread uses the allocator, every peak is exact (its own
  /// counters, at no cost). From the second thread on, peaks are batched, as Linux's percpu
  /// counters: each thread folds what it allocated and freed into shared counters only when its
  /// unfolded part leaves [0, batch] (8 MiB of bytes and of requested bytes, 128 blocks, per pool
  /// kind; detail::shared_counts), so threads allocating at once rarely touch a shared cache
  /// line. A peak is then never above the true one, and at most threads x batch below it per pool
  /// kind (both kinds: twice that), where threads are those holding an unfolded part (a thread
  /// that exits folds its own); a read raises each peak to the current value it reads, so a read
  /// at the high-water mark (nothing in flight) pins it exactly. reset_peak sets every peak to
  /// its current value, as before. Active peaks (frees waiting on other streams still count) keep
  /// the same bound: such a free is folded at once.
  /// Takes the pool lock; does not synchronize.
  [[nodiscard]] caching_allocator_stats stats() const;
  /// Blocks (and their bytes) of one pool kind that their users freed and that wait for other
  /// streams' work: active, no longer allocated.
  struct pending_frees {
    std::int64_t bytes{0};
    std::int64_t blocks{0};
  };
  /// The pending frees of pool kind `large ? large_pool : small_pool`: what stats() adds to the
  /// allocated counts to make the active ones, read without the lock (relaxed loads), so that a
  /// layer that keeps allocated counts of its own can follow active peaks as it allocates.
  [[nodiscard]] pending_frees pending_frees_of(bool large) const noexcept
  {
    if (pending_.blocks.load(std::memory_order_relaxed) == 0) { return {}; }
    std::size_t const k = large ? 1 : 0;
    return {pending_.bytes[k].load(std::memory_order_relaxed),
            pending_.count[k].load(std::memory_order_relaxed)};
  }
  /// Resets every peak to its current value.
  void reset_peak();

  /// Limit in bytes (0 when none); changing it does not release memory by itself.
  [[nodiscard]] std::size_t limit() const noexcept
  {
    return limit_.load(std::memory_order_relaxed);
  }
  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] Runtime& runtime() const noexcept { return runtime_; }
  [[nodiscard]] caching_allocator_options const& options() const noexcept { return options_; }
  /// Whether this allocator still exists, readable after it is gone: what gpukit's RAII types
  /// (owning streams, buffers) keep instead of trusting their reference to it, so that they may
  /// be destroyed after it (see "Destruction order" below). Not public API. Never throws.
  [[nodiscard]] detail::lifetime_token lifetime() const noexcept { return lifetime_.token(); }
  /// Where segments come from in fact: `options().source` with `automatic` resolved (and debug
  /// mode's sanitizer segments, which are synchronous). Takes no lock: the constructors choose
  /// the source, which is only read afterwards.
  [[nodiscard]] segment_source segment_source_in_use() const noexcept
    GPUKIT_NO_THREAD_SAFETY_ANALYSIS
  {
    segment_source const fixed = segments_.source();
    if (fixed == segment_source::upstream) { return fixed; }
    return growable_ ? segment_source::growable : fixed;
  }
  /// Debug mode: freed blocks waiting in the quarantine (0 when debug mode is off).
  [[nodiscard]] std::size_t debug_quarantined_blocks() const
  {
    return debug_ == nullptr ? 0 : debug_->blocks();
  }

  /// Where a block handed out by this allocator lives: what gpukit/memory/ipc.hpp needs to export
  /// it to another process.
  struct block_extent {
    void* segment_base{nullptr};   ///< the segment (growable: its reserved range)
    std::size_t segment_bytes{0};  ///< the segment's size
    std::size_t offset{0};         ///< the block's start from segment_base
    std::size_t bytes{0};          ///< the block's size (a multiple of 256, at least requested)
    bool stream_ordered{false};    ///< from malloc_async (not exportable with CUDA IPC handles)
    bool growable{false};          ///< a growable segment: the pages below hold the block
    std::size_t page_bytes{0};     ///< growable: the segment's page
    std::size_t first_page{0};     ///< growable: the page holding the block's first byte
    std::vector<physical_handle> pages;  ///< growable: the physical pages holding the block
  };
  /// The extent of `ptr`, a block this allocator has handed out and not taken back (its start).
  /// Takes the pool lock; does not call the runtime. The pages stay the allocator's: they hold the
  /// block only while it stays allocated.
  /// @throws gpukit::logic_error for any other pointer
  [[nodiscard]] block_extent extent(void const* ptr) const;

  /// One physical page of a growable segment, exported as a POSIX file descriptor.
  struct shared_page {
    int fd{-1};  ///< the allocator's descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    std::size_t bytes{0};  ///< the page's size
  };
  /// The pages holding a block of a growable segment, as another process maps them.
  struct shared_pages {
    std::size_t offset{0};           ///< the block's start from the first page's
    std::size_t bytes{0};            ///< the block's size
    std::vector<shared_page> pages;  ///< the pages in address order, first to last
  };
  /// The pages holding `ptr`, a block of a growable segment this allocator has handed out (its
  /// start), each exported as a POSIX file descriptor (cuMemExportToShareableHandle). A page is
  /// exported once: later calls return the same descriptor, which the allocator keeps open until
  /// the page is unmapped or the allocator destroyed. The descriptors are the allocator's: do not
  /// close them (duplicate one to keep it); they stay valid while the block stays allocated.
  /// Takes the pool lock; does not synchronize.
  /// @throws gpukit::logic_error for any other pointer, a block of another segment source, or an
  ///         allocator without growable_shareable (its pages cannot be exported)
  /// @throws gpukit::cuda_error when the runtime refuses an export
  [[nodiscard]] shared_pages share_pages(void const* ptr);

  /// Grants device `peer_device` read-write access to the pages of this allocator's growable
  /// segments (cuMemSetAccess): those mapped now and every page mapped later, as PyTorch's
  /// enablePeerAccess needs (cudaDeviceEnablePeerAccess covers cudaMalloc memory, not virtual
  /// memory). Granting the allocator's own device, or a peer granted before, does nothing.
  /// Takes the pool lock; does not synchronize.
  /// @throws gpukit::logic_error for a device ordinal below 0 or above 63
  /// @throws gpukit::cuda_error when the runtime refuses access (nothing granted by this call is
  ///         taken back; the peer is not remembered, so a later call tries again)
  void grant_access(int peer_device);
  /// The devices grant_access has granted, in the order granted.
  [[nodiscard]] std::vector<int> peers() const;

  /// Two allocators are equal when they are the same object (memory from one cannot be freed
  /// through another).
  friend bool operator==(basic_caching_allocator const& a,
                         basic_caching_allocator const& b) noexcept
  {
    return &a == &b;
  }
  friend bool operator!=(basic_caching_allocator const& a,
                         basic_caching_allocator const& b) noexcept
  {
    return &a != &b;
  }

 private:
  template <class R>
  friend struct detail::allocator_invariants;  // detail/allocator_invariants.hpp, for tests

  using block         = detail::caching_block<Runtime>;
  using thread_cache  = detail::caching_thread_cache<Runtime>;
  using front_type    = detail::caching::thread_cache_front<Runtime>;
  using capture_pool  = typename detail::caching::capture_pools<Runtime, block>::pool;
  using segment       = detail::caching::segment<Runtime>;
  using stats_type    = detail::caching::allocator_stats<block>;
  using segments_type = detail::caching::segment_source<Runtime, block>;
  using recorder_type = detail::caching::event_recorder<Runtime>;
  using stream_pool   = typename detail::caching::stream_pools<Runtime, block>::stream_pool;
  using pending_free  = typename detail::caching::stream_pools<Runtime, block>::pending_free;
  enum pool_kind : int { small_pool = 0, large_pool = 1 };

  static caching_allocator_options upstream_checked(caching_allocator_options o)
  {
    GPUKIT_EXPECTS(o.source == segment_source::automatic,
                   std::string{"caching_allocator: segments come from the upstream resource; "
                               "options.source must be automatic, not "} +
                     to_string(o.source));
    GPUKIT_EXPECTS(!o.debug.guard_pages,
                   "caching_allocator: guard pages need growable segments, not an upstream "
                   "resource's");
    o.source = segment_source::synchronous;  // no runtime pool is set up; the upstream decides
    return o;
  }
  static void check_alignment(std::size_t align)
  {
    detail::check_alignment("caching_allocator", align, alignment);
  }
  int kind_for(std::size_t size) const noexcept
  {
    return size <= options_.small_request_bytes ? small_pool : large_pool;
  }
  void annotate_alloc(block const* b, std::size_t bytes) const noexcept
  {
    if (options_.nvtx_annotate) {
      register_memory_region(segments_type::heap_of(b), b->data(), bytes);
    }
  }

  // Allocation and deallocation (detail/caching_allocator_impl.hpp).
  void* allocate_slow(std::size_t bytes, std::size_t size, stream_type stream, thread_cache& tc)
    GPUKIT_EXCLUDES(mutex_);
  block* find_reusable(std::size_t size, int kind, stream_type stream, thread_cache& tc,
                       bool capture) GPUKIT_REQUIRES(mutex_);
  block* find_free_or_migrate(std::size_t size, int kind, stream_type stream, bool capture)
    GPUKIT_REQUIRES(mutex_);
  block* new_memory(std::size_t bytes, std::size_t size, int kind, stream_type stream,
                    thread_cache& tc, bool capture) GPUKIT_REQUIRES(mutex_);
  void* hand_out(thread_cache& tc, block* b, std::size_t bytes, stream_type stream);
  void deallocate_impl(void* ptr, std::size_t bytes, bool check_size, stream_type stream)
    GPUKIT_EXCLUDES(mutex_);
  bool free_stream_dead(thread_cache& tc, stream_type stream) GPUKIT_EXCLUDES(mutex_);
  void return_to_pool(thread_cache& tc, block* b, stream_type stream) GPUKIT_EXCLUDES(mutex_);
  block* claim_own(thread_cache& tc, std::uintptr_t key, std::size_t bytes, bool check_size);
  block* claim_foreign(void* ptr, std::size_t bytes, bool check_size, void*& owner)
    GPUKIT_EXCLUDES(mutex_);
  void count_free(thread_cache& tc, block* b, void* ptr, stream_type stream, bool pending = false);
  void defer_free(thread_cache& tc, block* b, void* ptr, stream_type stream, void* owner)
    GPUKIT_EXCLUDES(mutex_);
  void park_pending(thread_cache& tc, block* b, void* ptr, pending_free&& pf)
    GPUKIT_REQUIRES(mutex_);
  void validate_options() const;
  void teardown() noexcept GPUKIT_EXCLUDES(mutex_);
  struct teardown_calls;

  // Debug mode (detail/caching/quarantine.hpp, detail/caching/guard_page_source.hpp): the
  // lock protocol of a free in debug mode, which joins the two layers to the pool.
  using debug_quarantine = detail::caching::quarantine<Runtime, block>;
  using guard_source     = detail::caching::guard_page_source<Runtime, block>;
  // Out of line, so that deallocate_impl, which calls it when debug mode is on, keeps its shape.
  __attribute__((noinline)) bool debug_free(void* ptr, std::size_t bytes, bool check_size,
                                            stream_type stream) GPUKIT_EXCLUDES(mutex_);
  void guard_free(void* ptr, std::size_t bytes, bool check_size, stream_type stream)
    GPUKIT_EXCLUDES(mutex_);
  // What the thread caches' front (detail/caching/thread_cache_front.hpp) asks of the pool, built
  // at each call (detail/caching_allocator_impl.hpp).
  struct front_operations;
  // The pool: free indices, splitting and coalescing (detail/caching_allocator_impl.hpp; segments:
  // detail/caching/segment_source.hpp and growable_source.hpp).
  block* find_free(std::size_t size, int kind, stream_type stream) GPUKIT_REQUIRES(mutex_);
  block* take(block* b, std::size_t size, std::size_t bytes, stream_type stream)
    GPUKIT_REQUIRES(mutex_);
  // The index free block b belongs in: its capture's pool, the global pool, or its stream's pool.
  detail::tlsf_index<block>& index_for(block const* b) GPUKIT_REQUIRES(mutex_);
  block* insert_free(block* b) GPUKIT_REQUIRES(mutex_);
  void unindex(block* b) GPUKIT_REQUIRES(mutex_) { index_for(b).remove(b); }
  void free_to_pool(block* b, stream_type stream) GPUKIT_REQUIRES(mutex_);
  // Streams (the layer: detail/caching/stream_pools.hpp): frees on a stream this thread has not
  // used yet, and on a destroyed one (detail/caching_allocator_impl.hpp).
  bool check_free_stream(thread_cache& tc, stream_type stream) GPUKIT_EXCLUDES(mutex_);
  void free_on_dead_stream(thread_cache& tc, block* b, void* ptr, stream_type stream)
    GPUKIT_EXCLUDES(mutex_);
  // What the stream pools' layer asks of the pool around it, built at each call under the lock
  // (detail/caching_allocator_impl.hpp).
  struct stream_operations;
  // The out-of-memory ladder (detail/caching/oom_ladder.hpp) and what it asks of the pool.
  using oom_ladder = detail::caching::oom_ladder<Runtime, block, oom_callback>;
  struct oom_operations;  // detail/caching_allocator_operations_impl.hpp
  // Graph capture (detail/caching_allocator_impl.hpp).
  // The capture pool `stream` allocates from (detail/caching/capture_pools.hpp), or nullptr.
  capture_pool* capture_for(stream_type stream, bool guess_on_error = false) GPUKIT_REQUIRES(mutex_)
  {
    return capture_.find_for(
      runtime_, stream, captures_underway_.load(std::memory_order_relaxed) != 0, guess_on_error);
  }
  void* allocate_captured(std::size_t bytes, std::size_t size, int kind, capture_pool& cp,
                          stream_type stream, thread_cache& tc) GPUKIT_REQUIRES(mutex_);
  // What the segments' layers (detail/caching/segment_source.hpp, growable_source.hpp) ask of
  // the pool around them, built at each call under the lock (detail/caching_allocator_impl.hpp).
  struct segment_pool;

  // The state, grouped by what it serves. Everything but the atomics is guarded by mutex_, which
  // clang's -Wthread-safety checks (GPUKIT_GUARDED_BY, and GPUKIT_REQUIRES on the functions that
  // need it held; tests/headers builds with it as an error).

  Runtime& runtime_;
  int device_;
  caching_allocator_options options_;
  std::size_t device_total_{0};
  bool growable_{false};
  std::atomic<std::size_t> limit_{0};

  mutable detail::annotated_mutex mutex_;  // the pool lock: guards everything below
  // Every block by address, the free blocks usable on any stream, the descriptors.
  detail::caching::block_index<block> blocks_ GPUKIT_GUARDED_BY(mutex_);
  guard_source guards_ GPUKIT_GUARDED_BY(mutex_){device_, blocks_};  // debug mode's guard pages
  // Fixed segments: their source (chosen by the constructors), the bytes reserved (growable pages
  // included), taking and giving back (detail/caching/segment_source.hpp).
  segments_type segments_ GPUKIT_GUARDED_BY(mutex_){runtime_, device_, options_};
  // Growable segments: their pages, spare pages and peers (detail/caching/growable_source.hpp).
  detail::caching::growable_source<Runtime, block> pages_ GPUKIT_GUARDED_BY(mutex_);
  // Streams: their free blocks, pending frees, events, checked and forgotten streams
  // (detail/caching/stream_pools.hpp).
  detail::caching::stream_pools<Runtime, block> streams_ GPUKIT_GUARDED_BY(mutex_);
  // The thread caches and the allocator's registration (detail/caching/thread_cache_front.hpp),
  // in front of the pool: not guarded as a whole, since a thread's hit in its own cache (local(),
  // push(), the cache's pop) takes no lock by design. Its list of caches is touched only under
  // mutex_: by local_slow and a thread's exit through front_operations::locked, else by
  // functions that hold it (caches(), request_flush_except, drain).
  front_type threads_;
  oom_ladder oom_ GPUKIT_GUARDED_BY(mutex_);  // callbacks, the last recovery, its waiters
  detail::caching::capture_pools<Runtime, block> capture_ GPUKIT_GUARDED_BY(mutex_);
  // Captures and windows under way: read on the fast path without the lock, written under it.
  std::atomic<int> captures_underway_{0};
  // Debug mode's quarantine (null when off; its own lock, taken before mutex_).
  std::unique_ptr<debug_quarantine> debug_;
  // Whether recording is on and the events per ring: read on the fast path (record() into a
  // thread's own ring), written under the lock (stop_recording: anywhere).
  detail::caching::recording_switch recording_;
  recorder_type recorder_ GPUKIT_GUARDED_BY(mutex_){recording_};  // the pool's events
  detail::pending_counts pending_;  // frees waiting on other streams (still active)
  detail::shared_counts shared_;    // peaks once two threads are in, batched per thread
  // Pool-level counters and peaks (stats() updates them: mutable).
  mutable stats_type stats_ GPUKIT_GUARDED_BY(mutex_){shared_, pending_};
  // Expired first thing in the destructor (before teardown): an owning stream that is destroyed
  // later then skips this allocator, and one being destroyed now is waited for.
  detail::lifetime_registration lifetime_;
};

/// The caching allocator over the CUDA runtime.
using caching_allocator = basic_caching_allocator<cuda_runtime>;

#if defined(__GNUC__)
#define GPUKIT_EXPORT __attribute__((visibility("default")))
#else
#define GPUKIT_EXPORT
#endif

namespace detail {

/// The process-wide registry of default allocators: (key, device) -> allocator. A non-template
/// exported inline function, so its static local is a GNU unique symbol of default visibility,
/// bound once per process even across shared libraries built with -fvisibility=hidden and loaded
/// with RTLD_LOCAL (the key names the Runtime and gpukit's version, so that the entries of
/// different instantiations never mix).
GPUKIT_EXPORT inline void* default_allocator_registry(char const* key, int device,
                                                      void* (*make)(int))
{
  static auto* mutex  = new std::mutex{};
  static auto* items  = new std::vector<std::pair<std::string, void*>>{};
  std::string const k = std::string{key} + "#" + std::to_string(device);
  std::lock_guard<std::mutex> lock{*mutex};
  for (auto const& [name, ptr] : *items) {
    if (name == k) { return ptr; }
  }
  void* p = make(device);
  items->emplace_back(k, p);
  return p;
}

}  // namespace detail

/// The process-wide caching allocator of `device` (default: the calling thread's current device)
/// over `Runtime::instance()`, created on first use and never destroyed. Its options are those of
/// the environment variable GPUKIT_ALLOC_CONF when it is set (`key:value` pairs, as
/// PYTORCH_CUDA_ALLOC_CONF: see gpukit/memory/alloc_conf.hpp), read when the device's allocator is
/// created; else the defaults.
///
/// There is one per device and Runtime in the whole process, also when several shared libraries
/// (built with -fvisibility=hidden, loaded with RTLD_LOCAL) each include gpukit: see
/// detail::default_allocator_registry. An executable that includes gpukit shares it with the
/// libraries it loads when it exports its symbols (-rdynamic, CMake's ENABLE_EXPORTS).
/// Thread-safe; the first call per device takes a lock, later ones read an atomic pointer.
/// @throws gpukit::logic_error for a device that does not exist, or when GPUKIT_ALLOC_CONF does not
///         parse (the message names the key and the value; no allocator is created, so every use
///         throws until the variable is fixed)
template <class Runtime = cuda_runtime>
basic_caching_allocator<Runtime>& default_caching_allocator(int device = -1)
{
  constexpr int max_devices = 64;
  static std::atomic<basic_caching_allocator<Runtime>*> cache[max_devices]{};  // this copy's view
  if (device < 0) { GPUKIT_CUDA_TRY(Runtime::instance().get_device(device)); }
  GPUKIT_EXPECTS(device < max_devices, "default_caching_allocator: device " +
                                         std::to_string(device) + " is out of range");
  if (auto* a = cache[device].load(std::memory_order_acquire)) { return *a; }
  std::string const key = std::string{"gpukit-" GPUKIT_VERSION_STRING ":"} + typeid(Runtime).name();
  auto* a               = static_cast<basic_caching_allocator<Runtime>*>(
    detail::default_allocator_registry(key.c_str(), device, [](int d) -> void* {
      return new basic_caching_allocator<Runtime>{Runtime::instance(), d,
                                                  detail::default_allocator_options(d)};
    }));
  cache[device].store(a, std::memory_order_release);
  return *a;
}

}  // namespace gpukit

// The bodies (they do not include this header).
#include <gpukit/memory/detail/caching_allocator_impl.hpp>
#include <gpukit/memory/detail/caching_allocator_operations_impl.hpp>

GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_caching_allocator<gpukit::cuda_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(gpukit::basic_caching_allocator<gpukit::cuda_runtime>&
                                gpukit::default_caching_allocator<gpukit::cuda_runtime>(int));
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_caching_allocator<gpukit::sim_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(gpukit::basic_caching_allocator<gpukit::sim_runtime>&
                                gpukit::default_caching_allocator<gpukit::sim_runtime>(int));

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::caching_allocator>,
              "gpukit::caching_allocator must be a CCCL stream-ordered memory resource");
#endif
