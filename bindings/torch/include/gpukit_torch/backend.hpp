// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/backend.hpp: what PyTorch's allocator interface asks, answered by gpukit.
//
// PyTorch's CUDA allocator is a C++ class (c10::cuda::CUDACachingAllocator::CUDAAllocator). The
// extension in ../../csrc subclasses it and forwards every call here; this header knows nothing of
// PyTorch, so CI tests it on the simulated GPU:
//
//   gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, 16 << 30)};
//   gpukit_torch::backend<gpukit::sim_runtime> b{sim,
//   gpukit::parse_alloc_conf("segments:synchronous")}; void* p = b.allocate(0, 1 << 20, stream); //
//   device 0, in `stream` order b.begin_allocate_to_pool(0, {1, 0}, [&](auto s) { return s ==
//   capture_stream; }); void* q = b.allocate(0, 4096, capture_stream);     // from the pool (a
//   gpukit capture pool) b.end_allocate_to_pool(0, {1, 0}); gpukit_torch::device_stats s =
//   b.stats(0);         // torch.cuda.memory_stats()'s numbers b.deallocate(q); b.deallocate(p);
//   b.release_pool(0, {1, 0});
//
// - One gpukit caching allocator per device, created on first use with the backend's options.
// - Private pools (PyTorch's MempoolId_t: CUDA graphs, torch.cuda.MemPool) are gpukit capture
//   pools. While a pool is being allocated to, an allocation on a stream its filter accepts goes to
//   a capture pool of that pool on that stream (begin_capture, or resume_capture of one of the
//   pool's ended capture pools, so that graphs sharing a pool reuse its free blocks); ending
//   allocation ends those captures; releasing the last use gives the capture pools back.
//   gpukit keys captures by stream: while a pool is allocated to on a stream, every allocation on
//   that stream that no other pool's filter claims and that the pool's filter rejects pauses it.
//   A side stream joined to a graph's capture is accepted by PyTorch's filter (same capture id)
//   and gets a capture pool of the same pool. From beginAllocateToPool to endAllocateToPool the
//   allocator keeps a capture window open: no event query or wait that a capture in global mode
//   refuses, and never a call that invalidates a capture on a capturing stream (its device, a
//   query, a wait), so graphs with side streams capture in every mode.
// - Every block handed out is recorded (device, stream, size, pool, call-stack context), so a free
//   needs only the pointer, as PyTorch's free does, and snapshots can name pools and stacks.
// - Requests are rounded as PyTorch rounds them (512 bytes at least and a multiple of 512, or
//   roundup_power2_divisions' steps; gpukit_torch/alloc_conf.hpp), and the rounded size is the
//   block gpukit allocates.
// - Statistics mean what torch.cuda.memory_stats()'s do. The backend counts blocks held by users
//   itself (allocation, allocated_bytes and requested_bytes; active and active_bytes are those
//   plus blocks freed but waiting for other streams' work), with PyTorch's sizes: the rounded size
//   for allocated and active bytes, the size asked for requested bytes, the small pool for rounded
//   sizes up to 1 MiB. Segments, reserved bytes, inactive splits and the device counts are the
//   caching allocator's. Where gpukit's policy differs from PyTorch's, so do the numbers: PyTorch
//   hands out a whole cached block when its remainder is too small to split (at most 1 MiB in the
//   large pool), gpukit always splits; growable segments count their address ranges as segments.
// - Where growable segments are asked for and a device has no virtual memory management, that
//   device gets synchronous (cudaMalloc) segments, and the warning handler is told once, for the
//   first such device (the extension makes one backend per process: one warning per process).
// - Blocks travel between processes in PyTorch's handle formats (share_ipc_handle,
//   open_ipc_handle): cudaMalloc segments as CUDA IPC handles, growable memory as PyTorch's
//   expandable segments (one POSIX descriptor per page, taken by the receiver with pidfd_getfd:
//   detail/pidfd.hpp). Where receivers would be refused, sharing fails in the sharing thread.
//
// Thread-safe, and allocations and frees on different threads do not wait for each other: the
// records are sharded by address and, once more than four threads have allocated or freed, the
// statistics are batched per shard (each shard's delta is folded into shared atomic counters only
// past a bound). While one thread allocates and frees, every operation folds, with plain stores
// under one lock; while up to four do (a training step's main and autograd threads), every
// operation folds with atomics: all is exact. Read with no operation in flight, current values
// are exact; once batched, a peak is never above the true one and at most 64 shards x (4 MiB, 16
// blocks) below it per pool kind (stats_batch_bytes). A statistics reader racing with them sees
// each counter as it was at some instant (as PyTorch's own snapshot does), never a peak below the
// current value it reports.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/ipc.hpp>
#include <gpukit_torch/alloc_conf.hpp>
#include <gpukit_torch/detail/record_table.hpp>
#include <gpukit_torch/detail/thread_annotations.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace gpukit_torch {

