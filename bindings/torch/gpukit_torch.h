// SPDX-License-Identifier: Apache-2.0
/* gpukit_torch.h: the C ABI of libgpukit_torch.so, gpukit's caching allocator as PyTorch's and
 * CuPy's device allocator (bindings/torch/gpukit_torch.pluggable installs it).
 *
 * Quick start (Python, before PyTorch touches CUDA):
 *
 *   import gpukit_torch
 *   gpukit_torch.install()                    # torch.cuda.memory.CUDAPluggableAllocator
 *   ...train...
 *   print(gpukit_torch.stats()["reserved_bytes_peak"])
 *
 * From C or C++: dlopen the library and call these functions. One allocator per device, created
 * on first use; every call names its device and sets it as the calling thread's current device for
 * the duration of the call (restoring the previous one), so the caller's current device does not
 * matter. Allocators are never destroyed: tensors freed while the process exits stay valid to free.
 *
 * Segment source (how each allocator takes memory from the device), chosen once, before the first
 * allocator is created: gpukit_torch_configure(), else the environment variable
 * GPUKIT_TORCH_SEGMENTS = growable | stream_ordered | synchronous | automatic. The default is
 * growable where this gpukit has growable (virtual-memory) segments, else automatic.
 *
 * Errors: functions returning int return 0 on success and -1 on error; gpukit_torch_last_error()
 * then says why. Only gpukit_torch_malloc throws (see there); nothing else lets an exception out.
 */
#ifndef GPUKIT_TORCH_H
#define GPUKIT_TORCH_H

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define GPUKIT_TORCH_API __attribute__((visibility("default")))
#else
#define GPUKIT_TORCH_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* gpukit_torch_stats: one device's allocator statistics (PyTorch's memory_stats vocabulary).
 * Fields are only ever added at the end; gpukit_torch_get_stats takes the caller's struct size. */
typedef struct gpukit_torch_stats {
  int64_t allocated_bytes; /* bytes of blocks held by users (256-byte rounded) */
  int64_t allocated_bytes_peak;
  int64_t reserved_bytes; /* bytes of segments held from the device */
  int64_t reserved_bytes_peak;
  int64_t active_bytes;
  int64_t active_bytes_peak;
  int64_t requested_bytes; /* bytes users asked for */
  int64_t requested_bytes_peak;
  int64_t inactive_split_bytes;
  int64_t inactive_split_bytes_peak;
  int64_t allocation_count;
  int64_t allocation_count_peak;
  int64_t segment_count;
  int64_t segment_count_peak;
  int64_t num_allocs;
  int64_t num_frees;
  int64_t num_device_allocs; /* segments taken from the device */
  int64_t num_device_frees;
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t synchronizing_frees;
  int64_t limit_bytes;    /* 0: none */
  int64_t bad_frees;      /* frees of pointers this device's allocator never gave (ignored) */
  int64_t segment_source; /* gpukit::segment_source as an integer; see gpukit_torch_stats_json */
  int64_t initialized;    /* 1 when the device's allocator exists (else every field is 0) */
  int64_t num_cache_hits; /* allocations served by a per-thread cache */
  /* Growable segments: physical pages created, released, and unmapped then mapped again. */
  int64_t num_pages_created;
  int64_t num_pages_released;
  int64_t num_pages_reused;
} gpukit_torch_stats;

/* The allocation function of torch.cuda.memory.CUDAPluggableAllocator: `size` bytes on `device`,
 * usable in `stream` order. size 0 returns NULL (PyTorch's empty tensors).
 *
 * Never returns NULL for size > 0: PyTorch does not check. Failure throws a C++ exception derived
 * from std::exception through this C-linkage function into PyTorch's C++ frames (both sides use
 * the same C++ runtime), which PyTorch's Python binding turns into a Python exception:
 *   - out of memory: gpukit::out_of_memory (a std::bad_alloc) whose message begins
 *     "gpukit: out of memory on device D: tried to allocate X MiB (N bytes)" and goes on with the
 *     allocator's state and what recovery tried; PyTorch reports it as RuntimeError with that
 *     message (torch.OutOfMemoryError is only raised for c10::OutOfMemoryError, a type only code
 *     that links libc10 can throw);
 *   - anything else (a bad device, a CUDA error): std::runtime_error naming size and device.
 * Callers that cannot take a C++ exception (ctypes, C) use gpukit_torch_malloc_nothrow. */
