// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/detail/alloc_conf_impl.hpp: the bodies of alloc_conf.hpp. Not public API.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/alloc_conf.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpukit_torch {

namespace detail {

inline std::string_view trim(std::string_view s) noexcept
{
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) { s.remove_prefix(1); }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) { s.remove_suffix(1); }
  return s;
}

inline std::string lower(std::string_view s)
{
  std::string o{s};
  for (char& c : o) { c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
  return o;
}

[[noreturn]] inline void bad_value(std::string_view key, std::string_view value,
                                   std::string const& why)
{
  throw gpukit::logic_error{"gpukit: alloc conf: bad value '" + std::string{value} + "' for '" +
                            std::string{key} + "': " + why};
}

inline bool is_power_of_two(unsigned long long v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

inline int floor_log2(unsigned long long v) noexcept { return 63 - __builtin_clzll(v); }

// A whole number (digits only), or false.
inline bool whole(std::string_view text, unsigned long long& out)
{
  if (text.empty() || text.size() > 19) { return false; }
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) { return false; }
  }
  out = std::strtoull(std::string{text}.c_str(), nullptr, 10);
  return true;
}

// PyTorch's booleans (True, False), and gpukit's spellings of them.
inline bool torch_bool(std::string_view key, std::string_view value)
{
  std::string const v = lower(value);
  if (v == "true" || v == "1" || v == "on" || v == "yes") { return true; }
  if (v == "false" || v == "0" || v == "off" || v == "no") { return false; }
  bad_value(key, value, "expected True or False");
}

inline std::size_t mebibytes(std::string_view key, std::string_view value)
{
  unsigned long long n = 0;
  if (!whole(value, n) || n == 0 || n > (~0ULL >> 21)) {
    bad_value(key, value, "expected a whole number of MiB, at least 1");
  }
  return static_cast<std::size_t>(n) << 20;
}

