// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/detail/system_checks.hpp: the checks of the machine around the devices:
// [pcie.<d>], [device_files], [nvtx] and [env.<NAME>]. Not public API.
#pragma once

#include <gpukit/doctor/detail/report.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpukit::detail {

/// A PCIe link as sysfs describes it.
struct pcie_link {
  bool known{false};
  std::string unreadable;  ///< the first file that could not be read or parsed
  double current_gts{0}, max_gts{0};
  int current_width{0}, max_width{0};
};

/// PCIe generation of a transfer rate per lane in GT/s (2.5 Gen1 ... 64 Gen6); 0 when unknown.
inline int pcie_generation(double gts) noexcept
{
  if (gts <= 0) return 0;
  if (gts < 4) return 1;
  if (gts < 6.5) return 2;
  if (gts < 12) return 3;
  if (gts < 24) return 4;
  if (gts < 48) return 5;
  if (gts < 96) return 6;
  return 7;
}

/// Reads <dir>/{current,max}_link_{speed,width} ("16.0 GT/s PCIe", "16").
inline pcie_link read_pcie_link(std::string const& dir)
{
  pcie_link l;
  auto number = [&](char const* name, double& out) {
    std::ifstream f{dir + "/" + name};
    std::string text;
    if (!f || !std::getline(f, text)) return false;
    char* end      = nullptr;
    double const v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || !(v > 0)) return false;
    out = v;
    return true;
  };
  double cw = 0, mw = 0;
  for (auto [name, out] : {std::pair<char const*, double*>{"current_link_speed", &l.current_gts},
                           {"max_link_speed", &l.max_gts},
                           {"current_link_width", &cw},
                           {"max_link_width", &mw}}) {
    if (!number(name, *out)) {
      l.unreadable = dir + "/" + name;
      return l;
    }
  }
  l.current_width = static_cast<int>(cw);
  l.max_width     = static_cast<int>(mw);
  l.known         = true;
  return l;
}

/// [pcie.<d>]: the PCIe link of device `d` at PCI address `pci` (domain:bus:device.0), read from
/// <root>/<pci>; run after the copies, so that a link idling at a low speed has trained up.
template <class Runtime>
doctor_check check_pcie(int d, std::string const& pci, std::string const& root)
{
  std::string const id = "pcie." + std::to_string(d), title = "PCIe link";
  if (Runtime::is_simulated) {
    return make_check(id, title, check_status::skip, "simulated GPU: no PCIe link");
  }
  pcie_link const l = read_pcie_link(root + "/" + pci);
  if (!l.known) {
    return make_check(
      id, title, check_status::skip,
      "unknown: cannot read " + l.unreadable + " (no sysfs here, or not a PCIe device)");
  }
  auto spell = [](double gts, int width) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "Gen%d x%d (%.1f GT/s)", pcie_generation(gts), width, gts);
    return std::string{buf};
  };
  std::string const now = spell(l.current_gts, l.current_width);
  std::string const top = spell(l.max_gts, l.max_width);
  int const gen_top     = pcie_generation(l.max_gts);
  if (l.current_width < l.max_width) {
    return make_check(
      id, title, check_status::warn,
      "PCI " + pci + " runs at " + now + ", narrower than its maximum " + top +
        ": host <-> device copies get about " +
        std::to_string(100 * l.current_width / l.max_width) + "% of the link",
      "put the GPU in a slot wired x" + std::to_string(l.max_width) +
        " (check riser cables and the BIOS's lane bifurcation); nvidia-smi -q -d PCIE shows the "
        "link");
  }
  if (pcie_generation(l.current_gts) < gen_top) {
    return make_check(
      id, title, check_status::warn,
      "PCI " + pci + " runs at " + now + ", slower than its maximum " + top,
      "an idle GPU lowers its link speed to save power: look again while copying (nvidia-smi -q -d "
      "PCIE); if it stays low, the slot, a riser or the BIOS caps the generation (set the slot to "
      "Gen" +
        std::to_string(gen_top) + " or auto)");
  }
  return make_check(id, title, check_status::ok, "PCI " + pci + " at " + now + ", its maximum");
}

