// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the instantiations of gpukit/host/pinned_pool.hpp over both runtimes (see
// src/caching_allocator.cpp).
#include <gpukit/host/pinned_pool.hpp>

namespace gpukit {

template class pinned_buffer<cuda_runtime>;
template class basic_pinned_pool<cuda_runtime>;
template class pinned_buffer<sim_runtime>;
template class basic_pinned_pool<sim_runtime>;

}  // namespace gpukit
