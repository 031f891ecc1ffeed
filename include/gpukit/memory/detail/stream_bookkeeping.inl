// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/stream_bookkeeping.inl: what basic_caching_allocator knows of streams: the
// pool of free blocks each stream owns, the streams checked to belong to its device and those
// forgotten, record_stream and the pending frees it causes (waiting on events of the recorded
// streams), the migration of other streams' free blocks to the global pool once an event shows
// their work done, forget_stream, and the spare events these use. Not public API; included by
// caching_allocator.hpp.
#pragma once

#include <gpukit/detail/hex.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace gpukit {

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
  // Freed during a graph capture: the streams it was used on, whose events are recorded once no
  // capture is under way (an event recorded in a capture cannot be queried). Empty once armed.
  std::vector<stream_type> uses;
  bool to_global{false};  // its stream was forgotten: usable by every stream once done
};

// A stream's first use: it must belong to this allocator's device (on CUDA, cudaMallocAsync on
// another device's stream takes that device's memory, and events of this device cannot be
// recorded on it). The null stream stands for this device's.
//
// Asking a stream its device (cudaStreamGetDevice) invalidates a graph capture it takes part in,
// in every capture mode, so a stream first met while it is capturing (a side stream joined to a
// capture, a second graph's new stream) is asked only cudaStreamIsCapturing, and is taken to be
// of this device: it is not remembered as checked, so its first use after the capture checks it.
template <class Runtime>
void basic_caching_allocator<Runtime>::check_stream(stream_type stream, char const* what)
{
  (void)check_stream(stream, what, false);
}

// As above; with `dead_ok`, a destroyed stream (its handle invalid) is retired instead of
// reported, and the result is false.
template <class Runtime>
bool basic_caching_allocator<Runtime>::check_stream(stream_type stream, char const* what,
                                                    bool dead_ok)
{
  if (stream == stream_type{} || std::find(streams_.checked.begin(), streams_.checked.end(),
                                           stream) != streams_.checked.end()) {
    return true;
  }
  bool capturing                 = false;
  typename Runtime::error_type r = runtime_.stream_is_capturing(stream, capturing);
  if (r == Runtime::success && capturing) { return true; }  // checked after the capture
  int d = -1;
  if (r == Runtime::success) { r = runtime_.stream_get_device(stream, d); }
  if (dead_ok && r == Runtime::invalid_resource_handle) {
    retire_dead_stream(stream);
    return false;
  }
  if (r == Runtime::invalid_resource_handle) {
    detail::throw_explained_cuda_error(
      r,
      std::string{what} + ": stream " + detail::hex(recorder_type::stream_id(stream)) +
        " is not a live stream of device " + std::to_string(device_) +
        " (it was destroyed, or created in another context or on another device); pass a stream "
        "created on device " +
        std::to_string(device_) + " that outlives the work queued on it",
      "stream_is_capturing, stream_get_device", GPUKIT_DETAIL_SOURCE);
  }
  GPUKIT_CUDA_TRY(r, std::string{what} + ": asking stream " +
                       detail::hex(recorder_type::stream_id(stream)) + " its device");
  GPUKIT_EXPECTS(d == device_, std::string{what} + ": the stream belongs to device " +
                                 std::to_string(d) + " but this allocator serves device " +
                                 std::to_string(device_) +
                                 "; use that device's allocator (default_caching_allocator(" +
                                 std::to_string(d) + "))");
  streams_.checked.push_back(stream);
  streams_.forgotten.erase(
    std::remove(streams_.forgotten.begin(), streams_.forgotten.end(), stream),
    streams_.forgotten.end());  // a new stream with a reused handle
  return true;
}

// A free on a stream this thread has not used yet: true when it is a live stream of this device
// (remembered by the thread), false when it was destroyed (then retired: see
// retire_dead_stream).
// @throws gpukit::logic_error for another device's stream; gpukit::cuda_error when the runtime
//         fails otherwise (nothing changes in both cases)
template <class Runtime>
bool basic_caching_allocator<Runtime>::check_free_stream(thread_cache& tc, stream_type stream)
{
  detail::pool_lock lock{mutex_};
  bool const live = check_stream(stream, "deallocate_async", true);
  if (live && std::find(streams_.checked.begin(), streams_.checked.end(), stream) !=
                streams_.checked.end()) {
    tc.checked_stream = stream;  // not a stream taken on trust while it is capturing
  }
  return live;
}

