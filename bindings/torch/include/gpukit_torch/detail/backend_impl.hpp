// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/detail/backend_impl.hpp: the bodies of backend.hpp. Not public API.
#pragma once

#include "pidfd.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>

namespace gpukit_torch {

template <class Runtime>
struct backend<Runtime>::device_state {
  std::unique_ptr<allocator_type> alloc;
  double fraction{1.0};
  mutable std::mutex base_mutex;
  gpukit::caching_allocator_stats base{};  // counters at the last reset of accumulated statistics
  std::unique_ptr<user_counts> users;
};

// PyTorch's counts of the blocks held by users (allocation, allocated_bytes, requested_bytes), by
// pool kind. Active blocks are these plus the allocator's pending frees, so only the active peaks
// (raised by allocations, the only events that add active blocks) and the active counts at the
// last reset of accumulated statistics (from which the frees since are derived) are kept.
//
// Batched, as Linux's percpu counters: each records shard keeps, under its records_lock, what the
// allocations recorded in it added and its unfolded delta (the blocks it holds less what it has
// folded into the shared current values). An allocation or free changes only its shard's delta
// (plain stores: the shard's lock is held anyway, and taken by every operation on the shard, so a
// delta per shard costs no lock, atomic or thread registry of its own, and outlives any thread,
// leaving nothing to fold at a thread's exit; the price: the bound counts 64 shards, not the
// threads, and per-thread deltas would need the caching allocator's thread-local registry);
// when the delta leaves [0, batch] (per pool kind: batch_bytes of rounded and of requested bytes,
// batch_count blocks) it is folded into current_ by fetch_add, leaving half a batch, and the peaks
// are raised to the values that makes. So:
// - one thread alone (the single-thread lock): every operation folds its whole delta with plain
//   loads and stores; every value and peak exact;
// - up to exact_stats_threads threads (a training step's main and autograd threads): every
//   operation folds its whole delta (fetch_add, and compare-exchange for the peaks), so the
//   values and peaks stay exact; batching starts when one more thread writes (note_writer);
// - current values read with no operation in flight are exact: current_ plus every shard's delta;
// - a peak is never above the true one (no delta is negative: current_ never exceeds the blocks
//   held) and at most record_shards x batch below it per pool kind (twice that for both);
// - a free while the allocator has frees pending on other streams is folded exactly, so that
//   active peaks (raised at folds with the pending frees then) keep the bound, but for a free
//   racing with the first one to go pending.
// Resets and readers take reset_mutex_ between themselves only; a reader racing with operations
// sees each counter at some instant and reports a peak no lower than the current value it
// reports; a peak reset racing with an allocation may miss it.
template <class Runtime>
class backend<Runtime>::user_counts {
 public:
  static constexpr std::int64_t batch_bytes = stats_batch_bytes;  // per shard and pool kind
  static constexpr std::int64_t batch_count = stats_batch_count;
  /// [statistic][kind]: statistic 0 blocks, 1 rounded bytes, 2 requested bytes; kind 0 small,
  /// 1 large.
  using by_kind = std::array<std::array<std::int64_t, 2>, 3>;

  /// Counts an allocation of `kind` whose record goes to `shard`, under that shard's
  /// records_lock; `single`: the lock is the single-thread one; `batch`: deltas are batched
  /// (else every operation folds its whole delta).
  void count_alloc(std::size_t kind, std::size_t size, std::size_t bytes, allocator_type const& a,
                   std::size_t shard, bool single, bool batch) noexcept
  {
    std::array<std::int64_t, 3> const n = {1, static_cast<std::int64_t>(size),
                                           static_cast<std::int64_t>(bytes)};
    shard_counts& sc                    = shards_[shard];
    for (std::size_t s = 0; s < 3; ++s) {
      sc.added[s][kind] += n[s];
      sc.delta[s][kind] += n[s];
    }
    if (!single && batch && within(sc, kind)) { return; }
    fold(sc, kind, single || !batch ? zero : reserve, a, single);
  }

  /// Counts a free of `kind` whose record was in `shard`, under that shard's records_lock;
  /// `single` and `batch` as for count_alloc.
  void count_free(std::size_t kind, std::size_t size, std::size_t bytes, allocator_type const& a,
                  std::size_t shard, bool single, bool batch) noexcept
  {
    std::array<std::int64_t, 3> const n = {1, static_cast<std::int64_t>(size),
                                           static_cast<std::int64_t>(bytes)};
    shard_counts& sc                    = shards_[shard];
    if (single) {
      // One thread alone folds every change at once, so the delta is zero here, and a free only
      // lowers the counts: no peak can rise (active ones neither: the block goes from allocated
      // to pending or free).
      for (std::size_t s = 0; s < 3; ++s) {
        add(current_[s][2], -n[s], true);
        add(current_[s][kind], -n[s], true);
      }
      return;
    }
    std::array<std::int64_t, 3> const before{sc.delta[0][kind], sc.delta[1][kind],
                                             sc.delta[2][kind]};
    for (std::size_t s = 0; s < 3; ++s) { sc.delta[s][kind] -= n[s]; }
    if (!batch) {
      fold(sc, kind, zero, a, false);
    } else if (pending_any(a)) {  // exact: the delta stays what it was
      fold(sc, kind, before, a, false);
    } else if (!within(sc, kind)) {
      fold(sc, kind, reserve, a, false);
    }
  }

