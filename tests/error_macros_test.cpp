// SPDX-License-Identifier: Apache-2.0
// The public error macros of gpukit/error_macros.hpp, included alone: what each throws, and that
// its message names what failed (the call and the error's value, the condition, the message) and
// where (this file and the macro's line): the form of a debug build, chosen here whatever the build
// type (error_messages_test checks the release form).
#define GPUKIT_ERROR_LOCATIONS 1
#include <gpukit/error_macros.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <string>

namespace {

bool contains(std::string const& text, std::string const& part)
{
  return text.find(part) != std::string::npos;
}

cudaError_t fails_with(cudaError_t e, int& calls)
{
  ++calls;
  return e;
}

std::string const this_file = __FILE__;

// GPUKIT_FAIL ends a function that returns a value: it never returns.
int dtype_size(int dtype)
{
  if (dtype == 0) { return 4; }
  GPUKIT_FAIL("unsupported dtype " + std::to_string(dtype));
}

}  // namespace

TEST_SUITE("error")
{
  TEST_CASE("GPUKIT_CUDA_TRY throws cuda_error naming the call and the error and where")
  {
    int calls      = 0;
    int const line = __LINE__ + 2;
    try {
      GPUKIT_CUDA_TRY(fails_with(cudaErrorInvalidValue, calls));
      FAIL("GPUKIT_CUDA_TRY did not throw");
    } catch (gpukit::cuda_error const& e) {
      CHECK(calls == 1);  // the call is evaluated once
      CHECK(e.code() == static_cast<int>(cudaErrorInvalidValue));
      CHECK(std::string{e.name()} == "cudaErrorInvalidValue");
      CHECK(std::string{e.call()} == "fails_with(cudaErrorInvalidValue, calls)");
      CHECK(e.line() == line);
      std::string const what = e.what();
      CHECK(contains(what,
                     "gpukit: fails_with(cudaErrorInvalidValue, calls) failed with "
                     "cudaErrorInvalidValue (" +
                       std::to_string(static_cast<int>(cudaErrorInvalidValue)) + ")"));
      CHECK(contains(what, this_file + ":" + std::to_string(line)));
    }
  }

  TEST_CASE("GPUKIT_CUDA_TRY with a status and a name names the call that returned the status")
  {
    cudaError_t const e = cudaErrorMemoryAllocation;
    try {
      GPUKIT_CUDA_TRY(e, "cudaMallocAsync(&p, bytes, s)");
      FAIL("GPUKIT_CUDA_TRY did not throw");
    } catch (gpukit::cuda_error const& err) {
      CHECK(contains(
        err.what(), "gpukit: cudaMallocAsync(&p, bytes, s) failed with cudaErrorMemoryAllocation"));
    }
  }

  TEST_CASE("GPUKIT_CUDA_TRY lets success through and evaluates the call once")
  {
    int calls = 0;
    CHECK_NOTHROW(GPUKIT_CUDA_TRY(fails_with(cudaSuccess, calls)));
    CHECK(calls == 1);
  }

  TEST_CASE("GPUKIT_EXPECTS throws logic_error naming the message and the condition and where")
  {
    std::size_t const bytes = 0;
    int const line          = __LINE__ + 2;
    try {
      GPUKIT_EXPECTS(bytes > 0, "upload of " + std::to_string(bytes) + " bytes");
      FAIL("GPUKIT_EXPECTS did not throw");
    } catch (gpukit::logic_error const& e) {
      std::string const what = e.what();
      CHECK(contains(what, "gpukit: upload of 0 bytes"));
      CHECK(contains(what, "precondition `bytes > 0` failed"));
      CHECK(contains(what, this_file + ":" + std::to_string(line)));
    }
  }

  TEST_CASE("GPUKIT_EXPECTS does not evaluate its message when the condition holds")
  {
    int messages = 0;
    auto message = [&] {
      ++messages;
      return std::string{"never"};
    };
    CHECK_NOTHROW(GPUKIT_EXPECTS(1 + 1 == 2, message()));
    CHECK(messages == 0);
  }

  TEST_CASE("GPUKIT_FAIL throws logic_error with its message and where")
  {
    CHECK(dtype_size(0) == 4);
    try {
      (void)dtype_size(7);
      FAIL("GPUKIT_FAIL did not throw");
    } catch (gpukit::logic_error const& e) {
      std::string const what = e.what();
      CHECK(contains(what, "gpukit: unsupported dtype 7 ("));
      CHECK(contains(what, this_file + ":"));
      CHECK_FALSE(contains(what, "precondition"));
    }
  }
}
