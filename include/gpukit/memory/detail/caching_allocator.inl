// gpukit/memory/detail/caching_allocator.inl: bodies of basic_caching_allocator. Not public API.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace gpukit::detail {

// ---------------------------------------------------------------------------------------------
// Thread-local registry: which thread cache this thread uses for which allocator.

struct tls_entry {
  std::uint64_t uid{0};
  void* allocator{nullptr};
  void* cache{nullptr};
  void (*on_exit)(void* allocator, void* cache){nullptr};
};

/// Allocators alive in this process (by uid), so that a thread exiting after an allocator died
/// does not touch it. uids are never reused.
struct live_allocators {
  std::mutex mutex;
  std::unordered_set<std::uint64_t> uids;
  std::atomic<std::uint64_t> next_uid{1};
  static live_allocators& get()
  {
    static live_allocators* r = new live_allocators{};  // never destroyed: threads outlive statics
    return *r;
  }
};

struct tls_registry {
  tls_entry last{};
  std::vector<tls_entry> entries;
  tls_registry()                               = default;
  tls_registry(tls_registry const&)            = delete;
  tls_registry& operator=(tls_registry const&) = delete;
  tls_registry(tls_registry&&)                 = delete;
  tls_registry& operator=(tls_registry&&)      = delete;
  ~tls_registry()
  {
    auto& live = live_allocators::get();
    std::lock_guard<std::mutex> lock{live.mutex};
    for (auto const& e : entries) {
      if (live.uids.count(e.uid) != 0) { e.on_exit(e.allocator, e.cache); }
    }
  }
  static tls_registry& get()
  {
    thread_local tls_registry r;
    return r;
  }
};

inline std::size_t round_up(std::size_t n, std::size_t a) noexcept { return (n + a - 1) / a * a; }

inline std::string hex(void const* p)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

enum class block_state : std::uint8_t {
  allocated,  // held by a user
  cached,     // in a thread cache
  free,       // in a pool index
  pending,    // freed, waiting for events on recorded streams
  unmapped,   // growable segments: address range without usable memory (page-aligned)
  dead,       // descriptor not describing any block (spare)
};

template <class Runtime>
struct caching_block {
  using stream_type = typename Runtime::stream_type;

  [[nodiscard]] std::uintptr_t address() const noexcept
  {
    return ptr.load(std::memory_order_relaxed);
  }
  [[nodiscard]] void* data() const noexcept { return reinterpret_cast<void*>(address()); }

  std::atomic<std::uintptr_t> ptr{0};
  std::atomic<block_state> state{block_state::dead};
  std::size_t size{0};
  std::size_t requested{0};
  stream_type stream{};           // allocated on / freed on (owner when free and not global)
  bool global{false};             // free and usable on any stream
  int kind{0};                    // small or large pool
  std::uint64_t free_seq{0};      // when it entered its stream's pool
  std::uint64_t capture_pool{0};  // private pool of a graph capture (0: none)
  void* segment{nullptr};
  caching_block* prev{nullptr};  // neighbours by address within the segment
  caching_block* next{nullptr};
  caching_block* free_prev{nullptr};  // index links (also the spare list)
  caching_block* free_next{nullptr};
  std::vector<stream_type> recorded;  // record_stream
};

template <class Runtime>
struct caching_thread_cache {
  using stream_type                 = typename Runtime::stream_type;
  using block                       = caching_block<Runtime>;
  static constexpr int stream_slots = 4;

  struct slot {
    stream_type stream{};
    bool used{false};
    std::uint64_t last_use{0};
    std::array<block*, tlsf_class_count> lists{};
    std::array<std::uint8_t, tlsf_class_count> counts{};
  };

  // Counters written by the owner thread only (relaxed load + store, no read-modify-write), read
  // by stats(). Each cache is its own allocation, so no two threads write one cache line.
  struct counter {
    std::atomic<std::int64_t> v{0};
    __attribute__((always_inline)) void add(std::int64_t d) noexcept
    {
      v.store(v.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
    }
    [[nodiscard]] std::int64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
  };

  /// A block for `size` bytes on `stream`, or nullptr.
  block* pop(stream_type stream, std::size_t size) noexcept
  {
    slot* s = find(stream);
    if (s == nullptr) { return nullptr; }
    int const fc = tlsf_floor_class(size);
    block* b     = s->lists[fc];
    int c        = fc;
    if (b == nullptr || b->size < size) {
      c = tlsf_ceil_class(size);
      if (c == fc) { c = fc + 1; }
      if (c >= tlsf_class_count) { return nullptr; }
      b = s->lists[c];
      if (b == nullptr) { return nullptr; }
    }
    s->lists[c] = b->free_next;
    --s->counts[c];
    cached_bytes.add(-static_cast<std::int64_t>(b->size));
    return b;
  }

  /// Keeps `b` for reuse on `stream`; false when there is no room.
  bool push(stream_type stream, block* b, int per_class, std::size_t max_bytes) noexcept
  {
    slot* s = find(stream);
    if (s == nullptr) { s = claim(stream); }
    if (s == nullptr) { return false; }
    int const c = tlsf_floor_class(b->size);
    if (s->counts[c] >= per_class ||
        static_cast<std::size_t>(cached_bytes.get()) + b->size > max_bytes) {
      return false;
    }
    b->free_next = s->lists[c];
    s->lists[c]  = b;
    ++s->counts[c];
    cached_bytes.add(static_cast<std::int64_t>(b->size));
    return true;
  }

  slot* find(stream_type stream) noexcept
  {
    if (mru != nullptr && mru->stream == stream && mru->used) { return mru; }
    for (auto& s : slots) {
      if (s.used && s.stream == stream) {
        s.last_use = ++tick;
        mru        = &s;
        return &s;
      }
    }
    return nullptr;
  }

  slot* claim(stream_type stream) noexcept
  {
    for (auto& s : slots) {
      if (!s.used) {
        s.used     = true;
        s.stream   = stream;
        s.last_use = ++tick;
        mru        = &s;
        return &s;
      }
    }
    return nullptr;  // all slots busy: the caller returns the block to the pool
  }

  /// Calls f(stream, block*) for every cached block and empties the cache.
  template <class F>
  void drain(F&& f)
  {
    for (auto& s : slots) {
      if (!s.used) { continue; }
      for (int c = 0; c < tlsf_class_count; ++c) {
        for (block* b = s.lists[c]; b != nullptr;) {
          block* next = b->free_next;
          f(s.stream, b);
          b = next;
        }
        s.lists[c]  = nullptr;
        s.counts[c] = 0;
      }
      s.used = false;
    }
    mru = nullptr;
    cached_bytes.add(-cached_bytes.get());
  }

  std::array<slot, stream_slots> slots{};
  slot* mru{nullptr};
  std::uint64_t tick{0};
  address_map<block> handed_out;  // blocks this thread allocated and has not freed
  // Blocks other threads freed stay in handed_out until their address comes back: when it holds
  // more than this, those entries are dropped (amortized: the bound doubles with what stays).
  std::size_t purge_at{4096};
  std::atomic<bool> flush_requested{false};
  bool orphaned{false};  // guarded by the allocator's mutex

  /// A counter that also keeps the highest value it reached (still one writer, no RMW).
  struct peaked_counter : counter {
    counter peak;
    __attribute__((always_inline)) void add(std::int64_t d) noexcept
    {
      std::int64_t const now = this->get() + d;
      this->v.store(now, std::memory_order_relaxed);
      if (now > peak.get()) { peak.v.store(now, std::memory_order_relaxed); }
    }
  };

  // allocated_bytes etc. are this thread's net contribution (negative when it frees blocks other
  // threads allocated); their peaks make the totals' peaks exact when one thread allocates.
  peaked_counter allocated_bytes, requested_bytes, allocation_count;
  counter cached_bytes;
  counter num_allocs, num_frees, num_cache_hits;

  // Recorded events (when recording): written by the owner, read by snapshot(), hence the lock,
  // taken only while recording.
  struct spin_lock {  // uncontended but for snapshot(): cheaper than a mutex per event
    std::atomic_flag flag = ATOMIC_FLAG_INIT;
    void lock() noexcept
    {
      while (flag.test_and_set(std::memory_order_acquire)) {}
    }
    void unlock() noexcept { flag.clear(std::memory_order_release); }
  };
  spin_lock ring_mutex;
  std::vector<memory_event> ring;
  std::size_t ring_next{0};
  std::uint64_t ring_dropped{0};

  void record(memory_event const& e, std::size_t capacity)
  {
    std::lock_guard<spin_lock> lock{ring_mutex};
    if (ring.size() < capacity) {
      ring.push_back(e);
    } else if (capacity != 0) {
      ring[ring_next] = e;
      ring_next       = (ring_next + 1) % capacity;
      ++ring_dropped;
    }
  }
};

}  // namespace gpukit::detail

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
  std::size_t mapped_pages{0};
};

