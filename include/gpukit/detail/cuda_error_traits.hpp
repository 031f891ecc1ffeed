// SPDX-License-Identifier: Apache-2.0
// gpukit/detail/cuda_error_traits.hpp: gpukit::error_traits<cudaError_t>, which names CUDA's
// errors for GPUKIT_CUDA_TRY and gpukit::cuda_error. Not public API: include
// gpukit/error_macros.hpp (for code that calls CUDA directly) or a runtime header.
//
// It sits in the core, beside error.hpp, so that the error macros and the runtimes that report
// CUDA's codes (gpukit/runtime/detail/cuda_errors.hpp) both take it from below, and nothing in the
// core includes a runtime header.
#pragma once

#include <gpukit/error.hpp>

#include <cuda_runtime_api.h>

namespace gpukit {

/// Names the errors of the CUDA family for GPUKIT_CUDA_TRY and gpukit::cuda_error.
template <>
struct error_traits<cudaError_t> {
  static constexpr cudaError_t success = cudaSuccess;
  /// "cudaErrorMemoryAllocation" for cudaErrorMemoryAllocation (cudaGetErrorName, which needs no
  /// driver). Never throws.
  [[nodiscard]] static char const* name(cudaError_t e) noexcept { return ::cudaGetErrorName(e); }
  /// CUDA's description of `e` (cudaGetErrorString). Never throws.
  [[nodiscard]] static char const* description(cudaError_t e) noexcept
  {
    return ::cudaGetErrorString(e);
  }
};

}  // namespace gpukit
