// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/cuda_runtime_impl.hpp: bodies of gpukit::cuda_runtime. Not public API;
// include <gpukit/runtime/cuda_runtime.hpp> instead.
#pragma once

#include <gpukit/runtime/detail/driver_api.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gpukit {

namespace detail {

/// Returns `e` after clearing it from CUDA's last-error slot, so that the next unrelated call (or
/// a user's cudaGetLastError after a kernel launch) does not report it. Sticky errors stay: the
/// context is unusable. cudaErrorNotReady is a query's answer, not an error: it is cleared only
/// when it is what the slot holds, so that an unrelated error left there earlier survives.
inline cudaError_t cuda_result(cudaError_t e) noexcept
{
  if (e == cudaErrorNotReady) {
    if (::cudaPeekAtLastError() == cudaErrorNotReady) { (void)::cudaGetLastError(); }
  } else if (e != cudaSuccess) {
    (void)::cudaGetLastError();
  }
  return e;
}

/// Makes sure the driver is initialized and the current device's primary context is current on
/// the calling thread, as the driver's virtual-memory calls expect. cudaFree(nullptr) does
/// exactly that and nothing else (it frees nothing and does not synchronize).
inline cudaError_t bind_primary_context() noexcept { return cuda_result(::cudaFree(nullptr)); }

/// The driver entry points, after binding the context; `status` is the first failure.
struct vm_call {
  driver_entry_points const& api;
  cudaError_t status;
};

inline vm_call begin_vm_call() noexcept
{
  driver_entry_points const& api = driver_api();
  if (api.status != cudaSuccess) { return {api, api.status}; }
  return {api, bind_primary_context()};
}

/// gpukit's copy direction as CUDA's; an unknown value stays unknown (CUDA then reports
/// cudaErrorInvalidMemcpyDirection).
inline cudaMemcpyKind to_cuda_memcpy_kind(memcpy_kind k) noexcept
{
  switch (k) {
    case memcpy_kind::host_to_host: return cudaMemcpyHostToHost;
    case memcpy_kind::host_to_device: return cudaMemcpyHostToDevice;
    case memcpy_kind::device_to_host: return cudaMemcpyDeviceToHost;
    case memcpy_kind::device_to_device: return cudaMemcpyDeviceToDevice;
    case memcpy_kind::infer: return cudaMemcpyDefault;
  }
  // An unknown direction maps to a value CUDA rejects with cudaErrorInvalidMemcpyDirection. It is
  // 7, not -1: cudaMemcpyKind has no fixed underlying type, so only values that fit the bits of
  // its enumerators (0..4, so 0..7) may be held by it.
  return static_cast<cudaMemcpyKind>(7);
}

inline CUdeviceptr to_device_ptr(void* p) noexcept
{
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

inline CUmemAllocationProp pinned_device_allocation(int device, bool shareable = false) noexcept
{
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes =
    shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id   = device;
  return prop;
}

}  // namespace detail

inline cuda_runtime& cuda_runtime::instance() noexcept
{
  static cuda_runtime rt;
  return rt;
}

// --- Devices -------------------------------------------------------------------------------------

inline cudaError_t cuda_runtime::device_count(int& n)
{
  n                   = 0;
  cudaError_t const e = ::cudaGetDeviceCount(&n);
  if (e != cudaSuccess) { n = 0; }
  return detail::cuda_result(e);
}

inline cudaError_t cuda_runtime::get_device(int& d)
{
  return detail::cuda_result(::cudaGetDevice(&d));
}

inline cudaError_t cuda_runtime::set_device(int d)
{
  return detail::cuda_result(::cudaSetDevice(d));
}

inline cudaError_t cuda_runtime::get_device_properties(device_properties& p, int d)
{
  cudaDeviceProp prop{};
  cudaError_t const e = ::cudaGetDeviceProperties(&prop, d);
  if (e != cudaSuccess) { return detail::cuda_result(e); }

  p                      = device_properties{};
  p.name                 = prop.name;
  p.ordinal              = d;
  p.major                = prop.major;
  p.minor                = prop.minor;
  p.total_memory         = prop.totalGlobalMem;
  p.multiprocessor_count = prop.multiProcessorCount;
  p.async_engine_count   = prop.asyncEngineCount;
  p.pci_domain_id        = prop.pciDomainID;
  p.pci_bus_id           = prop.pciBusID;
  p.pci_device_id        = prop.pciDeviceID;
  p.ecc_enabled          = prop.ECCEnabled != 0;
  p.unified_addressing   = prop.unifiedAddressing != 0;
  p.memory_pools         = prop.memoryPoolsSupported != 0;
  p.simulated            = false;

  // The runtime API has no attribute for virtual-memory support: ask the driver. When it cannot
  // be reached, report "unsupported" rather than failing the whole query.
  detail::driver_entry_points const& api = detail::driver_api();
  if (api.status == cudaSuccess) {
    CUdevice dev  = 0;
    int supported = 0;
    if (api.device_get(&dev, d) == CUDA_SUCCESS &&
        api.device_get_attribute(&supported,
                                 CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 dev) == CUDA_SUCCESS) {
      p.virtual_memory_management = supported != 0;
    }
  }
  return cudaSuccess;
}

inline cudaError_t cuda_runtime::mem_get_info(std::size_t& free_bytes, std::size_t& total_bytes)
{
  return detail::cuda_result(::cudaMemGetInfo(&free_bytes, &total_bytes));
}

inline cudaError_t cuda_runtime::driver_version(int& v)
{
  return detail::cuda_result(::cudaDriverGetVersion(&v));
}

inline cudaError_t cuda_runtime::runtime_version(int& v)
{
  return detail::cuda_result(::cudaRuntimeGetVersion(&v));
}

inline cudaError_t cuda_runtime::device_synchronize()
{
  return detail::cuda_result(::cudaDeviceSynchronize());
}

inline cudaError_t cuda_runtime::device_can_access_peer(int& can, int device, int peer)
{
  can = 0;
  return detail::cuda_result(::cudaDeviceCanAccessPeer(&can, device, peer));
}

inline cudaError_t cuda_runtime::device_enable_peer_access(int peer)
{
  return detail::cuda_result(::cudaDeviceEnablePeerAccess(peer, 0));
}

// --- Device memory -------------------------------------------------------------------------------

inline cudaError_t cuda_runtime::malloc(void** p, std::size_t bytes)
{
  return detail::cuda_result(::cudaMalloc(p, bytes));
}

inline cudaError_t cuda_runtime::free(void* p) { return detail::cuda_result(::cudaFree(p)); }

inline cudaError_t cuda_runtime::malloc_async(void** p, std::size_t bytes, stream_type s)
{
  return detail::cuda_result(::cudaMallocAsync(p, bytes, s));
}

inline cudaError_t cuda_runtime::free_async(void* p, stream_type s)
{
  return detail::cuda_result(::cudaFreeAsync(p, s));
}

// --- Pinned host memory --------------------------------------------------------------------------

inline cudaError_t cuda_runtime::host_alloc(void** p, std::size_t bytes, unsigned flags)
{
  return detail::cuda_result(::cudaHostAlloc(p, bytes, flags));
}

inline cudaError_t cuda_runtime::host_free(void* p)
{
  return detail::cuda_result(::cudaFreeHost(p));
}

inline cudaError_t cuda_runtime::host_register(void* p, std::size_t bytes, unsigned flags)
{
  return detail::cuda_result(::cudaHostRegister(p, bytes, flags));
}

inline cudaError_t cuda_runtime::host_unregister(void* p)
{
  return detail::cuda_result(::cudaHostUnregister(p));
}

// --- Virtual memory ------------------------------------------------------------------------------

namespace detail {
// The driver does not check every ordinal: cuMemGetAllocationGranularity answered for device
// 1 << 20 on the H200 (driver 580). Check it here, against the device count (fixed per process).
inline cudaError_t check_vm_device(int device)
{
  static int const count = [] {
    int n = 0;
    if (::cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)::cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return device >= 0 && device < count ? cudaSuccess : cudaErrorInvalidDevice;
}
}  // namespace detail

inline cudaError_t cuda_runtime::vm_granularity(std::size_t& g, int device)
{
  g               = 0;
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  if (auto const e = detail::check_vm_device(device); e != cudaSuccess) { return e; }
  CUmemAllocationProp const prop = detail::pinned_device_allocation(device);
  return detail::to_cuda_error(
    call.api.mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

inline cudaError_t cuda_runtime::vm_reserve(void** va, std::size_t bytes, std::size_t alignment)
{
  if (va == nullptr) { return cudaErrorInvalidValue; }
  *va             = nullptr;
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  CUdeviceptr ptr  = 0;
  CUresult const r = call.api.mem_address_reserve(&ptr, bytes, alignment, 0, 0);
  if (r == CUDA_SUCCESS) { *va = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr)); }
  return detail::to_cuda_error(r);
}

inline cudaError_t cuda_runtime::vm_free(void* va, std::size_t bytes)
{
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  return detail::to_cuda_error(call.api.mem_address_free(detail::to_device_ptr(va), bytes));
}

inline cudaError_t cuda_runtime::vm_create(physical_handle& h, std::size_t bytes, int device,
                                           bool shareable)
{
  h               = physical_handle{};
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  if (auto const e = detail::check_vm_device(device); e != cudaSuccess) { return e; }
  CUmemAllocationProp const prop = detail::pinned_device_allocation(device, shareable);
  return detail::to_cuda_error(call.api.mem_create(&h, bytes, &prop, 0));
}

inline cudaError_t cuda_runtime::vm_export_shareable(int& fd, physical_handle h)
{
  fd              = -1;
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  return detail::to_cuda_error(
    call.api.mem_export_to_shareable_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

inline cudaError_t cuda_runtime::vm_import_shareable(physical_handle& h, int fd)
{
  h               = physical_handle{};
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  return detail::to_cuda_error(call.api.mem_import_from_shareable_handle(
    &h, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
}

inline cudaError_t cuda_runtime::vm_release(physical_handle h)
{
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  return detail::to_cuda_error(call.api.mem_release(h));
}

inline cudaError_t cuda_runtime::vm_map(void* va, std::size_t bytes, physical_handle h)
{
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  return detail::to_cuda_error(call.api.mem_map(detail::to_device_ptr(va), bytes, 0, h, 0));
}

inline cudaError_t cuda_runtime::vm_unmap(void* va, std::size_t bytes)
{
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  return detail::to_cuda_error(call.api.mem_unmap(detail::to_device_ptr(va), bytes));
}

inline cudaError_t cuda_runtime::vm_set_access(void* va, std::size_t bytes, int device)
{
  auto const call = detail::begin_vm_call();
  if (call.status != cudaSuccess) { return call.status; }
  if (auto const e = detail::check_vm_device(device); e != cudaSuccess) { return e; }
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id   = device;
  desc.flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return detail::to_cuda_error(call.api.mem_set_access(detail::to_device_ptr(va), bytes, &desc, 1));
}

// --- Interprocess memory ------------------------------------------------------------------------

inline cudaError_t cuda_runtime::ipc_get_mem_handle(ipc_mem_handle& h, void* p)
{
  return detail::cuda_result(::cudaIpcGetMemHandle(&h, p));
}

inline cudaError_t cuda_runtime::ipc_open_mem_handle(void** p, ipc_mem_handle h)
{
  return detail::cuda_result(::cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess));
}

inline cudaError_t cuda_runtime::ipc_close_mem_handle(void* p)
{
  return detail::cuda_result(::cudaIpcCloseMemHandle(p));
}

// --- Streams -------------------------------------------------------------------------------------

inline cudaError_t cuda_runtime::stream_create(stream_type& s)
{
  return detail::cuda_result(::cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
}

inline cudaError_t cuda_runtime::stream_destroy(stream_type s)
{
  return detail::cuda_result(::cudaStreamDestroy(s));
}

inline cudaError_t cuda_runtime::stream_synchronize(stream_type s)
{
  return detail::cuda_result(::cudaStreamSynchronize(s));
}

inline cudaError_t cuda_runtime::stream_query(stream_type s)
{
  return detail::cuda_result(::cudaStreamQuery(s));
}

inline cudaError_t cuda_runtime::stream_wait_event(stream_type s, event_type e)
{
  return detail::cuda_result(::cudaStreamWaitEvent(s, e, cudaEventWaitDefault));
}

inline cudaError_t cuda_runtime::stream_get_device(stream_type s, int& device)
{
  return detail::cuda_result(::cudaStreamGetDevice(s, &device));
}

// --- Events --------------------------------------------------------------------------------------

inline cudaError_t cuda_runtime::event_create(event_type& e, bool timing)
{
  return detail::cuda_result(
    ::cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
}

inline cudaError_t cuda_runtime::event_destroy(event_type e)
{
  return detail::cuda_result(::cudaEventDestroy(e));
}

inline cudaError_t cuda_runtime::event_record(event_type e, stream_type s)
{
  return detail::cuda_result(::cudaEventRecord(e, s));
}

inline cudaError_t cuda_runtime::event_query(event_type e)
{
  return detail::cuda_result(::cudaEventQuery(e));
}

inline cudaError_t cuda_runtime::event_synchronize(event_type e)
{
  return detail::cuda_result(::cudaEventSynchronize(e));
}

inline cudaError_t cuda_runtime::event_elapsed_time(float& ms, event_type start, event_type stop)
{
  return detail::cuda_result(::cudaEventElapsedTime(&ms, start, stop));
}

// --- Copies and work on streams ------------------------------------------------------------------

inline cudaError_t cuda_runtime::memcpy_async(void* dst, void const* src, std::size_t bytes,
                                              memcpy_kind k, stream_type s)
{
  return detail::cuda_result(::cudaMemcpyAsync(dst, src, bytes, detail::to_cuda_memcpy_kind(k), s));
}

inline cudaError_t cuda_runtime::memcpy_peer_async(void* dst, int dst_device, void const* src,
                                                   int src_device, std::size_t bytes, stream_type s)
{
  return detail::cuda_result(::cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, s));
}

inline cudaError_t cuda_runtime::memset_async(void* dst, int value, std::size_t bytes,
                                              stream_type s)
{
  return detail::cuda_result(::cudaMemsetAsync(dst, value, bytes, s));
}

inline cudaError_t cuda_runtime::launch_host_func(stream_type s, host_fn fn, void* user)
{
  return detail::cuda_result(::cudaLaunchHostFunc(s, fn, user));
}

// --- Graph capture -------------------------------------------------------------------------------

inline cudaError_t cuda_runtime::stream_is_capturing(stream_type s, bool& capturing)
{
  capturing                      = false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t const e            = detail::cuda_result(::cudaStreamIsCapturing(s, &status));
  capturing                      = e == cudaSuccess && status != cudaStreamCaptureStatusNone;
  return e;
}

inline cudaError_t cuda_runtime::stream_capture_id(stream_type s, unsigned long long& id)
{
  id                             = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture     = 0;
  cudaError_t const e = detail::cuda_result(::cudaStreamGetCaptureInfo(s, &status, &capture));
  if (e == cudaSuccess && status != cudaStreamCaptureStatusNone) { id = capture; }
  return e;
}

inline cudaError_t cuda_runtime::begin_capture(stream_type s, int mode)
{
  return detail::cuda_result(::cudaStreamBeginCapture(s, static_cast<cudaStreamCaptureMode>(mode)));
}

inline cudaError_t cuda_runtime::end_capture(stream_type s, cudaGraph_t& graph)
{
  graph = nullptr;
  return detail::cuda_result(::cudaStreamEndCapture(s, &graph));
}

inline cudaError_t cuda_runtime::end_capture(stream_type s)
{
  cudaGraph_t graph   = nullptr;
  cudaError_t const e = end_capture(s, graph);
  if (graph != nullptr) { (void)::cudaGraphDestroy(graph); }
  return e;
}

inline cudaError_t cuda_runtime::exchange_capture_mode(int& mode)
{
  auto m              = static_cast<cudaStreamCaptureMode>(mode);
  cudaError_t const e = detail::cuda_result(::cudaThreadExchangeStreamCaptureMode(&m));
  mode                = static_cast<int>(m);
  return e;
}

}  // namespace gpukit
