// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/compiled_runtimes.hpp: what a header that declares compiled mode's
// instantiations (GPUKIT_DETAIL_EXTERN_TEMPLATE over cuda_runtime and sim_runtime) includes: the
// macros (gpukit/detail/compiled_mode.hpp) and, in compiled mode, both runtimes, complete. In
// compiled mode sim_runtime.hpp is declarations only, a small include; header-only, neither is
// included here. Not public API.
#pragma once

#include <gpukit/detail/compiled_mode.hpp>

#ifdef GPUKIT_COMPILED_LIBRARY
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#endif