template <class Runtime>
struct basic_caching_allocator<Runtime>::capture_pool {
  capture_id id{0};
  stream_type stream{};
  bool active{true};  // between begin_capture and end_capture
  detail::tlsf_index<block> index[2];
};

template <class Runtime>
struct basic_caching_allocator<Runtime>::stream_pool {
  stream_type stream{};
  detail::tlsf_index<block> index[2];
  std::uint64_t free_seq{0};
  bool migrating{false};
  event_type migration_event{};
  std::uint64_t migration_seq{0};
};

template <class Runtime>
struct basic_caching_allocator<Runtime>::pending_free {
  block* b{nullptr};
  stream_type stream{};
  std::vector<event_type> events;
  bool to_global{false};  // its stream was forgotten: usable by every stream once done
};

// ---------------------------------------------------------------------------------------------

template <class Runtime>
basic_caching_allocator<Runtime>::basic_caching_allocator(Runtime& runtime, int device,
                                                          caching_allocator_options options)
    : runtime_{runtime}, device_{device}, options_{options}
{
  GPUKIT_EXPECTS(options_.small_segment_bytes >= options_.small_request_bytes &&
                   options_.small_request_bytes >= alignment,
                 "caching_allocator_options: small_segment_bytes (" +
                   std::to_string(options_.small_segment_bytes) +
                   ") must be at least small_request_bytes (" +
                   std::to_string(options_.small_request_bytes) + ")");
  GPUKIT_EXPECTS(
    options_.medium_segment_bytes >= options_.medium_request_bytes,
    "caching_allocator_options: medium_segment_bytes must be at least medium_request_bytes");
  GPUKIT_EXPECTS(
    options_.segment_rounding_bytes % alignment == 0 && options_.segment_rounding_bytes > 0,
    "caching_allocator_options: segment_rounding_bytes must be a positive multiple of 256");
  GPUKIT_EXPECTS(options_.limit_fraction >= 0.0 && options_.limit_fraction <= 1.0,
                 "caching_allocator_options: limit_fraction " +
                   std::to_string(options_.limit_fraction) + " is not within [0, 1]");
  int count = 0;
  GPUKIT_CUDA_TRY(runtime_.device_count(count));
  GPUKIT_EXPECTS(device >= 0 && device < count, "caching_allocator: device " +
                                                  std::to_string(device) + " does not exist (" +
                                                  std::to_string(count) + " devices)");
  device_properties props;
  GPUKIT_CUDA_TRY(runtime_.get_device_properties(props, device));
  device_total_   = props.total_memory;
  stream_ordered_ = options_.source == segment_source::stream_ordered ||
                    (options_.source == segment_source::automatic && props.memory_pools);
  growable_ = options_.source == segment_source::growable;
  if (growable_) {
    GPUKIT_EXPECTS(props.virtual_memory_management,
                   "caching_allocator: segment_source::growable needs virtual memory management, "
                   "which device " +
                     std::to_string(device) + " (" + props.name + ") does not support");
    std::size_t granularity = 0;
    GPUKIT_CUDA_TRY(runtime_.vm_granularity(granularity, device));
    GPUKIT_EXPECTS(granularity != 0 && granularity % alignment == 0,
                   "caching_allocator: the device reports a mapping granularity of " +
                     std::to_string(granularity) + " bytes");
    GPUKIT_EXPECTS(options_.growable_page_bytes != 0,
                   "caching_allocator_options: growable_page_bytes must not be 0");
    page_bytes_[small_pool] = granularity;
    page_bytes_[large_pool] = detail::round_up(options_.growable_page_bytes, granularity);
  }
  std::size_t limit = options_.limit_bytes;
  if (options_.limit_fraction > 0.0) {
    auto const frac =
      static_cast<std::size_t>(options_.limit_fraction * static_cast<double>(device_total_));
    limit = limit == 0 ? frac : std::min(limit, frac);
  }
  limit_.store(limit, std::memory_order_relaxed);
  auto& live = detail::live_allocators::get();
  uid_       = live.next_uid.fetch_add(1);
  std::lock_guard<std::mutex> lock{live.mutex};
  live.uids.insert(uid_);
}

