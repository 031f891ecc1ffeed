// gpukit/runtime/runtime.hpp: the runtime policy, the one seam through which gpukit reaches a GPU.
//
// Quick start:
//
//   #include <gpukit/runtime/cuda_runtime.hpp>   // the real thing
//   #include <gpukit/runtime/sim_runtime.hpp>    // a simulated GPU in host memory
//
//   template <class Runtime>
//   void roundtrip(Runtime& rt) {
//     typename Runtime::stream_type s{};
//     GPUKIT_CUDA_TRY(rt.stream_create(s));
//     void* d = nullptr;
//     GPUKIT_CUDA_TRY(rt.malloc(&d, 1 << 20));
//     GPUKIT_CUDA_TRY(rt.memcpy_async(d, host, 1 << 20, gpukit::memcpy_kind::host_to_device, s));
//     GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
//     GPUKIT_CUDA_TRY(rt.free(d));
//     GPUKIT_CUDA_TRY(rt.stream_destroy(s));
//   }
//   roundtrip(gpukit::cuda_runtime::instance());
//   gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, 8ull << 30)};  // one 8 GiB GPU
//   roundtrip(sim);
//
// Every gpukit component is a template over a Runtime, e.g.
// `gpukit::basic_caching_allocator<Runtime>`; the public names are aliases over `cuda_runtime`
// (`gpukit::caching_allocator`). Two runtimes ship with gpukit:
//
// - `cuda_runtime` calls the CUDA runtime API (link statically with cudart) and the driver API for
//   virtual memory, reached through `cudaGetDriverEntryPointByVersion`, never by linking libcuda:
//   a binary built with gpukit starts on a machine without a driver, and every call then fails
//   with a clear error.
// - `sim_runtime` is a simulated GPU: device capacities in bytes, streams that really run
//   asynchronously (a worker thread each, FIFO), events with CUDA's semantics, copies, host
//   functions, virtual-address reservation and page mapping, and deterministic fault injection.
//
// ## The Runtime contract
//
// A Runtime is a class (an object: the simulated one carries state; `cuda_runtime` is empty) with:
//
//   using stream_type = ...;   // trivially copyable handle; a value-initialized one is the
//                              // device's default (null) stream
//   using event_type = ...;    // trivially copyable handle
//   using physical_handle = ...; // a physical memory allocation for virtual-memory mapping
//   static constexpr bool is_simulated;
//   static Runtime& instance();  // the process-wide runtime (for sim: the default simulated GPU)
//
// and these members, each returning `cudaError_t` (cudaSuccess, or the error, already cleared
// from CUDA's last-error slot so that the next call does not see it). Unless noted, calls act on
// the calling thread's current device, never block, and are thread-safe.
//
// Devices
//   device_count(int& n)
//   get_device(int& d) / set_device(int d)          per-thread current device, as in CUDA
//   get_device_properties(device_properties& p, int d)
//   mem_get_info(std::size_t& free, std::size_t& total)   current device
//   driver_version(int& v) / runtime_version(int& v)      CUDA's encoding (13000 = 13.0);
//                                                    without a driver, driver_version succeeds
//                                                    with 0 (as CUDA does): every other call fails
//   device_synchronize()                            blocks until the current device is idle
//   device_can_access_peer(int& can, int device, int peer)   1 when `device` can map `peer`'s
//                                                    memory (0 for device == peer)
//   device_enable_peer_access(int peer)             the current device may access `peer`'s
//                                                    memory (cudaMalloc memory; virtual memory
//                                                    needs vm_set_access for that device);
//                                                    cudaErrorPeerAccessAlreadyEnabled when it
//                                                    already may (not an error to callers)
// Device memory (current device)
//   malloc(void** p, std::size_t bytes)             synchronous allocation (cudaMalloc)
//   free(void* p)                                   may synchronize the device (cudaFree)
//   malloc_async(void** p, std::size_t bytes, stream_type s)   stream-ordered (cudaMallocAsync)
//   free_async(void* p, stream_type s)
// Pinned host memory
//   host_alloc(void** p, std::size_t bytes, unsigned flags)    flags: host_alloc_flags
//   host_free(void* p)
//   host_register(void* p, std::size_t bytes, unsigned flags) flags: host_register_flags
//   host_unregister(void* p)
// Virtual memory (driver API on CUDA)
//   vm_granularity(std::size_t& g, int device)      minimum mapping granularity
//   vm_reserve(void** va, std::size_t bytes, std::size_t alignment)  address range, no memory;
//                                                    alignment 0: the granularity
//   vm_free(void* va, std::size_t bytes)             the whole range reserved by vm_reserve
//   vm_create(physical_handle& h, std::size_t bytes, int device, bool shareable = false)
//                                                    physical memory, a multiple of the
//                                                    granularity; shareable: exportable as a POSIX
//                                                    file descriptor (vm_export_shareable)
//   vm_release(physical_handle h)                    memory is freed once also unmapped
//   vm_map(void* va, std::size_t bytes, physical_handle h)          the whole handle, at va
//   vm_unmap(void* va, std::size_t bytes)            whole mappings only; unmapping what is not
//                                                    mapped succeeds on CUDA (driver 580) and is
//                                                    reported as misuse by the simulated GPU
//   vm_set_access(void* va, std::size_t bytes, int device)          read-write for `device`;
//                                                    mapped memory is inaccessible until then; the
//                                                    range may span adjacent whole mappings
//   vm_export_shareable(int& fd, physical_handle h)  a new POSIX file descriptor for h (created
//                                                    shareable); the caller closes it. Another
//                                                    process receives it over a unix socket
//                                                    (SCM_RIGHTS) and imports it
//   vm_import_shareable(physical_handle& h, int fd)  a handle to the memory `fd` names; fd stays
//                                                    the caller's to close
// Interprocess memory (CUDA IPC)
//   ipc_get_mem_handle(ipc_mem_handle& h, void* p)   a handle naming the malloc allocation that
//                                                    holds p (not malloc_async memory: CUDA cannot
//                                                    export the default pool's memory this way)
//   ipc_open_mem_handle(void** p, ipc_mem_handle h)  in another process: *p = the allocation's
//                                                    base, mapped for the current device
//   ipc_close_mem_handle(void* p)                    unmaps what ipc_open_mem_handle returned
// Streams (non-blocking with respect to the null stream)
//   stream_create(stream_type& s)                    on the current device
//   stream_destroy(stream_type s)                    returns at once; queued work still runs
//   stream_synchronize(stream_type s)                blocks until s is idle
//   stream_query(stream_type s)                      cudaSuccess if idle, else cudaErrorNotReady
//   stream_wait_event(stream_type s, event_type e)   later work on s waits for e's capture
//                                                    (e may belong to another device)
//   stream_get_device(stream_type s, int& device)    the device s was created on (the null
//                                                    stream: the current device)
// Events (an event belongs to the device current when it was created)
//   event_create(event_type& e, bool timing = false) timing events cost more to record
//   event_destroy(event_type e)
//   event_record(event_type e, stream_type s)        captures the work submitted to s so far;
//                                                    cudaErrorInvalidResourceHandle when s
//                                                    belongs to another device than e
//   event_query(event_type e)                        cudaSuccess if the capture has completed
//                                                    (or e was never recorded), else NotReady
//   event_synchronize(event_type e)                  blocks until the capture completes
//   event_elapsed_time(float& ms, event_type start, event_type stop)   timing events only, of
//                                                    one device
// Copies and work on streams (stream-ordered; on CUDA a copy to or from pageable host memory may
// block the host until it is done, so code that must not block copies from pinned memory)
//   memcpy_async(void* dst, void const* src, std::size_t bytes, memcpy_kind k, stream_type s)
//   memcpy_peer_async(void* dst, int dst_device, void const* src, int src_device,
//                     std::size_t bytes, stream_type s)
//   memset_async(void* dst, int value, std::size_t bytes, stream_type s)
//   launch_host_func(stream_type s, host_fn fn, void* user)   runs fn(user) in stream order;
//                                                    fn must not call the runtime, nor block for
//                                                    long: CUDA may run the host functions of every
//                                                    stream on one thread
// Graph capture
//   stream_is_capturing(stream_type s, bool& capturing)   legal while capturing
//   exchange_capture_mode(int& mode)                 swaps the thread's cudaStreamCaptureMode
// Errors
//   static char const* error_name(cudaError_t) / error_string(cudaError_t)
//
// `is_runtime_v<R>` checks the shape of this contract at compile time.
#pragma once

