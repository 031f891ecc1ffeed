// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/runtime.hpp: the runtime policy, the one seam through which gpukit reaches a GPU.
//
// Quick start:
//
//   #include <gpukit/runtime/cuda_runtime.hpp>  // the real thing
//   #include <gpukit/runtime/sim_runtime.hpp>   // a simulated GPU in host memory
//
//   template <class Runtime>
//   void roundtrip(Runtime& rt, void const* host)
//   {
//     typename Runtime::stream_type s{};
//     GPUKIT_CUDA_TRY(rt.stream_create(s));
//     void* d = nullptr;
//     GPUKIT_CUDA_TRY(rt.malloc(&d, 1 << 20));
//     GPUKIT_CUDA_TRY(rt.memcpy_async(d, host, 1 << 20, gpukit::memcpy_kind::host_to_device, s));
//     GPUKIT_CUDA_TRY(rt.stream_synchronize(s));
//     GPUKIT_CUDA_TRY(rt.free(d));
//     GPUKIT_CUDA_TRY(rt.stream_destroy(s));
//   }
//
//   void run(void const* host)
//   {
//     roundtrip(gpukit::cuda_runtime::instance(), host);
//     // one simulated GPU of 8 GiB:
//     gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
//     roundtrip(sim, host);
//   }
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
// The operations are declared once, in <gpukit/runtime/contract.hpp> (the lists
// GPUKIT_RUNTIME_CORE_OPS, GPUKIT_RUNTIME_VM_OPS, GPUKIT_RUNTIME_IPC_OPS,
// GPUKIT_RUNTIME_CAPTURE_OPS and the named errors GPUKIT_RUNTIME_ERRORS), rendered as a table in
// docs/runtime_contract.md. A component checks only the capabilities it uses:
//
//   static_assert(gpukit::runtime_has_core_v<Runtime>);     // devices, memory, streams, events,
//                                                           // copies, host functions
//   static_assert(gpukit::runtime_has_vm_v<Runtime>);       // virtual memory
//   static_assert(gpukit::runtime_has_ipc_v<Runtime>);      // IPC handles, shareable memory
//   static_assert(gpukit::runtime_has_capture_v<Runtime>);  // graph-capture awareness
//
// `is_runtime_v<R>` is all four.
//
// ## Writing another runtime (e.g. HIP): one header and its detail/ file
//
// A runtime is a class (the simulated one carries state; `cuda_runtime` is empty) declaring:
//
//   using stream_type = ...;      // trivially copyable; value-initialized = the null stream
//   using event_type = ...;       // trivially copyable
//   using error_type = ...;       // its platform's status (hipError_t), compared with ==
//   using physical_handle = ...;  // vm, ipc: physical memory for virtual-memory mapping
//   using ipc_mem_handle = ...;   // ipc: an interprocess handle, copied as bytes
//   static constexpr bool is_simulated;
//   static Runtime& instance();   // the process-wide runtime
//   static constexpr error_type success, not_ready, ...;  // each of GPUKIT_RUNTIME_ERRORS
//   static constexpr int capture_mode_global, ...;        // each of GPUKIT_RUNTIME_CAPTURE_MODES
//   static char const* error_name(error_type) noexcept;
//   static char const* error_string(error_type) noexcept;
//   GPUKIT_RUNTIME_OPS(GPUKIT_RUNTIME_DECLARE_OPERATION)  // every operation, declared from the
//                                                       // list: [[nodiscard]] error_type NAME(...)
//
// maps gpukit's own vocabulary (<gpukit/runtime/runtime_types.hpp>: memcpy_kind, host_alloc_flags,
// host_register_flags) to its platform's values, returns every error already cleared from any
// last-error slot the platform keeps, and specializes `gpukit::error_traits<error_type>` (see
// <gpukit/error.hpp>) so that GPUKIT_CUDA_TRY names its errors. Then it passes the conformance
// suite in tests/runtime/conformance.hpp. Nothing else in gpukit needs to change.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/runtime/contract.hpp>
#include <gpukit/runtime/runtime_types.hpp>

namespace gpukit {

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
    if (detail::is_success(rt_.get_device(now)) && now != previous_) {
      (void)rt_.set_device(previous_);
    }
  }
  // Neither copyable nor movable (deleted copies leave no implicit moves).
  device_guard(device_guard const&)            = delete;
  device_guard& operator=(device_guard const&) = delete;

 private:
  Runtime& rt_;
  int previous_{0};
};

}  // namespace gpukit
