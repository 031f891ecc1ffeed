// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/compiled.hpp: gpukit/runtime/detail/compiled_runtimes.hpp under its old name, for
// gpukit/memory/caching_allocator.hpp alone. Not public API.
//
// Transitional: a core header must not include a runtime header (scripts/check-includes, which
// allows this one edge). When caching_allocator.hpp includes compiled_runtimes.hpp instead, delete
// this file and its entry in scripts/check-includes.
#pragma once

#include <gpukit/runtime/detail/compiled_runtimes.hpp>
