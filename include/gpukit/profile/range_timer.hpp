// SPDX-License-Identifier: Apache-2.0
// gpukit/profile/range_timer.hpp: GPU time per named range, without Nsight, cheap enough to leave
// on.
//
// Quick start:
//
//   #include <gpukit/profile/range_timer.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   #include <iostream>
//   #include <string>
//
//   void train(int steps, cudaStream_t stream)
//   {
//     gpukit::gpu_timer timer;                      // range_timer<cuda_runtime>
//     for (int step = 0; step < steps; ++step) {
//       auto t = timer.time("step", stream);        // timing event recorded on `stream` now ...
//       {
//         auto f = timer.time("forward", stream);   // ranges nest
//         // forward<<<grid, block, 0, stream>>>();
//       }                                           // ... and at the end of each scope
//       auto b = timer.time("backward", stream);
//       // backward<<<grid, block, 0, stream>>>();
//     }
//     timer.flush();                                // waits for the last ranges' events
//     std::cout << timer.report();                  // like torch.profiler's key_averages()
//     std::string json = timer.report_json();
//
//     // The same on the simulated GPU (its events carry timestamps):
//     gpukit::sim_runtime sim;
//     gpukit::range_timer<gpukit::sim_runtime> sim_timer{sim};
//   }
//
// How it works: `time(name, stream)` records a timing event on the stream (from a pool: events are
// created once and reused) and, unless disabled, pushes an NVTX range of the same name in the
// gpukit domain; the scope's end records a second event and pops the range. Nothing waits for the
// GPU: completed ranges are harvested with event queries (never blocking) at each range end and in
// `poll()`, and their elapsed GPU time is aggregated by name: count, total, min, max, mean, p50
// and p90 (over the last `samples_per_range` ranges) and share of the step. `flush()` waits for
// what is still pending; `stats()` and the reports show what has been harvested.
//
// GPU time of a range = time between its two events on its stream: the work queued on that stream
// inside the range (and any wait it had to do for other streams), not host time.
//
// Thread-safe: any thread may time ranges on any stream; one mutex guards the timer's tables (held
// for a few hundred nanoseconds, never across a runtime call that blocks). Names are interned by
// pointer, then by content: after the first use a name costs no allocation.
#pragma once

#include <gpukit/detail/json.hpp>
#include <gpukit/detail/spare_events.hpp>
#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/profile/nvtx.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpukit {

/// Settings of a range_timer.
struct range_timer_options {
  /// Ranges whose events may be in flight at once; beyond that a new range is not timed (counted
  /// in `dropped()`) rather than making the host wait.
  std::size_t max_pending{std::size_t{1} << 14};
  /// Durations kept per name for the percentiles (the latest ones).
  std::size_t samples_per_range{1024};
  /// Also push an NVTX range (gpukit domain, colored by name) for each timed range.
  bool emit_nvtx{true};
  /// The range whose total is 100% in `share`; empty: the sum of the outermost ranges' totals.
  std::string step_range{};
};

/// GPU time of every harvested range of one name.
struct range_stats {
  std::string name;
  std::uint64_t count{0};
  double total_ms{0.0};
  double min_ms{0.0};
  double max_ms{0.0};
  double mean_ms{0.0};
  double p50_ms{0.0};  ///< over the latest `samples_per_range` ranges
  double p90_ms{0.0};  ///< over the latest `samples_per_range` ranges
  double share{0.0};   ///< total_ms / the step's total (see range_timer_options::step_range)
  int depth{0};        ///< the shallowest nesting depth it was seen at (0: outermost)
};

/// Times named ranges on streams with the runtime's timing events and aggregates GPU time by name.
/// See the top of this header. Non-copyable, non-movable.
template <class Runtime>
class range_timer {
 public:
  using stream_type = typename Runtime::stream_type;
  using event_type  = typename Runtime::event_type;