/// [device_files]: /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<d> (under `root`) exist and
/// this user may read and write them. Missing files only warn when no device was usable.
template <class Runtime>
doctor_check check_device_files(std::string const& root, int count, bool device_usable)
{
  std::string const id = "device_files", title = "device files";
  if (Runtime::is_simulated) {
    return make_check(id, title, check_status::skip, "simulated GPU: no device files");
  }
  std::vector<std::string> files{root + "/nvidiactl", root + "/nvidia-uvm"};
  for (int d = 0; d < std::max(count, 1); ++d)
    files.push_back(root + "/nvidia" + std::to_string(d));
  std::string absent, denied;
  for (auto const& f : files) {
    if (::access(f.c_str(), F_OK) != 0) {
      absent += (absent.empty() ? "" : ", ") + f;
    } else if (::access(f.c_str(), R_OK | W_OK) != 0) {
      denied += (denied.empty() ? "" : ", ") + f;
    }
  }
  if (!denied.empty()) {
    return make_check(id, title, check_status::fail,
                      "not readable and writable by this user: " + denied,
                      "add the user to the group that owns them (often video), or in a container "
                      "let the runtime pass the devices (docker run --gpus all)",
                      doctor_exit::driver_error);
  }
  if (!absent.empty()) {
    return make_check(id, title, device_usable ? check_status::ok : check_status::warn,
                      "missing: " + absent,
                      device_usable ? std::string{}
                                    : std::string{"load the kernel modules (sudo modprobe nvidia "
                                                  "nvidia-uvm, or nvidia-modprobe -u -c=0); in a "
                                                  "container pass the devices (docker run --gpus "
                                                  "all)"});
  }
  return make_check(id, title, check_status::ok,
                    "present and accessible: " + std::to_string(files.size()) + " files");
}

/// [nvtx]: whether an NVTX tool is attached (NVTX_INJECTION64_PATH), and whether it exists.
inline doctor_check check_nvtx_tool(doctor_options const& o)
{
  std::string const id = "nvtx", title = "NVTX tool";
  std::optional<std::string> const tool = env_value(o, "NVTX_INJECTION64_PATH");
  if (!tool || tool->empty()) {
    return make_check(id, title, check_status::ok,
                      "no tool attached: NVTX ranges cost about 2 ns and record nothing");
  }
  if (::access(tool->c_str(), R_OK) != 0) {
    return make_check(id, title, check_status::warn,
                      "NVTX_INJECTION64_PATH=" + *tool +
                        " does not exist: NVTX cannot load it, ranges are recorded by nothing",
                      "point NVTX_INJECTION64_PATH at an existing injection library, or unset it");
  }
  return make_check(id, title, check_status::ok, "tool attached: NVTX_INJECTION64_PATH=" + *tool);
}

/// One variable's check, [env.<name>]: a warning with its fix when `bad`, else ok with what it
/// does.
inline doctor_check env_check(char const* name, bool bad, std::string effect, char const* fix)
{
  return make_check(std::string{"env."} + name, name, bad ? check_status::warn : check_status::ok,
                    std::move(effect), bad ? fix : "");
}

/// CUDA_VISIBLE_DEVICES (`visible`), when set.
inline std::optional<doctor_check> env_visible_devices(std::optional<std::string> const& visible)
{
  if (!visible) { return std::nullopt; }
  return env_check("CUDA_VISIBLE_DEVICES", visible->empty(),
                   visible->empty()
                     ? "set but empty: hides every GPU"
                     : "\"" + *visible + "\": only these devices are visible, renumbered from 0",
                   "unset it, or list the devices to use");
}

/// CUDA_LAUNCH_BLOCKING, when set.
inline std::optional<doctor_check> env_launch_blocking(doctor_options const& o)
{
  auto const v = env_value(o, "CUDA_LAUNCH_BLOCKING");
  if (!v) { return std::nullopt; }
  bool const on = *v == "1";
  return env_check("CUDA_LAUNCH_BLOCKING", on,
                   on ? "1: every kernel launch waits for the kernel to finish (for debugging; "
                        "much slower, and stream overlap is lost)"
                      : "\"" + *v + "\": launches stay asynchronous",
                   "unset CUDA_LAUNCH_BLOCKING outside debugging sessions");
}

/// PYTORCH_CUDA_ALLOC_CONF, when set.
inline std::optional<doctor_check> env_pytorch_alloc_conf(doctor_options const& o)
{
  auto const v = env_value(o, "PYTORCH_CUDA_ALLOC_CONF");
  if (!v) { return std::nullopt; }
  return env_check("PYTORCH_CUDA_ALLOC_CONF", false,
                   "\"" + *v +
                     "\": configures PyTorch's allocator only; gpukit's takes "
                     "gpukit::caching_allocator_options",
                   "");
}

