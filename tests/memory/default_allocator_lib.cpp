// SPDX-License-Identifier: Apache-2.0
// A shared library that includes gpukit, built with -fvisibility=hidden and loaded with
// RTLD_LOCAL by default_allocator_test: its default allocator must be the test's own.
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

extern "C" __attribute__((visibility("default"))) void* gpukit_test_default_allocator()
{
  return &gpukit::default_caching_allocator<gpukit::sim_runtime>(0);
}
