// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/thread_cache_front.hpp: the per-thread caches in front of the
// caching allocator's pool, and the thread-local registry that finds a thread's cache. Not public
// API.
//
// Each thread keeps, per allocator, one caching_thread_cache: short LIFO lists of freed blocks by
// size class for a few streams, the map of the blocks it handed out, its own statistics counters
// (one writer, no read-modify-write) and its ring of recorded events. A thread-local registry
// (tls_registry) finds a thread's cache for an allocator, the last one used first; a thread that
// exits returns its cached blocks to the pool and leaves its cache, counters intact, for the next
// thread. A cache takes blocks up to thread_cache_max_block_bytes; a thread that finds the pool
// lock held by another on its slow path takes larger ones, up to
// thread_cache_contended_max_block_bytes, until it meets no contention for a while
// (note_pool_lock).
//
// Owns: every cache of one allocator (thread_cache_front::caches()) and the allocator's
// registration: its uid, alive in live_allocators from construction to leave(). Invariants:
// - A cache belongs to one thread at a time: the thread whose registry holds it, or none
//   (orphaned, after its thread exited), until a new thread adopts it. Only its thread touches its
//   lists, so a hit (local, then the cache's pop or push) takes no lock and no atomic
//   read-modify-write.
// - A registry calls a cache's exit only while its allocator is alive (its uid in
//   live_allocators); uids are never reused.
// - A drained cache holds no block and no cached bytes; its blocks went to the pool.
//
// Single-threaded but for local() and push(), which a thread calls without the lock on its own
// cache. The allocator holds the front under its pool lock; what the front needs of the pool
// comes as `pool`, which the allocator builds at the call (basic_caching_allocator::
// front_operations), and which provides:
//   locked(f)                     runs f() under the pool lock (local_slow, flush, a thread exit)
//   free_to_pool(b, stream)       a drained block back to the pool, freed on `stream`
//   wake_waiters()                tells allocations waiting for frees that blocks came back
//   share_counts(caches)          a second thread came in: the shared counts, if not on yet
//   join_counts(cache)            a thread exits: its counts into the shared ones, when they are
//                                 on (joining them, or folding its whole delta)
//   context() -> void*            what the registry keeps to rebuild the pool at a thread's exit
//   Pool::of(context) -> Pool     rebuilds it
#pragma once

#include <gpukit/memory/caching_allocator_options.hpp>
#include <gpukit/memory/detail/address_map.hpp>
#include <gpukit/memory/detail/caching/event_ring.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/detail/shared_counts.hpp>
#include <gpukit/memory/detail/tlsf_index.hpp>
#include <gpukit/memory/memory_history.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace gpukit::detail {

// ---------------------------------------------------------------------------------------------
// Thread-local registry: which thread cache this thread uses for which allocator.

