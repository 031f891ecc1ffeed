// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/device_uvector.hpp: a typed, uninitialized, stream-ordered vector in device memory
// (RMM's device_uvector) over any gpukit allocator.
//
// Quick start:
//
//   #include <gpukit/memory/device_uvector.hpp>
//
//   #include <vector>
//
//   float run()
//   {
//     gpukit::cuda_stream s;
//     gpukit::device_uvector<float> v{1000, s};  // 1000 uninitialized floats, in s's order
//     std::vector<float> host(1000, 1.0f);
//     v.copy_from_host_async(host.data(), host.size(), s);  // host must live until s has run it
//     float const two = 2.0f;
//     v.set_element_async(0, two, s);            // `two` must live until s has run the copy
//     float const first = v.element(0, s);       // copies back and synchronizes s: 2.0f
//     v.resize(2000, s);                         // keeps the first 1000, the rest uninitialized
//     gpukit::device_buffer raw = v.release();   // the memory, as an untyped buffer
//     return first;
//   }
//
// Elements are never constructed or destroyed (T must be trivially copyable), so creating and
// resizing cost an allocation and at most one device-to-device copy. Stream, move and allocator
// semantics are those of basic_device_buffer (gpukit/memory/device_buffer.hpp), which holds the
// memory. Host copies go through the runtime's memcpy_async: pinned host memory makes them
// asynchronous; with pageable memory CUDA may block the host until the copy is done, and the host
// memory must stay valid until the copy has run in any case.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/device_buffer.hpp>

#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace gpukit {

/// A vector of uninitialized `T` in device memory over `Allocator` (see the top of this header):
/// `device_uvector<T>` over the caching allocator on the CUDA runtime,
/// `device_uvector<T, basic_caching_allocator<sim_runtime>>` on the simulated GPU.
/// Not thread-safe (like std::vector).
template <class T, class Allocator = caching_allocator>
class device_uvector final {
  static_assert(std::is_trivially_copyable_v<T>,
                "device_uvector holds trivially copyable types only (elements are copied as bytes "
                "and never constructed)");

 public:
  using value_type      = T;
  using size_type       = std::size_t;
  using pointer         = T*;
  using const_pointer   = T const*;
  using iterator        = T*;
  using const_iterator  = T const*;
  using allocator_type  = Allocator;
  using buffer_type     = basic_device_buffer<Allocator>;
  using stream_view     = typename buffer_type::stream_view;
  using reference       = T&;  ///< device memory: only for device code
  using const_reference = T const&;

  /// `size` uninitialized elements, allocated in `stream` order. Does not synchronize.
  /// @throws gpukit::bad_alloc when size * sizeof(T) overflows (the message names the size);
  ///         otherwise as basic_device_buffer's sized constructor
  device_uvector(std::size_t size, stream_view stream,
                 Allocator& alloc = detail::current_resource_for<Allocator>())
      : storage_{bytes_for(size), stream, alloc}
  {}
  /// A deep copy of `other`, in `stream` order. Does not synchronize.
  /// @throws as basic_device_buffer's copying constructor
  device_uvector(device_uvector const& other, stream_view stream,
                 Allocator& alloc = detail::current_resource_for<Allocator>())
      : storage_{other.storage_, stream, alloc}
  {}
  /// Takes ownership of `buffer`'s memory (its size must be a multiple of sizeof(T)).
  /// @throws gpukit::logic_error when it is not (the buffer is left as it was)
  explicit device_uvector(buffer_type&& buffer);

  ~device_uvector()                                = default;
  device_uvector(device_uvector const&)            = delete;
  device_uvector& operator=(device_uvector const&) = delete;
  /// Moves leave the source empty (see basic_device_buffer).
  device_uvector(device_uvector&&) noexcept            = default;
  device_uvector& operator=(device_uvector&&) noexcept = default;

