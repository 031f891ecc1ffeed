// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/stream_pools.hpp: what the caching allocator knows of streams: the
// pool of free blocks each stream owns, the streams checked to belong to its device and those
// forgotten, the pending frees of blocks used on other streams too (record_stream), which wait on
// events recorded on those streams, the migration of other streams' free blocks to the global pool
// once an event shows their work done, forgotten and destroyed streams, and the spare events these
// use. Not public API.
//
// Owns: the stream pools (each stream's free blocks per pool kind, its free sequence number, the
// event of its migration under way), the pending frees, the streams checked, the streams forgotten
// (the most recent forgotten_capacity), and the spare events. Invariants:
// - A block freed on stream S is reusable on S at once (it is in S's pool), on another stream only
//   once an event recorded on S after the free has completed: migrate records one event per
//   stream that holds free blocks (an event per crossing, never per free) and moves to the global
//   pool only the blocks that entered S's pool before it (free sequence number up to the event's).
// - A pending free waits on one event per other stream it was used on, recorded (armed) once no
//   graph capture is under way; once they have all completed it joins its stream's pool (the
//   global pool when its stream was forgotten) and its events go back to the spare list.
// - Every event is in one place only: a pending free, a stream pool's migration, or the spare list
//   (teardown_events destroys them all).
// - A stream found destroyed is retired once (the device synchronized, its blocks made every
//   stream's, the stream forgotten), and never while a capture is under way.
// - No call that would invalidate a graph capture is made on a capturing stream: a stream is asked
//   its device only after stream_is_capturing said it is not capturing (one met while capturing is
//   taken on trust and not remembered, so that its first use after the capture checks it), and no
//   event is recorded on, nor synchronization made of, a stream being captured.
//
// Single-threaded: the allocator calls it under its pool lock. It keeps the runtime and the
// device; what else a call needs of the allocator around it comes as `pool`, which the allocator
// builds at the call (basic_caching_allocator::stream_operations), and which provides:
//   capturing()                        whether a graph capture or capture window is under way
//   insert_free(b) -> Block*           indexes free block b where its fields say (global, or its
//                                      stream's pool here), merged with its free neighbours
//   free_to_pool(b, stream)            freed block b into the pool a free on `stream` goes to
//   global_bytes()                     bytes in the global free indices
//   count(&caching_allocator_stats::x) bumps an event counter (num_dead_streams,
//                                      num_cross_stream_events)
//   count_pending(kind, bytes, blocks) the pending frees' statistics (still active)
//   capture_of(stream)                 the id of the capture pool `stream` allocates from (0: none)
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/detail/caching_block.hpp>
#include <gpukit/memory/detail/tlsf_index.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gpukit::detail::caching {

/// The streams of a caching allocator, their pools and their events; see the top of this file.
template <class Runtime, class Block>
class stream_pools {
 public:
  using stream_type = typename Runtime::stream_type;
  using event_type  = typename Runtime::event_type;
  using error_type  = typename Runtime::error_type;

  /// The free blocks one stream owns, and the migration of them under way.
  struct stream_pool {
    stream_type stream{};
    tlsf_index<Block> index[2];      // per pool kind
    std::uint64_t free_seq{0};       // the free sequence number of the latest block in
    bool migrating{false};           // migration_event recorded and not yet seen complete
    event_type migration_event{};    // recorded on `stream`
    std::uint64_t migration_seq{0};  // free_seq when it was recorded
  };
  using pool_list = std::vector<std::unique_ptr<stream_pool>>;

  /// A block freed while used on other streams too (record_stream): it waits on their events.
  struct pending_free {
    Block* b{nullptr};
    stream_type stream{};  // freed on
    std::vector<event_type> events;
    // Freed during a graph capture: the streams it was used on, whose events are recorded once no
    // capture is under way (an event recorded in a capture cannot be queried). Empty once armed.
    std::vector<stream_type> uses;
    bool to_global{false};  // its stream was forgotten: usable by every stream once done
  };

  /// Forgotten streams remembered (the oldest is dropped first).
  static constexpr std::size_t forgotten_capacity = 256;

  stream_pools(Runtime& runtime, int device) noexcept : runtime_{runtime}, device_{device} {}
  /// Deletes the pools; the events are the owner's to destroy first (teardown_events).
  ~stream_pools()                              = default;
  stream_pools(stream_pools const&)            = delete;
  stream_pools& operator=(stream_pools const&) = delete;
  stream_pools(stream_pools&&)                 = delete;
  stream_pools& operator=(stream_pools&&)      = delete;

