// SPDX-License-Identifier: Apache-2.0
// doctor_cli.hpp: gpukit-doctor's command line and what it runs, callable in-process: shared by
// the tool (gpukit_doctor.cpp) and its argument fuzz harness (tests/fuzz/doctor_args_fuzz.cpp).
// Not installed.
#pragma once

#include <gpukit/doctor/doctor.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <exception>
#include <ostream>
#include <string>
#include <utility>

#ifndef GPUKIT_CUDA_ARCHITECTURES
#define GPUKIT_CUDA_ARCHITECTURES ""
#endif

namespace gpukit_doctor {

inline char const* const usage_text =
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
  bool architectures_given{false};  ///< --arch was given
  std::string error;                ///< what is wrong with the command line (empty: nothing)
};

/// The command line, checked: `error` says what is wrong with it, if anything.
inline command_line parse_arguments(int argc, char** argv)
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
      c.architectures       = a.substr(7);
      c.architectures_given = true;
    } else if (a == "--arch") {
      if (i + 1 == argc) {
        c.error = "--arch needs a value";
      } else {
        c.architectures       = argv[++i];
        c.architectures_given = true;
      }
    } else {
      c.error = "unknown option \"" + a + "\"";
    }
  }
  if (c.error.empty() && c.architectures_given) {
    if (std::string const bad = gpukit::architectures_error(c.architectures); !bad.empty()) {
      bool const whole = bad.rfind("\"" + c.architectures + "\" ", 0) == 0;  // one entry
      c.error          = "--arch " + (whole ? bad : "\"" + c.architectures + "\": " + bad);
    }
  }
  return c;
}

/// A gpukit message without its "gpukit: " prefix: the tool prints its own. (The tool is built
/// with GPUKIT_ERROR_LOCATIONS=0: no source location follows the message.)
inline std::string plain(std::string message)
{
  if (message.rfind("gpukit: ", 0) == 0) message.erase(0, 8);
  return message;
}

/// gpukit-doctor with arguments `argv`: the report goes to `out`, errors to `err`; returns the exit
/// code (see gpukit_doctor.cpp). `gpu` is the runtime checked without --sim (the tool passes
/// cuda_runtime::instance()); `options` the doctor's other settings (the architectures come from
/// the command line). Throws nothing.
template <class Runtime>
int run(int argc, char** argv, std::ostream& out, std::ostream& err, Runtime& gpu,
        gpukit::doctor_options options = {}) noexcept
{
  try {
    command_line const c = parse_arguments(argc, argv);
    if (!c.error.empty()) {
      err << "gpukit-doctor: error: " << c.error << '\n' << usage_text;
      return gpukit::doctor_exit::usage;
    }
    if (c.help) {
      out << usage_text;
      return 0;
    }
    if (c.sim) {  // GPUKIT_SIM_* configure the simulated GPU: a malformed value is a usage error
      try {
        (void)gpukit::sim_config::from_env();
      } catch (gpukit::logic_error const& e) {
        err << "gpukit-doctor: error: " << plain(e.what()) << '\n';
        return gpukit::doctor_exit::usage;
      }
    }
    options.built_architectures = c.architectures;
    gpukit::doctor_report const report =
      c.sim ? gpukit::run_doctor(gpukit::sim_runtime::instance(), options)
            : gpukit::run_doctor(gpu, options);
    out << (c.json ? report.to_json() + "\n" : report.to_text()) << std::flush;
    return report.exit_code();
  } catch (std::exception const& e) {  // std::bad_alloc: the system is in trouble
    try {
      err << "gpukit-doctor: error: " << plain(e.what()) << '\n';
    } catch (...) {}
    return gpukit::doctor_exit::driver_error;
  }
}

}  // namespace gpukit_doctor
