// SPDX-License-Identifier: Apache-2.0
// gpukit/host/detail/pinned_pool_impl.hpp: the bodies of gpukit::basic_pinned_pool. Not public API.
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/host/detail/host_pages.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

namespace gpukit {

namespace detail {

inline std::string pinned_hex(void const* p)
{
  char buf[2 + 2 * sizeof(void*) + 1];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace detail

// A pinned range: from host_alloc, memory the pool mapped and registered (map_and_register), or
// the user's memory registered with host_register. Buffers are carved from it front to back
// (`next`), and never given back one by one.
template <class Runtime>
struct basic_pinned_pool<Runtime>::segment {
  void* base{nullptr};
  std::size_t bytes{0};
  std::uintptr_t next{0};  ///< first address not carved yet
  std::uintptr_t end{0};
  segment_kind kind{segment_kind::allocated};
  std::size_t map_bytes{0};  ///< bytes to munmap (segment_kind::mapped)
  std::size_t live{0};       ///< buffers carved from it that are handed out or pending
  memory_heap heap{};        ///< the range as an NVTX heap (options_.nvtx_annotate)
};

template <class Runtime>
struct basic_pinned_pool<Runtime>::block {
  enum class state { in_use, pending, ready };
  void* ptr{nullptr};
  std::size_t cls{0};
  std::size_t requested{0};
  segment* seg{nullptr};
  state st{state::ready};
  std::vector<used_stream> streams;  ///< record_stream, cleared when handed out
};

// A returned buffer and the events (one per stream that used it) it waits on.
template <class Runtime>
struct basic_pinned_pool<Runtime>::pending {
  block* b{nullptr};
  device_event first{};
  std::vector<device_event> more;
};

template <class Runtime>
basic_pinned_pool<Runtime>::basic_pinned_pool(Runtime& runtime, pinned_pool_options options)
    : runtime_{runtime}, options_{options}
{
  GPUKIT_EXPECTS(options_.pin_threads >= 0,
                 "pinned_pool: pin_threads is " + std::to_string(options_.pin_threads));
  GPUKIT_EXPECTS(
    options_.growth == pinned_growth::map_and_register ||
      options_.growth == pinned_growth::host_alloc,
    "pinned_pool: unknown growth " + std::to_string(static_cast<int>(options_.growth)));
  if (options_.pin_threads == 0) {
    int const hw         = static_cast<int>(std::thread::hardware_concurrency());
    options_.pin_threads = std::max(1, std::min(8, hw));
  }
}

template <class Runtime>
typename Runtime::error_type basic_pinned_pool<Runtime>::free_segment(segment& s) noexcept
{
  if (options_.nvtx_annotate) { unregister_memory_heap(s.heap); }
  switch (s.kind) {
    case segment_kind::allocated: return runtime_.host_free(s.base);
    case segment_kind::user: return runtime_.host_unregister(s.base);
    case segment_kind::mapped: {
      typename Runtime::error_type const r = runtime_.host_unregister(s.base);
      // Unmapped even when unregistering fails: the pages are the pool's alone.
      int const e = detail::unmap_host_pages(s.base, s.map_bytes);
      return r != Runtime::success ? r : (e != 0 ? Runtime::invalid_value : Runtime::success);
    }
  }
  return Runtime::invalid_value;
}

template <class Runtime>
basic_pinned_pool<Runtime>::~basic_pinned_pool()
{
  lifetime_.expire();  // first, before anything is freed (dependents' callbacks wait for copies)
  detail::pool_lock lock{mutex_};
  auto finish = [this](device_event const& e) {
    GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_synchronize(e.event));
    GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_destroy(e.event));
  };
  for (auto& p : pending_) {
    finish(p.first);
    for (auto const& e : p.more) { finish(e); }
  }
  for (auto const& e : spare_events_) {
    GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_destroy(e.event));
  }
  for (auto& s : segments_) { GPUKIT_ASSERT_CUDA_SUCCESS(free_segment(*s)); }
}

template <class Runtime>
std::size_t basic_pinned_pool<Runtime>::class_size(std::size_t bytes) noexcept
{
  if (bytes == 0) { return 0; }
  if (bytes <= min_class_bytes) { return min_class_bytes; }
  int p = 0;
  for (std::size_t v = bytes; v > 1; v >>= 1) { ++p; }
  std::size_t const step = std::size_t{1} << (p - 3);  // 8 classes per power of two
  return (bytes + step - 1) & ~(step - 1);
}

