// SPDX-License-Identifier: Apache-2.0
// sanitizer_planted: plants one-byte overruns or reads after free in 1000-byte blocks of a gpukit
// caching allocator, for each segment source, so that compute-sanitizer's catch rate can be
// measured (benchmarks/profile/sanitizer_table.sh runs the whole matrix):
//
//   compute-sanitizer --tool memcheck --nvtx yes ./sanitizer_planted --source sync --bug overrun
//   ./sanitizer_planted --source growable --bug uaf --debug     # debug mode (quarantine, poison)
//
// --source sync|async|growable   segment source (synchronous, stream_ordered, growable)
// --bug none|overrun|uaf         none: a clean run; overrun: each kernel writes p[1000] of its
//                                block; uaf: each kernel reads a block after its free
// --debug                        the allocator's debug mode (as GPUKIT_DEBUG=1)
// --index I                      plant it in the I-th of 9 blocks (0..7, default 0)
//
// One bug a run: compute-sanitizer may end the context after the first error it reports.
// Prints what it planted and exits 0; without a GPU it says so and exits 0.
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
  int index{0};
};

bool parse(int argc, char** argv, args& a)
{
  for (int i = 1; i < argc; ++i) {
    std::string const k = argv[i];
    std::string const v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--debug") {
      a.debug = true;
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
                   "[--bug none|overrun|uaf] [--debug] [--index 0..7]\n");
      return false;
    }
  }
  return true;
}

int run(args const& a)
{
  constexpr std::size_t n = 1000;
  gpukit::caching_allocator_options o;
  o.source        = a.source;
  o.nvtx_annotate = true;
  o.debug.enabled = a.debug;
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
  GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
  for (char* p : blocks) {
    if (p != nullptr) { alloc.deallocate_async(p, n, s); }
  }
  GPUKIT_CUDA_TRY(cudaStreamSynchronize(s));
  alloc.forget_stream(s);
  GPUKIT_CUDA_TRY(cudaStreamDestroy(s));
  GPUKIT_CUDA_TRY(cudaFree(out));
  std::printf("planted %s in block %d\n", a.bug.c_str(), a.index);
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  args a;
  if (!parse(argc, argv, a)) { return 2; }
  int devices = 0;
  if (gpukit::cuda_runtime::instance().device_count(devices) != cudaSuccess || devices == 0) {
    std::printf("sanitizer_planted: no GPU, nothing to show\n");
    return 0;
  }
  try {
    return run(a);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "sanitizer_planted: %s\n", e.what());
    return 1;
  }
}
