// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the instantiations of gpukit/transfer/transfer_pipeline.hpp over cuda_runtime
// (see src/caching_allocator.cpp).
#include <gpukit/transfer/transfer_pipeline.hpp>

namespace gpukit {

template class basic_transfer_pipeline<cuda_runtime>;

}  // namespace gpukit
