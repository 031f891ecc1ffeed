// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/alloc_conf_impl.hpp: the bodies of alloc_conf.hpp, all of them readers of
// alloc_conf_keys. Not public API; included by alloc_conf.hpp.
#pragma once

#include <gpukit/error.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

/// Every refusal of a configuration string: "gpukit: alloc conf: <what>".
[[noreturn]] inline void conf_refuse(std::string const& what)
{
  throw logic_error{"gpukit: alloc conf: " + what};
}

[[noreturn]] inline void conf_fail(std::string_view key, std::string_view value,
                                   std::string const& why)
{
  conf_refuse("bad value '" + std::string{value} + "' for '" + std::string{key} + "': " + why);
}

/// The shortest decimal text that strtod reads back to `v` exactly.
inline std::string conf_number(double v)
{
  char text[32] = "";
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) { break; }
  }
  return text;
}

/// A bound of a count or size (whole, within std::size_t) as text.
inline std::string conf_whole(alloc_conf_kind kind, double bound)
{
  auto const n = static_cast<std::size_t>(bound);
  return kind == alloc_conf_kind::bytes ? format_alloc_conf_size(n) : std::to_string(n);
}

inline bool conf_bool(std::string_view key, std::string_view value)
{
  std::string const v = conf_lower(value);
  if (v == "true" || v == "1" || v == "on" || v == "yes") { return true; }
  if (v == "false" || v == "0" || v == "off" || v == "no") { return false; }
  conf_fail(key, value, "expected true or false");
}

/// A unit of a size and the power of two it multiplies by.
struct conf_unit {
  char const* name;  ///< lower case
  unsigned shift;
};

/// The units a size may end with (no unit: bytes), all powers of 1024.
inline constexpr conf_unit conf_units[] = {
  {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
  {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40},
};

/// The unit `unit` (lower case) names, or null.
inline conf_unit const* find_conf_unit(std::string const& unit) noexcept
{
  for (conf_unit const& u : conf_units) {
    if (unit == u.name) { return &u; }
  }
  return nullptr;
}

/// `text` as a size in `bytes`; else why not.
inline char const* conf_size(std::string_view text, std::size_t& bytes)
{
  std::string_view const t = conf_trim(text);
  std::size_t digits       = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) { ++digits; }
  if (digits == 0) { return "expected digits, then an optional unit (B, KiB, MiB, GiB, TiB)"; }
  if (digits > 19) { return "too large"; }
  unsigned long long const n = std::strtoull(std::string{t.substr(0, digits)}.c_str(), nullptr, 10);
  conf_unit const* unit      = find_conf_unit(conf_lower(conf_trim(t.substr(digits))));
  if (unit == nullptr) {
    return "unknown unit (B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB)";
  }
  if (unit->shift != 0 && n > (~0ULL >> unit->shift)) { return "too large"; }
  bytes = static_cast<std::size_t>(n << unit->shift);
  return nullptr;
}

/// Whether `v` is within `k`'s range (and a multiple of its `multiple`).
inline bool conf_in_range(alloc_conf_key const& k, double v) noexcept
{
  return std::isfinite(v) && v >= k.min && v <= k.max;
}

inline bool conf_bytes_in_range(alloc_conf_key const& k, std::size_t v) noexcept
{
  return conf_in_range(k, static_cast<double>(v)) && v % k.multiple == 0;
}

/// `v` as a whole number within `k`'s range, else false.
inline bool conf_count(alloc_conf_key const& k, std::string const& v, int& out)
{
  char* end   = nullptr;
  errno       = 0;
  long long n = v.empty() ? -1 : std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || !conf_in_range(k, static_cast<double>(n))) {
    return false;
  }
  out = static_cast<int>(n);
  return true;
}

/// `v` as a fraction within `k`'s range, else false.
inline bool conf_fraction(alloc_conf_key const& k, std::string const& v, double& out)
{
  char* end = nullptr;
  errno     = 0;
  double f  = v.empty() ? -1.0 : std::strtod(v.c_str(), &end);
  if (v.empty() || errno != 0 || *end != '\0' || !conf_in_range(k, f)) { return false; }
  out = f;
  return true;
}

/// `v` as a segment source within `k`'s range (by its name, in any case), else false.
inline bool conf_source(alloc_conf_key const& k, std::string const& v, segment_source& out)
{
  std::string const name = conf_lower(v);
  for (auto s = static_cast<int>(k.min); s <= static_cast<int>(k.max); ++s) {
    if (name == to_string(static_cast<segment_source>(s))) {
      out = static_cast<segment_source>(s);
      return true;
    }
  }
  return false;
}