/// A private pool's id, as PyTorch's MempoolId_t; {0, 0} is the default pool.
using pool_id = std::pair<unsigned long long, unsigned long long>;

/// One statistic as PyTorch keeps it: current, peak, and what was added and taken since the last
/// reset of accumulated statistics.
struct stat {
  std::int64_t current{0};
  std::int64_t peak{0};
  std::int64_t allocated{0};
  std::int64_t freed{0};
};

/// The statistics of torch.cuda.memory_stats() of one pool kind (".small_pool.", ".large_pool."),
/// or of both (".all."). `allocated` and `freed` count from the last reset of accumulated
/// statistics; those of the inactive-split statistics stay 0 (gpukit does not track them).
struct device_pool_stats {
  stat allocation;            ///< blocks held by users
  stat segment;               ///< segments (growable: mapped pages) held from the device
  stat active;                ///< allocated blocks and blocks waiting on other streams' work
  stat inactive_split;        ///< free blocks inside partly used segments
  stat allocated_bytes;       ///< bytes of blocks held by users (PyTorch's rounded sizes)
  stat reserved_bytes;        ///< bytes held from the device
  stat active_bytes;          ///< bytes of active blocks
  stat inactive_split_bytes;  ///< bytes of inactive split blocks
  stat requested_bytes;       ///< bytes users asked for
};

/// The statistics of torch.cuda.memory_stats(): the aggregate (".all.", StatType::AGGREGATE: the
/// members inherited), and per pool kind (StatType::SMALL_POOL, StatType::LARGE_POOL).
struct device_stats : device_pool_stats {
  device_pool_stats small_pool;  ///< requests up to the small request size (1 MiB by default)
  device_pool_stats large_pool;
  std::int64_t num_alloc_retries{0};
  std::int64_t num_ooms{0};
  std::int64_t num_sync_all_streams{0};  ///< segment frees that may synchronize the device
  std::int64_t num_device_alloc{0};
  std::int64_t num_device_free{0};
  /// PyTorch's max_split_size_mb in bytes, -1 when unlimited (always: gpukit does not use it).
  std::int64_t max_split_size{-1};
  stat oversize_allocations;  ///< blocks of at least max_split_size held (none)
  stat oversize_segments;     ///< segments of at least max_split_size (none)
};

/// How much call-stack context history recording keeps (PyTorch's RecordContext).
enum class record_when {
  never = 0,  ///< none
  state = 1,  ///< for blocks allocated now only
  alloc = 2,  ///< also on the allocations in the trace
  all   = 3,  ///< also on the frees in the trace
};

/// One event of the recorded history (PyTorch's TraceEntry).
struct trace_entry {
  enum class action { alloc, free_requested, free_completed, segment_alloc, segment_free, oom };
  action what{action::alloc};
  int device{0};
  std::uintptr_t address{0};  ///< for oom: the device's free bytes
  std::size_t bytes{0};       ///< requested bytes (blocks), segment bytes, or bytes asked (oom)
  std::uintptr_t stream{0};
  pool_id pool{0, 0};
  std::int64_t time_us{0};        ///< microseconds since the Unix epoch
  std::shared_ptr<void> context;  ///< what the context recorder returned, or null
};

/// One block of a segment in a snapshot.
struct block_info {
  std::uintptr_t address{0};
  std::size_t size{0};
  std::size_t requested{0};
  bool allocated{false};
  std::shared_ptr<void> context;  ///< allocated blocks, while history records context
};

/// One segment in a snapshot (PyTorch's SegmentInfo).
struct segment_info {
  int device{0};
  std::uintptr_t address{0};
  std::size_t total_size{0};
  std::size_t allocated_size{0};
  std::size_t requested_size{0};
  std::uintptr_t stream{0};
  bool is_large{true};
  bool is_expandable{false};
  pool_id owner{0, 0};  ///< the private pool of the blocks allocated in it, if any
  std::vector<block_info> blocks;
};

