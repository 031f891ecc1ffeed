// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/adaptors/failure_callback_resource_adaptor.hpp: on out of memory, calls the user's
// callback and tries again while it says so (RMM's failure_callback_resource_adaptor), over any
// gpukit or CCCL memory resource.
//
// Quick start:
//
//   #include <gpukit/memory/adaptors/failure_callback_resource_adaptor.hpp>
//   #include <gpukit/memory/caching_allocator.hpp>
//
//   #include <cstddef>
//
//   void step(gpukit::caching_allocator& alloc, cudaStream_t stream, std::size_t bytes)
//   {
//     int tries = 0;
//     gpukit::failure_callback_resource_adaptor retrying{
//       alloc, [&](gpukit::oom_context const& c) {
//         (void)c.requested;   // what failed; c.device, c.reserved, c.limit from its report
//         // ... free what you can: spill a cache, drop activations ...
//         return ++tries < 3;  // true: try the allocation again; false: let the error go
//       }};
//     void* p = retrying.allocate_async(bytes, stream);  // gpukit::out_of_memory after 3 tries
//     retrying.deallocate_async(p, bytes, stream);
//   }
//
// The caching allocator has its own out-of-memory ladder with callbacks (add_oom_callback), run
// before it gives up; this adaptor works over any resource, and over adaptors (a
// limiting_resource_adaptor's refusal is an out_of_memory too).
//
// What adaptors share (upstream by reference, entry points and CCCL concepts of the upstream, no
// virtual call) is at the top of gpukit/memory/adaptors/limiting_resource_adaptor.hpp.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/adaptors/detail/resource_adaptor_base.hpp>
#include <gpukit/memory/caching_allocator.hpp>  // oom_context, oom_callback

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gpukit {

/// Calls `Callback` when an allocation fails with `Exception`, and tries the allocation again
/// while the callback returns true; rethrows the error once it returns false (see the top of this
/// header). The callback runs on the allocating thread, with no lock of the adaptor held (it may
/// free through the adaptor), and may be called by several threads at once. When Exception is
/// gpukit::out_of_memory (or derives from it), the callback's oom_context carries its report's
/// device, reserved bytes and limit; otherwise the upstream's device (-1 when it does not say).
/// Deallocations pass through. Thread-safe when the upstream and the callback are.
///
/// @tparam Upstream any resource with gpukit's or CCCL's interface (held by reference)
/// @tparam Callback invocable as `bool(gpukit::oom_context const&)` (a lambda's type, deduced)
/// @tparam Exception the error that means "out of memory" for the upstream (CCCL's resources
///         throw std::bad_alloc or cuda::cuda_error)
template <class Upstream, class Callback = oom_callback, class Exception = out_of_memory>
class failure_callback_resource_adaptor final
    : public detail::resource_adaptor_base<
        failure_callback_resource_adaptor<Upstream, Callback, Exception>, Upstream> {
  using base =
    detail::resource_adaptor_base<failure_callback_resource_adaptor<Upstream, Callback, Exception>,
                                  Upstream>;
  friend base;
  static_assert(std::is_invocable_r_v<bool, Callback&, oom_context const&>,
                "the callback must be invocable as bool(gpukit::oom_context const&)");

 public:
  using typename base::stream_type;

  /// Allocates from `upstream` (which must outlive the adaptor), calling `callback` on failure.
  failure_callback_resource_adaptor(Upstream& upstream, Callback callback)
      : base{upstream}, callback_{std::move(callback)}
  {}
  ~failure_callback_resource_adaptor() = default;

  failure_callback_resource_adaptor(failure_callback_resource_adaptor const&)            = delete;
  failure_callback_resource_adaptor& operator=(failure_callback_resource_adaptor const&) = delete;
  failure_callback_resource_adaptor(failure_callback_resource_adaptor&&)                 = delete;
  failure_callback_resource_adaptor& operator=(failure_callback_resource_adaptor&&)      = delete;

 private:
  /// @throws Exception, as the upstream threw it last, once the callback returns false; what the
  ///         callback throws
  template <class Allocate>
  void* do_allocate(std::size_t bytes, stream_type, Allocate&& allocate)
  {
    for (;;) {
      try {
        return allocate();
      } catch (Exception const& e) {
        if (!callback_(context_of(e, bytes))) { throw; }
      }
    }
  }

  template <class Deallocate>
  void do_deallocate(void*, std::size_t, stream_type, Deallocate&& deallocate)
  {
    deallocate();
  }

  oom_context context_of(Exception const& e, std::size_t bytes) const
  {
    oom_context c;
    c.requested = bytes;
    if constexpr (std::is_base_of_v<out_of_memory, Exception>) {
      c.device   = e.report().device;
      c.reserved = e.report().reserved;
      c.limit    = e.report().limit;
    } else {
      (void)e;
      c.device = -1;
      if constexpr (detail::has_device_v<Upstream>) {
        c.device = this->upstream_resource().device();
      }
    }
    return c;
  }

  Callback callback_;
};

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
static_assert(detail::is_device_async_resource_v<
                failure_callback_resource_adaptor<detail::cccl_archetype_resource>>,
              "a failure_callback_resource_adaptor must be the CCCL resource its upstream is");
#endif

}  // namespace gpukit
