// SPDX-License-Identifier: Apache-2.0
// tests/support/wait.hpp: waiting, with a deadline, for what another thread makes true.
//
//   CHECK(gpukit::test::wait_until([&] { return pipe.stats().chunks == 2; }));
#pragma once

#include <chrono>
#include <thread>

namespace gpukit::test {

/// Polls `pred` every 100 us until it holds (true) or `timeout` passes (false).
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds{5000})
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) { return false; }
    std::this_thread::sleep_for(std::chrono::microseconds{100});
  }
  return true;
}

}  // namespace gpukit::test