// A stream found destroyed (the runtime calls it an invalid handle). Work queued on a destroyed
// stream still runs to completion, and no event can be recorded on it any more, so the safe path
// is to wait for the whole device once; then its free blocks (and blocks freed on it later) are
// usable by every stream, as after forget_stream. Rare, and never an error of its own.
// @throws gpukit::cuda_error when the device cannot be synchronized (nothing changes then)
template <class Runtime>
void basic_caching_allocator<Runtime>::retire_dead_stream(stream_type stream)
{
  if (captures_underway_.load(std::memory_order_relaxed) != 0) {
    detail::throw_explained_cuda_error(  // no synchronization during a capture
      Runtime::invalid_resource_handle,
      "deallocate_async: stream " + detail::hex(recorder_type::stream_id(stream)) +
        " was destroyed, and a block freed on it can be reused only after the device is "
        "synchronized, which a graph capture under way forbids; free it before destroying the "
        "stream, or after the capture ends",
      "device_synchronize", GPUKIT_DETAIL_SOURCE);
  }
  {
    device_guard<Runtime> guard{runtime_, device_};
    GPUKIT_CUDA_TRY(runtime_.device_synchronize());
  }
  stats_.count(&caching_allocator_stats::num_dead_streams);
  drop_stream(stream, true);
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

template <class Runtime>
typename basic_caching_allocator<Runtime>::stream_pool& basic_caching_allocator<Runtime>::pool_of(
  stream_type stream)
{
  for (auto& sp : streams_.pools) {
    if (sp->stream == stream) { return *sp; }
  }
  streams_.pools.push_back(std::make_unique<stream_pool>());
  streams_.pools.back()->stream = stream;
  return *streams_.pools.back();
}

// Whether `stream` takes part in a graph capture (asked of the runtime: legal during capture).
// The null stream is never captured; a destroyed stream is not capturing (callers find it dead).
template <class Runtime>
bool basic_caching_allocator<Runtime>::is_capturing(stream_type stream)
{
  if (stream == stream_type{}) { return false; }
  bool capturing                       = false;
  typename Runtime::error_type const e = runtime_.stream_is_capturing(stream, capturing);
  if (e == Runtime::invalid_resource_handle) { return false; }
  GPUKIT_CUDA_TRY(e, "stream_is_capturing");
  return capturing;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::record_stream(void* ptr, stream_type stream)
{
  auto const key = reinterpret_cast<std::uintptr_t>(ptr);
  detail::pool_lock lock{mutex_};
  check_stream(stream, "record_stream");
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
std::size_t basic_caching_allocator<Runtime>::poll_pending(bool wait)
{
  std::size_t moved = 0;
  for (std::size_t i = 0; i < streams_.pending.size();) {
    auto& pf = streams_.pending[i];
    if (!pf.uses.empty() && !arm_pending(pf)) {
      ++i;  // freed during a capture that is still under way
      continue;
    }
    bool done = true;
    for (event_type e : pf.events) {
      typename Runtime::error_type const q =
        wait ? runtime_.event_synchronize(e) : runtime_.event_query(e);
      if (q == Runtime::not_ready) {
        done = false;
        break;
      }
      GPUKIT_CUDA_TRY(q, wait ? "event_synchronize" : "event_query");
    }
    if (!done) {
      ++i;
      continue;
    }
    for (event_type e : pf.events) { streams_.spare_events.push_back(e); }
    moved += pf.b->size;
    pending_.add(pf.b->kind, -static_cast<std::int64_t>(pf.b->size), -1);
    if (pf.to_global) {
      pf.b->stream = stream_type{};
      pf.b->global = true;
      insert_free(pf.b);
    } else {
      free_to_pool(pf.b, pf.stream);
    }
    streams_.pending[i] = std::move(streams_.pending.back());
    streams_.pending.pop_back();
  }
  return moved;
}

// A free made during a graph capture (see defer_free): records an event on each stream that used
// the block, now that no capture of this allocator is under way and none of those streams is
// capturing. False, with nothing changed, while one still is.
// @throws gpukit::cuda_error when an event cannot be recorded (nothing changes then)
template <class Runtime>
bool basic_caching_allocator<Runtime>::arm_pending(pending_free& pf)
{
  if (captures_underway_.load(std::memory_order_relaxed) != 0) { return false; }
  for (stream_type s : pf.uses) {
    if (is_capturing(s)) { return false; }
  }
  device_guard<Runtime> guard{runtime_, device_};
  std::vector<event_type> events;
  std::vector<stream_type> dead;
  try {
    for (stream_type s : pf.uses) {
      event_type e                         = take_event();
      typename Runtime::error_type const r = runtime_.event_record(e, s);
      if (r != Runtime::success) { streams_.spare_events.push_back(e); }
      if (r == Runtime::invalid_resource_handle) {  // destroyed: retired once this is armed
        dead.push_back(s);
        continue;
      }
      GPUKIT_CUDA_TRY(r, "event_record");
      events.push_back(e);
    }
  } catch (...) {
    streams_.spare_events.insert(streams_.spare_events.end(), events.begin(), events.end());
    throw;
  }
  pf.events = std::move(events);
  pf.uses.clear();
  for (stream_type s : dead) { retire_dead_stream(s); }
  return true;
}

// Makes free blocks of other streams usable by any stream: one event per stream that holds free
// blocks, recorded when first needed; once it completes, the blocks that stream had freed before
// the event move to the global pool. With `wait`, blocks until those events complete.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::migrate(stream_type requester, bool wait)
{
  std::size_t moved = 0;
  device_guard<Runtime> guard{runtime_, device_};
  std::vector<stream_type> dead;  // destroyed streams: retired after the walk
  for (auto& sp : streams_.pools) {
    if (sp->stream == requester || (sp->index[0].empty() && sp->index[1].empty())) { continue; }
    if (!sp->migrating) {
      // An event recorded on a capturing stream is part of the graph: it could not be queried.
      if (is_capturing(sp->stream)) { continue; }
      event_type e                         = take_event();
      typename Runtime::error_type const r = runtime_.event_record(e, sp->stream);
      if (r != Runtime::success) { streams_.spare_events.push_back(e); }
      if (r == Runtime::invalid_resource_handle) {
        dead.push_back(sp->stream);
        continue;
      }
      GPUKIT_CUDA_TRY(r, "event_record");
      sp->migration_event = e;
      sp->migration_seq   = sp->free_seq;
      sp->migrating       = true;
      stats_.count(&caching_allocator_stats::num_cross_stream_events);
    }
    typename Runtime::error_type const q = wait ? runtime_.event_synchronize(sp->migration_event)
                                                : runtime_.event_query(sp->migration_event);
    if (q == Runtime::not_ready) { continue; }
    GPUKIT_CUDA_TRY(q, wait ? "event_synchronize" : "event_query");
    streams_.spare_events.push_back(sp->migration_event);
    sp->migrating = false;
    moved += make_global(*sp, sp->migration_seq);
  }
  for (stream_type s : dead) {
    std::size_t const before = blocks_.global_bytes();
    retire_dead_stream(s);
    moved += blocks_.global_bytes() - before;
  }
  return moved;
}

// Moves the free blocks `sp` holds that entered it up to `up_to_seq` into the global pool, merging
// them with their neighbours there. Returns the bytes moved.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::make_global(stream_pool& sp, std::uint64_t up_to_seq)
{
  std::vector<block*> movers;
  for (auto& idx : sp.index) {
    idx.for_each([&](block* b) {
      if (b->free_seq <= up_to_seq) { movers.push_back(b); }
    });
  }
  // Take them all out first (marked so that no merge sees them), then insert each, merging.
  for (block* b : movers) {
    sp.index[b->kind].remove(b);
    b->global = true;
    b->state.store(detail::block_state::pending, std::memory_order_relaxed);
  }
  std::size_t moved = 0;
  for (block* b : movers) {
    moved += b->size;
    insert_free(b);
  }
  return moved;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::forget_stream(stream_type stream)
{
  if (debug_ != nullptr) {  // debug mode: quarantined frees on it go back while it lives
    debug_->flush(
      stream, [this](auto const& e) { deallocate_impl(e.ptr, e.bytes, e.check_size, e.stream); });
  }
  thread_cache& tc = local_cache();
  detail::pool_lock lock{mutex_};
  drain_cache(tc);
  if (tc.checked_stream == stream) { tc.checked_stream = stream_type{}; }
  drop_stream(stream, false);
}

// forget_stream's work; `synchronized`: the stream's work is known complete (a retired dead
// stream). A stream already destroyed is retired (the device waited for) instead of failing.
template <class Runtime>
void basic_caching_allocator<Runtime>::drop_stream(stream_type stream, bool synchronized)
{
  // CUDA may hand the handle of a destroyed stream to a new one: check it again then.
  streams_.checked.erase(std::remove(streams_.checked.begin(), streams_.checked.end(), stream),
                         streams_.checked.end());
  auto remember = [&] {
    mutex_.assert_held();  // a lambda run under the lock
    // Blocks that still come back on it (other threads' cached blocks) go to every stream, never
    // to a pool of this stream, which may be destroyed by then.
    if (stream == stream_type{} || std::find(streams_.forgotten.begin(), streams_.forgotten.end(),
                                             stream) != streams_.forgotten.end()) {
      return;
    }
    if (streams_.forgotten.size() >= 256) { streams_.forgotten.erase(streams_.forgotten.begin()); }
    streams_.forgotten.push_back(stream);
  };
  auto has_pool = [&] {
    mutex_.assert_held();  // a lambda run under the lock
    return std::any_of(streams_.pools.begin(), streams_.pools.end(),
                       [&](auto const& sp) { return sp->stream == stream; });
  };
  bool const pending_here =
    std::any_of(streams_.pending.begin(), streams_.pending.end(),
                [&](pending_free const& pf) { return pf.stream == stream; });
  if (!has_pool() && !pending_here) {
    remember();
    return;
  }
  if (!synchronized) {
    // Synchronizing a capturing stream would invalidate its capture.
    GPUKIT_EXPECTS(!is_capturing(stream),
                   "forget_stream: stream " + detail::hex(recorder_type::stream_id(stream)) +
                     " is being captured into a CUDA graph; forget it after the capture ends");
    device_guard<Runtime> guard{runtime_, device_};
    typename Runtime::error_type const r =
      runtime_.stream_synchronize(stream);  // the work queued on it so far
    if (r == Runtime::invalid_resource_handle) {
      retire_dead_stream(stream);
      return;
    }
    GPUKIT_CUDA_TRY(r, "stream_synchronize (forget_stream)");
  }
  // Frees on it still waiting for other streams' events: every stream's once those complete.
  for (auto& pf : streams_.pending) {
    if (pf.stream == stream) {
      pf.stream    = stream_type{};
      pf.to_global = true;
    }
  }
  auto it = std::find_if(streams_.pools.begin(), streams_.pools.end(),
                         [&](auto const& sp) { return sp->stream == stream; });
  if (it != streams_.pools.end()) {
    stream_pool& sp = **it;
    if (sp.migrating) { streams_.spare_events.push_back(sp.migration_event); }  // complete now
    make_global(sp, std::numeric_limits<std::uint64_t>::max());
    streams_.pools.erase(it);
  }
  remember();
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::event_type basic_caching_allocator<Runtime>::take_event()
{
  if (!streams_.spare_events.empty()) {
    event_type e = streams_.spare_events.back();
    streams_.spare_events.pop_back();
    return e;
  }
  event_type e{};
  GPUKIT_CUDA_TRY(runtime_.event_create(e, false));
  return e;
}

}  // namespace gpukit