  [[nodiscard]] T* data() noexcept { return static_cast<T*>(storage_.data()); }
  [[nodiscard]] T const* data() const noexcept { return static_cast<T const*>(storage_.data()); }
  [[nodiscard]] iterator begin() noexcept { return data(); }
  [[nodiscard]] iterator end() noexcept { return data() + size(); }
  [[nodiscard]] const_iterator begin() const noexcept { return data(); }
  [[nodiscard]] const_iterator end() const noexcept { return data() + size(); }
  [[nodiscard]] std::size_t size() const noexcept { return storage_.size() / sizeof(T); }
  [[nodiscard]] std::size_t capacity() const noexcept { return storage_.capacity() / sizeof(T); }
  [[nodiscard]] bool is_empty() const noexcept { return storage_.is_empty(); }
  [[nodiscard]] stream_view stream() const noexcept { return storage_.stream(); }
  [[nodiscard]] Allocator& allocator() const noexcept { return storage_.allocator(); }
  /// See basic_device_buffer::set_stream.
  void set_stream(stream_view stream) { storage_.set_stream(stream); }

  /// The address of element `i` in device memory. @throws gpukit::logic_error when i >= size()
  [[nodiscard]] T* element_ptr(std::size_t i);
  [[nodiscard]] T const* element_ptr(std::size_t i) const;

  /// Copies `value` into element `i` in `stream` order. Does not synchronize: `value` must stay
  /// valid until the copy has run (pass an lvalue; temporaries are refused at compile time).
  /// @throws gpukit::logic_error when i >= size(); gpukit::cuda_error when the copy fails
  void set_element_async(std::size_t i, T const& value, stream_view stream);
  void set_element_async(std::size_t i, T const&& value, stream_view stream) = delete;
  /// Sets element `i`'s bytes to zero in `stream` order. Does not synchronize.
  /// @throws gpukit::logic_error when i >= size(); gpukit::cuda_error when the memset fails
  void set_element_to_zero_async(std::size_t i, stream_view stream);
  /// Copies `value` into element `i`, then synchronizes `stream` (any value, temporaries too).
  /// @throws as set_element_async
  void set_element(std::size_t i, T const& value, stream_view stream);
  /// Element `i`, copied to the host; synchronizes `stream`.
  /// @throws gpukit::logic_error when i >= size(); gpukit::cuda_error when the copy fails
  [[nodiscard]] T element(std::size_t i, stream_view stream) const;
  [[nodiscard]] T front_element(stream_view stream) const { return element(0, stream); }
  [[nodiscard]] T back_element(stream_view stream) const { return element(size() - 1, stream); }

  /// Copies `count` elements from host memory `source` into elements [first, first + count), in
  /// `stream` order. Does not synchronize (but see the top of this header on pageable memory).
  /// @throws gpukit::logic_error when the range is not inside the vector or source is null;
  ///         gpukit::cuda_error when the copy fails
  void copy_from_host_async(T const* source, std::size_t count, stream_view stream,
                            std::size_t first = 0);
  /// Copies elements [first, first + count) into host memory `target`, in `stream` order. Does
  /// not synchronize: read `target` after synchronizing `stream`.
  /// @throws as copy_from_host_async
  void copy_to_host_async(T* target, std::size_t count, stream_view stream,
                          std::size_t first = 0) const;

  /// See basic_device_buffer::reserve (in elements). @throws gpukit::bad_alloc on overflow
  void reserve(std::size_t count, stream_view stream)
  {
    storage_.reserve(bytes_for(count), stream);
  }
  /// See basic_device_buffer::resize (in elements). @throws gpukit::bad_alloc on overflow
  void resize(std::size_t count, stream_view stream) { storage_.resize(bytes_for(count), stream); }
  /// See basic_device_buffer::shrink_to_fit.
  void shrink_to_fit(stream_view stream) { storage_.shrink_to_fit(stream); }
  /// Hands the memory over as an untyped buffer and leaves the vector empty. Never throws.
  [[nodiscard]] buffer_type release() noexcept { return std::move(storage_); }

  /// `count * sizeof(T)`. @throws gpukit::bad_alloc naming the count when it overflows
  [[nodiscard]] static std::size_t bytes_for(std::size_t count);

 private:
  void check_index(std::size_t i, char const* what) const;
  void check_range(std::size_t first, std::size_t count, void const* host, char const* what) const;
  void copy(void* dst, void const* src, std::size_t bytes, memcpy_kind kind,
            stream_view stream) const;

  buffer_type storage_;
};

}  // namespace gpukit

#include <gpukit/memory/detail/device_uvector_impl.hpp>
