// gpukit doctor: is this machine's driver, runtime and GPU right for CUDA work?
//
//   doctor            checks the real GPU (cuda_runtime) and prints a report
//   doctor --json     the same report as one JSON object
//   doctor --sim      checks the simulated GPU instead (sim_runtime; says so in the report)
//
// Exit code: 0 when all is well (warnings allowed), else the code of the first failure:
// 10 no driver, 11 driver too old, 12 no device, 13 driver or system error, 14 kernels not built
// for the device, 15 device unusable; 2 for a bad argument. See gpukit/doctor.hpp.
#include <gpukit/doctor.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cstdio>
#include <cstring>
#include <string>

#ifndef GPUKIT_CUDA_ARCHITECTURES
#define GPUKIT_CUDA_ARCHITECTURES ""
#endif

int main(int argc, char** argv)
{
  bool json = false;
  bool sim  = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--sim") == 0) {
      sim = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--sim]\n", argv[0]);
      return gpukit::doctor_exit::usage;
    }
  }
  gpukit::doctor_options options;
  options.built_architectures = GPUKIT_CUDA_ARCHITECTURES;  // what gpukit's own kernels target
  gpukit::doctor_report const report =
    sim ? gpukit::run_doctor(gpukit::sim_runtime::instance(), options)
        : gpukit::run_doctor(gpukit::cuda_runtime::instance(), options);
  std::string const out = json ? report.to_json() + "\n" : report.to_text();
  std::fputs(out.c_str(), stdout);
  return report.exit_code();
}
