// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/caching_allocator_options.hpp: the settings of a caching allocator.
//
// Quick start:
//
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <cstddef>
//
//   void run()
//   {
//     gpukit::caching_allocator_options o;
//     o.source      = gpukit::segment_source::growable;  // GPUKIT_ALLOC_CONF: segments:growable
//     o.limit_bytes = std::size_t{40} << 30;              // GPUKIT_ALLOC_CONF: limit:40GiB
//     gpukit::caching_allocator alloc{gpukit::cuda_runtime::instance(), 0, o};
//   }
//
// Each option that a configuration string can set has one key in gpukit::alloc_conf_keys
// (gpukit/memory/alloc_conf.hpp), which also holds its range: the allocator's constructor checks
// options set from C++ against the same table and names the member, parse_alloc_conf names the
// key. docs/alloc_conf.md lists the keys, their ranges and defaults. This header holds only the
// settings; it includes no runtime and calls nothing.
#pragma once

#include <gpukit/memory/detail/debug_options.hpp>
#include <gpukit/profile/memory_annotation.hpp>

#include <cstddef>

namespace gpukit {

/// Where a caching allocator takes its segments from.
enum class segment_source {
  automatic,       ///< stream_ordered when the device supports memory pools, else synchronous
  stream_ordered,  ///< malloc_async / free_async on the requesting stream (cudaMallocAsync)
  synchronous,     ///< malloc / free (cudaMalloc / cudaFree; cudaFree may synchronize the device)
  /// Growable segments on CUDA virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap): one
  /// large address range per stream and pool kind, physical pages mapped on demand at its end, so
  /// that a block never has to fit inside a fixed segment. Free pages are unmapped by `release`,
  /// `trim` and the out-of-memory ladder, and reused (unmapped and mapped again where they are
  /// needed) before the allocator takes new pages from the device. See "Growable segments" in
  /// gpukit/memory/caching_allocator.hpp.
  growable,
  /// Segments from a memory resource given to the allocator's constructor (not a setting: what
  /// segment_source_in_use() says of such an allocator).
  upstream,
};

/// The name of a segment source as the `segments` key spells it ("growable"); "unknown" for a
/// value that is not a segment_source.
[[nodiscard]] inline char const* to_string(segment_source s) noexcept
{
  switch (s) {
    case segment_source::automatic: return "automatic";
    case segment_source::stream_ordered: return "stream_ordered";
    case segment_source::synchronous: return "synchronous";
    case segment_source::growable: return "growable";
    case segment_source::upstream: return "upstream";
  }
  return "unknown";
}

/// Settings of a caching allocator. Defaults suit training loops. The ranges of the members that
/// configuration strings set are in gpukit::alloc_conf_keys; the allocator's constructor refuses
/// a value outside them, naming the member.
struct caching_allocator_options {
  /// Largest number of bytes the allocator may hold from the device (0: no limit).
  std::size_t limit_bytes{0};
  /// Limit as a fraction of the device's total memory (0: no limit). The smaller limit applies.
  double limit_fraction{0.0};
  segment_source source{segment_source::automatic};
  /// Requests up to this size are "small": served from `small_segment_bytes` segments.
  std::size_t small_request_bytes{std::size_t{1} << 20};
  std::size_t small_segment_bytes{std::size_t{2} << 20};
  /// Requests between small and this size share `medium_segment_bytes` segments; larger
  /// requests get a segment of their own, rounded up to `segment_rounding_bytes`.
  std::size_t medium_request_bytes{std::size_t{10} << 20};
  std::size_t medium_segment_bytes{std::size_t{20} << 20};
  std::size_t segment_rounding_bytes{std::size_t{2} << 20};
  /// Blocks larger than this bypass the per-thread caches. Cached blocks cannot coalesce, so
  /// caching only small blocks (which live in their own small segments) keeps large segments
  /// whole: on the PyTorch traces, caching up to 32 MiB raised peak reserved by 6%.
  std::size_t thread_cache_max_block_bytes{std::size_t{1} << 20};
  /// A thread that finds the pool lock held by another thread caches larger blocks (which then
  /// need no lock): its admission doubles from thread_cache_max_block_bytes up to this, and halves
  /// back after 256 slow paths in a row that find the lock free. A thread alone keeps
  /// thread_cache_max_block_bytes. At most thread_cache_max_block_bytes: never raised.
  std::size_t thread_cache_contended_max_block_bytes{std::size_t{4} << 20};
  /// When no free block fits, return fully free segments of the same kind before taking a new
  /// one (each such segment is too small for the request). Lowers peak reserved memory at the
  /// cost of a device free and a later device allocation; stream-ordered, so it never waits.
  bool release_before_grow{true};
  /// Describe segments and blocks to NVTX's memory API (nvToolsExtMem.h), so that tools such as
  /// compute-sanitizer (`--nvtx yes`) report accesses beyond a block even inside its segment.
  /// On by default when an NVTX tool is configured (NVTX_INJECTION64_PATH is set, as
  /// compute-sanitizer and Nsight Systems do), off otherwise: about 36 instructions per
  /// allocation and free even with no tool attached. Compiled out with GPUKIT_DISABLE_NVTX.
  /// compute-sanitizer accepts heaps only over cudaMalloc memory (seen on the H200: it rejects
  /// nvtxMemHeapRegister over cudaMallocAsync and virtual memory), so only synchronous segments
  /// are described; debug mode (`debug.sanitizer_segments`) takes segments from cudaMalloc for
  /// every source, so that the tool sees every block.
  bool nvtx_annotate{nvtx_tool_configured()};
  /// Out-of-memory recovery's last step: wait up to this long for blocks other threads are
  /// returning to the pool (their cached blocks come back at their next call). 0: do not wait.
  int oom_wait_for_frees_ms{0};
  /// Growable segments: address space reserved per stream and pool kind (0: 9/8 of the device's
  /// memory, as PyTorch's expandable segments reserve). A request larger than this gets a range of
  /// its own. Address space costs no memory.
  std::size_t growable_reserve_bytes{0};
  /// Growable segments: the unit of mapping of the large pool (rounded up to the device's
  /// granularity, 2 MiB on current GPUs; the small pool maps one granule at a time). Each page is
  /// one cuMemCreate, cuMemMap and cuMemSetAccess (about 50 us together on an H100), so larger
  /// pages make growth cheaper and smaller ones lose less memory at the edges of free ranges.
  /// Replaying the PyTorch traces on an H100 (GPT-2, Llama with varying lengths, ResNet-50;
  /// benchmarks/results/), peak reserved / peak live and time per event against fixed segments
  /// were: 8 MiB 1.003-1.008 at 1.0-3.1x the time; 20 MiB (PyTorch's expandable segments' page)
  /// 1.006-1.012 at 0.4-1.7x; 32 MiB (the default) 1.005-1.013 at 0.5-0.8x.
  std::size_t growable_page_bytes{std::size_t{32} << 20};
  /// Growable segments: create each page exportable as a POSIX file descriptor
  /// (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), so that blocks can be shared with other processes
  /// (gpukit/memory/ipc.hpp). Off by default, as in CUDA.
  bool growable_shareable{false};
  /// Bytes one thread may keep cached per allocator before it returns blocks to the pool.
  std::size_t thread_cache_bytes{std::size_t{64} << 20};
  /// Blocks one thread keeps per size class and stream.
  int thread_cache_blocks_per_class{8};
  /// Debug mode: poisoning and quarantine of freed blocks, guard pages (GPUKIT_DEBUG=1, =guard).
  caching_allocator_debug_options debug{};
};

}  // namespace gpukit
