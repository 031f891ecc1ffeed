// SPDX-License-Identifier: Apache-2.0
// sanitizer_overflow: an out-of-bounds write into a gpukit block that lies inside a larger
// segment. compute-sanitizer sees it only because the caching allocator describes its blocks
// through NVTX's memory API:
//
//   compute-sanitizer --tool memcheck --nvtx yes ./sanitizer_overflow                 # reported
//   compute-sanitizer --tool memcheck --nvtx yes ./sanitizer_overflow --no-annotate   # missed
//
// Without a GPU it says so and exits 77 (skipped).
#include "gpu_main.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <cstdio>
#include <cstring>

__global__ void write_one_past(char* p, std::size_t n) { p[n] = 1; }

int main(int argc, char** argv)
{
  bool const annotate = !(argc > 1 && std::strcmp(argv[1], "--no-annotate") == 0);
  return gpukit_examples::run_on_gpu("sanitizer_overflow", [&] {
    gpukit::caching_allocator_options o;
    o.nvtx_annotate = annotate;
    // compute-sanitizer accepts NVTX heaps only over plain device allocations (cudaMalloc or
    // cuMemAlloc), not over memory from cudaMallocAsync's pools: take segments from cudaMalloc.
    o.source = gpukit::segment_source::synchronous;
    gpukit::caching_allocator alloc{gpukit::cuda_runtime::instance(), 0, o};
    cudaStream_t s{};
    GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto* a = static_cast<char*>(alloc.allocate_async(1000, s));  // both in one 2 MiB segment
    auto* b = static_cast<char*>(alloc.allocate_async(1000, s));
    write_one_past<<<1, 1, 0, s>>>(a,
                                   1000);  // a[1000]: past what was asked for, inside the segment
    GPUKIT_CUDA_TRY(cudaGetLastError());
    GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
    std::printf(
      "sanitizer_overflow: wrote one byte past a 1000-byte block at %p (next block at %p), "
      "annotation %s\n",
      static_cast<void*>(a), static_cast<void*>(b), annotate ? "on" : "off");
    alloc.deallocate_async(a, 1000, s);
    alloc.deallocate_async(b, 1000, s);
    alloc.forget_stream(s);
    GPUKIT_CUDA_TRY(cudaStreamDestroy(s));
    return 0;
  });
}
