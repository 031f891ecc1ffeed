// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/compiled_mode.hpp: GPUKIT_DETAIL_EXTERN_TEMPLATE and GPUKIT_DETAIL_COMPILED_INLINE,
// how headers declare what gpukit's compiled mode holds. Not public API. It includes nothing, so
// that the bodies of a runtime (sim_runtime's) can use it without a cycle;
// gpukit/runtime/detail/compiled_runtimes.hpp adds the two runtimes that the instantiations need.
#pragma once

/// In compiled mode (GPUKIT_COMPILED_LIBRARY, defined by linking gpukit::compiled; README,
/// "Building"), an explicit instantiation declaration of what src/*.cpp instantiates, so that the
/// including translation unit does not compile it again; otherwise nothing. At namespace scope,
/// with qualified names. The library instantiates over both runtimes, cuda_runtime and
/// sim_runtime: a header that declares them includes gpukit/runtime/detail/compiled_runtimes.hpp,
/// which brings both in compiled mode.
#ifdef GPUKIT_COMPILED_LIBRARY
#define GPUKIT_DETAIL_EXTERN_TEMPLATE(...) extern template __VA_ARGS__
#else
#define GPUKIT_DETAIL_EXTERN_TEMPLATE(...) static_assert(true)
#endif

/// The `inline` of a body that is no template and that compiled mode compiles once in src/
/// (sim_runtime's members, from runtime/detail/sim_runtime_impl.hpp; the checkpoint planners, from
/// checkpoint/detail/planners_impl.hpp): `inline` header-only, where every translation unit that
/// includes the header compiles the bodies; nothing in compiled mode, where the header leaves its
/// body file out (its consumers see declarations only) and the one source of the library that
/// includes the body file makes them ordinary definitions.
#ifdef GPUKIT_COMPILED_LIBRARY
#define GPUKIT_DETAIL_COMPILED_INLINE
#else
#define GPUKIT_DETAIL_COMPILED_INLINE inline
#endif
