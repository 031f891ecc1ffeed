// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the instantiations of gpukit/transfer/transfer_pipeline.hpp over both runtimes
// (see src/caching_allocator.cpp).
#include <gpukit/transfer/transfer_pipeline.hpp>

namespace gpukit {

template class basic_transfer_pipeline<cuda_runtime>;
template class basic_transfer_pipeline<sim_runtime>;

}  // namespace gpukit
