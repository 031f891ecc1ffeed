// The caching allocator on a real GPU (cuda_runtime): the same conformance cases as on the
// simulated GPU, and the stress test.
#include "memory/allocator_conformance.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

TEST_SUITE("gpu")
{
  TEST_CASE("caching_allocator on CUDA: round trip of many sizes")
  {
    gpukit::test::check_alloc_roundtrip(gpukit::cuda_runtime::instance());
  }
  TEST_CASE("caching_allocator on CUDA: same-stream reuse")
  {
    gpukit::test::check_same_stream_reuse(gpukit::cuda_runtime::instance());
  }
  TEST_CASE("caching_allocator on CUDA: bad input")
  {
    gpukit::test::check_bad_input(gpukit::cuda_runtime::instance());
  }
  TEST_CASE("caching_allocator on CUDA: limit and out-of-memory report")
  {
    gpukit::test::check_limit_and_oom_report(gpukit::cuda_runtime::instance());
  }
  TEST_CASE("caching_allocator on CUDA: stress with threads x streams x random sizes")
  {
    gpukit::test::check_stress(gpukit::cuda_runtime::instance(), 8, 2000, std::size_t{64} << 20);
  }
}
