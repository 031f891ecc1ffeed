// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the instantiations of gpukit/transfer/prefetcher.hpp over cuda_runtime (see
// src/caching_allocator.cpp).
#include <gpukit/transfer/prefetcher.hpp>

namespace gpukit {

template class basic_prefetcher<cuda_runtime>;

}  // namespace gpukit
