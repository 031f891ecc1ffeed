// The program every consumer project builds and runs: it includes gpukit's headers with the host
// compiler only and exercises them the way an application would.
#include <gpukit/error.hpp>
#include <gpukit/runtime/runtime.hpp>
#if __has_include(<gpukit/runtime/sim_runtime.hpp>)
#include <gpukit/runtime/sim_runtime.hpp>
#define GPUKIT_CONSUMER_HAS_SIM 1
#endif

#include <cstdio>
#include <cstring>
#include <string>

namespace {

int fail(char const* what)
{
  std::fprintf(stderr, "consumer: FAILED: %s\n", what);
  return 1;
}

}  // namespace

int main()
{
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
    GPUKIT_EXPECTS(1 + 1 == 3,
                   "1 + 1 must be 3 (this consumer checks that a broken precondition throws)");
    return fail("GPUKIT_EXPECTS did not throw");
  } catch (gpukit::logic_error const& e) {
    std::printf("consumer: caught gpukit::logic_error: %s\n", e.what());
  }
  try {
    gpukit::oom_report report;
    report.requested = 3ull << 30;
    report.hint      = "halve the micro-batch";
    throw gpukit::out_of_memory{report};
  } catch (std::bad_alloc const& e) {  // out_of_memory is a std::bad_alloc
    if (std::strstr(e.what(), "halve the micro-batch") == nullptr) {
      return fail("out_of_memory does not print its report");
    }
  }

#ifdef GPUKIT_CONSUMER_HAS_SIM
  static_assert(gpukit::is_runtime_v<gpukit::sim_runtime>);
  // TODO(package tests): allocate on a simulated GPU once sim_runtime.hpp lands.
#endif
  std::printf("consumer: OK\n");
  return 0;
}