struct tls_entry {
  std::uint64_t uid{0};
  void* context{nullptr};  // what the allocator's front rebuilds its pool from at a thread's exit
  void* cache{nullptr};
  void (*on_exit)(void* context, void* cache){nullptr};
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
      if (live.uids.count(e.uid) != 0) { e.on_exit(e.context, e.cache); }
    }
  }
  static tls_registry& get()
  {
    thread_local tls_registry r;
    return r;
  }
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
    tlsf_table<block*, tlsf_class_count> lists{};
    tlsf_table<std::uint8_t, tlsf_class_count> counts{};
    // Bit c set: lists[c] holds a block. A drain visits these classes alone, not every class.
    std::array<std::uint64_t, (tlsf_class_count + 63) / 64> held{};
  };

  // Counters written by the owner thread only (relaxed load + store, no read-modify-write), read
  // by stats(). Each cache is its own allocation, so no two threads write one cache line.
  struct counter {
    std::atomic<std::int64_t> v{0};
    __attribute__((always_inline)) void add(std::int64_t d) noexcept
    {
      v.store(v.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
    }
    [[nodiscard]] __attribute__((always_inline)) std::int64_t get() const noexcept
    {
      return v.load(std::memory_order_relaxed);
    }
  };

  /// A block for `size` bytes on `stream`, or nullptr. `small`: the small pool's largest block
  /// (the allocator's small_request_bytes): a request of at most that is never served by a block
  /// above it, which a thread that meets contention may cache (the pools' blocks and counts stay
  /// apart).
  block* pop(stream_type stream, std::size_t size,
             std::size_t small = static_cast<std::size_t>(-1)) noexcept
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
    if (b->size > small && size <= small) { return nullptr; }
    s->lists[c] = b->free_next;
    if (--s->counts[c] == 0) { s->held[held_word(c)] &= ~held_bit(c); }
    cached_bytes.add(-static_cast<std::int64_t>(b->size));
    return b;
  }

  /// Keeps `b` for reuse on `stream`; false when there is no room. Part of the free's fast path
  /// (through thread_cache_front::push), where the compiler inlines it.
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
    s->held[held_word(c)] |= held_bit(c);
    cached_bytes.add(static_cast<std::int64_t>(b->size));
    return true;
  }

  /// Takes out the smallest cached block of `stream` that holds `size` bytes by itself and
  /// belongs to the pool `kind`, or nullptr: the slow path gives it back to the pool, which splits
  /// it, where a drain would give back every block.
  block* take_fitting(stream_type stream, std::size_t size, int kind) noexcept
  {
    slot* s = find(stream);
    if (s == nullptr) { return nullptr; }
    for (int c = next_held(*s, tlsf_ceil_class(size)); c >= 0; c = next_held(*s, c + 1)) {
      for (block** link = &s->lists[c]; *link != nullptr; link = &(*link)->free_next) {
        block* b = *link;
        if (b->kind != kind) { continue; }
        *link = b->free_next;
        if (--s->counts[c] == 0) { s->held[held_word(c)] &= ~held_bit(c); }
        cached_bytes.add(-static_cast<std::int64_t>(b->size));
        return b;
      }
    }
    return nullptr;
  }

  /// The first class at or above `from` whose list holds a block, or -1.
  static int next_held(slot const& s, int from) noexcept
  {
    if (from >= tlsf_class_count) { return -1; }
    std::size_t w      = held_word(from);
    std::uint64_t bits = s.held[w] & ~(held_bit(from) - 1);
    while (bits == 0) {
      if (++w == s.held.size()) { return -1; }
      bits = s.held[w];
    }
    return static_cast<int>(w * 64 + static_cast<std::size_t>(__builtin_ctzll(bits)));
  }

  static std::size_t held_word(int c) noexcept { return static_cast<std::size_t>(c) / 64; }
  static std::uint64_t held_bit(int c) noexcept
  {
    return std::uint64_t{1} << (static_cast<unsigned>(c) % 64U);
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
      for (std::size_t w = 0; w < s.held.size(); ++w) {
        for (std::uint64_t bits = s.held[w]; bits != 0; bits &= bits - 1) {
          auto const c = static_cast<int>(w * 64 + static_cast<std::size_t>(__builtin_ctzll(bits)));
          for (block* b = s.lists[c]; b != nullptr;) {
            block* next = b->free_next;
            f(s.stream, b);
            b = next;
          }
          s.lists[c]  = nullptr;
          s.counts[c] = 0;
        }
        s.held[w] = 0;
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
  stream_type checked_stream{};   // the last stream this thread's free checked (device, liveness)
  // Blocks other threads freed stay in handed_out until their address comes back: when it holds
  // more than this, those entries are dropped (amortized: the bound doubles with what stays).
  std::size_t purge_at{4096};
  std::atomic<bool> flush_requested{false};
  // The largest block this thread caches once it has found the pool lock taken (0: not raised;
  // the options' thread_cache_max_block_bytes holds). Read and written by its thread only (see
  // thread_cache_front::note_pool_lock).
  std::size_t raised_admission{0};
  std::uint32_t calm_locks{0};  // slow paths in a row that found the pool lock free
  bool orphaned{false};         // guarded by the allocator's mutex
  // The shared counts (detail::shared_counts): whether this cache's own counts are in them, and
  // its counts when they were switched on (written then, under the allocator's lock).
  bool joined{false};
  std::int64_t join_bytes[2]{}, join_requested[2]{}, join_count[2]{};
  // Once joined: what of its net values, by pool kind, this cache has folded into the shared
  // counts (written by its owner only; the rest is its unfolded delta, in [0, batch]).
  std::array<kind_counts, 2> folded{};

  /// What this thread handed out (`in`) and took back (`out`) of one pool kind: totals that only
  /// grow, so a current value is their difference and PyTorch's allocated/freed totals are free.
  struct pool_flows {
    counter bytes_in, bytes_out, requested_in, requested_out, allocs, frees;
    counter peak_bytes, peak_requested, peak_count;  // of this thread's net values
    counter peak_active_bytes, peak_active_count;    // net values plus the pending frees
    // Inlined always: the allocation's fast path reads them (count_alloc), and the compiler's
    // own choice left them out of line there.
    [[nodiscard]] __attribute__((always_inline)) std::int64_t bytes() const noexcept
    {
      return bytes_in.get() - bytes_out.get();
    }
    [[nodiscard]] __attribute__((always_inline)) std::int64_t requested() const noexcept
    {
      return requested_in.get() - requested_out.get();
    }
    [[nodiscard]] __attribute__((always_inline)) std::int64_t count() const noexcept
    {
      return allocs.get() - frees.get();
    }
    [[nodiscard]] __attribute__((always_inline)) kind_counts net() const noexcept
    {
      return {bytes(), requested(), count()};
    }
  };

  /// Raises `peak` to `now` (one writer: a load and, rarely, a store).
  __attribute__((always_inline)) static void raise(counter& peak, std::int64_t now) noexcept
  {
    if (now > peak.get()) { peak.v.store(now, std::memory_order_relaxed); }
  }

  /// A block of `size` bytes (`requested` asked) of pool `kind` went to this thread's caller;
  /// `pending` holds the bytes and blocks of each pool kind whose frees wait on other streams
  /// (still active). The peaks are the allocator's while this is its only thread.
  __attribute__((always_inline)) void count_alloc(int kind, std::int64_t size,
                                                  std::int64_t requested,
                                                  pending_counts const& pending) noexcept
  {
    auto const k        = static_cast<std::size_t>(kind);
    pool_flows& f       = pools[k];
    pool_flows const& o = pools[k ^ 1];
    f.bytes_in.add(size);
    f.requested_in.add(requested);
    f.allocs.add(1);
    std::int64_t const b = f.bytes(), r = f.requested(), c = f.count();
    raise(f.peak_bytes, b);
    raise(f.peak_requested, r);
    raise(f.peak_count, c);
    raise(peak_bytes, b + o.bytes());
    raise(peak_requested, r + o.requested());
    raise(peak_count, c + o.count());
    if (pending.blocks.load(std::memory_order_relaxed) == 0) { return; }  // active == allocated
    std::int64_t const pb = pending.bytes[k].load(std::memory_order_relaxed);
    std::int64_t const pc = pending.count[k].load(std::memory_order_relaxed);
    std::int64_t const ob = pending.bytes[k ^ 1].load(std::memory_order_relaxed);
    std::int64_t const oc = pending.count[k ^ 1].load(std::memory_order_relaxed);
    raise(f.peak_active_bytes, b + pb);
    raise(f.peak_active_count, c + pc);
    raise(peak_active_bytes, b + pb + o.bytes() + ob);
    raise(peak_active_count, c + pc + o.count() + oc);
  }

  /// A block of `size` bytes (`requested` asked) of pool `kind` was freed by this thread.
  __attribute__((always_inline)) void count_free(int kind, std::int64_t size,
                                                 std::int64_t requested) noexcept
  {
    pool_flows& f = pools[static_cast<std::size_t>(kind)];
    f.bytes_out.add(size);
    f.requested_out.add(requested);
    f.frees.add(1);
  }

  // The flows are this thread's own (its net values are negative when it frees blocks other
  // threads allocated); the peaks make the totals' peaks exact when one thread allocates.
  std::array<pool_flows, 2> pools;                 // by pool kind: small, large
  counter peak_bytes, peak_requested, peak_count;  // of the net values over both kinds
  counter peak_active_bytes, peak_active_count;    // the same with the pending frees
  counter cached_bytes;
  counter num_cache_hits;

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
  caching::event_ring ring;  // guarded by ring_mutex

  void record(memory_event const& e, std::size_t capacity)
  {
    std::lock_guard<spin_lock> lock{ring_mutex};
    ring.push(e, capacity);
  }
};

}  // namespace gpukit::detail

