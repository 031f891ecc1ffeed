// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/alloc_conf.hpp: caching allocator options from a PyTorch-style string, and the
// table of its keys.
//
// Quick start:
//
//   #include <gpukit/memory/alloc_conf.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <string>
//
//   std::string run(gpukit::caching_allocator_options const& mine)
//   {
//     // GPUKIT_ALLOC_CONF="segments:growable,page_size:20MiB,limit:40GiB" python train.py
//     gpukit::caching_allocator_options o = gpukit::alloc_conf_from_env();
//     gpukit::caching_allocator alloc{gpukit::cuda_runtime::instance(), 0, o};
//
//     // or from any string, over options of your own:
//     auto o2 = gpukit::parse_alloc_conf("segments:synchronous, thread_cache:off", mine);
//     gpukit::caching_allocator other{gpukit::cuda_runtime::instance(), 0, o2};
//
//     // the settings in effect, as a string that parses back to them:
//     return gpukit::to_alloc_conf(alloc.options());
//   }
//
// The string is `key:value` pairs separated by commas, as PYTORCH_CUDA_ALLOC_CONF; spaces around
// keys and values are ignored, and so are empty entries. The keys, their values, ranges and
// defaults are listed in docs/alloc_conf.md, which is generated from alloc_conf_keys below (a test
// fails when it is stale). Sizes are a whole number of bytes with an optional unit: B, K/KB/KiB,
// M/MB/MiB, G/GB/GiB, T/TB/TiB (all powers of 1024, as PyTorch's `max_split_size_mb` counts).
// Booleans are true/false, 1/0, on/off, yes/no, in any case. An unknown key, a key given twice,
// two keys that set one option, or a bad or out-of-range value throws gpukit::logic_error naming
// the key as typed, so a typo never silently leaves a setting at its default. Nothing here calls
// the runtime.
//
// alloc_conf_keys is the one list of keys: parsing, the range checks (those of parse_alloc_conf
// and those of the allocator's constructor, for options set from C++), the list of known keys in
// messages, to_alloc_conf and the generated reference all read it. A new option that strings may
// set is one entry there.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator_options.hpp>

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace gpukit {

/// The variable alloc_conf_from_env reads by default.
inline constexpr char const* alloc_conf_variable = "GPUKIT_ALLOC_CONF";

/// What the value of a key is.
enum class alloc_conf_kind {
  bytes,     ///< a size: digits and an optional unit (parse_alloc_conf_size); a std::size_t
  count,     ///< a whole number; an int
  fraction,  ///< a decimal number; a double
  flag,      ///< true/false, 1/0, on/off, yes/no (any case); a bool
  source,    ///< a segment_source by the name to_string gives it
};

/// The option a key sets: a pointer to the member of caching_allocator_options (the one of the
/// member's type is set, the others are null) and the member's name, which messages about options
/// set from C++ give. Made by GPUKIT_ALLOC_CONF_FIELD(member).
struct alloc_conf_field {
  using options_type = caching_allocator_options;
  // The member pointers' types named once: nvcc rewrites a `T C::*member;` declaration with
  // parentheses, which the host compiler's -Wparentheses reports.
  using bytes_member    = std::size_t options_type::*;     ///< alloc_conf_kind::bytes
  using count_member    = int options_type::*;             ///< alloc_conf_kind::count
  using fraction_member = double options_type::*;          ///< alloc_conf_kind::fraction
  using flag_member     = bool options_type::*;            ///< alloc_conf_kind::flag
  using source_member   = segment_source options_type::*;  ///< alloc_conf_kind::source

  char const* name{};  ///< the member's name ("limit_bytes")
  /// The member's type: which pointer below is set. A shortcut key's value may be of another
  /// kind (thread_cache's is a flag, its member a size): code that reads or writes the member
  /// switches on this, not on alloc_conf_key::kind.
  alloc_conf_kind kind{};
  bytes_member bytes{};
  count_member count{};
  fraction_member fraction{};
  flag_member flag{};
  source_member source{};

  constexpr alloc_conf_field(char const* n, bytes_member m) noexcept
      : name{n}, kind{alloc_conf_kind::bytes}, bytes{m}
  {}
  constexpr alloc_conf_field(char const* n, count_member m) noexcept
      : name{n}, kind{alloc_conf_kind::count}, count{m}
  {}
  constexpr alloc_conf_field(char const* n, fraction_member m) noexcept
      : name{n}, kind{alloc_conf_kind::fraction}, fraction{m}
  {}
  constexpr alloc_conf_field(char const* n, flag_member m) noexcept
      : name{n}, kind{alloc_conf_kind::flag}, flag{m}
  {}
  constexpr alloc_conf_field(char const* n, source_member m) noexcept
      : name{n}, kind{alloc_conf_kind::source}, source{m}
  {}

  /// Whether both name the same member.
  [[nodiscard]] constexpr bool operator==(alloc_conf_field const& o) const noexcept
  {
    return bytes == o.bytes && count == o.count && fraction == o.fraction && flag == o.flag &&
           source == o.source;
  }
  /// Whether they name different members.
  [[nodiscard]] constexpr bool operator!=(alloc_conf_field const& o) const noexcept
  {
    return !(*this == o);
  }
};

/// The alloc_conf_field of `member` of caching_allocator_options, named as the member is.
#define GPUKIT_ALLOC_CONF_FIELD(member) \
  ::gpukit::alloc_conf_field { #member, &::gpukit::caching_allocator_options::member }

/// One key of a configuration string (see the top of this header): an entry of alloc_conf_keys.
struct alloc_conf_key {
  /// What a shortcut key does with its value: sets `o` (reports a bad value naming `key`, the
  /// key as typed).
  using shortcut_parser = void (*)(caching_allocator_options& o, std::string_view key,
                                   std::string_view value);

  char const* key;         ///< the key, in lower case, as strings and docs/alloc_conf.md spell it
  char const* alias;       ///< another spelling of the same key, or nullptr
  alloc_conf_field field;  ///< the option it sets
  alloc_conf_kind kind;    ///< what its value is (for a key that is not a shortcut: field.kind)
  /// bytes, count, fraction and source (as its enumerator's value): the smallest value allowed.
  double min;
  /// bytes, count, fraction and source: the largest value allowed (alloc_conf_unbounded: none).
  double max;
  std::size_t multiple;  ///< bytes: the value is a multiple of this (1: any)
  /// nullptr for a key whose value is its option's value, parsed by `kind`. Else the key is a
  /// shortcut that sets its option another way (`thread_cache:off` sets
  /// thread_cache_max_block_bytes to 0): the option's own key, the one without a shortcut, holds
  /// its range and is the one to_alloc_conf writes.
  shortcut_parser shortcut;
  char const* example;  ///< a value it accepts (docs/alloc_conf.md, and the tests parse it)
  char const* doc;      ///< what it sets, one sentence (Markdown)
};

/// An alloc_conf_key::max that bounds nothing.
inline constexpr double alloc_conf_unbounded = std::numeric_limits<double>::infinity();

/// The largest size alloc_conf_keys allows where it bounds one: 256 TiB, beyond any device (the
/// allocator's block index sizes its classes up to it).
inline constexpr double alloc_conf_most_bytes = static_cast<double>(std::size_t{1} << 48);

namespace detail {

void conf_expandable_segments(caching_allocator_options& o, std::string_view key,
                              std::string_view value);
void conf_thread_cache(caching_allocator_options& o, std::string_view key, std::string_view value);

/// The entry of a key whose value is its member's: `f` must be of `kind`, else alloc_conf_keys
/// fails to compile (it is a constant, and this throw is not one).
constexpr alloc_conf_key conf_key(char const* key, char const* alias, alloc_conf_field f,
                                  alloc_conf_kind kind, double min, double max,
                                  std::size_t multiple, char const* example, char const* doc)
{
  return f.kind == kind
           ? alloc_conf_key{key, alias, f, kind, min, max, multiple, nullptr, example, doc}
           : throw "alloc_conf_keys: the member is not of the key's kind";
}

constexpr alloc_conf_key conf_bytes(char const* key, char const* alias, alloc_conf_field f,
                                    double min, double max, std::size_t multiple,
                                    char const* example, char const* doc)
{
  return conf_key(key, alias, f, alloc_conf_kind::bytes, min, max, multiple, example, doc);
}

constexpr alloc_conf_key conf_count(char const* key, alloc_conf_field f, double min, double max,
                                    char const* example, char const* doc)
{
  return conf_key(key, nullptr, f, alloc_conf_kind::count, min, max, 1, example, doc);
}

constexpr alloc_conf_key conf_fraction(char const* key, char const* alias, alloc_conf_field f,
                                       char const* example, char const* doc)
{
  return conf_key(key, alias, f, alloc_conf_kind::fraction, 0.0, 1.0, 1, example, doc);
}

constexpr alloc_conf_key conf_flag(char const* key, alloc_conf_field f, char const* example,
                                   char const* doc)
{
  return conf_key(key, nullptr, f, alloc_conf_kind::flag, 0.0, 1.0, 1, example, doc);
}

/// A segment_source by name: its range is the enumerators' values.
constexpr alloc_conf_key conf_source(char const* key, alloc_conf_field f, char const* example,
                                     char const* doc)
{
  constexpr auto last = static_cast<double>(static_cast<int>(segment_source::growable));
  return conf_key(key, nullptr, f, alloc_conf_kind::source, 0.0, last, 1, example, doc);
}

/// A key whose value (a flag) sets `f` another way, through `parse`.
constexpr alloc_conf_key conf_shortcut(char const* key, alloc_conf_field f,
                                       alloc_conf_key::shortcut_parser parse, char const* example,
                                       char const* doc) noexcept
{
  return {key, nullptr, f, alloc_conf_kind::flag, 0.0, 1.0, 1, parse, example, doc};
}

}  // namespace detail

/// Every key of GPUKIT_ALLOC_CONF, once: docs/alloc_conf.md is this table.
inline constexpr alloc_conf_key alloc_conf_keys[] = {
  detail::conf_source("segments", GPUKIT_ALLOC_CONF_FIELD(source), "growable",
                      "where segments come from: `automatic` (stream_ordered where the device "
                      "has memory pools, else synchronous), `stream_ordered` (cudaMallocAsync), "
                      "`synchronous` (cudaMalloc) or `growable` (virtual memory mapped where the "
                      "pool grows, as PyTorch's expandable segments)"),
  detail::conf_shortcut("expandable_segments", GPUKIT_ALLOC_CONF_FIELD(source),
                        &detail::conf_expandable_segments, "true",
                        "PyTorch's name: `true` is `segments:growable`, `false` is "
                        "`segments:automatic`"),
  detail::conf_bytes("limit", "max_bytes", GPUKIT_ALLOC_CONF_FIELD(limit_bytes), 0,
                     alloc_conf_unbounded, 1, "40GiB",
                     "the most bytes the allocator may hold from the device (0: no limit)"),
  detail::conf_fraction("limit_fraction", "fraction", GPUKIT_ALLOC_CONF_FIELD(limit_fraction),
                        "0.9",
                        "a limit as a fraction of the device's memory (0: none); with `limit` "
                        "too, the smaller one applies"),
  detail::conf_bytes("page_size", "growable_page_bytes",
                     GPUKIT_ALLOC_CONF_FIELD(growable_page_bytes), 1, alloc_conf_most_bytes, 1,
                     "20MiB",
                     "growable segments: the large pool's mapping unit (rounded up to the "
                     "device's granularity, 2 MiB on current GPUs)"),
  detail::conf_bytes("growable_reserve_bytes", nullptr,
                     GPUKIT_ALLOC_CONF_FIELD(growable_reserve_bytes), 0, alloc_conf_most_bytes, 1,
                     "128GiB",
                     "growable segments: address space reserved per stream and pool kind (0: 9/8 "
                     "of the device's memory)"),
  detail::conf_flag("growable_shareable", GPUKIT_ALLOC_CONF_FIELD(growable_shareable), "true",
                    "growable segments: pages exportable to other processes (POSIX file "
                    "descriptors; gpukit/memory/ipc.hpp)"),
  detail::conf_bytes("small_request_bytes", nullptr, GPUKIT_ALLOC_CONF_FIELD(small_request_bytes),
                     256, alloc_conf_most_bytes, 256, "512KiB",
                     "requests up to this size are small: they share small segments"),
  detail::conf_bytes("small_segment_bytes", nullptr, GPUKIT_ALLOC_CONF_FIELD(small_segment_bytes),
                     256, alloc_conf_most_bytes, 256, "4MiB", "the size of small segments"),
  detail::conf_bytes("medium_request_bytes", nullptr, GPUKIT_ALLOC_CONF_FIELD(medium_request_bytes),
                     256, alloc_conf_most_bytes, 256, "16MiB",
                     "larger requests up to this size share medium segments; larger ones get a "
                     "segment of their own"),
  detail::conf_bytes("medium_segment_bytes", nullptr, GPUKIT_ALLOC_CONF_FIELD(medium_segment_bytes),
                     256, alloc_conf_most_bytes, 256, "32MiB", "the size of medium segments"),
  detail::conf_bytes("segment_rounding_bytes", nullptr,
                     GPUKIT_ALLOC_CONF_FIELD(segment_rounding_bytes), 256, alloc_conf_most_bytes,
                     256, "4MiB", "a segment of its own is rounded up to a multiple of this"),
  detail::conf_shortcut("thread_cache", GPUKIT_ALLOC_CONF_FIELD(thread_cache_max_block_bytes),
                        &detail::conf_thread_cache, "off",
                        "`off`: no per-thread caches (`thread_cache_max_block_bytes:0`); `on`: "
                        "the default `thread_cache_max_block_bytes` where it was 0"),
  detail::conf_bytes("thread_cache_bytes", nullptr, GPUKIT_ALLOC_CONF_FIELD(thread_cache_bytes), 0,
                     alloc_conf_unbounded, 1, "16MiB",
                     "bytes one thread may keep cached per allocator"),
  detail::conf_bytes("thread_cache_max_block_bytes", nullptr,
                     GPUKIT_ALLOC_CONF_FIELD(thread_cache_max_block_bytes), 0, alloc_conf_unbounded,
                     1, "256KiB",
                     "blocks larger than this bypass the per-thread caches (0: no caches)"),
  detail::conf_bytes("thread_cache_contended_max_block_bytes", nullptr,
                     GPUKIT_ALLOC_CONF_FIELD(thread_cache_contended_max_block_bytes), 0,
                     alloc_conf_unbounded, 1, "16MiB",
                     "a thread that finds the pool lock taken by another caches blocks up to "
                     "this size, doubling from `thread_cache_max_block_bytes` (at most that: "
                     "never raised)"),
  detail::conf_count("thread_cache_blocks_per_class",
                     GPUKIT_ALLOC_CONF_FIELD(thread_cache_blocks_per_class), 0, 255, "4",
                     "blocks one thread keeps per size class and stream"),
  detail::conf_flag("release_before_grow", GPUKIT_ALLOC_CONF_FIELD(release_before_grow), "false",
                    "when no free block fits, return fully free segments of the same kind before "
                    "taking a new one"),
  detail::conf_count("oom_wait_for_frees_ms", GPUKIT_ALLOC_CONF_FIELD(oom_wait_for_frees_ms), 0,
                     3600000, "100",
                     "out-of-memory recovery's last step: wait up to this many milliseconds for "
                     "blocks other threads return (0: do not wait)"),
  detail::conf_flag("nvtx_annotate", GPUKIT_ALLOC_CONF_FIELD(nvtx_annotate), "true",
                    "describe segments and blocks to NVTX's memory API, for compute-sanitizer "
                    "(default: on when an NVTX tool is configured, NVTX_INJECTION64_PATH)"),
};

/// Two options of which one must not be smaller than the other (a segment holds its requests).
struct alloc_conf_order {
  alloc_conf_field smaller;  ///< must not be larger than `larger`
  alloc_conf_field larger;   ///< must not be smaller than `smaller`
};

/// The orders the options' values keep, checked after every key of a string is applied and by
/// the allocator's constructor.
inline constexpr alloc_conf_order alloc_conf_orders[] = {
  {GPUKIT_ALLOC_CONF_FIELD(small_request_bytes), GPUKIT_ALLOC_CONF_FIELD(small_segment_bytes)},
  {GPUKIT_ALLOC_CONF_FIELD(small_request_bytes), GPUKIT_ALLOC_CONF_FIELD(medium_request_bytes)},
  {GPUKIT_ALLOC_CONF_FIELD(medium_request_bytes), GPUKIT_ALLOC_CONF_FIELD(medium_segment_bytes)},
};

/// The entry of alloc_conf_keys for `key` (its name or its alias, any case, spaces around it
/// ignored), or nullptr.
[[nodiscard]] alloc_conf_key const* find_alloc_conf_key(std::string_view key) noexcept;

/// The entry of alloc_conf_keys that owns `field`: its key that is not a shortcut. nullptr when
/// no key sets the member.
[[nodiscard]] alloc_conf_key const* find_alloc_conf_key(alloc_conf_field const& field) noexcept;

/// Applies one key to `o`: `value` parsed as `k` says and checked against its range.
/// @param o        the options to change
/// @param k        an entry of alloc_conf_keys
/// @param value    the value, as typed
/// @param key      the key as typed (what a message names); `k.key` when empty. Another
///                 vocabulary's key that sets the same option (PyTorch's, say) passes its own
/// @throws gpukit::logic_error naming `key`, the value and the range for a bad or out-of-range
///         value; `o` is unchanged then
void apply_alloc_conf_key(caching_allocator_options& o, alloc_conf_key const& k,
                          std::string_view value, std::string_view key = {});

/// `base` with the settings of `conf` applied (see the top of this header).
/// @throws gpukit::logic_error naming the key or value for an unknown key, a key given twice, two
///         keys that set one option, an entry without ':', a value that does not parse or is out
///         of range, or options out of the orders of alloc_conf_orders (options of `base` that
///         `conf` leaves are named by their member)
[[nodiscard]] caching_allocator_options parse_alloc_conf(std::string_view conf,
                                                         caching_allocator_options base = {});

/// parse_alloc_conf of the environment variable `variable` (default GPUKIT_ALLOC_CONF) over
/// `base`; `base` itself when the variable is unset or empty.
/// @throws gpukit::logic_error as parse_alloc_conf, with the variable's name in the message
[[nodiscard]] caching_allocator_options alloc_conf_from_env(
  char const* variable = alloc_conf_variable, caching_allocator_options base = {});

/// Every option of `o` that a key sets, as a configuration string (`key:value` per key of
/// alloc_conf_keys that is not a shortcut, in the table's order, sizes in the largest unit that
/// divides them): parse_alloc_conf reads it back to options equal to `o` in those members.
/// @throws gpukit::logic_error naming the member when `o` is out of range (as the allocator's
///         constructor refuses it)
[[nodiscard]] std::string to_alloc_conf(caching_allocator_options const& o);

/// A size such as "20MiB", "512", "2G" in bytes. @throws gpukit::logic_error for anything else
[[nodiscard]] std::size_t parse_alloc_conf_size(std::string_view text);

/// `bytes` as parse_alloc_conf_size reads it, in the largest unit that divides it exactly
/// ("20MiB", "1536KiB", "1000").
[[nodiscard]] std::string format_alloc_conf_size(std::size_t bytes);

/// What `k` accepts, as messages and docs/alloc_conf.md say it ("a whole number from 0 to 255").
[[nodiscard]] std::string alloc_conf_range(alloc_conf_key const& k);

/// docs/alloc_conf.md: the reference of every key, made from alloc_conf_keys and
/// alloc_conf_orders (Markdown).
[[nodiscard]] std::string alloc_conf_markdown();

namespace detail {

/// Checks every option a key sets against alloc_conf_keys and alloc_conf_orders, naming members
/// (the allocator's constructor).
/// @throws gpukit::logic_error naming the member, its value and the range
void validate_allocator_options(caching_allocator_options const& o);

/// The options of the default allocator of `device`: GPUKIT_ALLOC_CONF over the defaults, or the
/// defaults when it is unset or empty.
/// @throws gpukit::logic_error naming the device, the variable, the key and the value when the
///         variable does not parse
caching_allocator_options default_allocator_options(int device);

}  // namespace detail

}  // namespace gpukit

#include <gpukit/memory/detail/alloc_conf_impl.hpp>
