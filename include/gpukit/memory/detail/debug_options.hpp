// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/debug_options.hpp: the caching allocator's debug-mode settings and the
// GPUKIT_DEBUG environment switch. Not public API by itself: users name
// `gpukit::caching_allocator_debug_options` through <gpukit/memory/caching_allocator.hpp>.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace gpukit {
namespace detail {

/// Whether `value` (an environment variable's text, or null when unset) turns a switch on: unset,
/// empty, "0", "false", "off" and "no" (any case) are off, anything else is on.
[[nodiscard]] inline bool env_switch_on(char const* value) noexcept
{
  if (value == nullptr || *value == '\0') { return false; }
  char lower[8]{};
  std::size_t n = 0;
  for (; value[n] != '\0'; ++n) {
    if (n + 1 >= sizeof lower) { return true; }  // longer than any "off" word
    char const c = value[n];
    lower[n]     = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  for (char const* off : {"0", "false", "off", "no"}) {
    if (std::strcmp(lower, off) == 0) { return false; }
  }
  return true;
}

}  // namespace detail

/// Whether GPUKIT_DEBUG asks for the allocators' debug mode (see `env_switch_on` for the words).
[[nodiscard]] inline bool debug_mode_requested() noexcept
{
  return detail::env_switch_on(std::getenv("GPUKIT_DEBUG"));
}

/// Debug mode of a caching allocator: freed blocks are poisoned and held back from reuse for a
/// while, so that a use after free reads garbage (and, under compute-sanitizer with
/// `nvtx_annotate`, is reported) and a double free is caught even after the block would have been
/// handed out again. Costs a memset per free and the quarantined memory; off by default, on when
/// GPUKIT_DEBUG is set (to anything but 0/false/off/no). With it off the allocator's paths are
/// unchanged but for one pointer test per free.
struct caching_allocator_debug_options {
  bool enabled{debug_mode_requested()};
  /// Byte written over a freed block, in the freeing stream's order (memset_async); -1: none.
  int poison_byte{0xfd};
  /// Freed blocks wait in a first-in first-out quarantine until it holds more than this many
  /// bytes or blocks; only then do they return to the pool. 0 and 0: no quarantine.
  std::size_t quarantine_bytes{std::size_t{64} << 20};
  std::size_t quarantine_blocks{1024};
  /// With `nvtx_annotate` on (a tool such as compute-sanitizer attached), take segments from
  /// cudaMalloc whatever `source` says: the tool describes blocks only inside cudaMalloc memory
  /// (it rejects NVTX heaps over cudaMallocAsync and virtual memory), so this is what makes it see
  /// overruns and uses after free inside stream-ordered and growable pools.
  bool sanitizer_segments{true};
};

}  // namespace gpukit