  /// Adds shard `shard`'s counts to `sums`, under that shard's records_lock.
  void add_shard(std::size_t shard, shard_sums& sums) const noexcept
  {
    shard_counts const& sc = shards_[shard];
    for (std::size_t s = 0; s < 3; ++s) {
      for (std::size_t k = 0; k < 2; ++k) {
        sums.added[s][k] += sc.added[s][k];
        sums.unfolded[s][k] += sc.delta[s][k];
      }
    }
  }

  /// Fills allocation, allocated_bytes, requested_bytes, active and active_bytes of `to` (small,
  /// large, both). `sums`: the shards' counts, summed.
  void read(allocator_type const& a, shard_sums const& sums,
            std::array<device_pool_stats*, 3> const& to) const
  {
    std::lock_guard<std::mutex> lock{reset_mutex_};
    auto const pending = pending_of(a);
    for (std::size_t s = 0; s < 3; ++s) {
      auto const cur   = current(s, sums);
      auto const added = both_kinds(sums.added[s]);
      for (std::size_t i = 0; i < 3; ++i) {
        std::int64_t const allocated = added[i] - added_base_[s][i];
        stat const held{cur[i], std::max(peak_[s][i].load(std::memory_order_relaxed), cur[i]),
                        allocated, allocated - (cur[i] - current_base_[s][i])};
        device_pool_stats& o                                                     = *to[i];
        (s == 0 ? o.allocation : s == 1 ? o.allocated_bytes : o.requested_bytes) = held;
        if (s == 2) { continue; }
        std::int64_t const active = cur[i] + (s == 0 ? pending[i].blocks : pending[i].bytes);
        stat const act{
          active, std::max({active_peak_[s][i].load(std::memory_order_relaxed), held.peak, active}),
          allocated, allocated - (active - active_base_[s][i])};
        (s == 0 ? o.active : o.active_bytes) = act;
      }
    }
  }

  /// Every peak to its current value (`sums`: the shards' counts, summed), under a records_lock
  /// (which keeps single-thread writers out).
  void reset_peaks(allocator_type const& a, shard_sums const& sums)
  {
    std::lock_guard<std::mutex> lock{reset_mutex_};
    auto const pending = pending_of(a);
    for (std::size_t s = 0; s < 3; ++s) {
      auto const cur = current(s, sums);
      for (std::size_t i = 0; i < 3; ++i) {
        peak_[s][i].store(cur[i], std::memory_order_relaxed);
        if (s < 2) {
          active_peak_[s][i].store(cur[i] + (s == 0 ? pending[i].blocks : pending[i].bytes),
                                   std::memory_order_relaxed);
        }
      }
      // A fold that raised a peak between the loads and the stores is not lost.
      auto const again = load(current_[s]);
      for (std::size_t i = 0; i < 3; ++i) { raise(peak_[s][i], again[i], false); }
    }
  }

  /// What was allocated and freed to zero; `sums` as for read().
  void reset_accumulated(allocator_type const& a, shard_sums const& sums)
  {
    std::lock_guard<std::mutex> lock{reset_mutex_};
    auto const pending = pending_of(a);
    for (std::size_t s = 0; s < 3; ++s) {
      current_base_[s] = current(s, sums);
      added_base_[s]   = both_kinds(sums.added[s]);
      if (s < 2) {
        for (std::size_t i = 0; i < 3; ++i) {
          active_base_[s][i] =
            current_base_[s][i] + (s == 0 ? pending[i].blocks : pending[i].bytes);
        }
      }
    }
  }

 private:
  using counter       = std::atomic<std::int64_t>;
  using pending_frees = typename allocator_type::pending_frees;

  // [statistic][kind] of one records shard, written under its records_lock: what allocations
  // added, and the delta not folded into current_ yet.
  struct alignas(64) shard_counts {
    by_kind added{};
    by_kind delta{};
  };
  static constexpr std::array<std::int64_t, 3> zero{0, 0, 0};
  static constexpr std::array<std::int64_t, 3> reserve{batch_count / 2, batch_bytes / 2,
                                                       batch_bytes / 2};

  /// Whether shard `sc`'s delta of `kind` stays unfolded: within [0, batch] in every statistic.
  static bool within(shard_counts const& sc, std::size_t kind) noexcept
  {
    auto in = [](std::int64_t d, std::int64_t batch) {
      return static_cast<std::uint64_t>(d) <= static_cast<std::uint64_t>(batch);  // 0 <= d <= b
    };
    return in(sc.delta[0][kind], batch_count) && in(sc.delta[1][kind], batch_bytes) &&
           in(sc.delta[2][kind], batch_bytes);
  }

