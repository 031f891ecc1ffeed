// SPDX-License-Identifier: Apache-2.0
// gpukit/profile/memory_annotation.hpp: describe a pool's memory to NVTX tools (compute-sanitizer,
// Nsight Systems) with NVTX's memory API, and publish allocator statistics as NVTX counters.
//
// Quick start (what a pooling allocator calls):
//
//   #include <gpukit/memory/caching_allocator.hpp>
//   #include <gpukit/profile/memory_annotation.hpp>
//
//   void annotate(void* segment, std::size_t segment_bytes, void* block, std::size_t block_bytes)
//   {
//     // A segment taken from the device becomes a heap: the tool treats it as not accessible ...
//     gpukit::memory_heap heap = gpukit::register_memory_heap(segment, segment_bytes, "my pool");
//     // ... except for the blocks handed out from it:
//     gpukit::register_memory_region(heap, block, block_bytes);
//     gpukit::unregister_memory_region(block);  // the block is free again
//     gpukit::unregister_memory_heap(heap);     // the segment goes back to the device
//   }
//
//   void plot(gpukit::caching_allocator const& alloc, std::int64_t bytes)
//   {
//     // Statistics as counters (a tool plots them over time):
//     gpukit::nvtx_counter reserved{"my reserved bytes"};
//     reserved.sample(bytes);
//     gpukit::allocator_counters counters{"device 0"};  // allocated, reserved, active, requested
//     counters.sample(alloc.stats());
//   }
//
// With compute-sanitizer (`compute-sanitizer --tool memcheck --nvtx yes ./app`) a kernel that reads
// or writes past a block's end, inside its segment, is then reported, as it would be for a
// cudaMalloc'd buffer: without the annotation the whole segment looks valid.
//
// Cost: with no tool attached every function here is one load and a compare (NVTX's extension
// slots), after a one-time initialization on the process's first call; nothing allocates. All
// functions are thread-safe (NVTX's contract) and never throw. Define GPUKIT_DISABLE_NVTX (or
// NVTX_DISABLE) to compile them to nothing. Every function takes the NVTX domain as an optional
// template argument (default: gpukit::nvtx_domain).
#pragma once

#include <gpukit/profile/nvtx.hpp>

#include <nvtx3/nvToolsExtCounters.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace gpukit {

/// Whether an NVTX tool is configured for this process (NVTX_INJECTION64_PATH is set, as
/// compute-sanitizer and Nsight Systems do): the default of the pools' `nvtx_annotate` option.
[[nodiscard]] inline bool nvtx_tool_configured() noexcept
{
  return std::getenv("NVTX_INJECTION64_PATH") != nullptr;
}

/// A heap registered with NVTX (a tool's handle; the "no tool" handle when none is attached).
using memory_heap = nvtxMemHeapHandle_t;

#ifndef GPUKIT_DISABLE_NVTX
namespace detail {

/// A zeroed descriptor of NVTX's memory extension, its compatibility id and size filled in.
template <class Desc>
[[nodiscard]] Desc nvtx_mem_desc() noexcept
{
  Desc d{};
  d.extCompatID = NVTX_EXT_COMPATID_MEM;
  d.structSize  = sizeof(Desc);
  return d;
}

/// [p, p + bytes) as NVTX's memory calls describe a range of virtual addresses.
[[nodiscard]] inline nvtxMemVirtualRangeDesc_t nvtx_mem_range(void const* p,
                                                              std::size_t bytes) noexcept
{
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr  = p;
  range.size = bytes;
  return range;
}

/// A batch (register or resize: the same fields) whose one element is `range`, which must outlive
/// it; the caller sets the count, whose field names differ.
template <class Batch>
[[nodiscard]] Batch nvtx_mem_range_batch(nvtxMemVirtualRangeDesc_t const& range) noexcept
{
  auto batch                  = nvtx_mem_desc<Batch>();
  batch.regionType            = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements    = &range;
  return batch;
}
template <class Batch>
Batch nvtx_mem_range_batch(nvtxMemVirtualRangeDesc_t&&) = delete;  // it would dangle

}  // namespace detail

