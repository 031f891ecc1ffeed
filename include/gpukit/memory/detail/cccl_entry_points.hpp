// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/detail/cccl_entry_points.hpp: the CCCL memory-resource entry points of a
// stream-ordered device resource, written once from the resource's own. Not public API.
//
// A resource `R` (CRTP: `class R : public detail::cccl_entry_points<R>`) has
//
//   using stream_type = ...;                       // a value-initialized one: the default stream
//   void* allocate_async(std::size_t bytes, stream_type stream);
//   void deallocate_async(void* ptr, std::size_t bytes, stream_type stream);
//   static constexpr std::size_t alignment;        // the largest `align` it accepts
//   static void check_alignment(std::size_t align);  // throws gpukit::logic_error naming R
//
// (check_alignment may be private: R then declares the mixin a friend), and brings the names it
// also declares itself into its scope (`using base::allocate;`, and deallocate, allocate_async,
// deallocate_async), so that its own overloads do not hide these.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gpukit::detail {

/// The CCCL memory-resource interface of the stream-ordered resource `Derived`: CCCL 3.0's
/// allocate / deallocate(bytes, align) and allocate_async / deallocate_async(bytes, align,
/// stream_ref), and CCCL 3.1's names for them, allocate_sync / deallocate_sync(bytes, align) and
/// allocate / deallocate(stream_ref, bytes, align). Each checks `align` (Derived::check_alignment),
/// then calls Derived's allocate_async(bytes, stream) or deallocate_async(ptr, bytes, stream) (the
/// default stream where none is given), and throws what they throw. A stream_ref is a
/// `cuda::stream_ref`, or anything whose get() is a Derived::stream_type.
template <class Derived>
class cccl_entry_points {
  // Enables the stream_ref forms for StreamRef. D is Derived, named by each member template so that
  // it is read when the member is called, once Derived is complete.
  template <class StreamRef, class D>
  using stream_of = std::enable_if_t<
    std::is_same_v<decltype(std::declval<StreamRef const&>().get()), typename D::stream_type>, int>;

 public:
  /// allocate_async(bytes) on the default stream, with an alignment check.
  /// @throws gpukit::logic_error unless `align` is a power of two up to Derived::alignment
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t align)
  {
    Derived::check_alignment(align);
    return self().allocate_async(bytes, typename Derived::stream_type{});
  }
  /// deallocate_async(ptr, bytes) on the default stream, with an alignment check.
  void deallocate(void* ptr, std::size_t bytes, std::size_t align)
  {
    Derived::check_alignment(align);
    self().deallocate_async(ptr, bytes, typename Derived::stream_type{});
  }
  /// allocate_async(bytes, stream.get()), with an alignment check.
  template <class StreamRef, class D = Derived, stream_of<StreamRef, D> = 0>
  [[nodiscard]] void* allocate_async(std::size_t bytes, std::size_t align, StreamRef stream)
  {
    Derived::check_alignment(align);
    return self().allocate_async(bytes, stream.get());
  }
  /// deallocate_async(ptr, bytes, stream.get()), with an alignment check.
  template <class StreamRef, class D = Derived, stream_of<StreamRef, D> = 0>
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t align, StreamRef stream)
  {
    Derived::check_alignment(align);
    self().deallocate_async(ptr, bytes, stream.get());
  }

  /// CCCL 3.1's name of allocate(bytes, align).
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t align)
  {
    return allocate(bytes, align);
  }
  /// CCCL 3.1's name of deallocate(ptr, bytes, align).
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t align)
  {
    deallocate(ptr, bytes, align);
  }
  /// CCCL 3.1's name of allocate_async(bytes, align, stream), the stream first.
  template <class StreamRef, class D = Derived, stream_of<StreamRef, D> = 0>
  [[nodiscard]] void* allocate(StreamRef stream, std::size_t bytes, std::size_t align)
  {
    return allocate_async(bytes, align, stream);
  }
  /// CCCL 3.1's name of deallocate_async(ptr, bytes, align, stream), the stream first.
  template <class StreamRef, class D = Derived, stream_of<StreamRef, D> = 0>
  void deallocate(StreamRef stream, void* ptr, std::size_t bytes, std::size_t align)
  {
    deallocate_async(ptr, bytes, align, stream);
  }

 protected:
  cccl_entry_points()                                    = default;
  ~cccl_entry_points()                                   = default;
  cccl_entry_points(cccl_entry_points const&)            = default;
  cccl_entry_points& operator=(cccl_entry_points const&) = default;
  cccl_entry_points(cccl_entry_points&&)                 = default;
  cccl_entry_points& operator=(cccl_entry_points&&)      = default;

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace gpukit::detail
