// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled (src/): the instantiations over cuda_runtime that a translation unit using the
// caching allocator, the pinned pool or the transfer pipelines would otherwise compile itself, each
// compiled once here. Consumers of gpukit::compiled get GPUKIT_COMPILED_LIBRARY, under which the
// public headers declare these instantiations `extern template`: a consumer's TU then compiles none
// of their out-of-line members (the bodies in detail/*.inl), only what it inlines. sim_runtime's
// instantiations stay header-only.
//
// One source per public header, so that the library builds in parallel.
#include <gpukit/memory/caching_allocator.hpp>

namespace gpukit {

template class basic_caching_allocator<cuda_runtime>;
template basic_caching_allocator<cuda_runtime>& default_caching_allocator<cuda_runtime>(int);

}  // namespace gpukit
