// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/cuda_errors.hpp: CUDA's error vocabulary, shared by the two runtimes that
// report CUDA's codes (cuda_runtime, and sim_runtime, which simulates them). Not public API: use
// `Runtime::error_type`, `Runtime::out_of_memory`, `Runtime::error_name` and the others.
#pragma once

#include <gpukit/detail/cuda_error_traits.hpp>

#include <cuda_runtime_api.h>

namespace gpukit::detail {

/// The error type, named error codes, capture modes and error names of the CUDA family. A runtime
/// of that family derives from it; a runtime of another platform declares the same members over
/// its own types (the names are listed by GPUKIT_RUNTIME_ERRORS and GPUKIT_RUNTIME_CAPTURE_MODES).
struct cuda_error_vocabulary {
  using error_type = cudaError_t;

  static constexpr error_type success                        = cudaSuccess;
  static constexpr error_type not_ready                      = cudaErrorNotReady;
  static constexpr error_type out_of_memory                  = cudaErrorMemoryAllocation;
  static constexpr error_type invalid_value                  = cudaErrorInvalidValue;
  static constexpr error_type invalid_device                 = cudaErrorInvalidDevice;
  static constexpr error_type invalid_resource_handle        = cudaErrorInvalidResourceHandle;
  static constexpr error_type invalid_memcpy_direction       = cudaErrorInvalidMemcpyDirection;
  static constexpr error_type not_supported                  = cudaErrorNotSupported;
  static constexpr error_type no_device                      = cudaErrorNoDevice;
  static constexpr error_type insufficient_driver            = cudaErrorInsufficientDriver;
  static constexpr error_type peer_access_already_enabled    = cudaErrorPeerAccessAlreadyEnabled;
  static constexpr error_type peer_access_unsupported        = cudaErrorPeerAccessUnsupported;
  static constexpr error_type host_memory_already_registered = cudaErrorHostMemoryAlreadyRegistered;
  static constexpr error_type host_memory_not_registered     = cudaErrorHostMemoryNotRegistered;
  static constexpr error_type stream_capture_unsupported     = cudaErrorStreamCaptureUnsupported;
  static constexpr error_type stream_capture_invalidated     = cudaErrorStreamCaptureInvalidated;
  static constexpr error_type stream_capture_unmatched       = cudaErrorStreamCaptureUnmatched;
  static constexpr error_type stream_capture_unjoined        = cudaErrorStreamCaptureUnjoined;
  static constexpr error_type stream_capture_isolation       = cudaErrorStreamCaptureIsolation;
  static constexpr error_type captured_event                 = cudaErrorCapturedEvent;
  static constexpr error_type launch_failure                 = cudaErrorLaunchFailure;
  static constexpr error_type stub_library                   = cudaErrorStubLibrary;
  static constexpr error_type system_not_ready               = cudaErrorSystemNotReady;
  static constexpr error_type system_driver_mismatch         = cudaErrorSystemDriverMismatch;
  static constexpr error_type devices_unavailable            = cudaErrorDevicesUnavailable;
  static constexpr error_type compat_not_supported_on_device = cudaErrorCompatNotSupportedOnDevice;
  static constexpr error_type call_requires_newer_driver     = cudaErrorCallRequiresNewerDriver;
  static constexpr error_type unknown                        = cudaErrorUnknown;

  static constexpr int capture_mode_global       = cudaStreamCaptureModeGlobal;
  static constexpr int capture_mode_thread_local = cudaStreamCaptureModeThreadLocal;
  static constexpr int capture_mode_relaxed      = cudaStreamCaptureModeRelaxed;

  /// "cudaErrorMemoryAllocation" for cudaErrorMemoryAllocation (cudaGetErrorName, which needs no
  /// driver). Never throws.
  [[nodiscard]] static char const* error_name(error_type e) noexcept
  {
    return error_traits<error_type>::name(e);
  }
  /// CUDA's description of `e` (cudaGetErrorString). Never throws.
  [[nodiscard]] static char const* error_string(error_type e) noexcept
  {
    return error_traits<error_type>::description(e);
  }
};

}  // namespace gpukit::detail