/// What snapshot returns: segments of every device, and each device's recorded history.
struct memory_state {
  std::vector<segment_info> segments;
  std::vector<std::vector<trace_entry>> traces;  ///< one per device index
};

/// What out-of-memory observers are told (PyTorch's OutOfMemoryObserver arguments, and why).
struct oom_info {
  std::string message;  ///< gpukit's report
  int device{0};
  std::size_t requested{0};
  std::size_t allocated{0};
  std::size_t device_total{0};
  std::size_t device_free{0};
};

/// PyTorch's allocator interface over gpukit caching allocators (see the top of this header).
template <class Runtime>
class backend final {
 public:
  using allocator_type             = gpukit::basic_caching_allocator<Runtime>;
  using stream_type                = typename Runtime::stream_type;
  using stream_filter              = std::function<bool(stream_type)>;
  using context_recorder           = std::function<std::shared_ptr<void>()>;
  using oom_observer               = std::function<void(oom_info const&)>;
  using trace_observer             = std::function<void(trace_entry const&)>;
  using warning_handler            = std::function<void(std::string const&)>;
  static constexpr int max_devices = 64;
  /// The statistics of blocks held by users (allocation, allocated, requested, active bytes and
  /// counts) are exact while at most `exact_stats_threads` threads have allocated or freed (a
  /// training step's main and autograd threads among them), and batched once more have: each of
  /// `stats_slots` records shards then folds its delta into shared counters only when it leaves
  /// [0, batch], per pool kind `stats_batch_bytes` (rounded and requested bytes) and
  /// `stats_batch_count` blocks. A peak is then at most stats_slots x batch below the true one per
  /// pool kind (twice that for both), never above it; current values read with no operation in
  /// flight are exact.
  static constexpr int exact_stats_threads        = 4;
  static constexpr std::int64_t stats_batch_bytes = std::int64_t{4} << 20;
  static constexpr std::int64_t stats_batch_count = 16;
  static constexpr std::int64_t stats_slots       = 64;  // = record_shards

  /// A backend over `runtime`; each device's allocator gets `options` when first used, and
  /// requests are rounded to 512 bytes.
  explicit backend(Runtime& runtime, gpukit::caching_allocator_options options = {});
  /// A backend over `runtime` with the settings of `conf` (its options and its rounding).
  backend(Runtime& runtime, backend_conf const& conf);
  /// Destroys the allocators (and so frees every block still allocated).
  ~backend();
  backend(backend const&)            = delete;
  backend& operator=(backend const&) = delete;
  backend(backend&&)                 = delete;
  backend& operator=(backend&&)      = delete;

  /// The allocator of `device`, created on first use.
  /// @throws gpukit::logic_error for a device out of range
  [[nodiscard]] allocator_type& allocator(int device);
  [[nodiscard]] gpukit::caching_allocator_options const& options() const noexcept
  {
    return options_;
  }
  [[nodiscard]] Runtime& runtime() const noexcept { return runtime_; }
  [[nodiscard]] size_rounding const& rounding() const noexcept { return rounding_; }
  /// Where warnings go (default: standard error, one line each). Set before the first
  /// allocation; the handler is called without the backend's locks.
  void set_warning_handler(warning_handler handler);

  /// `bytes` on `device` in `stream` order, from the private pool whose filter accepts `stream`
  /// when one is being allocated to: a block of rounding().round_size(bytes). nullptr for 0 bytes.
  /// On failure the out-of-memory observers run (and history records it) before the gpukit error is
  /// rethrown.
  /// @throws gpukit::out_of_memory, gpukit::bad_alloc (limit), gpukit::logic_error, cuda_error
  [[nodiscard]] void* allocate(int device, std::size_t bytes, stream_type stream);
  /// Frees `ptr` on the stream it was allocated on. nullptr is ignored.
  /// @throws gpukit::logic_error for a pointer this backend did not hand out
  void deallocate(void* ptr);
  /// Whether `ptr` is a block this backend handed out and has not taken back.
  [[nodiscard]] bool owns(void const* ptr) const;
  /// The device of a block. @throws gpukit::logic_error for a pointer not handed out
  [[nodiscard]] int device_of(void const* ptr) const;
  /// Marks `ptr` as used on `stream` too (see caching_allocator::record_stream).
  void record_stream(void* ptr, stream_type stream);

