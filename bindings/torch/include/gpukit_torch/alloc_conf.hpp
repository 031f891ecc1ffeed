// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/alloc_conf.hpp: the PyTorch backend's settings: its defaults, PyTorch's own
// allocator keys (PYTORCH_CUDA_ALLOC_CONF), and PyTorch's size rounding.
//
// Quick start:
//
//   #include <gpukit/runtime/cuda_runtime.hpp>
//   #include <gpukit_torch/alloc_conf.hpp>
//   #include <gpukit_torch/backend.hpp>
//
//   // The defaults, then PYTORCH_CUDA_ALLOC_CONF (or its aliases), then GPUKIT_ALLOC_CONF:
//   gpukit_torch::backend_conf c = gpukit_torch::backend_conf_from_env();
//   c = gpukit_torch::parse_backend_conf("roundup_power2_divisions:[256:4,>:8]", c);
//   std::size_t const n = c.rounding.round_size(1000);  // 1024: PyTorch's block size
//   gpukit_torch::backend<gpukit::cuda_runtime> b{gpukit::cuda_runtime::instance(), c};
//
// A configuration string holds `key:value` entries separated by commas, as PyTorch's. Each key
// is either one of PyTorch 2.11's allocator keys (pytorch_keys below says what gpukit does with
// each: apply it with PyTorch's meaning, leave it to PyTorch's pinned-memory allocator, or refuse
// it with the reason gpukit does not need it) or one of gpukit's (gpukit::alloc_conf_keys,
// docs/alloc_conf.md). PyTorch's keys that set gpukit's options go through gpukit's table too: its
// parsers and its ranges. A key that sets what another key of the same string sets is refused,
// naming both. Nothing here calls the runtime or PyTorch.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/alloc_conf.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace gpukit_torch {

/// The backend's settings before the environment's and install()'s, one key per line:
/// - segments:growable: virtual-memory segments that map pages where the pool grows and give
///   back the pages of free ranges, as PyTorch's expandable_segments:True, so that varying
///   request sizes do not strand memory in cudaMalloc segments of the wrong size. Where the
///   device or driver has no virtual memory management the backend falls back to
///   `segments:synchronous` (cudaMalloc segments, PyTorch's default) and says so once.
/// - release_before_grow:false: PyTorch gives cached segments back only on out-of-memory and
///   empty_cache(). With synchronous segments each release is a cudaFree, which synchronizes the
///   device, so releasing before every growth would stall training steps; with growable segments
///   the key has no effect (free pages move to where the pool grows without a release).
/// - page_size:8MiB: the large pool maps 8 MiB pages, not gpukit's default 32 MiB. In training
///   the pool reaches a steady state after the first steps (7-27 pages mapped per 200 ms step of
///   GPT-2 with varying lengths, none unmapped), so growth costs little, while memory at the edges
///   of free ranges stays: on an H100 GPT-2 with varying lengths peaked 0.7% above expandable
///   segments with 32 MiB pages and 0.1% below with 8 MiB, at step times within run noise of each
///   other (benchmarks/results/). 32 MiB pages pay off where a pool keeps growing from cold.
/// The other growable settings keep gpukit's defaults: address space per stream and pool kind of
/// 9/8 of the device's memory (growable_reserve_bytes:0, as PyTorch reserves).
/// - growable_shareable:true: growable pages are created exportable as POSIX descriptors, as
///   PyTorch's expandable segments are, so that torch.multiprocessing shares them.
inline constexpr char const backend_default_conf[] =
  "segments:growable,"
  "release_before_grow:false,"
  "page_size:8MiB,"
  "growable_shareable:true";

