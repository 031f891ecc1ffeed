// SPDX-License-Identifier: Apache-2.0
// libgpukit_torch_trivial.so: the smallest allocator of PyTorch's pluggable ABI, straight over
// cudaMallocAsync / cudaFreeAsync on the device's default memory pool. It measures what
// torch.cuda.memory.CUDAPluggableAllocator costs by itself (PyTorch keeps its own pointer map under
// a lock on every allocation and free): compared with PyTorch's native cudaMallocAsync backend
// (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), the two differ only in that path.
//
// As PyTorch's cudaMallocAsync backend does, the pool's release threshold is raised to "never" on
// first use, so that freed memory stays cached in the pool instead of going back to the device at
// every synchronization. What can be measured of it: the pool's reserved and used bytes, current
// and high-water (cudaMemPoolAttrReserved/UsedMem{Current,High}), through
// gpukit_trivial_pool_stats.
//
//   void* gpukit_trivial_malloc(size_t size, int device, cudaStream_t stream);  // throws on OOM
//   void  gpukit_trivial_free(void* ptr, size_t size, int device, cudaStream_t stream);
//   int   gpukit_trivial_pool_stats(int device, unsigned long long out[4]);
//         // reserved, reserved high, used, used high; 0 on success, else the cudaError_t
//   int   gpukit_trivial_reset_peak(int device);
#include <gpukit/error.hpp>  // gpukit::bad_alloc: a std::bad_alloc with a message

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>

#define GPUKIT_TRIVIAL_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int max_devices = 64;
std::atomic<bool> pool_configured[max_devices]{};

// The calling thread's current device becomes `device` for the scope (cudaMallocAsync takes the
// pool of the stream's device, but the pool attributes are set on the current device's).
class device_guard {
 public:
  explicit device_guard(int device)
  {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device &&
        cudaSetDevice(device) == cudaSuccess) {
      previous_ = current;
    }
  }
  ~device_guard()
  {
    if (previous_ >= 0) { (void)cudaSetDevice(previous_); }
  }
  device_guard(device_guard const&)            = delete;
  device_guard& operator=(device_guard const&) = delete;

 private:
  int previous_{-1};
};

cudaError_t default_pool(int device, cudaMemPool_t& pool)
{
  if (device < 0 || device >= max_devices) { return cudaErrorInvalidDevice; }
  cudaError_t const e = cudaDeviceGetDefaultMemPool(&pool, device);
  if (e != cudaSuccess) { return e; }
  if (!pool_configured[device].load(std::memory_order_acquire)) {
    std::uint64_t never = UINT64_MAX;
    cudaError_t const s = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &never);
    if (s != cudaSuccess) { return s; }
    pool_configured[device].store(true, std::memory_order_release);
  }
  return cudaSuccess;
}

}  // namespace

GPUKIT_TRIVIAL_API void* gpukit_trivial_malloc(size_t size, int device, cudaStream_t stream)
{
  if (size == 0) { return nullptr; }
  device_guard guard{device};
  void* p       = nullptr;
  cudaError_t e = cudaSuccess;
  if (device < 0 || device >= max_devices ||
      !pool_configured[device].load(std::memory_order_acquire)) {
    cudaMemPool_t pool{};
    e = default_pool(device, pool);  // once per device: the release threshold
  }
  if (e == cudaSuccess) { e = cudaMallocAsync(&p, size, stream); }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw gpukit::bad_alloc{"gpukit: gpukit_trivial_malloc: cudaMallocAsync of " +
                            std::to_string(size) + " bytes on device " + std::to_string(device) +
                            " failed with " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
  }
  return p;
}

GPUKIT_TRIVIAL_API void gpukit_trivial_free(void* ptr, size_t size, int device, cudaStream_t stream)
{
  if (ptr == nullptr) { return; }
  device_guard guard{device};
  cudaError_t const e = cudaFreeAsync(ptr, stream);
  if (e != cudaSuccess && e != cudaErrorCudartUnloading && e != cudaErrorContextIsDestroyed) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "gpukit_trivial_free(%p, %zu bytes, device %d): %s\n", ptr, size, device,
                 cudaGetErrorName(e));
  }
}

GPUKIT_TRIVIAL_API int gpukit_trivial_pool_stats(int device, unsigned long long out[4])
{
  cudaMemPool_t pool{};
  cudaError_t e                  = default_pool(device, pool);
  cudaMemPoolAttr const attrs[4] = {cudaMemPoolAttrReservedMemCurrent,
                                    cudaMemPoolAttrReservedMemHigh, cudaMemPoolAttrUsedMemCurrent,
                                    cudaMemPoolAttrUsedMemHigh};
  for (int i = 0; i < 4 && e == cudaSuccess; ++i) {
    std::uint64_t v = 0;
    e               = cudaMemPoolGetAttribute(pool, attrs[i], &v);
    out[i]          = v;
  }
  return static_cast<int>(e);
}

GPUKIT_TRIVIAL_API int gpukit_trivial_reset_peak(int device)
{
  cudaMemPool_t pool{};
  cudaError_t e      = default_pool(device, pool);
  std::uint64_t zero = 0;  // resetting a high-water mark: only 0 is accepted
  if (e == cudaSuccess) {
    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
  }
  if (e == cudaSuccess) { e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero); }
  return static_cast<int>(e);
}
