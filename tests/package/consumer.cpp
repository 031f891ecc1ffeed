// SPDX-License-Identifier: Apache-2.0
// The program every consumer project builds and runs: it includes gpukit's headers (all of them,
// through gpukit/gpukit.hpp) with the host compiler only and uses them the way an application
// would.
#include <gpukit/gpukit.hpp>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

namespace {

int fail(char const* what)
{
  std::fprintf(stderr, "consumer: FAILED: %s\n", what);
  return 1;
}

}  // namespace

int main()
{
  static_assert(gpukit::is_runtime_v<gpukit::cuda_runtime>);
  static_assert(gpukit::is_runtime_v<gpukit::sim_runtime>);
#if GPUKIT_HAS_CCCL_MEMORY_RESOURCE
  static_assert(gpukit::detail::is_device_async_resource_v<gpukit::caching_allocator>);
#endif

  // The headers say the version the package (or the source tree) says.
  static_assert(GPUKIT_VERSION ==
                GPUKIT_VERSION_MAJOR * 10000 + GPUKIT_VERSION_MINOR * 100 + GPUKIT_VERSION_PATCH);
  if (std::strcmp(GPUKIT_VERSION_STRING, GPUKIT_EXPECTED_VERSION_STRING) != 0 ||
      std::strcmp(gpukit::version_string, GPUKIT_EXPECTED_VERSION_STRING) != 0) {
    return fail("gpukit/version.hpp does not say the version of the package");
  }
  std::printf("consumer: gpukit %s (%d)\n", GPUKIT_VERSION_STRING, GPUKIT_VERSION);

  // The error family: a failed CUDA call names itself (this also links cudart's error strings).
  try {
    GPUKIT_CUDA_TRY(cudaErrorInvalidValue);
    return fail("GPUKIT_CUDA_TRY did not throw");
  } catch (gpukit::cuda_error const& e) {
    if (e.code() != cudaErrorInvalidValue ||
        std::strstr(e.what(), "cudaErrorInvalidValue") == nullptr) {
      return fail("cuda_error does not name the error");
    }
  }
  try {
    GPUKIT_EXPECTS(1 + 1 == 3, "1 + 1 must be 3 (this consumer checks that a precondition throws)");
    return fail("GPUKIT_EXPECTS did not throw");
  } catch (gpukit::logic_error const& e) {
    std::printf("consumer: caught gpukit::logic_error: %s\n", e.what());
  }
  try {
    gpukit::oom_report report;
    report.requested = std::size_t{3} << 30;
    report.hint      = "halve the micro-batch";
    throw gpukit::out_of_memory{report};
  } catch (std::bad_alloc const& e) {  // out_of_memory is a std::bad_alloc
    if (std::strstr(e.what(), "halve the micro-batch") == nullptr) {
      return fail("out_of_memory does not print its report");
    }
  }

  // The real runtime: the binary starts without a driver, and calls then fail with an error.
  int gpus                 = 0;
  cudaError_t const status = gpukit::cuda_runtime::instance().device_count(gpus);
  std::printf("consumer: cuda_runtime: %d GPU(s) (%s)\n", gpus,
              gpukit::cuda_runtime::error_name(status));

  // A round trip through a simulated 1 GiB GPU.
  gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
  std::size_t const bytes = std::size_t{1} << 20;
  std::vector<unsigned char> in(bytes), out(bytes, 0);
  for (std::size_t i = 0; i < bytes; ++i) { in[i] = static_cast<unsigned char>(i * 7 + 1); }
  gpukit::sim_runtime::stream_type s{};
  void* d = nullptr;
  GPUKIT_CUDA_TRY(sim.stream_create(s));
  GPUKIT_CUDA_TRY(sim.malloc(&d, bytes));
  GPUKIT_CUDA_TRY(sim.memcpy_async(d, in.data(), bytes, gpukit::memcpy_kind::host_to_device, s));
  GPUKIT_CUDA_TRY(sim.memcpy_async(out.data(), d, bytes, gpukit::memcpy_kind::device_to_host, s));
  GPUKIT_CUDA_TRY(sim.stream_synchronize(s));
  GPUKIT_CUDA_TRY(sim.free(d));
  GPUKIT_CUDA_TRY(sim.stream_destroy(s));
  if (in != out) { return fail("the simulated GPU's round trip changed the bytes"); }
  std::printf("consumer: 1 MiB round trip through a simulated GPU: ok\n");

  std::printf("consumer: OK\n");
  return 0;
}