// roundup_power2_divisions: "N", or "[a:N,b:M,...,>:K]" with a, b powers of two in MiB. Filled as
// PyTorch fills its table: the first interval's value also below it, '>' from the last interval
// on, intervals not named and not covered stay 0.
inline size_rounding power2_divisions(std::string_view key, std::string_view value)
{
  size_rounding r;
  auto divisions = [&](std::string_view text) {
    unsigned long long n = 0;
    if (!whole(trim(text), n) || !is_power_of_two(n)) {
      bad_value(
        key, value,
        "divisions '" + std::string{trim(text)} + "' are not a power of two (1, 2, 4, ...)");
    }
    return static_cast<std::size_t>(n);
  };
  if (value.empty() || value.front() != '[') {
    r.divisions.fill(divisions(value));
    return r;
  }
  if (value.back() != ']') { bad_value(key, value, "a list must end with ']'"); }
  std::string_view list = value.substr(1, value.size() - 2);
  std::size_t last      = 0;
  bool any              = false;
  while (!trim(list).empty()) {
    std::size_t const comma      = list.find(',');
    std::string_view const entry = trim(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    std::size_t const colon = entry.find(':');
    if (colon == std::string_view::npos) {
      bad_value(key, value, "'" + std::string{entry} + "' is not <MiB>:<divisions>");
    }
    std::string_view const at = trim(entry.substr(0, colon));
    std::size_t const n       = divisions(entry.substr(colon + 1));
    any                       = true;
    if (at == ">") {
      std::fill(r.divisions.begin() + static_cast<std::ptrdiff_t>(last) + 1, r.divisions.end(), n);
      continue;
    }
    unsigned long long mib = 0;
    if (!whole(at, mib) || !is_power_of_two(mib)) {
      bad_value(key, value,
                "interval '" + std::string{at} + "' is not a power of two of MiB (1, 2, 4, ...)");
    }
    std::size_t const index =
      std::min<std::size_t>(static_cast<std::size_t>(floor_log2(mib)), r.divisions.size() - 1);
    if (last == 0) {
      std::fill(r.divisions.begin(), r.divisions.begin() + static_cast<std::ptrdiff_t>(index), n);
    }
    r.divisions[index] = n;
    last               = index;
  }
  if (!any) { bad_value(key, value, "the list is empty"); }
  return r;
}

// PyTorch's keys that set gpukit's options, each applied through the entry of
// gpukit::alloc_conf_keys that owns the option (its parser and its range), and refused beside a
// gpukit key that sets the same option.
struct pytorch_option {
  char const* pytorch;
  gpukit::alloc_conf_field field;
};
inline constexpr pytorch_option pytorch_options[] = {
  {"expandable_segments", GPUKIT_ALLOC_CONF_FIELD(source)},
  {"per_process_memory_fraction", GPUKIT_ALLOC_CONF_FIELD(limit_fraction)},
  {"large_segment_size_mb", GPUKIT_ALLOC_CONF_FIELD(medium_segment_bytes)},
  {"large_segment_size_mb", GPUKIT_ALLOC_CONF_FIELD(growable_page_bytes)},
};

// PyTorch's keys that are two spellings of one setting, and its name for messages.
struct pytorch_alias {
  char const* a;
  char const* b;
  char const* what;
};
inline constexpr pytorch_alias pytorch_aliases[] = {
  {"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "the lock"},
  {"pinned_use_cuda_host_register", "pinned_use_hip_host_register", "host registration"},
};

// Sets `field` as gpukit's key for it would from `value`; a bad value names `key`, PyTorch's key.
inline void set_option(gpukit::caching_allocator_options& o, gpukit::alloc_conf_field const& field,
                       std::string const& key, std::string const& value)
{
  gpukit::apply_alloc_conf_key(o, *gpukit::find_alloc_conf_key(field), value, key);
}

// What a key of either vocabulary sets, for the check that no two keys set one thing: its
// gpukit options (PyTorch's keys above, gpukit's through their table) or, for PyTorch's
// spellings of one setting, that setting.
struct key_sets {
  std::string key;
  std::vector<gpukit::alloc_conf_field> fields;
  char const* setting{nullptr};
};

inline key_sets what_key_sets(std::string const& key)
{
  key_sets s{key, {}, nullptr};
  for (pytorch_option const& p : pytorch_options) {
    if (key == p.pytorch) { s.fields.push_back(p.field); }
  }
  for (pytorch_alias const& a : pytorch_aliases) {
    if (key == a.a || key == a.b) { s.setting = a.what; }
  }
  if (find_pytorch_key(key) == nullptr) {
    if (gpukit::alloc_conf_key const* k = gpukit::find_alloc_conf_key(key)) {
      s.fields.push_back(k->field);
    }
  }
  return s;
}

// Refuses `next` when a key given before it sets one of the things it sets.
inline void refuse_overlap(std::vector<key_sets> const& given, key_sets const& next)
{
  for (key_sets const& g : given) {
    std::string what = g.setting != nullptr && g.setting == next.setting ? g.setting : "";
    for (gpukit::alloc_conf_field const& f : g.fields) {
      for (gpukit::alloc_conf_field const& n : next.fields) {
        if (f == n && what.empty()) { what = gpukit::find_alloc_conf_key(f)->key; }
      }
    }
    GPUKIT_EXPECTS(what.empty(), "alloc conf: '" + g.key + "' and '" + next.key + "' both set " +
                                   what + "; give one of them");
  }
}

// Splits `conf` at commas outside brackets into trimmed, non-empty entries.
inline std::vector<std::string_view> entries(std::string_view conf)
{
  std::vector<std::string_view> out;
  int depth         = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= conf.size(); ++i) {
    char const c = i < conf.size() ? conf[i] : ',';
    if (c == '[') { ++depth; }
    if (c == ']' && depth > 0) { --depth; }
    if ((c == ',' && depth == 0) || i == conf.size()) {  // an unclosed '[' ends at the end
      std::string_view const e = trim(conf.substr(start, i - start));
      if (!e.empty()) { out.push_back(e); }
      start = i + 1;
    }
  }
  return out;
}

// Refuses a value other than PyTorch's default (k.accepted) for a key gpukit accepts only so.
inline void check_default_only(pytorch_key const& k, std::string const& key, std::string_view value,
                               std::string_view entry)
{
  bool const is_bool = std::string_view{k.accepted} == "False";
  bool const same =
    is_bool ? !torch_bool(key, value) : lower(value) == lower(std::string_view{k.accepted});
  if (!same) {
    throw gpukit::logic_error{"gpukit: alloc conf: '" + std::string{entry} + "': gpukit accepts '" +
                              key + "' only as " + k.accepted +
                              " (PyTorch's default): " + k.reason};
  }
}

// large_segment_size_mb: the segments that medium requests share (and the growable pages), in MiB;
// each must hold the largest such request.
inline void set_large_segment_size(gpukit::caching_allocator_options& o, std::string const& key,
                                   std::string_view value)
{
  std::size_t const bytes = mebibytes(key, value);
  if (bytes < o.medium_request_bytes) {
    bad_value(key, value,
              "the segment must hold the largest request that shares one (" +
                std::to_string(o.medium_request_bytes >> 20) + " MiB)");
  }
  std::string const size = gpukit::format_alloc_conf_size(bytes);
  for (pytorch_option const& p : pytorch_options) {
    if (key == p.pytorch) { set_option(o, p.field, key, size); }
  }
}

// A key whose setting gpukit applies (pytorch_key_use::applied).
inline void apply_pytorch_option(backend_conf& c, pytorch_key const& k, std::string const& key,
                                 std::string_view value)
{
  auto& o = c.options;
  if (key == "expandable_segments") {
    // PyTorch's two segment kinds: virtual memory, or cudaMalloc segments.
    set_option(o, GPUKIT_ALLOC_CONF_FIELD(source), key,
               gpukit::to_string(torch_bool(key, value) ? gpukit::segment_source::growable
                                                        : gpukit::segment_source::synchronous));
  } else if (key == "roundup_power2_divisions") {
    c.rounding = power2_divisions(key, value);
  } else if (key == "per_process_memory_fraction") {
    gpukit::caching_allocator_options next = o;
    set_option(next, GPUKIT_ALLOC_CONF_FIELD(limit_fraction), key, std::string{value});
    if (next.limit_fraction == 0.0) { bad_value(key, value, k.reason); }
    o = next;
  } else if (key == "large_segment_size_mb") {
    set_large_segment_size(o, key, value);
  }
}

inline void apply_pytorch_key(backend_conf& c, pytorch_key const& k, std::string const& key,
                              std::string_view value, std::string_view entry)
{
  switch (k.use) {
    case pytorch_key_use::refused:
      throw gpukit::logic_error{"gpukit: alloc conf: '" + std::string{entry} +
                                "': gpukit does not use '" + key + "': " + k.reason +
                                " (remove it from the configuration)"};
    case pytorch_key_use::default_only: check_default_only(k, key, value, entry); return;
    case pytorch_key_use::host_allocator:
      if (!c.host_settings.empty()) { c.host_settings += ','; }
      c.host_settings += std::string{entry};
      return;
    case pytorch_key_use::applied: break;
  }
  apply_pytorch_option(c, k, key, value);
}

}  // namespace detail