  /// A timed range: started by `range_timer::time`, ended when destroyed (on the thread that
  /// destroys it). Non-copyable, non-movable: keep it in a local variable.
  class [[nodiscard]] scope {
   public:
    ~scope() { timer_.end_range(*this); }
    // Neither copyable nor movable (deleted copies leave no implicit moves).
    scope(scope const&)            = delete;
    scope& operator=(scope const&) = delete;

   private:
    friend class range_timer;
    scope(range_timer& t, char const* name, stream_type s) : timer_{t}
    {
      t.begin_range(*this, name, s);
    }
    range_timer& timer_;
    std::uint32_t name_{0};
    event_type start_{};
    stream_type stream_{};
    int depth_{0};
    bool timed_{false};
    bool nvtx_{false};
  };

  /// A timer over `rt` (e.g. `cuda_runtime::instance()`). Creates no event until the first range.
  explicit range_timer(Runtime& rt, range_timer_options options = {})
      : rt_{rt}, options_{std::move(options)}
  {}
  /// A timer over `Runtime::instance()`.
  range_timer() : range_timer{Runtime::instance()} {}

  /// Waits for the pending ranges (as `flush`, errors ignored), then destroys every event.
  ~range_timer()
  {
    try {
      flush();
    } catch (...) {}
    detail::pool_lock lock{mutex_};
    for (auto& p : pending_) {
      (void)rt_.event_destroy(p.start);
      (void)rt_.event_destroy(p.stop);
    }
    for (auto e : free_events_) (void)rt_.event_destroy(e);
  }
  // Neither copyable nor movable (deleted copies leave no implicit moves).
  range_timer(range_timer const&)            = delete;
  range_timer& operator=(range_timer const&) = delete;

  /// Starts a range named `name` on stream `s`: records a timing event on `s` now and another when
  /// the returned scope is destroyed. `name` must stay valid until the call returns. Never blocks
  /// the host on the GPU. Throws gpukit::cuda_error when an event cannot be created or recorded.
  [[nodiscard]] scope time(char const* name, stream_type s) { return scope{*this, name, s}; }

  /// Harvests the ranges whose events have completed (event queries only: never blocks).
  /// Returns how many were harvested. Throws gpukit::cuda_error when a query fails.
  std::size_t poll() { return harvest(false); }

  /// Waits for every range ended so far to complete on the GPU, and harvests it. Blocks.
  void flush() { harvest(true); }

  /// Ranges ended but not yet harvested.
  [[nodiscard]] std::size_t pending() const
  {
    detail::pool_lock lock{mutex_};
    return pending_.size();
  }
  /// Ranges not timed because `max_pending` were in flight (or an event failed).
  [[nodiscard]] std::uint64_t dropped() const
  {
    detail::pool_lock lock{mutex_};
    return dropped_;
  }

  /// Statistics of every name harvested so far, largest total first (polls first).
  [[nodiscard]] std::vector<range_stats> stats()
  {
    poll();
    detail::pool_lock lock{mutex_};
    return summarize();
  }
  /// Statistics of one name (polls first); empty when no range of that name was harvested.
  [[nodiscard]] std::optional<range_stats> stats(std::string_view name)
  {
    for (auto& s : stats()) {
      if (s.name == name) return s;
    }
    return std::nullopt;
  }

