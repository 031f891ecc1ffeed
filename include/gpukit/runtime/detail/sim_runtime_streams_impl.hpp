// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_streams_impl.hpp: streams, events, copies and host functions of
// gpukit::sim_runtime. Not public API; included by gpukit/runtime/detail/sim_runtime_impl.hpp (its
// header comment describes the locking).
#pragma once

#include <gpukit/detail/compiled_mode.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

namespace gpukit {

// ---- streams ------------------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_create(stream_type& s)
{
  if (auto e = enter(sim_op::stream_create); e != cudaSuccess) { return e; }
  auto const id = detail::sim_next_id();
  auto stream   = std::make_shared<detail::sim_stream>(id, current_device());
  stream->start();
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    streams_.emplace(id, std::move(stream));
  }
  reap_streams();
  s = reinterpret_cast<stream_type>(static_cast<std::uintptr_t>(id));
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_destroy(stream_type s)
{
  if (auto e = enter(sim_op::stream_destroy); e != cudaSuccess) { return e; }
  if (s == nullptr) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "stream_destroy(null stream): the default stream cannot be destroyed");
  }
  auto const id = reinterpret_cast<std::uintptr_t>(s);
  std::shared_ptr<detail::sim_stream> stream;
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    auto it = streams_.find(id);
    if (it != streams_.end()) {
      stream = std::move(it->second);
      streams_.erase(it);
      // Moved to draining_ under the same lock, so wait_device never misses its queued work.
      std::lock_guard<std::mutex> drain_lock{draining_mutex_};
      draining_.push_back(stream);
    }
  }
  if (!stream) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "stream_destroy(stream " + detail::sim_hex(id) +
                    "): not a live stream of this simulated GPU (already destroyed, or never "
                    "created by it)");
  }
  stream->stop();
  reap_streams();
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_synchronize(stream_type s)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto e = enter(sim_op::stream_synchronize); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_synchronize", err);
  if (!stream) { return err; }
  if (auto f = on_capturing_stream("stream_synchronize", stream->id); f != cudaSuccess) {
    return f;
  }
  stream->wait_for(stream->mark());
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_query(stream_type s)
{
  if (auto e = enter(sim_op::stream_query); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_query", err);
  if (!stream) { return err; }
  if (auto f = on_capturing_stream("stream_query", stream->id); f != cudaSuccess) { return f; }
  return stream->idle() ? cudaSuccess : cudaErrorNotReady;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_wait_event(stream_type s,
                                                                         event_type e)
{
  if (auto f = enter(sim_op::stream_wait_event); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_wait_event", err);
  if (!stream) { return err; }
  auto event = find_event(e, "stream_wait_event", err);
  if (!event) { return err; }
  if (captured_events_count_.load(std::memory_order_acquire) != 0) {
    std::string why;
    {
      detail::pool_lock lock{capture_mutex_};
      if (auto it = captured_events_.find(event->id); it != captured_events_.end()) {
        detail::sim_graph_capture* c     = capture_by_id(it->second.capture);
        detail::sim_graph_capture* other = capture_of(stream->id);
        auto const args = "stream_wait_event(stream " + detail::sim_hex(s) + ", event " +
                          detail::sim_hex(e) + "): ";
        if (c == nullptr) {
          err = cudaErrorCapturedEvent;
          why = args + "the event was last recorded during capture " +
                std::to_string(it->second.capture) + ", which has ended";
        } else if (c->invalidated && (other == nullptr || other == c)) {
          return cudaErrorStreamCaptureInvalidated;
        } else if (other == nullptr) {
          c->members.push_back({stream->id, 0, it->second.reach});  // joins the capture
          return cudaSuccess;
        } else if (other == c) {
          detail::sim_merge_reach(c->find(stream->id)->reach, it->second.reach);
          return cudaSuccess;
        } else {
          c->invalidate("stream_wait_event");
          other->invalidate("stream_wait_event");
          err = cudaErrorStreamCaptureIsolation;
          why = args + "the stream takes part in capture " + std::to_string(other->id) +
                " and the event belongs to capture " + std::to_string(c->id) +
                "; both are invalidated";
        }
      }
    }
    if (err != cudaSuccess) { return misuse(err, std::move(why)); }
  }
  auto capture = event->current();
  if (!capture || capture->is_done()) { return cudaSuccess; }
  return enqueue(
    *stream, [capture] { capture->wait(); }, "stream_wait_event");
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::stream_get_device(stream_type s, int& device)
{
  if (auto e = enter(sim_op::stream_get_device); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "stream_get_device", err);
  if (!stream) { return err; }
  if (auto f = on_capturing_stream("stream_get_device", stream->id); f != cudaSuccess) { return f; }
  device = stream->device;
  return cudaSuccess;
}

// ---- events -------------------------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::event_create(event_type& e, bool timing)
{
  if (auto f = enter(sim_op::event_create); f != cudaSuccess) { return f; }
  auto const id = detail::sim_next_id();
  auto event    = std::make_shared<detail::sim_event>(id, timing, current_device());
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    events_.emplace(id, std::move(event));
  }
  e = reinterpret_cast<event_type>(static_cast<std::uintptr_t>(id));
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::event_destroy(event_type e)
{
  if (auto f = enter(sim_op::event_destroy); f != cudaSuccess) { return f; }
  auto const id      = reinterpret_cast<std::uintptr_t>(e);
  std::size_t erased = 0;
  {
    std::unique_lock<std::shared_mutex> lock{handles_mutex_};
    erased = events_.erase(id);
  }
  if (erased != 0 && captured_events_count_.load(std::memory_order_acquire) != 0) {
    detail::pool_lock lock{capture_mutex_};
    captured_events_.erase(id);
    captured_events_count_.store(captured_events_.size(), std::memory_order_release);
  }
  if (erased == 0) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "event_destroy(event " + detail::sim_hex(id) +
                    "): not a live event of this simulated GPU (already destroyed, or never "
                    "created by it)");
  }
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::event_record(event_type e, stream_type s)
{
  if (auto f = enter(sim_op::event_record); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto event      = find_event(e, "event_record", err);
  if (!event) { return err; }
  auto stream = find_stream(s, "event_record", err);
  if (!stream) { return err; }
  if (stream->device != event->device) {
    return misuse(cudaErrorInvalidResourceHandle,
                  "event_record(event " + detail::sim_hex(e) + ", stream " + detail::sim_hex(s) +
                    "): the event belongs to device " + std::to_string(event->device) +
                    " and the stream to device " + std::to_string(stream->device) +
                    " (create the event with the stream's device current)");
  }
  if (captures_underway_.load(std::memory_order_acquire) != 0 ||
      captured_events_count_.load(std::memory_order_acquire) != 0) {
    detail::pool_lock lock{capture_mutex_};
    if (detail::sim_graph_capture* c = capture_of(stream->id)) {
      if (c->invalidated) { return cudaErrorStreamCaptureInvalidated; }
      // Recorded in a capture: a point of the graph that waits on it can join, never work that
      // completes.
      auto const* m                  = c->find(stream->id);
      detail::sim_captured_event& ce = captured_events_[event->id];
      ce.capture                     = c->id;
      ce.reach                       = m->reach;
      detail::sim_merge_reach(ce.reach, {{m->stream, m->work}});
      captured_events_count_.store(captured_events_.size(), std::memory_order_release);
      return cudaSuccess;
    }
    captured_events_.erase(event->id);
    captured_events_count_.store(captured_events_.size(), std::memory_order_release);
  }
  auto capture = std::make_shared<detail::sim_capture>(event->timing);
  if (stream->caught_up()) {
    capture->complete();  // nothing to wait for: complete now, as an idle GPU would almost at once
  } else if (auto f = enqueue(
               *stream, [capture] { capture->complete(); }, "event_record");
             f != cudaSuccess) {
    return f;
  }
  event->set(std::move(capture));
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::event_query(event_type e)
{
  if (auto f = enter(sim_op::event_query); f != cudaSuccess) { return f; }
  if (captured_events_count_.load(std::memory_order_acquire) != 0) {
    if (auto f = on_captured_event("event_query", reinterpret_cast<std::uintptr_t>(e));
        f != cudaSuccess) {
      return f;
    }
  }
  if (e != nullptr) {
    // The hot path: no reference counting, one shared lock and the event's own mutex.
    std::shared_lock<std::shared_mutex> lock{handles_mutex_};
    if (auto it = events_.find(reinterpret_cast<std::uintptr_t>(e)); it != events_.end()) {
      return it->second->completed() ? cudaSuccess : cudaErrorNotReady;
    }
  }
  cudaError_t err = cudaSuccess;
  (void)find_event(e, "event_query", err);  // records the misuse
  return err;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::event_synchronize(event_type e)
{
  synchronizations_.fetch_add(1, std::memory_order_relaxed);
  if (auto f = enter(sim_op::event_synchronize); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto event      = find_event(e, "event_synchronize", err);
  if (!event) { return err; }
  if (captured_events_count_.load(std::memory_order_acquire) != 0) {
    if (auto f = on_captured_event("event_synchronize", event->id); f != cudaSuccess) { return f; }
  }
  if (auto capture = event->current()) { capture->wait(); }
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::event_elapsed_time(float& ms,
                                                                          event_type start,
                                                                          event_type stop)
{
  if (auto f = enter(sim_op::event_elapsed_time); f != cudaSuccess) { return f; }
  cudaError_t err = cudaSuccess;
  auto a          = find_event(start, "event_elapsed_time", err);
  if (!a) { return err; }
  auto b = find_event(stop, "event_elapsed_time", err);
  if (!b) { return err; }
  auto const args =
    "event_elapsed_time(" + detail::sim_hex(start) + ", " + detail::sim_hex(stop) + ")";
  if (!a->timing || !b->timing) {
    return misuse(cudaErrorInvalidResourceHandle,
                  args + ": both events must be created with timing = true");
  }
  if (a->device != b->device) {
    return misuse(cudaErrorInvalidResourceHandle, args + ": the events belong to devices " +
                                                    std::to_string(a->device) + " and " +
                                                    std::to_string(b->device));
  }
  auto ca = a->current();
  auto cb = b->current();
  if (!ca || !cb) {
    return misuse(cudaErrorInvalidResourceHandle, args + ": an event was never recorded");
  }
  if (!ca->is_done() || !cb->is_done()) { return cudaErrorNotReady; }
  ms = std::chrono::duration<float, std::milli>(cb->when - ca->when).count();
  return cudaSuccess;
}

// ---- copies and host functions ------------------------------------------------------------------

GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::placement sim_runtime::place(void const* p,
                                                                        std::size_t bytes) const
{
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - a) {
    return placement{placement::where::invalid, -1, "the range wraps around the address space"};
  }
  auto const end = a + bytes;
  if (auto it = allocations_.upper_bound(a); it != allocations_.begin()) {
    --it;
    if (a < it->first + it->second.mapped_bytes) {
      return place_in_allocation(it->first, it->second, end, bytes);
    }
  }
  if (auto r = reservations_.upper_bound(a); r != reservations_.begin()) {
    --r;
    if (a < r->first + r->second.bytes) {
      if (end > r->first + r->second.bytes) {
        return placement{
          placement::where::invalid, -1,
          "the range runs past the end of the reservation at " + detail::sim_hex(r->first)};
      }
      return place_in_mappings(a, end);
    }
  }
  return placement{};  // host memory
}

GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::placement sim_runtime::place_in_allocation(
  std::uintptr_t base, detail::sim_allocation const& al, std::uintptr_t end, std::size_t bytes)
{
  if (al.pending_free) {
    return placement{placement::where::invalid, al.device,
                     "the allocation at " + detail::sim_hex(base) + " was freed with free_async"};
  }
  if (end > base + al.bytes) {
    return placement{placement::where::invalid, al.device,
                     std::to_string(bytes) + " bytes from here run " +
                       std::to_string(end - (base + al.bytes)) +
                       " bytes past the end of the allocation at " + detail::sim_hex(base) +
                       " of " + std::to_string(al.bytes) + " bytes"};
  }
  return placement{placement::where::device, al.device, {}};
}

GPUKIT_DETAIL_COMPILED_INLINE sim_runtime::placement sim_runtime::place_in_mappings(
  std::uintptr_t a, std::uintptr_t end) const
{
  placement out{placement::where::invalid, -1, {}};
  auto m = mappings_.upper_bound(a);
  if (m == mappings_.begin()) {
    out.why = "virtual memory not mapped at " + detail::sim_hex(a);
    return out;
  }
  --m;
  out.device            = m->second.device;
  std::uintptr_t cursor = a;
  while (cursor < end) {
    if (m == mappings_.end() || m->first > cursor || m->first + m->second.bytes <= cursor) {
      out.why = "virtual memory not mapped at " + detail::sim_hex(cursor);
      return out;
    }
    if (m->second.access_mask == 0) {
      out.why = "virtual memory at " + detail::sim_hex(cursor) +
                " is mapped but not accessible (vm_set_access was not called)";
      return out;
    }
    cursor = m->first + m->second.bytes;
    ++m;
  }
  out.kind = placement::where::device;
  return out;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t
sim_runtime::check_side(char const* call, std::string const& args, char const* side, void const* p,
                        std::size_t bytes, bool want_device, int want_device_id)
{
  auto const fail = [&](std::string const& why) {
    return misuse(cudaErrorInvalidValue, std::string{call} + "(" + args + "): " + side + " " +
                                           detail::sim_hex(p) + ": " + why);
  };
  if (p == nullptr) { return fail("null pointer"); }
  placement pl;
  {
    std::lock_guard<std::mutex> lock{mem_mutex_};
    pl = place(p, bytes);
  }
  if (pl.kind == placement::where::invalid) { return fail(pl.why); }
  if (want_device && pl.kind != placement::where::device) {
    return fail("not device memory of this simulated GPU (host memory, never allocated, or freed)");
  }
  if (!want_device && pl.kind != placement::where::host) {
    return fail("is device memory (on device " + std::to_string(pl.device) +
                "), but the copy kind says host memory");
  }
  if (want_device && want_device_id >= 0 && pl.device != want_device_id) {
    return fail("is memory of device " + std::to_string(pl.device) + ", not of device " +
                std::to_string(want_device_id));
  }
  return cudaSuccess;
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::memcpy_async(void* dst, void const* src,
                                                                    std::size_t bytes,
                                                                    memcpy_kind kind, stream_type s)
{
  if (auto e = enter(sim_op::memcpy_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "memcpy_async", err);
  if (!stream) { return err; }
  auto const args = "dst " + detail::sim_hex(dst) + ", src " + detail::sim_hex(src) + ", " +
                    std::to_string(bytes) + ", kind " + std::to_string(static_cast<int>(kind));
  bool dst_device = false;
  bool src_device = false;
  switch (kind) {
    case memcpy_kind::host_to_host: break;
    case memcpy_kind::host_to_device: dst_device = true; break;
    case memcpy_kind::device_to_host: src_device = true; break;
    case memcpy_kind::device_to_device: dst_device = src_device = true; break;
    case memcpy_kind::infer: break;
    default:
      return misuse(cudaErrorInvalidMemcpyDirection,
                    "memcpy_async(" + args + "): unknown memcpy_kind");
  }
  if (bytes == 0) { return cudaSuccess; }
  if (kind == memcpy_kind::infer) {
    // Either side may be anything valid: only invalid placements (bad ranges) are refused.
    for (auto [side, p] : {std::pair<char const*, void const*>{"dst", dst}, {"src", src}}) {
      if (p == nullptr) {
        return misuse(cudaErrorInvalidValue, "memcpy_async(" + args + "): " + side + " is null");
      }
      placement pl;
      {
        std::lock_guard<std::mutex> lock{mem_mutex_};
        pl = place(p, bytes);
      }
      if (pl.kind == placement::where::invalid) {
        return misuse(cudaErrorInvalidValue, "memcpy_async(" + args + "): " + side + " " +
                                               detail::sim_hex(p) + ": " + pl.why);
      }
    }
  } else {
    if (auto e = check_side("memcpy_async", args, "dst", dst, bytes, dst_device, -1);
        e != cudaSuccess) {
      return e;
    }
    if (auto e = check_side("memcpy_async", args, "src", src, bytes, src_device, -1);
        e != cudaSuccess) {
      return e;
    }
  }
  return enqueue(
    *stream, [dst, src, bytes] { std::memmove(dst, src, bytes); }, "memcpy_async");
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::memcpy_peer_async(
  void* dst, int dst_device, void const* src, int src_device, std::size_t bytes, stream_type s)
{
  if (auto e = enter(sim_op::memcpy_peer_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "memcpy_peer_async", err);
  if (!stream) { return err; }
  if (!valid_device(dst_device)) { return bad_device("memcpy_peer_async", dst_device); }
  if (!valid_device(src_device)) { return bad_device("memcpy_peer_async", src_device); }
  if (bytes == 0) { return cudaSuccess; }
  auto const args = "dst " + detail::sim_hex(dst) + " on device " + std::to_string(dst_device) +
                    ", src " + detail::sim_hex(src) + " on device " + std::to_string(src_device) +
                    ", " + std::to_string(bytes);
  if (auto e = check_side("memcpy_peer_async", args, "dst", dst, bytes, true, dst_device);
      e != cudaSuccess) {
    return e;
  }
  if (auto e = check_side("memcpy_peer_async", args, "src", src, bytes, true, src_device);
      e != cudaSuccess) {
    return e;
  }
  if (src_device != dst_device && !peer_access_enabled(src_device, dst_device) &&
      !peer_access_enabled(dst_device, src_device)) {
    staged_peer_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  return enqueue(
    *stream, [dst, src, bytes] { std::memmove(dst, src, bytes); }, "memcpy_peer_async");
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::memset_async(void* dst, int value,
                                                                    std::size_t bytes,
                                                                    stream_type s)
{
  if (auto e = enter(sim_op::memset_async); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "memset_async", err);
  if (!stream) { return err; }
  if (bytes == 0) { return cudaSuccess; }
  auto const args = "dst " + detail::sim_hex(dst) + ", value " + std::to_string(value) + ", " +
                    std::to_string(bytes);
  if (auto e = check_side("memset_async", args, "dst", dst, bytes, true, -1); e != cudaSuccess) {
    return e;
  }
  return enqueue(
    *stream, [dst, value, bytes] { std::memset(dst, value, bytes); }, "memset_async");
}

GPUKIT_DETAIL_COMPILED_INLINE cudaError_t sim_runtime::launch_host_func(stream_type s, host_fn fn,
                                                                        void* user)
{
  if (auto e = enter(sim_op::launch_host_func); e != cudaSuccess) { return e; }
  cudaError_t err = cudaSuccess;
  auto stream     = find_stream(s, "launch_host_func", err);
  if (!stream) { return err; }
  if (fn == nullptr) {
    return misuse(cudaErrorInvalidValue,
                  "launch_host_func(fn null, user " + detail::sim_hex(user) + "): null function");
  }
  return enqueue(
    *stream, [fn, user] { fn(user); }, "launch_host_func");
}

}  // namespace gpukit
