// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled (src/): the instantiations over both runtimes, cuda_runtime and sim_runtime,
// that a translation unit using the caching allocator, the pinned pool, the transfer pipelines or
// the checkpoint executor would otherwise compile itself, each compiled once here, and
// sim_runtime's own bodies (src/sim_runtime.cpp). Consumers of gpukit::compiled get
// GPUKIT_COMPILED_LIBRARY, under which the public headers declare these instantiations `extern
// template`: a consumer's TU then compiles none of their out-of-line members (the bodies in
// detail/*.inl), only what it inlines.
//
// One source per public header, so that the library builds in parallel.
#include <gpukit/memory/caching_allocator.hpp>

namespace gpukit {

template class basic_caching_allocator<cuda_runtime>;
template basic_caching_allocator<cuda_runtime>& default_caching_allocator<cuda_runtime>(int);
template class basic_caching_allocator<sim_runtime>;
template basic_caching_allocator<sim_runtime>& default_caching_allocator<sim_runtime>(int);

}  // namespace gpukit