namespace gpukit::detail::caching {

/// The thread caches of one allocator and its registration; see the top of this file.
template <class Runtime>
class thread_cache_front {
 public:
  using stream_type = typename Runtime::stream_type;
  using block       = caching_block<Runtime>;
  using cache       = caching_thread_cache<Runtime>;
  using cache_list  = std::vector<std::unique_ptr<cache>>;

  /// Registers a new uid among the live allocators.
  thread_cache_front() : uid_{live_allocators::get().next_uid.fetch_add(1)}
  {
    auto& live = live_allocators::get();
    std::lock_guard<std::mutex> lock{live.mutex};
    live.uids.insert(uid_);
  }
  ~thread_cache_front() { leave(); }
  thread_cache_front(thread_cache_front const&)            = delete;
  thread_cache_front& operator=(thread_cache_front const&) = delete;
  thread_cache_front(thread_cache_front&&)                 = delete;
  thread_cache_front& operator=(thread_cache_front&&)      = delete;

  /// Ends the registration: threads that exit from now on leave this front's caches alone (the
  /// allocator's destructor calls it first). Idempotent.
  void leave() noexcept
  {
    if (left_) { return; }
    left_      = true;
    auto& live = live_allocators::get();
    std::lock_guard<std::mutex> lock{live.mutex};
    live.uids.erase(uid_);
  }

