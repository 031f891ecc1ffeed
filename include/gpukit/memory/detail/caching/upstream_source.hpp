// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/caching/upstream_source.hpp: the caching allocator's segments taken from a
// user's memory resource (any gpukit resource, or any CCCL memory resource: RMM's, an adaptor
// stack, cudaMallocAsync's), in place of the runtime. Not public API.
//
// The resource is held by reference (the user keeps it alive longer than the allocator) behind
// two function pointers: segments are taken and given back on the allocator's slow path only, so
// the hot path never meets the indirection. Each segment goes back with the size, alignment and
// stream it was taken with, through the entry point family it was taken from:
//
//   gpukit's       allocate_async(bytes, stream) / deallocate_async(p, bytes, stream)  (the
//                  allocator's own stream type: gpukit's resources over either runtime)
//   CCCL 3.0's     allocate_async(bytes, align, stream_ref) / deallocate_async(p, bytes, align,
//                  stream_ref)                                        (CUDA streams only)
//   CCCL 3.1's     allocate(stream_ref, bytes, align) / deallocate(stream_ref, p, bytes, align)
//   synchronous    allocate(bytes, align) / deallocate(p, bytes, align), or allocate_sync /
//                  deallocate_sync (the resource has no stream-ordered entry point)
//
// `stream_ordered()` says whether segments were taken in stream order (then the allocator gives
// them back on the stream that last used them, as with cudaMallocAsync's segments).
#pragma once

#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>

#include <cuda_runtime_api.h>
#include <cuda/stream_ref>

#include <cstddef>
#include <type_traits>

namespace gpukit::detail::caching {

/// A user's resource as the source of the caching allocator's segments (see the top of this file).
/// `Stream`: the allocator's stream type.
template <class Stream>
class upstream_source {
 public:
  static constexpr std::size_t alignment = 256;  ///< of every segment

  /// No resource: `engaged()` is false and the allocator uses its runtime.
  upstream_source() noexcept = default;

  /// Segments from `resource`, which must outlive this source and every segment it hands out.
  template <class Resource, std::enable_if_t<!std::is_same_v<Resource, upstream_source>, int> = 0>
  explicit upstream_source(Resource& resource) noexcept
      : resource_{&resource}, allocate_{&calls<Resource>::allocate},
        deallocate_{&calls<Resource>::deallocate}, stream_ordered_{calls<Resource>::stream_ordered}
  {
    static_assert(calls<Resource>::usable,
                  "the caching allocator's upstream must be a memory resource: allocate_async("
                  "bytes, stream) with this allocator's stream type, CCCL's allocate_async(bytes, "
                  "alignment, stream_ref) or allocate(stream_ref, bytes, alignment), or "
                  "allocate(bytes, alignment)");
  }

  /// Whether a resource was given.
  [[nodiscard]] bool engaged() const noexcept { return resource_ != nullptr; }
  /// Whether segments are taken and given back in stream order.
  [[nodiscard]] bool stream_ordered() const noexcept { return stream_ordered_; }

  /// A segment of `bytes` usable in `stream` order. Throws what the resource throws (an
  /// out-of-memory error derives from std::bad_alloc).
  [[nodiscard]] void* allocate(std::size_t bytes, Stream stream) const
  {
    return allocate_(resource_, bytes, stream);
  }
  /// Gives back a segment taken with allocate(bytes, ...), in `stream` order.
  void deallocate(void* p, std::size_t bytes, Stream stream) const
  {
    deallocate_(resource_, p, bytes, stream);
  }

 private:
  template <class R>
  struct calls {
    static constexpr bool own            = has_gpukit_async_v<R, Stream>;
    static constexpr bool cuda           = std::is_same_v<Stream, cudaStream_t>;
    static constexpr bool ccl30a         = cuda && has_cccl30_async_v<R, cuda::stream_ref>;
    static constexpr bool ccl31a         = cuda && has_cccl31_async_v<R, cuda::stream_ref>;
    static constexpr bool ccl30s         = has_cccl30_sync_v<R>;
    static constexpr bool ccl31s         = has_cccl31_sync_v<R>;
    static constexpr bool stream_ordered = own || ccl30a || ccl31a;
    static constexpr bool usable         = stream_ordered || ccl30s || ccl31s;

    static void* allocate(void* r, std::size_t bytes, Stream s)
    {
      auto& res = *static_cast<R*>(r);
      if constexpr (own) {
        return res.allocate_async(bytes, s);
      } else if constexpr (ccl30a) {
        return res.allocate_async(bytes, alignment, cuda::stream_ref{s});
      } else if constexpr (ccl31a) {
        return res.allocate(cuda::stream_ref{s}, bytes, alignment);
      } else if constexpr (ccl30s) {
        return res.allocate(bytes, alignment);
      } else {
        return res.allocate_sync(bytes, alignment);
      }
    }
    static void deallocate(void* r, void* p, std::size_t bytes, Stream s)
    {
      auto& res = *static_cast<R*>(r);
      if constexpr (own) {
        res.deallocate_async(p, bytes, s);
      } else if constexpr (ccl30a) {
        res.deallocate_async(p, bytes, alignment, cuda::stream_ref{s});
      } else if constexpr (ccl31a) {
        res.deallocate(cuda::stream_ref{s}, p, bytes, alignment);
      } else if constexpr (ccl30s) {
        res.deallocate(p, bytes, alignment);
      } else {
        res.deallocate_sync(p, bytes, alignment);
      }
    }
  };

  void* resource_{nullptr};
  void* (*allocate_)(void*, std::size_t, Stream){nullptr};
  void (*deallocate_)(void*, void*, std::size_t, Stream){nullptr};
  bool stream_ordered_{false};
};

}  // namespace gpukit::detail::caching