template <class Runtime>
basic_caching_allocator<Runtime>::~basic_caching_allocator()
{
  {
    auto& live = detail::live_allocators::get();
    std::lock_guard<std::mutex> lock{live.mutex};
    live.uids.erase(uid_);
  }
  std::lock_guard<std::mutex> lock{mutex_};
  device_guard<Runtime> guard{runtime_, device_};
  // Every segment goes back, whatever it holds; pending events first (their streams' work).
  for (auto& p : pending_) {
    for (event_type e : p.events) { (void)runtime_.event_destroy(e); }
  }
  for (auto& sp : stream_pools_) {
    if (sp->migrating) { (void)runtime_.event_destroy(sp->migration_event); }
  }
  for (event_type e : spare_events_) { (void)runtime_.event_destroy(e); }
  // The streams blocks were last used on may be gone by now (a stream destroyed after
  // forget_stream, or never forgotten): wait for the device once, then free everything in the
  // order of the device's null stream, which always exists.
  if (segments_ != 0) { (void)runtime_.device_synchronize(); }
  for (auto& spares : spare_pages_) {
    for (physical_handle h : spares) { (void)runtime_.vm_release(h); }
  }
  blocks_.for_each([&](std::uintptr_t, block* b) {
    if (b->prev == nullptr) {  // first block of its segment
      auto* seg = static_cast<segment*>(b->segment);
      if (seg->growable) {
        for (std::size_t i = 0; i < seg->mapped.size(); ++i) {
          if (seg->mapped[i] == 0) { continue; }
          (void)runtime_.vm_unmap(static_cast<char*>(seg->ptr) + i * seg->page, seg->page);
          (void)runtime_.vm_release(seg->handles[i]);
        }
        (void)runtime_.vm_free(seg->ptr, seg->size);
      } else if (seg->stream_ordered) {
        (void)runtime_.free_async(seg->ptr, stream_type{});
      } else {
        (void)runtime_.free(seg->ptr);
      }
      if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }
      delete seg;
    }
  });
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::thread_cache&
basic_caching_allocator<Runtime>::local_cache()
{
  auto& r = detail::tls_registry::get();
  if (r.last.uid == uid_) { return *static_cast<thread_cache*>(r.last.cache); }
  for (auto const& e : r.entries) {
    if (e.uid == uid_) {
      r.last = e;
      return *static_cast<thread_cache*>(e.cache);
    }
  }
  thread_cache* tc = nullptr;
  {
    std::lock_guard<std::mutex> lock{mutex_};
    for (auto& c : caches_) {
      if (c->orphaned) {
        c->orphaned = false;
        tc          = c.get();
        break;
      }
    }
    if (tc == nullptr) {
      caches_.push_back(std::make_unique<thread_cache>());
      tc = caches_.back().get();
    }
  }
  detail::tls_entry e{uid_, this, tc, &on_thread_exit};
  // Forget entries of allocators that no longer exist, so a thread that outlives many allocators
  // keeps a short list.
  {
    auto& live = detail::live_allocators::get();
    std::lock_guard<std::mutex> lock{live.mutex};
    r.entries.erase(
      std::remove_if(r.entries.begin(), r.entries.end(),
                     [&](detail::tls_entry const& x) { return live.uids.count(x.uid) == 0; }),
      r.entries.end());
  }
  r.entries.push_back(e);
  r.last = e;
  return *tc;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::on_thread_exit(void* allocator, void* cache)
{
  auto* self = static_cast<basic_caching_allocator*>(allocator);
  auto* tc   = static_cast<thread_cache*>(cache);
  std::lock_guard<std::mutex> lock{self->mutex_};
  self->flush_cache_locked(*tc);
  tc->handed_out.erase_if([](std::uintptr_t, block*) { return true; });
  // The counters stay: the sums over caches stay right when another thread reuses this one.
  tc->orphaned = true;
}

// ---------------------------------------------------------------------------------------------
// Allocation

template <class Runtime>
void* basic_caching_allocator<Runtime>::allocate_async(std::size_t bytes, stream_type stream)
{
  GPUKIT_EXPECTS(
    bytes != 0, "allocate_async: cannot allocate 0 bytes (device " + std::to_string(device_) + ")");
  if (bytes > device_total_) {
    throw bad_alloc{"gpukit: allocate_async: " + std::to_string(bytes) +
                    " bytes is more than device " + std::to_string(device_) + " has in total (" +
                    std::to_string(device_total_) + " bytes)"};
  }
  std::size_t const size = detail::round_up(bytes, alignment);
  thread_cache& tc       = local_cache();
  if (tc.flush_requested.load(std::memory_order_relaxed)) { flush_cache(tc); }
  if (size <= options_.thread_cache_max_block_bytes &&
      captures_underway_.load(std::memory_order_relaxed) == 0) {
    if (block* b = tc.pop(stream, size)) {
      b->state.store(detail::block_state::allocated, std::memory_order_relaxed);
      b->requested = bytes;
      b->stream    = stream;
      tc.num_cache_hits.add(1);
      return hand_out(tc, b, bytes, stream);
    }
  }
  return allocate_slow(bytes, size, stream, tc);
}

template <class Runtime>
void* basic_caching_allocator<Runtime>::allocate_slow(std::size_t bytes, std::size_t size,
                                                      stream_type stream, thread_cache& tc)
{
  std::unique_lock<std::mutex> lock{mutex_};
  check_stream_locked(stream, "allocate_async");
  int const kind     = kind_for(size);
  bool const capture = captures_underway_.load(std::memory_order_relaxed) != 0;
  if (capture) {
    if (capture_pool* cp = active_capture_locked(stream)) {
      return allocate_captured_locked(bytes, size, kind, *cp, tc);
    }
  }
  // While a graph is being captured (in global mode), event queries and synchronizations are
  // illegal on every thread: blocks waiting on events stay where they are until it ends.
  if (!capture && !pending_.empty()) { poll_pending_locked(); }  // reuse the oldest memory first
  block* b = find_free_locked(size, kind, stream);
  if (b == nullptr && !capture && migrate_locked(stream, false)) {
    b = find_free_locked(size, kind, stream);
  }
  if (b == nullptr && tc.cached_bytes.get() > 0) {
    // This thread's cached blocks (of any stream) may coalesce into what is needed.
    flush_cache_locked(tc);
    b = find_free_locked(size, kind, stream);
    if (b == nullptr && !capture && migrate_locked(stream, false)) {
      b = find_free_locked(size, kind, stream);
    }
  }
  if (b == nullptr) {
    std::vector<stream_type> freed_on;
    if (options_.release_before_grow && !growable_) {
      // No free block fits: fully free segments of this kind are too small for it. Give them
      // back before taking a new segment, so they do not add to the peak (stream-ordered frees
      // in the order of the stream that used them: no wait).
      release_locked(0, &freed_on, kind);
    }
    bool oom = false;
    b        = growable_ ? grow_locked(size, kind, stream, oom)
                         : new_segment_locked(size, kind, stream, oom);
    if (b == nullptr) {
      ++pool_stats_.num_alloc_retries;
      b = recover_locked(lock, size, kind, stream, tc, freed_on, capture);
      if (b == nullptr) { throw_oom_locked(bytes, size); }
    }
  }
  void* p = hand_out(tc, take_locked(b, size, bytes, stream), bytes, stream);
  if (freed_across_threads_) { update_peaks_locked(); }  // the sums are the only true peaks then
  return p;
}

// Drops the entries of blocks other threads have freed since (their descriptor now describes
// another block, or none). Descriptors are never deallocated while the allocator lives, so reading
// one that another thread reuses is safe; its state and address are atomics.
template <class Runtime>
void basic_caching_allocator<Runtime>::purge_handed_out(thread_cache& tc)
{
  tc.handed_out.erase_if([](std::uintptr_t key, block* b) {
    return b->address() != key ||
           b->state.load(std::memory_order_relaxed) != detail::block_state::allocated;
  });
  tc.purge_at = std::max<std::size_t>(4096, 2 * tc.handed_out.size());
}

// Every path that gives a block to a user ends here: the thread's map and counters, then the
// optional recording and annotation.
template <class Runtime>
__attribute__((always_inline)) inline void* basic_caching_allocator<Runtime>::hand_out(
  thread_cache& tc, block* b, std::size_t bytes, stream_type stream)
{
  tc.handed_out.insert(b->address(), b);
  if (tc.handed_out.size() > tc.purge_at) { purge_handed_out(tc); }
  tc.allocated_bytes.add(static_cast<std::int64_t>(b->size));
  tc.requested_bytes.add(static_cast<std::int64_t>(bytes));
  tc.allocation_count.add(1);
  tc.num_allocs.add(1);
  if (recording_.load(std::memory_order_relaxed)) {
    record(tc, memory_event::action::alloc, b, stream);
  }
  annotate_alloc(b, bytes);
  return b->data();
}

template <class Runtime>
void basic_caching_allocator<Runtime>::record(thread_cache& tc, memory_event::action what,
                                              block const* b, stream_type stream)
{
  tc.record(memory_event{what, now_ns(), b->address(), b->size, stream_id(stream)}, ring_capacity_);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::record_pool_locked(memory_event::action what,
                                                          std::uintptr_t address, std::size_t bytes,
                                                          stream_type stream)
{
  if (!recording_.load(std::memory_order_relaxed)) { return; }
  memory_event const e{what, now_ns(), address, bytes, stream_id(stream)};
  if (pool_ring_.size() < ring_capacity_) {
    pool_ring_.push_back(e);
  } else if (ring_capacity_ != 0) {
    pool_ring_[pool_ring_next_] = e;
    pool_ring_next_             = (pool_ring_next_ + 1) % ring_capacity_;
    ++pool_ring_dropped_;
  }
}

template <class Runtime>
std::uint64_t basic_caching_allocator<Runtime>::now_ns() noexcept
{
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now().time_since_epoch())
                                      .count());
}

template <class Runtime>
memory_heap basic_caching_allocator<Runtime>::segment_heap(block const* b) noexcept
{
  return static_cast<segment const*>(b->segment)->nvtx_heap;
}