  /// A table of `stats()`, like torch.profiler's key_averages(): name (indented by depth),
  /// calls, total, mean, p50, p90, min, max (milliseconds of GPU time) and share of the step.
  [[nodiscard]] std::string report()
  {
    auto const all = stats();
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "%-32s %8s %12s %10s %10s %10s %10s %10s %7s\n", "range",
                  "calls", "total ms", "mean ms", "p50 ms", "p90 ms", "min ms", "max ms", "share");
    out += line;
    out += std::string(32 + 8 + 12 + 10 * 5 + 7 + 8, '-') + "\n";
    for (auto const& s : all) {
      std::string name =
        std::string(static_cast<std::size_t>(std::min(s.depth, 8)) * 2, ' ') + s.name;
      if (name.size() > 32) name = name.substr(0, 29) + "...";
      std::snprintf(line, sizeof line,
                    "%-32s %8llu %12.3f %10.3f %10.3f %10.3f %10.3f %10.3f %6.1f%%\n", name.c_str(),
                    static_cast<unsigned long long>(s.count), s.total_ms, s.mean_ms, s.p50_ms,
                    s.p90_ms, s.min_ms, s.max_ms, s.share * 100.0);
      out += line;
    }
    detail::pool_lock lock{mutex_};
    std::snprintf(line, sizeof line, "pending %zu, dropped %llu\n", pending_.size(),
                  static_cast<unsigned long long>(dropped_));
    out += line;
    return out;
  }

  /// `stats()` as one JSON object: {"ranges":[{"name":..., "count":..., "total_ms":..., ...}],
  /// "pending":N, "dropped":N}.
  [[nodiscard]] std::string report_json()
  {
    auto const all  = stats();
    std::string out = "{\"ranges\":[";
    bool first      = true;
    for (auto const& s : all) {
      if (!first) out += ',';
      first = false;
      out += "{\"name\":" + detail::json_string(s.name) + ",\"count\":" + std::to_string(s.count) +
             ",\"total_ms\":" + detail::json_number(s.total_ms) +
             ",\"mean_ms\":" + detail::json_number(s.mean_ms) +
             ",\"p50_ms\":" + detail::json_number(s.p50_ms) +
             ",\"p90_ms\":" + detail::json_number(s.p90_ms) +
             ",\"min_ms\":" + detail::json_number(s.min_ms) +
             ",\"max_ms\":" + detail::json_number(s.max_ms) +
             ",\"share\":" + detail::json_number(s.share) +
             ",\"depth\":" + std::to_string(s.depth) + "}";
    }
    detail::pool_lock lock{mutex_};
    out += "],\"pending\":" + std::to_string(pending_.size()) +
           ",\"dropped\":" + std::to_string(dropped_) + "}";
    return out;
  }

  /// Forgets every harvested statistic (pending ranges are still harvested later).
  void reset()
  {
    detail::pool_lock lock{mutex_};
    for (auto& n : names_) n.clear_stats();
    dropped_ = 0;
  }

  /// The runtime the timer records events with.
  [[nodiscard]] Runtime& runtime() const noexcept { return rt_; }

 private:
  static_assert(
    runtime_has_core_v<Runtime>,
    "range_timer needs a Runtime with the core operations (gpukit/runtime/contract.hpp)");

  struct name_entry {
    std::string name;
    std::uint32_t color{0};
    std::uint64_t count{0};
    double total{0.0};
    double min{std::numeric_limits<double>::infinity()};
    double max{0.0};
    int depth{std::numeric_limits<int>::max()};
    std::vector<float> samples;  // ring of the latest durations
    std::size_t next_sample{0};
    void clear_stats()
    {
      count = 0, total = 0.0, min = std::numeric_limits<double>::infinity(), max = 0.0;
      depth = std::numeric_limits<int>::max();
      samples.clear();
      next_sample = 0;
    }
  };
  struct pending_range {
    std::uint32_t name;
    int depth;
    event_type start;
    event_type stop;
  };

  static int& depth() noexcept
  {
    static thread_local int d = 0;
    return d;
  }

#ifndef GPUKIT_DISABLE_NVTX
  static color color_of(std::uint32_t c) noexcept
  {
    return color{argb{0xFF, static_cast<std::uint8_t>(c >> 16), static_cast<std::uint8_t>(c >> 8),
                      static_cast<std::uint8_t>(c)}};
  }
