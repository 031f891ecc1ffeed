// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/memory_summary_impl.hpp: the bodies of memory_summary.hpp. Not public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gpukit {

namespace detail {

inline constexpr int summary_width = 75;  // between the table's borders, as PyTorch's

/// One cell of 10 characters: `v` in the unit that suits `reference` (the row's first value), as
/// PyTorch chooses it: bytes up to 768 KiB, then KiB up to 768 MiB, and so on; counts in units, K
/// from 750,000, M from 750,000 K.
inline std::string summary_cell(std::int64_t v, std::int64_t reference, bool bytes)
{
  static char const* const size_units[]  = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  static char const* const count_units[] = {" ", "K", "M"};
  int const last                         = bytes ? 5 : 2;
  double const step                      = bytes ? 768.0 * 1024 : 750.0 * 1000;
  std::int64_t const factor              = bytes ? 1024 : 1000;
  double ref                             = static_cast<double>(reference);
  int unit                               = 0;
  while (unit < last && ref >= step) {
    ++unit;
    v /= factor;
    ref /= static_cast<double>(factor);
  }
  char buf[32];
  if (bytes) {
    std::snprintf(buf, sizeof buf, "%6lld %s", static_cast<long long>(v), size_units[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%7lld %s ", static_cast<long long>(v), count_units[unit]);
  }
  return buf;
}

/// `text` between the borders, padded to the table's width.
inline std::string summary_line(std::string text)
{
  if (text.size() < summary_width) { text.append(summary_width - text.size(), ' '); }
  return "|" + text + "|\n";
}

inline std::string summary_rule(char c) { return "|" + std::string(summary_width, c) + "|\n"; }

/// One row: a name and the four values; the totals shown as "-" when `totals` is false.
struct summary_values {
  std::int64_t current, peak, allocated, freed;
};

inline std::string summary_row(char const* name, summary_values const& v,
                               summary_values const& reference, bool bytes, bool totals)
{
  std::string const untracked = "      -   ";
  char head[32];
  std::snprintf(head, sizeof head, " %-21s | ", name);
  return summary_line(head + summary_cell(v.current, reference.current, bytes) + " | " +
                      summary_cell(v.peak, reference.peak, bytes) + " | " +
                      (totals ? summary_cell(v.allocated, reference.allocated, bytes) : untracked) +
                      " | " + (totals ? summary_cell(v.freed, reference.freed, bytes) : untracked) +
                      " ");
}

/// A size for gpukit's lines: in the largest unit it reaches, with one decimal when not whole.
inline std::string summary_size(std::int64_t bytes)
{
  static char const* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v                         = static_cast<double>(bytes);
  int unit                         = 0;
  while (unit < 5 && (v >= 1024.0 || v <= -1024.0)) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf,
                v == static_cast<double>(static_cast<std::int64_t>(v)) ? "%.0f %s" : "%.1f %s", v,
                units[unit]);
  return buf;
}

/// PyTorch's rows: the metrics, each for the whole allocator and per pool.
inline std::string summary_metrics(caching_allocator_stats const& s, bool abbreviated)
{
  // Member pointers through aliases: nvcc writes `T C::*m` back as `T (C::*m)`, which g++'s
  // -Wparentheses then warns about.
  using all_member  = stat_pair caching_allocator_stats::*;
  using pool_member = stat_totals caching_pool_stats::*;
  struct metric {
    char const* name;
    all_member all;
    pool_member pool;
    bool bytes;
    bool totals;
  };
  using a                       = caching_allocator_stats;
  using p                       = caching_pool_stats;
  static metric const metrics[] = {
    {"Allocated memory", &a::allocated_bytes, &p::allocated_bytes, true, true},
    {"Active memory", &a::active_bytes, &p::active_bytes, true, true},
    {"Requested memory", &a::requested_bytes, &p::requested_bytes, true, true},
    {"GPU reserved memory", &a::reserved_bytes, &p::reserved_bytes, true, true},
    {"Non-releasable memory", &a::inactive_split_bytes, &p::inactive_split_bytes, true, false},
    {"Allocations", &a::allocation_count, &p::allocation_count, false, true},
    {"Active allocs", &a::active_count, &p::active_count, false, true},
    {"GPU reserved segments", &a::segment_count, &p::segment_count, false, true},
    {"Non-releasable allocs", &a::inactive_split_count, &p::inactive_split_count, false, false},
  };
  auto values = [](stat_totals const& t) {
    return summary_values{t.current, t.peak, t.allocated, t.freed};
  };
  std::string out;
  for (metric const& m : metrics) {
    stat_totals const& large = s.large_pool.*m.pool;
    stat_totals const& small = s.small_pool.*m.pool;
    summary_values const all{(s.*m.all).current, (s.*m.all).peak, large.allocated + small.allocated,
                             large.freed + small.freed};
    out += summary_rule('-');
    out += summary_row(m.name, all, all, m.bytes, m.totals);
    if (!abbreviated) {
      out += summary_row("      from large pool", values(large), all, m.bytes, m.totals);
      out += summary_row("      from small pool", values(small), all, m.bytes, m.totals);
    }
  }
  for (char const* name : {"Oversize allocations", "Oversize GPU segments"}) {
    out += summary_rule('-');
    out += summary_row(name, summary_values{0, 0, 0, 0}, summary_values{0, 0, 0, 0}, false, true);
  }
  return out;
}

/// gpukit's lines: the segment source (when known), device calls, thread caches, the ladder.
inline std::string summary_gpukit(caching_allocator_stats const& s, char const* source)
{
  auto u          = [](std::uint64_t v) { return std::to_string(v); };
  std::string out = "gpukit: segments: ";
  out += source != nullptr ? source : "(see the allocator)";
  out += "; device allocs " + u(s.num_device_allocs) + ", frees " + u(s.num_device_frees) +
         "; synchronizing frees " + u(s.synchronizing_frees) + "\n";
  out += "gpukit: thread caches: " + summary_size(s.cached_bytes) + " cached; " +
         u(s.num_cache_hits) + " of " + u(s.num_allocs) + " allocations served from them\n";
  out += "gpukit: OOM recoveries: " + u(s.num_alloc_retries) + " allocations needed recovery, " +
         u(s.num_ooms) + " failed; " + u(s.num_release_waits) + " release waits; " +
         u(s.num_cross_stream_events) + " cross-stream events; " + u(s.num_dead_streams) +
         " dead streams\n";
  for (std::size_t i = 0; i < static_cast<std::size_t>(recovery_step_count); ++i) {
    out += "gpukit:   step " + std::to_string(i + 1) + ", " + recovery_step_names[i] + ": ran " +
           u(s.num_recovery_steps[i]) + ", made " +
           summary_size(static_cast<std::int64_t>(s.recovery_bytes[i])) + " available\n";
  }
  return out;
}

inline std::string summary_text(caching_allocator_stats const& s, int device, bool abbreviated,
                                char const* source)
{
  char buf[96];
  std::string out = summary_rule('=');
  std::string title =
    "gpukit caching allocator memory summary, device ID " + std::to_string(device);
  std::size_t const left = title.size() < summary_width ? (summary_width - title.size()) / 2 : 0;
  out += summary_line(std::string(left, ' ') + title);
  out += summary_rule('-');
  std::snprintf(buf, sizeof buf, "%11sCUDA OOMs: %-12llu |%8scudaMalloc retries: %-8llu", "",
                static_cast<unsigned long long>(s.num_ooms), "",
                static_cast<unsigned long long>(s.num_alloc_retries));
  out += summary_line(buf);
  out += summary_rule('=');
  out +=
    summary_line("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  out += summary_metrics(s, abbreviated);
  out += summary_rule('=');
  out += summary_gpukit(s, source);
  return out;
}

}  // namespace detail

inline std::string memory_summary(caching_allocator_stats const& stats, int device,
                                  bool abbreviated)
{
  return detail::summary_text(stats, device, abbreviated, nullptr);
}

template <class Runtime>
std::string memory_summary(basic_caching_allocator<Runtime> const& allocator, bool abbreviated)
{
  return detail::summary_text(allocator.stats(), allocator.device(), abbreviated,
                              to_string(allocator.segment_source_in_use()));
}

}  // namespace gpukit
