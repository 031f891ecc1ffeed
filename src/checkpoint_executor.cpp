// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the instantiations of gpukit/checkpoint/executor.hpp over both runtimes, all
// its members but run_async, a template over the caller's stages (see src/caching_allocator.cpp).
#include <gpukit/checkpoint/executor.hpp>

namespace gpukit {

template class basic_checkpoint_executor<cuda_runtime>;
template class basic_checkpoint_executor<sim_runtime>;

}  // namespace gpukit
