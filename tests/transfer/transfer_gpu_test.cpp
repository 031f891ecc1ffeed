// The pinned pool, transfer pipeline and prefetcher on a real GPU (cuda_runtime): the same cases
// as on the simulated GPU, plus a transfer of the size the benchmarks use.
#include "transfer/transfer_conformance.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

using gpukit::cuda_runtime;

TEST_SUITE("gpu")
{
  TEST_CASE("pinned_pool on CUDA: reuse and size classes and statistics")
  {
    gpukit::test::check_pool_basics(cuda_runtime::instance());
  }
  TEST_CASE("pinned_pool on CUDA: bad input")
  {
    gpukit::test::check_pool_bad_input(cuda_runtime::instance());
  }
  TEST_CASE("pinned_pool on CUDA: the limit refuses growth")
  {
    gpukit::test::check_pool_limit(cuda_runtime::instance());
  }
  TEST_CASE("pinned_pool on CUDA: a buffer returned with a stream comes back after its work")
  {
    gpukit::test::check_pool_stream_return(cuda_runtime::instance());
  }
  TEST_CASE("transfer on CUDA: round trips on the calling thread")
  {
    gpukit::test::check_pipeline_roundtrip(cuda_runtime::instance(), 1);
  }
  TEST_CASE("transfer on CUDA: round trips with staging threads")
  {
    gpukit::test::check_pipeline_roundtrip(cuda_runtime::instance(), 4);
  }
  TEST_CASE("transfer on CUDA: both directions at once")
  {
    gpukit::test::check_pipeline_bidirectional(cuda_runtime::instance());
  }
  TEST_CASE("transfer on CUDA: bad input")
  {
    gpukit::test::check_pipeline_bad_input(cuda_runtime::instance());
  }
  TEST_CASE("transfer on CUDA: submitted transfers complete with their bytes")
  {
    gpukit::test::check_submitted_transfers(cuda_runtime::instance());
  }
  TEST_CASE("transfer on CUDA: 256 MiB and 1 byte with default options")
  {
    auto& rt = cuda_runtime::instance();
    gpukit::pinned_pool pool{rt};
    gpukit::transfer_pipeline pipe{rt, pool};
    gpukit::test::stream_holder<cuda_runtime> s{rt};
    std::size_t const bytes = (std::size_t{256} << 20) + 1;
    gpukit::test::device_buffer<cuda_runtime> dev{rt, bytes};
    std::vector<unsigned char> src(bytes), dst(bytes);
    gpukit::test::fill_pattern(src.data(), bytes, 123);
    pipe.copy_to_device_async(dev.p, src.data(), bytes, s.s);
    pipe.copy_to_host_async(dst.data(), dev.p, bytes, s.s);
    CHECK(gpukit::test::first_mismatch(dst.data(), bytes, 123) == bytes);
    GPUKIT_CUDA_TRY(rt.stream_synchronize(s.s));
  }
  TEST_CASE("prefetcher on CUDA: batches arrive in order with their bytes")
  {
    gpukit::test::check_prefetcher_order(cuda_runtime::instance());
  }
}
