// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/compiled.hpp: GPUKIT_DETAIL_EXTERN_TEMPLATE, how a header declares the
// instantiations that gpukit's compiled mode holds. Not public API.
#pragma once

/// In compiled mode (GPUKIT_COMPILED_LIBRARY, defined by linking gpukit::compiled; README,
/// "Building"), an explicit instantiation declaration of what src/*.cpp instantiates, so that the
/// including translation unit does not compile it again; otherwise nothing. At namespace scope,
/// with qualified names.
#ifdef GPUKIT_COMPILED_LIBRARY
#define GPUKIT_DETAIL_EXTERN_TEMPLATE(...) extern template __VA_ARGS__
#else
#define GPUKIT_DETAIL_EXTERN_TEMPLATE(...) static_assert(true)
#endif