  /// Folds shard `sc`'s delta of `kind` into current_ but for `keep` of it, and raises the peaks
  /// (and, while the allocator `a` has frees pending, the active peaks) to the values that makes.
  /// `single`: no other writer runs (plain loads and stores).
  void fold(shard_counts& sc, std::size_t kind, std::array<std::int64_t, 3> const& keep,
            allocator_type const& a, bool single) noexcept
  {
    std::array<std::int64_t, 3> now{}, both{};
    for (std::size_t s = 0; s < 3; ++s) {
      std::int64_t const d = sc.delta[s][kind] - keep[s];
      sc.delta[s][kind]    = keep[s];
      // A rise goes to the kind first, a fall to both first: both never exceeds the kinds' sum.
      if (d >= 0) {
        now[s]  = add(current_[s][kind], d, single);
        both[s] = add(current_[s][2], d, single);
      } else {
        both[s] = add(current_[s][2], d, single);
        now[s]  = add(current_[s][kind], d, single);
      }
      raise(peak_[s][kind], now[s], single);
      raise(peak_[s][2], both[s], single);
    }
    // While no free is pending, active equals allocated and its peaks are the allocated ones
    // (read() takes the larger).
    auto const mine = a.pending_frees_of(kind == 1), theirs = a.pending_frees_of(kind != 1);
    if (mine.blocks == 0 && theirs.blocks == 0) { return; }
    raise(active_peak_[0][kind], now[0] + mine.blocks, single);
    raise(active_peak_[1][kind], now[1] + mine.bytes, single);
    raise(active_peak_[0][2], both[0] + mine.blocks + theirs.blocks, single);
    raise(active_peak_[1][2], both[1] + mine.bytes + theirs.bytes, single);
  }

  // Under the single-thread lock no other writer runs: a plain load and store, with no
  // read-modify-write (the counters stay atomics for the readers, who take no such lock).
  static std::int64_t add(counter& c, std::int64_t n, bool single) noexcept
  {
    if (single) {
      std::int64_t const v = c.load(std::memory_order_relaxed) + n;
      c.store(v, std::memory_order_relaxed);
      return v;
    }
    return c.fetch_add(n, std::memory_order_relaxed) + n;
  }
  static void raise(counter& peak, std::int64_t v, bool single) noexcept
  {
    std::int64_t p = peak.load(std::memory_order_relaxed);
    if (single) {
      if (v > p) { peak.store(v, std::memory_order_relaxed); }
      return;
    }
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {}
  }
  static bool pending_any(allocator_type const& a) noexcept
  {
    return a.pending_frees_of(false).blocks != 0 || a.pending_frees_of(true).blocks != 0;
  }
  static std::array<std::int64_t, 3> both_kinds(std::array<std::int64_t, 2> const& c) noexcept
  {
    return {c[0], c[1], c[0] + c[1]};
  }
  // Small, large, and their sum (of the kinds: both's own counter serves the peaks only).
  static std::array<std::int64_t, 3> load(std::array<counter, 3> const& c) noexcept
  {
    std::int64_t const s = c[0].load(std::memory_order_relaxed);
    std::int64_t const l = c[1].load(std::memory_order_relaxed);
    return {s, l, s + l};
  }
  /// Statistic `s`'s current values: the folded ones plus the shards' deltas.
  std::array<std::int64_t, 3> current(std::size_t s, shard_sums const& sums) const noexcept
  {
    auto const folded     = load(current_[s]);
    std::int64_t const sm = folded[0] + sums.unfolded[s][0];
    std::int64_t const lg = folded[1] + sums.unfolded[s][1];
    return {sm, lg, sm + lg};
  }
  static std::array<pending_frees, 3> pending_of(allocator_type const& a) noexcept
  {
    auto const s = a.pending_frees_of(false), l = a.pending_frees_of(true);
    return {s, l, {s.bytes + l.bytes, s.blocks + l.blocks}};
  }

  // [statistic][kind]: statistic 0 blocks, 1 rounded bytes, 2 requested bytes; kind 0 small,
  // 1 large, 2 both. On cache lines of their own: the folded current values, written by folds;
  // the peaks, read and written by folds; each shard's counts (under its records_lock).
  alignas(64) std::array<std::array<counter, 3>, 3> current_{};
  alignas(64) std::array<std::array<counter, 3>, 3> peak_{};
  std::array<std::array<counter, 3>, 2> active_peak_{};  // blocks, bytes
  std::array<shard_counts, record_shards> shards_{};
  // At the last reset of accumulated statistics.
  alignas(64) mutable std::mutex reset_mutex_;
  std::array<std::array<std::int64_t, 3>, 3> current_base_{};  // under reset_mutex_
  std::array<std::array<std::int64_t, 3>, 3> added_base_{};    // under reset_mutex_
  std::array<std::array<std::int64_t, 3>, 2> active_base_{};   // under reset_mutex_
};

namespace detail {

/// The address `p` as error messages print it: "0x7f3a2c000000" (a null pointer is "0x0").
inline std::string address_text(void const* p)
{
  char buf[2 + 2 * sizeof(std::uintptr_t) + 1];
  std::snprintf(buf, sizeof(buf), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

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
backend<Runtime>::backend(Runtime& runtime, backend_conf const& conf)
    : runtime_{runtime}, options_{conf.options}, rounding_{conf.rounding}
{}

template <class Runtime>
void backend<Runtime>::set_warning_handler(warning_handler handler)
{
  std::lock_guard<std::mutex> lock{create_mutex_};
  warn_ = std::move(handler);
}

template <class Runtime>
void backend<Runtime>::warn(std::string const& message) const
{
  warning_handler h;
  {
    std::lock_guard<std::mutex> lock{create_mutex_};
    h = warn_;
  }
  if (h) {
    h(message);
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
  }
}

// The allocator options of `device`: the backend's, with growable segments replaced by
// synchronous ones where the device has no virtual memory management (`fallback` then says why).
template <class Runtime>
gpukit::caching_allocator_options backend<Runtime>::options_for(int device,
                                                                std::string& fallback) const
{
  gpukit::caching_allocator_options o = options_;
  if (o.source != gpukit::segment_source::growable) { return o; }
  gpukit::device_properties props;
  if (runtime_.get_device_properties(props, device) != Runtime::success ||
      props.virtual_memory_management) {
    return o;  // the allocator reports a failure to read the properties itself
  }
  o.source = gpukit::segment_source::synchronous;
  fallback = "gpukit: device " + std::to_string(device) + " (" + props.name +
             ") has no virtual memory management, so it cannot have growable segments (the "
             "backend's default): it uses synchronous (cudaMalloc) segments instead. Set "
             "segments:synchronous (GPUKIT_ALLOC_CONF, or gpukit_torch.install()'s settings) to "
             "choose them and silence this warning.";
  return o;
}

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
                 "device " + std::to_string(device) + " is out of range");
  std::unique_lock<std::mutex> lock{create_mutex_};
  if (device_state* d = devices_[device].load(std::memory_order_acquire)) { return *d; }
  std::string fallback;
  auto d      = std::make_unique<device_state>();
  d->alloc    = std::make_unique<allocator_type>(runtime_, device, options_for(device, fallback));
  d->users    = std::make_unique<user_counts>();
  d->fraction = options_.limit_fraction > 0.0 ? options_.limit_fraction : 1.0;
  if (history_on_.load(std::memory_order_relaxed)) { d->alloc->start_recording(); }
  devices_[device].store(d.get(), std::memory_order_release);
  device_state& out = *d.release();
  lock.unlock();
  if (!fallback.empty() && !warned_no_vmm_.exchange(true)) { warn(fallback); }
  return out;
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
std::size_t backend<Runtime>::shard_index(void const* ptr) noexcept
{
  // Blocks are at least 512-byte aligned: the bits above those, mixed (Fibonacci hashing).
  auto const x = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr) >> 9);
  return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> (64 - record_shard_bits));
}

