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
