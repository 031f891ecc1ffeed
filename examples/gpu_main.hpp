// SPDX-License-Identifier: Apache-2.0
// examples/gpu_main.hpp: main() of the example and benchmark programs that need a GPU.
//
//   int main(int argc, char** argv)
//   {
//     args const a = parse(argc, argv);
//     return gpukit_examples::run_on_gpu("profile_mlp", [&] { return run(a); });
//   }
//
// Without a device the program prints why and exits 77, which CTest reports as skipped
// (SKIP_RETURN_CODE 77, set for every example test), never as passed. An exception from the
// program is printed under its name and exits 1.
#pragma once

#include <gpukit/runtime/cuda_runtime.hpp>

#include <cstdio>
#include <exception>
#include <utility>

namespace gpukit_examples {

/// The exit status of a program that could not run here (CTest's SKIP_RETURN_CODE).
inline constexpr int skipped = 77;

/// program() when the CUDA runtime sees a device, else `skipped`; exceptions give 1.
template <class Program>
int run_on_gpu(char const* name, Program&& program)
{
  int devices         = 0;
  cudaError_t const e = gpukit::cuda_runtime::instance().device_count(devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA GPU (%s): skipped\n", name,
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return skipped;
  }
  try {
    return std::forward<Program>(program)();
  } catch (std::exception const& ex) {
    std::fprintf(stderr, "%s: %s\n", name, ex.what());
    return 1;
  }
}

}  // namespace gpukit_examples
