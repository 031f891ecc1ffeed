// SPDX-License-Identifier: Apache-2.0
// gpukit/host/pinned_pool.hpp: a caching pool of pinned (page-locked) host buffers.
//
// Quick start:
//
//   #include <gpukit/host/pinned_pool.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   #include <cstring>
//
//   void upload(void* dev, void const* batch, std::size_t batch_bytes, cudaStream_t stream)
//   {
//     gpukit::pinned_pool pool{gpukit::cuda_runtime::instance()};
//     pool.reserve(std::size_t{256} << 20);  // pin 256 MiB once, carve buffers from it
//     {
//       gpukit::pinned_buffer<gpukit::cuda_runtime> buf = pool.acquire(batch_bytes);
//       std::memcpy(buf.data(), batch, batch_bytes);
//       cudaMemcpyAsync(dev, buf.data(), batch_bytes, cudaMemcpyHostToDevice, stream);
//       buf.record_stream(stream);  // reused only after `stream` reaches here
//     }                             // back in the pool: no cudaFreeHost, no sync
//
//     void* p = pool.allocate(batch_bytes);  // the raw form
//     pool.deallocate_async(p, stream);      // one pooled event, recorded on `stream`
//     auto s = pool.stats();                 // allocated/reserved/cached, hits, pins, ...
//     (void)s;
//
//     // The same pool on a simulated GPU (CI without a GPU):
//     gpukit::sim_runtime sim;
//     gpukit::basic_pinned_pool<gpukit::sim_runtime> sim_pool{sim};
//   }
//
// ## Design
//
// - `cudaHostAlloc` costs 1.2 ms for 64 KiB and 0.67 s for 1 GiB on the H200 host, and
//   `cudaFreeHost` waits for the device: the pool pins memory once and hands it out again and
//   again. Nothing on the allocate/deallocate path frees pinned memory.
// - Size classes: requests round up to one of 8 classes per power of two (at least 4 KiB), so at
//   most 12.5% of a buffer is lost to rounding (PyTorch's pinned allocator rounds to a power of
//   two: a 600 MiB request takes 1 GiB). A class is served from a free buffer of that class, else
//   carved from reserved memory (`reserve`, `add_host_memory`), else pinned anew unless that
//   would pass the limit.
// - Growth pins fast (pinned_growth::map_and_register, the default): one `cudaHostAlloc` pins
//   2-4 GB/s, because one thread faults in and zeroes every 4 KiB page; the pool instead maps
//   ordinary memory 2 MiB aligned with transparent huge pages, faults it in with several threads,
//   then page-locks it with `cudaHostRegister` (about 16.7 GB/s on the H200 host). Such ranges
//   are freed with `cudaHostUnregister` + munmap; `cudaFreeHost`, which waits for the device, is
//   called only for pinned_growth::host_alloc ranges, and only by release_cached and the
//   destructor.
// - Memory tools: with `nvtx_annotate` (on when an NVTX tool is configured) every pinned range is
//   an NVTX memory heap and every buffer handed out a region of the bytes requested.
// - Stream semantics: a buffer returned with the streams that used it (`deallocate_async`,
//   `record_stream`) gets one pooled event recorded per stream, and is handed out again only once
//   those events have completed (checked with event_query when its class runs dry: never a wait,
//   never a device-wide sync). A buffer returned without streams is reusable at once.
// - Several GPUs: one pool serves every device. Memory is pinned portable by default
//   (host_alloc_flags::portable, host_register_flags::portable), so a buffer is pinned for every
//   device, not only the one current when it was pinned; the streams given back with a buffer may
//   belong to any device: each event is created on its stream's device (events are kept per
//   device), whatever device is current.
// - One mutex guards the pool; every member is thread-safe.
#pragma once

#include <gpukit/detail/alignment_check.hpp>
#include <gpukit/detail/cccl_compat.hpp>  // <cuda/memory_resource>, whichever CCCL
#include <gpukit/detail/lifetime.hpp>
#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/detail/compiled_runtimes.hpp>
#include <gpukit/runtime/runtime.hpp>
#include <gpukit/stats.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpukit {

/// How a pinned pool pins memory when it grows (allocate with nothing cached, reserve, prewarm).
enum class pinned_growth {
  /// Ordinary memory mapped 2 MiB aligned with transparent huge pages (mmap,
  /// madvise(MADV_HUGEPAGE)), faulted in by `pin_threads` threads at once, then page-locked with
  /// host_register (cudaHostRegister). Freed with host_unregister and munmap: never host_free.
  /// The H200 host pinned this way at about 16.7 GB/s.
  map_and_register,
  /// One host_alloc (cudaHostAlloc) per range: 2-4 GB/s, the kernel faulting and zeroing 4 KiB
  /// pages with one thread. Freed with host_free, which may wait for the device.
  host_alloc,
};

/// Settings of a pinned pool.
struct pinned_pool_options {
  /// Most bytes the pool may hold pinned (host_alloc plus registered memory); 0: no limit.
  std::size_t limit_bytes{0};
  /// How the pool pins memory when it grows.
  pinned_growth growth{pinned_growth::map_and_register};
  /// Threads that fault in a range grown by map_and_register (the calling thread included; ranges
  /// under 16 MiB per thread use fewer). 0: min(8, hardware threads).
  int pin_threads{0};
  /// Advise transparent huge pages (2 MiB) for ranges grown by map_and_register.
  bool huge_pages{true};
  /// Flags of every host_alloc (host_alloc_flags); portable: usable with every device.
  unsigned alloc_flags{host_alloc_flags::portable};
  /// Flags of every host_register (host_register_flags): add_host_memory and map_and_register.
  unsigned register_flags{host_register_flags::portable};
  /// Describe the pool's ranges and buffers to NVTX's memory API (nvToolsExtMem.h): each pinned
  /// range is a sub-allocator heap, each buffer handed out a region of the bytes requested, so
  /// that tools (compute-sanitizer `--nvtx yes`) see an access past a buffer inside its range.
  /// On by default when an NVTX tool is configured (NVTX_INJECTION64_PATH is set), as for the
  /// caching allocator. Compiled out with GPUKIT_DISABLE_NVTX.
  bool nvtx_annotate{nvtx_tool_configured()};
};

/// Statistics of a pinned pool (PyTorch's `torch.cuda.host_memory_stats` vocabulary).
struct pinned_pool_stats {
  stat_pair allocated_bytes;              ///< bytes of buffers handed out (class sizes)
  stat_pair requested_bytes;              ///< bytes users asked for
  stat_pair reserved_bytes;               ///< bytes pinned by the pool (host_alloc + registered)
  stat_pair cached_bytes;                 ///< bytes of free buffers, ready or waiting on streams
  stat_pair allocation_count;             ///< buffers handed out
  stat_pair segment_count;                ///< host_alloc or registered ranges held
  std::int64_t pending_bytes{0};          ///< returned buffers whose streams' work is pending
  std::uint64_t num_allocs{0};            ///< allocate calls that succeeded
  std::uint64_t num_frees{0};             ///< buffers returned
  std::uint64_t num_cache_hits{0};        ///< allocations served by a free buffer of the class
  std::uint64_t num_growths{0};           ///< ranges the pool pinned itself (either pinned_growth)
  std::uint64_t num_host_allocs{0};       ///< host_alloc calls (cudaHostAlloc)
  std::uint64_t num_host_frees{0};        ///< host_free calls (cudaFreeHost: release_cached only)
  std::uint64_t num_host_registers{0};    ///< host_register calls (growth and add_host_memory)
  std::uint64_t num_host_unregisters{0};  ///< host_unregister calls (release_cached only)
  std::uint64_t num_events_recorded{0};   ///< events recorded on return (one per stream)
  /// Streams found destroyed when a buffer used on them came back: each cost one synchronization
  /// of its device instead of an event, and was dropped from the buffer's streams.
  std::uint64_t num_dead_streams{0};
  std::uint64_t num_limit_refusals{0};  ///< allocations refused by the limit
};

template <class Runtime>
class basic_pinned_pool;