  // ---- what it holds ----------------------------------------------------------------------------

  /// Every stream pool, in the order the streams first held a free block.
  [[nodiscard]] pool_list& pools() noexcept { return pools_; }
  [[nodiscard]] pool_list const& pools() const noexcept { return pools_; }
  /// The frees waiting on other streams' events.
  [[nodiscard]] std::vector<pending_free> const& pending() const noexcept { return pending_; }
  [[nodiscard]] bool has_pending() const noexcept { return !pending_.empty(); }
  /// Events kept for reuse.
  [[nodiscard]] std::size_t spare_events() const noexcept { return spare_events_.size(); }
  /// Whether `stream` is known to belong to the device (the null stream is not listed).
  [[nodiscard]] bool checked(stream_type stream) const
  {
    return std::find(checked_.begin(), checked_.end(), stream) != checked_.end();
  }
  /// Whether `stream` was forgotten (forget, or retired), and not used by a user since.
  [[nodiscard]] bool forgotten(stream_type stream) const
  {
    return !forgotten_.empty() &&
           std::find(forgotten_.begin(), forgotten_.end(), stream) != forgotten_.end();
  }

  // ---- the stream pools -------------------------------------------------------------------------

  /// The pool of `stream`, created empty when it has none.
  stream_pool& pool_of(stream_type stream)
  {
    for (auto& sp : pools_) {
      if (sp->stream == stream) { return *sp; }
    }
    pools_.push_back(std::make_unique<stream_pool>());
    pools_.back()->stream = stream;
    return *pools_.back();
  }
  /// A free block of at least `size` bytes of pool kind `kind` in `stream`'s pool, or nullptr.
  [[nodiscard]] Block* find(std::size_t size, int kind, stream_type stream)
  {
    for (auto& sp : pools_) {
      if (sp->stream == stream) { return sp->index[kind].find(size); }
    }
    return nullptr;
  }
  /// The free sequence number of a block entering `stream`'s pool now.
  std::uint64_t next_free_seq(stream_type stream) { return ++pool_of(stream).free_seq; }

  // ---- streams: checked, forgotten, destroyed ---------------------------------------------------

