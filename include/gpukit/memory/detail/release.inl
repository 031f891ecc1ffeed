// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/release.inl: giving memory back: release, trim and release_segments (fully
// free fixed segments, largest first, each freed in the order of the stream that used it last;
// growable segments unmap their free pages in detail/caching/growable_source.hpp). The
// out-of-memory ladder and release_before_grow call release_segments too. Not public API; included
// by caching_allocator.hpp.
#pragma once

#include <gpukit/memory/caching_allocator.hpp>

#include <algorithm>
#include <mutex>
#include <vector>

namespace gpukit {

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
  return release_segments(target_reserved_bytes);
}

/// Whether streams are being captured into a CUDA graph, asked of the runtime once per stream
/// (legal during capture). A capture this allocator was not told about (begun on the stream
/// directly) shows only here: a free on such a stream would become a node of the graph.
template <class Runtime>
struct basic_caching_allocator<Runtime>::capture_probe {
  Runtime& runtime;
  std::vector<stream_type> capturing{};
  std::vector<stream_type> idle{};

  bool operator()(stream_type s)
  {
    if (s == stream_type{}) { return false; }  // the null stream is never captured
    if (std::find(idle.begin(), idle.end(), s) != idle.end()) { return false; }
    if (std::find(capturing.begin(), capturing.end(), s) != capturing.end()) { return true; }
    bool now                             = false;
    typename Runtime::error_type const e = runtime.stream_is_capturing(s, now);
    // Destroyed: no capture (a capturing stream cannot be destroyed); the free finds it dead and
    // retires it.
    if (e == Runtime::invalid_resource_handle) { return false; }
    GPUKIT_CUDA_TRY(e, "stream_is_capturing (releasing cached memory)");
    (now ? capturing : idle).push_back(s);
    return now;
  }
};

// Returns fully free fixed segments, largest first, until at most `target` bytes are reserved
// (growable segments unmap their free pages first); only those of pool kind `only_kind` (-1: both)
// and of `only_stream`'s pool (nullptr: every pool). The streams of the stream-ordered frees issued
// go to `freed_on` (nullptr: oom_.unsettled()), which an allocation that finds no memory waits
// for before reporting out of memory. Returns the bytes released.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release_segments(std::size_t target,
                                                               std::vector<stream_type>* freed_on,
                                                               int only_kind,
                                                               stream_type const* only_stream)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGE(categories::allocator, "release free segments to the driver");
  std::size_t released = 0;
  if (growable_ && only_kind < 0) {
    released += pages_.release(target, only_stream, growable_pool{*this});
  }
  std::vector<stream_type>& issued = freed_on != nullptr ? *freed_on : oom_.unsettled();
  std::vector<block*> const whole  = whole_free_segments(only_kind, only_stream);
  device_guard<Runtime> guard{runtime_, device_};
  capture_probe capturing{runtime_};
  for (block* b : whole) {
    if (pool_.reserved <= target) { break; }
    if (capturing(b->global ? stream_type{} : b->stream)) { continue; }  // stays until it ends
    released += release_segment(b, issued);
  }
  return released;
}

// The free blocks that span a fixed segment of their own, in the pools release_segments names,
// largest first. While a graph is captured: none of a capturing stream (a free there would join
// the graph) and no synchronous segment (its free is illegal then).
template <class Runtime>
std::vector<typename basic_caching_allocator<Runtime>::block*>
basic_caching_allocator<Runtime>::whole_free_segments(int only_kind, stream_type const* only_stream)
{
  bool const capture = captures_underway_.load(std::memory_order_relaxed) != 0;
  std::vector<block*> whole;
  auto collect = [&](block* b) {
    mutex_.assert_held();  // a lambda run under the lock
    auto const* seg = static_cast<segment const*>(b->segment);
    bool const alone =
      b->prev == nullptr && b->next == nullptr && b->capture_pool == 0 && !seg->growable;
    if (!alone || (only_kind >= 0 && b->kind != only_kind)) { return; }
    if (capture && (!seg->stream_ordered || (!b->global && capture_.active_on(b->stream)))) {
      return;
    }
    whole.push_back(b);
  };
  for_each_free_index(only_stream, [&](detail::tlsf_index<block>& idx) { idx.for_each(collect); });
  std::sort(whole.begin(), whole.end(), [](block* a, block* b) { return a->size > b->size; });
  return whole;
}

// Calls f(index) for the free indices of `only_stream`'s pool (nullptr: every stream's pool, then
// the global ones).
template <class Runtime>
template <class F>
void basic_caching_allocator<Runtime>::for_each_free_index(stream_type const* only_stream, F&& f)
{
  for (auto& sp : streams_.pools()) {
    if (only_stream != nullptr && !(sp->stream == *only_stream)) { continue; }
    for (auto& idx : sp->index) { f(idx); }
  }
  if (only_stream != nullptr) { return; }
  for (auto& idx : blocks_.globals()) { f(idx); }
}

// Frees the segment that free block b spans: stream-ordered in the order of the stream that used
// it last (no wait; that stream goes to `issued`), else synchronously. Returns its bytes.
template <class Runtime>
std::size_t basic_caching_allocator<Runtime>::release_segment(block* b,
                                                              std::vector<stream_type>& issued)
{
  auto* seg = static_cast<segment*>(b->segment);
  if (options_.nvtx_annotate) { unregister_memory_heap(seg->nvtx_heap); }  // before the free
  stream_type const on = free_segment_memory(*seg, b->global ? stream_type{} : b->stream);
  if (seg->stream_ordered && std::find(issued.begin(), issued.end(), on) == issued.end()) {
    issued.push_back(on);
  }
  if (!seg->stream_ordered) { stats_.count(&caching_allocator_stats::synchronizing_frees); }
  recorder_.record_pool(memory_event::action::segment_free, b->address(), seg->size, on);
  unindex(b);
  blocks_.remove(b);
  std::size_t const bytes = seg->size;
  pool_.reserved -= bytes;
  stats_.count_reserved(seg->kind, -static_cast<std::int64_t>(bytes));
  stats_.count_segment(seg->kind, -1);
  stats_.count(&caching_allocator_stats::num_device_frees);
  delete seg;
  return bytes;
}

// The runtime's free of a fixed segment last used on `on`; a stream found destroyed is retired
// (the device waited for) and the free goes to the null stream. Returns the stream it went to.
// @throws gpukit::cuda_error when the free fails (the segment stays)
template <class Runtime>
typename Runtime::stream_type basic_caching_allocator<Runtime>::free_segment_memory(segment& seg,
                                                                                    stream_type on)
{
  if (upstream_.engaged()) {
    upstream_.deallocate(seg.ptr, seg.size, seg.stream_ordered ? on : stream_type{});
    return on;
  }
  if (!seg.stream_ordered) {
    GPUKIT_CUDA_TRY(runtime_.free(seg.ptr), "free (releasing a segment)");
    return on;
  }
  typename Runtime::error_type e = runtime_.free_async(seg.ptr, on);
  if (e == Runtime::invalid_resource_handle &&
      captures_underway_.load(std::memory_order_relaxed) == 0) {
    streams_.retire_dead_stream(on, stream_operations{*this});
    on = stream_type{};
    e  = runtime_.free_async(seg.ptr, on);
  }
  GPUKIT_CUDA_TRY(e, "free_async (releasing a segment)");
  return on;
}

}  // namespace gpukit
