// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/graph_capture.inl: CUDA graph capture in basic_caching_allocator: each
// capture gets a private pool (begin_capture, end_capture, release_capture_pool); while it is under
// way, allocations on its stream, and on the streams joined to it, come from that pool and new
// segments from a synchronous malloc in relaxed capture mode. Not public API; included by
// caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gpukit {

template <class Runtime>
struct basic_caching_allocator<Runtime>::capture_pool {
  capture_id id{0};
  stream_type stream{};
  bool active{true};  // between begin_capture and end_capture
  detail::tlsf_index<block> index[2];
};

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_id
basic_caching_allocator<Runtime>::begin_capture(stream_type stream)
{
  detail::pool_lock lock{mutex_};
  GPUKIT_EXPECTS(active_capture_locked(stream) == nullptr,
                 "begin_capture: the stream already has a capture under way on this allocator");
  capture_.pools.push_back(std::make_unique<capture_pool>());
  capture_.pools.back()->id     = capture_.next_id++;
  capture_.pools.back()->stream = stream;
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
  return capture_.pools.back()->id;
}

template <class Runtime>
void basic_caching_allocator<Runtime>::resume_capture(stream_type stream, capture_id id)
{
  detail::pool_lock lock{mutex_};
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
  detail::pool_lock lock{mutex_};
  capture_pool* cp = active_capture_locked(stream);
  GPUKIT_EXPECTS(cp != nullptr, "end_capture: no capture is under way on this stream");
  cp->active = false;
  captures_underway_.fetch_sub(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::begin_capture_window()
{
  detail::pool_lock lock{mutex_};
  ++capture_.windows;
  captures_underway_.fetch_add(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::end_capture_window()
{
  detail::pool_lock lock{mutex_};
  GPUKIT_EXPECTS(capture_.windows > 0,
                 "end_capture_window: no capture window is open on this allocator (device " +
                   std::to_string(device_) + ")");
  --capture_.windows;
  captures_underway_.fetch_sub(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_caching_allocator<Runtime>::release_capture_pool(capture_id id)
{
  detail::pool_lock lock{mutex_};
  auto it = std::find_if(capture_.pools.begin(), capture_.pools.end(),
                         [&](auto const& cp) { return cp->id == id; });
  GPUKIT_EXPECTS(it != capture_.pools.end(),
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
    insert_free(b);
  }
  capture_.pools.erase(it);
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_pool*
basic_caching_allocator<Runtime>::active_capture_locked(stream_type stream)
{
  for (auto& cp : capture_.pools) {
    if (cp->active && cp->stream == stream) { return cp.get(); }
  }
  return nullptr;
}

// The capture under way that `stream` takes part in: the one begun (or resumed) on it, else, for a
// stream the runtime says is joined to a capture (a side stream that waited on an event recorded
// in it), the one begun on a stream of that same runtime capture. nullptr when none. Only
// stream_capture_id is asked, which is legal during capture. With `guess_on_error`, a failing
// query (a free, which must not throw by now) gives the oldest capture under way: its pool holds
// the block until release_capture_pool, longer than needed but never while a graph may use it.
template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_pool*
basic_caching_allocator<Runtime>::capture_for_locked(stream_type stream, bool guess_on_error)
{
  if (capture_pool* cp = active_capture_locked(stream)) { return cp; }
  if (captures_underway_.load(std::memory_order_relaxed) == 0 || stream == stream_type{}) {
    return nullptr;
  }
  auto fail = [&](typename Runtime::error_type e) -> capture_pool* {
    mutex_.assert_held();  // a lambda run under the lock
    if (!guess_on_error) { GPUKIT_CUDA_TRY(e, "stream_capture_id"); }
    for (auto& cp : capture_.pools) {
      if (cp->active) { return cp.get(); }
    }
    return nullptr;
  };
  unsigned long long id          = 0;
  typename Runtime::error_type e = runtime_.stream_capture_id(stream, id);
  if (e == Runtime::invalid_resource_handle) { return nullptr; }  // destroyed: not capturing
  if (e != Runtime::success) { return fail(e); }
  if (id == 0) { return nullptr; }
  for (auto& cp : capture_.pools) {
    if (!cp->active) { continue; }
    unsigned long long origin = 0;
    e                         = runtime_.stream_capture_id(cp->stream, origin);
    if (e != Runtime::success) { return fail(e); }
    if (origin == id) { return cp.get(); }
  }
  return nullptr;
}

template <class Runtime>
typename basic_caching_allocator<Runtime>::capture_pool&
basic_caching_allocator<Runtime>::capture_pool_locked(capture_id id)
{
  for (auto& cp : capture_.pools) {
    if (cp->id == id) { return *cp; }
  }
  GPUKIT_EXPECTS(false, "caching_allocator: capture pool " + std::to_string(id) + " is gone");
  return *capture_.pools.front();  // not reached
}

// During capture: blocks come from the capture's private pool (for its stream and the streams
// joined to it); new segments from a synchronous malloc made in relaxed capture mode (legal during
// capture, and not part of the graph).
template <class Runtime>
void* basic_caching_allocator<Runtime>::allocate_captured_locked(std::size_t bytes,
                                                                 std::size_t size, int kind,
                                                                 capture_pool& cp,
                                                                 stream_type stream,
                                                                 thread_cache& tc)
{
  block* b = cp.index[kind].find(size);
  if (b == nullptr) {
    std::size_t const seg_size = segment_size_for(size);
    std::size_t const limit    = limit_.load(std::memory_order_relaxed);
    if (limit != 0 && pool_.reserved + seg_size > limit) { throw_oom_locked(bytes, size); }
    auto seg                       = std::make_unique<segment>();
    block* nb                      = blocks_.new_block();
    void* p                        = nullptr;
    typename Runtime::error_type e = Runtime::success;
    {
      device_guard<Runtime> guard{runtime_, device_};
      int mode = cudaStreamCaptureModeRelaxed;
      GPUKIT_CUDA_TRY(runtime_.exchange_capture_mode(mode));
      e = runtime_.malloc(&p, seg_size);
      (void)runtime_.exchange_capture_mode(mode);
    }
    if (e != Runtime::success) {
      blocks_.recycle(nb);
      if (e == Runtime::out_of_memory) { throw_oom_locked(bytes, size); }
      GPUKIT_CUDA_TRY(e, "malloc (a segment for a graph capture)");
    }
    adopt_segment_locked(nb, std::move(seg), p, seg_size, kind, cp.stream, false, cp.id);
    cp.index[kind].insert(nb);
    b = nb;
  }
  return hand_out(tc, take(b, size, bytes, stream), bytes, stream);
}

}  // namespace gpukit