#endif

  // Records the start event and pushes the NVTX range; on failure leaves nothing behind.
  void begin_range(scope& sc, char const* name, stream_type s) GPUKIT_EXCLUDES(mutex_)
  {
    sc.stream_          = s;
    std::uint32_t color = 0;
    {
      detail::pool_lock lock{mutex_};
      sc.name_ = intern(name);
      color    = names_[sc.name_].color;
      if (pending_.size() + in_flight_ < options_.max_pending) {
        sc.start_ = take_event();
        sc.timed_ = true;
        ++in_flight_;
      } else {
        ++dropped_;
      }
    }
    if (sc.timed_) {
      typename Runtime::error_type const e = rt_.event_record(sc.start_, s);
      if (e != Runtime::success) {
        detail::pool_lock lock{mutex_};
        drop_range(sc);
        GPUKIT_CUDA_TRY(e, "event_record(start of the range, stream)");
      }
    }
    sc.depth_ = depth()++;
#ifndef GPUKIT_DISABLE_NVTX
    if (options_.emit_nvtx) {
      nvtxDomainRangePushEx(nvtx3::v1::domain::get<nvtx_domain>(),
                            event_attributes{message{name}, color_of(color)}.get());
      sc.nvtx_ = true;
    }
#else
    (void)color;
#endif
  }

  // The id of `name`: found by its pointer, else by its text, else added.
  std::uint32_t intern(char const* name) GPUKIT_REQUIRES(mutex_)
  {
    auto const by_ptr = by_pointer_.find(name);
    if (by_ptr != by_pointer_.end() && names_[by_ptr->second].name == name) return by_ptr->second;
    std::string_view const key{name};
    auto const by_text = by_content_.find(std::string{key});
    std::uint32_t id   = 0;
    if (by_text != by_content_.end()) {
      id = by_text->second;
    } else {
      id = static_cast<std::uint32_t>(names_.size());
      name_entry e;
      e.name  = std::string{key};
      e.color = name_color(key);
      names_.push_back(std::move(e));
      by_content_.emplace(std::string{key}, id);
    }
    by_pointer_[name] = id;
    return id;
  }

  event_type take_event() GPUKIT_REQUIRES(mutex_)
  {
    return detail::take_spare_event(rt_, free_events_, true);
  }

  void end_range(scope& sc) noexcept GPUKIT_EXCLUDES(mutex_)
  {
#ifndef GPUKIT_DISABLE_NVTX
    if (sc.nvtx_) nvtxDomainRangePop(nvtx3::v1::domain::get<nvtx_domain>());
#endif
    --depth();
    if (!sc.timed_) return;
    event_type stop{};
    try {
      {
        detail::pool_lock lock{mutex_};
        stop = take_event();
      }
      if (rt_.event_record(stop, sc.stream_) != Runtime::success) {
        detail::pool_lock lock{mutex_};
        free_events_.push_back(stop);
        drop_range(sc);
        return;
      }
      detail::pool_lock lock{mutex_};
      pending_.push_back(pending_range{sc.name_, sc.depth_, sc.start_, stop});
      --in_flight_;
    } catch (...) {
      // A destructor never throws: the range is lost (counted as dropped).
      detail::pool_lock lock{mutex_};
      drop_range(sc);
      return;
    }
    try {
      harvest(false);
    } catch (...) {  // reported by the next poll() or flush()
    }
  }

  // The scope's start event goes back to the pool, the range is dropped.
  void drop_range(scope& sc) GPUKIT_REQUIRES(mutex_)
  {
    free_events_.push_back(sc.start_);
    --in_flight_;
    ++dropped_;
    sc.timed_ = false;
  }

  // Harvests completed ranges; with `wait`, waits for every pending one first (outside the lock).
  std::size_t harvest(bool wait) GPUKIT_EXCLUDES(mutex_)
  {
    if (wait) {
      std::vector<event_type> stops;
      {
        detail::pool_lock lock{mutex_};
        for (auto const& p : pending_) stops.push_back(p.stop);
      }
      for (auto e : stops) GPUKIT_CUDA_TRY(rt_.event_synchronize(e));
    }
    detail::pool_lock lock{mutex_};
    std::size_t harvested  = 0;
    std::size_t const scan = wait ? pending_.size() : std::min<std::size_t>(pending_.size(), 32);
    std::size_t kept       = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      pending_range const p = pending_[i];
      bool done             = false;
      if (i < scan) {
        typename Runtime::error_type const q = rt_.event_query(p.stop);
        if (q == Runtime::success) {
          float ms                             = 0.0f;
          typename Runtime::error_type const t = rt_.event_elapsed_time(ms, p.start, p.stop);
          if (t == Runtime::success) {
            record(p, ms);
            ++harvested;
            done = true;
          } else if (t != Runtime::not_ready) {
            ++dropped_;
            done = true;
          }
        } else if (q != Runtime::not_ready) {
          ++dropped_;
          done = true;
        }
      }
      if (done) {
        free_events_.push_back(p.start);
        free_events_.push_back(p.stop);
      } else {
        pending_[kept++] = p;
      }
    }
    pending_.resize(kept);
    return harvested;
  }

  void record(pending_range const& p, float ms) GPUKIT_REQUIRES(mutex_)
  {
    name_entry& n = names_[p.name];
    ++n.count;
    n.total += ms;
    n.min   = std::min<double>(n.min, ms);
    n.max   = std::max<double>(n.max, ms);
    n.depth = std::min(n.depth, p.depth);
    if (options_.samples_per_range == 0) return;
    if (n.samples.size() < options_.samples_per_range) {
      n.samples.push_back(ms);
    } else {
      n.samples[n.next_sample] = ms;
      n.next_sample            = (n.next_sample + 1) % options_.samples_per_range;
    }
  }

  // The statistics of every name harvested, largest total first.
  std::vector<range_stats> summarize() const GPUKIT_REQUIRES(mutex_)
  {
    std::vector<range_stats> out;
    double outer_total = 0.0;
    double step_total  = -1.0;
    for (auto const& n : names_) {
      if (n.count == 0) continue;
      range_stats s;
      s.name                    = n.name;
      s.count                   = n.count;
      s.total_ms                = n.total;
      s.min_ms                  = n.min;
      s.max_ms                  = n.max;
      s.mean_ms                 = n.total / static_cast<double>(n.count);
      s.depth                   = n.depth;
      std::vector<float> sorted = n.samples;
      std::sort(sorted.begin(), sorted.end());
      if (!sorted.empty()) {
        auto at = [&](double q) {
          return static_cast<double>(
            sorted[static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5)]);
        };
        s.p50_ms = at(0.5);
        s.p90_ms = at(0.9);
      }
      if (n.depth == 0) outer_total += n.total;
      if (!options_.step_range.empty() && n.name == options_.step_range) step_total = n.total;
      out.push_back(std::move(s));
    }
    double const base = step_total >= 0.0 ? step_total : outer_total;
    for (auto& s : out) s.share = base > 0.0 ? s.total_ms / base : 0.0;
    std::sort(out.begin(), out.end(), [](range_stats const& a, range_stats const& b) {
      return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
    });
    return out;
  }

  Runtime& rt_;
  range_timer_options const options_;
  // The timer's tables, guarded by mutex_ (clang's -Wthread-safety checks it).
  mutable detail::annotated_mutex mutex_;
  std::vector<name_entry> names_ GPUKIT_GUARDED_BY(mutex_);
  std::unordered_map<char const*, std::uint32_t> by_pointer_ GPUKIT_GUARDED_BY(mutex_);
  std::unordered_map<std::string, std::uint32_t> by_content_ GPUKIT_GUARDED_BY(mutex_);
  std::vector<event_type> free_events_ GPUKIT_GUARDED_BY(mutex_);
  std::vector<pending_range> pending_ GPUKIT_GUARDED_BY(mutex_);
  std::size_t in_flight_ GPUKIT_GUARDED_BY(mutex_){0};  // ranges begun, not yet ended
  std::uint64_t dropped_ GPUKIT_GUARDED_BY(mutex_){0};
};

/// GPU time per range on the real GPU: `range_timer<cuda_runtime>`.
using gpu_timer = range_timer<cuda_runtime>;

}  // namespace gpukit
