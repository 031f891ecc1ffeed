// SPDX-License-Identifier: Apache-2.0
// The pinned pool, transfer pipeline and prefetcher on a real GPU (cuda_runtime): the conformance
// cases the simulated GPU runs, plus a transfer of the size the benchmarks use.
#include "transfer/transfer_conformance.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

#include <vector>

using gpukit::cuda_runtime;

TEST_SUITE("gpu")
{
  GPUKIT_TRANSFER_CONFORMANCE_CASES(cuda_runtime::instance(), "cuda_runtime")

  TEST_CASE("cuda_runtime: transfer: 256 MiB and 1 byte with default options")
  {
    auto& rt = cuda_runtime::instance();
    gpukit::test::transfer_fixture<cuda_runtime> f{rt};
    gpukit::transfer_pipeline pipe{rt, f.pool};
    std::size_t const bytes = 256 * gpukit::test::mib + 1;
    gpukit::test::device_buffer<cuda_runtime> dev{rt, bytes};
    auto const src = gpukit::test::pattern_bytes(bytes, 123);
    std::vector<unsigned char> dst(bytes);
    pipe.copy_to_device_async(dev.p, src.data(), bytes, f.s);
    pipe.copy_to_host_async(dst.data(), dev.p, bytes, f.s);
    CHECK(gpukit::test::first_mismatch(dst.data(), bytes, 123) == bytes);
    GPUKIT_CUDA_TRY(rt.stream_synchronize(f.s));
  }
}