  /// A stream's first use: it must belong to the device (on CUDA, cudaMallocAsync on another
  /// device's stream takes that device's memory, and events of this device cannot be recorded on
  /// it). The null stream stands for the device's. Asking a stream its device (cudaStreamGetDevice)
  /// invalidates a graph capture it takes part in, in every capture mode, so a stream met while it
  /// is capturing (a side stream joined to a capture, a second graph's new stream) is asked only
  /// stream_is_capturing and taken to be of the device: it is not remembered as checked, so its
  /// first use after the capture checks it. `what` names the caller in messages.
  /// @throws gpukit::logic_error for another device's stream; gpukit::cuda_error for a destroyed
  ///         one, or when the runtime fails otherwise
  void check_stream(stream_type stream, char const* what) { (void)check(stream, what, false); }
  /// As check_stream, but a destroyed stream is retired (retire_dead_stream) instead of reported,
  /// and the result is false; true for a live stream.
  template <class Pool>
  bool check_live_stream(stream_type stream, char const* what, Pool&& pool)
  {
    if (check(stream, what, true)) { return true; }
    retire_dead_stream(stream, pool);
    return false;
  }
  /// Whether `stream` takes part in a graph capture (asked of the runtime: legal during capture).
  /// The null stream is never captured; a destroyed stream is not capturing (callers find it dead).
  /// @throws gpukit::cuda_error when the runtime fails otherwise
  bool is_capturing(stream_type stream)
  {
    if (stream == stream_type{}) { return false; }
    bool capturing     = false;
    error_type const e = runtime_.stream_is_capturing(stream, capturing);
    if (e == Runtime::invalid_resource_handle) { return false; }
    GPUKIT_CUDA_TRY(e, "stream_is_capturing");
    return capturing;
  }
  /// A user's free on `stream`: a live stream (a forgotten handle reused), no longer forgotten.
  void unforget(stream_type stream)
  {
    if (forgotten_.empty()) { return; }
    forgotten_.erase(std::remove(forgotten_.begin(), forgotten_.end(), stream), forgotten_.end());
  }
  /// A stream found destroyed (the runtime calls it an invalid handle). Work queued on a destroyed
  /// stream still runs to completion, and no event can be recorded on it any more, so the safe
  /// path is to wait for the whole device once; then its free blocks (and blocks freed on it
  /// later) are usable by every stream, as after forget. Rare, and never an error of its own.
  /// @throws gpukit::cuda_error during a graph capture (no synchronization then), or when the
  ///         device cannot be synchronized (nothing changes in both cases)
  template <class Pool>
  void retire_dead_stream(stream_type stream, Pool&& pool)
  {
    if (pool.capturing()) {
      detail::throw_explained_cuda_error(  // no synchronization during a capture
        Runtime::invalid_resource_handle,
        "deallocate_async: stream " + hex(handle(stream)) +
          " was destroyed, and a block freed on it can be reused only after the device is "
          "synchronized, which a graph capture under way forbids; free it before destroying the "
          "stream, or after the capture ends",
        "device_synchronize", GPUKIT_DETAIL_SOURCE);
    }
    {
      device_guard<Runtime> guard{runtime_, device_};
      GPUKIT_CUDA_TRY(runtime_.device_synchronize());
    }
    pool.count(&caching_allocator_stats::num_dead_streams);
    forget(stream, true, pool);
  }
  /// forget_stream: waits for the work queued on `stream` so far (`synchronized`: it is known
  /// complete, a retired dead stream), then makes its free blocks, and its pending frees once their
  /// events complete, usable on every stream; blocks freed on it later go to every stream too.
  /// A stream found destroyed is retired (the device waited for) instead.
  /// @throws gpukit::logic_error while `stream` is being captured (waiting for it would invalidate
  ///         the capture); gpukit::cuda_error when it cannot be synchronized (nothing changes)
  template <class Pool>
  void forget(stream_type stream, bool synchronized, Pool&& pool)
  {
    // CUDA may hand the handle of a destroyed stream to a new one: check it again then.
    checked_.erase(std::remove(checked_.begin(), checked_.end(), stream), checked_.end());
    bool const pending_here =
      std::any_of(pending_.begin(), pending_.end(),
                  [&](pending_free const& pf) { return pf.stream == stream; });
    if (!has_pool(stream) && !pending_here) {
      remember_forgotten(stream);
      return;
    }
    if (!synchronized && !wait_for(stream, pool)) { return; }  // destroyed: retired
    // Frees on it still waiting for other streams' events: every stream's once those complete.
    for (auto& pf : pending_) {
      if (pf.stream == stream) {
        pf.stream    = stream_type{};
        pf.to_global = true;
      }
    }
    auto it = std::find_if(pools_.begin(), pools_.end(),
                           [&](auto const& sp) { return sp->stream == stream; });
    if (it != pools_.end()) {
      stream_pool& sp = **it;
      if (sp.migrating) { spare_events_.push_back(sp.migration_event); }  // complete now
      make_global(sp, std::numeric_limits<std::uint64_t>::max(), pool);
      pools_.erase(it);
    }
    remember_forgotten(stream);
  }

  // ---- pending frees ----------------------------------------------------------------------------

