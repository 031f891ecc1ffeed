// SPDX-License-Identifier: Apache-2.0
// gpukit/error_macros.hpp: the macros that check a runtime call or a precondition and throw one
// of gpukit's errors (gpukit/error.hpp), for gpukit's code and for yours.
//
// Quick start:
//
//   #include <gpukit/error_macros.hpp>
//
//   #include <cuda_runtime_api.h>
//
//   #include <cstddef>
//   #include <string>
//
//   void* upload(void const* host, std::size_t bytes, cudaStream_t stream)
//   {
//     GPUKIT_EXPECTS(bytes > 0, "upload of 0 bytes");         // gpukit::logic_error
//     void* d = nullptr;
//     GPUKIT_CUDA_TRY(cudaMallocAsync(&d, bytes, stream));    // gpukit::cuda_error naming the call
//     cudaError_t const e = cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream);
//     GPUKIT_CUDA_TRY(e, "cudaMemcpyAsync(d, host)");         // a status obtained earlier
//     return d;
//   }
//
//   [[noreturn]] void unsupported(int dtype)
//   {
//     GPUKIT_FAIL("unsupported dtype " + std::to_string(dtype));   // gpukit::logic_error
//   }
//
// Every message starts with "gpukit: " (the macros add it: `message` carries no prefix). In debug
// builds (GPUKIT_ERROR_LOCATIONS, see gpukit/error.hpp) it ends with the file and line of the
// macro, and GPUKIT_EXPECTS's with the condition's text:
//
//   GPUKIT_CUDA_TRY(cudaMallocAsync(&d, bytes, stream))
//     gpukit: cudaMallocAsync(&d, bytes, stream) failed with cudaErrorMemoryAllocation (2):
//     out of memory at app.cpp:17
//   GPUKIT_EXPECTS(bytes > 0, "upload of 0 bytes")
//     gpukit: upload of 0 bytes (precondition `bytes > 0` failed at app.cpp:15)
//   GPUKIT_FAIL("unsupported dtype " + std::to_string(dtype))
//     gpukit: unsupported dtype 7 (app.cpp:25)
//
// In release builds the same messages stop before " at app.cpp:17" and before " (".
//
// A status is checked against the success value of its runtime family (gpukit::error_traits):
// cudaError_t for CUDA, and the error type of any other runtime (the simulated GPU's included).
// The macros never synchronize and never call the runtime; the error a runtime call returned is
// already cleared from any last-error slot the platform keeps.
#pragma once

/// @file
/// GPUKIT_CUDA_TRY, GPUKIT_EXPECTS, GPUKIT_FAIL and GPUKIT_ASSERT_CUDA_SUCCESS: the checks that
/// throw gpukit's errors (gpukit/error.hpp). The quick start is at the top of this header.

#include <gpukit/detail/cuda_error_traits.hpp>  // error_traits<cudaError_t>
#include <gpukit/detail/error_macros.hpp>
#include <gpukit/error.hpp>

#include <cassert>

/// Checks a runtime status and throws gpukit::cuda_error when it is not success.
///
/// - `GPUKIT_CUDA_TRY(call)`: `call` is a runtime call (or any expression whose type
///   gpukit::error_traits knows); the error names the call's text.
/// - `GPUKIT_CUDA_TRY(status, what)`: a status obtained earlier; `what` (a string) names the call
///   that returned it, e.g. `GPUKIT_CUDA_TRY(e, "rt.stream_query(s)")`.
///
/// The exception keeps the error's value, its name as the runtime spells it, the call, the file
/// and the line (gpukit::cuda_error::code, name, call, file, line).
#define GPUKIT_CUDA_TRY(...)                                                                   \
  GPUKIT_DETAIL_TRY_SELECT(__VA_ARGS__, GPUKIT_DETAIL_TRY_NAMED, GPUKIT_DETAIL_TRY_CALL, none) \
  (__VA_ARGS__)

/// Throws gpukit::logic_error when the precondition `cond` is false. `message` (anything
/// convertible to std::string, without a "gpukit: " prefix) should name the value that broke it,
/// the limit and the fix; with GPUKIT_ERROR_LOCATIONS the error also names the condition's text,
/// the file and the line. `message` is evaluated only when `cond` is false.
#define GPUKIT_EXPECTS(cond, message)                                                \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      ::gpukit::detail::throw_logic_error((message), GPUKIT_DETAIL_CONDITION(cond)); \
    }                                                                                \
  } while (0)

/// Throws gpukit::logic_error with `message` (anything convertible to std::string, no prefix) and,
/// with GPUKIT_ERROR_LOCATIONS, the file and the line: for a branch that input must never reach.
#define GPUKIT_FAIL(message) \
  ::gpukit::detail::throw_logic_error((message), nullptr, GPUKIT_DETAIL_WHERE)

/// For destructors, which never throw: asserts that `call` returned success in debug builds, and
/// only evaluates it (discarding the status) when NDEBUG is defined.
#ifdef NDEBUG
#define GPUKIT_ASSERT_CUDA_SUCCESS(call) \
  do {                                   \
    (void)(call);                        \
  } while (0)
#else
#define GPUKIT_ASSERT_CUDA_SUCCESS(call)                          \
  do {                                                            \
    bool const gpukit_ok_ = ::gpukit::detail::is_success((call)); \
    assert(gpukit_ok_&& #call);                                   \
    (void)gpukit_ok_;                                             \
  } while (0)
#endif