#include <gpukit/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace gpukit {

/// Direction of a copy; the values are those of `cudaMemcpyKind`.
enum class memcpy_kind : int {
  host_to_host     = cudaMemcpyHostToHost,
  host_to_device   = cudaMemcpyHostToDevice,
  device_to_host   = cudaMemcpyDeviceToHost,
  device_to_device = cudaMemcpyDeviceToDevice,
  infer            = cudaMemcpyDefault,  ///< inferred from the pointers (unified addressing)
};

/// Flags of `host_alloc`; the values are those of `cudaHostAlloc*`.
struct host_alloc_flags {
  static constexpr unsigned none     = cudaHostAllocDefault;
  static constexpr unsigned portable = cudaHostAllocPortable;  ///< pinned for every device
  static constexpr unsigned mapped   = cudaHostAllocMapped;    ///< device-addressable
  static constexpr unsigned write_combined =
    cudaHostAllocWriteCombined;  ///< fast H2D, slow host reads
};

/// Flags of `host_register`; the values are those of `cudaHostRegister*`.
struct host_register_flags {
  static constexpr unsigned none      = cudaHostRegisterDefault;
  static constexpr unsigned portable  = cudaHostRegisterPortable;
  static constexpr unsigned mapped    = cudaHostRegisterMapped;
  static constexpr unsigned read_only = cudaHostRegisterReadOnly;
};