  [[nodiscard]] std::uint64_t uid() const noexcept { return uid_; }
  /// Every cache, of live threads and orphaned ones (read under the pool lock).
  [[nodiscard]] cache_list const& caches() const noexcept { return caches_; }

  /// The calling thread's cache: one thread-local load and a comparison when this front is the
  /// last one the thread used. No lock.
  template <class Pool>
  __attribute__((always_inline)) cache& local(Pool pool)
  {
    auto& r = tls_registry::get();
    if (r.last.uid == uid_) { return *static_cast<cache*>(r.last.cache); }
    return local_slow(r, pool);
  }

  /// local()'s first call on a thread (or after another allocator was used there): out of line,
  /// so that local() inlines into the hot path. Takes the pool lock to adopt an orphaned cache or
  /// make one, and the live allocators' lock to register it.
  template <class Pool>
  __attribute__((noinline)) cache& local_slow(tls_registry& r, Pool pool)
  {
    for (auto const& e : r.entries) {
      if (e.uid == uid_) {
        r.last = e;
        return *static_cast<cache*>(e.cache);
      }
    }
    cache* tc = nullptr;
    pool.locked([&] {
      tc = adopt();
      if (caches_.size() > 1) { pool.share_counts(caches_); }
    });
    tls_entry e{uid_, pool.context(), tc, &on_thread_exit<Pool>};
    // Forget entries of allocators that no longer exist, so a thread that outlives many allocators
    // keeps a short list.
    {
      auto& live = live_allocators::get();
      std::lock_guard<std::mutex> lock{live.mutex};
      r.entries.erase(
        std::remove_if(r.entries.begin(), r.entries.end(),
                       [&](tls_entry const& x) { return live.uids.count(x.uid) == 0; }),
        r.entries.end());
    }
    r.entries.push_back(e);
    r.last = e;
    return *tc;
  }

  /// The largest block `tc` takes: the options' thread_cache_max_block_bytes, or more while its
  /// thread meets contention (note_pool_lock).
  [[nodiscard]] __attribute__((always_inline)) static std::size_t admission(
    cache const& tc, caching_allocator_options const& options) noexcept
  {
    return std::max(options.thread_cache_max_block_bytes, tc.raised_admission);
  }

  /// Whether `tc` takes a block of `size` bytes: admission(tc, options) >= size, with the raised
  /// admission read only for sizes above the options' (the hot paths' common case costs what it
  /// did before caches could be raised).
  [[nodiscard]] __attribute__((always_inline)) static bool admits(
    cache const& tc, caching_allocator_options const& options, std::size_t size) noexcept
  {
    return size <= options.thread_cache_max_block_bytes || size <= tc.raised_admission;
  }

  /// Slow paths in a row that must find the pool lock free before a raised admission halves.
  static constexpr std::uint32_t calm_before_lowering = 256;

  /// tc's thread took the pool lock on a slow path; `waited`: another thread held it first. Blocks
  /// a thread caches need no lock, so a thread that meets contention caches blocks twice as large
  /// as before, up to the options' thread_cache_contended_max_block_bytes; one that then finds the
  /// lock free on calm_before_lowering slow paths in a row halves that back toward
  /// thread_cache_max_block_bytes. A thread alone never raises it, and keeps the small caches whose
  /// blocks leave large segments whole. No caches (thread_cache_max_block_bytes 0): none raised.
  static void note_pool_lock(cache& tc, bool waited,
                             caching_allocator_options const& options) noexcept
  {
    std::size_t const base = options.thread_cache_max_block_bytes;
    std::size_t const most = options.thread_cache_contended_max_block_bytes;
    std::size_t const now  = std::max(base, tc.raised_admission);
    if (waited) {
      tc.calm_locks = 0;
      if (base != 0 && now < most) { tc.raised_admission = now > most / 2 ? most : 2 * now; }
      return;
    }
    if (tc.raised_admission == 0 || ++tc.calm_locks < calm_before_lowering) { return; }
    tc.calm_locks       = 0;
    tc.raised_admission = now / 2 > base ? now / 2 : 0;
  }

