// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching_allocator_impl.hpp: the bodies of basic_caching_allocator, the
// façade over the layers in detail/caching/ (see ARCHITECTURE.md, "The caching allocator's
// layers"): construction (options validated) and destruction (never throws), allocate_async (the
// thread-cache front, then the pool under the lock) and deallocate_async (the claim of the block,
// then the front, pending frees or the pool), the free indices, graph captures' private pools,
// the observers' entry points (stats, reset_peak, recording, snapshot), release and trim.
// What the layers ask of the pool, built at each call:
// detail/caching_allocator_operations_impl.hpp. Not public API: included at the end of
// caching_allocator.hpp, which it does not include.
//
// Layers that own their state (detail/caching/*.hpp, single-threaded, each with its own test in
// tests/memory/detail/caching/; the allocator holds them under its pool lock, but for the front):
//   block_index.hpp    blocks by address, global free indices, split/coalesce/carve/recycle
//   thread_cache_front.hpp  per-thread caches and the thread-local registry
//   capture_pools.hpp  the private pools of graph captures
//   event_ring.hpp     the rings of recorded events (the pool's and each thread's)
//   segment.hpp        the descriptor of a segment
//   stream_pools.hpp   stream pools, stream checks, pending frees, cross-stream migration,
//                      forgotten and destroyed streams, events
//   segment_source.hpp fixed segments: their source (malloc_async, malloc or an upstream
//                      resource), the bytes reserved, taking them and giving them back
//   growable_source.hpp  growable (virtual memory) segments: pages mapped on demand, spare pages
//   oom_ladder.hpp     the out-of-memory ladder, its callbacks and the out_of_memory report
//   quarantine.hpp     debug mode: checks of a free, poisoning, the quarantine (its own lock)
//   guard_page_source.hpp  debug mode's guard pages: a block on its own pages, placed and retired
//   allocator_stats.hpp  pool-level counters and peaks (stats(), reset_peak(): end of this file)
//   event_recorder.hpp   the pool's events, start_recording, the events of snapshot() (end of
//                        this file)
// The lock discipline is declared (GPUKIT_GUARDED_BY, GPUKIT_REQUIRES, GPUKIT_EXCLUDES:
// gpukit/detail/thread_annotations.hpp) and checked by clang's -Wthread-safety.
#pragma once

#include <gpukit/detail/hex.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gpukit {

template <class Runtime>
basic_caching_allocator<Runtime>::basic_caching_allocator(Runtime& runtime, int device,
                                                          caching_allocator_options options)
    : runtime_{runtime}, device_{device}, options_{options}, pages_{runtime, device},
      streams_{runtime, device}, oom_{runtime, device}
{
  validate_options();
  int count = 0;
  GPUKIT_CUDA_TRY(runtime_.device_count(count));
  GPUKIT_EXPECTS(device >= 0 && device < count, "caching_allocator: device " +
                                                  std::to_string(device) + " does not exist (" +
                                                  std::to_string(count) + " devices)");
  device_properties props;
  GPUKIT_CUDA_TRY(runtime_.get_device_properties(props, device));
  device_total_       = props.total_memory;
  bool stream_ordered = options_.source == segment_source::stream_ordered ||
                        (options_.source == segment_source::automatic && props.memory_pools);
  growable_ = options_.source == segment_source::growable;
  // Annotation and debug mode settle the segment source (detail/caching/quarantine.hpp).
  bool const guard = detail::caching::settle_debug_mode(options_, stream_ordered, growable_);
  segments_.use_runtime(stream_ordered);
  if (options_.debug.enabled) {
    debug_ =
      std::make_unique<debug_quarantine>(runtime_, device_, options_, captures_underway_, mutex_);
  }
  if (guard) { guards_.enable(); }
  if (growable_) {
    GPUKIT_EXPECTS(props.virtual_memory_management,
                   "caching_allocator: segment_source::growable needs virtual memory management, "
                   "which device " +
                     std::to_string(device) + " (" + props.name + ") does not support");
    pages_.set_up(options_, device_total_, alignment);
  }
  std::size_t limit = options_.limit_bytes;
  if (options_.limit_fraction > 0.0) {
    auto const frac =
      static_cast<std::size_t>(options_.limit_fraction * static_cast<double>(device_total_));
    limit = limit == 0 ? frac : std::min(limit, frac);
  }
  limit_.store(limit, std::memory_order_relaxed);
}

// Every option, checked once against the ranges of alloc_conf_keys (gpukit/memory/alloc_conf.hpp),
// which parse_alloc_conf checks too: a value out of range names the member and the value.
template <class Runtime>
void basic_caching_allocator<Runtime>::validate_options() const
{
  static_assert(
    alloc_conf_most_bytes == static_cast<double>(std::size_t{1} << detail::tlsf_max_shift),
    "the keys' largest size is the block index's");
  detail::validate_allocator_options(options_);
}