template <class Runtime>
void basic_pinned_pool<Runtime>::bump(stat_pair& s, std::int64_t delta) noexcept
{
  s.current += delta;
  s.peak = std::max(s.peak, s.current);
}

template <class Runtime>
void basic_pinned_pool<Runtime>::check_limit(std::size_t more, std::size_t request,
                                             char const* call)
{
  std::size_t const lim = options_.limit_bytes;
  if (lim == 0 || (more <= lim && reserved_ <= lim - more)) { return; }
  ++stats_.num_limit_refusals;
  throw bad_alloc{"gpukit: pinned_pool::" + std::string{call} + ": " + std::to_string(request) +
                  " bytes (" + std::to_string(more) + " to pin) would pass the limit of " +
                  std::to_string(lim) + " bytes: " + std::to_string(reserved_) + " pinned, " +
                  std::to_string(stats_.cached_bytes.current) + " cached (" +
                  std::to_string(stats_.pending_bytes) +
                  " waiting on streams); raise the limit or call release_cached()"};
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::segment& basic_pinned_pool<Runtime>::add_segment(
  void* base, std::size_t bytes, segment_kind kind, std::size_t map_bytes)
{
  auto s       = std::make_unique<segment>();
  s->base      = base;
  s->bytes     = bytes;
  auto const b = reinterpret_cast<std::uintptr_t>(base);
  s->next      = (b + min_class_bytes - 1) & ~std::uintptr_t{min_class_bytes - 1};
  s->end       = b + bytes;
  s->kind      = kind;
  s->map_bytes = map_bytes;
  if (options_.nvtx_annotate) { s->heap = register_memory_heap(base, bytes, "gpukit pinned pool"); }
  segments_.push_back(std::move(s));
  bump(stats_.reserved_bytes, static_cast<std::int64_t>(bytes));
  bump(stats_.segment_count, 1);
  return *segments_.back();
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::segment& basic_pinned_pool<Runtime>::grow(std::size_t bytes,
                                                                               std::size_t request,
                                                                               growth_call call)
{
  // Counted as reserved before the lock is dropped, so that concurrent growth cannot pass the
  // limit together.
  check_limit(bytes, request, call.name);
  reserved_ += bytes;
  bool const map = options_.growth == pinned_growth::map_and_register;
  GPUKIT_DETAIL_SLOW_PATH_RANGEF(categories::pinned_pool, "pinned pool: grow %.1f MiB (%s)",
                                 detail::mib(bytes), map ? "map and register" : "host alloc");
  ++(map ? stats_.num_host_registers : stats_.num_host_allocs);
  void* p                        = nullptr;
  std::size_t map_bytes          = 0;
  typename Runtime::error_type r = Runtime::success;
  bool map_failed                = false;
  int map_error                  = 0;  // errno of the failed mapping
  {
    detail::pool_lock::unlocked_scope unlocked{mutex_};
    if (map) {
      detail::host_mapping const m =
        detail::map_host_pages(bytes, options_.huge_pages, options_.pin_threads);
      if (m.base == nullptr) {
        map_failed = true;
        map_error  = m.error;
      } else {
        r = runtime_.host_register(m.base, m.bytes, options_.register_flags);
        if (r != Runtime::success) { (void)detail::unmap_host_pages(m.base, m.bytes); }
        p         = m.base;
        map_bytes = m.bytes;
      }
    } else {
      r = runtime_.host_alloc(&p, bytes, options_.alloc_flags);
    }
  }
  if (map_failed) {
    reserved_ -= bytes;
    throw bad_alloc{"gpukit: pinned_pool::" + std::string{call.name} + ": mapping " +
                    std::to_string(bytes) +
                    " bytes of host memory failed: " + std::strerror(map_error)};
  }
  if (r != Runtime::success) {
    reserved_ -= bytes;
    detail::throw_cuda_error(r, map ? call.host_register : call.host_alloc, GPUKIT_DETAIL_SOURCE);
  }
  ++stats_.num_growths;
  return add_segment(p, bytes, map ? segment_kind::mapped : segment_kind::allocated, map_bytes);
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::block* basic_pinned_pool<Runtime>::take_ready(std::size_t cls)
{
  auto it = ready_.find(cls);
  if (it == ready_.end() || it->second.empty()) { return nullptr; }
  block* b = it->second.back();
  it->second.pop_back();
  return b;
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::block* basic_pinned_pool<Runtime>::carve(std::size_t cls)
{
  // Newest segments first: older ones are usually full.
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it) {
    segment& s               = **it;
    std::size_t const stride = (cls + min_class_bytes - 1) & ~(min_class_bytes - 1);
    if (s.next > s.end || s.end - s.next < cls) { continue; }
    auto b = std::make_unique<block>();
    b->ptr = reinterpret_cast<void*>(s.next);
    b->cls = cls;
    b->seg = &s;
    b->st  = block::state::in_use;               // about to be handed out: never cached
    s.next += std::min(stride, s.end - s.next);  // the next buffer stays 4 KiB aligned
    block* raw = b.get();
    blocks_.emplace(raw->ptr, std::move(b));
    return raw;
  }
  return nullptr;
}

template <class Runtime>
void basic_pinned_pool<Runtime>::poll_pending(std::size_t cls, bool all)
{
  auto done = [this](device_event const& e) {
    typename Runtime::error_type const r = runtime_.event_query(e.event);
    if (r == Runtime::not_ready) { return false; }
    if (r != Runtime::success) {
      detail::throw_cuda_error(r, "event_query (pinned_pool)", GPUKIT_DETAIL_SOURCE);
    }
    return true;
  };
  for (std::size_t i = 0; i < pending_.size();) {
    pending& p = pending_[i];
    if (!all && p.b->cls != cls) {
      ++i;
      continue;
    }
    bool ready = done(p.first);
    for (std::size_t k = 0; ready && k < p.more.size(); ++k) { ready = done(p.more[k]); }
    if (!ready) {
      ++i;
      continue;
    }
    spare_events_.push_back(p.first);
    spare_events_.insert(spare_events_.end(), p.more.begin(), p.more.end());
    block* b = p.b;
    b->st    = block::state::ready;
    --b->seg->live;
    stats_.pending_bytes -= static_cast<std::int64_t>(b->cls);
    ready_[b->cls].push_back(b);
    if (i + 1 != pending_.size()) { pending_[i] = std::move(pending_.back()); }
    pending_.pop_back();
  }
}

template <class Runtime>
void basic_pinned_pool<Runtime>::hand_out(block& b, std::size_t bytes, bool hit)
{
  if (b.st == block::state::ready) { bump(stats_.cached_bytes, -static_cast<std::int64_t>(b.cls)); }
  b.st        = block::state::in_use;
  b.requested = bytes;
  b.streams.clear();
  ++b.seg->live;
  bump(stats_.allocated_bytes, static_cast<std::int64_t>(b.cls));
  bump(stats_.requested_bytes, static_cast<std::int64_t>(bytes));
  bump(stats_.allocation_count, 1);
  ++stats_.num_allocs;
  if (hit) { ++stats_.num_cache_hits; }
  if (options_.nvtx_annotate) { register_memory_region(b.seg->heap, b.ptr, bytes); }
}

template <class Runtime>
void* basic_pinned_pool<Runtime>::allocate(std::size_t bytes)
{
  GPUKIT_EXPECTS(bytes != 0, "pinned_pool::allocate: 0 bytes requested");
  if (bytes > max_request_bytes) {
    throw bad_alloc{"gpukit: pinned_pool::allocate: " + std::to_string(bytes) +
                    " bytes is more than any host can pin (largest request: " +
                    std::to_string(max_request_bytes) + " bytes)"};
  }
  std::size_t const cls = class_size(bytes);
  detail::pool_lock lock{mutex_};
  block* b = take_ready(cls);
  if (b == nullptr) {
    poll_pending(cls, false);
    b = take_ready(cls);
  }
  if (b != nullptr) {
    hand_out(*b, bytes, true);
    return b->ptr;
  }
  if ((b = carve(cls)) != nullptr) {
    hand_out(*b, bytes, false);
    return b->ptr;
  }
  // Pin a range of its own.
  segment& s = grow(
    cls, bytes,
    {"allocate", "host_alloc (pinned_pool::allocate)", "host_register (pinned_pool::allocate)"});
  void* p = s.base;
  s.next  = s.end;
  auto nb = std::make_unique<block>();
  nb->ptr = p;
  nb->cls = cls;
  nb->seg = &s;
  nb->st  = block::state::in_use;
  b       = nb.get();
  blocks_.emplace(p, std::move(nb));
  hand_out(*b, bytes, false);
  return p;
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::block& basic_pinned_pool<Runtime>::find_handed_out(
  void* ptr, char const* call)
{
  auto it = blocks_.find(ptr);
  GPUKIT_EXPECTS(it != blocks_.end(), "pinned_pool::" + std::string{call} + ": pointer " +
                                        detail::pinned_hex(ptr) +
                                        " was never handed out by this pool");
  GPUKIT_EXPECTS(it->second->st == block::state::in_use, "pinned_pool::" + std::string{call} +
                                                           ": pointer " + detail::pinned_hex(ptr) +
                                                           " is not handed out (double return?)");
  return *it->second;
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::device_event basic_pinned_pool<Runtime>::take_event(int device)
{
  for (auto it = spare_events_.rbegin(); it != spare_events_.rend(); ++it) {
    if (it->device == device) {
      device_event const e = *it;
      spare_events_.erase(std::next(it).base());
      return e;
    }
  }
  // An event records only on streams of the device it was created on.
  device_guard<Runtime> guard{runtime_, device};
  device_event e{device, event_type{}};
  GPUKIT_CUDA_TRY(runtime_.event_create(e.event, false));
  return e;
}

template <class Runtime>
typename basic_pinned_pool<Runtime>::used_stream basic_pinned_pool<Runtime>::used_by(
  stream_type stream)
{
  used_stream u{stream, 0};
  GPUKIT_CUDA_TRY(runtime_.stream_get_device(stream, u.device));
  return u;
}

// One event per stream `b` was used on, recorded there. A stream found destroyed (an invalid
// handle) gets none: work queued on a destroyed stream still runs, so its device is synchronized
// once instead and the stream dropped. On failure the events go back to the spares and the error
// propagates.
template <class Runtime>
std::vector<typename basic_pinned_pool<Runtime>::device_event>
basic_pinned_pool<Runtime>::record_events(std::vector<used_stream>& streams)
{
  std::vector<device_event> events;
  try {
    for (std::size_t i = 0; i < streams.size();) {
      device_event const e                 = take_event(streams[i].device);
      typename Runtime::error_type const r = runtime_.event_record(e.event, streams[i].stream);
      if (r != Runtime::success) { spare_events_.push_back(e); }
      if (r == Runtime::invalid_resource_handle) {
        device_guard<Runtime> guard{runtime_, streams[i].device};
        GPUKIT_CUDA_TRY(runtime_.device_synchronize());
        ++stats_.num_dead_streams;
        streams.erase(streams.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      GPUKIT_CUDA_TRY(r, "event_record (pinned_pool::deallocate_async)");
      events.push_back(e);
      ++stats_.num_events_recorded;
      ++i;
    }
  } catch (...) {
    spare_events_.insert(spare_events_.end(), events.begin(), events.end());
    throw;
  }
  return events;
}

template <class Runtime>
void basic_pinned_pool<Runtime>::take_back(block& b, used_stream const* stream)
{
  std::vector<used_stream>& streams = b.streams;
  bool const added =
    stream != nullptr && std::find(streams.begin(), streams.end(), *stream) == streams.end();
  if (added) { streams.push_back(*stream); }
  auto const cls = static_cast<std::int64_t>(b.cls);
  std::vector<device_event> events;
  try {
    events = record_events(streams);
  } catch (...) {  // the buffer stays handed out
    if (added) {
      auto const it = std::find(streams.begin(), streams.end(), *stream);
      if (it != streams.end()) { streams.erase(it); }
    }
    throw;
  }
  if (events.empty()) {
    streams.clear();
    b.st = block::state::ready;
    --b.seg->live;
    ready_[b.cls].push_back(&b);
  } else {
    pending p;
    p.b     = &b;
    p.first = events.front();
    p.more.assign(events.begin() + 1, events.end());
    b.st = block::state::pending;
    stats_.pending_bytes += cls;
    pending_.push_back(std::move(p));
  }
  bump(stats_.allocated_bytes, -cls);
  bump(stats_.requested_bytes, -static_cast<std::int64_t>(b.requested));
  bump(stats_.allocation_count, -1);
  bump(stats_.cached_bytes, cls);
  ++stats_.num_frees;
  if (options_.nvtx_annotate) { unregister_memory_region(b.ptr); }
}

template <class Runtime>
void basic_pinned_pool<Runtime>::deallocate(void* ptr)
{
  detail::pool_lock lock{mutex_};
  take_back(find_handed_out(ptr, "deallocate"), nullptr);
}

template <class Runtime>
void basic_pinned_pool<Runtime>::deallocate_async(void* ptr, stream_type stream)
{
  // The stream's device is asked before the lock: the runtime call stays off the pool's mutex.
  used_stream const used = used_by(stream);
  detail::pool_lock lock{mutex_};
  take_back(find_handed_out(ptr, "deallocate_async"), &used);
}

template <class Runtime>
void basic_pinned_pool<Runtime>::record_stream(void* ptr, stream_type stream)
{
  used_stream const used = used_by(stream);
  detail::pool_lock lock{mutex_};
  block& b = find_handed_out(ptr, "record_stream");
  if (std::find(b.streams.begin(), b.streams.end(), used) == b.streams.end()) {
    b.streams.push_back(used);
  }
}

template <class Runtime>
void basic_pinned_pool<Runtime>::reserve(std::size_t bytes)
{
  GPUKIT_EXPECTS(bytes != 0, "pinned_pool::reserve: 0 bytes requested");
  if (bytes > max_request_bytes) {
    throw bad_alloc{"gpukit: pinned_pool::reserve: " + std::to_string(bytes) +
                    " bytes is more than any host can pin"};
  }
  detail::pool_lock lock{mutex_};
  (void)grow(
    bytes, bytes,
    {"reserve", "host_alloc (pinned_pool::reserve)", "host_register (pinned_pool::reserve)"});
}

template <class Runtime>
void basic_pinned_pool<Runtime>::prewarm(std::size_t bytes, std::size_t count)
{
  GPUKIT_EXPECTS(bytes != 0 && count != 0, "pinned_pool::prewarm: " + std::to_string(count) +
                                             " buffers of " + std::to_string(bytes) +
                                             " bytes requested");
  std::size_t const cls = class_size(std::min(bytes, max_request_bytes));
  if (bytes > max_request_bytes || count > max_request_bytes / cls) {
    throw bad_alloc{"gpukit: pinned_pool::prewarm: " + std::to_string(count) + " x " +
                    std::to_string(bytes) + " bytes is more than any host can pin"};
  }
  std::size_t const stride = (cls + min_class_bytes - 1) & ~(min_class_bytes - 1);
  std::size_t const total  = stride * count;
  detail::pool_lock lock{mutex_};
  segment& s =
    grow(total, total,
         {"prewarm", "host_alloc (pinned_pool::prewarm)", "host_register (pinned_pool::prewarm)"});
  auto& list = ready_[cls];
  for (std::size_t i = 0; i < count; ++i) {
    auto b = std::make_unique<block>();
    b->ptr = reinterpret_cast<void*>(s.next);
    b->cls = cls;
    b->seg = &s;
    s.next += stride;
    list.push_back(b.get());
    blocks_.emplace(b->ptr, std::move(b));
  }
  bump(stats_.cached_bytes, static_cast<std::int64_t>(cls * count));
}

template <class Runtime>
void basic_pinned_pool<Runtime>::add_host_memory(void* ptr, std::size_t bytes)
{
  GPUKIT_EXPECTS(ptr != nullptr && bytes != 0, "pinned_pool::add_host_memory: range " +
                                                 detail::pinned_hex(ptr) + " of " +
                                                 std::to_string(bytes) + " bytes");
  detail::pool_lock lock{mutex_};
  check_limit(bytes, bytes, "add_host_memory");
  reserved_ += bytes;
  ++stats_.num_host_registers;
  typename Runtime::error_type r = Runtime::success;
  {
    detail::pool_lock::unlocked_scope unlocked{mutex_};
    r = runtime_.host_register(ptr, bytes, options_.register_flags);
  }
  if (r != Runtime::success) {
    reserved_ -= bytes;
    detail::throw_cuda_error(r, "host_register (pinned_pool::add_host_memory)",
                             GPUKIT_DETAIL_SOURCE);
  }
  add_segment(ptr, bytes, segment_kind::user, 0);
}

template <class Runtime>
std::vector<std::unique_ptr<typename basic_pinned_pool<Runtime>::segment>>
basic_pinned_pool<Runtime>::take_unused_segments()
{
  poll_pending(0, true);
  std::vector<std::unique_ptr<segment>> dropped;
  for (auto it = segments_.begin(); it != segments_.end();) {
    if ((*it)->live != 0) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(*it));
    it = segments_.erase(it);
  }
  if (dropped.empty()) { return dropped; }
  auto gone = [&](block const* b) {
    for (auto const& s : dropped) {
      if (b->seg == s.get()) { return true; }
    }
    return false;
  };
  for (auto& [cls, list] : ready_) {
    list.erase(std::remove_if(list.begin(), list.end(), gone), list.end());
  }
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (gone(it->second.get())) {
      bump(stats_.cached_bytes, -static_cast<std::int64_t>(it->second->cls));
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

template <class Runtime>
std::size_t basic_pinned_pool<Runtime>::release_cached()
{
  std::vector<std::unique_ptr<segment>> dropped;
  {
    detail::pool_lock lock{mutex_};
    dropped = take_unused_segments();
  }
  std::size_t released = 0;
  // The first failure is thrown once every range has been tried.
  typename Runtime::error_type error = Runtime::success;
  char const* failed_call            = nullptr;
  for (auto& s : dropped) {
    typename Runtime::error_type const r = free_segment(*s);
    detail::pool_lock lock{mutex_};
    bool const freed = s->kind == segment_kind::allocated;
    ++(freed ? stats_.num_host_frees : stats_.num_host_unregisters);
    if (r != Runtime::success) {  // keep it out of the pool: the memory state is unknown
      if (error == Runtime::success) {
        error       = r;
        failed_call = freed ? "host_free (pinned_pool::release_cached)"
                            : "host_unregister (pinned_pool::release_cached)";
      }
      continue;
    }
    released += s->bytes;
    reserved_ -= s->bytes;
    bump(stats_.reserved_bytes, -static_cast<std::int64_t>(s->bytes));
    bump(stats_.segment_count, -1);
  }
  if (error != Runtime::success) {
    detail::throw_cuda_error(error, failed_call, GPUKIT_DETAIL_SOURCE);
  }
  return released;
}

template <class Runtime>
bool basic_pinned_pool<Runtime>::owns(void const* ptr, std::size_t bytes) const noexcept
{
  auto const a = reinterpret_cast<std::uintptr_t>(ptr);
  if (ptr == nullptr || a + bytes < a) { return false; }
  detail::pool_lock lock{mutex_};
  for (auto const& s : segments_) {
    auto const b = reinterpret_cast<std::uintptr_t>(s->base);
    if (a >= b && a + bytes <= b + s->bytes) { return true; }
  }
  return false;
}

template <class Runtime>
pinned_pool_stats basic_pinned_pool<Runtime>::stats() const
{
  detail::pool_lock lock{mutex_};
  return stats_;
}

template <class Runtime>
void basic_pinned_pool<Runtime>::reset_peak()
{
  detail::pool_lock lock{mutex_};
  for (stat_pair* s : {&stats_.allocated_bytes, &stats_.requested_bytes, &stats_.reserved_bytes,
                       &stats_.cached_bytes, &stats_.allocation_count, &stats_.segment_count}) {
    s->peak = s->current;
  }
}

template <class Runtime>
std::size_t basic_pinned_pool<Runtime>::limit() const noexcept
{
  detail::pool_lock lock{mutex_};
  return options_.limit_bytes;
}

template <class Runtime>
void basic_pinned_pool<Runtime>::set_limit(std::size_t bytes) noexcept
{
  detail::pool_lock lock{mutex_};
  options_.limit_bytes = bytes;
}

template <class Runtime>
void pinned_buffer<Runtime>::record_stream(stream_type stream)
{
  GPUKIT_EXPECTS(ptr_ != nullptr, "pinned_buffer::record_stream: the buffer is empty");
  GPUKIT_EXPECTS(pool_life_.alive(), "pinned_buffer::record_stream: the pool was destroyed");
  pool_->record_stream(ptr_, stream);
}

template <class Runtime>
void pinned_buffer<Runtime>::reset() noexcept
{
  if (ptr_ == nullptr) { return; }
  if (!pool_life_.alive()) {  // the pool's destructor freed the memory
    pool_      = nullptr;
    pool_life_ = {};
    ptr_       = nullptr;
    bytes_     = 0;
    return;
  }
  try {
    pool_->deallocate(ptr_);
  } catch (std::exception const& e) {  // destructors never throw: the buffer stays handed out
    std::fprintf(stderr, "gpukit: pinned_buffer: returning %zu bytes at %p failed: %s\n", bytes_,
                 ptr_, e.what());
  }
  pool_      = nullptr;
  pool_life_ = {};
  ptr_       = nullptr;
  bytes_     = 0;
}

}  // namespace gpukit