inline std::size_t size_rounding::divisions_for(std::size_t bytes) const noexcept
{
  int const log         = bytes == 0 ? 0 : detail::floor_log2(bytes);
  std::size_t const idx = log > 20 ? static_cast<std::size_t>(log - 20) : 0;
  return divisions[std::min(idx, divisions.size() - 1)];
}

inline std::size_t size_rounding::round_size(std::size_t bytes) const noexcept
{
  constexpr std::size_t unit = pytorch_min_block_bytes;
  if (bytes < unit) { return unit; }
  // No device holds this much: left as asked, for the allocator to refuse by its size.
  if (bytes > (std::numeric_limits<std::size_t>::max() >> 1)) { return bytes; }
  std::size_t const n = divisions_for(bytes);
  if (n > 1 && bytes > unit * n) {
    if (detail::is_power_of_two(bytes)) { return bytes; }
    std::size_t const floor = std::size_t{1} << detail::floor_log2(bytes);
    std::size_t const step  = floor >> detail::floor_log2(n);
    if (step == 0) { return floor << 1; }
    std::size_t const down = bytes & ~(step - 1);
    return down == bytes ? bytes : down + step;
  }
  return (bytes + unit - 1) / unit * unit;
}

inline pytorch_key const* find_pytorch_key(std::string_view key) noexcept
{
  std::string const k = detail::lower(detail::trim(key));
  for (auto const& p : pytorch_keys) {
    if (k == p.key) { return &p; }
  }
  return nullptr;
}