  // Private pools (PyTorch: createOrIncrefPool, beginAllocateToPool, endAllocateToPool,
  // releasePool, getPoolUseCount, checkPoolLiveAllocations).
  void create_or_incref_pool(int device, pool_id id);
  /// Until end_allocate_to_pool, allocations on streams `filter` accepts come from pool `id`
  /// (created, or its use count raised). Later calls take precedence over earlier ones.
  /// @throws gpukit::logic_error if the pool is already being allocated to, or id is {0, 0}
  void begin_allocate_to_pool(int device, pool_id id, stream_filter filter);
  /// @throws gpukit::logic_error if the pool is not being allocated to
  void end_allocate_to_pool(int device, pool_id id);
  /// Lowers the pool's use count; at zero its memory becomes the device's again (blocks still
  /// allocated from it stay valid and become ordinary when freed).
  /// @throws gpukit::logic_error for an unknown pool or one still being allocated to
  void release_pool(int device, pool_id id);
  [[nodiscard]] int pool_use_count(int device, pool_id id) const;
  /// Whether the blocks allocated from pool `id` now are exactly `expected`.
  [[nodiscard]] bool check_pool_live_allocations(int device, pool_id id,
                                                 std::unordered_set<void*> const& expected) const;

  /// The blocks allocated from pool `id` now, in address order (PyTorch's getCheckpointState).
  [[nodiscard]] std::vector<void*> pool_live_blocks(int device, pool_id id) const;
  /// Brings pool `id` back to `checkpoint` (from pool_live_blocks; PyTorch's
  /// setCheckpointPoolState, which CUDA graph trees call): frees the pool's blocks allocated
  /// since, and returns them. Blocks of the checkpoint must still be allocated: gpukit cannot hand
  /// out a block at a chosen address again.
  /// @throws gpukit::logic_error naming how many checkpointed blocks were freed since (nothing
  ///         is changed then)
  std::vector<void*> restore_pool(int device, pool_id id, std::vector<void*> const& checkpoint);

  /// Statistics of `device` (zero before its first allocation).
  [[nodiscard]] device_stats stats(int device) const;
  void reset_peak_stats(int device);
  void reset_accumulated_stats(int device);

  /// Limits `device` to `fraction` of its memory (1: no limit).
  /// @throws gpukit::logic_error for a fraction outside [0, 1]
  void set_memory_fraction(int device, double fraction);
  [[nodiscard]] double memory_fraction(int device) const;
  /// Returns every fully free segment of every device to the runtime. Returns the bytes released.
  std::size_t empty_cache();
  /// The largest free block `device`'s allocator holds.
  [[nodiscard]] std::size_t largest_free_block(int device) const;
  /// PyTorch's cacheInfo: the larger of `largest` and largest_free_block(device), where a
  /// `largest` of 0 is first the device's free memory (PyTorch's optimistic guess, which cuDNN's
  /// algorithm search takes as the workspace it may ask for).
  [[nodiscard]] std::size_t cache_info(int device, std::size_t largest) const;
  /// The segment holding block `ptr`: its start and size.
  /// @throws gpukit::logic_error for a pointer not handed out
  [[nodiscard]] std::pair<void*, std::size_t> base_allocation(void const* ptr) const;

  /// Starts (enabled) or stops recording history. `recorder` is called on each allocation (and
  /// each free for record_when::all) to capture its context; `max_entries` bounds the trace of
  /// each device. clear: forget what was recorded so far.
  void record_history(bool enabled, context_recorder recorder, std::size_t max_entries,
                      record_when when, bool clear);
  [[nodiscard]] bool history_enabled() const noexcept
  {
    return history_on_.load(std::memory_order_relaxed);
  }
  /// Segments and blocks of every device (only those of pool `pool` when it is not {0, 0}) and
  /// the recorded history (none when include_traces is false). Does not synchronize.
  [[nodiscard]] memory_state snapshot(pool_id pool = {0, 0}, bool include_traces = true) const;

  /// Called, in order, when an allocation fails.
  void add_oom_observer(oom_observer observer);
  /// Called with every block and out-of-memory event as it happens, whether or not history is
  /// recorded (PyTorch's AllocatorTraceTracker), on the thread that caused it.
  void add_trace_observer(trace_observer observer);

