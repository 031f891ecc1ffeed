// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/compiled.hpp: GPUKIT_DETAIL_EXTERN_TEMPLATE and GPUKIT_DETAIL_COMPILED_INLINE, how
// headers declare what gpukit's compiled mode holds. Not public API.
#pragma once

/// In compiled mode (GPUKIT_COMPILED_LIBRARY, defined by linking gpukit::compiled; README,
/// "Building"), an explicit instantiation declaration of what src/*.cpp instantiates, so that the
/// including translation unit does not compile it again; otherwise nothing. At namespace scope,
/// with qualified names. The library instantiates over both runtimes, cuda_runtime and
/// sim_runtime: in compiled mode a header that declares them includes both (below).
#ifdef GPUKIT_COMPILED_LIBRARY
#define GPUKIT_DETAIL_EXTERN_TEMPLATE(...) extern template __VA_ARGS__
#else
#define GPUKIT_DETAIL_EXTERN_TEMPLATE(...) static_assert(true)
#endif

/// The `inline` of a body that is no template and that compiled mode compiles once in src/
/// (sim_runtime's members, from detail/sim_runtime.inl; the checkpoint planners, from
/// checkpoint/detail/planners_impl.hpp): `inline` header-only, where every translation unit that
/// includes the header compiles the bodies; nothing in compiled mode, where the header leaves its
/// body file out (its consumers see declarations only) and the one source of the library that
/// includes the body file makes them ordinary definitions.
#ifdef GPUKIT_COMPILED_LIBRARY
#define GPUKIT_DETAIL_COMPILED_INLINE
#else
#define GPUKIT_DETAIL_COMPILED_INLINE inline
#endif

#ifdef GPUKIT_COMPILED_LIBRARY
// The runtimes of the instantiations that GPUKIT_DETAIL_EXTERN_TEMPLATE declares, complete. In
// compiled mode sim_runtime.hpp is declarations only, a small include.
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#endif
