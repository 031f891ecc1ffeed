// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/thread_cache.inl: the per-thread caches of basic_caching_allocator. Not
// public API; included by caching_allocator.hpp.
//
// Each thread keeps, per allocator, one caching_thread_cache: short LIFO lists of freed blocks by
// size class for a few streams, the map of the blocks it handed out, its own statistics counters
// (one writer, no read-modify-write) and its ring of recorded events. A thread-local registry finds
// a thread's cache for an allocator (the last one used first); a thread that exits returns its
// cached blocks to the pool and leaves its cache, counters intact, for the next thread.
//
// Holds: the registry (tls_entry, live_allocators, tls_registry), caching_thread_cache, and the
// allocator's local_cache, on_thread_exit, purge_handed_out and flush_cache and drain_cache.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/detail/caching/event_ring.hpp>

#include <algorithm>
#include <array>
#include <mutex>
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
  stream_type checked_stream{};   // the last stream this thread's free checked (device, liveness)
  // Blocks other threads freed stay in handed_out until their address comes back: when it holds
  // more than this, those entries are dropped (amortized: the bound doubles with what stays).
  std::size_t purge_at{4096};
  std::atomic<bool> flush_requested{false};
  bool orphaned{false};  // guarded by the allocator's mutex
  // The shared counts (detail::shared_counts): whether this cache's own counts are in them, and
  // its counts when they were switched on (written then, under the allocator's lock).
  bool joined{false};
  std::int64_t join_bytes[2]{}, join_requested[2]{}, join_count[2]{};

  /// What this thread handed out (`in`) and took back (`out`) of one pool kind: totals that only
  /// grow, so a current value is their difference and PyTorch's allocated/freed totals are free.
  struct pool_flows {
    counter bytes_in, bytes_out, requested_in, requested_out, allocs, frees;
    counter peak_bytes, peak_requested, peak_count;  // of this thread's net values
    counter peak_active_bytes, peak_active_count;    // net values plus the pending frees
    [[nodiscard]] std::int64_t bytes() const noexcept { return bytes_in.get() - bytes_out.get(); }
    [[nodiscard]] std::int64_t requested() const noexcept
    {
      return requested_in.get() - requested_out.get();
    }
    [[nodiscard]] std::int64_t count() const noexcept { return allocs.get() - frees.get(); }
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

namespace gpukit {

template <class Runtime>
__attribute__((always_inline)) inline typename basic_caching_allocator<Runtime>::thread_cache&
basic_caching_allocator<Runtime>::local_cache()
{
  auto& r = detail::tls_registry::get();
  if (r.last.uid == uid_) { return *static_cast<thread_cache*>(r.last.cache); }
  return local_cache_slow(r);
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::thread_cache&
basic_caching_allocator<Runtime>::local_cache_slow(detail::tls_registry& r)
{
  for (auto const& e : r.entries) {
    if (e.uid == uid_) {
      r.last = e;
      return *static_cast<thread_cache*>(e.cache);
    }
  }
  thread_cache* tc = nullptr;
  {
    detail::pool_lock lock{mutex_};
    for (auto& c : threads_.caches) {
      if (c->orphaned) {
        c->orphaned = false;
        tc          = c.get();
        break;
      }
    }
    if (tc == nullptr) {
      threads_.caches.push_back(std::make_unique<thread_cache>());
      tc = threads_.caches.back().get();
    }
    if (threads_.caches.size() > 1 && !shared_.on.load(std::memory_order_relaxed)) {
      stats_.share_counts(
        threads_.caches, stats_type::scan(streams_.pending(), streams_.pools(), blocks_.globals()));
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
  detail::pool_lock lock{self->mutex_};
  self->drain_cache(*tc);
  tc->handed_out.erase_if([](std::uintptr_t, block*) { return true; });
  tc->checked_stream = stream_type{};
  // The counters stay: the sums over caches stay right when another thread reuses this one.
  tc->orphaned = true;
  if (self->shared_.on.load(std::memory_order_relaxed) && !tc->joined) {
    stats_type::join_shared_counts(self->shared_, *tc);  // its last counts, not the switch's
  }
}

// Drops the entries of blocks other threads have freed since (their descriptor now describes
// another block, or none). Descriptors are never deallocated while the allocator lives, so reading
// one that another thread reuses is safe; its state and address are atomics.
template <class Runtime>
void basic_caching_allocator<Runtime>::purge_handed_out(thread_cache& tc)
{
  tc.handed_out.erase_if([&tc](std::uintptr_t key, block* b) {
    return b->address() != key || b->owner.load(std::memory_order_relaxed) != &tc;
  });
  tc.purge_at = std::max<std::size_t>(4096, 2 * tc.handed_out.size());
}

template <class Runtime>
void basic_caching_allocator<Runtime>::drain_cache(thread_cache& tc)
{
  tc.flush_requested.store(false, std::memory_order_relaxed);
  tc.drain([&](stream_type s, block* b) {
    mutex_.assert_held();  // a lambda run under the lock
    free_to_pool(b, s);
  });
  oom_.wake_waiters();
}

template <class Runtime>
void basic_caching_allocator<Runtime>::flush_cache(thread_cache& tc)
{
  detail::pool_lock lock{mutex_};
  drain_cache(tc);
}

}  // namespace gpukit
