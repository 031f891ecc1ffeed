// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/device_scalar.hpp: one stream-ordered value in device memory (RMM's device_scalar)
// over any gpukit allocator.
//
// Quick start:
//
//   #include <gpukit/memory/device_scalar.hpp>
//
//   int count_on_device()
//   {
//     gpukit::cuda_stream s;
//     gpukit::device_scalar<int> count{0, s};  // allocated and set to 0 (synchronizes s)
//     // count_kernel<<<grid, block, 0, s.value()>>>(count.data());
//     return count.value(s);                   // copies back and synchronizes s
//   }
//
// A device_uvector of one element: see gpukit/memory/device_uvector.hpp for the stream, move and
// allocator semantics.
#pragma once

#include <gpukit/memory/device_uvector.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gpukit {

/// One uninitialized `T` in device memory over `Allocator`: `device_scalar<T>` over the caching
/// allocator on the CUDA runtime, `device_scalar<T, basic_caching_allocator<sim_runtime>>` on the
/// simulated GPU. Not thread-safe.
template <class T, class Allocator = caching_allocator>
class device_scalar final {
 public:
  using value_type     = T;
  using allocator_type = Allocator;
  using vector_type    = device_uvector<T, Allocator>;
  using stream_view    = typename vector_type::stream_view;

  /// An uninitialized value, allocated in `stream` order. Does not synchronize.
  /// @throws as device_uvector's constructor
  explicit device_scalar(stream_view stream,
                         Allocator& alloc = detail::current_resource_for<Allocator>())
      : storage_{1, stream, alloc}
  {}
  /// A value set to `value`; synchronizes `stream` once the copy has run (so `value` may be a
  /// temporary). @throws as device_uvector's constructor and set_element
  device_scalar(T const& value, stream_view stream,
                Allocator& alloc = detail::current_resource_for<Allocator>())
      : storage_{1, stream, alloc}
  {
    storage_.set_element(0, value, stream);
  }
  /// A deep copy of `other`, in `stream` order. Does not synchronize.
  device_scalar(device_scalar const& other, stream_view stream,
                Allocator& alloc = detail::current_resource_for<Allocator>())
      : storage_{other.storage_, stream, alloc}
  {}

  ~device_scalar()                               = default;
  device_scalar(device_scalar const&)            = delete;
  device_scalar& operator=(device_scalar const&) = delete;
  /// Moves leave the source empty: data() null; value() then throws gpukit::logic_error.
  device_scalar(device_scalar&&) noexcept            = default;
  device_scalar& operator=(device_scalar&&) noexcept = default;

  /// The value, copied to the host; synchronizes `stream`.
  /// @throws gpukit::cuda_error when the copy fails; gpukit::logic_error when moved from
  [[nodiscard]] T value(stream_view stream) const { return storage_.element(0, stream); }
  /// Copies `value` in `stream` order. Does not synchronize: `value` must stay valid until the
  /// copy has run (temporaries are refused at compile time).
  /// @throws gpukit::cuda_error when the copy fails; gpukit::logic_error when moved from
  void set_value_async(T const& value, stream_view stream)
  {
    storage_.set_element_async(0, value, stream);
  }
  void set_value_async(T const&& value, stream_view stream) = delete;
  /// Sets the value's bytes to zero in `stream` order. Does not synchronize.
  void set_value_to_zero_async(stream_view stream)
  {
    storage_.set_element_to_zero_async(0, stream);
  }

  [[nodiscard]] T* data() noexcept { return storage_.data(); }
  [[nodiscard]] T const* data() const noexcept { return storage_.data(); }
  /// 1, or 0 once moved from.
  [[nodiscard]] std::size_t size() const noexcept { return storage_.size(); }
  [[nodiscard]] stream_view stream() const noexcept { return storage_.stream(); }
  [[nodiscard]] Allocator& allocator() const noexcept { return storage_.allocator(); }
  /// See basic_device_buffer::set_stream.
  void set_stream(stream_view stream) { storage_.set_stream(stream); }

 private:
  vector_type storage_;
};

}  // namespace gpukit
