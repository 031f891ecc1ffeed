// SPDX-FileCopyrightText: gpukit contributors
// SPDX-License-Identifier: Apache-2.0
//
// Include order does not matter: a translation unit that includes CCCL's <cuda/memory_resource>
// first (without CCCL 3.0's experimental opt-in, as most users do) still compiles gpukit's
// resources, and they still satisfy CCCL's memory-resource concepts. Built against the toolkit's
// CCCL here and against other releases by scripts/cccl-compat.
#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/transfer/prefetcher.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>
#include <gpukit/version.hpp>

#include "cccl_checks.hpp"
