// SPDX-License-Identifier: Apache-2.0
// NVTX's own switch, NVTX_DISABLE, compiles gpukit's ranges out too (nvtx_disabled_test.cpp runs
// this and checks that the tool was never loaded).
#define NVTX_DISABLE
#include <gpukit/profile/memory_annotation.hpp>
#include <gpukit/profile/nvtx.hpp>

static_assert(!gpukit::nvtx_compiled_in);

void gpukit_test_disable_macro_exercise()
{
  GPUKIT_FUNC_RANGE();
  GPUKIT_RANGE("a");
  gpukit::scoped_range r{"x"};
  gpukit::named_range n{"y"};
  gpukit::mark("m");
  int block = 0;
  auto heap = gpukit::register_memory_heap(&block, sizeof block);
  gpukit::register_memory_region(heap, &block, sizeof block);
  gpukit::unregister_memory_region(&block);
  gpukit::unregister_memory_heap(heap);
  gpukit::nvtx_counter{"c"}.sample(1);
}
