// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the instantiations of gpukit/transfer/prefetcher.hpp over both runtimes (see
// src/caching_allocator.cpp).
#include <gpukit/transfer/prefetcher.hpp>

namespace gpukit {

template class basic_prefetcher<cuda_runtime>;
template class basic_prefetcher<sim_runtime>;

}  // namespace gpukit