  /// PyTorch's shareable handle of block `ptr`, in PyTorch's own format so that processes using
  /// PyTorch's allocator open it too, and the block's offset from the start of what the handle
  /// maps:
  /// - a cudaMalloc segment: "\x02c" and the segment's CUDA IPC handle; the offset in the segment;
  /// - a growable segment (pages created shareable: growable_shareable): "\x02e", PyTorch's
  ///   expandable-segment header (this process's id, 4 zero bytes, the page size and the number of
  ///   pages, native-endian: 24 bytes) and one int per page, the POSIX descriptor the allocator
  ///   exported it as (kept open until the page is unmapped); the offset in the first page. A
  ///   receiver takes the descriptors with pidfd_open and pidfd_getfd.
  /// Does not synchronize.
  /// @throws gpukit::logic_error for a pointer not handed out, memory CUDA cannot export, or a
  ///         growable block when the PyTorch version's handle layout is unknown to gpukit
  /// @throws std::system_error (the errno, and a message naming the cause and the setting that
  ///         avoids it) for a growable block when receivers would be refused the descriptors
  ///         (sharing_refusal)
  [[nodiscard]] std::pair<std::string, std::size_t> share_ipc_handle(void* ptr);
  /// Opens a handle from share_ipc_handle, or from PyTorch's own allocator, of this or another
  /// process on the current device: the start of what it maps (the segment, or the first page),
  /// mapped while any copy of the result lives. Opened once per handle string (later opens of the
  /// same bytes return the same mapping). Imported pages are made accessible to the current
  /// device and to the peers grant_peer_access gave it.
  /// @throws gpukit::logic_error for a handle of another format (fabric handles included)
  /// @throws std::system_error (the errno, and a message naming the cause and the setting that
  ///         avoids it) when pidfd_open or pidfd_getfd is refused
  /// @throws gpukit::cuda_error when the runtime cannot import or map the memory
  [[nodiscard]] std::shared_ptr<void> open_ipc_handle(std::string const& handle);
  /// Why growable blocks cannot be shared from this process ("" when they can): a probe, run once
  /// per backend (a forked child taking one of this process's descriptors, as a receiver
  /// does; see detail/pidfd.hpp). Blocks for the probe the first time.
  [[nodiscard]] std::string const& sharing_refusal();
  /// The PyTorch version whose handle layouts share_ipc_handle writes and open_ipc_handle reads
  /// (2.11 unless told; the expandable-segment layout here is that of PyTorch 2.5 to 2.11).
  void set_torch_version(int major, int minor) noexcept;
  /// PyTorch's enablePeerAccess(device, peer), in its argument order: `device` may access
  /// `peer`'s memory: `peer`'s growable pages, now and later, and the
  /// growable blocks other processes shared that are open on `peer` (cuMemSetAccess).
  /// cudaDeviceEnablePeerAccess, which the caller makes, covers cudaMalloc memory.
  /// @throws gpukit::logic_error for a device out of range; gpukit::cuda_error when refused
  void grant_peer_access(int device, int peer);

 private:
  struct record {
    int device{0};
    stream_type stream{};
    std::size_t bytes{0};  // asked for
    std::size_t size{0};   // rounded: the block's size to PyTorch and to the allocator
    pool_id pool{0, 0};
    std::shared_ptr<void> context;
  };
  // The records of blocks handed out, by address, in shards (shard_index: a hash of the address).
  // While one thread alone has allocated and freed, single_mutex_ guards every shard and the user
  // counts are written with plain loads and stores; from the first allocation or free on a second
  // thread on, a thread locks only the shard of the block it allocates or frees and counts into
  // that shard's delta (user_counts, batched per shard), so threads rarely wait for each other or
  // share a cache line. Readers of every record (snapshots, pool checks) lock the shards one at
  // a time.
  static constexpr int record_shard_bits = 6;
  struct alignas(64) record_shard {
    mutable std::mutex mutex;
    detail::record_table<record> records;  // under records_lock
  };
  struct pool_state {
    int use_count{0};
    std::vector<typename allocator_type::capture_id> ended;  // capture pools not under way
  };
  struct capture_on_stream {
    stream_type stream{};
    pool_id pool{0, 0};
    typename allocator_type::capture_id id{0};
  };
  /// A device's private pools, the pools being allocated to (beginAllocateToPool) with their
  /// filters, and the allocator's captures that route allocations on a stream to a pool.
  struct device_pools {
    std::map<pool_id, pool_state> pools;
    std::vector<std::pair<pool_id, stream_filter>> underway;
    std::vector<capture_on_stream> captures;
  };
  struct device_state;
  class user_counts;
  /// What readers of the user counts sum over the records shards, by statistic (blocks, rounded
  /// bytes, requested bytes) and pool kind: what allocations added, and the deltas not folded
  /// into the shared current values yet (see user_counts).
  struct shard_sums {
    std::array<std::array<std::int64_t, 2>, 3> added{};
    std::array<std::array<std::int64_t, 2>, 3> unfolded{};
  };

