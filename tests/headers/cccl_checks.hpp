// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// Compile-time checks shared by the include-order tests: the compiler sees the CCCL that CMake
// found (GPUKIT_TEST_CCCL_VERSION, from find_package(CCCL)), not another copy on its include path,
// and gpukit's resources satisfy that CCCL's memory-resource concepts.
#pragma once

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/adaptors/failure_callback_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/limiting_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/logging_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/statistics_resource_adaptor.hpp>
#include <gpukit/memory/adaptors/tracking_resource_adaptor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/malloc_async_resource.hpp>

static_assert(CCCL_VERSION == GPUKIT_TEST_CCCL_VERSION,
              "the compiler sees another CCCL than the one CMake found");
static_assert(GPUKIT_HAS_CCCL_MEMORY_RESOURCE == 1,
              "CCCL's memory-resource concepts are missing after including gpukit");
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::caching_allocator>);
static_assert(gpukit::detail::is_host_device_sync_resource_v<gpukit::pinned_pool>);
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::malloc_async_resource>);
// The resource adaptors are the resource their upstream is, alone and stacked.
static_assert(gpukit::detail::is_device_async_resource_v<
              gpukit::limiting_resource_adaptor<gpukit::caching_allocator>>);
static_assert(gpukit::detail::is_device_async_resource_v<
              gpukit::statistics_resource_adaptor<gpukit::malloc_async_resource>>);
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::tracking_resource_adaptor<
                gpukit::logging_resource_adaptor<gpukit::caching_allocator>>>);
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::failure_callback_resource_adaptor<
                gpukit::limiting_resource_adaptor<gpukit::caching_allocator>>>);
static_assert(gpukit::detail::is_host_device_sync_resource_v<
              gpukit::statistics_resource_adaptor<gpukit::pinned_pool>>);
static_assert(!gpukit::detail::is_device_async_resource_v<
              gpukit::tracking_resource_adaptor<gpukit::pinned_pool>>);