namespace detail {
/// Runtime calls that failed in caching allocators' destructors, process-wide.
inline std::atomic<std::uint64_t> teardown_failures{0};

/// Counts `n` failures of a destructor; the first of the process goes to stderr.
inline void note_teardown_failures(std::uint64_t n, int device) noexcept
{
  if (n == 0) { return; }
  if (teardown_failures.fetch_add(n) == 0) {
    std::fprintf(stderr,
                 "gpukit: caching_allocator (device %d): %llu runtime call(s) failed while it was "
                 "destroyed; some device memory may not have been returned (counted in "
                 "caching_allocator_teardown_failures())\n",
                 device, static_cast<unsigned long long>(n));
  }
}
}  // namespace detail

inline std::uint64_t caching_allocator_teardown_failures() noexcept
{
  return detail::teardown_failures.load();
}

template <class Runtime>
basic_caching_allocator<Runtime>::~basic_caching_allocator()
{
  lifetime_.expire();  // first: RAII types destroyed later must find this allocator gone
  threads_.leave();    // threads that exit from now on leave its caches alone
  teardown();
}

/// A runtime call of teardown: tried twice; a call that fails both times is counted.
template <class Runtime>
struct basic_caching_allocator<Runtime>::teardown_calls {
  std::uint64_t failed{0};
  template <class F>
  void operator()(F&& f) noexcept
  {
    if (f() != Runtime::success && f() != Runtime::success) { ++failed; }
  }
};

// Every segment goes back, whatever it holds. Never throws: a runtime call that fails is tried
// once more (a stream-ordered free that fails becomes a synchronous one), and what still fails is
// counted (caching_allocator_teardown_failures) and reported once on stderr.
template <class Runtime>
void basic_caching_allocator<Runtime>::teardown() noexcept
{
  detail::pool_lock lock{mutex_};
  teardown_calls call;
  std::optional<device_guard<Runtime>> guard;
  for (int attempt = 0; attempt < 2 && !guard; ++attempt) {
    try {
      guard.emplace(runtime_, device_);
    } catch (...) {  // the frees below name their memory: they go on without the guard
    }
  }
  if (!guard) { ++call.failed; }
  streams_.teardown_events(call);  // the events of pending frees, migrations and spares
  // The streams blocks were last used on may be gone by now (a stream destroyed after
  // forget_stream, or never forgotten): wait for the device once, then free everything in the
  // order of the device's null stream, which always exists.
  if (stats_.segments() != 0) {
    call([&] { return runtime_.device_synchronize(); });
  }
  pages_.teardown_spares(call);
  blocks_.for_each([&](std::uintptr_t, block* b) {
    mutex_.assert_held();  // a lambda run under the lock
    if (b->prev != nullptr) { return; }
    // One segment back to the runtime, after its NVTX heap (tools reject a heap whose memory is
    // gone); a growable segment's descriptor is its layer's.
    auto* seg = static_cast<segment*>(b->segment);
    if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }
    if (seg->growable) {
      pages_.teardown_segment(*seg, call);
    } else {
      segments_.teardown(seg, call);
    }
  });
  detail::note_teardown_failures(call.failed, device_);
}

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
  std::size_t size = 0;
  if (!detail::checked_round_up(bytes, alignment, size)) {
    throw bad_alloc{"gpukit: allocate_async: " + std::to_string(bytes) +
                    " bytes cannot be rounded up to 256 (device " + std::to_string(device_) + ")"};
  }
  thread_cache& tc = threads_.local(front_operations{*this});
  if (tc.flush_requested.load(std::memory_order_relaxed)) {
    front_type::flush(tc, front_operations{*this});
  }
  if (front_type::admits(tc, options_, size) &&
      captures_underway_.load(std::memory_order_relaxed) == 0) {
    if (block* b = tc.pop(stream, size, options_.small_request_bytes)) {
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
  bool waited = false;
  detail::pool_lock lock{mutex_, waited};
  front_type::note_pool_lock(tc, waited, options_);
  streams_.check_stream(stream, "allocate_async");
  int const kind     = kind_for(size);
  bool const capture = captures_underway_.load(std::memory_order_relaxed) != 0;
  if (capture) {
    if (capture_pool* cp = capture_for(stream)) {
      return allocate_captured(bytes, size, kind, *cp, stream, tc);
    }
  }
  if (guards_.on() && !capture) {  // guard pages (detail/caching/guard_page_source.hpp)
    auto reserve = [&](std::size_t n, bool& oom) {
      mutex_.assert_held();  // these lambdas run under the lock
      return pages_.reserve_range(n, kind, stream, oom, segment_pool{*this});
    };
    auto map_run = [&](block* u, std::uintptr_t at, std::size_t pages, bool& oom) {
      mutex_.assert_held();
      return pages_.map_run(u, at, pages, oom, segment_pool{*this});
    };
    auto free_run = [&](block* run) {
      mutex_.assert_held();
      insert_free(run);
    };
    auto reclaim = [&] {
      mutex_.assert_held();
      stats_.count(&caching_allocator_stats::num_alloc_retries);
      pages_.release(0, nullptr, segment_pool{*this});
    };
    block* b = guards_.allocate(bytes, size, stream, pages_.page_bytes(kind), pages_.unmapped(kind),
                                reserve, map_run, free_run, reclaim);
    if (b == nullptr) { oom_.throw_oom(bytes, size, oom_operations{*this, tc}); }
    return hand_out(tc, b, bytes, stream);
  }
  block* b = find_reusable(size, kind, stream, tc, capture);
  if (b == nullptr) { b = new_memory(bytes, size, kind, stream, tc, capture); }
  return hand_out(tc, take(b, size, bytes, stream), bytes, stream);
}

// A free block of `size` bytes for `stream` from what the pool holds: after the pending frees whose
// events completed, then blocks other streams freed, then the smallest block this thread caches
// for `stream` that holds the request (the pool splits it; the rest of the cache stays), then all
// of this thread's cached blocks (of any stream: they may coalesce into what is needed). A thread
// whose cache holds what a request needs thus never grows the pool for it, and a miss does not
// empty its cache. While a graph is being captured (in global mode),
// event queries and synchronizations are illegal on every thread: blocks waiting on events stay
// where they are until it ends. nullptr when none fits.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::find_reusable(
  std::size_t size, int kind, stream_type stream, thread_cache& tc, bool capture)
{
  if (!capture && streams_.has_pending()) {  // the oldest memory first
    streams_.poll_pending(false, stream_operations{*this});
  }
  block* b = find_free_or_migrate(size, kind, stream, capture);
  if (b == nullptr && tc.cached_bytes.get() > 0) {
    if (front_type::release_fitting(tc, stream, size, kind, front_operations{*this})) {
      b = find_free_or_migrate(size, kind, stream, capture);
    }
    if (b == nullptr) {
      front_type::drain(tc, front_operations{*this});
      b = find_free_or_migrate(size, kind, stream, capture);
    }
  }
  return b;
}

