// SPDX-License-Identifier: Apache-2.0
// nvtx_heap_probe: which NVTX heap registrations compute-sanitizer accepts, by the kind of memory
// under the heap (raw CUDA, no gpukit). One variant per run:
//
//   compute-sanitizer --tool memcheck --nvtx yes ./nvtx_heap_probe VARIANT [bug]
//
// VARIANT: sync_unreg_before_free, sync_unreg_after_free, async_nosync, async_synced,
// async_pool_synced, vmm_whole_reserve, vmm_mapped_page, vmm_two_maps_union.
// With `bug`, a kernel writes one byte past a 1000-byte region registered at the heap's start.
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstdio>
#include <cstring>
#include <string>

__global__ void poke(char* p, std::size_t i) { p[i] = 1; }

static nvtxDomainHandle_t dom()
{
  static auto d = nvtxDomainCreateA("probe");
  return d;
}

static nvtxMemHeapHandle_t heap(void* p, std::size_t n)
{
  nvtxMemVirtualRangeDesc_t r{};
  r.ptr  = p;
  r.size = n;
  nvtxMemHeapDesc_t d{};
  d.extCompatID          = NVTX_EXT_COMPATID_MEM;
  d.structSize           = sizeof d;
  d.usage                = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  d.type                 = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  d.typeSpecificDescSize = sizeof r;
  d.typeSpecificDesc     = &r;
  return nvtxMemHeapRegister(dom(), &d);
}
static void region(nvtxMemHeapHandle_t h, void* p, std::size_t n)
{
  nvtxMemVirtualRangeDesc_t r{};
  r.ptr  = p;
  r.size = n;
  nvtxMemRegionsRegisterBatch_t b{};
  b.extCompatID           = NVTX_EXT_COMPATID_MEM;
  b.structSize            = sizeof b;
  b.regionType            = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  b.heap                  = h;
  b.regionCount           = 1;
  b.regionDescElementSize = sizeof r;
  b.regionDescElements    = &r;
  nvtxMemRegionsRegister(dom(), &b);
}
static void unregion(void* p)
{
  nvtxMemRegionRef_t ref{};
  ref.pointer = p;
  nvtxMemRegionsUnregisterBatch_t b{};
  b.extCompatID    = NVTX_EXT_COMPATID_MEM;
  b.structSize     = sizeof b;
  b.refType        = NVTX_MEM_REGION_REF_TYPE_POINTER;
  b.refCount       = 1;
  b.refElementSize = sizeof ref;
  b.refElements    = &ref;
  nvtxMemRegionsUnregister(dom(), &b);
}

static void use(nvtxMemHeapHandle_t h, char* p, bool bug, cudaStream_t s)
{
  region(h, p, 1000);
  poke<<<1, 1, 0, s>>>(p, bug ? 1000 : 999);
  cudaStreamSynchronize(s);
  unregion(p);
}

int main(int argc, char** argv)
{
  if (argc < 2) return 2;
  std::string const v = argv[1];
  bool const bug      = argc > 2 && std::strcmp(argv[2], "bug") == 0;
  cudaFree(nullptr);
  cudaStream_t s{};
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::size_t const seg = 2u << 20;
  if (v.rfind("sync", 0) == 0) {
    void* p{};
    cudaMalloc(&p, seg);
    auto h = heap(p, seg);
    use(h, static_cast<char*>(p), bug, s);
    if (v == "sync_unreg_before_free") {
      nvtxMemHeapUnregister(dom(), h);
      cudaFree(p);
    } else {
      cudaFree(p);
      nvtxMemHeapUnregister(dom(), h);
    }
  } else if (v.rfind("async", 0) == 0) {
    void* p{};
    cudaMemPool_t pool{};
    if (v == "async_pool_synced") {
      cudaMemPoolProps props{};
      props.allocType     = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id   = 0;
      cudaMemPoolCreate(&pool, &props);
      cudaMallocFromPoolAsync(&p, seg, pool, s);
    } else {
      cudaMallocAsync(&p, seg, s);
    }
    if (v != "async_nosync") cudaStreamSynchronize(s);
    auto h = heap(p, seg);
    use(h, static_cast<char*>(p), bug, s);
    nvtxMemHeapUnregister(dom(), h);
    cudaFreeAsync(p, s);
    cudaStreamSynchronize(s);
    if (pool) cudaMemPoolDestroy(pool);
  } else {
    std::size_t const reserve = 64u << 20;
    CUdeviceptr base{};
    cuMemAddressReserve(&base, reserve, 0, 0, 0);
    CUmemAllocationProp prop{};
    prop.type          = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id   = 0;
    CUmemGenericAllocationHandle h1{}, h2{};
    cuMemCreate(&h1, seg, &prop, 0);
    cuMemMap(base, seg, 0, h1, 0);
    if (v == "vmm_two_maps_union") {
      cuMemCreate(&h2, seg, &prop, 0);
      cuMemMap(base + seg, seg, 0, h2, 0);
    }
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cuMemSetAccess(base, v == "vmm_two_maps_union" ? 2 * seg : seg, &acc, 1);
    std::size_t const hbytes = v == "vmm_whole_reserve"    ? reserve
                               : v == "vmm_two_maps_union" ? 2 * seg
                                                           : seg;
    auto h                   = heap(reinterpret_cast<void*>(base), hbytes);
    // a region that straddles the two pages when there are two
    char* p = reinterpret_cast<char*>(base) + (v == "vmm_two_maps_union" ? seg - 512 : 0);
    use(h, p, bug, s);
    nvtxMemHeapUnregister(dom(), h);
    cuMemUnmap(base, seg);
    cuMemRelease(h1);
    if (h2) {
      cuMemUnmap(base + seg, seg);
      cuMemRelease(h2);
    }
    cuMemAddressFree(base, reserve);
  }
  cudaStreamDestroy(s);
  std::printf("probe %s %s done\n", v.c_str(), bug ? "bug" : "clean");
  return 0;
}
