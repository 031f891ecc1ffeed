// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/alloc_conf.hpp: caching allocator options from a PyTorch-style string.
//
// Quick start:
//
//   #include <gpukit/memory/alloc_conf.hpp>
//
//   void run(gpukit::caching_allocator_options const& mine)
//   {
//     // GPUKIT_ALLOC_CONF="segments:growable,page_size:20MiB,limit:40GiB" python train.py
//     gpukit::caching_allocator_options o = gpukit::alloc_conf_from_env();
//     gpukit::caching_allocator alloc{gpukit::cuda_runtime::instance(), 0, o};
//
//     // or from any string, over options of your own:
//     auto o2 = gpukit::parse_alloc_conf("segments:synchronous, thread_cache:off", mine);
//     gpukit::caching_allocator other{gpukit::cuda_runtime::instance(), 0, o2};
//   }
//
// The string is `key:value` pairs separated by commas, as PYTORCH_CUDA_ALLOC_CONF; spaces around
// keys and values are ignored, and so are empty entries. Keys (see caching_allocator_options for
// what each one does):
//
// | key | value |
// |---|---|
// | segments | automatic, stream_ordered, synchronous, growable |
// | expandable_segments | true / false (PyTorch's name: growable / automatic) |
// | limit (or max_bytes) | a size: the most bytes the allocator may hold (0: none) |
// | limit_fraction (or fraction) | a fraction of the device's memory, in (0, 1] |
// | page_size (or growable_page_bytes) | a size: growable segments' mapping unit |
// | growable_reserve_bytes | a size: growable address space per stream and pool kind |
// | growable_shareable | true / false: growable pages exportable to other processes |
// | small_request_bytes, small_segment_bytes, medium_request_bytes, medium_segment_bytes,
// segment_rounding_bytes | sizes | | thread_cache | on / off (off: no per-thread caches) | |
// thread_cache_bytes, thread_cache_max_block_bytes | sizes | | thread_cache_blocks_per_class | a
// count | | release_before_grow | true / false | | oom_wait_for_frees_ms | milliseconds | |
// nvtx_annotate | true / false |
//
// Sizes are a whole number of bytes with an optional unit: B, K/KB/KiB, M/MB/MiB, G/GB/GiB (all
// powers of 1024, as PyTorch's `max_split_size_mb` counts). Booleans are true/false, 1/0, on/off,
// yes/no, in any case. An unknown key, a repeated key or a bad value throws gpukit::logic_error
// naming it, so a typo never silently leaves a setting at its default. Nothing here calls the
// runtime.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>

namespace gpukit {

/// The variable alloc_conf_from_env reads by default.
inline constexpr char const* alloc_conf_variable = "GPUKIT_ALLOC_CONF";

/// `base` with the settings of `conf` applied (see the top of this header).
/// @throws gpukit::logic_error naming the key or value for an unknown key, a key given twice, an
///         entry without ':' or a value that does not parse or is out of range
[[nodiscard]] caching_allocator_options parse_alloc_conf(std::string_view conf,
                                                         caching_allocator_options base = {});

/// parse_alloc_conf of the environment variable `variable` (default GPUKIT_ALLOC_CONF) over
/// `base`; `base` itself when the variable is unset or empty.
/// @throws gpukit::logic_error as parse_alloc_conf, with the variable's name in the message
[[nodiscard]] caching_allocator_options alloc_conf_from_env(
  char const* variable = alloc_conf_variable, caching_allocator_options base = {});

/// A size such as "20MiB", "512", "2G" in bytes. @throws gpukit::logic_error for anything else
[[nodiscard]] std::size_t parse_alloc_conf_size(std::string_view text);

/// The name of a segment source as the `segments` key spells it.
[[nodiscard]] char const* to_string(segment_source s) noexcept;

}  // namespace gpukit

#include <gpukit/memory/detail/alloc_conf.inl>
