// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/oom_ladder.hpp: what the caching allocator does when no memory is
// left: the out-of-memory ladder (the steps of recovery_step_names, in that order, each followed by
// a fresh search of the pool and one more try of the runtime), the user's callbacks, the waits for
// stream-ordered frees still on their way, and the out_of_memory exception with its report and
// hint. Not public API.
//
// Single-threaded: the allocator calls it under its pool lock, and passes that lock in: the
// callbacks step releases it around each callback (pool_lock::unlocked_scope, the one step run
// without it), and the wait step waits on it. What a step does to the pool it asks of an operations
// object the allocator passes at each call (`Ops` below: a template parameter, so the calls are
// static, never virtual); the stream waits and the device's free memory it asks of the runtime.
//
// Owns: the callbacks; what the last recovery did (steps(), the report's steps); the condition
// variable that the wait step waits on and the count of recoveries waiting (wake_waiters() is
// called as blocks come back to the pool); and the streams of stream-ordered frees issued outside
// a recovery (release(), trim()) that no recovery has waited for yet (unsettled()).
//
// Invariants:
// - once a recovery has begun, steps() holds one entry per step, named as recovery_step_names;
//   a step that did not apply (nothing to collect during a capture, no callbacks, no wait) stays
//   not attempted;
// - waiters() counts the recoveries blocked in the wait step now;
// - every recovery that does not return a block has waited for every stream of unsettled() and of
//   its request's freed_on (but those capturing, which stay in unsettled()): the allocator is never
//   out of memory while frees it issued may still be on their way, outside captures.
//
// `Ops`, the pool's operations (called with the pool lock held; Block* results nullptr for none):
//   Block* find_free(std::size_t size, int kind, stream_type stream)    a free block that fits
//   Block* new_segment(std::size_t size, int kind, stream_type stream)  new memory from the runtime
//   std::size_t poll_pending(bool wait)      pending frees whose events completed (wait: waited)
//   std::size_t migrate(stream_type requester, bool wait)  blocks other streams freed, made global
//   void drain_cache()                       the calling thread's cached blocks back to the pool
//   void flush_other_caches()                asks the other threads to return theirs
//   std::size_t release_segments(std::vector<stream_type>& freed_on, stream_type const* only)
//                                            whole free segments (of `only`'s pool, nullptr: all)
//                                            back to the device; their streams go to freed_on
//   bool is_capturing(stream_type)           whether a stream is being captured into a graph
//   void retire_dead_stream(stream_type)     a destroyed stream's blocks made every stream's
//   std::size_t reserved(), limit(), allocated()   the pool's bytes reserved, limit, in users'
//   hands Context callback_context(std::size_t size)     what a callback is told
//   (Callback(Context)) void for_each_free_pool(F f)             f(stream_type const* stream, Index
//   const& small,
//                                            Index const& large) for each stream's free indices,
//                                            then once for the global ones with stream nullptr
//                                            (Index: bytes(), largest())
//   void count_step(int step, std::size_t reclaimed), count_release_wait(), count_oom(size)
//                                            the statistics (and count_oom: the recorded event)
#pragma once

#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator_stats.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace gpukit::detail::caching {

/// The out-of-memory ladder of a caching allocator; see the top of this file.
template <class Runtime, class Block, class Callback>
class oom_ladder {
 public:
  using stream_type   = typename Runtime::stream_type;
  using callback_type = Callback;

  /// The steps, in the order of recovery_step_names.
  enum step : int {
    step_events,
    step_callbacks,
    step_release_stream,
    step_release_all,
    step_other_pool,
    step_wait,
  };
  static_assert(step_wait + 1 == recovery_step_count, "one enumerator per recovery_step_names");

  /// What one recovery works on.
  struct request {
    std::size_t size{0};                 // bytes (rounded to the allocator's granularity)
    int kind{0};                         // pool kind: 0 small, 1 large
    stream_type stream{};                // the requesting stream
    std::vector<stream_type>& freed_on;  // streams whose stream-ordered frees have not landed yet
    bool capture{false};                 // a graph capture is under way: no event query, no sync
    int wait_for_frees_ms{0};            // the wait step's bound (0: no wait step)
  };