  device_state& state(int device) const;
  device_state* state_if_created(int device) const noexcept;
  device_pools& pools_of(int device) GPUKIT_TORCH_REQUIRES(pools_mutex_)
  {
    return pools_[static_cast<std::size_t>(device)];
  }
  device_pools const& pools_of(int device) const GPUKIT_TORCH_REQUIRES(pools_mutex_)
  {
    return pools_[static_cast<std::size_t>(device)];
  }
  /// The pool an allocation on `stream` goes to (`p`: its device's pools, `d`: its device).
  pool_id route(device_state& d, device_pools& p, stream_type stream)
    GPUKIT_TORCH_REQUIRES(pools_mutex_);
  /// Ends the allocator's capture p.captures[index], kept for its pool to resume.
  void pause_capture(device_state& d, device_pools& p, std::size_t index)
    GPUKIT_TORCH_REQUIRES(pools_mutex_);
  /// Counts the pools being allocated to and the captures under way, into routing_.
  void recount_routing() GPUKIT_TORCH_REQUIRES(pools_mutex_);
  std::shared_ptr<void> capture_context(record_when at_least) const;
  void trace(trace_entry e);
  void on_failed_allocation(int device, std::size_t bytes, gpukit::bad_alloc const& e);
  void add_segment_events(int device, gpukit::memory_snapshot const& snap,
                          std::vector<trace_entry>& out) const;
  segment_info to_segment_info(int device, gpukit::memory_snapshot::segment const& g,
                               bool growable) const;
  gpukit::caching_allocator_options options_for(int device, std::string& fallback) const;
  class records_lock;
  static std::size_t shard_index(void const* ptr) noexcept;
  shard_sums shard_totals(device_state const& d) const;
  void warn(std::string const& message) const;
  static std::int64_t now_us() noexcept;

  Runtime& runtime_;
  gpukit::caching_allocator_options options_;
  size_rounding rounding_;
  warning_handler warn_;
  mutable std::atomic<bool> warned_no_vmm_{false};
  std::atomic<int> torch_version_{211};  // major * 100 + minor

  std::mutex ipc_mutex_;  // everything below
  std::map<std::string, std::weak_ptr<gpukit::imported_block<Runtime>>> opened_;  // by handle
  bool probed_{false};
  std::string refusal_;  // the probe's finding, and its errno
  int probe_error_{0};
  mutable std::mutex create_mutex_;
  mutable std::array<std::atomic<device_state*>, max_devices> devices_{};

  static constexpr std::size_t record_shards = std::size_t{1} << record_shard_bits;
  static_assert(record_shards == stats_slots, "the statistics are batched per records shard");
  mutable std::array<record_shard, record_shards> records_;
  mutable std::mutex single_mutex_;          // every shard, until shared_
  mutable std::thread::id owner_;            // under single_mutex_: the one thread so far
  mutable std::atomic<bool> shared_{false};  // set once, under single_mutex_
  // Threads that have allocated or freed since shared_ was set (never lowered): the statistics
  // are batched once this passes exact_stats_threads (note_writer).
  std::atomic<int> writers_{0};
  std::uint64_t const uid_{next_uid()};  // never reused: a thread's note of this backend
  static std::uint64_t next_uid() noexcept
  {
    static std::atomic<std::uint64_t> n{1};
    return n.fetch_add(1, std::memory_order_relaxed);
  }
  /// Counts the calling thread among writers_ once; whether the statistics are batched now.
  bool note_writer() noexcept;

  // Pools, filters and captures under way, of every device (clang's -Wthread-safety checks it).
  mutable detail::annotated_mutex pools_mutex_;
  std::array<device_pools, max_devices> pools_ GPUKIT_TORCH_GUARDED_BY(pools_mutex_);
  std::atomic<int> routing_{0};  // pools being allocated to, or captures under way

  mutable std::mutex history_mutex_;  // everything below
  std::atomic<bool> history_on_{false};
  std::atomic<int> history_when_{0};
  context_recorder recorder_;
  std::size_t max_entries_{0};
  std::deque<trace_entry> trace_;
  std::vector<oom_observer> oom_observers_;
  std::vector<trace_observer> trace_observers_;
  std::atomic<bool> traced_{false};  // history on, or a trace observer attached
};

}  // namespace gpukit_torch

#include "detail/backend_impl.hpp"
