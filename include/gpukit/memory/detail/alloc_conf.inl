// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/alloc_conf.inl: the bodies of alloc_conf.hpp. Not public API.
#pragma once

#include <gpukit/memory/alloc_conf.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

namespace gpukit {

namespace detail {

inline std::string_view conf_trim(std::string_view s) noexcept
{
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) { s.remove_prefix(1); }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) { s.remove_suffix(1); }
  return s;
}

inline std::string conf_lower(std::string_view s)
{
  std::string o{s};
  for (char& c : o) { c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
  return o;
}

[[noreturn]] inline void conf_fail(std::string_view key, std::string_view value,
                                   std::string const& why)
{
  throw logic_error{"gpukit: alloc conf: bad value '" + std::string{value} + "' for '" +
                    std::string{key} + "': " + why};
}

inline bool conf_bool(std::string_view key, std::string_view value)
{
  std::string const v = conf_lower(value);
  if (v == "true" || v == "1" || v == "on" || v == "yes") { return true; }
  if (v == "false" || v == "0" || v == "off" || v == "no") { return false; }
  conf_fail(key, value, "expected true or false");
}

inline std::size_t conf_size(std::string_view key, std::string_view value)
{
  try {
    return parse_alloc_conf_size(value);
  } catch (logic_error const& e) {
    conf_fail(key, value, e.what());
  }
}

inline long long conf_count(std::string_view key, std::string_view value, long long max)
{
  std::string const v{value};
  char* end   = nullptr;
  errno       = 0;
  long long n = v.empty() ? -1 : std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || n < 0 || n > max) {
    conf_fail(key, value, "expected a whole number from 0 to " + std::to_string(max));
  }
  return n;
}

inline double conf_fraction(std::string_view key, std::string_view value)
{
  std::string const v{value};
  char* end = nullptr;
  errno     = 0;
  double f  = v.empty() ? -1.0 : std::strtod(v.c_str(), &end);
  if (v.empty() || errno != 0 || *end != '\0' || !std::isfinite(f) || f <= 0.0 || f > 1.0) {
    conf_fail(key, value, "expected a fraction in (0, 1]");
  }
  return f;
}

inline segment_source conf_source(std::string_view key, std::string_view value)
{
  std::string const v = conf_lower(value);
  for (segment_source s : {segment_source::automatic, segment_source::stream_ordered,
                           segment_source::synchronous, segment_source::growable}) {
    if (v == to_string(s)) { return s; }
  }
  conf_fail(key, value, "expected automatic, stream_ordered, synchronous or growable");
}

// Applies one key; false when the key is unknown. `setting` receives what the key sets, named by
// its canonical key: aliases (max_bytes for limit) and keys that set the same option another way
// (thread_cache:off and thread_cache_max_block_bytes; expandable_segments and segments) share it,
// so that a configuration cannot set one option twice with the later silently winning.
inline bool conf_apply(caching_allocator_options& o, std::string const& key, std::string_view value,
                       char const*& setting)
{
  // The member pointer's type named once: nvcc rewrites a `T C::*member;` declaration with
  // parentheses, which the host compiler's -Wparentheses reports.
  using size_member = std::size_t caching_allocator_options::*;
  struct size_key {
    char const* name;
    char const* setting;
    size_member member;
  };
  static constexpr size_key sizes[] = {
    {"limit", "limit", &caching_allocator_options::limit_bytes},
    {"max_bytes", "limit", &caching_allocator_options::limit_bytes},
    {"page_size", "page_size", &caching_allocator_options::growable_page_bytes},
    {"growable_page_bytes", "page_size", &caching_allocator_options::growable_page_bytes},
    {"growable_reserve_bytes", "growable_reserve_bytes",
     &caching_allocator_options::growable_reserve_bytes},
    {"small_request_bytes", "small_request_bytes", &caching_allocator_options::small_request_bytes},
    {"small_segment_bytes", "small_segment_bytes", &caching_allocator_options::small_segment_bytes},
    {"medium_request_bytes", "medium_request_bytes",
     &caching_allocator_options::medium_request_bytes},
    {"medium_segment_bytes", "medium_segment_bytes",
     &caching_allocator_options::medium_segment_bytes},
    {"segment_rounding_bytes", "segment_rounding_bytes",
     &caching_allocator_options::segment_rounding_bytes},
    {"thread_cache_bytes", "thread_cache_bytes", &caching_allocator_options::thread_cache_bytes},
    {"thread_cache_max_block_bytes", "thread_cache",
     &caching_allocator_options::thread_cache_max_block_bytes},
  };
  for (auto const& s : sizes) {
    if (key == s.name) {
      setting       = s.setting;
      o.*(s.member) = conf_size(key, value);
      return true;
    }
  }
  setting = nullptr;
  if (key == "segments") {
    setting  = "segments";
    o.source = conf_source(key, value);
  } else if (key == "expandable_segments") {
    setting  = "segments";
    o.source = conf_bool(key, value) ? segment_source::growable : segment_source::automatic;
  } else if (key == "limit_fraction" || key == "fraction") {
    setting          = "limit_fraction";
    o.limit_fraction = conf_fraction(key, value);
  } else if (key == "growable_shareable") {
    o.growable_shareable = conf_bool(key, value);
  } else if (key == "thread_cache") {
    setting = "thread_cache";
    if (!conf_bool(key, value)) { o.thread_cache_max_block_bytes = 0; }
  } else if (key == "thread_cache_blocks_per_class") {  // the allocator's range: [0, 255]
    o.thread_cache_blocks_per_class = static_cast<int>(conf_count(key, value, 255));
  } else if (key == "release_before_grow") {
    o.release_before_grow = conf_bool(key, value);
  } else if (key == "oom_wait_for_frees_ms") {
    o.oom_wait_for_frees_ms = static_cast<int>(conf_count(key, value, INT_MAX));
  } else if (key == "nvtx_annotate") {
    o.nvtx_annotate = conf_bool(key, value);
  } else {
    return false;
  }
  return true;
}

}  // namespace detail