  /// The fast path's end: freed block b goes to `tc` for `stream` when it is small (admission), of
  /// no capture, no capture is under way and the cache has room. False when it did not. No lock.
  __attribute__((always_inline)) static bool push(cache& tc, block* b, stream_type stream,
                                                  caching_allocator_options const& options,
                                                  std::atomic<int> const& captures) noexcept
  {
    return admits(tc, options, b->size) && b->capture_pool == 0 &&
           captures.load(std::memory_order_relaxed) == 0 &&
           tc.push(stream, b, options.thread_cache_blocks_per_class, options.thread_cache_bytes);
  }

  /// Every block cached in `tc` back to the pool (the pool lock held). Out of line: the hot path
  /// calls it only when asked to flush.
  template <class Pool>
  __attribute__((noinline)) static void drain(cache& tc, Pool pool)
  {
    tc.flush_requested.store(false, std::memory_order_relaxed);
    tc.drain([&](stream_type s, block* b) { pool.free_to_pool(b, s); });
    pool.wake_waiters();
  }

  /// The smallest block cached in `tc` for `stream` that holds `size` bytes of pool `kind` back
  /// to the pool (the pool lock held); false where `tc` caches none.
  template <class Pool>
  static bool release_fitting(cache& tc, stream_type stream, std::size_t size, int kind, Pool pool)
  {
    block* b = tc.take_fitting(stream, size, kind);
    if (b == nullptr) { return false; }
    pool.free_to_pool(b, stream);
    return true;
  }

  /// drain() under the pool lock, taken here.
  template <class Pool>
  static void flush(cache& tc, Pool pool)
  {
    pool.locked([&] { drain(tc, pool); });
  }

  /// Asks every thread but the owner of `tc` to drain its cache at its next call (the pool lock
  /// held).
  void request_flush_except(cache const& tc) noexcept
  {
    for (auto& c : caches_) {
      if (c.get() != &tc) { c->flush_requested.store(true, std::memory_order_relaxed); }
    }
  }

  /// Drops the entries of blocks other threads have freed since (their descriptor now describes
  /// another block, or none). Descriptors are never deallocated while the allocator lives, so
  /// reading one that another thread reuses is safe; its state and address are atomics.
  static void purge_handed_out(cache& tc)
  {
    tc.handed_out.erase_if([&tc](std::uintptr_t key, block* b) {
      return b->address() != key || b->owner.load(std::memory_order_relaxed) != &tc;
    });
    tc.purge_at = std::max<std::size_t>(4096, 2 * tc.handed_out.size());
  }

 private:
  /// An orphaned cache, adopted, or a new one (the pool lock held).
  cache* adopt()
  {
    for (auto& c : caches_) {
      if (c->orphaned) {
        c->orphaned = false;
        return c.get();
      }
    }
    caches_.push_back(std::make_unique<cache>());
    return caches_.back().get();
  }

  /// A thread exits (its registry's destructor, the allocator alive): its cached blocks go back
  /// to the pool and its cache waits, counters intact, for the next thread.
  template <class Pool>
  static void on_thread_exit(void* context, void* c)
  {
    Pool pool = Pool::of(context);
    auto* tc  = static_cast<cache*>(c);
    pool.locked([&] {
      drain(*tc, pool);
      tc->handed_out.erase_if([](std::uintptr_t, block*) { return true; });
      tc->checked_stream   = stream_type{};
      tc->raised_admission = 0;  // the next thread starts from the options' admission
      tc->calm_locks       = 0;
      // The counters stay: the sums over caches stay right when another thread reuses this one.
      tc->orphaned = true;
      pool.join_counts(*tc);  // its last counts, not the switch's; no delta left
    });
  }

  cache_list caches_;
  std::uint64_t uid_;
  bool left_{false};
};

}  // namespace gpukit::detail::caching
