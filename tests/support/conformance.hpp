// SPDX-License-Identifier: Apache-2.0
// tests/support/conformance.hpp: one doctest case of a conformance suite, for suites that run the
// same checks on every Runtime (the simulated GPU and CUDA).
//
//   GPUKIT_TEST_CONFORMANCE_CASE(gpukit::cuda_runtime::instance(), "cuda_runtime",
//                                "round trips", check_roundtrip)
//
// A suite defines one macro that lists its cases this way (tests/transfer/transfer_conformance.hpp
// does) and invokes it once per runtime.
//
// Each case is named "<name_prefix>: <what>" and calls gpukit::test::<check>(rt), where rt binds
// `runtime_expr` with `auto&&`: an lvalue (a shared runtime) or a prvalue (a fresh simulated GPU
// per case) both work.
#pragma once

#include <doctest/doctest.h>

/// One TEST_CASE named "<name_prefix>: <what>" that runs gpukit::test::<check> on `runtime_expr`.
#define GPUKIT_TEST_CONFORMANCE_CASE(runtime_expr, name_prefix, what, check) \
  TEST_CASE(name_prefix ": " what)                                           \
  {                                                                          \
    auto&& gpukit_conformance_rt = runtime_expr;                             \
    ::gpukit::test::check(gpukit_conformance_rt);                            \
  }