/// CUDA_DEVICE_ORDER, when set, or unset on a machine with several GPUs (`several`).
inline std::optional<doctor_check> env_device_order(doctor_options const& o, bool several)
{
  if (auto const v = env_value(o, "CUDA_DEVICE_ORDER")) {
    return env_check("CUDA_DEVICE_ORDER", false,
                     "\"" + *v + "\"" + (*v == "PCI_BUS_ID" ? ": ordinals match nvidia-smi" : ""),
                     "");
  }
  if (!several) { return std::nullopt; }
  return env_check(
    "CUDA_DEVICE_ORDER", true,
    "unset: CUDA numbers devices fastest first, which may differ from nvidia-smi's order",
    "export CUDA_DEVICE_ORDER=PCI_BUS_ID so that ordinals match nvidia-smi");
}

/// CUDA_MODULE_LOADING, when set.
inline std::optional<doctor_check> env_module_loading(doctor_options const& o)
{
  auto const v = env_value(o, "CUDA_MODULE_LOADING");
  if (!v) { return std::nullopt; }
  bool const eager = *v == "EAGER";
  return env_check(
    "CUDA_MODULE_LOADING", eager,
    "\"" + *v + "\"" +
      (eager ? ": every kernel is loaded at start (slower start, more device memory)" : ""),
    "unset it (LAZY is the default)");
}

/// CUDA_CACHE_DISABLE, when it is 1.
inline std::optional<doctor_check> env_cache_disable(doctor_options const& o)
{
  auto const v = env_value(o, "CUDA_CACHE_DISABLE");
  if (!v || *v != "1") { return std::nullopt; }
  return env_check("CUDA_CACHE_DISABLE", true, "1: PTX is JIT-compiled again on every run",
                   "unset CUDA_CACHE_DISABLE");
}

/// LD_LIBRARY_PATH, when it holds a stubs directory.
inline std::optional<doctor_check> env_ld_library_path(doctor_options const& o)
{
  auto const v = env_value(o, "LD_LIBRARY_PATH");
  if (!v || v->find("stubs") == std::string::npos) { return std::nullopt; }
  return env_check("LD_LIBRARY_PATH", true,
                   "contains a stubs directory: a libcuda.so stub there hides the driver "
                   "(cudaErrorStubLibrary)",
                   "remove the CUDA toolkit's lib64/stubs from LD_LIBRARY_PATH");
}

/// [env.GPUKIT_SIM]: the simulated GPU's configuration, when either variable is set.
inline std::optional<doctor_check> env_simulated_gpu(doctor_options const& o)
{
  auto const devs = env_value(o, "GPUKIT_SIM_DEVICES"), cap = env_value(o, "GPUKIT_SIM_CAPACITY");
  if (!devs && !cap) { return std::nullopt; }
  return make_check("env.GPUKIT_SIM", "simulated GPU configuration", check_status::ok,
                    "GPUKIT_SIM_DEVICES=" + devs.value_or("(unset)") +
                      ", GPUKIT_SIM_CAPACITY=" + cap.value_or("(unset)"));
}

/// [env.<NAME>]: the environment variables that change CUDA's behavior, each when it is set (and
/// CUDA_DEVICE_ORDER also when it is unset on a machine with several GPUs). `visible` is
/// CUDA_VISIBLE_DEVICES, `count` the devices the runtime sees.
template <class Runtime>
std::vector<doctor_check> check_environment(doctor_options const& o,
                                            std::optional<std::string> const& visible, int count)
{
  std::optional<doctor_check> checks[] = {
    env_visible_devices(visible), env_launch_blocking(o),
    env_pytorch_alloc_conf(o),    env_device_order(o, count > 1 && !Runtime::is_simulated),
    env_module_loading(o),        env_cache_disable(o),
    env_ld_library_path(o),       Runtime::is_simulated ? env_simulated_gpu(o) : std::nullopt,
  };
  std::vector<doctor_check> out;
  for (auto& c : checks) {
    if (c) { out.push_back(std::move(*c)); }
  }
  return out;
}

}  // namespace gpukit::detail