  oom_ladder(Runtime& runtime, int device) : runtime_{runtime}, device_{device} {}
  ~oom_ladder()                            = default;
  oom_ladder(oom_ladder const&)            = delete;
  oom_ladder& operator=(oom_ladder const&) = delete;
  oom_ladder(oom_ladder&&)                 = delete;
  oom_ladder& operator=(oom_ladder&&)      = delete;

  /// Runs `callback` in the callbacks step, after those added before.
  void add_callback(Callback callback) { callbacks_.push_back(std::move(callback)); }
  [[nodiscard]] std::size_t callback_count() const noexcept { return callbacks_.size(); }
  /// What the last recovery did, one entry per step (empty before the first).
  [[nodiscard]] std::vector<oom_report::step> const& steps() const noexcept { return steps_; }
  /// Where the streams of stream-ordered frees issued outside a recovery go (release(), trim()):
  /// the next recovery waits for them.
  [[nodiscard]] std::vector<stream_type>& unsettled() noexcept { return unsettled_; }
  /// Recoveries blocked in the wait step now.
  [[nodiscard]] int waiters() const noexcept { return waiters_; }
  /// Blocks came back to the pool: wakes the recoveries in the wait step, if any.
  void wake_waiters()
  {
    if (waiters_ != 0) { frees_cv_.notify_all(); }
  }

  /// The ladder: what is still on its way first, then each step until one finds a block; before
  /// giving up, the frees issued meanwhile are waited for and the pool tried once more. Returns
  /// nullptr when every step failed; steps() then holds what each reclaimed. `mutex`, the pool
  /// lock, is released around the callbacks and while waiting for frees.
  template <class Ops>
  Block* recover(request& r, Ops& ops, annotated_mutex& mutex) GPUKIT_REQUIRES(mutex)
  {
    static_assert(std::size(ladder<Ops>) == recovery_step_count, "one function per step");
    steps_.assign(recovery_step_count, oom_report::step{});
    for (std::size_t i = 0; i < steps_.size(); ++i) { steps_[i].name = recovery_step_names[i]; }
    settle_frees(r, ops);  // segments returned just before the failed try (release_before_grow)
    if (Block* b = retry(r, ops)) { return b; }
    for (step_fn<Ops> const run : ladder<Ops>) {
      if (Block* b = (this->*run)(r, ops, mutex)) { return b; }
    }
    // Never out of memory while frees this allocator issued may still be on their way.
    if (r.capture || (r.freed_on.empty() && unsettled_.empty())) { return nullptr; }
    settle_frees(r, ops);
    return retry(r, ops);
  }