/// Whether the member `k` (not a shortcut) sets holds a value within `k`'s range.
inline bool conf_member_in_range(alloc_conf_key const& k, caching_allocator_options const& o)
{
  alloc_conf_field const& f = k.field;
  switch (f.kind) {
    case alloc_conf_kind::bytes: return conf_bytes_in_range(k, o.*(f.bytes));
    case alloc_conf_kind::count: return conf_in_range(k, static_cast<double>(o.*(f.count)));
    case alloc_conf_kind::fraction: return conf_in_range(k, o.*(f.fraction));
    case alloc_conf_kind::flag: return true;
    case alloc_conf_kind::source:
      return conf_in_range(k, static_cast<double>(static_cast<int>(o.*(f.source))));
  }
  return false;
}

/// The value of the member `k` (not a shortcut) sets, as a configuration string spells it
/// (`in_bytes`: sizes as a plain number of bytes, as C++ sets them).
inline std::string conf_member_text(alloc_conf_key const& k, caching_allocator_options const& o,
                                    bool in_bytes = false)
{
  alloc_conf_field const& f = k.field;
  switch (f.kind) {
    case alloc_conf_kind::bytes:
      return in_bytes ? std::to_string(o.*(f.bytes)) : format_alloc_conf_size(o.*(f.bytes));
    case alloc_conf_kind::count: return std::to_string(o.*(f.count));
    case alloc_conf_kind::fraction: return conf_number(o.*(f.fraction));
    case alloc_conf_kind::flag: return o.*(f.flag) ? "true" : "false";
    case alloc_conf_kind::source: {
      segment_source const s = o.*(f.source);
      return in_bytes ? std::to_string(static_cast<int>(s)) : std::string{to_string(s)};
    }
  }
  return {};
}

inline void conf_expandable_segments(caching_allocator_options& o, std::string_view key,
                                     std::string_view value)
{
  o.source = conf_bool(key, value) ? segment_source::growable : segment_source::automatic;
}

inline void conf_thread_cache(caching_allocator_options& o, std::string_view key,
                              std::string_view value)
{
  if (!conf_bool(key, value)) {
    o.thread_cache_max_block_bytes = 0;
  } else if (o.thread_cache_max_block_bytes == 0) {
    o.thread_cache_max_block_bytes = caching_allocator_options{}.thread_cache_max_block_bytes;
  }
}

/// A key of a string, as typed, and the option it set.
struct conf_given {
  alloc_conf_field field;
  std::string key;
};

/// Checks every option against its key's range and alloc_conf_orders. An option that `given`
/// lists is named by the key typed for it, the others by their member.
inline void conf_validate(caching_allocator_options const& o, std::vector<conf_given> const& given)
{
  auto typed = [&](alloc_conf_field const& f) -> conf_given const* {
    for (conf_given const& g : given) {
      if (g.field == f) { return &g; }
    }
    return nullptr;
  };
  for (alloc_conf_key const& k : alloc_conf_keys) {
    if (k.shortcut != nullptr || conf_member_in_range(k, o)) { continue; }
    std::string const range = alloc_conf_range(k);
    if (conf_given const* g = typed(k.field)) { conf_fail(g->key, conf_member_text(k, o), range); }
    throw logic_error{"gpukit: caching_allocator_options: " + std::string{k.field.name} + " = " +
                      conf_member_text(k, o, true) + " is out of range: expected " + range};
  }
  for (alloc_conf_order const& order : alloc_conf_orders) {
    alloc_conf_key const& small = *find_alloc_conf_key(order.smaller);
    alloc_conf_key const& large = *find_alloc_conf_key(order.larger);
    if (o.*(small.field.bytes) <= o.*(large.field.bytes)) { continue; }
    bool const from_string = typed(small.field) != nullptr || typed(large.field) != nullptr;
    auto name              = [&](alloc_conf_key const& k) {
      conf_given const* g = typed(k.field);
      std::string const v = conf_member_text(k, o, !from_string);
      return (g != nullptr ? "'" + g->key + "'" : std::string{k.field.name}) + " (" + v + ")";
    };
    std::string const what = name(large) + " is smaller than " + name(small);
    if (from_string) { conf_refuse(what); }
    throw logic_error{"gpukit: caching_allocator_options: " + what};
  }
}

}  // namespace detail

inline std::size_t parse_alloc_conf_size(std::string_view text)
{
  std::size_t bytes = 0;
  if (char const* why = detail::conf_size(text, bytes)) {
    throw logic_error{"gpukit: '" + std::string{text} + "' is not a size: " + why};
  }
  return bytes;
}

