// SPDX-License-Identifier: Apache-2.0
// The pinned pool, transfer pipeline and prefetcher conformance cases on the simulated GPU (a
// fresh one per case). The simulated GPU's streams are threads, so every case is in
// TEST_SUITE("sim_concurrency"), which the tsan preset runs under ThreadSanitizer.
#include "transfer/transfer_conformance.hpp"

#include "support/sim_gpu.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

TEST_SUITE("sim_concurrency")
{
  GPUKIT_TRANSFER_CONFORMANCE_CASES(
    gpukit::sim_runtime{gpukit::test::one_device(gpukit::test::gib)}, "sim_runtime")
}
