// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/oom_recovery.inl: what basic_caching_allocator does when no memory is left:
// the recovery ladder (one function a step, in the order of recovery_step_names, each followed by a
// fresh search of the pool and one more try of the runtime), the user's callbacks, and the
// out_of_memory exception with its report and hint. Not public API; included by
// caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace gpukit {

namespace detail {
/// The name of the NVTX range around the out-of-memory ladder's step `step`.
[[nodiscard]] inline std::string oom_step_range_name(int step)
{
  return std::string{"OOM ladder: "} + recovery_step_names[step];
}
}  // namespace detail

/// What one recovery works on: the request, and the streams whose stream-ordered frees have not
/// yet taken effect.
template <class Runtime>
struct basic_caching_allocator<Runtime>::recovery_request {
  std::size_t size;
  int kind;
  stream_type stream;
  thread_cache& tc;
  std::vector<stream_type>& freed_on;
  bool capture;  // a graph capture is under way: no event query, no synchronization
};

// The out-of-memory ladder: each step, then a fresh search of the pool and one more try of the
// runtime. Steps that do not apply (nothing to collect, no callbacks, ...) are recorded as such.
// Returns nullptr when every step failed; recovery_.ladder then holds what each reclaimed (for the
// report).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::recover(
  std::size_t size, int kind, stream_type stream, thread_cache& tc,
  std::vector<stream_type>& freed_on, bool capture)
{
  recovery_.ladder.assign(recovery_step_count, oom_report::step{});
  for (std::size_t i = 0; i < recovery_.ladder.size(); ++i) {
    recovery_.ladder[i].name = recovery_step_names[i];
  }
  recovery_request r{size, kind, stream, tc, freed_on, capture};
  settle_frees(r);  // segments returned just before the failed try (release_before_grow)
  if (block* b = retry(r)) { return b; }
  for (recovery_fn const step : recovery_ladder) {
    if (block* b = (this->*step)(r)) { return b; }
  }
  // Never out of memory while frees this allocator issued may still be on their way.
  if (r.capture || (r.freed_on.empty() && recovery_.unsettled.empty())) { return nullptr; }
  settle_frees(r);
  return retry(r);
}

// A fresh search of the pool, then one more try of the runtime.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::retry(
  recovery_request const& r)
{
  if (block* b = find_free(r.size, r.kind, r.stream)) { return b; }
  bool oom = false;
  return growable_ ? grow_segment(r.size, r.kind, r.stream, oom)
                   : new_segment(r.size, r.kind, r.stream, oom);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::count_step(recovery_step step, std::size_t reclaimed)
{
  auto const i                  = static_cast<std::size_t>(step);
  recovery_.ladder[i].attempted = true;
  recovery_.ladder[i].bytes_reclaimed += reclaimed;
  stats_.count_recovery_step(i, reclaimed);
}

// Stream-ordered frees take effect when their stream reaches them: wait for those streams only
// (never the whole device); then the memory is the device's again.
template <class Runtime>
void basic_caching_allocator<Runtime>::settle_frees(recovery_request& r)
{
  if (r.capture) { return; }
  for (stream_type fs : recovery_.unsettled) {  // issued by release() and trim()
    if (std::find(r.freed_on.begin(), r.freed_on.end(), fs) == r.freed_on.end()) {
      r.freed_on.push_back(fs);
    }
  }
  recovery_.unsettled.clear();
  if (r.freed_on.empty()) { return; }
  device_guard<Runtime> guard{runtime_, device_};
  std::vector<stream_type> capturing;  // waiting would end their capture: left unsettled
  while (!r.freed_on.empty()) {
    stream_type const fs = r.freed_on.back();
    if (is_capturing(fs)) {
      capturing.push_back(fs);
      r.freed_on.pop_back();
      continue;
    }
    typename Runtime::error_type const e = runtime_.stream_synchronize(fs);
    if (e == Runtime::invalid_resource_handle) {
      retire_dead_stream(fs);  // synchronizes the device: every free issued has landed
    } else {
      GPUKIT_CUDA_TRY(e, "stream_synchronize (out-of-memory recovery)");
    }
    stats_.count(&caching_allocator_stats::num_release_waits);
    r.freed_on.pop_back();
  }
  recovery_.unsettled = std::move(capturing);  // settled by a later recovery
}

// (1) Blocks whose cross-stream events have completed (no waiting).
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::recover_events(
  recovery_request& r)
{
  if (r.capture) { return nullptr; }
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, detail::oom_step_range_name(step_events));
  count_step(step_events, poll_pending() + migrate(r.stream, false));
  drain_cache(r.tc);
  return retry(r);
}

// (2) The user's callbacks, in order, without the pool lock (they may free memory); each may ask
// for another try.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::recover_callbacks(recovery_request& r)
{
  if (recovery_.callbacks.empty()) { return nullptr; }
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, detail::oom_step_range_name(step_callbacks));
  auto callbacks = recovery_.callbacks;
  for (auto const& cb : callbacks) {
    std::size_t const free_before     = free_bytes();
    std::size_t const reserved_before = pool_.reserved;
    oom_context const ctx{r.size, device_, pool_.reserved,
                          static_cast<std::size_t>(limit_.load(std::memory_order_relaxed))};
    bool again = false;
    {
      detail::pool_lock::unlocked_scope unlocked{mutex_};  // the one step run without the lock
      again = cb(ctx);
    }
    drain_cache(r.tc);
    std::size_t const free_after = free_bytes();
    count_step(step_callbacks,
               (free_after > free_before ? free_after - free_before : 0) +
                 (reserved_before > pool_.reserved ? reserved_before - pool_.reserved : 0));
    if (again) {
      if (block* b = retry(r)) { return b; }
    }
  }
  return nullptr;
}