  /// Counts the failure (ops.count_oom) and throws gpukit::out_of_memory for a request of `bytes`
  /// (`size` once rounded), with the report of the device, the pool and the last recovery.
  template <class Ops>
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Ops&& ops)
  {
    ops.count_oom(size);
    oom_report r;
    r.requested = bytes;
    r.device    = device_;
    {
      device_guard<Runtime> guard{runtime_, device_};
      (void)runtime_.mem_get_info(r.device_free, r.device_total);
    }
    r.allocated = ops.allocated();
    r.reserved  = ops.reserved();
    r.limit     = ops.limit();
    ops.for_each_free_pool([&r](stream_type const* stream, auto const& small, auto const& large) {
      std::size_t const cached = small.bytes() + large.bytes();
      r.total_free_in_pool += cached;
      r.largest_free_block = std::max({r.largest_free_block, small.largest(), large.largest()});
      if (stream != nullptr && cached != 0) {
        std::uintptr_t id = 0;
        std::memcpy(&id, stream, std::min(sizeof id, sizeof *stream));
        r.cached_per_stream.push_back({id, cached});
      }
    });
    r.steps = steps_;
    r.hint  = hint(r, size);
    throw out_of_memory{std::move(r)};
  }

 private:
  // The name of the NVTX range around step `s`.
  [[nodiscard]] static std::string range_name(step s)
  {
    return std::string{"OOM ladder: "} + recovery_step_names[s];
  }

  // A fresh search of the pool, then one more try of the runtime.
  template <class Ops>
  static Block* retry(request const& r, Ops& ops)
  {
    if (Block* b = ops.find_free(r.size, r.kind, r.stream)) { return b; }
    return ops.new_segment(r.size, r.kind, r.stream);
  }

  template <class Ops>
  void count_step(Ops& ops, step s, std::size_t reclaimed)
  {
    auto const i        = static_cast<std::size_t>(s);
    steps_[i].attempted = true;
    steps_[i].bytes_reclaimed += reclaimed;
    ops.count_step(s, reclaimed);
  }

  // Free bytes in the pool's indices.
  template <class Ops>
  static std::size_t free_bytes(Ops& ops)
  {
    std::size_t n = 0;
    ops.for_each_free_pool([&n](stream_type const*, auto const& small, auto const& large) {
      n += small.bytes() + large.bytes();
    });
    return n;
  }

  // Stream-ordered frees take effect when their stream reaches them: wait for those streams only
  // (never the whole device); then the memory is the device's again.
  template <class Ops>
  void settle_frees(request& r, Ops& ops)
  {
    if (r.capture) { return; }
    for (stream_type fs : unsettled_) {  // issued by release() and trim()
      if (std::find(r.freed_on.begin(), r.freed_on.end(), fs) == r.freed_on.end()) {
        r.freed_on.push_back(fs);
      }
    }
    unsettled_.clear();
    if (r.freed_on.empty()) { return; }
    device_guard<Runtime> guard{runtime_, device_};
    std::vector<stream_type> capturing;  // waiting would end their capture: left unsettled
    while (!r.freed_on.empty()) {
      stream_type const fs = r.freed_on.back();
      if (ops.is_capturing(fs)) {
        capturing.push_back(fs);
        r.freed_on.pop_back();
        continue;
      }
      typename Runtime::error_type const e = runtime_.stream_synchronize(fs);
      if (e == Runtime::invalid_resource_handle) {
        ops.retire_dead_stream(fs);  // synchronizes the device: every free issued has landed
      } else {
        GPUKIT_CUDA_TRY(e, "stream_synchronize (out-of-memory recovery)");
      }
      ops.count_release_wait();
      r.freed_on.pop_back();
    }
    unsettled_ = std::move(capturing);  // settled by a later recovery
  }

  // (1) Blocks whose cross-stream events have completed (no waiting).
  template <class Ops>
  Block* collect_events(request& r, Ops& ops, annotated_mutex&)
  {
    if (r.capture) { return nullptr; }
    GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, range_name(step_events));
    std::size_t const polled   = ops.poll_pending(false);
    std::size_t const migrated = ops.migrate(r.stream, false);
    count_step(ops, step_events, polled + migrated);
    ops.drain_cache();
    return retry(r, ops);
  }

  // (2) The user's callbacks, in order, without the pool lock (they may free memory through the
  // allocator); each may ask for another try.
  template <class Ops>
  Block* run_callbacks(request& r, Ops& ops, annotated_mutex& mutex) GPUKIT_REQUIRES(mutex)
  {
    if (callbacks_.empty()) { return nullptr; }
    GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, range_name(step_callbacks));
    auto const callbacks = callbacks_;  // another thread may add one while the lock is released
    for (auto const& cb : callbacks) {
      std::size_t const free_before     = free_bytes(ops);
      std::size_t const reserved_before = ops.reserved();
      auto const ctx                    = ops.callback_context(r.size);
      bool again                        = false;
      {
        pool_lock::unlocked_scope unlocked{mutex};  // the one step run without the lock
        again = cb(ctx);
      }
      ops.drain_cache();
      std::size_t const free_after     = free_bytes(ops);
      std::size_t const reserved_after = ops.reserved();
      count_step(ops, step_callbacks,
                 (free_after > free_before ? free_after - free_before : 0) +
                   (reserved_before > reserved_after ? reserved_before - reserved_after : 0));
      if (again) {
        if (Block* b = retry(r, ops)) { return b; }
      }
    }
    return nullptr;
  }

  // (3) Cached free segments of the requesting stream.
  template <class Ops>
  Block* release_stream(request& r, Ops& ops, annotated_mutex&)
  {
    GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, range_name(step_release_stream));
    count_step(ops, step_release_stream, ops.release_segments(r.freed_on, &r.stream));
    settle_frees(r, ops);
    return retry(r, ops);
  }

  // (4) Cached free segments of every stream; blocks other streams freed are first made usable,
  // waiting only on the events that guard them.
  template <class Ops>
  Block* release_all(request& r, Ops& ops, annotated_mutex&)
  {
    GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, range_name(step_release_all));
    ops.flush_other_caches();
    std::size_t moved = 0;
    if (!r.capture) {
      moved = ops.migrate(r.stream, true);
      moved += ops.poll_pending(true);
    }
    if (moved != 0) {
      if (Block* b = ops.find_free(r.size, r.kind, r.stream)) {
        count_step(ops, step_release_all, moved);
        return b;
      }
    }
    count_step(ops, step_release_all, moved + ops.release_segments(r.freed_on, nullptr));
    settle_frees(r, ops);
    return retry(r, ops);
  }

  // (5) A free block of the other pool kind. Small requests come from small segments, large ones
  // from large segments; on a full device the free memory may all sit in the other kind's blocks
  // (large blocks split by live tensors, which no release can return). The request is cut from
  // such a block: the rest stays free in its pool, and the block merges back with it when freed.
  template <class Ops>
  Block* other_pool(request& r, Ops& ops, annotated_mutex&)
  {
    GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, range_name(step_other_pool));
    Block* b = ops.find_free(r.size, r.kind ^ 1, r.stream);
    count_step(ops, step_other_pool, b != nullptr ? r.size : 0);
    return b;
  }

  // (6) A bounded wait for blocks that other threads are returning to the pool.
  template <class Ops>
  Block* wait_for_frees(request& r, Ops& ops, annotated_mutex& mutex) GPUKIT_REQUIRES(mutex)
  {
    if (r.wait_for_frees_ms <= 0) { return nullptr; }
    GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, range_name(step_wait));
    std::size_t const free_before = free_bytes(ops);
    ++waiters_;
    detail::wait_for(frees_cv_, mutex, std::chrono::milliseconds(r.wait_for_frees_ms));
    --waiters_;
    std::size_t const free_after = free_bytes(ops);
    count_step(ops, step_wait, free_after > free_before ? free_after - free_before : 0);
    if (!r.capture) { ops.migrate(r.stream, false); }
    ops.release_segments(r.freed_on, nullptr);
    settle_frees(r, ops);
    return retry(r, ops);
  }

  // What would have made a request of `size` fit, for the report `r`.
  [[nodiscard]] static std::string hint(oom_report const& r, std::size_t size)
  {
    if (r.limit != 0 && r.reserved + size > r.limit) {
      return "the allocator's limit (" + std::to_string(r.limit) +
             " bytes) stops this allocation; raise it with set_limit() or free tensors you no "
             "longer need";
    }
    if (r.total_free_in_pool >= size && r.largest_free_block < size) {
      return "enough memory is free in the pool but no free block is large enough "
             "(fragmentation); growable segments (virtual memory) or fewer distinct block sizes "
             "would make it fit";
    }
    if (r.largest_free_block >= size) {
      return "a free block of " + std::to_string(r.largest_free_block) +
             " bytes is held for a CUDA graph capture's pool or another stream's pending work; "
             "release_capture_pool() or synchronizing that stream returns it";
    }
    return "reduce the batch size or the memory held by live tensors; " +
           std::to_string(r.allocated) + " bytes are allocated by users";
  }

  // The ladder's steps, one per enumerator of `step`, in that order; each records what it
  // reclaimed (count_step) and, but for the other pool's, ends with a fresh search of the pool and
  // one more try of the runtime.
  template <class Ops>
  using step_fn = Block* (oom_ladder::*)(request&, Ops&, annotated_mutex&);
  template <class Ops>
  static constexpr step_fn<Ops> ladder[] = {
    &oom_ladder::collect_events<Ops>, &oom_ladder::run_callbacks<Ops>,
    &oom_ladder::release_stream<Ops>, &oom_ladder::release_all<Ops>,
    &oom_ladder::other_pool<Ops>,     &oom_ladder::wait_for_frees<Ops>,
  };

  Runtime& runtime_;
  int device_;
  std::vector<Callback> callbacks_;
  std::vector<oom_report::step> steps_;  // what the last recovery did
  std::condition_variable frees_cv_;     // blocks came back to the pool (for step_wait)
  int waiters_{0};
  std::vector<stream_type> unsettled_;  // streams of stream-ordered frees release() issued
};

}  // namespace gpukit::detail::caching
