// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/malloc_async_resource.hpp: a stream-ordered device memory resource over the
// runtime's own pool (cudaMallocAsync / cudaFreeAsync; RMM's cuda_async_memory_resource), for
// code that wants no caching of gpukit's, and as an upstream for the resource adaptors.
//
// Quick start:
//
//   #include <gpukit/memory/malloc_async_resource.hpp>
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   void run(cudaStream_t stream)
//   {
//     gpukit::malloc_async_resource mr{gpukit::cuda_runtime::instance(), 0};  // device 0
//     void* p = mr.allocate_async(1 << 20, stream);  // cudaMallocAsync on `stream`
//     mr.deallocate_async(p, 1 << 20, stream);       // cudaFreeAsync on `stream`
//
//     // The same on the simulated GPU:
//     gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
//     gpukit::basic_malloc_async_resource<gpukit::sim_runtime> sim_mr{sim, 0};
//     void* q = sim_mr.allocate(4096);  // on the default stream
//     sim_mr.deallocate(q, 4096);
//   }
//
// Memory comes from the pool of the stream's device (for the default stream: of the calling
// thread's current device), as cudaMallocAsync does: use streams of device(). It satisfies CCCL's
// stream-ordered, device-accessible resource concept (over cuda_runtime).
#pragma once

#include <gpukit/detail/alignment_check.hpp>
#include <gpukit/detail/cccl_compat.hpp>
#include <gpukit/detail/hex.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>  // detail::adaptor_oom_report
#include <gpukit/memory/detail/cccl_entry_points.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace gpukit {

/// Device memory from the runtime's stream-ordered allocator, with no pool of gpukit's (see the
/// top of this header). Stateless but for its runtime and device; thread-safe. Every allocation
/// is at least 256-byte aligned. Two resources are equal when they use the same runtime and
/// device (memory from one may be freed through the other).
///
/// @tparam Runtime cuda_runtime or sim_runtime (any runtime with malloc_async and free_async)
template <class Runtime>
class basic_malloc_async_resource final
    : public detail::cccl_entry_points<basic_malloc_async_resource<Runtime>> {
 public:
  using runtime_type = Runtime;
  using stream_type  = typename Runtime::stream_type;

  /// Alignment of every allocation; the largest `align` the CCCL entry points accept.
  static constexpr std::size_t alignment = 256;

  /// A resource for `device` of `runtime` (which must outlive it). Allocates nothing.
  explicit basic_malloc_async_resource(Runtime& runtime, int device = 0) noexcept
      : runtime_{&runtime}, device_{device}
  {}
  ~basic_malloc_async_resource() = default;

  basic_malloc_async_resource(basic_malloc_async_resource const&)                = default;
  basic_malloc_async_resource& operator=(basic_malloc_async_resource const&)     = default;
  basic_malloc_async_resource(basic_malloc_async_resource&&) noexcept            = default;
  basic_malloc_async_resource& operator=(basic_malloc_async_resource&&) noexcept = default;

  /// `bytes` of device memory usable in `stream` order (malloc_async); null for 0 bytes. Does not
  /// synchronize.
  /// @throws gpukit::out_of_memory naming the request and the device's free memory when the
  ///         runtime has no room
  /// @throws gpukit::cuda_error for any other failure (e.g. a stream being captured)
  [[nodiscard]] void* allocate_async(std::size_t bytes, stream_type stream)
  {
    void* p = nullptr;
    if (bytes == 0) { return p; }
    auto const e = runtime_->malloc_async(&p, bytes, stream);
    if (e == Runtime::out_of_memory) { throw out_of_memory{report(bytes)}; }
    GPUKIT_CUDA_TRY(
      e, "malloc_async(" + std::to_string(bytes) + " bytes) on device " + std::to_string(device_));
    return p;
  }
  /// Frees `ptr` in `stream` order (free_async); a null ptr is ignored. Does not synchronize.
  /// @throws gpukit::cuda_error when the runtime refuses (e.g. a pointer it did not allocate)
  void deallocate_async(void* ptr, std::size_t /*bytes*/, stream_type stream)
  {
    if (ptr == nullptr) { return; }
    GPUKIT_CUDA_TRY(runtime_->free_async(ptr, stream), "free_async(" + detail::hex(ptr) + ")");
  }
  /// allocate_async on the default stream. Does not synchronize.
  [[nodiscard]] void* allocate(std::size_t bytes) { return allocate_async(bytes, stream_type{}); }
  /// deallocate_async on the default stream.
  void deallocate(void* ptr, std::size_t bytes) { deallocate_async(ptr, bytes, stream_type{}); }

  // The CCCL memory-resource interface (CCCL 3.0's and 3.1's names, as basic_caching_allocator
  // has them), which detail::cccl_entry_points writes from allocate_async and deallocate_async.
  // `align` may be any power of two up to 256 (else gpukit::logic_error).
  friend detail::cccl_entry_points<basic_malloc_async_resource>;  // check_alignment
  using detail::cccl_entry_points<basic_malloc_async_resource>::allocate;
  using detail::cccl_entry_points<basic_malloc_async_resource>::allocate_async;
  using detail::cccl_entry_points<basic_malloc_async_resource>::deallocate;
  using detail::cccl_entry_points<basic_malloc_async_resource>::deallocate_async;

  /// The runtime it allocates from.
  [[nodiscard]] Runtime& runtime() const noexcept { return *runtime_; }
  /// The device it allocates on.
  [[nodiscard]] int device() const noexcept { return device_; }

  /// The memory is device accessible (for CCCL's property queries).
  friend void get_property(basic_malloc_async_resource const&,
                           detail::cccl_device_accessible) noexcept
  {}
  /// Equal when they use the same runtime and device.
  friend bool operator==(basic_malloc_async_resource const& a,
                         basic_malloc_async_resource const& b) noexcept
  {
    return a.runtime_ == b.runtime_ && a.device_ == b.device_;
  }
  friend bool operator!=(basic_malloc_async_resource const& a,
                         basic_malloc_async_resource const& b) noexcept
  {
    return !(a == b);
  }

 private:
  static void check_alignment(std::size_t align)
  {
    detail::check_alignment("malloc_async_resource", align, alignment);
  }

  oom_report report(std::size_t bytes) const
  {
    oom_report r = detail::adaptor_oom_report(*this, bytes);  // the device's memory
    r.hint       = "the runtime's pool has no room for " + std::to_string(bytes) +
             " bytes; free memory, or trim the pool (cudaMemPoolTrimTo)";
    return r;
  }

  Runtime* runtime_;
  int device_;
};

/// The malloc_async resource over the CUDA runtime.
using malloc_async_resource = basic_malloc_async_resource<cuda_runtime>;

}  // namespace gpukit

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::malloc_async_resource>,
              "gpukit::malloc_async_resource must be a CCCL stream-ordered memory resource");
#endif