inline namespace nvtx_enabled {

/// Registers [base, base + bytes) as a sub-allocator heap (NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR,
/// virtual addresses): tools treat it as not accessible until regions are registered in it.
/// `name` (may be null) labels it. Returns the tool's handle (never null; "no tool" when none).
template <class D = nvtx_domain>
[[nodiscard]] inline memory_heap register_memory_heap(void const* base, std::size_t bytes,
                                                      char const* name = nullptr) noexcept
{
  nvtxMemVirtualRangeDesc_t const range = detail::nvtx_mem_range(base, bytes);
  auto desc                             = detail::nvtx_mem_desc<nvtxMemHeapDesc_t>();
  desc.usage                            = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type                             = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize             = sizeof(range);
  desc.typeSpecificDesc                 = &range;
  if (name != nullptr) {
    desc.messageType   = NVTX_MESSAGE_TYPE_ASCII;
    desc.message.ascii = name;
  }
  return nvtxMemHeapRegister(nvtx3::v1::domain::get<D>(), &desc);
}

/// Unregisters a heap from `register_memory_heap`, and with it every region inside it.
template <class D = nvtx_domain>
inline void unregister_memory_heap(memory_heap heap) noexcept
{
  nvtxMemHeapUnregister(nvtx3::v1::domain::get<D>(), heap);
}

/// Forgets every region of `heap` (as if freshly registered): for a pool that releases all its
/// blocks at once.
template <class D = nvtx_domain>
inline void reset_memory_heap(memory_heap heap) noexcept
{
  nvtxMemHeapReset(nvtx3::v1::domain::get<D>(), heap);
}

/// Registers [p, p + bytes), inside `heap`, as an allocation handed to a user (read-write).
template <class D = nvtx_domain>
inline void register_memory_region(memory_heap heap, void const* p, std::size_t bytes) noexcept
{
  nvtxMemVirtualRangeDesc_t const range = detail::nvtx_mem_range(p, bytes);
  auto batch        = detail::nvtx_mem_range_batch<nvtxMemRegionsRegisterBatch_t>(range);
  batch.heap        = heap;
  batch.regionCount = 1;
  nvtxMemRegionsRegister(nvtx3::v1::domain::get<D>(), &batch);
}

/// Changes the size of the region starting at `p` (e.g. a block grown in place).
template <class D = nvtx_domain>
inline void resize_memory_region(void const* p, std::size_t bytes) noexcept
{
  nvtxMemVirtualRangeDesc_t const range = detail::nvtx_mem_range(p, bytes);
  auto batch            = detail::nvtx_mem_range_batch<nvtxMemRegionsResizeBatch_t>(range);
  batch.regionDescCount = 1;
  nvtxMemRegionsResize(nvtx3::v1::domain::get<D>(), &batch);
}

/// Unregisters the region starting at `p`: its bytes are no longer accessible to users.
template <class D = nvtx_domain>
inline void unregister_memory_region(void const* p) noexcept
{
  nvtxMemRegionRef_t ref{};
  ref.pointer          = p;
  auto batch           = detail::nvtx_mem_desc<nvtxMemRegionsUnregisterBatch_t>();
  batch.refType        = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount       = 1;
  batch.refElementSize = sizeof(ref);
  batch.refElements    = &ref;
  nvtxMemRegionsUnregister(nvtx3::v1::domain::get<D>(), &batch);
}

/// Names the region starting at `p` (e.g. the tensor it holds).
template <class D = nvtx_domain>
inline void name_memory_region(void const* p, char const* name) noexcept
{
  nvtxMemRegionNameDesc_t element{};
  element.regionRefType   = NVTX_MEM_REGION_REF_TYPE_POINTER;
  element.nameType        = NVTX_MESSAGE_TYPE_ASCII;
  element.region.pointer  = p;
  element.name.ascii      = name;
  auto batch              = detail::nvtx_mem_desc<nvtxMemRegionsNameBatch_t>();
  batch.regionCount       = 1;
  batch.regionElementSize = sizeof(element);
  batch.regionElements    = &element;
  nvtxMemRegionsName(nvtx3::v1::domain::get<D>(), &batch);
}

/// An int64 NVTX counter in domain `D` (NVTX's counters extension, nvToolsExtCounters.h):
/// registered on construction, sampled with `sample`. Copyable (the id is shared).
template <class D = nvtx_domain>
class nvtx_counter_in {
 public:
  /// Registers a counter named `name` (with an optional description); both must outlive the call.
  explicit nvtx_counter_in(char const* name, char const* description = nullptr) noexcept
  {
    nvtxCounterAttr_t attr{};
    attr.structSize  = sizeof(attr);
    attr.schemaId    = NVTX_PAYLOAD_ENTRY_TYPE_INT64;
    attr.name        = name;
    attr.description = description;
    attr.scopeId     = NVTX_SCOPE_NONE;
    attr.counterId   = NVTX_COUNTER_ID_NONE;
    id_              = nvtxCounterRegister(nvtx3::v1::domain::get<D>(), &attr);
  }
  /// Records `value` now (the tool takes the timestamp).
  void sample(std::int64_t value) const noexcept
  {
    nvtxCounterSampleInt64(nvtx3::v1::domain::get<D>(), id_, value);
  }
  /// The tool's id for the counter (0 when no tool is attached).
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }

 private:
  std::uint64_t id_{0};
};

}  // namespace nvtx_enabled
#else   // GPUKIT_DISABLE_NVTX
inline namespace nvtx_disabled {
template <class D = nvtx_domain>
[[nodiscard]] inline memory_heap register_memory_heap(void const*, std::size_t,
                                                      char const* = nullptr) noexcept
{
  return reinterpret_cast<memory_heap>(static_cast<std::intptr_t>(-1));  // "no tool"
}
template <class D = nvtx_domain>
inline void unregister_memory_heap(memory_heap) noexcept
{}
template <class D = nvtx_domain>
inline void reset_memory_heap(memory_heap) noexcept
{}
template <class D = nvtx_domain>
inline void register_memory_region(memory_heap, void const*, std::size_t) noexcept
{}
template <class D = nvtx_domain>
inline void resize_memory_region(void const*, std::size_t) noexcept
{}
template <class D = nvtx_domain>
inline void unregister_memory_region(void const*) noexcept
{}
template <class D = nvtx_domain>
inline void name_memory_region(void const*, char const*) noexcept
{}
template <class D = nvtx_domain>
class nvtx_counter_in {
 public:
  explicit nvtx_counter_in(char const*, char const* = nullptr) noexcept {}
  void sample(std::int64_t) const noexcept {}
  [[nodiscard]] std::uint64_t id() const noexcept { return 0; }
};
}  // namespace nvtx_disabled
#endif  // GPUKIT_DISABLE_NVTX

