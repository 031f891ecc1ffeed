// SPDX-License-Identifier: Apache-2.0
// gpukit-doctor: is this machine's driver, runtime and GPU right for CUDA work?
//
//   gpukit-doctor               checks the real GPU (cuda_runtime) and prints a report
//   gpukit-doctor --json        the same report as one JSON object
//   gpukit-doctor --sim         checks the simulated GPU instead (sim_runtime; says so in the
//   report) gpukit-doctor --arch LIST   the architectures your kernels were built for, as
//                               CMAKE_CUDA_ARCHITECTURES spells them ("90", "80;90-real"); an
//                               empty LIST skips that check. Default: those gpukit was built for
//
// Exit code: 0 when all is well (warnings allowed), else the code of the first failure:
// 10 no driver, 11 driver too old, 12 no device, 13 driver or system error, 14 kernels not built
// for the device, 15 device unusable; 2 for a bad command line. See gpukit/doctor/doctor.hpp.
#include <gpukit/doctor/doctor.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cstdio>
#include <string>

#ifndef GPUKIT_CUDA_ARCHITECTURES
#define GPUKIT_CUDA_ARCHITECTURES ""
#endif

namespace {

char const* const usage_text =
  "usage: gpukit-doctor [--json] [--sim] [--arch LIST]\n"
  "Checks the NVIDIA driver, the CUDA runtime and each GPU; prints each check with its fix.\n"
  "  --json       the report as one JSON object\n"
  "  --sim        check gpukit's simulated GPU instead of this machine's\n"
  "  --arch LIST  the CUDA architectures the kernels were built for (\"90\", \"80;90-real\");\n"
  "               empty: no architecture check. Default: \"" GPUKIT_CUDA_ARCHITECTURES
  "\"\n"
  "Exit code: 0 ok (warnings allowed), 10 no driver, 11 driver too old, 12 no device,\n"
  "13 driver or system error, 14 kernels not built for the device, 15 device unusable,\n"
  "2 bad command line.\n";

struct command_line {
  bool json{false};
  bool sim{false};
  bool help{false};
  std::string architectures{GPUKIT_CUDA_ARCHITECTURES};
  std::string error;  ///< what is wrong with the command line (empty: nothing)
};

command_line parse_arguments(int argc, char** argv)
{
  command_line c;
  for (int i = 1; i < argc && c.error.empty(); ++i) {
    std::string const a = argv[i];
    if (a == "--json") {
      c.json = true;
    } else if (a == "--sim") {
      c.sim = true;
    } else if (a == "--help" || a == "-h") {
      c.help = true;
    } else if (a.rfind("--arch=", 0) == 0) {
      c.architectures = a.substr(7);
    } else if (a == "--arch") {
      if (i + 1 == argc) {
        c.error = "--arch needs a value";
      } else {
        c.architectures = argv[++i];
      }
    } else {
      c.error = "unknown option \"" + a + "\"";
    }
  }
  return c;
}

}  // namespace

int main(int argc, char** argv)
{
  command_line const c = parse_arguments(argc, argv);
  if (!c.error.empty()) {
    std::fprintf(stderr, "gpukit-doctor: error: %s\n%s", c.error.c_str(), usage_text);
    return gpukit::doctor_exit::usage;
  }
  if (c.help) {
    std::fputs(usage_text, stdout);
    return 0;
  }
  if (c.sim) {  // GPUKIT_SIM_* configure the simulated GPU: a malformed value is a usage error
    try {
      (void)gpukit::sim_config::from_env();
    } catch (gpukit::logic_error const& e) {
      std::string message = e.what();
      if (message.rfind("gpukit: ", 0) == 0) message.erase(0, 8);
      if (auto const at = message.rfind(" ("); at != std::string::npos) message.erase(at);
      std::fprintf(stderr, "gpukit-doctor: error: %s\n", message.c_str());
      return gpukit::doctor_exit::usage;
    }
  }
  gpukit::doctor_options options;
  options.built_architectures = c.architectures;
  gpukit::doctor_report const report =
    c.sim ? gpukit::run_doctor(gpukit::sim_runtime::instance(), options)
          : gpukit::run_doctor(gpukit::cuda_runtime::instance(), options);
  std::string const out = c.json ? report.to_json() + "\n" : report.to_text();
  std::fputs(out.c_str(), stdout);
  return report.exit_code();
}