// (3) Cached free segments of the requesting stream.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::recover_release_stream(recovery_request& r)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator,
                                detail::oom_step_range_name(step_release_stream));
  count_step(step_release_stream, release_segments(0, &r.freed_on, -1, &r.stream));
  settle_frees(r);
  return retry(r);
}

// (4) Cached free segments of every stream; blocks other streams freed are first made usable,
// waiting only on the events that guard them.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::recover_release_all(recovery_request& r)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator,
                                detail::oom_step_range_name(step_release_all));
  for (auto& c : threads_.caches) {
    if (c.get() != &r.tc) { c->flush_requested.store(true, std::memory_order_relaxed); }
  }
  std::size_t moved = r.capture ? 0 : migrate(r.stream, true) + poll_pending(true);
  if (moved != 0) {
    if (block* b = find_free(r.size, r.kind, r.stream)) {
      count_step(step_release_all, moved);
      return b;
    }
  }
  count_step(step_release_all, moved + release_segments(0, &r.freed_on));
  settle_frees(r);
  return retry(r);
}

// (5) A free block of the other pool kind. Small requests come from small segments, large ones
// from large segments; on a full device the free memory may all sit in the other kind's blocks
// (large blocks split by live tensors, which no release can return). The request is cut from such
// a block: the rest stays free in its pool, and the block merges back with it when freed.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block*
basic_caching_allocator<Runtime>::recover_other_pool(recovery_request& r)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator,
                                detail::oom_step_range_name(step_other_pool));
  block* b = find_free(r.size, r.kind ^ 1, r.stream);
  count_step(step_other_pool, b != nullptr ? r.size : 0);
  return b;
}

// (6) A bounded wait for blocks that other threads are returning to the pool.
template <class Runtime>
typename basic_caching_allocator<Runtime>::block* basic_caching_allocator<Runtime>::recover_wait(
  recovery_request& r)
{
  if (options_.oom_wait_for_frees_ms <= 0) { return nullptr; }
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, detail::oom_step_range_name(step_wait));
  std::size_t const free_before = free_bytes();
  ++recovery_.waiters;
  detail::wait_for(recovery_.frees_cv, mutex_,
                   std::chrono::milliseconds(options_.oom_wait_for_frees_ms));
  --recovery_.waiters;
  std::size_t const free_after = free_bytes();
  count_step(step_wait, free_after > free_before ? free_after - free_before : 0);
  if (!r.capture) { migrate(r.stream, false); }
  release_segments(0, &r.freed_on);
  settle_frees(r);
  return retry(r);
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::free_bytes() const
{
  std::size_t n = blocks_.global_bytes();
  for (auto const& sp : streams_.pools) { n += sp->index[0].bytes() + sp->index[1].bytes(); }
  return n;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::add_oom_callback(oom_callback callback)
{
  GPUKIT_EXPECTS(static_cast<bool>(callback), "add_oom_callback: the callback is empty");
  detail::pool_lock lock{mutex_};
  recovery_.callbacks.push_back(std::move(callback));
}

template <class Runtime>
void basic_caching_allocator<Runtime>::throw_oom(std::size_t bytes, std::size_t size)
{
  stats_.count(&caching_allocator_stats::num_ooms);
  recorder_.record_pool(memory_event::action::oom, 0, size, stream_type{});
  caching_allocator_stats const& counted = stats_.update_peaks(threads_.caches);
  oom_report r;
  r.requested = bytes;
  r.device    = device_;
  {
    device_guard<Runtime> guard{runtime_, device_};
    (void)runtime_.mem_get_info(r.device_free, r.device_total);
  }
  r.allocated = static_cast<std::size_t>(counted.allocated_bytes.current);
  r.reserved  = pool_.reserved;
  r.limit     = limit_.load(std::memory_order_relaxed);
  for (auto const& sp : streams_.pools) {
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
  for (auto const& idx : blocks_.globals()) {
    r.total_free_in_pool += idx.bytes();
    r.largest_free_block = std::max(r.largest_free_block, idx.largest());
  }
  r.steps = recovery_.ladder;
  if (r.limit != 0 && pool_.reserved + size > r.limit) {
    r.hint =
      "the allocator's limit (" + std::to_string(r.limit) +
      " bytes) stops this allocation; raise it with set_limit() or free tensors you no longer need";
  } else if (r.total_free_in_pool >= size && r.largest_free_block < size) {
    r.hint =
      "enough memory is free in the pool but no free block is large enough (fragmentation); "
      "growable segments (virtual memory) or fewer distinct block sizes would make it fit";
  } else if (r.largest_free_block >= size) {
    r.hint = "a free block of " + std::to_string(r.largest_free_block) +
             " bytes is held for a CUDA graph capture's pool or another stream's pending work; "
             "release_capture_pool() or synchronizing that stream returns it";
  } else {
    r.hint = "reduce the batch size or the memory held by live tensors; " +
             std::to_string(r.allocated) + " bytes are allocated by users";
  }
  throw out_of_memory{std::move(r)};
}

}  // namespace gpukit
