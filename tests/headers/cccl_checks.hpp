// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// Compile-time checks shared by the include-order tests: the compiler sees the CCCL that CMake
// found (GPUKIT_TEST_CCCL_VERSION, from find_package(CCCL)), not another copy on its include path,
// and gpukit's resources satisfy that CCCL's memory-resource concepts.
#pragma once

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>

static_assert(CCCL_VERSION == GPUKIT_TEST_CCCL_VERSION,
              "the compiler sees another CCCL than the one CMake found");
static_assert(GPUKIT_HAS_CCCL_MEMORY_RESOURCE == 1,
              "CCCL's memory-resource concepts are missing after including gpukit");
static_assert(gpukit::detail::is_device_async_resource_v<gpukit::caching_allocator>);
static_assert(gpukit::detail::is_host_device_sync_resource_v<gpukit::pinned_pool>);
