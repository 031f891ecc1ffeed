// SPDX-License-Identifier: Apache-2.0
// strict_consumer.cpp's twin for nvcc: gpukit/gpukit.hpp (with the .cuh headers, which it includes
// under nvcc) and Thrust, built with the host compiler's strictest warnings (-Xcompiler) and
// gpukit's include folder as a plain -I, so that a warning in any gpukit header fails the build.
#include <gpukit/gpukit.hpp>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>

namespace gpukit {

template class thrust_allocator<float>;
template class thrust_allocator<char>;

}  // namespace gpukit

float gpukit_strict_consumer_sum(float const* data, std::size_t n, cudaStream_t stream)
{
  gpukit::thrust_allocator<float> alloc{gpukit::default_caching_allocator(0), stream};
  thrust::device_vector<float, gpukit::thrust_allocator<float>> v(data, data + n, alloc);
  return thrust::reduce(thrust::cuda::par(gpukit::thrust_allocator<char>{alloc}).on(stream),
                        v.begin(), v.end());
}