// A free block of this stream's or the global pool; else, outside captures, the same after moving
// the blocks other streams freed whose work has completed.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::find_free_or_migrate(std::size_t size, int kind,
                                                       stream_type stream, bool capture)
{
  block* b = find_free(size, kind, stream);
  if (b == nullptr && !capture && streams_.migrate(stream, false, stream_operations{*this})) {
    b = find_free(size, kind, stream);
  }
  return b;
}

// No free block fits: new memory from the runtime, else the out-of-memory ladder.
// @throws gpukit::out_of_memory when the ladder finds nothing either
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::new_memory(
  std::size_t bytes, std::size_t size, int kind, stream_type stream, thread_cache& tc, bool capture)
{
  std::vector<stream_type> freed_on;
  if (options_.release_before_grow && !growable_) {
    // Fully free segments of this kind are too small for the request. Give them back before
    // taking a new segment, so they do not add to the peak (stream-ordered frees in the order of
    // the stream that used them: no wait).
    segments_.release(0, freed_on, kind, nullptr, segment_pool{*this});
  }
  bool oom = false;
  segment_pool pool{*this};
  block* b = growable_ ? pages_.grow(size, kind, stream, oom, pool)
                       : segments_.take(size, kind, stream, oom, pool);
  if (b != nullptr) { return b; }
  stats_.count(&caching_allocator_stats::num_alloc_retries);
  oom_operations ops{*this, tc};
  typename oom_ladder::request r{size,     kind,    stream,
                                 freed_on, capture, options_.oom_wait_for_frees_ms};
  b = oom_.recover(r, ops, mutex_);
  if (b == nullptr) { oom_.throw_oom(bytes, size, ops); }
  return b;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::add_oom_callback(oom_callback callback)
{
  GPUKIT_EXPECTS(static_cast<bool>(callback), "add_oom_callback: the callback is empty");
  detail::pool_lock lock{mutex_};
  oom_.add_callback(std::move(callback));
}

// Every path that gives a block to a user ends here: the thread's map and counters, then the
// optional recording and annotation.
template <class Runtime>
__attribute__((always_inline)) inline void* basic_caching_allocator<Runtime>::hand_out(
  thread_cache& tc, block* b, std::size_t bytes, stream_type stream)
{
  b->owner.store(&tc, std::memory_order_release);
  tc.handed_out.insert(b->address(), b);
  if (tc.handed_out.size() > tc.purge_at) { front_type::purge_handed_out(tc); }
  bool const shared = shared_.on.load(std::memory_order_relaxed);
  if (shared && !tc.joined) {  // before this thread's own count: see join
    stats_type::join_shared_counts(shared_, tc, pending_);
  }
  tc.count_alloc(b->kind, static_cast<std::int64_t>(b->size), static_cast<std::int64_t>(bytes),
                 pending_);
  if (shared) {  // batched: folds only when the thread's delta leaves its bound
    auto const k = static_cast<std::size_t>(b->kind);
    shared_.count_op(b->kind, tc.pools[k].net(), tc.folded[k], pending_);
  }
  if (recording_.on.load(std::memory_order_relaxed)) {
    recorder_type::record(tc, recording_.capacity.load(std::memory_order_relaxed),
                          memory_event::action::alloc, b, stream);
  }
  annotate_alloc(b, bytes);
  return b->data();
}

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

// The fast path: a block this thread handed out goes back to its cache, with no lock. Blocks of
// other threads, blocks used on other streams (record_stream) and blocks the cache has no room for
// go through the pool lock. Every free is accepted by one compare-exchange on the block's owner
// (claim_own, claim_foreign): of two racing frees exactly one wins, the other is a double free.
template <class Runtime>
void basic_caching_allocator<Runtime>::deallocate_impl(void* ptr, std::size_t bytes,
                                                       bool check_size, stream_type stream)
{
  if (ptr == nullptr) { return; }
  if (debug_ != nullptr && debug_free(ptr, bytes, check_size, stream)) { return; }  // debug mode
  auto const key     = reinterpret_cast<std::uintptr_t>(ptr);
  thread_cache& tc   = threads_.local(front_operations{*this});
  bool const dead    = free_stream_dead(tc, stream);
  block* b           = claim_own(tc, key, bytes, check_size);
  bool const foreign = b == nullptr;  // allocated by another thread (or an earlier life)
  void* owner        = &tc;           // the cache that handed the block out (claim_foreign sets it)
  if (foreign) { b = claim_foreign(ptr, bytes, check_size, owner); }
  if (dead) {
    free_on_dead_stream(tc, b, ptr, stream);
    return;
  }
  if (!b->recorded.empty()) {
    defer_free(tc, b, ptr, stream, owner);
    return;
  }
  count_free(tc, b, ptr, stream);
  b->state.store(detail::block_state::cached, std::memory_order_relaxed);
  // A block another thread allocated goes back to the pool, not to this thread's cache: a thread
  // that frees what others allocate (PyTorch's autograd threads) would otherwise strand it.
  if (!foreign && front_type::push(tc, b, stream, options_, captures_underway_)) { return; }
  return_to_pool(tc, b, stream);
}

// Whether the free's stream, one this thread's cache does not know yet, was found destroyed: it is
// checked first (device, liveness), as allocations check theirs; a known one costs one comparison.
// @throws gpukit::logic_error for another device's stream
template <class Runtime>
__attribute__((always_inline)) inline bool basic_caching_allocator<Runtime>::free_stream_dead(
  thread_cache& tc, stream_type stream)
{
  return !(stream == stream_type{}) && !(stream == tc.checked_stream) &&
         tc.find(stream) == nullptr && !check_free_stream(tc, stream);
}

// A free on a stream this thread has not used yet: true when it is a live stream of this device
// (remembered by the thread), false when it was destroyed (then retired: see
// stream_pools::retire_dead_stream).
// @throws gpukit::logic_error for another device's stream; gpukit::cuda_error when the runtime
//         fails otherwise (nothing changes in both cases)
template <class Runtime>
bool basic_caching_allocator<Runtime>::check_free_stream(thread_cache& tc, stream_type stream)
{
  detail::pool_lock lock{mutex_};
  bool const live =
    streams_.check_live_stream(stream, "deallocate_async", stream_operations{*this});
  if (live && streams_.checked(stream)) {
    tc.checked_stream = stream;  // not a stream taken on trust while it is capturing
  }
  return live;
}

// A block freed on a destroyed stream (already retired: the device has been synchronized): usable
// by every stream at once.
template <class Runtime>
void basic_caching_allocator<Runtime>::free_on_dead_stream(thread_cache& tc, block* b, void* ptr,
                                                           stream_type stream)
{
  detail::pool_lock lock{mutex_};
  count_free(tc, b, ptr, stream);
  b->recorded.clear();
  b->stream = stream_type{};
  b->global = true;
  insert_free(b);
  oom_.wake_waiters();
}

// Freed block b goes back to the shared pool, on `stream`.
template <class Runtime>
void basic_caching_allocator<Runtime>::return_to_pool(thread_cache& tc, block* b,
                                                      stream_type stream)
{
  bool waited = false;
  detail::pool_lock lock{mutex_, waited};
  front_type::note_pool_lock(tc, waited, options_);
  streams_.unforget(stream);  // a user's free on it: a live stream (a reused handle)
  free_to_pool(b, stream);
}

// The block this thread handed out at `key`, claimed for this free; nullptr when this thread's
// record is missing or refers to an earlier life of the block (another thread freed it since; the
// block may now be another thread's), which the caller treats as a free by another thread.
// @throws gpukit::logic_error for a size other than the one allocated (nothing claimed)
template <class Runtime>
__attribute__((always_inline)) inline typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::claim_own(thread_cache& tc, std::uintptr_t key, std::size_t bytes,
                                            bool check_size)
{
  block* b = tc.handed_out.find(key);
  if (b == nullptr) { return nullptr; }
  void* expected = &tc;
  if (b->address() == key && b->owner.load(std::memory_order_acquire) == expected) {
    GPUKIT_EXPECTS(!check_size || bytes == b->requested,
                   "deallocate: pointer " + detail::hex(b->data()) + " was allocated with " +
                     std::to_string(b->requested) + " bytes but freed with " +
                     std::to_string(bytes));
    if (b->owner.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
      return b;
    }
  }
  tc.handed_out.erase(key);  // stale: the block was freed by another thread since
  return nullptr;
}

// A pointer this thread did not hand out (or an error): its block in the pool, claimed for this
// free; `owner` receives the cache that handed it out (to undo the claim).
// @throws gpukit::logic_error for a pointer this allocator did not hand out, a double free or a
//         size other than the one allocated; nothing changes then
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::claim_foreign(
  void* ptr, std::size_t bytes, bool check_size, void*& owner)
{
  detail::pool_lock lock{mutex_};
  block* b = blocks_.find(ptr);
  if (b == nullptr) {
    GPUKIT_EXPECTS(false, "deallocate: pointer " + detail::hex(ptr) +
                            " was not allocated by this allocator (device " +
                            std::to_string(device_) + ")");
  }
  auto const double_free = [&] {
    return "deallocate: double free of " + detail::hex(ptr) + " (a block of " +
           std::to_string(b->size) + " bytes that is already free, device " +
           std::to_string(device_) + ")";
  };
  owner = b->owner.load(std::memory_order_acquire);
  GPUKIT_EXPECTS(
    owner != nullptr && b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
    double_free());
  GPUKIT_EXPECTS(!check_size || bytes == b->requested,
                 "deallocate: pointer " + detail::hex(ptr) + " was allocated with " +
                   std::to_string(b->requested) + " bytes but freed with " + std::to_string(bytes));
  // The owner's own free may race with this one (it takes no lock): one compare-exchange wins.
  GPUKIT_EXPECTS(b->owner.compare_exchange_strong(owner, nullptr, std::memory_order_acq_rel,
                                                  std::memory_order_relaxed),
                 double_free());
  return b;
}

// Every free counts here: the annotation, the thread's map and counters, the optional recording.
// `pending`: the block joins the pending frees (still active) right after, under the pool lock.
template <class Runtime>
__attribute__((always_inline)) inline void basic_caching_allocator<Runtime>::count_free(
  thread_cache& tc, block* b, void* ptr, stream_type stream, bool pending)
{
  if (options_.nvtx_annotate && debug_ == nullptr) {
    unregister_memory_region(ptr);
  }  // debug: done
  tc.handed_out.erase(reinterpret_cast<std::uintptr_t>(ptr));
  bool const shared = shared_.on.load(std::memory_order_relaxed);
  if (shared && !tc.joined) { stats_type::join_shared_counts(shared_, tc, pending_); }
  auto const k = static_cast<std::size_t>(b->kind);
  // A free that goes pending is folded exactly: the delta stays what it was.
  detail::kind_counts const keep =
    shared && pending ? tc.pools[k].net() - tc.folded[k] : detail::kind_counts{};
  tc.count_free(b->kind, static_cast<std::int64_t>(b->size),
                static_cast<std::int64_t>(b->requested));
  if (shared && pending) {
    shared_.fold(b->kind, tc.pools[k].net(), tc.folded[k], keep, pending_);
  } else if (shared) {
    shared_.count_op(b->kind, tc.pools[k].net(), tc.folded[k], pending_);
  }
  if (recording_.on.load(std::memory_order_relaxed)) {
    recorder_type::record(tc, recording_.capacity.load(std::memory_order_relaxed),
                          memory_event::action::free, b, stream);
  }
}

// A block used on other streams too (record_stream): reusable once the work queued there up to
// now has completed, so it waits as a pending free on an event per such stream. During a graph
// capture (of this allocator, or on any of those streams) an event would be part of the graph and
// could not be queried: the block waits, its events unrecorded, until the capture has ended
// (stream_pools::poll_pending arms it), kept for the capture's pool as free_to_pool would keep it.
template <class Runtime>
void basic_caching_allocator<Runtime>::defer_free(thread_cache& tc, block* b, void* ptr,
                                                  stream_type stream, void* owner)
{
  detail::pool_lock lock{mutex_};
  pending_free pf;
  pf.b      = b;
  pf.stream = stream;
  std::optional<device_guard<Runtime>> guard;  // its query and switch can fail too: inside the try
  try {
    if (streams_.defer_in_capture(b, stream, pf, stream_operations{*this})) {
      park_pending(tc, b, ptr, std::move(pf));
      return;
    }
    guard.emplace(runtime_, device_);
    streams_.record_uses(b, stream, pf, stream_operations{*this});
  } catch (...) {  // the block stays allocated, as if this call had not been made
    streams_.give_events(pf.events);
    b->owner.store(owner, std::memory_order_release);
    throw;
  }
  if (pf.events.empty()) {  // every other stream was destroyed and waited for
    count_free(tc, b, ptr, stream);
    b->recorded.clear();
    free_to_pool(b, stream);
    return;
  }
  park_pending(tc, b, ptr, std::move(pf));
}

// b, freed, waits as a pending free (still active in the statistics until its events complete).
template <class Runtime>
void basic_caching_allocator<Runtime>::park_pending(thread_cache& tc, block* b, void* ptr,
                                                    pending_free&& pf)
{
  // Counted free first, then pending (both under the pool lock, so readers see neither alone):
  // the fold leaves the shared value as the block joins the pending frees, so no fold on another
  // thread adds the block twice to an active peak.
  count_free(tc, b, ptr, pf.stream, true);
  pending_.add(b->kind, static_cast<std::int64_t>(b->size), 1);
  streams_.park(std::move(pf));
}

template <class Runtime>
void basic_caching_allocator<Runtime>::record_stream(void* ptr, stream_type stream)
{
  auto const key = reinterpret_cast<std::uintptr_t>(ptr);
  detail::pool_lock lock{mutex_};
  streams_.check_stream(stream, "record_stream");
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

template <class Runtime>
void basic_caching_allocator<Runtime>::forget_stream(stream_type stream)
{
  if (debug_ != nullptr) {  // debug mode: quarantined frees on it go back while it lives
    debug_->flush(
      stream, [this](auto const& e) { deallocate_impl(e.ptr, e.bytes, e.check_size, e.stream); });
  }
  thread_cache& tc = threads_.local(front_operations{*this});
  detail::pool_lock lock{mutex_};
  front_type::drain(tc, front_operations{*this});
  if (tc.checked_stream == stream) { tc.checked_stream = stream_type{}; }
  streams_.forget(stream, false, stream_operations{*this});
}

// Debug mode's part of every free (detail/caching/quarantine.hpp): true when it took the free (the
// caller returns). Under the quarantine's lock, the free is checked against the pool's books under
// the pool lock; a block with guard pages is then freed at once (guard_free), any other poisoned
// and quarantined. The frees the quarantine pushes out go back through the ordinary free path.
// @throws gpukit::logic_error for a pointer this allocator did not hand out, a double free (also
// of a block still in quarantine) or a size that differs from the allocation's
template <class Runtime>
bool basic_caching_allocator<Runtime>::debug_free(void* ptr, std::size_t bytes, bool check_size,
                                                  stream_type stream)
{
  auto const admit = [&]() -> std::optional<std::size_t> {
    std::size_t size = 0;
    bool guarded     = false;
    {
      detail::pool_lock lock{mutex_};
      guards_.check_free(ptr);
      size    = debug_->check_free(blocks_.find(ptr), ptr, bytes, check_size);
      guarded = guards_.holds(ptr);
    }
    if (guarded && captures_underway_.load(std::memory_order_relaxed) == 0) {
      guard_free(ptr, bytes, check_size, stream);
      return std::nullopt;
    }
    if (guarded) {  // freed while a graph is being captured (no waiting): an ordinary free
      detail::pool_lock lock{mutex_};
      guards_.forget(ptr);
    }
    return size;
  };
  return debug_->free(ptr, bytes, check_size, stream, admit, [this](auto const& e) {
    deallocate_impl(e.ptr, e.bytes, e.check_size, e.stream);
  });
}

// Guard pages: the free of a guarded block, checked by debug_free (the quarantine's lock held).
// Waits for the block's streams, then unmaps its run (the pages become spare pages). A stream found
// destroyed costs a device synchronization.
// @throws gpukit::cuda_error when a wait fails (the block stays allocated) or an unmap fails (the
//         block is free; its pages stay mapped until release)
template <class Runtime>
void basic_caching_allocator<Runtime>::guard_free(void* ptr, std::size_t bytes, bool check_size,
                                                  stream_type stream)
{
  thread_cache& tc = threads_.local(front_operations{*this});
  void* owner      = nullptr;
  block* b         = claim_foreign(ptr, bytes, check_size, owner);
  std::vector<stream_type> streams{stream};
  {
    detail::pool_lock lock{mutex_};
    streams.insert(streams.end(), b->recorded.begin(), b->recorded.end());
  }
  try {
    guard_source::wait_for_streams(runtime_, device_, streams);
  } catch (...) {
    b->owner.store(owner, std::memory_order_release);  // as if this free had not been made
    throw;
  }
  count_free(tc, b, ptr, stream);
  detail::pool_lock lock{mutex_};
  block* merged = insert_free(guards_.retire(b, options_.debug.quarantine_blocks));
  oom_.wake_waiters();
  // The free has happened: from here nothing throws (a caller told of an error would free the
  // block again). Pages that cannot be unmapped now stay mapped until release() unmaps them.
  try {
    typename Runtime::error_type error = Runtime::success;
    device_guard<Runtime> guard{runtime_, device_};
    pages_.unmap_free_pages(merged, std::numeric_limits<std::size_t>::max(), error,
                            segment_pool{*this});
    if (error != Runtime::success) {
      stats_.count(&caching_allocator_stats::num_guard_unmap_failures);
    }
  } catch (...) {
    stats_.count(&caching_allocator_stats::num_guard_unmap_failures);
  }
}

// ---- Observers: statistics (detail/caching/allocator_stats.hpp) and the recorded history
// (detail/caching/event_recorder.hpp), with the pieces they read from the other layers.

template <class Runtime>
caching_allocator_stats basic_caching_allocator<Runtime>::stats() const
{
  detail::pool_lock lock{mutex_};
  return stats_.read(threads_.caches(),
                     stats_type::scan(streams_.pending(), streams_.pools(), blocks_.globals()));
}

template <class Runtime>
void basic_caching_allocator<Runtime>::reset_peak()
{
  detail::pool_lock lock{mutex_};
  stats_.reset_peak(threads_.caches(),
                    stats_type::scan(streams_.pending(), streams_.pools(), blocks_.globals()));
}

template <class Runtime>
void basic_caching_allocator<Runtime>::start_recording(std::size_t events_per_thread)
{
  GPUKIT_EXPECTS(events_per_thread > 0, "start_recording: the ring must hold at least one event");
  detail::pool_lock lock{mutex_};
  recorder_.start_recording(threads_.caches(), events_per_thread);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::stop_recording()
{
  recording_.on.store(false, std::memory_order_relaxed);
}

template <class Runtime>
memory_snapshot basic_caching_allocator<Runtime>::snapshot() const
{
  detail::pool_lock lock{mutex_};
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
        g.stream  = recorder_type::stream_id(head->stream);
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
  recorder_.fill_events(s, threads_.caches());
  return s;
}

// ---- the pool: what the segments' layers ask of it, the free indices, splitting and coalescing,
// the extent of a block, the export of growable pages (gpukit/memory/ipc.hpp) and the peers
// granted access to them ----

template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::find_free(
  std::size_t size, int kind, stream_type stream)
{
  if (block* b = streams_.find(size, kind, stream)) { return b; }
  return blocks_.global(kind).find(size);
}

// Takes free block b for an allocation of `size` bytes (`bytes` asked) on `stream`; the tail goes
// back free to b's pool (detail/caching/block_index.hpp).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::take(
  block* b, std::size_t size, std::size_t bytes, stream_type stream)
{
  blocks_.carve(b, size, [this](block const* x) -> detail::tlsf_index<block>& {
    mutex_.assert_held();  // a lambda run under the lock
    return index_for(x);
  });
  b->state.store(detail::block_state::allocated, std::memory_order_relaxed);
  b->requested = bytes;
  b->stream    = stream;
  b->global    = false;
  return b;
}

template <class Runtime>
detail::tlsf_index<typename basic_caching_allocator<Runtime>::block>&
basic_caching_allocator<Runtime>::index_for(block const* b)
{
  if (b->capture_pool != 0) { return capture_.at(b->capture_pool).index[b->kind]; }
  if (b->global) { return blocks_.global(b->kind); }
  return streams_.pool_of(b->stream).index[b->kind];
}

// Inserts free block b (state free, owner set) into its index, merging free neighbours first.
// Returns the block that holds b's bytes now (b, or the free block before it that absorbed it).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::insert_free(
  block* b)
{
  return blocks_.insert_free(b, [this](block const* x) -> detail::tlsf_index<block>& {
    mutex_.assert_held();  // a lambda run under the lock
    return index_for(x);
  });
}

template <class Runtime>
void basic_caching_allocator<Runtime>::free_to_pool(block* b, stream_type stream)
{
  if (b->capture_pool == 0 && captures_underway_.load(std::memory_order_relaxed) != 0) {
    // Freed on a stream being captured: the graph may use the block when it replays, so it is
    // kept for that capture's pool (reusable within it) until release_capture_pool.
    if (capture_pool* cp = capture_for(stream, true)) { b->capture_pool = cp->id; }
  }
  if (b->capture_pool != 0) {
    b->stream = stream;
    b->global = false;
    insert_free(b);
    return;
  }
  if (streams_.forgotten(stream)) {
    // Freed on a stream forget_stream has synchronized (a pending free completing, another
    // thread's cache flushing): its work is done, and the stream may be gone: any stream's now.
    b->stream = stream_type{};
    b->global = true;
    insert_free(b);
    oom_.wake_waiters();
    return;
  }
  b->stream   = stream;
  b->global   = false;
  b->free_seq = streams_.next_free_seq(stream);
  insert_free(b);
  oom_.wake_waiters();
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::block_extent basic_caching_allocator<Runtime>::extent(
  void const* ptr) const
{
  detail::pool_lock lock{mutex_};
  block const* b = blocks_.find(ptr);
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

template <class Runtime>
typename basic_caching_allocator<Runtime>::shared_pages
basic_caching_allocator<Runtime>::share_pages(void const* ptr)
{
  detail::pool_lock lock{mutex_};
  block const* b = blocks_.find(ptr);
  GPUKIT_EXPECTS(
    b != nullptr && b->state.load(std::memory_order_relaxed) == detail::block_state::allocated,
    "caching_allocator::share_pages: " + detail::hex(ptr) +
      " is not a block this allocator has handed out (device " + std::to_string(device_) + ")");
  auto* seg = static_cast<segment*>(b->segment);
  GPUKIT_EXPECTS(seg->growable, "caching_allocator::share_pages: " + detail::hex(ptr) +
                                  " lies in a " +
                                  (seg->stream_ordered ? "cudaMallocAsync" : "cudaMalloc") +
                                  " segment, not a growable one (export_block shares it)");
  GPUKIT_EXPECTS(!seg->fds.empty(),
                 "caching_allocator::share_pages: " + detail::hex(ptr) +
                   " lies in a growable segment whose pages are not shareable: set "
                   "caching_allocator_options::growable_shareable");
  std::size_t const off   = b->address() - reinterpret_cast<std::uintptr_t>(seg->ptr);
  std::size_t const first = off / seg->page;
  std::size_t const last  = (off + b->size - 1) / seg->page;
  shared_pages out;
  out.offset = off - first * seg->page;
  out.bytes  = b->size;
  out.pages.reserve(last + 1 - first);
  for (int fd : pages_.export_pages(*seg, first, last)) {
    out.pages.push_back(shared_page{fd, seg->page});
  }
  return out;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::grant_access(int peer_device)
{
  GPUKIT_EXPECTS(
    peer_device >= 0 && peer_device < 64,
    "caching_allocator::grant_access: device " + std::to_string(peer_device) + " is out of range");
  detail::pool_lock lock{mutex_};
  pages_.grant(peer_device);
}

template <class Runtime>
std::vector<int> basic_caching_allocator<Runtime>::peers() const
{
  detail::pool_lock lock{mutex_};
  return pages_.peers();
}

// ---- giving memory back: release and trim (segments: detail/caching/segment_source.hpp and
// growable_source.hpp; the out-of-memory ladder and release_before_grow release them too) ----

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release()
{
  if (debug_ != nullptr) {  // debug mode: the quarantine's blocks are free memory too
    debug_->flush_all(
      [this](auto const& e) { deallocate_impl(e.ptr, e.bytes, e.check_size, e.stream); });
  }
  return trim(0);
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::trim(std::size_t target_reserved_bytes)
{
  thread_cache& tc = threads_.local(front_operations{*this});
  detail::pool_lock lock{mutex_};
  front_type::drain(tc, front_operations{*this});
  threads_.request_flush_except(tc);
  if (captures_underway_.load(std::memory_order_relaxed) == 0) {
    streams_.poll_pending(false, stream_operations{*this});
  }
  return segments_.release(target_reserved_bytes, oom_.unsettled(), -1, nullptr,
                           segment_pool{*this});
}

// ---- graph captures: each capture's private pool (detail/caching/capture_pools.hpp)

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_id
basic_caching_allocator<Runtime>::begin_capture(stream_type stream)
{
  detail::pool_lock lock{mutex_};
  capture_id const id = capture_.begin(stream);
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
  return id;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::resume_capture(stream_type stream, capture_id id)
{
  detail::pool_lock lock{mutex_};
  capture_.resume(stream, id);
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::end_capture(stream_type stream)
{
  detail::pool_lock lock{mutex_};
  capture_.end(stream);
  captures_underway_.fetch_sub(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::begin_capture_window()
{
  detail::pool_lock lock{mutex_};
  capture_.open_window();
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::end_capture_window()
{
  detail::pool_lock lock{mutex_};
  capture_.close_window(device_);
  captures_underway_.fetch_sub(1, std::memory_order_relaxed);
}

// Free blocks of the pool become ordinary free blocks of every stream (the graph is gone and its
// launches done, by the caller's word); blocks still allocated become ordinary blocks when freed.
template <class Runtime>
void basic_caching_allocator<Runtime>::release_capture_pool(capture_id id)
{
  detail::pool_lock lock{mutex_};
  std::vector<block*> const movers = capture_.release(id);
  for (block* b : movers) {
    b->state.store(detail::block_state::pending, std::memory_order_relaxed);
  }
  blocks_.for_each([&](std::uintptr_t, block* b) {
    if (b->capture_pool == id) { b->capture_pool = 0; }
  });
  for (block* b : movers) {
    b->global = true;
    insert_free(b);
  }
}

// During capture: blocks come from the capture's private pool (for its stream and the streams
// joined to it); new segments from a synchronous malloc made in relaxed capture mode (legal during
// capture, and not part of the graph).
template <class Runtime>
void* basic_caching_allocator<Runtime>::allocate_captured(std::size_t bytes, std::size_t size,
                                                          int kind, capture_pool& cp,
                                                          stream_type stream, thread_cache& tc)
{
  block* b = cp.index[kind].find(size);
  if (b == nullptr) {
    bool oom = false;
    segment_pool pool{*this};
    block* nb = segments_.take_for_capture(size, kind, cp.stream, cp.id, oom, pool);
    if (nb == nullptr) { oom_.throw_oom(bytes, size, oom_operations{*this, tc}); }
    cp.index[kind].insert(nb);
    b = nb;
  }
  return hand_out(tc, take(b, size, bytes, stream), bytes, stream);
}

}  // namespace gpukit
