// SPDX-License-Identifier: Apache-2.0
// The resource adaptors' conformance suite (adaptor_conformance.hpp) on the simulated GPU, and the
// compile-time check that every adaptor, alone and stacked, satisfies exactly the CCCL
// memory-resource concepts its upstream satisfies (tests/headers/cccl_checks.hpp checks the same
// against every CCCL release scripts/cccl-compat builds).
#include "memory/adaptors/adaptor_conformance.hpp"

#include "support/caching_allocator.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/detail/cccl_compat.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

namespace {

using gpukit::sim_runtime;
using gpukit::test::one_device;

#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE

template <class A, class U>
constexpr bool same_concepts_v = gpukit::detail::is_device_async_resource_v<A> ==
                                 gpukit::detail::is_device_async_resource_v<U>&&
                                   gpukit::detail::is_host_device_sync_resource_v<A> ==
                                 gpukit::detail::is_host_device_sync_resource_v<U>;

template <template <class> class Adaptor, class U>
constexpr bool adapts_v = same_concepts_v<Adaptor<U>, U>&&
  same_concepts_v<gpukit::limiting_resource_adaptor<Adaptor<U>>, U>&&
    same_concepts_v<gpukit::statistics_resource_adaptor<Adaptor<U>>, U>&&
      same_concepts_v<gpukit::tracking_resource_adaptor<Adaptor<U>>, U>&&
        same_concepts_v<gpukit::logging_resource_adaptor<Adaptor<U>>, U>&&
          same_concepts_v<gpukit::failure_callback_resource_adaptor<Adaptor<U>>, U>;

template <class U>
using failure_callback = gpukit::failure_callback_resource_adaptor<U>;

template <class U>
constexpr bool all_adapt_v = adapts_v<gpukit::limiting_resource_adaptor, U>&& adapts_v<
  gpukit::statistics_resource_adaptor, U>&& adapts_v<gpukit::tracking_resource_adaptor, U>&&
  adapts_v<gpukit::logging_resource_adaptor, U>&& adapts_v<failure_callback, U>;

// Stream-ordered, device accessible: every adaptor and pair is too.
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::caching_allocator>);
static_assert(all_adapt_v<gpukit::caching_allocator>);
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::malloc_async_resource>);
static_assert(all_adapt_v<gpukit::malloc_async_resource>);
// Synchronous, host and device accessible (pinned memory): every adaptor is that, not more.
static_assert(gpukit::detail::is_host_device_sync_resource_v<gpukit::pinned_pool>);
static_assert(all_adapt_v<gpukit::pinned_pool>);
static_assert(!gpukit::detail::is_device_async_resource_v<
              gpukit::statistics_resource_adaptor<gpukit::pinned_pool>>);
// The simulated GPU's streams are no cuda::stream_ref: no CCCL concept, over it or adapted.
static_assert(!gpukit::detail::is_device_async_resource_v<gpukit::test::sim_allocator>);
static_assert(all_adapt_v<gpukit::test::sim_allocator>);

#endif

}  // namespace

TEST_SUITE("resource_adaptors")
{
  GPUKIT_ADAPTOR_CONFORMANCE_CASES(sim_runtime{one_device()}, "sim_runtime", 4, 400)
}