GPUKIT_TORCH_API void* gpukit_torch_malloc(size_t size, int device, cudaStream_t stream);

/* The free function of torch.cuda.memory.CUDAPluggableAllocator: `ptr` of `size` bytes (as
 * allocated; 0: do not check the size), freed in `stream` order. NULL is ignored. Never throws:
 * a pointer gpukit never gave, a double free or a wrong size is ignored (the allocator is left
 * unchanged), counted in bad_frees, written to stderr and kept in gpukit_torch_last_error;
 * with GPUKIT_TORCH_ABORT_ON_BAD_FREE=1 in the environment it aborts instead. */
GPUKIT_TORCH_API void gpukit_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);

/* gpukit_torch_malloc without exceptions: 0 and *out set on success (NULL for size 0); 1 when
 * the allocation was refused (out of memory, over the limit, larger than the device); -1 on any
 * other error. The reason is in gpukit_torch_last_error. */
GPUKIT_TORCH_API int gpukit_torch_malloc_nothrow(size_t size, int device, cudaStream_t stream,
                                                 void** out);

/* Chooses the segment source of allocators created from now on ("growable", "stream_ordered",
 * "synchronous", "automatic"; NULL or "": GPUKIT_TORCH_SEGMENTS, else the default). -1 for an
 * unknown name, or one this gpukit does not have. Allocators already created keep theirs. */
GPUKIT_TORCH_API int gpukit_torch_configure(char const* segments);

/* Copies device `device`'s statistics into *out (at most out_size bytes: pass sizeof(*out)).
 * device -1: the calling thread's current device. Zeros (initialized = 0) before the device's
 * first allocation. */
GPUKIT_TORCH_API int gpukit_torch_get_stats(int device, gpukit_torch_stats* out, size_t out_size);

/* The same statistics as one JSON object, plus "device" and "segments" (the source's name),
 * written into buf (NUL-terminated, truncated to buf_size - 1 characters). Returns the full
 * length (excluding the NUL; call again with a larger buffer when it is >= buf_size), -1 on
 * error. */
GPUKIT_TORCH_API long long gpukit_torch_stats_json(int device, char* buf, size_t buf_size);

/* Returns every fully free segment of `device` (-1: of every device) to the device, as
 * torch.cuda.empty_cache() does for PyTorch's allocator (which, for a pluggable allocator, does
 * nothing). Returns the bytes released, or -1 on error. */
GPUKIT_TORCH_API long long gpukit_torch_empty_cache(int device);

/* Resets every peak of `device` (-1: the current device) to its current value. */
GPUKIT_TORCH_API int gpukit_torch_reset_peak(int device);

/* Limits the bytes `device` (-1: the current device) may hold from the device (0: no limit).
 * Creates the device's allocator if needed; does not release memory by itself. */
GPUKIT_TORCH_API int gpukit_torch_set_limit(int device, size_t bytes);

/* Starts (enabled != 0; a ring of events_per_thread events per thread, 0: 65536) or stops
 * recording allocator events on `device` (-1: the current device), for gpukit_torch_snapshot. */
GPUKIT_TORCH_API int gpukit_torch_record_history(int device, int enabled, size_t events_per_thread);

/* Writes `device`'s segments, blocks and recorded events to `path` as `format`:
 *   "pickle"  PyTorch's memory snapshot (python -m torch.cuda._memory_viz trace_plot FILE)
 *   "json"    gpukit's JSON; "trace": replay_trace's format; "html": a self-contained report
 * format NULL or "": from the path's extension (.pickle/.pkl, .json, .trace, .html), else pickle.
 */
GPUKIT_TORCH_API int gpukit_torch_snapshot(int device, char const* path, char const* format);

/* The last error any call of this library recorded (process-wide: frees run on PyTorch's threads),
 * copied into buf (NUL-terminated, truncated). Returns its full length; 0 when there was none. */
GPUKIT_TORCH_API size_t gpukit_torch_last_error(char* buf, size_t buf_size);

#ifdef __cplusplus
}
#endif

#endif /* GPUKIT_TORCH_H */