inline std::string format_alloc_conf_size(std::size_t bytes)
{
  char const* const units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    unsigned const shift   = 10U * static_cast<unsigned>(4 - i);
    std::size_t const unit = std::size_t{1} << shift;
    if (bytes != 0 && bytes % unit == 0) { return std::to_string(bytes >> shift) + units[i]; }
  }
  return std::to_string(bytes);
}

inline std::string alloc_conf_range(alloc_conf_key const& k)
{
  bool const bounded = k.max != alloc_conf_unbounded;
  switch (k.kind) {
    case alloc_conf_kind::bytes: {
      std::string r = "a size";
      if (bounded) {
        r +=
          " from " + detail::conf_whole(k.kind, k.min) + " to " + detail::conf_whole(k.kind, k.max);
      } else if (k.min > 0) {
        r += " of at least " + detail::conf_whole(k.kind, k.min);
      }
      if (k.multiple > 1) { r += ", a multiple of " + std::to_string(k.multiple); }
      return r;
    }
    case alloc_conf_kind::count:
      return "a whole number from " + detail::conf_whole(k.kind, k.min) + " to " +
             detail::conf_whole(k.kind, k.max);
    case alloc_conf_kind::fraction:
      return "a fraction from " + detail::conf_number(k.min) + " to " + detail::conf_number(k.max);
    case alloc_conf_kind::flag: return "true or false";
    case alloc_conf_kind::source: {
      std::string r;
      auto const first = static_cast<int>(k.min);
      auto const last  = static_cast<int>(k.max);
      for (int s = first; s <= last; ++s) {
        r += s == first ? "" : (s == last ? " or " : ", ");
        r += to_string(static_cast<segment_source>(s));
      }
      return r;
    }
  }
  return {};
}

inline alloc_conf_key const* find_alloc_conf_key(std::string_view key) noexcept
{
  std::string_view const k = detail::conf_trim(key);
  auto same                = [&](char const* name) {
    if (name == nullptr || std::string_view{name}.size() != k.size()) { return false; }
    for (std::size_t i = 0; i < k.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(k[i])) != name[i]) { return false; }
    }
    return true;
  };
  for (alloc_conf_key const& e : alloc_conf_keys) {
    if (same(e.key) || same(e.alias)) { return &e; }
  }
  return nullptr;
}

inline alloc_conf_key const* find_alloc_conf_key(alloc_conf_field const& field) noexcept
{
  for (alloc_conf_key const& e : alloc_conf_keys) {
    if (e.shortcut == nullptr && e.field == field) { return &e; }
  }
  return nullptr;
}

inline void apply_alloc_conf_key(caching_allocator_options& o, alloc_conf_key const& k,
                                 std::string_view value, std::string_view key)
{
  if (key.empty()) { key = k.key; }
  if (k.shortcut != nullptr) {
    k.shortcut(o, key, value);
    return;
  }
  std::string const v           = std::string{detail::conf_trim(value)};
  alloc_conf_field const& field = k.field;
  auto refuse                   = [&](std::string const& why = {}) {
    detail::conf_fail(key, value, "expected " + alloc_conf_range(k) + why);
  };
  bool parsed = true;
  switch (k.kind) {
    case alloc_conf_kind::bytes: {
      std::size_t bytes = 0;
      if (char const* why = detail::conf_size(v, bytes)) { refuse(std::string{": "} + why); }
      parsed = detail::conf_bytes_in_range(k, bytes);
      if (parsed) { o.*(field.bytes) = bytes; }
      break;
    }
    case alloc_conf_kind::count: parsed = detail::conf_count(k, v, o.*(field.count)); break;
    case alloc_conf_kind::fraction:
      parsed = detail::conf_fraction(k, v, o.*(field.fraction));
      break;
    case alloc_conf_kind::flag: o.*(field.flag) = detail::conf_bool(key, v); break;
    case alloc_conf_kind::source: parsed = detail::conf_source(k, v, o.*(field.source)); break;
  }
  if (!parsed) { refuse(); }
}