/// The variables PyTorch 2.11 reads its allocator settings from, in order: the first one set
/// (and not empty) is used.
inline constexpr char const* pytorch_conf_variables[] = {
  "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};

/// PyTorch's smallest block and rounding unit (kMinBlockSize).
inline constexpr std::size_t pytorch_min_block_bytes = 512;

/// PyTorch's rounding of a request to the size of the block that serves it (round_size):
/// 512 bytes at least and a multiple of 512, or, where roundup_power2_divisions gives N > 1
/// divisions for the request's size, the next of N equal steps between two powers of two.
struct size_rounding {
  /// Divisions by size interval: [i] for sizes from 2^i MiB (i = 0 also below 1 MiB, i = 15 also
  /// from 32 GiB on), as PyTorch indexes them. 0 or 1: plain 512-byte rounding.
  std::array<std::size_t, 16> divisions{};

  /// The block size PyTorch gives a request of `bytes` (bytes > 0); `bytes` itself beyond 2^63,
  /// which no device holds (rounding would overflow).
  [[nodiscard]] std::size_t round_size(std::size_t bytes) const noexcept;
  /// The divisions that apply to a request of `bytes`.
  [[nodiscard]] std::size_t divisions_for(std::size_t bytes) const noexcept;
};

/// What the backend makes of a configuration.
struct backend_conf {
  gpukit::caching_allocator_options options;  ///< each device's caching allocator's
  size_rounding rounding;                     ///< roundup_power2_divisions
  /// Entries for PyTorch's pinned-memory allocator, which gpukit leaves in place ("key:value,..."
  /// in the order given); PyTorch reads PYTORCH_CUDA_ALLOC_CONF itself, install() passes the rest.
  std::string host_settings;
};

/// What gpukit does with one of PyTorch's keys.
enum class pytorch_key_use {
  applied,         ///< takes effect in gpukit, with PyTorch's meaning
  host_allocator,  ///< PyTorch's pinned-memory allocator (not replaced by gpukit) applies it
  default_only,    ///< PyTorch's default value is what gpukit does; any other value is refused
  refused,         ///< any value is refused
};

/// One of PyTorch 2.11's allocator keys and what gpukit does with it.
struct pytorch_key {
  char const* key;
  pytorch_key_use use;
  char const* accepted;  ///< default_only: the values accepted (PyTorch's default); else ""
  char const* effect;    ///< what gpukit does with it
  char const* reason;    ///< why (for refused values: why gpukit does not need them)
};

/// Every key of PyTorch 2.11's allocator configuration (CUDA, ROCm spellings, and the generic
/// ones), in the order of bindings/torch/README.md's table.
inline constexpr pytorch_key pytorch_keys[] = {
  {"expandable_segments", pytorch_key_use::applied, "",
   "True: `segments:growable`; False: `segments:synchronous` (cudaMalloc segments)",
   "PyTorch's two segment kinds are gpukit's growable and synchronous sources"},
  {"roundup_power2_divisions", pytorch_key_use::applied, "",
   "rounds requests as PyTorch does (`N` or `[64:8,256:4,>:1]`, sizes in MiB); "
   "memory_stats() counts the rounded sizes",
   "the rounding decides block sizes and so memory_allocated()"},
  {"per_process_memory_fraction", pytorch_key_use::applied, "",
   "limits each device to this fraction of its memory, as "
   "torch.cuda.set_per_process_memory_fraction",
   "gpukit enforces limits itself (`fraction`); 0 is refused: no allocation could succeed"},
  {"large_segment_size_mb", pytorch_key_use::applied, "",
   "the segment that 1-10 MiB requests share (`medium_segment_bytes`) and the growable large "
   "pool's page (`page_size`)",
   "gpukit sizes segments as PyTorch does"},
  {"max_split_size_mb", pytorch_key_use::refused, "", "refused",
   "it works around cudaMalloc segments fragmented by large blocks split for smaller requests; "
   "gpukit's default growable segments map pages where the pool grows and give back free ones, "
   "so no block size needs to stay unsplit"},
  {"max_non_split_rounding_mb", pytorch_key_use::refused, "", "refused",
   "gpukit always cuts a cached block to the request's size, so no request is given a larger "
   "block that this key would bound"},
  {"garbage_collection_threshold", pytorch_key_use::refused, "", "refused",
   "gpukit returns cached memory when an allocation would otherwise fail (free segments of the "
   "requesting stream, then of every stream) and growable segments move free pages to where the "
   "pool grows, so there is no threshold to tune"},
  {"backend", pytorch_key_use::default_only, "native", "accepted as `native` only",
   "gpukit is the allocator behind PyTorch's native interface; stream-ordered cudaMallocAsync "
   "segments are `segments:stream_ordered`"},
  {"release_lock_on_cudamalloc", pytorch_key_use::default_only, "False", "accepted as False only",
   "blocks up to 1 MiB (up to 4 MiB for a thread that meets contention) come from per-thread "
   "caches that do not wait for the lock held while a segment is taken"},
  {"release_lock_on_hipmalloc", pytorch_key_use::default_only, "False", "accepted as False only",
   "ROCm's spelling of release_lock_on_cudamalloc"},
  {"graph_capture_record_stream_reuse", pytorch_key_use::default_only, "False",
   "accepted as False only",
   "gpukit reuses a block freed inside a capture with uses on other streams once the capture "
   "ends, as PyTorch's default does"},
  {"pinned_use_cuda_host_register", pytorch_key_use::host_allocator, "",
   "applied by PyTorch's pinned-memory allocator", "gpukit replaces only the device allocator"},
  {"pinned_use_hip_host_register", pytorch_key_use::host_allocator, "",
   "applied by PyTorch's pinned-memory allocator", "gpukit replaces only the device allocator"},
  {"pinned_num_register_threads", pytorch_key_use::host_allocator, "",
   "applied by PyTorch's pinned-memory allocator", "gpukit replaces only the device allocator"},
  {"pinned_use_background_threads", pytorch_key_use::host_allocator, "",
   "applied by PyTorch's pinned-memory allocator", "gpukit replaces only the device allocator"},
  {"pinned_reserve_segment_size_mb", pytorch_key_use::host_allocator, "",
   "applied by PyTorch's pinned-memory allocator", "gpukit replaces only the device allocator"},
};

/// The entry of pytorch_keys for `key` (as typed, any case), or nullptr.
[[nodiscard]] pytorch_key const* find_pytorch_key(std::string_view key) noexcept;

/// `base` with the settings of `conf` applied: PyTorch's keys as pytorch_keys says, gpukit's
/// through gpukit::parse_alloc_conf. Entries are split at commas outside brackets (so that
/// `roundup_power2_divisions:[256:4,>:8]` is one entry).
/// @throws gpukit::logic_error naming the key (and the value) for a refused key or value, an
///         unknown key, a key given twice, two keys that set one thing, or a bad value
[[nodiscard]] backend_conf parse_backend_conf(std::string_view conf, backend_conf base = {});

/// The backend's settings from the environment: `base` (default: backend_default_conf), then
/// the first of pytorch_conf_variables that is set, then GPUKIT_ALLOC_CONF.
/// @throws gpukit::logic_error as parse_backend_conf, naming the variable and its value
[[nodiscard]] backend_conf backend_conf_from_env();
[[nodiscard]] backend_conf backend_conf_from_env(backend_conf base);

/// The settings backend_conf_from_env reads, as one string: "<defaults>,<PyTorch's
/// variable>,<GPUKIT_ALLOC_CONF>" with the unset ones left out.
[[nodiscard]] std::string effective_conf_from_env();

/// `c` as one configuration string that parse_backend_conf reads back to the same settings:
/// gpukit's keys as gpukit::to_alloc_conf writes them (every option), then
/// `roundup_power2_divisions` when it rounds, then the entries for PyTorch's pinned-memory
/// allocator. What install() reports as the settings in effect.
/// @throws gpukit::logic_error naming the member when `c.options` is out of range
[[nodiscard]] std::string to_alloc_conf(backend_conf const& c);

/// bindings/torch/README.md's table of PyTorch's keys, made from pytorch_keys (Markdown, one row
/// per key, with its header).
[[nodiscard]] std::string pytorch_keys_markdown();

}  // namespace gpukit_torch

#include "detail/alloc_conf_impl.hpp"
