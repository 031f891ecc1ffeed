// SPDX-License-Identifier: Apache-2.0
// The whole-stack translation unit scripts/compile-time times over the simulated GPU
// (whole_stack.hpp over sim_runtime), as a test of gpukit code holds it. Compiled header-only and
// in the compiled mode (GPUKIT_COMPILED_LIBRARY, gpukit::compiled), never run.
#include "whole_stack.hpp"

#include <gpukit/runtime/sim_runtime.hpp>

int main()
{
  gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30)};
  return whole_stack::step(sim);
}
