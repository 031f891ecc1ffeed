// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/thrust_allocator.cuh: Thrust containers and algorithms on a caching allocator.
//
// Quick start (nvcc):
//
//   #include <gpukit/memory/thrust_allocator.cuh>
//
//   #include <thrust/device_vector.h>
//   #include <thrust/execution_policy.h>
//   #include <thrust/reduce.h>
//
//   float sum_of_zeros(std::size_t n, cudaStream_t stream)
//   {
//     gpukit::thrust_allocator<float> alloc{gpukit::default_caching_allocator(0), stream};
//     thrust::device_vector<float, gpukit::thrust_allocator<float>> v(n, 0.0f, alloc);
//     // Temporary storage of Thrust algorithms, stream-ordered on `stream`:
//     return thrust::reduce(thrust::cuda::par(gpukit::thrust_allocator<char>{alloc}).on(stream),
//                           v.begin(), v.end());
//   }
//
// Memory is allocated and freed in the order of the allocator's stream (no synchronization).
// Zero-element requests return a null pointer, as Thrust expects, instead of the caching
// allocator's error for zero bytes.
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/memory/caching_allocator.hpp>

#include <thrust/device_ptr.h>
#include <thrust/memory.h>

#include <cstddef>
#include <limits>

namespace gpukit {

/// A Thrust allocator of T over a basic_caching_allocator, on one stream.
template <class T, class Runtime = cuda_runtime>
class thrust_allocator {
 public:
  using value_type      = T;
  using pointer         = thrust::device_ptr<T>;
  using const_pointer   = thrust::device_ptr<T const>;
  using reference       = thrust::device_reference<T>;
  using const_reference = thrust::device_reference<T const>;
  using size_type       = std::size_t;
  using difference_type = std::ptrdiff_t;
  using stream_type     = typename Runtime::stream_type;

  template <class U>
  struct rebind {
    using other = thrust_allocator<U, Runtime>;
  };

  /// Allocates from `upstream` in the order of `stream` (default: the default stream).
  explicit thrust_allocator(
    basic_caching_allocator<Runtime>& upstream = default_caching_allocator<Runtime>(),
    stream_type stream                         = stream_type{}) noexcept
      : upstream_{&upstream}, stream_{stream}
  {}
  template <class U>
  thrust_allocator(
    thrust_allocator<U, Runtime> const& other) noexcept  // NOLINT: converting, as Thrust needs
      : upstream_{&other.upstream()}, stream_{other.stream()}
  {}

  /// @throws gpukit::bad_alloc / out_of_memory as basic_caching_allocator::allocate_async
  pointer allocate(size_type n)
  {
    if (n == 0) { return pointer{}; }
    GPUKIT_EXPECTS(
      n <= std::numeric_limits<size_type>::max() / sizeof(T),
      "thrust_allocator: " + std::to_string(n) + " elements overflow the size in bytes");
    return pointer{static_cast<T*>(upstream_->allocate_async(n * sizeof(T), stream_))};
  }
  void deallocate(pointer p, size_type n)
  {
    if (p.get() == nullptr) { return; }
    upstream_->deallocate_async(thrust::raw_pointer_cast(p), n * sizeof(T), stream_);
  }

  [[nodiscard]] basic_caching_allocator<Runtime>& upstream() const noexcept { return *upstream_; }
  [[nodiscard]] stream_type stream() const noexcept { return stream_; }

  template <class U>
  bool operator==(thrust_allocator<U, Runtime> const& o) const noexcept
  {
    return upstream_ == &o.upstream() && stream_ == o.stream();
  }
  template <class U>
  bool operator!=(thrust_allocator<U, Runtime> const& o) const noexcept
  {
    return !(*this == o);
  }

 private:
  basic_caching_allocator<Runtime>* upstream_;
  stream_type stream_;
};

}  // namespace gpukit