inline caching_allocator_options parse_alloc_conf(std::string_view conf,
                                                  caching_allocator_options base)
{
  std::vector<detail::conf_given> given;
  while (!conf.empty()) {
    std::size_t const comma      = conf.find(',');
    std::string_view const entry = detail::conf_trim(conf.substr(0, comma));
    conf = comma == std::string_view::npos ? std::string_view{} : conf.substr(comma + 1);
    if (entry.empty()) { continue; }
    std::size_t const colon = entry.find(':');
    if (colon == std::string_view::npos) {
      detail::conf_refuse("entry '" + std::string{entry} + "' is not key:value");
    }
    std::string const key   = detail::conf_lower(detail::conf_trim(entry.substr(0, colon)));
    alloc_conf_key const* k = find_alloc_conf_key(key);
    if (k == nullptr) {
      std::string known;
      for (alloc_conf_key const& e : alloc_conf_keys) {
        known += (known.empty() ? "" : ", ") + std::string{e.key};
        if (e.alias != nullptr) { known += std::string{" (or "} + e.alias + ")"; }
      }
      detail::conf_refuse("unknown key '" + key + "' (known: " + known + ")");
    }
    for (detail::conf_given const& g : given) {
      if (g.key == key) { detail::conf_refuse("key '" + key + "' is given twice"); }
      if (g.field == k->field) {
        detail::conf_refuse("'" + g.key + "' and '" + key + "' both set " +
                            find_alloc_conf_key(k->field)->key + "; give one of them");
      }
    }
    apply_alloc_conf_key(base, *k, detail::conf_trim(entry.substr(colon + 1)), key);
    given.push_back({k->field, key});
  }
  detail::conf_validate(base, given);
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

inline std::string to_alloc_conf(caching_allocator_options const& o)
{
  detail::validate_allocator_options(o);
  std::string conf;
  for (alloc_conf_key const& k : alloc_conf_keys) {
    if (k.shortcut != nullptr) { continue; }
    conf += (conf.empty() ? "" : ",") + std::string{k.key} + ":" + detail::conf_member_text(k, o);
  }
  return conf;
}

inline std::string alloc_conf_markdown()
{
  caching_allocator_options defaults;
  defaults.nvtx_annotate = false;  // its default depends on the environment: its doc says how
  std::string md =
    "<!-- Generated from gpukit::alloc_conf_keys (include/gpukit/memory/alloc_conf.hpp) by "
    "tests/memory/alloc_conf_test.cpp: edit the table, then run the test with "
    "GPUKIT_UPDATE_ALLOC_CONF_DOC=1. -->\n\n"
    "# GPUKIT_ALLOC_CONF: the caching allocator's keys\n\n"
    "`GPUKIT_ALLOC_CONF` (read by the default allocators, `gpukit::alloc_conf_from_env()` and "
    "the PyTorch backend) and `gpukit::parse_alloc_conf()` take `key:value` pairs separated by "
    "commas, as `PYTORCH_CUDA_ALLOC_CONF` does: `segments:growable,page_size:20MiB,limit:40GiB`. "
    "Spaces around keys and values are ignored, and so are empty entries; keys are read in any "
    "case. Sizes are a whole number of bytes with an optional unit: B, K/KB/KiB, M/MB/MiB, "
    "G/GB/GiB, T/TB/TiB (all powers of 1024). Booleans are true/false, 1/0, on/off, yes/no. An "
    "unknown key, a key given twice, two keys that set one option (a key and its alias, say) or "
    "a value out of range is refused, naming the key as typed. `gpukit::to_alloc_conf(options)` "
    "writes options back as such a string. The allocator checks options set from C++ against "
    "the same ranges, naming the member of `gpukit::caching_allocator_options`.\n\n"
    "| key | member | value | default | example | what it sets |\n"
    "|---|---|---|---|---|---|\n";
  for (alloc_conf_key const& k : alloc_conf_keys) {
    std::string key = "`" + std::string{k.key} + "`";
    if (k.alias != nullptr) { key += " (or `" + std::string{k.alias} + "`)"; }
    std::string const fallback = k.shortcut != nullptr
                                   ? "(`" + std::string{find_alloc_conf_key(k.field)->key} + "`)"
                                   : "`" + detail::conf_member_text(k, defaults) + "`";
    md += "| " + key + " | `" + k.field.name + "` | " + alloc_conf_range(k) + " | " + fallback +
          " | `" + k.example + "` | " + k.doc + " |\n";
  }
  std::string shortcuts;
  for (alloc_conf_key const& k : alloc_conf_keys) {
    if (k.shortcut != nullptr) {
      shortcuts += (shortcuts.empty() ? "`" : ", `") + std::string{k.key} + "`";
    }
  }
  md += "\nShortcuts (" + shortcuts +
        ") set the option of another key, which is their default (in brackets) and which "
        "`gpukit::to_alloc_conf` writes.\n\n## Orders\n\nChecked once every key of a string "
        "is applied, and by the allocator's constructor:\n\n";
  for (alloc_conf_order const& order : alloc_conf_orders) {
    md += "- `" + std::string{find_alloc_conf_key(order.larger)->key} + "` is at least `" +
          find_alloc_conf_key(order.smaller)->key + "`\n";
  }
  return md;
}

inline void detail::validate_allocator_options(caching_allocator_options const& o)
{
  detail::conf_validate(o, {});
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
