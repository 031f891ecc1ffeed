// SPDX-License-Identifier: Apache-2.0
// vmm_cost: what the driver charges for the calls that growable segments make, per call and per
// GiB, next to cudaMalloc/cudaFree of the same amount: the numbers behind the growable source's
// page size and its way of mapping a run of pages.
//
//   vmm_cost [--total-mib N] [--rounds N]
//
// For each page size (2, 8, 20, 32, 64 MiB) and a total of N MiB (default 4096), each way of
// mapping the total is timed `rounds` times (median reported):
//   per_page     one cuMemCreate and one cuMemMap per page, one cuMemSetAccess over the run
//   one_mapping  one cuMemCreate and one cuMemMap for the run, one cuMemSetAccess
//   access_each  as per_page, but one cuMemSetAccess per page
//   cuda_malloc  one cudaMalloc per page-sized chunk
// and undone (unmap and release, or cudaFree). Output: one JSON object per line.
// (Mapping one handle page by page is not a way: cuMemMap refuses a non-zero offset into a handle,
// CUDA_ERROR_NOT_SUPPORTED on an H100 with driver 580, as its documentation says.)
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

void check(CUresult r, char const* what)
{
  if (r != CUDA_SUCCESS) {
    char const* s = nullptr;
    cuGetErrorString(r, &s);
    std::fprintf(stderr, "vmm_cost: %s failed: %s\n", what, s != nullptr ? s : "?");
    std::exit(1);
  }
}

double us_since(clk::time_point t0)
{
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

struct timing {
  double map_us{0};
  double unmap_us{0};
};

CUmemAllocationProp prop_for(int device)
{
  CUmemAllocationProp p{};
  p.type          = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id   = device;
  return p;
}

CUmemAccessDesc access_for(int device)
{
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id   = device;
  a.flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

// Maps `pages` pages of `page` bytes at va the way `how` names, then undoes it; returns the times.
timing run_vmm(std::string const& how, CUdeviceptr va, std::size_t page, std::size_t pages,
               int device)
{
  CUmemAllocationProp const prop = prop_for(device);
  CUmemAccessDesc const access   = access_for(device);
  std::vector<CUmemGenericAllocationHandle> handles;
  timing t;
  auto const t0 = clk::now();
  if (how == "per_page" || how == "access_each") {
    handles.resize(pages);
    for (std::size_t i = 0; i < pages; ++i) {
      check(cuMemCreate(&handles[i], page, &prop, 0), "cuMemCreate");
      check(cuMemMap(va + i * page, page, 0, handles[i], 0), "cuMemMap");
      if (how == "access_each") {
        check(cuMemSetAccess(va + i * page, page, &access, 1), "access");
      }
    }
    if (how == "per_page") {
      check(cuMemSetAccess(va, pages * page, &access, 1), "cuMemSetAccess");
    }
  } else {  // one_mapping
    handles.resize(1);
    check(cuMemCreate(&handles[0], pages * page, &prop, 0), "cuMemCreate");
    check(cuMemMap(va, pages * page, 0, handles[0], 0), "cuMemMap");
    check(cuMemSetAccess(va, pages * page, &access, 1), "cuMemSetAccess");
  }
  check(cuCtxSynchronize(), "cuCtxSynchronize");
  t.map_us      = us_since(t0);
  auto const t1 = clk::now();
  if (how == "one_mapping") {
    check(cuMemUnmap(va, pages * page), "cuMemUnmap");
  } else {
    for (std::size_t i = 0; i < pages; ++i) {
      check(cuMemUnmap(va + i * page, page), "cuMemUnmap");
    }
  }
  for (auto h : handles) { check(cuMemRelease(h), "cuMemRelease"); }
  check(cuCtxSynchronize(), "cuCtxSynchronize");
  t.unmap_us = us_since(t1);
  return t;
}

timing run_malloc(std::size_t page, std::size_t pages)
{
  std::vector<void*> ptrs(pages, nullptr);
  timing t;
  auto const t0 = clk::now();
  for (auto& p : ptrs) {
    if (cudaMalloc(&p, page) != cudaSuccess) {
      std::fprintf(stderr, "vmm_cost: cudaMalloc of %zu bytes failed\n", page);
      std::exit(1);
    }
  }
  cudaDeviceSynchronize();
  t.map_us      = us_since(t0);
  auto const t1 = clk::now();
  for (void* p : ptrs) { cudaFree(p); }
  cudaDeviceSynchronize();
  t.unmap_us = us_since(t1);
  return t;
}

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv)
{
  std::size_t total_mib = 4096;
  int rounds            = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--total-mib") == 0) {
      total_mib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (std::strcmp(argv[i], "--rounds") == 0) {
      rounds = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "vmm_cost: unknown option %s (--total-mib N, --rounds N)\n", argv[i]);
      return 2;
    }
  }
  if (total_mib == 0 || rounds < 1) {
    std::fprintf(stderr, "vmm_cost: --total-mib and --rounds must be at least 1\n");
    return 2;
  }
  check(cuInit(0), "cuInit");
  cudaFree(nullptr);  // the primary context
  int const device             = 0;
  CUmemAllocationProp const pr = prop_for(device);
  std::size_t granularity      = 0;
  check(cuMemGetAllocationGranularity(&granularity, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "granularity");
  std::size_t const total = total_mib << 20;
  CUdeviceptr va          = 0;
  check(cuMemAddressReserve(&va, total, 0, 0, 0), "cuMemAddressReserve");
  char const* hows[] = {"per_page", "one_mapping", "access_each", "cuda_malloc"};
  for (std::size_t page_mib : {2, 8, 20, 32, 64}) {
    std::size_t const page  = page_mib << 20;
    std::size_t const pages = total / page;
    if (page % granularity != 0 || pages == 0) { continue; }
    for (char const* how : hows) {
      std::vector<double> map, unmap;
      for (int r = 0; r < rounds; ++r) {
        timing const t = std::strcmp(how, "cuda_malloc") == 0
                           ? run_malloc(page, pages)
                           : run_vmm(how, va, page, pages, device);
        map.push_back(t.map_us);
        unmap.push_back(t.unmap_us);
      }
      double const gib = static_cast<double>(pages * page) / static_cast<double>(1ull << 30);
      std::printf(
        "{\"how\": \"%s\", \"page_mib\": %zu, \"pages\": %zu, \"map_us\": %.1f, \"unmap_us\": "
        "%.1f, "
        "\"map_us_per_page\": %.2f, \"map_ms_per_gib\": %.3f, \"unmap_ms_per_gib\": %.3f}\n",
        how, page_mib, pages, median(map), median(unmap), median(map) / static_cast<double>(pages),
        median(map) / 1000.0 / gib, median(unmap) / 1000.0 / gib);
      std::fflush(stdout);
    }
  }
  check(cuMemAddressFree(va, total), "cuMemAddressFree");
  return 0;
}
