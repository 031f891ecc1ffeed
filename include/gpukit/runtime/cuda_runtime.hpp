// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/cuda_runtime.hpp: the runtime policy over the real CUDA runtime.
//
// Quick start:
//
//   #include <gpukit/runtime/cuda_runtime.hpp>
//
//   void run()
//   {
//     auto& rt = gpukit::cuda_runtime::instance();
//     gpukit::cuda_runtime::stream_type s{};
//     GPUKIT_CUDA_TRY(rt.stream_create(s));  // non-blocking stream
//     void* d = nullptr;
//     GPUKIT_CUDA_TRY(rt.malloc_async(&d, 1 << 20, s));
//     GPUKIT_CUDA_TRY(rt.memset_async(d, 0, 1 << 20, s));
//     GPUKIT_CUDA_TRY(rt.free_async(d, s));
//     GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
//     GPUKIT_CUDA_TRY(rt.stream_destroy(s));
//
//     // Virtual memory: reserve addresses, back them with physical memory, grant access.
//     std::size_t g = 0;
//     GPUKIT_CUDA_TRY(rt.vm_granularity(g, 0));
//     void* va = nullptr;
//     GPUKIT_CUDA_TRY(rt.vm_reserve(&va, 4 * g, 0));
//     gpukit::cuda_runtime::physical_handle h{};
//     GPUKIT_CUDA_TRY(rt.vm_create(h, g, 0));
//     GPUKIT_CUDA_TRY(rt.vm_map(va, g, h));
//     GPUKIT_CUDA_TRY(rt.vm_set_access(va, g, 0));  // `va` is now usable device memory
//   }
//
// `cuda_runtime` implements the Runtime contract of <gpukit/runtime/runtime.hpp> with the CUDA
// runtime API, and virtual memory with the driver API reached through
// `cudaGetDriverEntryPointByVersion` (gpukit never links libcuda). It is an empty class: every
// member is a thin wrapper, safe to call from any thread, that returns the CUDA error and leaves
// nothing behind in CUDA's last-error slot (a non-sticky error is cleared before it returns;
// `cudaErrorNotReady` from a query is not an error: it is removed from the slot only when it is
// what the slot holds, so an unrelated error left there earlier is not swallowed).
//
// On a machine without a driver (or without a device) a program using it still starts, and
// every call returns a clear error (`cudaErrorInsufficientDriver`, `cudaErrorNoDevice`, ...)
// instead of crashing; `driver_version` then reports 0, as `cudaDriverGetVersion` does.
//
// Unless noted, a member acts on the calling thread's current device and does not block.
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/runtime/detail/cuda_errors.hpp>
#include <gpukit/runtime/detail/driver_api.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace gpukit {

/// CUDA's interprocess memory handle (`cuda_runtime::ipc_mem_handle`, also the simulated GPU's).
/// Prefer `Runtime::ipc_mem_handle` in code that is generic over runtimes.
using ipc_mem_handle = cudaIpcMemHandle_t;

// gpukit's own flag values are CUDA's, so cuda_runtime passes them through unchanged.
static_assert(host_alloc_flags::portable == cudaHostAllocPortable &&
              host_alloc_flags::mapped == cudaHostAllocMapped &&
              host_alloc_flags::write_combined == cudaHostAllocWriteCombined &&
              host_alloc_flags::none == cudaHostAllocDefault);
static_assert(host_register_flags::portable == cudaHostRegisterPortable &&
              host_register_flags::mapped == cudaHostRegisterMapped &&
              host_register_flags::read_only == cudaHostRegisterReadOnly &&
              host_register_flags::none == cudaHostRegisterDefault);

/// The Runtime policy that drives a real GPU through CUDA. Stateless; use `instance()`.
/// Its error vocabulary (error_type = cudaError_t, the named codes such as `out_of_memory`, the
/// capture modes, error_name and error_string) comes from detail::cuda_error_vocabulary.
class cuda_runtime final : public detail::cuda_error_vocabulary {
 public:
  using stream_type                  = cudaStream_t;  ///< nullptr: the legacy default stream
  using event_type                   = cudaEvent_t;
  using physical_handle              = CUmemGenericAllocationHandle;  ///< from cuMemCreate
  using ipc_mem_handle               = cudaIpcMemHandle_t;            ///< 64 opaque bytes
  static constexpr bool is_simulated = false;

