// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// gpukit/detail/cccl_compat.hpp: CCCL's memory-resource concepts, whichever CCCL is found.
//
// gpukit's resources satisfy CCCL's memory-resource concepts, whose names and opt-in changed:
//
//   CCCL 3.0 (CUDA 13.0) and older   experimental: <cuda/memory_resource> declares nothing unless
//                                    LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is defined
//                                    before its first inclusion. Synchronous: resource_with;
//                                    stream-ordered: async_resource_with (allocate_async).
//   CCCL 3.1 (CUDA 13.1) and later   no opt-in. Synchronous: synchronous_resource_with
//                                    (allocate_sync); stream-ordered: resource_with
//                                    (allocate(stream, bytes, align)).
//
// Including this header (every gpukit header that needs the concepts does) gives, for any of them:
//
//   GPUKIT_HAS_CCCL_MEMORY_RESOURCE        1 when the concepts are there, 0 when they cannot be
//                                          (see below); wrap uses of the traits in #if
//   detail::cccl_device_accessible,        CCCL's property tags (gpukit's own empty tags when the
//   detail::cccl_host_accessible           concepts are absent), for get_property friends
//   detail::is_device_async_resource_v<R>  R is a stream-ordered, device-accessible resource
//   detail::is_host_device_sync_resource_v<R>  R is a synchronous resource whose memory is host
//                                          and device accessible (pinned memory)
//
// Include order does not matter. With CCCL 3.0, a translation unit that included
// <cuda/memory_resource> without the opt-in before any gpukit header got empty headers (every
// declaration in CCCL 3.0's cuda/__memory_resource/*.h sits inside `#if defined(opt-in)`, only the
// include guards are set); this header then clears those guards and reads them again with the
// opt-in, which declares the concepts exactly as if gpukit had come first. Older CCCL releases,
// whose layout is not checked here, leave GPUKIT_HAS_CCCL_MEMORY_RESOURCE at 0 in that case.
//
// Not API (detail/): the names may change in any release.
#pragma once

#if defined(__has_include)
#if __has_include(<cuda/version>)
#include <cuda/version>
#endif
#endif
#if !defined(CCCL_VERSION)
#include <cuda/std/version>
#endif
#if !defined(CCCL_VERSION)
#error \
  "gpukit needs CCCL (the CUDA toolkit's include/cccl, or a release found with find_package(CCCL))"
#endif

#if CCCL_VERSION >= 3001000  // no opt-in, the concepts are always declared
#include <cuda/memory_resource>
#define GPUKIT_HAS_CCCL_MEMORY_RESOURCE 1
#elif defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)  // opted in, by gpukit or the user
#include <cuda/memory_resource>
#define GPUKIT_HAS_CCCL_MEMORY_RESOURCE 1
#elif !defined(_CUDA__MEMORY_RESOURCE_GET_PROPERTY_H) &&                                          \
  !defined(_CUDA__MEMORY_RESOURCE_PROPERTIES_H) && !defined(_CUDA__MEMORY_RESOURCE_RESOURCE_H) && \
  !defined(_CUDA__MEMORY_RESOURCE_RESOURCE_REF_H)  // not included yet: opt in
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#include <cuda/memory_resource>
#define GPUKIT_HAS_CCCL_MEMORY_RESOURCE 1
#elif CCCL_VERSION >= 3000000  // CCCL 3.0, included without the opt-in: read it again with it
#undef _CUDA_MEMORY_RESOURCE
#undef _CUDA__MEMORY_RESOURCE_GET_PROPERTY_H
#undef _CUDA__MEMORY_RESOURCE_PROPERTIES_H
#undef _CUDA__MEMORY_RESOURCE_RESOURCE_H
#undef _CUDA__MEMORY_RESOURCE_RESOURCE_REF_H
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#include <cuda/memory_resource>
#define GPUKIT_HAS_CCCL_MEMORY_RESOURCE 1
#else  // an older CCCL, included without the opt-in: its concepts are out of reach
#define GPUKIT_HAS_CCCL_MEMORY_RESOURCE 0
#endif

namespace gpukit::detail {

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE

using cccl_device_accessible = ::cuda::mr::device_accessible;
using cccl_host_accessible   = ::cuda::mr::host_accessible;

#if CCCL_VERSION >= 3001000
template <class R>
inline constexpr bool is_device_async_resource_v =
  ::cuda::mr::resource_with<R, ::cuda::mr::device_accessible>;
template <class R>
inline constexpr bool is_host_device_sync_resource_v =
  ::cuda::mr::synchronous_resource_with<R, ::cuda::mr::host_accessible,
                                        ::cuda::mr::device_accessible>;
#else
template <class R>
inline constexpr bool is_device_async_resource_v =
  ::cuda::mr::async_resource_with<R, ::cuda::mr::device_accessible>;
template <class R>
inline constexpr bool is_host_device_sync_resource_v =
  ::cuda::mr::resource_with<R, ::cuda::mr::host_accessible, ::cuda::mr::device_accessible>;
#endif

#else

struct cccl_device_accessible {};
struct cccl_host_accessible {};

#endif

}  // namespace gpukit::detail