/// A pinned buffer from a pinned pool, returned to it on destruction (RAII). Move-only.
/// The pool may be destroyed first, whatever the declaration order: its destructor frees every
/// pinned range, and the buffer's destructor (or reset) then returns nothing; data() names freed
/// memory from then on and record_stream throws gpukit::logic_error.
template <class Runtime>
class pinned_buffer final {
 public:
  using stream_type = typename Runtime::stream_type;

  pinned_buffer() noexcept = default;
  pinned_buffer(basic_pinned_pool<Runtime>& pool, void* ptr, std::size_t bytes) noexcept
      : pool_{&pool}, pool_life_{pool.lifetime()}, ptr_{ptr}, bytes_{bytes}
  {}
  /// Returns the buffer to its pool, to be reused once the work of every stream given to
  /// record_stream has completed (a destroyed stream among them costs a device synchronization).
  /// Never throws: an error is written to stderr and the buffer stays handed out.
  ~pinned_buffer() { reset(); }
  pinned_buffer(pinned_buffer const&)            = delete;
  pinned_buffer& operator=(pinned_buffer const&) = delete;
  pinned_buffer(pinned_buffer&& other) noexcept
      : pool_{std::exchange(other.pool_, nullptr)}, pool_life_{std::exchange(other.pool_life_, {})},
        ptr_{std::exchange(other.ptr_, nullptr)}, bytes_{std::exchange(other.bytes_, 0)}
  {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept
  {
    if (this != &other) {
      reset();
      pool_      = std::exchange(other.pool_, nullptr);
      pool_life_ = std::exchange(other.pool_life_, {});
      ptr_       = std::exchange(other.ptr_, nullptr);
      bytes_     = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  [[nodiscard]] void* data() const noexcept { return ptr_; }
  /// Bytes requested (the buffer may be larger: its size class).
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] explicit operator bool() const noexcept { return ptr_ != nullptr; }

  /// The buffer is used by work on `stream`: it returns to the pool only after that work.
  /// Does not synchronize. @throws gpukit::logic_error when the buffer is empty or its pool was
  /// destroyed
  void record_stream(stream_type stream);
  /// Returns the buffer now (as the destructor does; nothing when the pool was destroyed first);
  /// the handle becomes empty.
  void reset() noexcept;
  /// Gives up ownership without returning the buffer: the caller must deallocate it.
  [[nodiscard]] void* release() noexcept
  {
    pool_      = nullptr;
    pool_life_ = {};
    bytes_     = 0;
    return std::exchange(ptr_, nullptr);
  }

 private:
  basic_pinned_pool<Runtime>* pool_{nullptr};
  detail::lifetime_token pool_life_;  // pool_'s: whether it may still be called
  void* ptr_{nullptr};
  std::size_t bytes_{0};
};

/// A caching pool of pinned host buffers over a Runtime (see the top of this header).
/// Thread-safe. Not copyable or movable.
template <class Runtime>
class basic_pinned_pool final {
 public:
  using runtime_type = Runtime;
  /// Buffers are returned, and reused, in the order of these streams (never a device sync).
  using stream_type = typename Runtime::stream_type;
  using event_type  = typename Runtime::event_type;  ///< one pooled event per returning stream

  /// Smallest size class, and the alignment of every buffer carved from reserved memory.
  static constexpr std::size_t min_class_bytes = 4096;
  /// Largest request accepted (larger ones are refused as bad_alloc before any rounding).
  static constexpr std::size_t max_request_bytes = std::size_t{1} << 46;

  /// An empty pool: pins nothing until asked. Does not call the runtime.
  /// @throws gpukit::logic_error for a negative pin_threads or an unknown growth
  explicit basic_pinned_pool(Runtime& runtime, pinned_pool_options options = {});
  /// Waits for the events of buffers still pending (event_synchronize on those only), then frees
  /// every pinned range: host_free for host_alloc ones (may synchronize the device),
  /// host_unregister (and munmap for the pool's own mappings) for registered ones. Buffers still
  /// handed out become invalid: their pinned_buffer handles (and a transfer_pipeline's staging
  /// chunks, whose copies the pipeline waits for first) return nothing later. Never throws.
  ~basic_pinned_pool();
  basic_pinned_pool(basic_pinned_pool const&)            = delete;
  basic_pinned_pool& operator=(basic_pinned_pool const&) = delete;
  basic_pinned_pool(basic_pinned_pool&&)                 = delete;
  basic_pinned_pool& operator=(basic_pinned_pool&&)      = delete;

  /// A pinned buffer of at least `bytes` (its size class), aligned to 4 KiB when carved from
  /// reserved memory and to the page when pinned on its own. Does not synchronize; pins memory
  /// (host_alloc, milliseconds for large sizes) only when no free buffer of the class is ready and
  /// no reserved memory is left to carve (see pinned_growth).
  /// @throws gpukit::logic_error when bytes is 0
  /// @throws gpukit::bad_alloc when bytes exceeds max_request_bytes, or pinning it would pass the
  ///         limit (the message names the request, the limit and what is held), or host memory
  ///         cannot be mapped
  /// @throws gpukit::cuda_error when host_alloc or host_register fails; the pool is left unchanged
  [[nodiscard]] void* allocate(std::size_t bytes);
  /// allocate() wrapped in a pinned_buffer that returns it on destruction. Throws as allocate.
  [[nodiscard]] pinned_buffer<Runtime> acquire(std::size_t bytes)
  {
    return pinned_buffer<Runtime>{*this, allocate(bytes), bytes};
  }

  /// Returns `ptr`, reusable at once unless streams were given to record_stream (then as
  /// deallocate_async without a stream of its own). Does not synchronize.
  /// @throws gpukit::logic_error for a pointer this pool did not hand out, or a double return;
  ///         the pool is left unchanged
  void deallocate(void* ptr);
  /// Returns `ptr`, used by work on `stream` (and on the streams given to record_stream): one
  /// pooled event is recorded on each, and the buffer is handed out again only after all have
  /// completed. Does not synchronize.
  /// @throws gpukit::logic_error as deallocate
  /// @throws gpukit::cuda_error when an event cannot be created or recorded; the buffer then stays
  ///         handed out (the pool is unchanged) and may be returned again
  void deallocate_async(void* ptr, stream_type stream);
  /// Marks `ptr` as used by work on `stream` too: its return records an event there.
  /// Does not synchronize. @throws gpukit::logic_error for a pointer not currently handed out
  void record_stream(void* ptr, stream_type stream);

  /// Pins `bytes` more (one range, pinned as options().growth says) to carve buffers from later:
  /// prewarming, so that the first steps of a loop pin nothing. Blocks while pages are pinned;
  /// does not synchronize the device.
  /// @throws gpukit::logic_error when bytes is 0
  /// @throws gpukit::bad_alloc when it would pass the limit, or host memory cannot be mapped
  /// @throws gpukit::cuda_error when host_alloc or host_register fails
  void reserve(std::size_t bytes);
  /// Makes `count` free buffers of the class of `bytes` ready at once (carved from one new pinned
  /// range). Throws as reserve.
  void prewarm(std::size_t bytes, std::size_t count);
  /// Registers the user's memory [ptr, ptr + bytes) (host_register) as a source of buffers. The
  /// memory must stay valid until the pool is destroyed, which unregisters it.
  /// @throws gpukit::logic_error for a null ptr or zero bytes
  /// @throws gpukit::bad_alloc when it would pass the limit
  /// @throws gpukit::cuda_error when host_register fails (e.g. already registered)
  void add_host_memory(void* ptr, std::size_t bytes);

  /// Frees every pinned range whose buffers are all free and ready (host_free for host_alloc
  /// ones, host_unregister and munmap for the pool's mappings, host_unregister for the user's
  /// memory), and returns the bytes released. host_free may synchronize the device: call it
  /// outside hot loops. @throws gpukit::cuda_error when host_free or host_unregister fails
  std::size_t release_cached();

  /// True when [ptr, ptr + bytes) lies in memory this pool pinned or registered (a pinned source:
  /// transfers from it need no staging). Takes the pool lock; never throws.
  [[nodiscard]] bool owns(void const* ptr, std::size_t bytes) const noexcept;
  /// The size class (bytes actually reserved) of a request of `bytes`; 0 for 0.
  [[nodiscard]] static std::size_t class_size(std::size_t bytes) noexcept;

  // The CCCL memory-resource interface: a synchronous resource of host- and device-accessible
  // memory (detail::is_host_device_sync_resource_v; cuda::mr::resource_with<R, host_accessible,
  // device_accessible> in CCCL 3.0, synchronous_resource_with from CCCL 3.1 on, which names the
  // members allocate_sync/deallocate_sync). `align` may be any power of two up to 4 KiB: every
  // buffer is 4 KiB aligned.

  /// allocate(bytes) with an alignment check. @throws gpukit::logic_error for a bad alignment;
  /// otherwise as allocate(bytes)
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t align)
  {
    check_alignment(align);
    return allocate(bytes);
  }
  /// deallocate(ptr) with an alignment check (bytes is not needed). Throws as deallocate(ptr).
  void deallocate(void* ptr, std::size_t /*bytes*/, std::size_t align)
  {
    check_alignment(align);
    deallocate(ptr);
  }
  /// CCCL 3.1's names: allocate(bytes, align).
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t align)
  {
    return allocate(bytes, align);
  }
  /// CCCL 3.1's names: deallocate(ptr, bytes, align).
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t align)
  {
    deallocate(ptr, bytes, align);
  }
  /// Pinned memory is host accessible and device accessible (unified addressing).
  friend void get_property(basic_pinned_pool const&, detail::cccl_host_accessible) noexcept {}
  friend void get_property(basic_pinned_pool const&, detail::cccl_device_accessible) noexcept {}
  /// Two pools are equal when they are the same object.
  friend bool operator==(basic_pinned_pool const& a, basic_pinned_pool const& b) noexcept
  {
    return &a == &b;
  }
  friend bool operator!=(basic_pinned_pool const& a, basic_pinned_pool const& b) noexcept
  {
    return &a != &b;
  }

  /// Statistics (a consistent snapshot).
  [[nodiscard]] pinned_pool_stats stats() const;
  /// Resets every peak to its current value.
  void reset_peak();

  /// The limit in bytes (0: none). Lowering it frees nothing by itself.
  [[nodiscard]] std::size_t limit() const noexcept;
  void set_limit(std::size_t bytes) noexcept;
  [[nodiscard]] Runtime& runtime() const noexcept { return runtime_; }
  [[nodiscard]] pinned_pool_options const& options() const noexcept { return options_; }
  /// Whether this pool still exists, readable after it is gone: what pinned_buffer and
  /// transfer_pipeline keep so that they may be destroyed after it (gpukit/detail/lifetime.hpp).
  /// Not public API. Never throws.
  [[nodiscard]] detail::lifetime_token lifetime() const noexcept { return lifetime_.token(); }

 private:
  enum class segment_kind { allocated, mapped, user };  ///< host_alloc, the pool's mmap, the user's
  struct segment;
  struct block;
  struct pending;

  static void check_alignment(std::size_t align)
  {
    detail::check_alignment("pinned_pool", align, min_class_bytes);
  }
  /// The newest free buffer of class `cls` that may be reused now, taken off the free list; or
  /// nullptr.
  block* take_ready(std::size_t cls) GPUKIT_REQUIRES(mutex_);
  /// A new buffer of class `cls` cut from the free end of a range; nullptr when none has room.
  block* carve(std::size_t cls) GPUKIT_REQUIRES(mutex_);
  segment& add_segment(void* base, std::size_t bytes, segment_kind kind, std::size_t map_bytes)
    GPUKIT_REQUIRES(mutex_);
  /// A member that grows the pool, as its errors name it. String literals: cuda_error keeps the
  /// failed call's text as a pointer, which must outlive the exception.
  struct growth_call {
    char const* name;           ///< in bad_alloc messages: "allocate"
    char const* host_alloc;     ///< the failed call: "host_alloc (pinned_pool::allocate)"
    char const* host_register;  ///< the failed call: "host_register (pinned_pool::allocate)"
  };
  /// Pins a new range of `bytes` for a request of `request` bytes; mutex_ is released while the
  /// memory is mapped and pinned.
  segment& grow(std::size_t bytes, std::size_t request, growth_call call) GPUKIT_REQUIRES(mutex_);
  typename Runtime::error_type free_segment(segment& s) noexcept;
  /// Takes out of the pool every range none of whose buffers is handed out or pending, with its
  /// free buffers, for release_cached to give back off the lock.
  std::vector<std::unique_ptr<segment>> take_unused_segments() GPUKIT_REQUIRES(mutex_);
  /// Moves the returned buffers whose events have completed (of class `cls`, or `all`) to the free
  /// lists.
  void poll_pending(std::size_t cls, bool all) GPUKIT_REQUIRES(mutex_);
  /// The handed-out buffer at `ptr`; throws, naming `call`, for any other pointer.
  block& find_handed_out(void* ptr, char const* call) GPUKIT_REQUIRES(mutex_);
  void check_limit(std::size_t more, std::size_t request, char const* call) GPUKIT_REQUIRES(mutex_);
  struct used_stream {  ///< a stream that used a buffer, and its device (asked off the lock)
    stream_type stream{};
    int device{0};
    bool operator==(used_stream const& o) const { return stream == o.stream; }
  };
  used_stream used_by(stream_type stream) GPUKIT_EXCLUDES(mutex_);
  /// Takes back a handed-out buffer: free at once, or pending on the events of the streams that
  /// used it (`stream` added to them).
  void take_back(block& b, used_stream const* stream) GPUKIT_REQUIRES(mutex_);
  struct device_event {  ///< an event and the device it belongs to (events record on its streams)
    int device{0};
    event_type event{};
  };
  device_event take_event(int device) GPUKIT_REQUIRES(mutex_);
  std::vector<device_event> record_events(std::vector<used_stream>& streams)
    GPUKIT_REQUIRES(mutex_);
  void hand_out(block& b, std::size_t bytes, bool hit) GPUKIT_REQUIRES(mutex_);
  static void bump(stat_pair& s, std::int64_t delta) noexcept;

  Runtime& runtime_;
  pinned_pool_options options_;  // not guarded: only limit_bytes changes later, under mutex_
  // The pool's tables, guarded by mutex_ (clang's -Wthread-safety checks it: GPUKIT_GUARDED_BY,
  // and GPUKIT_REQUIRES on the members above that need it held).
  mutable detail::annotated_mutex mutex_;
  std::vector<std::unique_ptr<segment>> segments_ GPUKIT_GUARDED_BY(mutex_);
  /// Every carved buffer.
  std::unordered_map<void*, std::unique_ptr<block>> blocks_ GPUKIT_GUARDED_BY(mutex_);
  /// Class -> free buffers, reusable now (LIFO).
  std::map<std::size_t, std::vector<block*>> ready_ GPUKIT_GUARDED_BY(mutex_);
  std::vector<pending> pending_ GPUKIT_GUARDED_BY(mutex_);  ///< returned, waiting on events
  /// Events of every device the pool's buffers were used on.
  std::vector<device_event> spare_events_ GPUKIT_GUARDED_BY(mutex_);
  std::size_t reserved_ GPUKIT_GUARDED_BY(mutex_){0};
  mutable pinned_pool_stats stats_ GPUKIT_GUARDED_BY(mutex_){};
  // Expired first thing in the destructor: pinned buffers destroyed later return nothing, and a
  // pipeline's on_expire callback waits for the copies from its chunks before they are freed.
  detail::lifetime_registration lifetime_;
};

/// The pinned pool over the CUDA runtime.
using pinned_pool = basic_pinned_pool<cuda_runtime>;

}  // namespace gpukit

#include <gpukit/host/detail/pinned_pool_impl.hpp>

GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::pinned_buffer<gpukit::cuda_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_pinned_pool<gpukit::cuda_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::pinned_buffer<gpukit::sim_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_pinned_pool<gpukit::sim_runtime>);

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(gpukit::detail::is_host_device_sync_resource_v<gpukit::pinned_pool>,
              "gpukit::pinned_pool must be a CCCL memory resource");
#endif