inline char const* to_string(segment_source s) noexcept
{
  switch (s) {
    case segment_source::automatic: return "automatic";
    case segment_source::stream_ordered: return "stream_ordered";
    case segment_source::synchronous: return "synchronous";
    case segment_source::growable: return "growable";
  }
  return "unknown";
}

inline std::size_t parse_alloc_conf_size(std::string_view text)
{
  std::string_view const t = detail::conf_trim(text);
  std::size_t digits       = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) { ++digits; }
  auto fail = [&](char const* why) -> std::size_t {
    throw logic_error{"gpukit: '" + std::string{text} + "' is not a size: " + why};
  };
  if (digits == 0) { return fail("expected digits, then an optional unit (B, KiB, MiB, GiB)"); }
  if (digits > 19) { return fail("too large"); }
  unsigned long long const n = std::strtoull(std::string{t.substr(0, digits)}.c_str(), nullptr, 10);
  std::string const unit     = detail::conf_lower(detail::conf_trim(t.substr(digits)));
  unsigned shift             = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    shift = 40;
  } else {
    return fail("unknown unit (B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB)");
  }
  if (shift != 0 && n > (~0ULL >> shift)) { return fail("too large"); }
  return static_cast<std::size_t>(n << shift);
}

inline caching_allocator_options parse_alloc_conf(std::string_view conf,
                                                  caching_allocator_options base)
{
  struct seen_key {
    std::string key;      // as the user typed it (lower case)
    std::string setting;  // what it sets (aliases and overlapping keys share one)
  };
  std::vector<seen_key> seen;
  while (!conf.empty()) {
    std::size_t const comma      = conf.find(',');
    std::string_view const entry = detail::conf_trim(conf.substr(0, comma));
    conf = comma == std::string_view::npos ? std::string_view{} : conf.substr(comma + 1);
    if (entry.empty()) { continue; }
    std::size_t const colon = entry.find(':');
    GPUKIT_EXPECTS(colon != std::string_view::npos,
                   "alloc conf: entry '" + std::string{entry} + "' is not key:value");
    std::string const key        = detail::conf_lower(detail::conf_trim(entry.substr(0, colon)));
    std::string_view const value = detail::conf_trim(entry.substr(colon + 1));
    for (seen_key const& k : seen) {
      GPUKIT_EXPECTS(k.key != key, "alloc conf: key '" + key + "' is given twice");
    }
    char const* setting = nullptr;
    GPUKIT_EXPECTS(detail::conf_apply(base, key, value, setting),
                   "alloc conf: unknown key '" + key +
                     "' (known: segments, expandable_segments, limit, max_bytes, limit_fraction, "
                     "fraction, page_size, growable_page_bytes, growable_reserve_bytes, "
                     "growable_shareable, small_request_bytes, small_segment_bytes, "
                     "medium_request_bytes, medium_segment_bytes, segment_rounding_bytes, "
                     "thread_cache, thread_cache_bytes, thread_cache_max_block_bytes, "
                     "thread_cache_blocks_per_class, release_before_grow, oom_wait_for_frees_ms, "
                     "nvtx_annotate)");
    std::string const what = setting != nullptr ? setting : key;
    for (seen_key const& k : seen) {
      GPUKIT_EXPECTS(k.setting != what, "alloc conf: '" + k.key + "' and '" + key + "' both set " +
                                          what + "; give one of them");
    }
    seen.push_back({key, what});
  }
  GPUKIT_EXPECTS(base.small_request_bytes <= base.small_segment_bytes,
                 "alloc conf: small_request_bytes (" + std::to_string(base.small_request_bytes) +
                   ") is larger than small_segment_bytes (" +
                   std::to_string(base.small_segment_bytes) + ")");
  GPUKIT_EXPECTS(base.growable_page_bytes != 0 && base.segment_rounding_bytes != 0,
                 "alloc conf: page_size and segment_rounding_bytes must not be 0");
  return base;
}

inline caching_allocator_options alloc_conf_from_env(char const* variable,
                                                     caching_allocator_options base)
{
  char const* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') { return base; }
  try {
    return parse_alloc_conf(value, base);
  } catch (logic_error const& e) {
    throw logic_error{std::string{e.what()} + " (in " + variable + "=\"" + value + "\")"};
  }
}

inline caching_allocator_options detail::default_allocator_options(int device)
{
  try {
    return alloc_conf_from_env();
  } catch (logic_error const& e) {
    throw logic_error{"gpukit: default_caching_allocator(" + std::to_string(device) +
                      "): " + e.what()};
  }
}

}  // namespace gpukit
