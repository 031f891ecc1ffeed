// gpukit/detail/error_macros.hpp: the macros behind gpukit's error family. Not public API.
//
//   GPUKIT_CUDA_TRY(call)          throws gpukit::cuda_error when `call` (a cudaError_t) fails,
//                                  after clearing CUDA's last (non-sticky) error
//   GPUKIT_EXPECTS(cond, message)  throws gpukit::logic_error(message) when `cond` is false;
//                                  `message` is any expression convertible to std::string
//   GPUKIT_ASSERT_CUDA_SUCCESS(call)  for destructors, which never throw: asserts in debug builds
//                                  and discards the result in release builds
#pragma once

#include <gpukit/error.hpp>

#include <cuda_runtime_api.h>

#include <cassert>
#include <string>

namespace gpukit::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, char const* call, char const* file,
                                          int line);
[[noreturn]] inline void throw_logic_error(std::string const& message, char const* file, int line);

}  // namespace gpukit::detail

#define GPUKIT_STRINGIFY_DETAIL(x) #x
#define GPUKIT_STRINGIFY(x)        GPUKIT_STRINGIFY_DETAIL(x)

#define GPUKIT_CUDA_TRY(call)                                                        \
  do {                                                                               \
    cudaError_t const gpukit_status_ = (call);                                       \
    if (gpukit_status_ != cudaSuccess) {                                             \
      ::gpukit::detail::throw_cuda_error(gpukit_status_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

#define GPUKIT_EXPECTS(cond, message)                                                    \
  do {                                                                                   \
    if (!(cond)) { ::gpukit::detail::throw_logic_error((message), __FILE__, __LINE__); } \
  } while (0)

#ifdef NDEBUG
#define GPUKIT_ASSERT_CUDA_SUCCESS(call) \
  do {                                   \
    (void)(call);                        \
  } while (0)
#else
#define GPUKIT_ASSERT_CUDA_SUCCESS(call)            \
  do {                                              \
    cudaError_t const gpukit_status_ = (call);      \
    assert(gpukit_status_ == cudaSuccess && #call); \
    (void)gpukit_status_;                           \
  } while (0)
#endif

namespace gpukit::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, char const* call, char const* file,
                                          int line)
{
  // A failed call leaves a non-sticky error behind in the CUDA runtime; clear it so the next
  // unrelated call does not report it. (Sticky errors stay: the context is unusable.)
  if (code != cudaErrorNotReady) { (void)::cudaGetLastError(); }
  throw ::gpukit::cuda_error{code, call, file, line};
}

[[noreturn]] inline void throw_logic_error(std::string const& message, char const* file, int line)
{
  throw ::gpukit::logic_error{"gpukit: " + message + " (" + file + ":" + std::to_string(line) +
                              ")"};
}

}  // namespace gpukit::detail