  /// A free of block b (used on other streams too) on `stream` during a graph capture that involves
  /// its streams (of the allocator, or on any of them): true when b is to wait, its events
  /// unrecorded, for its other streams' uses (put in pf.uses) until no capture is under way, kept
  /// for the capture pool of `stream` as a free would keep it.
  /// @throws gpukit::cuda_error when the runtime fails (pf.uses may be filled)
  template <class Pool>
  bool defer_in_capture(Block* b, stream_type stream, pending_free& pf, Pool&& pool)
  {
    bool in_capture = pool.capturing() || is_capturing(stream);
    for (std::size_t i = 0; i < b->recorded.size() && !in_capture; ++i) {
      in_capture = !(b->recorded[i] == stream) && is_capturing(b->recorded[i]);
    }
    if (!in_capture) { return false; }
    std::uint64_t const capture = b->capture_pool == 0 ? pool.capture_of(stream) : 0;
    for (stream_type s : b->recorded) {
      if (!(s == stream)) { pf.uses.push_back(s); }
    }
    if (pf.uses.empty()) { return false; }
    if (capture != 0) { b->capture_pool = capture; }
    return true;
  }
  /// A free of block b on `stream`: an event on each other stream b was used on, into pf.events;
  /// a stream found destroyed is retired (the device waited for) instead. The caller holds a
  /// device guard.
  /// @throws gpukit::cuda_error when a record fails otherwise (the events so far are in pf.events)
  template <class Pool>
  void record_uses(Block* b, stream_type stream, pending_free& pf, Pool&& pool)
  {
    for (stream_type s : b->recorded) {
      if (s == stream) { continue; }
      event_type e{};
      error_type const r = record_event(e, s);
      if (r == Runtime::invalid_resource_handle) {  // s was destroyed: the device is waited for
        retire_dead_stream(s, pool);
        continue;
      }
      GPUKIT_CUDA_TRY(r, "event_record");
      pf.events.push_back(e);
    }
  }
  /// pf waits as a pending free (its block's recorded streams cleared, its state pending).
  void park(pending_free&& pf)
  {
    pf.b->recorded.clear();
    pf.b->state.store(block_state::pending, std::memory_order_relaxed);
    pending_.push_back(std::move(pf));
  }
  /// Moves the pending frees whose events have all completed (with `wait`: waited for) into their
  /// stream's pool, arming first those freed during a capture that has ended. Returns the bytes
  /// moved.
  /// @throws gpukit::cuda_error when a query or a record fails (what moved so far stays moved)
  template <class Pool>
  std::size_t poll_pending(bool wait, Pool&& pool)
  {
    std::size_t moved = 0;
    for (std::size_t i = 0; i < pending_.size();) {
      pending_free& pf = pending_[i];
      // Freed during a capture that is still under way, or waiting on events still: stays.
      if ((!pf.uses.empty() && !arm_pending(pf, pool)) || !events_done(pf, wait)) {
        ++i;
        continue;
      }
      moved += complete(i, pool);
    }
    return moved;
  }

  // ---- migration --------------------------------------------------------------------------------

  /// Makes free blocks of streams other than `requester` usable by any stream: one event per
  /// stream that holds free blocks, recorded when first needed; once it completes, the blocks that
  /// stream had freed before the event move to the global pool. With `wait`, blocks until those
  /// events complete. A stream being captured is left alone (an event recorded on it would be part
  /// of the graph); one found destroyed is retired. Returns the bytes that became global.
  /// @throws gpukit::cuda_error when a record or a query fails otherwise
  template <class Pool>
  std::size_t migrate(stream_type requester, bool wait, Pool&& pool)
  {
    std::size_t moved = 0;
    device_guard<Runtime> guard{runtime_, device_};
    std::vector<stream_type> dead;  // destroyed streams: retired after the walk
    for (auto& sp : pools_) {
      if (sp->stream == requester || (sp->index[0].empty() && sp->index[1].empty())) { continue; }
      if (!sp->migrating && !start_migration(*sp, dead, pool)) { continue; }
      moved += finish_migration(*sp, wait, pool);
    }
    for (stream_type s : dead) {
      std::size_t const before = pool.global_bytes();
      retire_dead_stream(s, pool);
      moved += pool.global_bytes() - before;
    }
    return moved;
  }

  // ---- events -----------------------------------------------------------------------------------

  /// A spare event, else a new one (timing disabled).
  /// @throws gpukit::cuda_error when one cannot be created
  event_type take_event()
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
  /// Events taken and not used (or complete) go back to the spare list.
  void give_events(std::vector<event_type> const& events)
  {
    spare_events_.insert(spare_events_.end(), events.begin(), events.end());
  }
  /// Destroys every event held (pending frees', migrations', spares), each through
  /// `call(f)`, which runs f (returning the runtime's error) and counts its failures.
  template <class Call>
  void teardown_events(Call& call) noexcept
  {
    for (auto& p : pending_) {
      for (event_type e : p.events) {
        call([&] { return runtime_.event_destroy(e); });
      }
    }
    for (auto& sp : pools_) {
      if (sp->migrating) {
        call([&] { return runtime_.event_destroy(sp->migration_event); });
      }
    }
    for (event_type e : spare_events_) {
      call([&] { return runtime_.event_destroy(e); });
    }
  }

