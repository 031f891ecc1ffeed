// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/release.inl: giving memory back: release, trim and release_locked (fully
// free fixed segments, largest first, each freed in the order of the stream that used it last;
// growable segments unmap their free pages in growable_segments.inl). The out-of-memory ladder
// and release_before_grow call release_locked too. Not public API; included by
// caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <mutex>
#include <vector>

namespace gpukit {

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release()
{
  debug_flush(stream_type{}, true);  // debug mode: the quarantine's blocks are free memory too
  return trim(0);
}

template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::trim(std::size_t target_reserved_bytes)
{
  thread_cache& tc = local_cache();
  detail::pool_lock lock{mutex_};
  flush_cache_locked(tc);
  for (auto& c : threads_.caches) {
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
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, "release free segments to the driver");
  std::size_t released = 0;
  if (growable_ && only_kind < 0) { released += release_growable_locked(target, only_stream); }
  // Stream-ordered frees issued here are waited for before an allocation reports out of memory.
  std::vector<stream_type>& issued = freed_on != nullptr ? *freed_on : recovery_.unsettled;
  bool const capture               = captures_underway_.load(std::memory_order_relaxed) != 0;
  std::vector<block*> whole;  // free blocks that span their segment
  auto collect = [&](block* b) {
    mutex_.assert_held();  // a lambda run under the lock
    auto const* seg = static_cast<segment const*>(b->segment);
    // While a graph is captured: no free on a capturing stream (it would join the graph), and no
    // synchronous free (illegal then).
    if (capture && (!seg->stream_ordered || (!b->global && active_capture_locked(b->stream)))) {
      return;
    }
    if (b->prev == nullptr && b->next == nullptr && b->capture_pool == 0 && !seg->growable &&
        (only_kind < 0 || b->kind == only_kind)) {
      whole.push_back(b);
    }
  };
  for (auto& sp : streams_.pools) {
    if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
    for (auto& idx : sp->index) { idx.for_each(collect); }
  }
  if (only_stream == nullptr) {
    for (auto& idx : blocks_.globals()) { idx.for_each(collect); }
  }
  std::sort(whole.begin(), whole.end(), [](block* a, block* b) { return a->size > b->size; });
  device_guard<Runtime> guard{runtime_, device_};
  // A capture this allocator was not told about (begun on the stream directly): a free on that
  // stream would become a node of the graph, not a free. Such segments stay until it ends.
  std::vector<stream_type> capturing_streams, idle_streams;
  auto is_capturing = [&](stream_type s) {
    if (s == stream_type{}) { return false; }  // the null stream is never captured
    if (std::find(idle_streams.begin(), idle_streams.end(), s) != idle_streams.end()) {
      return false;
    }
    if (std::find(capturing_streams.begin(), capturing_streams.end(), s) !=
        capturing_streams.end()) {
      return true;
    }
    bool capturing                       = false;
    typename Runtime::error_type const e = runtime_.stream_is_capturing(s, capturing);
    // Destroyed: no capture (a capturing stream cannot be destroyed); the free below finds it
    // dead and retires it.
    if (e == Runtime::invalid_resource_handle) { return false; }
    GPUKIT_CUDA_TRY(e, "stream_is_capturing (releasing cached memory)");
    (capturing ? capturing_streams : idle_streams).push_back(s);
    return capturing;
  };
  for (block* b : whole) {
    if (pool_.reserved <= target) { break; }
    auto* seg = static_cast<segment*>(b->segment);
    // Stream-ordered: freed in the order of the stream that last used it, so no wait at all.
    stream_type on = b->global ? stream_type{} : b->stream;
    if (is_capturing(b->global ? stream_type{} : b->stream)) { continue; }
    if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }  // before the free
    typename Runtime::error_type e =
      seg->stream_ordered ? runtime_.free_async(seg->ptr, on) : runtime_.free(seg->ptr);
    if (e == Runtime::invalid_resource_handle && seg->stream_ordered && !capture) {
      retire_dead_stream_locked(on);  // destroyed: the device waited for, then the null stream
      on = stream_type{};
      e  = runtime_.free_async(seg->ptr, on);
    }
    GPUKIT_CUDA_TRY(
      e, seg->stream_ordered ? "free_async (releasing a segment)" : "free (releasing a segment)");
    if (seg->stream_ordered && std::find(issued.begin(), issued.end(), on) == issued.end()) {
      issued.push_back(on);
    }
    if (!seg->stream_ordered) { ++stats_.synchronizing_frees; }
    record_pool_locked(memory_event::action::segment_free, b->address(), seg->size, on);
    unindex(b);
    blocks_.remove(b);
    pool_.reserved -= seg->size;
    count_reserved_locked(seg->kind, -static_cast<std::int64_t>(seg->size));
    released += seg->size;
    count_segment_locked(seg->kind, -1);
    ++stats_.num_device_frees;
    delete seg;
  }
  return released;
}

}  // namespace gpukit
