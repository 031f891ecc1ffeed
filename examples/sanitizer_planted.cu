// SPDX-License-Identifier: Apache-2.0
// sanitizer_planted: plants one-byte overruns or reads after free in 1000-byte blocks of a gpukit
// caching allocator, for each segment source, so that compute-sanitizer's catch rate can be
// measured (benchmarks/profile/sanitizer_table.sh runs the whole matrix):
//
//   compute-sanitizer --tool memcheck --nvtx yes ./sanitizer_planted --source sync --bug overrun
//   ./sanitizer_planted --source growable --bug uaf --debug     # debug mode (quarantine, poison)
//   ./sanitizer_planted --guard-pages --bug overrun --bytes 1024  # no tool: the kernel faults
//
// --source sync|async|growable   segment source (synchronous, stream_ordered, growable)
// --bug none|overrun|uaf         none: a clean run; overrun: each kernel writes p[1000] of its
//                                block; uaf: each kernel reads a block after its free
// --debug                        the allocator's debug mode (as GPUKIT_DEBUG=1)
// --guard-pages                  debug mode with guard pages (as GPUKIT_DEBUG=guard; implies
//                                --source growable, no NVTX annotation): each block ends at the end
//                                of its mapped pages and the next page is unmapped
// --bytes N                      block size (default 1000; 1..65536). The overrun writes p[N]: with
//                                guard pages it faults when N is a multiple of 256, else it lands
//                                in the 256-byte alignment slack before the page end
// --index I                      plant it in the I-th of 9 blocks (0..7, default 0)
//
// One bug a run: compute-sanitizer may end the context after the first error it reports, and a
// kernel that faults loses the context (hence one process per bug). Prints what it planted and
// "result: no fault" (exit 0), or "result: faulted (<error>)" when the planted access made the
// kernel fault (exit 3, at once: the context is gone); without a GPU it says so and exits 77
// (skipped).
#include "gpu_main.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

__global__ void fill(char* p, std::size_t n)
{
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) { p[i] = static_cast<char>(i); }
}
__global__ void write_at(char* p, std::size_t i) { p[i] = 1; }
__global__ void read_at(char const* p, std::size_t i, char* out) { *out = p[i]; }

namespace {

struct args {
  gpukit::segment_source source{gpukit::segment_source::synchronous};
  std::string bug{"none"};
  bool debug{false};
  bool guard_pages{false};
  std::size_t bytes{1000};
  int index{0};
};

bool parse(int argc, char** argv, args& a)
{
  for (int i = 1; i < argc; ++i) {
    std::string const k = argv[i];
    std::string const v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--debug") {
      a.debug = true;
    } else if (k == "--guard-pages") {
      a.guard_pages = true;
    } else if (k == "--bytes" && std::atol(v.c_str()) >= 1 && std::atol(v.c_str()) <= 65536) {
      a.bytes = static_cast<std::size_t>(std::atol(v.c_str()));
      ++i;
    } else if (k == "--source" && (v == "sync" || v == "async" || v == "growable")) {
      a.source = v == "sync"    ? gpukit::segment_source::synchronous
                 : v == "async" ? gpukit::segment_source::stream_ordered
                                : gpukit::segment_source::growable;
      ++i;
    } else if (k == "--bug" && (v == "none" || v == "overrun" || v == "uaf")) {
      a.bug = v;
      ++i;
    } else if (k == "--index" && v.size() == 1 && v[0] >= '0' && v[0] <= '7') {
      a.index = v[0] - '0';
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: sanitizer_planted [--source sync|async|growable] "
                   "[--bug none|overrun|uaf] [--debug] [--guard-pages] [--bytes N] "
                   "[--index 0..7]\n");
      return false;
    }
  }
  return true;
}

// Waits for `s`; when the planted access made a kernel fault, says so and ends the process at once
// (the context is lost: nothing can be freed any more).
void wait_for(cudaStream_t s)
{
  cudaError_t const e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) { return; }
  std::printf("result: faulted (%s: %s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
  std::fflush(stdout);
  std::_Exit(3);
}

int run(args const& a)
{
  std::size_t const n = a.bytes;
  gpukit::caching_allocator_options o;
  o.source            = a.guard_pages ? gpukit::segment_source::growable : a.source;
  o.nvtx_annotate     = !a.guard_pages;
  o.debug.enabled     = a.debug || a.guard_pages;
  o.debug.guard_pages = a.guard_pages;
  gpukit::caching_allocator alloc{gpukit::cuda_runtime::instance(), 0, o};
  cudaStream_t s{};
  GPUKIT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char* out = nullptr;
  GPUKIT_CUDA_TRY(cudaMalloc(&out, 1));
  std::vector<char*> blocks;
  for (int i = 0; i < 9; ++i) {  // the last one: every planted block has a neighbour
    blocks.push_back(static_cast<char*>(alloc.allocate_async(n, s)));
    fill<<<1, 128, 0, s>>>(blocks.back(), n);
  }
  char* const p = blocks[static_cast<std::size_t>(a.index)];
  if (a.bug == "overrun") {
    write_at<<<1, 1, 0, s>>>(p, n);  // one byte past what was asked for
  } else if (a.bug == "uaf") {
    alloc.deallocate_async(p, n, s);
    read_at<<<1, 1, 0, s>>>(p, 0, out);  // its first byte, after its free
    blocks[static_cast<std::size_t>(a.index)] = nullptr;
  } else {
    read_at<<<1, 1, 0, s>>>(p, n - 1, out);  // its last byte: in bounds
  }
  GPUKIT_CUDA_TRY(cudaGetLastError());
  std::printf("planted %s in block %d (%zu bytes%s)\n", a.bug.c_str(), a.index, n,
              a.guard_pages ? ", guard pages" : "");
  std::fflush(stdout);
  wait_for(s);
  for (char* p : blocks) {
    if (p != nullptr) { alloc.deallocate_async(p, n, s); }
  }
  GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
  alloc.forget_stream(s);
  GPUKIT_CUDA_TRY(cudaStreamDestroy(s));
  GPUKIT_CUDA_TRY(cudaFree(out));
  std::printf("result: no fault\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  args a;
  if (!parse(argc, argv, a)) { return 2; }
  return gpukit_examples::run_on_gpu("sanitizer_planted", [&] { return run(a); });
}
