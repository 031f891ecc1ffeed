// SPDX-License-Identifier: Apache-2.0
// gpukit-doctor: is this machine's driver, runtime and GPU right for CUDA work?
//
//   gpukit-doctor               checks the real GPU (cuda_runtime) and prints a report
//   gpukit-doctor --json        the same report as one JSON object
//   gpukit-doctor --sim         checks the simulated GPU instead (sim_runtime; says so in the
//                               report)
//   gpukit-doctor --arch LIST   the architectures your kernels were built for, as
//                               CMAKE_CUDA_ARCHITECTURES spells them ("90", "80;90-real"); an
//                               empty LIST skips that check. Default: those gpukit was built for.
//                               An entry that is not an architecture is a bad command line
//
// Exit code: 0 when all is well (warnings allowed), else the code of the first failure:
// 10 no driver, 11 driver too old, 12 no device, 13 driver or system error, 14 kernels not built
// for the device, 15 device unusable; 2 for a bad command line. See gpukit/doctor/doctor.hpp.
// The command line is parsed and run by doctor_cli.hpp, which the argument fuzz harness calls too.
#include "doctor_cli.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>

#include <iostream>

int main(int argc, char** argv)
{
  return gpukit_doctor::run(argc, argv, std::cout, std::cerr, gpukit::cuda_runtime::instance());
}
