// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/debug_options.hpp: the caching allocator's debug-mode settings and the
// GPUKIT_DEBUG environment switch. Not public API by itself: users name
// `gpukit::caching_allocator_debug_options` through <gpukit/memory/caching_allocator.hpp>.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

/// Whether `value` (GPUKIT_DEBUG's text) names guard pages: "guard", "guard_pages" or
/// "guard-pages" (any case).
[[nodiscard]] inline bool env_names_guard_pages(char const* value) noexcept
{
  if (value == nullptr) { return false; }
  char lower[16]{};
  for (std::size_t n = 0; value[n] != '\0'; ++n) {
    if (n + 1 >= sizeof lower) { return false; }
    char const c = value[n];
    lower[n]     = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  for (char const* word : {"guard", "guard_pages", "guard-pages"}) {
    if (std::strcmp(lower, word) == 0) { return true; }
  }
  return false;
}

}  // namespace detail

/// Whether GPUKIT_DEBUG asks for the allocators' debug mode (see `env_switch_on` for the words).
[[nodiscard]] inline bool debug_mode_requested() noexcept
{
  return detail::env_switch_on(std::getenv("GPUKIT_DEBUG"));
}

/// Whether GPUKIT_DEBUG asks for guard pages too (GPUKIT_DEBUG=guard): debug mode everywhere,
/// and guard pages in the allocators whose source is `segment_source::growable`.
[[nodiscard]] inline bool debug_guard_pages_requested() noexcept
{
  return detail::env_names_guard_pages(std::getenv("GPUKIT_DEBUG"));
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
  /// Guard pages (growable segments only; implies `enabled`): every block gets its own run of
  /// mapped pages inside the reservation, placed so that the block ENDS where its last page ends,
  /// and the page after the run stays reserved but unmapped. An access past the block's end then
  /// faults (cudaErrorIllegalAddress) with no tool attached. The block's start is aligned to
  /// `alignment` (256 bytes), so its size is the request rounded up to 256: an overrun faults at
  /// once when the request is a multiple of 256, else after the `size - bytes` (< 256) bytes of
  /// slack between the request's end and the page end. A free waits for its stream (and the
  /// streams of record_stream) and unmaps the block's pages at once, so a later access faults too
  /// (no poison, no quarantine: the pages are gone); new blocks take fresh addresses, going round
  /// the reservation before reusing any. Each block costs at least one page of the device's
  /// mapping granularity (2 MiB on current GPUs): both pool kinds map that page size. While a
  /// graph is being captured, blocks are placed as usual.
  /// With `source` other than `segment_source::growable` the allocator's constructor throws
  /// gpukit::logic_error. Over `sanitizer_segments`, guard pages win: the allocator stays on
  /// virtual memory (and NVTX annotation, which compute-sanitizer rejects there, is off).
  /// GPUKIT_DEBUG=guard turns it on in allocators whose source is growable (others get debug
  /// mode without guard pages).
  bool guard_pages{false};
};

}  // namespace gpukit