 private:
  // check_stream's work; with `dead_ok`, false for a destroyed stream instead of an error.
  bool check(stream_type stream, char const* what, bool dead_ok)
  {
    if (stream == stream_type{} || checked(stream)) { return true; }
    bool capturing = false;
    error_type r   = runtime_.stream_is_capturing(stream, capturing);
    if (r == Runtime::success && capturing) { return true; }  // checked after the capture
    int d = -1;
    if (r == Runtime::success) { r = runtime_.stream_get_device(stream, d); }
    if (dead_ok && r == Runtime::invalid_resource_handle) { return false; }
    if (r == Runtime::invalid_resource_handle) { throw_not_live(r, stream, what); }
    GPUKIT_CUDA_TRY(r,
                    std::string{what} + ": asking stream " + hex(handle(stream)) + " its device");
    GPUKIT_EXPECTS(d == device_, std::string{what} + ": the stream belongs to device " +
                                   std::to_string(d) + " but this allocator serves device " +
                                   std::to_string(device_) +
                                   "; use that device's allocator (default_caching_allocator(" +
                                   std::to_string(d) + "))");
    checked_.push_back(stream);
    unforget(stream);  // a new stream with a reused handle
    return true;
  }

  [[noreturn]] void throw_not_live(error_type r, stream_type stream, char const* what) const
  {
    detail::throw_explained_cuda_error(
      r,
      std::string{what} + ": stream " + hex(handle(stream)) + " is not a live stream of device " +
        std::to_string(device_) +
        " (it was destroyed, or created in another context or on another device); pass a stream "
        "created on device " +
        std::to_string(device_) + " that outlives the work queued on it",
      "stream_is_capturing, stream_get_device", GPUKIT_DETAIL_SOURCE);
  }

  // The handle of `stream` as a number, for messages.
  static std::uintptr_t handle(stream_type stream) noexcept
  {
    std::uintptr_t id = 0;
    std::memcpy(&id, &stream, std::min(sizeof id, sizeof stream));
    return id;
  }

  bool has_pool(stream_type stream) const
  {
    return std::any_of(pools_.begin(), pools_.end(),
                       [&](auto const& sp) { return sp->stream == stream; });
  }

  // Blocks that still come back on a forgotten stream (other threads' cached blocks) go to every
  // stream, never to a pool of that stream, which may be destroyed by then.
  void remember_forgotten(stream_type stream)
  {
    if (stream == stream_type{} || forgotten(stream)) { return; }
    if (forgotten_.size() >= forgotten_capacity) { forgotten_.erase(forgotten_.begin()); }
    forgotten_.push_back(stream);
  }

  // forget's wait for the work queued on `stream` so far; false when it was found destroyed (then
  // retired).
  template <class Pool>
  bool wait_for(stream_type stream, Pool& pool)
  {
    // Synchronizing a capturing stream would invalidate its capture.
    GPUKIT_EXPECTS(!is_capturing(stream),
                   "forget_stream: stream " + hex(handle(stream)) +
                     " is being captured into a CUDA graph; forget it after the capture ends");
    device_guard<Runtime> guard{runtime_, device_};
    error_type const r = runtime_.stream_synchronize(stream);  // the work queued on it so far
    if (r == Runtime::invalid_resource_handle) {
      retire_dead_stream(stream, pool);
      return false;
    }
    GPUKIT_CUDA_TRY(r, "stream_synchronize (forget_stream)");
    return true;
  }

  // A spare (or new) event recorded on `stream`, into `e`; when the record fails, the event goes
  // back to the spare list and the error is returned.
  error_type record_event(event_type& e, stream_type stream)
  {
    e                  = take_event();
    error_type const r = runtime_.event_record(e, stream);
    if (r != Runtime::success) { spare_events_.push_back(e); }
    return r;
  }

  // A free made during a graph capture (defer_in_capture): records an event on each stream that
  // used the block, now that no capture is under way and none of those streams is capturing.
  // False, with nothing changed, while one still is.
  // @throws gpukit::cuda_error when an event cannot be recorded (nothing changes then)
  template <class Pool>
  bool arm_pending(pending_free& pf, Pool& pool)
  {
    if (pool.capturing()) { return false; }
    for (stream_type s : pf.uses) {
      if (is_capturing(s)) { return false; }
    }
    device_guard<Runtime> guard{runtime_, device_};
    std::vector<event_type> events;
    std::vector<stream_type> dead;
    try {
      for (stream_type s : pf.uses) {
        event_type e{};
        error_type const r = record_event(e, s);
        if (r == Runtime::invalid_resource_handle) {  // destroyed: retired once this is armed
          dead.push_back(s);
          continue;
        }
        GPUKIT_CUDA_TRY(r, "event_record");
        events.push_back(e);
      }
    } catch (...) {
      give_events(events);
      throw;
    }
    pf.events = std::move(events);
    pf.uses.clear();
    for (stream_type s : dead) { retire_dead_stream(s, pool); }
    return true;
  }