inline backend_conf parse_backend_conf(std::string_view conf, backend_conf base)
{
  std::string gpukit_part;
  std::vector<detail::key_sets> given;  // every key of the string, in lower case
  for (std::string_view const entry : detail::entries(conf)) {
    std::size_t const colon = entry.find(':');
    GPUKIT_EXPECTS(colon != std::string_view::npos,
                   "alloc conf: entry '" + std::string{entry} + "' is not key:value");
    std::string const key        = detail::lower(detail::trim(entry.substr(0, colon)));
    std::string_view const value = detail::trim(entry.substr(colon + 1));
    for (detail::key_sets const& g : given) {
      GPUKIT_EXPECTS(g.key != key, "alloc conf: key '" + key + "' is given twice");
    }
    detail::key_sets sets = detail::what_key_sets(key);
    detail::refuse_overlap(given, sets);
    given.push_back(std::move(sets));
    if (pytorch_key const* k = find_pytorch_key(key)) {
      detail::apply_pytorch_key(base, *k, key, value, entry);
    } else {
      if (!gpukit_part.empty()) { gpukit_part += ','; }
      gpukit_part += std::string{entry};
    }
  }
  try {
    base.options = gpukit::parse_alloc_conf(gpukit_part, base.options);
  } catch (gpukit::logic_error const& e) {
    std::string what = e.what();
    if (what.find("unknown key") != std::string::npos) {
      what += " (PyTorch's keys gpukit knows: ";
      for (std::size_t i = 0; i < std::size(pytorch_keys); ++i) {
        what += std::string{i == 0 ? "" : ", "} + pytorch_keys[i].key;
      }
      what += ")";
    }
    throw gpukit::logic_error{what};
  }
  return base;
}

inline backend_conf backend_conf_from_env(backend_conf base)
{
  auto layer = [&](char const* variable) {
    char const* value = std::getenv(variable);
    if (value == nullptr || *value == '\0') { return false; }
    try {
      base = parse_backend_conf(value, base);
    } catch (gpukit::logic_error const& e) {
      throw gpukit::logic_error{std::string{e.what()} + " (in " + variable + "=\"" + value + "\")"};
    }
    return true;
  };
  for (char const* v : pytorch_conf_variables) {
    if (layer(v)) { break; }
  }
  layer(gpukit::alloc_conf_variable);
  return base;
}

inline backend_conf backend_conf_from_env()
{
  return backend_conf_from_env(parse_backend_conf(backend_default_conf));
}

inline std::string effective_conf_from_env()
{
  std::string s = backend_default_conf;
  auto add      = [&](char const* variable) {
    char const* value = std::getenv(variable);
    if (value == nullptr || *value == '\0') { return false; }
    s += std::string{","} + value;
    return true;
  };
  for (char const* v : pytorch_conf_variables) {
    if (add(v)) { break; }
  }
  add(gpukit::alloc_conf_variable);
  return s;
}

namespace detail {

// roundup_power2_divisions' value for `r` as power2_divisions reads it back: "N" where every
// interval has N, else the intervals with divisions, the last run of equal ones as '>'.
inline std::string power2_divisions_text(size_rounding const& r)
{
  auto const& d       = r.divisions;
  std::size_t const n = d.size();
  std::size_t tail    = n - 1;  // the last run of equal divisions starts here
  while (tail > 0 && d[tail - 1] == d[tail]) { --tail; }
  if (d[n - 1] != 0 && tail == 0) { return std::to_string(d[0]); }
  std::size_t before = tail;  // the last interval with divisions before the run
  while (before > 0 && d[before - 1] == 0) { --before; }
  bool const arrow = d[n - 1] != 0 && tail > 0 && before == tail;
  std::string text;
  for (std::size_t i = 0; i < (arrow ? tail : n); ++i) {
    if (d[i] == 0) { continue; }
    text +=
      (text.empty() ? "" : ",") + std::to_string(std::size_t{1} << i) + ":" + std::to_string(d[i]);
  }
  if (arrow) { text += ",>:" + std::to_string(d[n - 1]); }
  return text.empty() ? text : "[" + text + "]";
}

}  // namespace detail

inline std::string to_alloc_conf(backend_conf const& c)
{
  std::string conf            = gpukit::to_alloc_conf(c.options);
  std::string const divisions = detail::power2_divisions_text(c.rounding);
  if (!divisions.empty()) { conf += ",roundup_power2_divisions:" + divisions; }
  if (!c.host_settings.empty()) { conf += "," + c.host_settings; }
  return conf;
}

inline std::string pytorch_keys_markdown()
{
  std::string t = "| PyTorch key | gpukit | why |\n|---|---|---|\n";
  for (auto const& k : pytorch_keys) {
    t += "| `" + std::string{k.key} + "` | " + k.effect + " | " + k.reason + " |\n";
  }
  return t;
}

}  // namespace gpukit_torch