  cuda_runtime()                               = default;
  ~cuda_runtime()                              = default;
  cuda_runtime(cuda_runtime const&)            = default;
  cuda_runtime& operator=(cuda_runtime const&) = default;
  cuda_runtime(cuda_runtime&&)                 = default;
  cuda_runtime& operator=(cuda_runtime&&)      = default;

  /// The process-wide instance (a function-local static; the class holds no state).
  [[nodiscard]] static cuda_runtime& instance() noexcept;

  // ---- The Runtime contract's operations ---------------------------------------------------
  // One member per entry of GPUKIT_RUNTIME_OPS (gpukit/runtime/contract.hpp), declared from that
  // list: `[[nodiscard]] error_type NAME(PARAMETERS)`. What each does in cuda_runtime:
  //
  // Devices:
  //   device_count: Number of CUDA devices (cudaGetDeviceCount). @param n set to the count, 0 on
  //     failure. @return cudaSuccess, or e.g. cudaErrorNoDevice / cudaErrorInsufficientDriver.
  //     Does not block.
  //   get_device: The calling thread's current device (cudaGetDevice). @param d set to its
  //     ordinal. @return cudaSuccess or the CUDA error. Does not block.
  //   set_device: Makes `d` the calling thread's current device and initializes its primary
  //     context (cudaSetDevice). @return cudaSuccess, or cudaErrorInvalidDevice for a bad
  //     ordinal. Blocks only while a context is first created.
  //   get_device_properties: Fills `p` for device `d` (cudaGetDeviceProperties; virtual-memory
  //     support from the driver's CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, false
  //     when the driver API cannot be reached). @return cudaSuccess, or cudaErrorInvalidDevice /
  //     the CUDA error. Does not block.
  //   mem_get_info: Free and total memory of the current device in bytes (cudaMemGetInfo).
  //     @return cudaSuccess or the CUDA error. Does not block.
  //   driver_version: The driver's CUDA version, e.g. 13000 (cudaDriverGetVersion); 0 with
  //     cudaSuccess when no driver is installed. Does not block.
  //   runtime_version: The CUDA runtime's version gpukit was built with, e.g. 13000
  //     (cudaRuntimeGetVersion).
  //   device_synchronize: Blocks until every stream of the current device is idle
  //     (cudaDeviceSynchronize). @return cudaSuccess, or an error of earlier asynchronous work.
  //   device_can_access_peer: Whether `device` can access the memory of `peer`
  //     (cudaDeviceCanAccessPeer). @param can set to 1 or 0 (0 for device == peer). Does not
  //     block.
  //   device_enable_peer_access: Lets the current device access `peer`'s memory
  //     (cudaDeviceEnablePeerAccess, flags 0): copies and kernels then reach it over NVLink or
  //     PCIe directly. @return cudaSuccess; cudaErrorPeerAccessAlreadyEnabled when already
  //     enabled (cleared from the error slot); cudaErrorPeerAccessUnsupported /
  //     cudaErrorInvalidDevice otherwise. May block briefly.
  // Device memory:
  //   malloc: Allocates `bytes` on the current device (cudaMalloc). @param p set to the memory.
  //     @return cudaSuccess, or cudaErrorMemoryAllocation when the device is full. May
  //     synchronize the device.
  //   free: Frees memory from `malloc` (cudaFree). @return cudaSuccess, or cudaErrorInvalidValue
  //     for a pointer `malloc` did not return. May synchronize the device.
  //   malloc_async: Stream-ordered allocation from the device's default memory pool
  //     (cudaMallocAsync): the memory may be used by work on `s` enqueued after this call. Does
  //     not block. @return cudaSuccess, cudaErrorMemoryAllocation, or cudaErrorNotSupported
  //     without pools.
  //   free_async: Stream-ordered free (cudaFreeAsync): `p` is freed once the work before it on
  //     `s` is done. Does not block.
  // Pinned host memory:
  //   host_alloc: Allocates page-locked host memory (cudaHostAlloc). @param flags
  //     host_alloc_flags, passed through. @return cudaSuccess or cudaErrorMemoryAllocation.
  //     Blocks while pages are pinned (milliseconds for large sizes).
  //   host_free: Frees memory from `host_alloc` (cudaFreeHost). May synchronize the device.
  //   host_register: Page-locks an existing host range (cudaHostRegister). @param flags
  //     host_register_flags, passed through. @return cudaSuccess, or
  //     cudaErrorHostMemoryAlreadyRegistered. Blocks while pages are pinned.
  //   host_unregister: Undoes `host_register` (cudaHostUnregister). @return cudaSuccess, or
  //     cudaErrorHostMemoryNotRegistered. May synchronize the device.
  // Virtual memory (driver API):
  // Each returns the error of the driver-entry-point lookup (e.g. cudaErrorInsufficientDriver)
  // when the driver API cannot be reached, and maps driver errors to their runtime names
  // (CUDA_ERROR_OUT_OF_MEMORY -> cudaErrorMemoryAllocation, ...). Each first makes the current
  // device's primary context current on the calling thread (cudaFree(nullptr), which frees
  // nothing), as the driver calls expect; that fails with the runtime's error on a machine
  // without a usable device.
  //   vm_granularity: Minimum mapping granularity of pinned memory on `device`
  //     (cuMemGetAllocationGranularity, CU_MEM_ALLOC_GRANULARITY_MINIMUM). Does not block.
  //   vm_reserve: Reserves `bytes` of device address space, no memory behind it
  //     (cuMemAddressReserve). @param alignment a power of two, or 0 for the granularity. Does
  //     not block.
  //   vm_free: Frees a whole range from `vm_reserve`; it must be unmapped first
  //     (cuMemAddressFree).
  //   vm_create: Creates `bytes` of physical memory on `device`, a multiple of the granularity
  //     (cuMemCreate). @param shareable request CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, so that
  //     vm_export_shareable can export it to another process @return cudaSuccess, or
  //     cudaErrorMemoryAllocation when the device is full. Does not block.
  //   vm_export_shareable: A new POSIX file descriptor naming the memory of `h`, which must have
  //     been created shareable (cuMemExportToShareableHandle,
  //     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). The caller owns and closes it; another process
  //     receives it over a unix socket (SCM_RIGHTS). Does not block.
  //   vm_import_shareable: A handle to the memory that `fd` (from vm_export_shareable, maybe of
  //     another process) names (cuMemImportFromShareableHandle); map it with vm_map, release it
  //     with vm_release. `fd` stays the caller's to close. Does not block.
  //   vm_release: Releases a handle (cuMemRelease); its memory is freed once it is also unmapped.
  //   vm_map: Maps the whole of `h` (`bytes` long) at `va`, inside a reserved, unmapped range
  //     (cuMemMap). The memory is inaccessible until `vm_set_access`. Does not block.
  //   vm_unmap: Unmaps whole mappings in [va, va + bytes) (cuMemUnmap). @return cudaSuccess, or
  //     cudaErrorInvalidValue when the range is not exactly mapped. May synchronize the device.
  //   vm_set_access: Grants `device` read-write access to the fully mapped range [va, va + bytes)
  //     (cuMemSetAccess, CU_MEM_ACCESS_FLAGS_PROT_READWRITE). May synchronize the device.
  // Interprocess memory (CUDA IPC):
  //   ipc_get_mem_handle: A handle naming the cudaMalloc allocation that holds `p`, for another
  //     process (cudaIpcGetMemHandle). cudaMallocAsync memory of the default pool cannot be
  //     exported this way (cudaErrorInvalidValue). Does not block.
  //   ipc_open_mem_handle: Maps the allocation `h` names, exported by another process, for the
  //     current device (cudaIpcOpenMemHandle, cudaIpcMemLazyEnablePeerAccess): *p = its base.
  //     Opening the same handle again in this context returns the same pointer (reference
  //     counted). May block.
  //   ipc_close_mem_handle: Unmaps memory from ipc_open_mem_handle (cudaIpcCloseMemHandle). May
  //     block.
  // Streams:
  //   stream_create: Creates a stream on the current device that does not synchronize with the
  //     legacy null stream (cudaStreamCreateWithFlags, cudaStreamNonBlocking). Does not block.
  //   stream_destroy: Destroys `s` (cudaStreamDestroy); returns at once, work already queued on
  //     `s` still runs.
  //   stream_synchronize: Blocks until every piece of work queued on `s` has completed
  //     (cudaStreamSynchronize).
  //   stream_query: cudaSuccess when `s` is idle, cudaErrorNotReady while work is pending
  //     (cudaStreamQuery). Does not block.
  //   stream_wait_event: Work queued on `s` after this call waits until `e`'s capture completes
  //     (cudaStreamWaitEvent). Does not block the host.
  //   stream_get_device: The device `s` was created on (cudaStreamGetDevice; the current device
  //     for the null stream). @param device set to its ordinal. Does not block.
  // Events:
  //   event_create: Creates an event (cudaEventCreateWithFlags): cudaEventDisableTiming unless
  //     `timing`.
  //   event_destroy: Destroys `e` (cudaEventDestroy); returns at once even if its capture is
  //     pending.
  //   event_record: Captures the work queued on `s` so far in `e` (cudaEventRecord). Does not
  //     block.
  //   event_query: cudaSuccess when `e`'s capture has completed or `e` was never recorded, else
  //     cudaErrorNotReady (cudaEventQuery). Does not block.
  //   event_synchronize: Blocks until `e`'s capture completes (cudaEventSynchronize).
  //   event_elapsed_time: Milliseconds between two completed timing events
  //     (cudaEventElapsedTime). @return cudaSuccess; cudaErrorInvalidResourceHandle for an event
  //     created without timing or never recorded; cudaErrorNotReady while either is pending. Does
  //     not block.
  // Copies and work on streams (stream-ordered; never block the host):
  //   memcpy_async: Copies `bytes` from `src` to `dst` in stream order (cudaMemcpyAsync). A
  //     pageable host source or destination makes CUDA stage the copy and may make it
  //     synchronous.
  //   memcpy_peer_async: Copies between devices (or within one) in stream order
  //     (cudaMemcpyPeerAsync).
  //   memset_async: Sets `bytes` bytes at `dst` to `value` in stream order (cudaMemsetAsync).
  //   launch_host_func: Runs `fn(user)` on a CUDA thread once the work before it on `s`
  //     completes; later work on `s` waits for it (cudaLaunchHostFunc). `fn` must not call the
  //     runtime, and should not block for long: CUDA may run the host functions of every stream
  //     on one thread, one at a time.
  //   stream_is_capturing: Whether `s` is being captured into a CUDA graph
  //     (cudaStreamIsCapturing; legal during capture). Does not block.
  //   stream_capture_id: The id of the capture `s` takes part in, as the stream that began it or
  //     as one joined to it by waiting on an event recorded in it; 0 when `s` is not capturing
  //     (cudaStreamGetCaptureInfo; legal during capture, unlike cudaStreamGetDevice,
  //     cudaStreamQuery, cudaStreamGetFlags and cudaStreamGetId, which invalidate it). Does not
  //     block.
  //   exchange_capture_mode: Swaps the calling thread's stream capture mode
  //     (cudaThreadExchangeStreamCaptureMode), e.g. to cudaStreamCaptureModeRelaxed around a
  //     cudaMalloc that a capture in global mode would reject.
  GPUKIT_RUNTIME_OPS(GPUKIT_RUNTIME_DECLARE_OPERATION)