  // Whether every event of pf has completed (with `wait`: waited for).
  bool events_done(pending_free const& pf, bool wait)
  {
    for (event_type e : pf.events) {
      error_type const q = wait ? runtime_.event_synchronize(e) : runtime_.event_query(e);
      if (q == Runtime::not_ready) { return false; }
      GPUKIT_CUDA_TRY(q, wait ? "event_synchronize" : "event_query");
    }
    return true;
  }

  // Pending free i, whose events have completed, joins its pool; returns its bytes.
  template <class Pool>
  std::size_t complete(std::size_t i, Pool& pool)
  {
    pending_free& pf = pending_[i];
    for (event_type e : pf.events) { spare_events_.push_back(e); }
    std::size_t const bytes = pf.b->size;
    pool.count_pending(pf.b->kind, -static_cast<std::int64_t>(bytes), -1);
    if (pf.to_global) {
      pf.b->stream = stream_type{};
      pf.b->global = true;
      pool.insert_free(pf.b);
    } else {
      pool.free_to_pool(pf.b, pf.stream);
    }
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    return bytes;
  }

  // Records the event of sp's migration; false when none can be recorded now: sp's stream is being
  // captured (the event would be part of the graph, never queryable), or destroyed (into `dead`).
  template <class Pool>
  bool start_migration(stream_pool& sp, std::vector<stream_type>& dead, Pool& pool)
  {
    if (is_capturing(sp.stream)) { return false; }
    event_type e{};
    error_type const r = record_event(e, sp.stream);
    if (r == Runtime::invalid_resource_handle) {
      dead.push_back(sp.stream);
      return false;
    }
    GPUKIT_CUDA_TRY(r, "event_record");
    sp.migration_event = e;
    sp.migration_seq   = sp.free_seq;
    sp.migrating       = true;
    pool.count(&caching_allocator_stats::num_cross_stream_events);
    return true;
  }

  // Once sp's migration event has completed (with `wait`: waited for), the blocks sp held before
  // it go to the global pool. Returns the bytes moved (0 while it has not completed).
  template <class Pool>
  std::size_t finish_migration(stream_pool& sp, bool wait, Pool& pool)
  {
    error_type const q = wait ? runtime_.event_synchronize(sp.migration_event)
                              : runtime_.event_query(sp.migration_event);
    if (q == Runtime::not_ready) { return 0; }
    GPUKIT_CUDA_TRY(q, wait ? "event_synchronize" : "event_query");
    spare_events_.push_back(sp.migration_event);
    sp.migrating = false;
    return make_global(sp, sp.migration_seq, pool);
  }

  // Moves the free blocks `sp` holds that entered it up to `up_to_seq` into the global pool,
  // merging them with their neighbours there. Returns the bytes moved.
  template <class Pool>
  std::size_t make_global(stream_pool& sp, std::uint64_t up_to_seq, Pool& pool)
  {
    std::vector<Block*> movers;
    for (auto& idx : sp.index) {
      idx.for_each([&](Block* b) {
        if (b->free_seq <= up_to_seq) { movers.push_back(b); }
      });
    }
    // Take them all out first (marked so that no merge sees them), then insert each, merging.
    for (Block* b : movers) {
      sp.index[b->kind].remove(b);
      b->global = true;
      b->state.store(block_state::pending, std::memory_order_relaxed);
    }
    std::size_t moved = 0;
    for (Block* b : movers) {
      moved += b->size;
      pool.insert_free(b);
    }
    return moved;
  }

  Runtime& runtime_;
  int device_;
  pool_list pools_;                       // free blocks each stream owns
  std::vector<pending_free> pending_;     // frees waiting on recorded streams
  std::vector<stream_type> checked_;      // streams known to belong to device_
  std::vector<stream_type> forgotten_;    // forgotten (the most recent forgotten_capacity)
  std::vector<event_type> spare_events_;  // for reuse
};

}  // namespace gpukit::detail::caching