template <class Runtime>
std::uintptr_t basic_caching_allocator<Runtime>::stream_id(stream_type stream) noexcept
{
  std::uintptr_t id = 0;
  std::memcpy(&id, &stream, std::min(sizeof id, sizeof stream));
  return id;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::start_recording(std::size_t events_per_thread)
{
  GPUKIT_EXPECTS(events_per_thread > 0, "start_recording: the ring must hold at least one event");
  std::lock_guard<std::mutex> lock{mutex_};
  ring_capacity_ = events_per_thread;
  for (auto& c : caches_) {
    std::lock_guard<typename thread_cache::spin_lock> ring_lock{c->ring_mutex};
    c->ring.clear();
    c->ring_next    = 0;
    c->ring_dropped = 0;
  }
  pool_ring_.clear();
  pool_ring_next_    = 0;
  pool_ring_dropped_ = 0;
  recording_.store(true, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::stop_recording()
{
  recording_.store(false, std::memory_order_relaxed);
}

template <class Runtime>
memory_snapshot basic_caching_allocator<Runtime>::snapshot() const
{
  std::lock_guard<std::mutex> lock{mutex_};
  memory_snapshot s;
  s.device = device_;
  blocks_.for_each([&](std::uintptr_t, block* head) {
    if (head->prev != nullptr) { return; }
    auto const* seg = static_cast<segment const*>(head->segment);
    // A growable segment appears as one segment per run of mapped blocks (as PyTorch shows its
    // expandable segments), so that the blocks of each segment tile it.
    memory_snapshot::segment g;
    auto flush = [&] {
      if (!g.blocks.empty()) { s.segments.push_back(std::move(g)); }
      g = memory_snapshot::segment{};
    };
    for (block const* b = head; b != nullptr; b = b->next) {
      auto const st = b->state.load(std::memory_order_relaxed);
      if (st == detail::block_state::unmapped) {
        flush();
        continue;
      }
      if (g.blocks.empty()) {
        g.address = b->address();
        g.size    = 0;
        g.stream  = stream_id(head->stream);
        g.small   = seg->kind == small_pool;
      }
      bool const allocated = st == detail::block_state::allocated;
      g.blocks.push_back({b->address(), b->size, allocated ? b->requested : 0, allocated});
      g.size += b->size;
    }
    flush();
  });
  std::sort(s.segments.begin(), s.segments.end(),
            [](auto const& a, auto const& b) { return a.address < b.address; });
  s.events         = pool_ring_;
  s.dropped_events = pool_ring_dropped_;
  for (auto const& c : caches_) {
    std::lock_guard<typename thread_cache::spin_lock> ring_lock{c->ring_mutex};
    s.events.insert(s.events.end(), c->ring.begin(), c->ring.end());
    s.dropped_events += c->ring_dropped;
  }
  std::stable_sort(s.events.begin(), s.events.end(),
                   [](auto const& a, auto const& b) { return a.time_ns < b.time_ns; });
  return s;
}

// A stream's first use: it must belong to this allocator's device (on CUDA, cudaMallocAsync on
// another device's stream takes that device's memory, and events of this device cannot be
// recorded on it). The null stream stands for this device's.
template <class Runtime>
void basic_caching_allocator<Runtime>::check_stream_locked(stream_type stream, char const* what)
{
  if (stream == stream_type{} || std::find(checked_streams_.begin(), checked_streams_.end(),
                                           stream) != checked_streams_.end()) {
    return;
  }
  int d = -1;
  GPUKIT_CUDA_TRY(runtime_.stream_get_device(stream, d));
  GPUKIT_EXPECTS(d == device_, std::string{what} + ": the stream belongs to device " +
                                 std::to_string(d) + " but this allocator serves device " +
                                 std::to_string(device_) +
                                 "; use that device's allocator (default_caching_allocator(" +
                                 std::to_string(d) + "))");
  checked_streams_.push_back(stream);
  forgotten_streams_.erase(
    std::remove(forgotten_streams_.begin(), forgotten_streams_.end(), stream),
    forgotten_streams_.end());  // a new stream with a reused handle
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::find_free_locked(std::size_t size, int kind, stream_type stream)
{
  for (auto& sp : stream_pools_) {
    if (sp->stream == stream) {
      if (block* b = sp->index[kind].find(size)) { return b; }
      break;
    }
  }
  return global_[kind].find(size);
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
void basic_caching_allocator<Runtime>::adopt_segment_locked(block* b, std::unique_ptr<segment> seg,
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
  b->ptr.store(reinterpret_cast<std::uintptr_t>(p), std::memory_order_relaxed);
  b->size         = seg_size;
  b->kind         = kind;
  b->stream       = stream;
  b->global       = false;
  b->capture_pool = pool;
  b->segment      = seg.release();
  b->prev = b->next = nullptr;
  b->state.store(detail::block_state::free, std::memory_order_relaxed);
  blocks_.insert(b->address(), b);
  reserved_ += seg_size;
  ++segments_;
  pool_stats_.reserved_bytes.peak =
    std::max(pool_stats_.reserved_bytes.peak, static_cast<std::int64_t>(reserved_));
  pool_stats_.segment_count.peak =
    std::max(pool_stats_.segment_count.peak, static_cast<std::int64_t>(segments_));
  ++pool_stats_.num_device_allocs;
  record_pool_locked(memory_event::action::segment_alloc, b->address(), seg_size, stream);
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::new_segment_locked(std::size_t size, int kind, stream_type stream,
                                                     bool& oom)
{
  std::size_t seg_size    = segment_size_for(size);
  std::size_t const limit = limit_.load(std::memory_order_relaxed);
  if (limit != 0 && reserved_ + seg_size > limit) {
    // Within the limit, a segment just big enough may still fit.
    seg_size = detail::round_up(size, alignment);
    if (reserved_ + seg_size > limit) {
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
  // Host-side bookkeeping first, so that a failure after the runtime call cannot leak memory.
  auto seg      = std::make_unique<segment>();
  block* b      = new_block_locked();
  void* p       = nullptr;
  cudaError_t e = cudaSuccess;
  {
    device_guard<Runtime> guard{runtime_, device_};
    e =
      stream_ordered_ ? runtime_.malloc_async(&p, seg_size, stream) : runtime_.malloc(&p, seg_size);
  }
  if (e != cudaSuccess) {
    recycle_block_locked(b);
    if (e == cudaErrorMemoryAllocation) {
      oom = true;
      return nullptr;
    }
    GPUKIT_CUDA_TRY(e);
  }
  adopt_segment_locked(b, std::move(seg), p, seg_size, kind, stream, stream_ordered_, 0);
  // Indexed as a free block of `stream`, so take_locked finds it where it expects it.
  auto& sp    = stream_pool_locked(stream);
  b->free_seq = ++sp.free_seq;
  sp.index[kind].insert(b);
  return b;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::take_locked(
  block* b, std::size_t size, std::size_t bytes, stream_type stream)
{
  unindex_locked(b);
  b->state.store(detail::block_state::allocated,
                 std::memory_order_relaxed);  // before the tail merges
  if (b->size - size >= alignment) {
    // Split: the tail stays free, with b's owner.
    block* rest = split_off_locked(b, size);
    rest->state.store(detail::block_state::free, std::memory_order_relaxed);
    insert_free_locked(rest);
  }
  b->state.store(detail::block_state::allocated, std::memory_order_relaxed);
  b->requested = bytes;
  b->stream    = stream;
  b->global    = false;
  return b;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::stream_pool&
basic_caching_allocator<Runtime>::stream_pool_locked(stream_type stream)
{
  for (auto& sp : stream_pools_) {
    if (sp->stream == stream) { return *sp; }
  }
  stream_pools_.push_back(std::make_unique<stream_pool>());
  stream_pools_.back()->stream = stream;
  return *stream_pools_.back();
}

template <class Runtime>
void basic_caching_allocator<Runtime>::unindex_locked(block* b)
{
  if (b->capture_pool != 0) {
    capture_pool_locked(b->capture_pool).index[b->kind].remove(b);
  } else if (b->global) {
    global_[b->kind].remove(b);
  } else {
    stream_pool_locked(b->stream).index[b->kind].remove(b);
  }
}

// Inserts free block b (state free, owner set) into its index, merging free neighbours first.
// Returns the block that holds b's bytes now (b, or the free block before it that absorbed it).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::insert_free_locked(block* b)
{
  auto mergeable = [&](block* n) {
    if (n == nullptr || n->state.load(std::memory_order_relaxed) != detail::block_state::free) {
      return false;
    }
    if (n->capture_pool != b->capture_pool) { return false; }
    return b->capture_pool != 0 || n->global || b->global || n->stream == b->stream;
  };
  auto absorb_owner = [&](block* n) {
    if (b->global && !n->global) {
      b->global = false;
      b->stream = n->stream;
    }
    b->free_seq = std::max(b->free_seq, n->free_seq);
  };
  if (mergeable(b->prev)) {
    block* p = b->prev;
    unindex_locked(p);
    absorb_owner(p);
    // p absorbs b: keep p's address.
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) { b->next->prev = p; }
    p->stream   = b->stream;
    p->global   = b->global;
    p->free_seq = b->free_seq;
    blocks_.erase(b->address());
    recycle_block_locked(b);
    b = p;
  }
  if (mergeable(b->next)) {
    block* n = b->next;
    unindex_locked(n);
    absorb_owner(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) { n->next->prev = b; }
    blocks_.erase(n->address());
    recycle_block_locked(n);
  }
  b->state.store(detail::block_state::free, std::memory_order_relaxed);
  if (b->capture_pool != 0) {
    capture_pool_locked(b->capture_pool).index[b->kind].insert(b);
  } else if (b->global) {
    global_[b->kind].insert(b);
  } else {
    stream_pool_locked(b->stream).index[b->kind].insert(b);
  }
  return b;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::free_to_pool_locked(block* b, stream_type stream)
{
  if (b->capture_pool == 0 && captures_underway_.load(std::memory_order_relaxed) != 0) {
    // Freed on a stream being captured: the graph may use the block when it replays, so it is
    // kept for that capture's pool (reusable within it) until release_capture_pool.
    if (capture_pool* cp = active_capture_locked(stream)) { b->capture_pool = cp->id; }
  }
  if (b->capture_pool != 0) {
    b->stream = stream;
    b->global = false;
    insert_free_locked(b);
    return;
  }
  if (!forgotten_streams_.empty() && std::find(forgotten_streams_.begin(), forgotten_streams_.end(),
                                               stream) != forgotten_streams_.end()) {
    // Freed on a stream forget_stream has synchronized (a pending free completing, another
    // thread's cache flushing): its work is done, and the stream may be gone: any stream's now.
    b->stream = stream_type{};
    b->global = true;
    insert_free_locked(b);
    if (oom_waiters_ != 0) { frees_cv_.notify_all(); }
    return;
  }
  b->stream   = stream;
  b->global   = false;
  b->free_seq = ++stream_pool_locked(stream).free_seq;
  insert_free_locked(b);
  if (oom_waiters_ != 0) { frees_cv_.notify_all(); }
}

// The out-of-memory ladder: each step, then a fresh search of the pool and one more try of the
// runtime. Steps that do not apply (nothing to collect, no callbacks, ...) are recorded as such.
// Returns nullptr when every step failed; ladder_ then holds what each reclaimed (for the report).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::recover_locked(
  std::unique_lock<std::mutex>& lock, std::size_t size, int kind, stream_type stream,
  thread_cache& tc, std::vector<stream_type>& freed_on, bool capture)
{
  ladder_.assign(recovery_step_count, oom_report::step{});
  for (int i = 0; i < recovery_step_count; ++i) { ladder_[i].name = recovery_step_names[i]; }
  auto attempt = [&]() -> block* {
    if (block* b = find_free_locked(size, kind, stream)) { return b; }
    bool oom = false;
    return growable_ ? grow_locked(size, kind, stream, oom)
                     : new_segment_locked(size, kind, stream, oom);
  };
  auto count = [&](int step, std::size_t reclaimed) {
    ladder_[step].attempted = true;
    ladder_[step].bytes_reclaimed += reclaimed;
    ++pool_stats_.num_recovery_steps[step];
    pool_stats_.recovery_bytes[step] += reclaimed;
  };
  // Stream-ordered frees take effect when their stream reaches them: wait for those streams only
  // (never the whole device); then the memory is the device's again.
  auto settle = [&] {
    if (freed_on.empty() || capture) { return; }
    device_guard<Runtime> guard{runtime_, device_};
    for (stream_type fs : freed_on) {
      GPUKIT_CUDA_TRY(runtime_.stream_synchronize(fs));
      ++pool_stats_.num_release_waits;
    }
    freed_on.clear();
  };
  settle();  // segments returned just before the failed try (release_before_grow)
  if (block* b = attempt()) { return b; }

  // (1) Blocks whose cross-stream events have completed (no waiting).
  if (!capture) {
    count(step_events, poll_pending_locked() + migrate_locked(stream, false));
    flush_cache_locked(tc);
    if (block* b = attempt()) { return b; }
  }
  // (2) The user's callbacks, in order, without the pool lock (they may free memory); each may ask
  // for another try.
  if (!oom_callbacks_.empty()) {
    auto callbacks = oom_callbacks_;
    for (auto const& cb : callbacks) {
      std::size_t const free_before     = free_bytes_locked();
      std::size_t const reserved_before = reserved_;
      oom_context const ctx{size, device_, reserved_,
                            static_cast<std::size_t>(limit_.load(std::memory_order_relaxed))};
      lock.unlock();
      bool const again = cb(ctx);
      lock.lock();
      flush_cache_locked(tc);
      std::size_t const free_after = free_bytes_locked();
      count(step_callbacks, (free_after > free_before ? free_after - free_before : 0) +
                              (reserved_before > reserved_ ? reserved_before - reserved_ : 0));
      if (again) {
        if (block* b = attempt()) { return b; }
      }
    }
  }
  // (3) Cached free segments of the requesting stream, then of every stream; blocks other
  // streams freed are first made usable, waiting only on the events that guard them.
  count(step_release_stream, release_locked(0, &freed_on, -1, &stream));
  settle();
  if (block* b = attempt()) { return b; }
  for (auto& c : caches_) {
    if (c.get() != &tc) { c->flush_requested.store(true, std::memory_order_relaxed); }
  }
  std::size_t moved = capture ? 0 : migrate_locked(stream, true) + poll_pending_locked(true);
  if (moved != 0) {
    if (block* b = find_free_locked(size, kind, stream)) {
      count(step_release_all, moved);
      return b;
    }
  }
  count(step_release_all, moved + release_locked(0, &freed_on));
  settle();
  if (block* b = attempt()) { return b; }
  // Growable segments: steps 3 and 4 unmap the free pages of the streams they release.
  // (5) A bounded wait for blocks that other threads are returning to the pool.
  if (options_.oom_wait_for_frees_ms > 0) {
    std::size_t const free_before = free_bytes_locked();
    ++oom_waiters_;
    frees_cv_.wait_for(lock, std::chrono::milliseconds(options_.oom_wait_for_frees_ms));
    --oom_waiters_;
    std::size_t const free_after = free_bytes_locked();
    count(step_wait, free_after > free_before ? free_after - free_before : 0);
    if (!capture) { migrate_locked(stream, false); }
    release_locked(0, &freed_on);
    settle();
    if (block* b = attempt()) { return b; }
  }
  return nullptr;
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::free_bytes_locked() const
{
  std::size_t n = global_[0].bytes() + global_[1].bytes();
  for (auto const& sp : stream_pools_) { n += sp->index[0].bytes() + sp->index[1].bytes(); }
  return n;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::add_oom_callback(oom_callback callback)
{
  GPUKIT_EXPECTS(static_cast<bool>(callback), "add_oom_callback: the callback is empty");
  std::lock_guard<std::mutex> lock{mutex_};
  oom_callbacks_.push_back(std::move(callback));
}

// ---------------------------------------------------------------------------------------------
// Deallocation

template <class Runtime>
void basic_caching_allocator<Runtime>::deallocate_async(void* ptr, std::size_t bytes,
                                                        stream_type stream)
{
  deallocate_impl(ptr, bytes, true, stream);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::deallocate_async(void* ptr, stream_type stream)
{
  deallocate_impl(ptr, 0, false, stream);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::deallocate_impl(void* ptr, std::size_t bytes,
                                                       bool check_size, stream_type stream)
{
  if (ptr == nullptr) { return; }
  auto const key   = reinterpret_cast<std::uintptr_t>(ptr);
  thread_cache& tc = local_cache();
  block* b         = tc.handed_out.find(key);
  if (b != nullptr && (b->address() != key || b->state.load(std::memory_order_relaxed) !=
                                                detail::block_state::allocated)) {
    tc.handed_out.erase(key);  // stale: freed by another thread since
    b = nullptr;
  }
  bool const foreign = b == nullptr;  // allocated by another thread
  if (b == nullptr) {
    // Not handed out by this thread (or an error): look it up in the pool.
    std::lock_guard<std::mutex> lock{mutex_};
    b = blocks_.find(key);
    if (b != nullptr) { freed_across_threads_ = true; }  // per-thread peaks no longer bound it
    if (b == nullptr) {
      GPUKIT_EXPECTS(false, "deallocate: pointer " + detail::hex(ptr) +
                              " was not allocated by this allocator (device " +
                              std::to_string(device_) + ")");
    }
    auto const st = b->state.load(std::memory_order_relaxed);
    GPUKIT_EXPECTS(st == detail::block_state::allocated,
                   "deallocate: double free of " + detail::hex(ptr) + " (a block of " +
                     std::to_string(b->size) + " bytes that is already free, device " +
                     std::to_string(device_) + ")");
  }
  GPUKIT_EXPECTS(!check_size || bytes == b->requested,
                 "deallocate: pointer " + detail::hex(ptr) + " was allocated with " +
                   std::to_string(b->requested) + " bytes but freed with " + std::to_string(bytes));
  auto count_free = [&] {
    if (options_.nvtx_annotate) { unregister_memory_region(ptr); }
    tc.handed_out.erase(key);
    tc.allocated_bytes.add(-static_cast<std::int64_t>(b->size));
    tc.requested_bytes.add(-static_cast<std::int64_t>(b->requested));
    tc.allocation_count.add(-1);
    tc.num_frees.add(1);
  };
  if (!b->recorded.empty()) {
    // Used on other streams too: reusable once the work queued there up to now has completed.
    std::lock_guard<std::mutex> lock{mutex_};
    pending_free pf;
    pf.b      = b;
    pf.stream = stream;
    device_guard<Runtime> guard{runtime_, device_};
    for (stream_type s : b->recorded) {
      if (s == stream) { continue; }
      event_type e        = take_event_locked();
      cudaError_t const r = runtime_.event_record(e, s);
      if (r != cudaSuccess) {  // the block stays allocated, as if this call had not been made
        spare_events_.push_back(e);
        spare_events_.insert(spare_events_.end(), pf.events.begin(), pf.events.end());
        GPUKIT_CUDA_TRY(r);
      }
      pf.events.push_back(e);
    }
    count_free();
    if (recording_.load(std::memory_order_relaxed)) {
      record(tc, memory_event::action::free, b, stream);
    }
    b->recorded.clear();
    b->state.store(detail::block_state::pending, std::memory_order_relaxed);
    pending_.push_back(std::move(pf));
    return;
  }
  count_free();
  if (recording_.load(std::memory_order_relaxed)) {
    record(tc, memory_event::action::free, b, stream);
  }
  b->state.store(detail::block_state::cached, std::memory_order_relaxed);
  // A block another thread allocated goes back to the pool, not to this thread's cache: a thread
  // that frees what others allocate (PyTorch's autograd threads) would otherwise strand it.
  if (!foreign && b->size <= options_.thread_cache_max_block_bytes && b->capture_pool == 0 &&
      captures_underway_.load(std::memory_order_relaxed) == 0 &&
      tc.push(stream, b, options_.thread_cache_blocks_per_class, options_.thread_cache_bytes)) {
    return;
  }
  std::lock_guard<std::mutex> lock{mutex_};
  if (!forgotten_streams_.empty()) {  // a user's free on it: a live stream (a reused handle)
    forgotten_streams_.erase(
      std::remove(forgotten_streams_.begin(), forgotten_streams_.end(), stream),
      forgotten_streams_.end());
  }
  free_to_pool_locked(b, stream);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::record_stream(void* ptr, stream_type stream)
{
  auto const key = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock{mutex_};
  check_stream_locked(stream, "record_stream");
  block* b = blocks_.find(key);
  GPUKIT_EXPECTS(
    b != nullptr && b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
    "record_stream: pointer " + detail::hex(ptr) +
      " is not currently allocated by this allocator (device " + std::to_string(device_) + ")");
  if (stream == b->stream) { return; }
  if (std::find(b->recorded.begin(), b->recorded.end(), stream) == b->recorded.end()) {
    b->recorded.push_back(stream);
  }
}

// Moves pending frees whose events have all completed into their stream's pool.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::poll_pending_locked(bool wait)
{
  std::size_t moved = 0;
  for (std::size_t i = 0; i < pending_.size();) {
    auto& pf  = pending_[i];
    bool done = true;
    for (event_type e : pf.events) {
      cudaError_t const q = wait ? runtime_.event_synchronize(e) : runtime_.event_query(e);
      if (q == cudaErrorNotReady) {
        done = false;
        break;
      }
      GPUKIT_CUDA_TRY(q);
    }
    if (!done) {
      ++i;
      continue;
    }
    for (event_type e : pf.events) { spare_events_.push_back(e); }
    moved += pf.b->size;
    if (pf.to_global) {
      pf.b->stream = stream_type{};
      pf.b->global = true;
      insert_free_locked(pf.b);
    } else {
      free_to_pool_locked(pf.b, pf.stream);
    }
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
  return moved;
}

// Makes free blocks of other streams usable by any stream: one event per stream that holds free
// blocks, recorded when first needed; once it completes, the blocks that stream had freed before
// the event move to the global pool. With `wait`, blocks until those events complete.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::migrate_locked(stream_type requester, bool wait)
{
  std::size_t moved = 0;
  device_guard<Runtime> guard{runtime_, device_};
  for (auto& sp : stream_pools_) {
    if (sp->stream == requester || (sp->index[0].empty() && sp->index[1].empty())) { continue; }
    if (!sp->migrating) {
      event_type e        = take_event_locked();
      cudaError_t const r = runtime_.event_record(e, sp->stream);
      if (r != cudaSuccess) { spare_events_.push_back(e); }
      GPUKIT_CUDA_TRY(r);
      sp->migration_event = e;
      sp->migration_seq   = sp->free_seq;
      sp->migrating       = true;
      ++pool_stats_.num_cross_stream_events;
    }
    cudaError_t const q = wait ? runtime_.event_synchronize(sp->migration_event)
                               : runtime_.event_query(sp->migration_event);
    if (q == cudaErrorNotReady) { continue; }
    GPUKIT_CUDA_TRY(q);
    spare_events_.push_back(sp->migration_event);
    sp->migrating = false;
    std::vector<block*> movers;
    for (auto& idx : sp->index) {
      idx.for_each([&](block* b) {
        if (b->free_seq <= sp->migration_seq) { movers.push_back(b); }
      });
    }
    // Take them all out first (marked so that no merge sees them), then insert each, merging.
    for (block* b : movers) {
      sp->index[b->kind].remove(b);
      b->global = true;
      b->state.store(detail::block_state::pending, std::memory_order_relaxed);
    }
    for (block* b : movers) {
      moved += b->size;
      insert_free_locked(b);
    }
  }
  return moved;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::forget_stream(stream_type stream)
{
  thread_cache& tc = local_cache();
  std::lock_guard<std::mutex> lock{mutex_};
  flush_cache_locked(tc);
  // CUDA may hand the handle of a destroyed stream to a new one: check it again then.
  checked_streams_.erase(std::remove(checked_streams_.begin(), checked_streams_.end(), stream),
                         checked_streams_.end());
  auto remember = [&] {
    // Blocks that still come back on it (other threads' cached blocks) go to every stream, never
    // to a pool of this stream, which may be destroyed by then.
    if (stream == stream_type{} || std::find(forgotten_streams_.begin(), forgotten_streams_.end(),
                                             stream) != forgotten_streams_.end()) {
      return;
    }
    if (forgotten_streams_.size() >= 256) { forgotten_streams_.erase(forgotten_streams_.begin()); }
    forgotten_streams_.push_back(stream);
  };
  auto it                 = std::find_if(stream_pools_.begin(), stream_pools_.end(),
                                         [&](auto const& sp) { return sp->stream == stream; });
  bool const pending_here = std::any_of(
    pending_.begin(), pending_.end(), [&](pending_free const& pf) { return pf.stream == stream; });
  if (it == stream_pools_.end() && !pending_here) {
    remember();
    return;
  }
  device_guard<Runtime> guard{runtime_, device_};
  GPUKIT_CUDA_TRY(runtime_.stream_synchronize(stream));  // the work queued on it so far
  // Frees on it still waiting for other streams' events: every stream's once those complete.
  for (auto& pf : pending_) {
    if (pf.stream == stream) {
      pf.stream    = stream_type{};
      pf.to_global = true;
    }
  }
  if (it != stream_pools_.end()) {
    stream_pool& sp = **it;
    if (sp.migrating) { spare_events_.push_back(sp.migration_event); }  // complete now
    std::vector<block*> movers;
    for (auto& idx : sp.index) {
      idx.for_each([&](block* b) { movers.push_back(b); });
    }
    for (block* b : movers) {
      sp.index[b->kind].remove(b);
      b->global = true;
      b->state.store(detail::block_state::pending, std::memory_order_relaxed);
    }
    for (block* b : movers) { insert_free_locked(b); }
    stream_pools_.erase(it);
  }
  remember();
}

template <class Runtime>
void basic_caching_allocator<Runtime>::flush_cache_locked(thread_cache& tc)
{
  tc.flush_requested.store(false, std::memory_order_relaxed);
  tc.drain([&](stream_type s, block* b) { free_to_pool_locked(b, s); });
  if (oom_waiters_ != 0) { frees_cv_.notify_all(); }
}

template <class Runtime>
void basic_caching_allocator<Runtime>::flush_cache(thread_cache& tc)
{
  std::lock_guard<std::mutex> lock{mutex_};
  flush_cache_locked(tc);
}

// ---------------------------------------------------------------------------------------------
// Release

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release()
{
  return trim(0);
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::trim(std::size_t target_reserved_bytes)
{
  thread_cache& tc = local_cache();
  std::lock_guard<std::mutex> lock{mutex_};
  flush_cache_locked(tc);
  for (auto& c : caches_) {
    if (c.get() != &tc) { c->flush_requested.store(true, std::memory_order_relaxed); }
  }
  if (captures_underway_.load(std::memory_order_relaxed) == 0) { poll_pending_locked(); }
  return release_locked(target_reserved_bytes);
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release_locked(std::size_t target,
                                                             std::vector<stream_type>* freed_on,
                                                             int only_kind,
                                                             stream_type const* only_stream)
{
  std::size_t released = 0;
  if (growable_ && only_kind < 0) { released += release_growable_locked(target, only_stream); }
  std::vector<block*> whole;  // free blocks that span their segment
  auto collect = [&](block* b) {
    if (b->prev == nullptr && b->next == nullptr && b->capture_pool == 0 &&
        !static_cast<segment*>(b->segment)->growable && (only_kind < 0 || b->kind == only_kind)) {
      whole.push_back(b);
    }
  };
  for (auto& sp : stream_pools_) {
    if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
    for (auto& idx : sp->index) { idx.for_each(collect); }
  }
  if (only_stream == nullptr) {
    for (auto& idx : global_) { idx.for_each(collect); }
  }
  std::sort(whole.begin(), whole.end(), [](block* a, block* b) { return a->size > b->size; });
  device_guard<Runtime> guard{runtime_, device_};
  for (block* b : whole) {
    if (reserved_ <= target) { break; }
    auto* seg = static_cast<segment*>(b->segment);
    // Stream-ordered: freed in the order of the stream that last used it, so no wait at all.
    stream_type const on = b->global ? stream_type{} : b->stream;
    cudaError_t const e =
      seg->stream_ordered ? runtime_.free_async(seg->ptr, on) : runtime_.free(seg->ptr);
    GPUKIT_CUDA_TRY(e);
    if (seg->stream_ordered && freed_on != nullptr &&
        std::find(freed_on->begin(), freed_on->end(), on) == freed_on->end()) {
      freed_on->push_back(on);
    }
    if (!seg->stream_ordered) { ++pool_stats_.synchronizing_frees; }
    record_pool_locked(memory_event::action::segment_free, b->address(), seg->size, on);
    if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }
    unindex_locked(b);
    blocks_.erase(b->address());
    recycle_block_locked(b);
    reserved_ -= seg->size;
    released += seg->size;
    --segments_;
    ++pool_stats_.num_device_frees;
    delete seg;
  }
  return released;
}

// ---------------------------------------------------------------------------------------------
// Descriptors and events

template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::new_block_locked()
{
  if (spare_blocks_ == nullptr) {
    constexpr std::size_t chunk = 256;
    block_chunks_.push_back(std::unique_ptr<block[]>(new block[chunk]));
    block* blocks = block_chunks_.back().get();
    for (std::size_t i = 0; i < chunk; ++i) {
      blocks[i].free_next = spare_blocks_;
      spare_blocks_       = &blocks[i];
    }
  }
  block* b        = spare_blocks_;
  spare_blocks_   = b->free_next;
  b->free_next    = nullptr;
  b->capture_pool = 0;
  b->recorded.clear();
  return b;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::recycle_block_locked(block* b)
{
  b->state.store(detail::block_state::dead, std::memory_order_relaxed);
  b->ptr.store(0, std::memory_order_relaxed);
  b->prev = b->next = nullptr;
  b->free_prev      = nullptr;
  b->free_next      = spare_blocks_;
  spare_blocks_     = b;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::event_type
basic_caching_allocator<Runtime>::take_event_locked()
{
  if (!spare_events_.empty()) {
    event_type e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  event_type e{};
  GPUKIT_CUDA_TRY(runtime_.event_create(e, false));
  return e;
}

// ---------------------------------------------------------------------------------------------
// Statistics

template <class Runtime>
void basic_caching_allocator<Runtime>::update_peaks_locked() const
{
  // Current values are the sums over threads. A peak is the highest of: the sums seen here (when
  // statistics are read, on every allocation that takes the pool lock, at out-of-memory and
  // reset_peak) and, while every block has been freed by the thread that allocated it, each
  // thread's own peak (exact when a single thread allocates, a lower bound otherwise). Once a
  // block is freed by another thread (as PyTorch's autograd threads do), a thread's own count can
  // exceed the total, so its peak is no longer used. Reserved and segment peaks are exact: they
  // are raised where segments are taken.
  std::int64_t allocated = 0, requested = 0, count = 0;
  std::int64_t allocated_peak = 0, requested_peak = 0, count_peak = 0;
  for (auto const& c : caches_) {
    allocated += c->allocated_bytes.get();
    requested += c->requested_bytes.get();
    count += c->allocation_count.get();
    allocated_peak = std::max(allocated_peak, c->allocated_bytes.peak.get());
    requested_peak = std::max(requested_peak, c->requested_bytes.peak.get());
    count_peak     = std::max(count_peak, c->allocation_count.peak.get());
  }
  auto bump = [](stat_pair& s, std::int64_t v, std::int64_t thread_peak = 0) {
    s.current = v;
    s.peak    = std::max({s.peak, v, thread_peak});
  };
  if (freed_across_threads_) { allocated_peak = requested_peak = count_peak = 0; }
  bump(pool_stats_.allocated_bytes, allocated, allocated_peak);
  bump(pool_stats_.requested_bytes, requested, requested_peak);
  bump(pool_stats_.allocation_count, count, count_peak);
  bump(pool_stats_.reserved_bytes, static_cast<std::int64_t>(reserved_));
  bump(pool_stats_.segment_count, static_cast<std::int64_t>(segments_));
}

template <class Runtime>
caching_allocator_stats basic_caching_allocator<Runtime>::stats() const
{
  std::lock_guard<std::mutex> lock{mutex_};
  update_peaks_locked();
  caching_allocator_stats s  = pool_stats_;
  std::int64_t pending_bytes = 0, pending_count = 0, split_bytes = 0, split_count = 0;
  for (auto const& p : pending_) {
    pending_bytes += static_cast<std::int64_t>(p.b->size);
    ++pending_count;
  }
  auto split = [&](block* b) {
    if (b->prev != nullptr || b->next != nullptr) {
      split_bytes += static_cast<std::int64_t>(b->size);
      ++split_count;
    }
  };
  for (auto const& sp : stream_pools_) {
    for (auto const& idx : sp->index) { idx.for_each(split); }
  }
  for (auto const& idx : global_) { idx.for_each(split); }
  for (auto const& c : caches_) {
    s.cached_bytes += c->cached_bytes.get();
    s.num_allocs += static_cast<std::uint64_t>(c->num_allocs.get());
    s.num_frees += static_cast<std::uint64_t>(c->num_frees.get());
    s.num_cache_hits += static_cast<std::uint64_t>(c->num_cache_hits.get());
  }
  auto bump = [](stat_pair& st, stat_pair& keep, std::int64_t v) {
    st.current = v;
    keep.peak  = std::max(keep.peak, v);
    st.peak    = keep.peak;
  };
  bump(s.active_bytes, pool_stats_.active_bytes, s.allocated_bytes.current + pending_bytes);
  bump(s.active_count, pool_stats_.active_count, s.allocation_count.current + pending_count);
  bump(s.inactive_split_bytes, pool_stats_.inactive_split_bytes, split_bytes);
  bump(s.inactive_split_count, pool_stats_.inactive_split_count, split_count);
  return s;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::reset_peak()
{
  std::lock_guard<std::mutex> lock{mutex_};
  update_peaks_locked();
  for (auto& c : caches_) {  // the owners write these too: a relaxed store races benignly
    c->allocated_bytes.peak.v.store(c->allocated_bytes.get(), std::memory_order_relaxed);
    c->requested_bytes.peak.v.store(c->requested_bytes.get(), std::memory_order_relaxed);
    c->allocation_count.peak.v.store(c->allocation_count.get(), std::memory_order_relaxed);
  }
  for (stat_pair* p :
       {&pool_stats_.allocated_bytes, &pool_stats_.requested_bytes, &pool_stats_.reserved_bytes,
        &pool_stats_.active_bytes, &pool_stats_.inactive_split_bytes, &pool_stats_.allocation_count,
        &pool_stats_.segment_count, &pool_stats_.active_count, &pool_stats_.inactive_split_count}) {
    p->peak = p->current;
  }
}

template <class Runtime>
void basic_caching_allocator<Runtime>::throw_oom_locked(std::size_t bytes, std::size_t size)
{
  ++pool_stats_.num_ooms;
  record_pool_locked(memory_event::action::oom, 0, size, stream_type{});
  update_peaks_locked();
  oom_report r;
  r.requested = bytes;
  r.device    = device_;
  {
    device_guard<Runtime> guard{runtime_, device_};
    (void)runtime_.mem_get_info(r.device_free, r.device_total);
  }
  r.allocated = static_cast<std::size_t>(pool_stats_.allocated_bytes.current);
  r.reserved  = reserved_;
  r.limit     = limit_.load(std::memory_order_relaxed);
  for (auto const& sp : stream_pools_) {
    std::size_t const cached = sp->index[0].bytes() + sp->index[1].bytes();
    r.total_free_in_pool += cached;
    r.largest_free_block =
      std::max({r.largest_free_block, sp->index[0].largest(), sp->index[1].largest()});
    if (cached != 0) {
      std::uintptr_t id = 0;
      std::memcpy(&id, &sp->stream, std::min(sizeof id, sizeof sp->stream));
      r.cached_per_stream.push_back({id, cached});
    }
  }
  for (auto const& idx : global_) {
    r.total_free_in_pool += idx.bytes();
    r.largest_free_block = std::max(r.largest_free_block, idx.largest());
  }
  r.steps = ladder_;
  if (r.limit != 0 && reserved_ + size > r.limit) {
    r.hint =
      "the allocator's limit (" + std::to_string(r.limit) +
      " bytes) stops this allocation; raise it with set_limit() or free tensors you no longer need";
  } else if (r.total_free_in_pool >= size) {
    r.hint =
      "enough memory is free in the pool but no free block is large enough (fragmentation); "
      "growable segments (virtual memory) or fewer distinct block sizes would make it fit";
  } else {
    r.hint = "reduce the batch size or the memory held by live tensors; " +
             std::to_string(r.allocated) + " bytes are allocated by users";
  }
  throw out_of_memory{std::move(r)};
}

// ---------------------------------------------------------------------------------------------
// Graph capture

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_id
basic_caching_allocator<Runtime>::begin_capture(stream_type stream)
{
  std::lock_guard<std::mutex> lock{mutex_};
  GPUKIT_EXPECTS(active_capture_locked(stream) == nullptr,
                 "begin_capture: the stream already has a capture under way on this allocator");
  capture_pools_.push_back(std::make_unique<capture_pool>());
  capture_pools_.back()->id     = next_capture_id_++;
  capture_pools_.back()->stream = stream;
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
  return capture_pools_.back()->id;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::resume_capture(stream_type stream, capture_id id)
{
  std::lock_guard<std::mutex> lock{mutex_};
  GPUKIT_EXPECTS(active_capture_locked(stream) == nullptr,
                 "resume_capture: the stream already has a capture under way on this allocator");
  capture_pool& cp = capture_pool_locked(id);
  GPUKIT_EXPECTS(!cp.active, "resume_capture: capture pool " + std::to_string(id) + " is in use");
  cp.active = true;
  cp.stream = stream;
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::end_capture(stream_type stream)
{
  std::lock_guard<std::mutex> lock{mutex_};
  capture_pool* cp = active_capture_locked(stream);
  GPUKIT_EXPECTS(cp != nullptr, "end_capture: no capture is under way on this stream");
  cp->active = false;
  captures_underway_.fetch_sub(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::release_capture_pool(capture_id id)
{
  std::lock_guard<std::mutex> lock{mutex_};
  auto it = std::find_if(capture_pools_.begin(), capture_pools_.end(),
                         [&](auto const& cp) { return cp->id == id; });
  GPUKIT_EXPECTS(it != capture_pools_.end(),
                 "release_capture_pool: no capture pool " + std::to_string(id));
  GPUKIT_EXPECTS(!(*it)->active,
                 "release_capture_pool: capture " + std::to_string(id) + " has not ended");
  // Free blocks become ordinary free blocks of every stream (the graph is gone and its launches
  // done, by the caller's word); blocks still allocated become ordinary blocks when freed.
  std::vector<block*> movers;
  for (auto& idx : (*it)->index) {
    idx.for_each([&](block* b) { movers.push_back(b); });
  }
  for (block* b : movers) {
    (*it)->index[b->kind].remove(b);
    b->state.store(detail::block_state::pending, std::memory_order_relaxed);
  }
  blocks_.for_each([&](std::uintptr_t, block* b) {
    if (b->capture_pool == id) { b->capture_pool = 0; }
  });
  for (block* b : movers) {
    b->global = true;
    insert_free_locked(b);
  }
  capture_pools_.erase(it);
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_pool*
basic_caching_allocator<Runtime>::active_capture_locked(stream_type stream)
{
  for (auto& cp : capture_pools_) {
    if (cp->active && cp->stream == stream) { return cp.get(); }
  }
  return nullptr;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_pool&
basic_caching_allocator<Runtime>::capture_pool_locked(capture_id id)
{
  for (auto& cp : capture_pools_) {
    if (cp->id == id) { return *cp; }
  }
  GPUKIT_EXPECTS(false, "caching_allocator: capture pool " + std::to_string(id) + " is gone");
  return *capture_pools_.front();  // not reached
}

// During capture: blocks come from the capture's private pool; new segments from a synchronous
// malloc made in relaxed capture mode (legal during capture, and not part of the graph).
template <class Runtime>
void* basic_caching_allocator<Runtime>::allocate_captured_locked(std::size_t bytes,
                                                                 std::size_t size, int kind,
                                                                 capture_pool& cp, thread_cache& tc)
{
  block* b = cp.index[kind].find(size);
  if (b == nullptr) {
    std::size_t const seg_size = segment_size_for(size);
    std::size_t const limit    = limit_.load(std::memory_order_relaxed);
    if (limit != 0 && reserved_ + seg_size > limit) { throw_oom_locked(bytes, size); }
    auto seg      = std::make_unique<segment>();
    block* nb     = new_block_locked();
    void* p       = nullptr;
    cudaError_t e = cudaSuccess;
    {
      device_guard<Runtime> guard{runtime_, device_};
      int mode = cudaStreamCaptureModeRelaxed;
      GPUKIT_CUDA_TRY(runtime_.exchange_capture_mode(mode));
      e = runtime_.malloc(&p, seg_size);
      (void)runtime_.exchange_capture_mode(mode);
    }
    if (e != cudaSuccess) {
      recycle_block_locked(nb);
      if (e == cudaErrorMemoryAllocation) { throw_oom_locked(bytes, size); }
      GPUKIT_CUDA_TRY(e);
    }
    adopt_segment_locked(nb, std::move(seg), p, seg_size, kind, cp.stream, false, cp.id);
    cp.index[kind].insert(nb);
    b = nb;
  }
  return hand_out(tc, take_locked(b, size, bytes, cp.stream), bytes, cp.stream);
}

// ---------------------------------------------------------------------------------------------
// Extent of a block (interprocess export, gpukit/memory/ipc.hpp)

template <class Runtime>
typename basic_caching_allocator<Runtime>::block_extent basic_caching_allocator<Runtime>::extent(
  void const* ptr) const
{
  std::lock_guard<std::mutex> lock{mutex_};
  block const* b = blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
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

// ---------------------------------------------------------------------------------------------
// Invariants (tests)

template <class Runtime>
std::string basic_caching_allocator<Runtime>::check_invariants() const
{
  std::lock_guard<std::mutex> lock{mutex_};
  std::string err;
  std::size_t seg_bytes = 0, seg_count = 0, blocks = 0, indexed_bytes = 0;
  blocks_.for_each([&](std::uintptr_t key, block* b) {
    ++blocks;
    if (b->address() != key) { err += "block key mismatch; "; }
    if (b->prev == nullptr) {
      auto* seg = static_cast<segment*>(b->segment);
      if (seg == nullptr || reinterpret_cast<std::uintptr_t>(seg->ptr) != key) {
        err += "segment head mismatch; ";
      }
      std::size_t total = 0;
      for (block* x = b; x != nullptr; x = x->next) {
        if (x->next != nullptr && x->address() + x->size != x->next->address()) {
          err += "blocks do not tile; ";
        }
        if (x->next != nullptr && x->next->prev != x) { err += "broken prev link; "; }
        if (x->segment != b->segment) { err += "block in the wrong segment; "; }
        if (blocks_.find(x->address()) != x) { err += "block missing from the map; "; }
        auto const st = x->state.load(std::memory_order_relaxed);
        if (st == detail::block_state::free && x->next != nullptr &&
            x->next->state.load(std::memory_order_relaxed) == detail::block_state::free &&
            (x->global || x->next->global || x->stream == x->next->stream)) {
          err += "mergeable neighbours left unmerged; ";
        }
        if (st == detail::block_state::dead) { err += "dead block in a segment; "; }
        if (seg->growable) {
          // Blocks in use or free lie on mapped pages; unmapped ones are page-aligned, unindexed
          // ranges, each listed once, never next to another.
          auto const off    = x->address() - reinterpret_cast<std::uintptr_t>(seg->ptr);
          std::size_t first = off / seg->page, last = (off + x->size - 1) / seg->page;
          if (st == detail::block_state::unmapped) {
            if (off % seg->page != 0 || x->size % seg->page != 0) {
              err += "unmapped block not page-aligned; ";
            }
            if (x->next != nullptr &&
                x->next->state.load(std::memory_order_relaxed) == detail::block_state::unmapped) {
              err += "unmapped neighbours left unmerged; ";
            }
            auto const& list = unmapped_[x->kind];
            if (std::count(list.begin(), list.end(), x) != 1) {
              err += "unmapped block not listed once; ";
            }
          } else {
            for (std::size_t i = first; i <= last && i < seg->mapped.size(); ++i) {
              if (seg->mapped[i] == 0) {
                err += "block on an unmapped page; ";
                break;
              }
            }
          }
        }
        total += x->size;
      }
      if (total != seg->size) { err += "segment size mismatch; "; }
      if (seg->growable) {
        std::size_t n = 0;
        for (auto m : seg->mapped) { n += m; }
        if (n != seg->mapped_pages) { err += "mapped page count mismatch; "; }
        seg_bytes += seg->mapped_pages * seg->page;
      } else {
        seg_bytes += seg->size;
      }
      ++seg_count;
    }
  });
  auto count_index = [&](detail::tlsf_index<block> const& idx, bool global, stream_type s) {
    idx.for_each([&](block* b) {
      indexed_bytes += b->size;
      if (b->state.load(std::memory_order_relaxed) != detail::block_state::free) {
        err += "indexed block not free; ";
      }
      if (b->capture_pool != 0 || b->global != global || (!global && !(b->stream == s))) {
        err += "block in the wrong index; ";
      }
    });
  };
  for (auto const& sp : stream_pools_) {
    for (auto const& idx : sp->index) { count_index(idx, false, sp->stream); }
  }
  for (auto const& idx : global_) { count_index(idx, true, stream_type{}); }
  for (auto const& cp : capture_pools_) {
    for (auto const& idx : cp->index) {
      idx.for_each([&](block* b) {
        indexed_bytes += b->size;
        if (b->capture_pool != cp->id) { err += "block in the wrong capture pool; "; }
        if (b->state.load(std::memory_order_relaxed) != detail::block_state::free) {
          err += "indexed block not free; ";
        }
      });
    }
  }
  std::size_t free_blocks_bytes = 0;
  blocks_.for_each([&](std::uintptr_t, block* b) {
    if (b->state.load(std::memory_order_relaxed) == detail::block_state::free) {
      free_blocks_bytes += b->size;
    }
  });
  if (free_blocks_bytes != indexed_bytes) { err += "free blocks and indices disagree; "; }
  for (int k = 0; k < 2; ++k) { seg_bytes += spare_pages_[k].size() * page_bytes_[k]; }
  if (seg_bytes != reserved_) {
    err +=
      "reserved " + std::to_string(reserved_) + " != segments " + std::to_string(seg_bytes) + "; ";
  }
  if (seg_count != segments_) { err += "segment count mismatch; "; }
  return err;
}

}  // namespace gpukit
