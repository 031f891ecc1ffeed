// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/detail/backend.inl: the bodies of backend.hpp. Not public API.
#pragma once

#include "../backend.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>

namespace gpukit_torch {

template <class Runtime>
struct backend<Runtime>::device_state {
  std::unique_ptr<allocator_type> alloc;
  double fraction{1.0};
  std::map<pool_id, pool_state> pools;                      // under pools_mutex_
  std::vector<std::pair<pool_id, stream_filter>> underway;  // under pools_mutex_
  std::vector<capture_on_stream> captures;                  // under pools_mutex_
  mutable std::mutex base_mutex;
  gpukit::caching_allocator_stats base{};  // counters at the last reset of accumulated statistics
};

namespace detail {

inline std::string pool_name(pool_id id)
{
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

}  // namespace detail

template <class Runtime>
backend<Runtime>::backend(Runtime& runtime, gpukit::caching_allocator_options options)
    : runtime_{runtime}, options_{options}
{}

template <class Runtime>
backend<Runtime>::~backend()
{
  for (auto& d : devices_) { delete d.load(std::memory_order_relaxed); }
}

template <class Runtime>
typename backend<Runtime>::device_state* backend<Runtime>::state_if_created(
  int device) const noexcept
{
  if (device < 0 || device >= max_devices) { return nullptr; }
  return devices_[device].load(std::memory_order_acquire);
}

template <class Runtime>
typename backend<Runtime>::device_state& backend<Runtime>::state(int device) const
{
  if (device_state* d = state_if_created(device)) { return *d; }
  GPUKIT_EXPECTS(device >= 0 && device < max_devices,
                 "gpukit_torch: device " + std::to_string(device) + " is out of range");
  std::lock_guard<std::mutex> lock{create_mutex_};
  if (device_state* d = devices_[device].load(std::memory_order_acquire)) { return *d; }
  auto d   = std::make_unique<device_state>();
  d->alloc = std::make_unique<allocator_type>(runtime_, device, options_);
  if (history_on_.load(std::memory_order_relaxed)) { d->alloc->start_recording(); }
  devices_[device].store(d.get(), std::memory_order_release);
  return *d.release();
}

template <class Runtime>
typename backend<Runtime>::allocator_type& backend<Runtime>::allocator(int device)
{
  return *state(device).alloc;
}

template <class Runtime>
std::int64_t backend<Runtime>::now_us() noexcept
{
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// Allocation

template <class Runtime>
void* backend<Runtime>::allocate(int device, std::size_t bytes, stream_type stream)
{
  if (bytes == 0) { return nullptr; }
  device_state& d = state(device);
  record r{device, stream, bytes, pool_id{0, 0}, capture_context(record_when::state)};
  void* p = nullptr;
  try {
    if (routing_.load(std::memory_order_acquire) != 0) {
      std::lock_guard<std::mutex> lock{pools_mutex_};
      r.pool = route_locked(d, stream);
      p      = d.alloc->allocate_async(bytes, stream);
    } else {
      p = d.alloc->allocate_async(bytes, stream);
    }
  } catch (gpukit::bad_alloc const& e) {
    on_failed_allocation(device, bytes, e);
    throw;
  }
  if (traced_.load(std::memory_order_relaxed)) {
    trace({trace_entry::action::alloc, device, reinterpret_cast<std::uintptr_t>(p), bytes,
           reinterpret_cast<std::uintptr_t>(stream), r.pool, now_us(),
           history_when_.load(std::memory_order_relaxed) >= static_cast<int>(record_when::alloc)
             ? r.context
             : nullptr});
  }
  std::lock_guard<std::mutex> lock{records_mutex_};
  records_.emplace(p, std::move(r));
  return p;
}

template <class Runtime>
void backend<Runtime>::deallocate(void* ptr)
{
  if (ptr == nullptr) { return; }
  record r;
  {
    std::lock_guard<std::mutex> lock{records_mutex_};
    auto it = records_.find(ptr);
    GPUKIT_EXPECTS(it != records_.end(), "gpukit_torch: free of " + gpukit::detail::hex(ptr) +
                                           ", which gpukit did not allocate (or freed already)");
    r = std::move(it->second);
    records_.erase(it);
  }
  device_state& d = state(r.device);
  d.alloc->deallocate_async(ptr, r.bytes, r.stream);
  if (traced_.load(std::memory_order_relaxed)) {
    auto ctx = capture_context(record_when::all);
    if (!ctx) { ctx = r.context; }
    auto const at = now_us();
    for (auto what : {trace_entry::action::free_requested, trace_entry::action::free_completed}) {
      trace({what, r.device, reinterpret_cast<std::uintptr_t>(ptr), r.bytes,
             reinterpret_cast<std::uintptr_t>(r.stream), r.pool, at, ctx});
    }
  }
}

template <class Runtime>
bool backend<Runtime>::owns(void const* ptr) const
{
  std::lock_guard<std::mutex> lock{records_mutex_};
  return records_.count(ptr) != 0;
}

template <class Runtime>
int backend<Runtime>::device_of(void const* ptr) const
{
  std::lock_guard<std::mutex> lock{records_mutex_};
  auto it = records_.find(ptr);
  GPUKIT_EXPECTS(it != records_.end(),
                 "gpukit_torch: " + gpukit::detail::hex(ptr) + " is not a block gpukit allocated");
  return it->second.device;
}

template <class Runtime>
void backend<Runtime>::record_stream(void* ptr, stream_type stream)
{
  state(device_of(ptr)).alloc->record_stream(ptr, stream);
}

template <class Runtime>
void backend<Runtime>::on_failed_allocation(int device, std::size_t bytes,
                                            gpukit::bad_alloc const& e)
{
  oom_info info;
  info.device    = device;
  info.requested = bytes;
  info.message   = e.what();
  if (auto const* oom = dynamic_cast<gpukit::out_of_memory const*>(&e)) {
    info.allocated    = oom->report().allocated;
    info.device_total = oom->report().device_total;
    info.device_free  = oom->report().device_free;
  } else {
    info.allocated = static_cast<std::size_t>(stats(device).allocated_bytes.current);
    gpukit::device_guard<Runtime> guard{runtime_, device};
    (void)runtime_.mem_get_info(info.device_free, info.device_total);
  }
  if (traced_.load(std::memory_order_relaxed)) {
    trace({trace_entry::action::oom,
           device,
           info.device_free,
           bytes,
           0,
           {0, 0},
           now_us(),
           capture_context(record_when::alloc)});
  }
  std::vector<oom_observer> observers;
  {
    std::lock_guard<std::mutex> lock{history_mutex_};
    observers = oom_observers_;
  }
  for (auto const& o : observers) { o(info); }
}

template <class Runtime>
void backend<Runtime>::add_oom_observer(oom_observer observer)
{
  GPUKIT_EXPECTS(static_cast<bool>(observer), "gpukit_torch: empty out-of-memory observer");
  std::lock_guard<std::mutex> lock{history_mutex_};
  oom_observers_.push_back(std::move(observer));
}

// ---------------------------------------------------------------------------------------------
// Private pools

template <class Runtime>
void backend<Runtime>::create_or_incref_pool(int device, pool_id id)
{
  GPUKIT_EXPECTS(id != pool_id(0, 0), "gpukit_torch: pool (0, 0) is the default pool");
  device_state& d = state(device);
  std::lock_guard<std::mutex> lock{pools_mutex_};
  ++d.pools[id].use_count;
}

template <class Runtime>
void backend<Runtime>::begin_allocate_to_pool(int device, pool_id id, stream_filter filter)
{
  GPUKIT_EXPECTS(static_cast<bool>(filter), "gpukit_torch: beginAllocateToPool without a filter");
  create_or_incref_pool(device, id);
  device_state& d = state(device);
  std::lock_guard<std::mutex> lock{pools_mutex_};
  for (auto const& u : d.underway) {
    if (u.first == id) {
      --d.pools[id].use_count;
      GPUKIT_EXPECTS(false, "gpukit_torch: beginAllocateToPool: already allocating to pool " +
                              detail::pool_name(id));
    }
  }
  d.underway.emplace_back(id, std::move(filter));
  // The capture begins after this call, on streams met at their first allocation: until then no
  // allocation or free may make a call that a capture refuses (an event query, a wait).
  d.alloc->begin_capture_window();
  update_routing_locked();
}

template <class Runtime>
void backend<Runtime>::end_allocate_to_pool(int device, pool_id id)
{
  device_state& d = state(device);
  std::lock_guard<std::mutex> lock{pools_mutex_};
  auto it = std::find_if(d.underway.begin(), d.underway.end(),
                         [&](auto const& u) { return u.first == id; });
  GPUKIT_EXPECTS(
    it != d.underway.end(),
    "gpukit_torch: endAllocateToPool: not allocating to pool " + detail::pool_name(id));
  d.underway.erase(it);
  for (std::size_t i = d.captures.size(); i-- > 0;) {
    if (d.captures[i].pool == id) { pause_locked(d, i); }
  }
  d.alloc->end_capture_window();
  update_routing_locked();
}

template <class Runtime>
void backend<Runtime>::release_pool(int device, pool_id id)
{
  device_state& d = state(device);
  std::lock_guard<std::mutex> lock{pools_mutex_};
  auto it = d.pools.find(id);
  GPUKIT_EXPECTS(it != d.pools.end() && it->second.use_count > 0,
                 "gpukit_torch: releasePool: no pool " + detail::pool_name(id));
  if (--it->second.use_count > 0) { return; }
  for (std::size_t i = d.captures.size(); i-- > 0;) {
    if (d.captures[i].pool == id) { pause_locked(d, i); }
  }
  for (auto cid : it->second.ended) { d.alloc->release_capture_pool(cid); }
  d.pools.erase(it);
  update_routing_locked();
}

template <class Runtime>
int backend<Runtime>::pool_use_count(int device, pool_id id) const
{
  device_state& d = state(device);
  std::lock_guard<std::mutex> lock{pools_mutex_};
  auto it = d.pools.find(id);
  return it == d.pools.end() ? 0 : it->second.use_count;
}

template <class Runtime>
bool backend<Runtime>::check_pool_live_allocations(int device, pool_id id,
                                                   std::unordered_set<void*> const& expected) const
{
  std::size_t live = 0;
  std::lock_guard<std::mutex> lock{records_mutex_};
  for (auto const& [p, r] : records_) {
    if (r.device != device || r.pool != id) { continue; }
    if (expected.count(const_cast<void*>(p)) == 0) { return false; }
    ++live;
  }
  return live == expected.size();
}

template <class Runtime>
std::vector<void*> backend<Runtime>::pool_live_blocks(int device, pool_id id) const
{
  std::vector<void*> live;
  {
    std::lock_guard<std::mutex> lock{records_mutex_};
    for (auto const& [p, r] : records_) {
      if (r.device == device && r.pool == id) { live.push_back(const_cast<void*>(p)); }
    }
  }
  std::sort(live.begin(), live.end());
  return live;
}

template <class Runtime>
std::vector<void*> backend<Runtime>::restore_pool(int device, pool_id id,
                                                  std::vector<void*> const& checkpoint)
{
  std::vector<void*> const now = pool_live_blocks(device, id);
  std::vector<void*> sorted    = checkpoint;
  std::sort(sorted.begin(), sorted.end());
  std::vector<void*> missing, extra;
  std::set_difference(sorted.begin(), sorted.end(), now.begin(), now.end(),
                      std::back_inserter(missing));
  std::set_difference(now.begin(), now.end(), sorted.begin(), sorted.end(),
                      std::back_inserter(extra));
  GPUKIT_EXPECTS(missing.empty(),
                 "gpukit_torch: setCheckpointPoolState: " + std::to_string(missing.size()) +
                   " block(s) of the checkpoint of pool " + detail::pool_name(id) +
                   " were freed since, and gpukit cannot allocate a block at a chosen address");
  for (void* p : extra) { deallocate(p); }
  return extra;
}

// Which pool an allocation on `stream` goes to, with the allocator's capture on `stream` set to
// match: the most recent pool whose filter accepts the stream, or the default pool.
template <class Runtime>
pool_id backend<Runtime>::route_locked(device_state& d, stream_type stream)
{
  pool_id target{0, 0};
  for (auto it = d.underway.rbegin(); it != d.underway.rend(); ++it) {
    if (it->second(stream)) {
      target = it->first;
      break;
    }
  }
  for (std::size_t i = 0; i < d.captures.size(); ++i) {
    if (d.captures[i].stream == stream) {
      if (d.captures[i].pool == target) { return target; }
      pause_locked(d, i);
      break;
    }
  }
  if (target == pool_id(0, 0)) { return target; }
  pool_state& p = d.pools[target];
  capture_on_stream c{stream, target, 0};
  if (!p.ended.empty()) {
    c.id = p.ended.back();
    d.alloc->resume_capture(stream, c.id);
    p.ended.pop_back();
  } else {
    c.id = d.alloc->begin_capture(stream);
  }
  d.captures.push_back(c);
  update_routing_locked();
  return target;
}

template <class Runtime>
void backend<Runtime>::pause_locked(device_state& d, std::size_t index)
{
  capture_on_stream const c = d.captures[index];
  d.alloc->end_capture(c.stream);
  d.pools[c.pool].ended.push_back(c.id);
  d.captures.erase(d.captures.begin() + static_cast<std::ptrdiff_t>(index));
}

template <class Runtime>
void backend<Runtime>::update_routing_locked()
{
  int n = 0;
  for (auto const& slot : devices_) {
    if (device_state const* d = slot.load(std::memory_order_acquire)) {
      n += static_cast<int>(d->underway.size() + d->captures.size());
    }
  }
  routing_.store(n, std::memory_order_release);
}

// ---------------------------------------------------------------------------------------------
// Statistics and limits

template <class Runtime>
device_stats backend<Runtime>::stats(int device) const
{
  device_stats out;
  device_state const* d = state_if_created(device);
  if (d == nullptr) { return out; }
  gpukit::caching_allocator_stats const s = d->alloc->stats();
  gpukit::caching_allocator_stats b;
  {
    std::lock_guard<std::mutex> lock{d->base_mutex};
    b = d->base;
  }
  auto i64 = [](auto v) { return static_cast<std::int64_t>(v); };
  // Per pool: gpukit's totals since the last reset of accumulated statistics.
  auto pool = [](gpukit::caching_pool_stats const& p, gpukit::caching_pool_stats const& base) {
    auto since = [](gpukit::stat_totals const& now, gpukit::stat_totals const& then) {
      return stat{now.current, now.peak, now.allocated - then.allocated, now.freed - then.freed};
    };
    device_pool_stats o;
    o.allocation           = since(p.allocation_count, base.allocation_count);
    o.segment              = since(p.segment_count, base.segment_count);
    o.active               = since(p.active_count, base.active_count);
    o.inactive_split       = since(p.inactive_split_count, base.inactive_split_count);
    o.allocated_bytes      = since(p.allocated_bytes, base.allocated_bytes);
    o.reserved_bytes       = since(p.reserved_bytes, base.reserved_bytes);
    o.active_bytes         = since(p.active_bytes, base.active_bytes);
    o.inactive_split_bytes = since(p.inactive_split_bytes, base.inactive_split_bytes);
    o.requested_bytes      = since(p.requested_bytes, base.requested_bytes);
    return o;
  };
  out.small_pool = pool(s.small_pool, b.small_pool);
  out.large_pool = pool(s.large_pool, b.large_pool);
  // The aggregate: gpukit's current values and peaks, the pools' totals together.
  auto all = [&](gpukit::stat_pair const& p, stat device_pool_stats::*member) {
    stat const &sm = out.small_pool.*member, &lg = out.large_pool.*member;
    return stat{p.current, p.peak, sm.allocated + lg.allocated, sm.freed + lg.freed};
  };
  using m                  = device_pool_stats;
  out.allocation           = all(s.allocation_count, &m::allocation);
  out.segment              = all(s.segment_count, &m::segment);
  out.active               = all(s.active_count, &m::active);
  out.inactive_split       = all(s.inactive_split_count, &m::inactive_split);
  out.allocated_bytes      = all(s.allocated_bytes, &m::allocated_bytes);
  out.reserved_bytes       = all(s.reserved_bytes, &m::reserved_bytes);
  out.active_bytes         = all(s.active_bytes, &m::active_bytes);
  out.inactive_split_bytes = all(s.inactive_split_bytes, &m::inactive_split_bytes);
  out.requested_bytes      = all(s.requested_bytes, &m::requested_bytes);
  out.num_alloc_retries    = i64(s.num_alloc_retries - b.num_alloc_retries);
  out.num_ooms             = i64(s.num_ooms - b.num_ooms);
  out.num_sync_all_streams = i64(s.synchronizing_frees - b.synchronizing_frees);
  out.num_device_alloc     = i64(s.num_device_allocs - b.num_device_allocs);
  out.num_device_free      = i64(s.num_device_frees - b.num_device_frees);
  return out;
}

template <class Runtime>
void backend<Runtime>::reset_peak_stats(int device)
{
  if (device_state* d = state_if_created(device)) { d->alloc->reset_peak(); }
}

template <class Runtime>
void backend<Runtime>::reset_accumulated_stats(int device)
{
  device_state* d = state_if_created(device);
  if (d == nullptr) { return; }
  {
    std::lock_guard<std::mutex> lock{d->base_mutex};
    d->base = d->alloc->stats();
  }
}

template <class Runtime>
void backend<Runtime>::set_memory_fraction(int device, double fraction)
{
  GPUKIT_EXPECTS(
    fraction >= 0.0 && fraction <= 1.0,
    "gpukit_torch: memory fraction " + std::to_string(fraction) + " is not within [0, 1]");
  device_state& d  = state(device);
  std::size_t free = 0, total = 0;
  {
    gpukit::device_guard<Runtime> guard{runtime_, device};
    GPUKIT_CUDA_TRY(runtime_.mem_get_info(free, total));
  }
  d.fraction = fraction;
  // A limit of 0 means none to gpukit: a fraction of 0 allows one byte (nothing fits).
  std::size_t const limit = static_cast<std::size_t>(fraction * static_cast<double>(total));
  d.alloc->set_limit(fraction >= 1.0 ? 0 : std::max<std::size_t>(limit, 1));
}

template <class Runtime>
double backend<Runtime>::memory_fraction(int device) const
{
  device_state const* d = state_if_created(device);
  return d == nullptr ? 1.0 : d->fraction;
}

template <class Runtime>
std::size_t backend<Runtime>::empty_cache()
{
  std::size_t released = 0;
  for (auto const& slot : devices_) {
    if (device_state* d = slot.load(std::memory_order_acquire)) { released += d->alloc->release(); }
  }
  return released;
}

template <class Runtime>
std::size_t backend<Runtime>::largest_free_block(int device) const
{
  device_state const* d = state_if_created(device);
  if (d == nullptr) { return 0; }
  std::size_t largest = 0;
  for (auto const& g : d->alloc->snapshot().segments) {
    for (auto const& b : g.blocks) {
      if (!b.allocated) { largest = std::max(largest, b.size); }
    }
  }
  return largest;
}

template <class Runtime>
std::pair<void*, std::size_t> backend<Runtime>::base_allocation(void const* ptr) const
{
  auto const x = state(device_of(ptr)).alloc->extent(ptr);
  return {x.segment_base, x.segment_bytes};
}

// ---------------------------------------------------------------------------------------------
// Interprocess sharing

template <class Runtime>
std::pair<std::string, std::size_t> backend<Runtime>::share_ipc_handle(void* ptr)
{
  gpukit::ipc_block_handle const h = gpukit::export_block(*state(device_of(ptr)).alloc, ptr);
  GPUKIT_EXPECTS(h.type == gpukit::ipc_block_handle::kind::cuda_ipc,
                 "gpukit_torch: shareIpcHandle: blocks of growable segments cannot be shared "
                 "through PyTorch's handles; set GPUKIT_ALLOC_CONF=segments:synchronous");
  std::string s{
    "\x02"
    "c"};
  s.append(reinterpret_cast<char const*>(&h.memory), sizeof h.memory);
  return {s, h.offset};
}

template <class Runtime>
std::shared_ptr<void> backend<Runtime>::open_ipc_handle(std::string const& handle)
{
  static std::mutex mutex;
  static auto* opened = new std::map<std::string, std::weak_ptr<void>>{};
  gpukit::ipc_block_handle h;
  std::size_t const n = sizeof h.memory;
  if (handle.size() == n + 2 && handle[0] == '\x02' && handle[1] == 'c') {
    std::memcpy(&h.memory, handle.data() + 2, n);
  } else if (handle.size() == n) {  // PyTorch's unversioned handle
    std::memcpy(&h.memory, handle.data(), n);
  } else {
    GPUKIT_EXPECTS(false, "gpukit_torch: getIpcDevPtr: not a CUDA IPC handle gpukit can open (" +
                            std::to_string(handle.size()) +
                            " bytes; expandable segments' "
                            "handles are not supported)");
  }
  std::lock_guard<std::mutex> lock{mutex};
  if (auto p = (*opened)[handle].lock()) { return p; }
  h.bytes     = 1;  // unknown: the segment's start is what PyTorch asks for
  auto holder = std::make_shared<gpukit::imported_block<Runtime>>(runtime_, h, -1);
  std::shared_ptr<void> p{holder, holder->data()};
  (*opened)[handle] = p;
  return p;
}

// ---------------------------------------------------------------------------------------------
// History and snapshots

template <class Runtime>
std::shared_ptr<void> backend<Runtime>::capture_context(record_when at_least) const
{
  if (!history_on_.load(std::memory_order_relaxed) ||
      history_when_.load(std::memory_order_relaxed) < static_cast<int>(at_least)) {
    return nullptr;
  }
  context_recorder r;
  {
    std::lock_guard<std::mutex> lock{history_mutex_};
    r = recorder_;
  }
  return r ? r() : nullptr;
}

template <class Runtime>
void backend<Runtime>::trace(trace_entry e)
{
  std::vector<trace_observer> observers;
  {
    std::lock_guard<std::mutex> lock{history_mutex_};
    observers = trace_observers_;
    if (history_on_.load(std::memory_order_relaxed) && max_entries_ != 0) {
      if (trace_.size() >= max_entries_) { trace_.pop_front(); }
      trace_.push_back(e);
    }
  }
  for (auto const& o : observers) { o(e); }
}

template <class Runtime>
void backend<Runtime>::add_trace_observer(trace_observer observer)
{
  GPUKIT_EXPECTS(static_cast<bool>(observer), "gpukit_torch: empty trace observer");
  std::lock_guard<std::mutex> lock{history_mutex_};
  trace_observers_.push_back(std::move(observer));
  traced_.store(true, std::memory_order_relaxed);
}

template <class Runtime>
void backend<Runtime>::record_history(bool enabled, context_recorder recorder,
                                      std::size_t max_entries, record_when when, bool clear)
{
  std::lock_guard<std::mutex> lock{history_mutex_};
  if (clear) { trace_.clear(); }
  bool const was_on = history_on_.load(std::memory_order_relaxed);
  recorder_         = enabled ? std::move(recorder) : context_recorder{};
  max_entries_      = enabled ? max_entries : max_entries_;
  history_when_.store(enabled ? static_cast<int>(when) : 0, std::memory_order_relaxed);
  history_on_.store(enabled, std::memory_order_relaxed);
  traced_.store(enabled || !trace_observers_.empty(), std::memory_order_relaxed);
  while (trace_.size() > max_entries_) { trace_.pop_front(); }
  for (auto const& slot : devices_) {
    device_state* d = slot.load(std::memory_order_acquire);
    if (d == nullptr) { continue; }
    if (enabled && (!was_on || clear)) { d->alloc->start_recording(); }
    if (!enabled && was_on) { d->alloc->stop_recording(); }
  }
}

template <class Runtime>
segment_info backend<Runtime>::to_segment_info(int device,
                                               gpukit::memory_snapshot::segment const& g) const
{
  segment_info s;
  s.device        = device;
  s.address       = g.address;
  s.total_size    = g.size;
  s.stream        = g.stream;
  s.is_large      = !g.small;
  s.is_expandable = options_.source == gpukit::segment_source::growable;
  std::lock_guard<std::mutex> lock{records_mutex_};
  for (auto const& b : g.blocks) {
    block_info bi{b.address, b.size, b.requested, b.allocated, nullptr};
    if (b.allocated) {
      s.allocated_size += b.size;
      s.requested_size += b.requested;
      auto it = records_.find(reinterpret_cast<void const*>(b.address));
      if (it != records_.end()) {
        bi.context = it->second.context;
        if (it->second.pool != pool_id(0, 0)) { s.owner = it->second.pool; }
      }
    }
    s.blocks.push_back(std::move(bi));
  }
  return s;
}

template <class Runtime>
void backend<Runtime>::add_segment_events(int device, gpukit::memory_snapshot const& snap,
                                          std::vector<trace_entry>& out) const
{
  using namespace std::chrono;
  // gpukit stamps events with the steady clock: move them onto the Unix epoch.
  std::int64_t const shift =
    now_us() - duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
  for (auto const& e : snap.events) {
    trace_entry t;
    if (e.what == gpukit::memory_event::action::segment_alloc) {
      t.what = trace_entry::action::segment_alloc;
    } else if (e.what == gpukit::memory_event::action::segment_free) {
      t.what = trace_entry::action::segment_free;
    } else {
      continue;  // blocks and out-of-memory events are traced here, with their context
    }
    t.device  = device;
    t.address = e.address;
    t.bytes   = e.bytes;
    t.stream  = e.stream;
    t.time_us = static_cast<std::int64_t>(e.time_ns / 1000) + shift;
    out.push_back(std::move(t));
  }
}

template <class Runtime>
memory_state backend<Runtime>::snapshot(pool_id pool, bool include_traces) const
{
  memory_state m;
  for (int dev = 0; dev < max_devices; ++dev) {
    device_state const* d = state_if_created(dev);
    if (d == nullptr) { continue; }
    gpukit::memory_snapshot const snap = d->alloc->snapshot();
    for (auto const& g : snap.segments) {
      segment_info s = to_segment_info(dev, g);
      if (pool == pool_id(0, 0) || s.owner == pool) { m.segments.push_back(std::move(s)); }
    }
    if (m.traces.size() <= static_cast<std::size_t>(dev)) { m.traces.resize(dev + 1); }
    if (include_traces && history_on_.load(std::memory_order_relaxed)) {
      add_segment_events(dev, snap, m.traces[dev]);
    }
  }
  if (include_traces) {
    std::lock_guard<std::mutex> lock{history_mutex_};
    for (auto const& e : trace_) {
      if (m.traces.size() <= static_cast<std::size_t>(e.device)) { m.traces.resize(e.device + 1); }
      m.traces[e.device].push_back(e);
    }
  }
  for (auto& t : m.traces) {
    std::stable_sort(t.begin(), t.end(),
                     [](auto const& a, auto const& b) { return a.time_us < b.time_us; });
  }
  return m;
}

}  // namespace gpukit_torch