/// An interprocess memory handle (cudaIpcMemHandle_t: 64 opaque bytes, copied as they are).
using ipc_mem_handle = cudaIpcMemHandle_t;

/// A host function enqueued on a stream (same signature as `cudaHostFn_t`).
using host_fn = void (*)(void*);

/// What gpukit needs to know about a device.
struct device_properties {
  std::string name;
  int ordinal{0};
  int major{0};  ///< compute capability
  int minor{0};
  std::size_t total_memory{0};
  int multiprocessor_count{0};
  int async_engine_count{0};  ///< copy engines: 2 or more copy both directions at once
  int pci_domain_id{0};       ///< PCI address domain:bus:device.0 (sysfs names the device so)
  int pci_bus_id{0};
  int pci_device_id{0};
  bool ecc_enabled{false};  ///< ECC on device memory is on (false also when the GPU lacks it)
  bool unified_addressing{false};
  bool virtual_memory_management{false};  ///< cuMem* virtual memory is supported
  bool memory_pools{false};               ///< cudaMallocAsync is supported
  bool simulated{false};
};

namespace detail {

template <class R, class = void>
struct is_runtime_impl : std::false_type {};

// clang-format off
template <class R>
struct is_runtime_impl<R, std::void_t<
  typename R::stream_type, typename R::event_type, typename R::physical_handle,
  decltype(R::is_simulated), decltype(R::instance()),
  decltype(R::error_name(cudaSuccess)), decltype(R::error_string(cudaSuccess)),
  decltype(std::declval<R&>().device_count(std::declval<int&>())),
  decltype(std::declval<R&>().get_device(std::declval<int&>())),
  decltype(std::declval<R&>().set_device(0)),
  decltype(std::declval<R&>().get_device_properties(std::declval<device_properties&>(), 0)),
  decltype(std::declval<R&>().mem_get_info(std::declval<std::size_t&>(), std::declval<std::size_t&>())),
  decltype(std::declval<R&>().driver_version(std::declval<int&>())),
  decltype(std::declval<R&>().runtime_version(std::declval<int&>())),
  decltype(std::declval<R&>().device_synchronize()),
  decltype(std::declval<R&>().device_can_access_peer(std::declval<int&>(), 0, 0)),
  decltype(std::declval<R&>().device_enable_peer_access(0)),
  decltype(std::declval<R&>().malloc(std::declval<void**>(), std::size_t{})),
  decltype(std::declval<R&>().free(std::declval<void*>())),
  decltype(std::declval<R&>().malloc_async(std::declval<void**>(), std::size_t{}, std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().free_async(std::declval<void*>(), std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().host_alloc(std::declval<void**>(), std::size_t{}, 0u)),
  decltype(std::declval<R&>().host_free(std::declval<void*>())),
  decltype(std::declval<R&>().host_register(std::declval<void*>(), std::size_t{}, 0u)),
  decltype(std::declval<R&>().host_unregister(std::declval<void*>())),
  decltype(std::declval<R&>().vm_granularity(std::declval<std::size_t&>(), 0)),
  decltype(std::declval<R&>().vm_reserve(std::declval<void**>(), std::size_t{}, std::size_t{})),
  decltype(std::declval<R&>().vm_free(std::declval<void*>(), std::size_t{})),
  decltype(std::declval<R&>().vm_create(std::declval<typename R::physical_handle&>(), std::size_t{}, 0)),
  decltype(std::declval<R&>().vm_release(std::declval<typename R::physical_handle>())),
  decltype(std::declval<R&>().vm_map(std::declval<void*>(), std::size_t{}, std::declval<typename R::physical_handle>())),
  decltype(std::declval<R&>().vm_unmap(std::declval<void*>(), std::size_t{})),
  decltype(std::declval<R&>().vm_set_access(std::declval<void*>(), std::size_t{}, 0)),
  decltype(std::declval<R&>().vm_create(std::declval<typename R::physical_handle&>(), std::size_t{}, 0, true)),
  decltype(std::declval<R&>().vm_export_shareable(std::declval<int&>(), std::declval<typename R::physical_handle>())),
  decltype(std::declval<R&>().vm_import_shareable(std::declval<typename R::physical_handle&>(), 0)),
  decltype(std::declval<R&>().ipc_get_mem_handle(std::declval<ipc_mem_handle&>(), std::declval<void*>())),
  decltype(std::declval<R&>().ipc_open_mem_handle(std::declval<void**>(), std::declval<ipc_mem_handle>())),
  decltype(std::declval<R&>().ipc_close_mem_handle(std::declval<void*>())),
  decltype(std::declval<R&>().stream_create(std::declval<typename R::stream_type&>())),
  decltype(std::declval<R&>().stream_destroy(std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().stream_synchronize(std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().stream_query(std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().stream_wait_event(std::declval<typename R::stream_type>(), std::declval<typename R::event_type>())),
  decltype(std::declval<R&>().stream_get_device(std::declval<typename R::stream_type>(), std::declval<int&>())),
  decltype(std::declval<R&>().event_create(std::declval<typename R::event_type&>(), false)),
  decltype(std::declval<R&>().event_destroy(std::declval<typename R::event_type>())),
  decltype(std::declval<R&>().event_record(std::declval<typename R::event_type>(), std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().event_query(std::declval<typename R::event_type>())),
  decltype(std::declval<R&>().event_synchronize(std::declval<typename R::event_type>())),
  decltype(std::declval<R&>().event_elapsed_time(std::declval<float&>(), std::declval<typename R::event_type>(), std::declval<typename R::event_type>())),
  decltype(std::declval<R&>().memcpy_async(std::declval<void*>(), std::declval<void const*>(), std::size_t{}, memcpy_kind::infer, std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().memcpy_peer_async(std::declval<void*>(), 0, std::declval<void const*>(), 0, std::size_t{}, std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().memset_async(std::declval<void*>(), 0, std::size_t{}, std::declval<typename R::stream_type>())),
  decltype(std::declval<R&>().launch_host_func(std::declval<typename R::stream_type>(), host_fn{}, std::declval<void*>())),
  decltype(std::declval<R&>().stream_is_capturing(std::declval<typename R::stream_type>(), std::declval<bool&>())),
  decltype(std::declval<R&>().exchange_capture_mode(std::declval<int&>()))
>> : std::true_type {};
// clang-format on

}  // namespace detail

/// True when R has the shape of the Runtime contract described at the top of this header.
template <class R>
inline constexpr bool is_runtime_v = detail::is_runtime_impl<R>::value;

/// Restores the calling thread's current device on scope exit (a device guard).
/// Throws gpukit::cuda_error when the device cannot be read or set.
template <class Runtime>
class device_guard {
 public:
  device_guard(Runtime& rt, int device) : rt_{rt}
  {
    GPUKIT_CUDA_TRY(rt_.get_device(previous_));
    if (previous_ != device) { GPUKIT_CUDA_TRY(rt_.set_device(device)); }
  }
  ~device_guard()
  {
    int now = previous_;
    if (rt_.get_device(now) == cudaSuccess && now != previous_) { (void)rt_.set_device(previous_); }
  }
  device_guard(device_guard const&)            = delete;
  device_guard& operator=(device_guard const&) = delete;
  device_guard(device_guard&&)                 = delete;
  device_guard& operator=(device_guard&&)      = delete;

 private:
  Runtime& rt_;
  int previous_{0};
};

}  // namespace gpukit
