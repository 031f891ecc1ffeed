// SPDX-License-Identifier: Apache-2.0
// gpukit::compiled: the bodies of gpukit::sim_runtime (detail/sim_runtime_impl.hpp), compiled once
// here. In compiled mode gpukit/runtime/sim_runtime.hpp declares the class and leaves its body
// file out; GPUKIT_DETAIL_COMPILED_INLINE makes the bodies ordinary definitions in this source
// alone (gpukit/detail/compiled_mode.hpp).
#include <gpukit/runtime/sim_runtime.hpp>

#include <gpukit/runtime/detail/sim_runtime_impl.hpp>