// Holds what guards the records of one shard: the single-thread lock while one thread alone has
// allocated and freed, the shard's own lock after. A `writer` (an allocation or a free) on a
// thread other than the first ends the single-thread mode, for good: every write made under the
// single-thread lock happens before shared_ is seen set (release, acquire), and a thread that
// finds it clear only after taking that lock sees every write made under it.
template <class Runtime>
class backend<Runtime>::records_lock {
 public:
  records_lock(backend const& b, std::size_t shard, bool writer)
  {
    if (!b.shared_.load(std::memory_order_acquire)) {
      lock_ = std::unique_lock<std::mutex>{b.single_mutex_};
      if (!b.shared_.load(std::memory_order_relaxed)) {
        if (!writer) {
          single_ = true;
          return;
        }
        auto const me = std::this_thread::get_id();
        if (b.owner_ == std::thread::id{}) { b.owner_ = me; }
        if (b.owner_ == me) {
          single_ = true;
          return;
        }
        b.shared_.store(true, std::memory_order_release);
      }
      lock_.unlock();
    }
    lock_ = std::unique_lock<std::mutex>{b.records_[shard].mutex};
  }
  /// Whether this is the single-thread lock (no other writer runs).
  [[nodiscard]] bool single() const noexcept { return single_; }

 private:
  std::unique_lock<std::mutex> lock_;
  bool single_{false};
};

template <class Runtime>
bool backend<Runtime>::note_writer() noexcept
{
  // The backends this thread has written to, the last one first (one comparison on the hot path).
  struct noted {
    std::uint64_t last{0};
    std::vector<std::uint64_t> all;
  };
  thread_local noted mine;
  if (mine.last != uid_) {
    if (std::find(mine.all.begin(), mine.all.end(), uid_) == mine.all.end()) {
      try {
        mine.all.push_back(uid_);
      } catch (...) {  // out of host memory: counted again next time, which only batches sooner
      }
      writers_.fetch_add(1, std::memory_order_relaxed);
    }
    mine.last = uid_;
  }
  return writers_.load(std::memory_order_relaxed) > exact_stats_threads;
}