/// An int64 counter in the gpukit domain.
using nvtx_counter = nvtx_counter_in<nvtx_domain>;

/// A caching allocator's statistics as NVTX counters: "<prefix> allocated bytes", "... reserved
/// bytes", "... active bytes", "... requested bytes". `sample(stats)` takes any type with
/// `allocated_bytes`, `reserved_bytes`, `active_bytes` and `requested_bytes` members that have a
/// `current` (gpukit::caching_allocator_stats). Names are kept in fixed buffers: no allocation.
template <class D = nvtx_domain>
class allocator_counters_in {
 public:
  /// Registers the four counters, their names prefixed with `prefix` (truncated to 80 bytes).
  explicit allocator_counters_in(char const* prefix = "gpukit") noexcept
      : allocated_{name(allocated_name_, prefix, " allocated bytes")},
        reserved_{name(reserved_name_, prefix, " reserved bytes")}, active_{name(active_name_,
                                                                                 prefix,
                                                                                 " active bytes")},
        requested_{name(requested_name_, prefix, " requested bytes")}
  {}
  /// Samples every counter from `stats`.
  template <class Stats>
  void sample(Stats const& stats) const noexcept
  {
    allocated_.sample(static_cast<std::int64_t>(stats.allocated_bytes.current));
    reserved_.sample(static_cast<std::int64_t>(stats.reserved_bytes.current));
    active_.sample(static_cast<std::int64_t>(stats.active_bytes.current));
    requested_.sample(static_cast<std::int64_t>(stats.requested_bytes.current));
  }

 private:
  static char const* name(char (&out)[112], char const* prefix, char const* suffix) noexcept
  {
    std::size_t n = 0;
    for (char const* p = prefix; p != nullptr && *p != '\0' && n < 80; ++p) out[n++] = *p;
    for (char const* s = suffix; *s != '\0' && n + 1 < sizeof out; ++s) out[n++] = *s;
    out[n] = '\0';
    return out;
  }
  char allocated_name_[112]{};
  char reserved_name_[112]{};
  char active_name_[112]{};
  char requested_name_[112]{};
  nvtx_counter_in<D> allocated_;
  nvtx_counter_in<D> reserved_;
  nvtx_counter_in<D> active_;
  nvtx_counter_in<D> requested_;
};
/// Allocator counters in the gpukit domain.
using allocator_counters = allocator_counters_in<nvtx_domain>;

}  // namespace gpukit