  // ---- Graph capture itself (not in the contract: a graph is CUDA's own type) ----------------

  /// Begins capturing `s` into a CUDA graph (cudaStreamBeginCapture). Does not block.
  /// @param s the stream that begins (and must end) the capture
  /// @param mode capture_mode_global (the default, as CUDA's), capture_mode_thread_local or
  ///   capture_mode_relaxed: which threads' unsafe calls (cudaMalloc, synchronizations, queries)
  ///   the capture refuses
  [[nodiscard]] cudaError_t begin_capture(stream_type s, int mode = capture_mode_global);
  /// Ends the capture begun on `s` (cudaStreamEndCapture): `graph` = the captured graph, which
  /// the caller destroys (cudaGraphDestroy). @return cudaErrorStreamCaptureInvalidated when a call
  /// invalidated the capture, cudaErrorStreamCaptureUnjoined when a stream forked into it was not
  /// joined back, cudaErrorStreamCaptureUnmatched when `s` did not begin it (graph null then).
  [[nodiscard]] cudaError_t end_capture(stream_type s, cudaGraph_t& graph);
  /// As above, destroying the graph at once: for code that needs only the capture's verdict.
  [[nodiscard]] cudaError_t end_capture(stream_type s);
};

static_assert(is_runtime_v<cuda_runtime>, "cuda_runtime must satisfy the Runtime contract");

}  // namespace gpukit

#include <gpukit/runtime/detail/cuda_runtime_impl.hpp>