template <class Runtime>
void* backend<Runtime>::allocate(int device, std::size_t bytes, stream_type stream)
{
  if (bytes == 0) { return nullptr; }
  device_state& d = state(device);
  record r{device,        stream,
           bytes,         rounding_.round_size(bytes),
           pool_id{0, 0}, capture_context(record_when::state)};
  void* p = nullptr;
  try {
    if (routing_.load(std::memory_order_acquire) != 0) {
      detail::scoped_lock lock{pools_mutex_};
      r.pool = route(d, pools_of(device), stream);
      p      = d.alloc->allocate_async(r.size, stream);
    } else {
      p = d.alloc->allocate_async(r.size, stream);
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
  std::size_t const shard = shard_index(p);
  std::size_t const kind  = r.size > options_.small_request_bytes ? 1 : 0;
  std::size_t const size = r.size, asked = r.bytes;
  std::exception_ptr failed;
  {
    records_lock const lock{*this, shard, true};
    try {
      records_[shard].records.insert(p, std::move(r));
      d.users->count_alloc(kind, size, asked, *d.alloc, shard, lock.single(),
                           !lock.single() && note_writer());
    } catch (...) {  // no host memory for the record: nothing counted, and the block goes back
      failed = std::current_exception();
    }
  }
  if (failed) {
    d.alloc->deallocate_async(p, size, stream);
    std::rethrow_exception(failed);
  }
  return p;
}

template <class Runtime>
void backend<Runtime>::deallocate(void* ptr)
{
  if (ptr == nullptr) { return; }
  record r;
  device_state* d = nullptr;
  {
    std::size_t const shard = shard_index(ptr);
    records_lock const lock{*this, shard, true};
    auto& records       = records_[shard].records;
    record* const found = records.find(ptr);
    GPUKIT_EXPECTS(found != nullptr, "free of " + detail::address_text(ptr) +
                                       ", which gpukit did not allocate (or freed already)");
    r = std::move(*found);
    records.erase(ptr);
    d = state_if_created(r.device);  // created by the block's allocation
    d->users->count_free(r.size > options_.small_request_bytes ? 1 : 0, r.size, r.bytes, *d->alloc,
                         shard, lock.single(), !lock.single() && note_writer());
  }
  d->alloc->deallocate_async(ptr, r.size, r.stream);
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
  std::size_t const shard = shard_index(ptr);
  records_lock const lock{*this, shard, false};
  return records_[shard].records.find(ptr) != nullptr;
}

template <class Runtime>
int backend<Runtime>::device_of(void const* ptr) const
{
  std::size_t const shard = shard_index(ptr);
  records_lock const lock{*this, shard, false};
  record const* found = records_[shard].records.find(ptr);
  GPUKIT_EXPECTS(found != nullptr, detail::address_text(ptr) + " is not a block gpukit allocated");
  return found->device;
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
  GPUKIT_EXPECTS(static_cast<bool>(observer), "empty out-of-memory observer");
  std::lock_guard<std::mutex> lock{history_mutex_};
  oom_observers_.push_back(std::move(observer));
}

// ---------------------------------------------------------------------------------------------
// Private pools

template <class Runtime>
void backend<Runtime>::create_or_incref_pool(int device, pool_id id)
{
  GPUKIT_EXPECTS(id != pool_id(0, 0), "pool (0, 0) is the default pool");
  (void)state(device);
  detail::scoped_lock lock{pools_mutex_};
  ++pools_of(device).pools[id].use_count;
}

template <class Runtime>
void backend<Runtime>::begin_allocate_to_pool(int device, pool_id id, stream_filter filter)
{
  GPUKIT_EXPECTS(static_cast<bool>(filter), "beginAllocateToPool without a filter");
  create_or_incref_pool(device, id);
  device_state& d = state(device);
  detail::scoped_lock lock{pools_mutex_};
  device_pools& p = pools_of(device);
  for (auto const& u : p.underway) {
    if (u.first == id) {
      --p.pools[id].use_count;
      GPUKIT_EXPECTS(false,
                     "beginAllocateToPool: already allocating to pool " + detail::pool_name(id));
    }
  }
  p.underway.emplace_back(id, std::move(filter));
  // The capture begins after this call, on streams met at their first allocation: until then no
  // allocation or free may make a call that a capture refuses (an event query, a wait).
  d.alloc->begin_capture_window();
  recount_routing();
}

template <class Runtime>
void backend<Runtime>::end_allocate_to_pool(int device, pool_id id)
{
  device_state& d = state(device);
  detail::scoped_lock lock{pools_mutex_};
  device_pools& p = pools_of(device);
  auto it         = std::find_if(p.underway.begin(), p.underway.end(),
                                 [&](auto const& u) { return u.first == id; });
  GPUKIT_EXPECTS(it != p.underway.end(),
                 "endAllocateToPool: not allocating to pool " + detail::pool_name(id));
  p.underway.erase(it);
  for (std::size_t i = p.captures.size(); i-- > 0;) {
    if (p.captures[i].pool == id) { pause_capture(d, p, i); }
  }
  d.alloc->end_capture_window();
  recount_routing();
}

template <class Runtime>
void backend<Runtime>::release_pool(int device, pool_id id)
{
  device_state& d = state(device);
  detail::scoped_lock lock{pools_mutex_};
  device_pools& p = pools_of(device);
  auto it         = p.pools.find(id);
  GPUKIT_EXPECTS(it != p.pools.end() && it->second.use_count > 0,
                 "releasePool: no pool " + detail::pool_name(id));
  if (--it->second.use_count > 0) { return; }
  for (std::size_t i = p.captures.size(); i-- > 0;) {
    if (p.captures[i].pool == id) { pause_capture(d, p, i); }
  }
  for (auto cid : it->second.ended) { d.alloc->release_capture_pool(cid); }
  p.pools.erase(it);
  recount_routing();
}

template <class Runtime>
int backend<Runtime>::pool_use_count(int device, pool_id id) const
{
  (void)state(device);
  detail::scoped_lock lock{pools_mutex_};
  device_pools const& p = pools_of(device);
  auto it               = p.pools.find(id);
  return it == p.pools.end() ? 0 : it->second.use_count;
}

template <class Runtime>
bool backend<Runtime>::check_pool_live_allocations(int device, pool_id id,
                                                   std::unordered_set<void*> const& expected) const
{
  // Shard by shard: PyTorch asks while no allocation goes to the pool.
  std::size_t live = 0;
  for (std::size_t shard = 0; shard < record_shards; ++shard) {
    records_lock const lock{*this, shard, false};
    bool unexpected = false;
    records_[shard].records.for_each([&](void* p, record const& r) {
      if (r.device != device || r.pool != id) { return; }
      unexpected = unexpected || expected.count(p) == 0;
      ++live;
    });
    if (unexpected) { return false; }
  }
  return live == expected.size();
}

template <class Runtime>
std::vector<void*> backend<Runtime>::pool_live_blocks(int device, pool_id id) const
{
  std::vector<void*> live;
  for (std::size_t shard = 0; shard < record_shards; ++shard) {
    records_lock const lock{*this, shard, false};
    records_[shard].records.for_each([&](void* p, record const& r) {
      if (r.device == device && r.pool == id) { live.push_back(p); }
    });
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
                 "setCheckpointPoolState: " + std::to_string(missing.size()) +
                   " block(s) of the checkpoint of pool " + detail::pool_name(id) +
                   " were freed since, and gpukit cannot allocate a block at a chosen address");
  for (void* p : extra) { deallocate(p); }
  return extra;
}

// Which pool an allocation on `stream` goes to, with the allocator's capture on `stream` set to
// match: the most recent pool whose filter accepts the stream, or the default pool.
template <class Runtime>
pool_id backend<Runtime>::route(device_state& d, device_pools& p, stream_type stream)
{
  pool_id target{0, 0};
  for (auto it = p.underway.rbegin(); it != p.underway.rend(); ++it) {
    if (it->second(stream)) {
      target = it->first;
      break;
    }
  }
  for (std::size_t i = 0; i < p.captures.size(); ++i) {
    if (p.captures[i].stream == stream) {
      if (p.captures[i].pool == target) { return target; }
      pause_capture(d, p, i);
      break;
    }
  }
  if (target == pool_id(0, 0)) { return target; }
  pool_state& pool = p.pools[target];
  capture_on_stream c{stream, target, 0};
  if (!pool.ended.empty()) {
    c.id = pool.ended.back();
    d.alloc->resume_capture(stream, c.id);
    pool.ended.pop_back();
  } else {
    c.id = d.alloc->begin_capture(stream);
  }
  p.captures.push_back(c);
  recount_routing();
  return target;
}

template <class Runtime>
void backend<Runtime>::pause_capture(device_state& d, device_pools& p, std::size_t index)
{
  capture_on_stream const c = p.captures[index];
  d.alloc->end_capture(c.stream);
  p.pools[c.pool].ended.push_back(c.id);
  p.captures.erase(p.captures.begin() + static_cast<std::ptrdiff_t>(index));
}

template <class Runtime>
void backend<Runtime>::recount_routing()
{
  int n = 0;
  for (auto const& p : pools_) { n += static_cast<int>(p.underway.size() + p.captures.size()); }
  routing_.store(n, std::memory_order_release);
}

// ---------------------------------------------------------------------------------------------
// Statistics and limits

// What allocations on `d` added and the deltas not folded yet, by statistic and pool kind: the
// sums over the records shards, each read under its records_lock.
template <class Runtime>
typename backend<Runtime>::shard_sums backend<Runtime>::shard_totals(device_state const& d) const
{
  shard_sums sums;
  for (std::size_t shard = 0; shard < record_shards; ++shard) {
    records_lock const lock{*this, shard, false};
    d.users->add_shard(shard, sums);
  }
  return sums;
}

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
  // Blocks held by users, and active ones, with PyTorch's sizes (see user_counts).
  d->users->read(*d->alloc, shard_totals(*d), {&out.small_pool, &out.large_pool, &out});
  return out;
}

template <class Runtime>
void backend<Runtime>::reset_peak_stats(int device)
{
  device_state* d = state_if_created(device);
  if (d == nullptr) { return; }
  d->alloc->reset_peak();
  auto const sums = shard_totals(*d);  // each shard under its lock, before taking one below
  records_lock const lock{*this, 0, false};
  d->users->reset_peaks(*d->alloc, sums);
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
  d->users->reset_accumulated(*d->alloc, shard_totals(*d));
}

template <class Runtime>
void backend<Runtime>::set_memory_fraction(int device, double fraction)
{
  GPUKIT_EXPECTS(fraction >= 0.0 && fraction <= 1.0,
                 "memory fraction " + std::to_string(fraction) + " is not within [0, 1]");
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
  if (d != nullptr) { return d->fraction; }
  return options_.limit_fraction > 0.0 ? options_.limit_fraction : 1.0;
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
std::size_t backend<Runtime>::cache_info(int device, std::size_t largest) const
{
  if (largest == 0) {
    std::size_t free = 0, total = 0;
    gpukit::device_guard<Runtime> guard{runtime_, device};
    if (runtime_.mem_get_info(free, total) == Runtime::success) { largest = free; }
  }
  return std::max(largest, largest_free_block(device));
}

template <class Runtime>
std::pair<void*, std::size_t> backend<Runtime>::base_allocation(void const* ptr) const
{
  auto const x = state(device_of(ptr)).alloc->extent(ptr);
  return {x.segment_base, x.segment_bytes};
}

// ---------------------------------------------------------------------------------------------
// Interprocess sharing

namespace detail {

/// PyTorch's shareable handles: a version byte, then a type byte.
inline constexpr char handle_version            = 2;
inline constexpr char handle_cuda_malloc        = 'c';
inline constexpr char handle_expandable_segment = 'e';

/// What follows "\x02e" in PyTorch 2.5 to 2.11 (ExpandableSegment::share's ShareHeader): the
/// sender's process id, padding (zero, so that equal handles are equal strings), the page size and
/// the number of pages; then one int (a POSIX descriptor of the sender) per page.
struct expandable_share_header {
  std::int32_t pid;
  std::uint32_t padding;
  std::uint64_t page_bytes;
  std::uint64_t pages;
};
static_assert(sizeof(expandable_share_header) == 24, "PyTorch's ShareHeader is 24 bytes");
static_assert(sizeof(int) == 4 && sizeof(pid_t) == 4, "PyTorch's handle holds 4-byte ints");

/// Bytes of one CUmemFabricHandle, which PyTorch 2.11 sends per page instead of a descriptor where
/// IMEX fabric handles work.
inline constexpr std::size_t fabric_handle_bytes = 64;

/// "2.11" for 211.
inline std::string torch_version_name(int v)
{
  return std::to_string(v / 100) + "." + std::to_string(v % 100);
}

}  // namespace detail

template <class Runtime>
void backend<Runtime>::set_torch_version(int major, int minor) noexcept
{
  torch_version_.store(major * 100 + minor, std::memory_order_relaxed);
}

template <class Runtime>
std::string const& backend<Runtime>::sharing_refusal()
{
  std::lock_guard<std::mutex> lock{ipc_mutex_};
  if (!probed_) {
    auto const probe = detail::probe_pidfd_getfd();
    refusal_         = probe.message();
    probe_error_     = probe.error;
    probed_          = true;
  }
  return refusal_;
}

namespace detail {

/// Refuses PyTorch versions whose expandable-segment handles gpukit does not write or read.
inline void check_expandable_layout(int version, char const* call)
{
  GPUKIT_EXPECTS(version >= 205 && version <= 211,
                 std::string{call} + ": PyTorch " + torch_version_name(version) +
                   (version < 205 ? " has no expandable-segment handles (PyTorch 2.5 added them)"
                                  : "'s expandable-segment handles differ from those of PyTorch "
                                    "2.5 to 2.11, the layout gpukit writes and reads") +
                   ", so growable memory cannot be shared: set GPUKIT_ALLOC_CONF="
                   "segments:synchronous");
}

}  // namespace detail

template <class Runtime>
std::pair<std::string, std::size_t> backend<Runtime>::share_ipc_handle(void* ptr)
{
  allocator_type& alloc = *state(device_of(ptr)).alloc;
  if (!alloc.extent(ptr).growable) {
    gpukit::ipc_block_handle const h = gpukit::export_block(alloc, ptr);
    std::string s{detail::handle_version, detail::handle_cuda_malloc};
    s.append(reinterpret_cast<char const*>(&h.memory), sizeof h.memory);
    return {s, h.offset};
  }
  detail::check_expandable_layout(torch_version_.load(std::memory_order_relaxed), "shareIpcHandle");
  if (std::string const& why = sharing_refusal(); !why.empty()) {
    throw std::system_error{probe_error_, std::generic_category(), why};
  }
  auto const shared = alloc.share_pages(ptr);
  detail::expandable_share_header header{};  // zeroed padding
  header.pid        = static_cast<std::int32_t>(::getpid());
  header.page_bytes = shared.pages.front().bytes;
  header.pages      = shared.pages.size();
  std::string s{detail::handle_version, detail::handle_expandable_segment};
  s.append(reinterpret_cast<char const*>(&header), sizeof header);
  for (auto const& page : shared.pages) {
    std::int32_t const fd = page.fd;
    s.append(reinterpret_cast<char const*>(&fd), sizeof fd);
  }
  return {s, shared.offset};
}

namespace detail {

/// Takes the sender's descriptor of each page (the ints after `header` in `handle`) into `h.fds`.
inline void take_page_descriptors(gpukit::ipc_block_handle& h, std::string const& handle,
                                  expandable_share_header const& header)
{
  int const pidfd = open_process(header.pid);
  try {
    for (std::size_t i = 0; i < header.pages; ++i) {
      std::int32_t fd = 0;
      std::memcpy(&fd, handle.data() + 2 + sizeof header + i * sizeof fd, sizeof fd);
      h.fds.push_back(take_descriptor(header.pid, pidfd, fd));  // h closes them
    }
  } catch (...) {
    ::close(pidfd);
    throw;
  }
  ::close(pidfd);
}

/// The block an expandable-segment handle ("\x02e", a header, a descriptor per page) shares.
/// @throws gpukit::logic_error for a handle too short, of fabric handles, or without one
///         descriptor per page
inline gpukit::ipc_block_handle read_expandable_handle(std::string const& handle)
{
  expandable_share_header header{};
  GPUKIT_EXPECTS(handle.size() >= 2 + sizeof header,
                 "getIpcDevPtr: an expandable-segment handle of " + std::to_string(handle.size()) +
                   " bytes is shorter than its header");
  std::memcpy(&header, handle.data() + 2, sizeof header);
  std::size_t const rest = handle.size() - 2 - sizeof header;
  GPUKIT_EXPECTS(header.pages == 0 || header.pages > rest / fabric_handle_bytes ||
                   rest != header.pages * fabric_handle_bytes,
                 "getIpcDevPtr: the sender (process " + std::to_string(header.pid) + ") shared " +
                   std::to_string(header.pages) +
                   " pages as fabric handles (CUmemFabricHandle, IMEX), which gpukit does not "
                   "import; set TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0 or expandable_segments:False "
                   "in the sender");
  GPUKIT_EXPECTS(header.pages != 0 && header.pages <= rest / sizeof(int) &&
                   rest == header.pages * sizeof(int) && header.pid > 0,
                 "getIpcDevPtr: an expandable-segment handle of " + std::to_string(handle.size()) +
                   " bytes (process " + std::to_string(header.pid) + ", " +
                   std::to_string(header.pages) + " pages of " + std::to_string(header.page_bytes) +
                   " bytes) does not hold one descriptor per page");
  gpukit::ipc_block_handle h;
  h.type       = gpukit::ipc_block_handle::kind::shareable_pages;
  h.page_bytes = header.page_bytes;
  h.bytes      = header.pages * header.page_bytes;
  h.offset     = 0;
  take_page_descriptors(h, handle, header);
  return h;
}

/// The block a handle of PyTorch's formats shares: versioned (cudaMalloc or expandable segment,
/// the latter refused by check_expandable_layout for `torch_version`) or PyTorch's unversioned.
/// @throws gpukit::logic_error for a handle of none of these formats
inline gpukit::ipc_block_handle read_ipc_handle(std::string const& handle, int torch_version)
{
  gpukit::ipc_block_handle h;
  std::size_t const n = sizeof h.memory;
  bool const versioned =
    handle.size() >= 2 && handle[0] == handle_version &&
    (handle[1] == handle_cuda_malloc || handle[1] == handle_expandable_segment);
  if (versioned && handle[1] == handle_expandable_segment) {
    check_expandable_layout(torch_version, "getIpcDevPtr");
    return read_expandable_handle(handle);
  }
  if (versioned && handle.size() == n + 2) {
    std::memcpy(&h.memory, handle.data() + 2, n);
    h.bytes = 1;                    // unknown: the segment's start is what PyTorch asks for
  } else if (handle.size() == n) {  // PyTorch's unversioned handle
    std::memcpy(&h.memory, handle.data(), n);
    h.bytes = 1;
  } else {
    GPUKIT_EXPECTS(false, "getIpcDevPtr: not a handle of PyTorch's formats (" +
                            std::to_string(handle.size()) + " bytes, starting with byte " +
                            std::to_string(handle.empty() ? -1 : int{handle[0]}) + ")");
  }
  return h;
}

}  // namespace detail

template <class Runtime>
std::shared_ptr<void> backend<Runtime>::open_ipc_handle(std::string const& handle)
{
  std::lock_guard<std::mutex> lock{ipc_mutex_};
  if (auto it = opened_.find(handle); it != opened_.end()) {
    if (auto block = it->second.lock()) { return {block, block->data()}; }
  }
  gpukit::ipc_block_handle const h =
    detail::read_ipc_handle(handle, torch_version_.load(std::memory_order_relaxed));
  // Unmapped when the last tensor over it goes: after the device's work that may still use it
  // (CUDA does not wait for it in cuMemUnmap).
  std::shared_ptr<gpukit::imported_block<Runtime>> block{
    new gpukit::imported_block<Runtime>{runtime_, h, -1},
    [rt = &runtime_](gpukit::imported_block<Runtime>* b) {
      try {
        gpukit::device_guard<Runtime> guard{*rt, b->device()};
        (void)rt->device_synchronize();
      } catch (...) {  // the device could not be made current: unmapped all the same
      }
      delete b;
    }};
  for (int peer : allocator(block->device()).peers()) { block->grant_access(peer); }
  opened_[handle] = block;
  return {block, block->data()};
}

template <class Runtime>
void backend<Runtime>::grant_peer_access(int device, int peer)
{
  state(peer).alloc->grant_access(device);
  std::lock_guard<std::mutex> lock{ipc_mutex_};
  for (auto it = opened_.begin(); it != opened_.end();) {
    auto block = it->second.lock();
    if (!block) {
      it = opened_.erase(it);  // closed since
      continue;
    }
    if (block->device() == peer) { block->grant_access(device); }
    ++it;
  }
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
  GPUKIT_EXPECTS(static_cast<bool>(observer), "empty trace observer");
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
                                               gpukit::memory_snapshot::segment const& g,
                                               bool growable) const
{
  segment_info s;
  s.device        = device;
  s.address       = g.address;
  s.total_size    = g.size;
  s.stream        = g.stream;
  s.is_large      = !g.small;
  s.is_expandable = growable;
  for (auto const& b : g.blocks) {
    block_info bi{b.address, b.size, b.requested, b.allocated, nullptr};
    if (b.allocated) {
      auto const* p           = reinterpret_cast<void const*>(b.address);
      std::size_t const shard = shard_index(p);
      records_lock const lock{*this, shard, false};
      if (record const* r = records_[shard].records.find(p)) {
        bi.requested = r->bytes;  // the allocator was asked for the rounded size
        bi.context   = r->context;
        if (r->pool != pool_id(0, 0)) { s.owner = r->pool; }
      }
    }
    if (b.allocated) {
      s.allocated_size += bi.size;
      s.requested_size += bi.requested;
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
      segment_info s = to_segment_info(
        dev, g, d->alloc->segment_source_in_use() == gpukit::segment_source::growable);
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
