// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/driver_api.hpp: the few CUDA driver API entry points gpukit needs (virtual
// memory and one device attribute), reached through cudaGetDriverEntryPointByVersion so that
// nothing links libcuda. Not public API.
//
// The entry points are resolved once per process, on first use, in a function-local static
// (thread-safe initialization). Without a driver, or with a driver too old for a symbol, the
// lookup fails and `driver_api().status` says why; callers then return that error instead of
// calling through a null pointer.
#pragma once

#include <cuda.h>  // types and enums only: no driver function is called through this header
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace gpukit::detail {

/// The CUDA version whose ABI gpukit asks for. Every symbol below has kept the signature it had
/// when it was introduced (CUDA 10.2 for cuMem*, 2.0 for cuDeviceGet*), which is what the
/// PFN_*_v10020 / PFN_*_v2000 typedefs describe; asking for 12.0 returns those same versions and
/// works with every driver that can run a CUDA 12 or 13 runtime.
inline constexpr unsigned driver_abi_version = 12000;

/// Function pointers into the driver, or a reason why there are none.
struct driver_entry_points {
  cudaError_t status{cudaErrorNotSupported};  ///< cudaSuccess when every pointer below is set
  char const* missing{nullptr};               ///< the first symbol that could not be resolved

  PFN_cuDeviceGet_v2000 device_get{nullptr};
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute{nullptr};
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity{nullptr};
  PFN_cuMemAddressReserve_v10020 mem_address_reserve{nullptr};
  PFN_cuMemAddressFree_v10020 mem_address_free{nullptr};
  PFN_cuMemCreate_v10020 mem_create{nullptr};
  PFN_cuMemRelease_v10020 mem_release{nullptr};
  PFN_cuMemMap_v10020 mem_map{nullptr};
  PFN_cuMemUnmap_v10020 mem_unmap{nullptr};
  PFN_cuMemSetAccess_v10020 mem_set_access{nullptr};
  PFN_cuMemExportToShareableHandle_v10020 mem_export_to_shareable_handle{nullptr};
  PFN_cuMemImportFromShareableHandle_v10020 mem_import_from_shareable_handle{nullptr};
};

/// Looks up one driver symbol into `fn`; returns false (and sets `out.status`/`out.missing`
/// once) when the runtime or the driver cannot provide it.
template <class Fn>
bool resolve_driver_symbol(driver_entry_points& out, char const* symbol, Fn& fn) noexcept
{
  void* address                                = nullptr;
  cudaDriverEntryPointQueryResult query_result = cudaDriverEntryPointSymbolNotFound;
  cudaError_t const e = ::cudaGetDriverEntryPointByVersion(symbol, &address, driver_abi_version,
                                                           cudaEnableDefault, &query_result);
  if (e != cudaSuccess) {
    (void)::cudaGetLastError();
    out.status  = e;  // e.g. cudaErrorInsufficientDriver without a driver
    out.missing = symbol;
    return false;
  }
  if (address == nullptr || query_result != cudaDriverEntryPointSuccess) {
    // The driver is there but lacks the symbol (or this version of it).
    out.status  = query_result == cudaDriverEntryPointVersionNotSufficent
                    ? cudaErrorInsufficientDriver
                    : cudaErrorNotSupported;
    out.missing = symbol;
    return false;
  }
  fn = reinterpret_cast<Fn>(address);
  return true;
}

/// Resolves every entry point (or none: `status` then names the failure).
inline driver_entry_points load_driver_entry_points() noexcept
{
  driver_entry_points d{};
  bool const ok =
    resolve_driver_symbol(d, "cuDeviceGet", d.device_get) &&
    resolve_driver_symbol(d, "cuDeviceGetAttribute", d.device_get_attribute) &&
    resolve_driver_symbol(d, "cuMemGetAllocationGranularity", d.mem_get_allocation_granularity) &&
    resolve_driver_symbol(d, "cuMemAddressReserve", d.mem_address_reserve) &&
    resolve_driver_symbol(d, "cuMemAddressFree", d.mem_address_free) &&
    resolve_driver_symbol(d, "cuMemCreate", d.mem_create) &&
    resolve_driver_symbol(d, "cuMemRelease", d.mem_release) &&
    resolve_driver_symbol(d, "cuMemMap", d.mem_map) &&
    resolve_driver_symbol(d, "cuMemUnmap", d.mem_unmap) &&
    resolve_driver_symbol(d, "cuMemSetAccess", d.mem_set_access) &&
    resolve_driver_symbol(d, "cuMemExportToShareableHandle", d.mem_export_to_shareable_handle) &&
    resolve_driver_symbol(d, "cuMemImportFromShareableHandle", d.mem_import_from_shareable_handle);
  if (!ok) { return driver_entry_points{d.status, d.missing}; }  // all or nothing
  d.status = cudaSuccess;
  return d;
}

/// The process-wide entry points, resolved on first call. Never blocks after the first call.
inline driver_entry_points const& driver_api() noexcept
{
  static driver_entry_points const entry_points = load_driver_entry_points();
  return entry_points;
}

/// A driver error and the runtime error that names it.
struct driver_error_name {
  CUresult driver;
  cudaError_t runtime;
};

/// The driver errors gpukit's calls can return, each with its runtime error.
inline constexpr driver_error_name driver_error_names[] = {
  {CUDA_SUCCESS, cudaSuccess},
  {CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue},
  {CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation},
  {CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError},
  {CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading},
  {CUDA_ERROR_STUB_LIBRARY, cudaErrorStubLibrary},
  {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, cudaErrorCallRequiresNewerDriver},
  {CUDA_ERROR_DEVICE_UNAVAILABLE, cudaErrorDevicesUnavailable},
  {CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice},
  {CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice},
  {CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized},
  {CUDA_ERROR_CONTEXT_IS_DESTROYED, cudaErrorContextIsDestroyed},
  {CUDA_ERROR_ALREADY_MAPPED, cudaErrorAlreadyMapped},
  {CUDA_ERROR_NOT_MAPPED, cudaErrorNotMapped},
  {CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle},
  {CUDA_ERROR_ILLEGAL_STATE, cudaErrorIllegalState},
  {CUDA_ERROR_NOT_FOUND, cudaErrorSymbolNotFound},
  {CUDA_ERROR_NOT_READY, cudaErrorNotReady},
  {CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress},
  {CUDA_ERROR_LAUNCH_FAILED, cudaErrorLaunchFailure},
  {CUDA_ERROR_ECC_UNCORRECTABLE, cudaErrorECCUncorrectable},
  {CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted},
  {CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported},
  {CUDA_ERROR_SYSTEM_NOT_READY, cudaErrorSystemNotReady},
  {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, cudaErrorSystemDriverMismatch},
  {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, cudaErrorCompatNotSupportedOnDevice},
  {CUDA_ERROR_OPERATING_SYSTEM, cudaErrorOperatingSystem},
  {CUDA_ERROR_TIMEOUT, cudaErrorTimeout},
};

/// The runtime error that best names a driver error (unknown ones become cudaErrorUnknown).
[[nodiscard]] constexpr cudaError_t to_cuda_error(CUresult r) noexcept
{
  for (driver_error_name const& e : driver_error_names) {
    if (e.driver == r) { return e.runtime; }
  }
  return cudaErrorUnknown;
}

}  // namespace gpukit::detail
