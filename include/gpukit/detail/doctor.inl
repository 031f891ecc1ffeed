// gpukit/detail/doctor.inl: the doctor's checks (see gpukit/doctor.hpp). Not public API.
#pragma once

#include <gpukit/doctor.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace gpukit {

inline std::string cuda_version_string(int v)
{
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

inline char const* minimum_driver_branch(int cuda_version) noexcept
{
  switch (cuda_version / 1000) {
    case 13: return "580";
    case 12: return "525";
    case 11: return "450";
    default: return "";
  }
}

inline check_status doctor_report::verdict() const noexcept
{
  check_status v = check_status::ok;
  for (auto const& c : checks) {
    if (c.status == check_status::fail) return check_status::fail;
    if (c.status == check_status::warn) v = check_status::warn;
  }
  return v;
}

inline int doctor_report::exit_code() const noexcept
{
  for (auto const& c : checks) {
    if (c.status == check_status::fail) return c.exit_code != 0 ? c.exit_code : 1;
  }
  return doctor_exit::ok;
}

inline doctor_check const* doctor_report::find(std::string_view id) const noexcept
{
  for (auto const& c : checks) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

inline std::string doctor_report::to_text() const
{
  std::string out = simulated
                      ? "gpukit doctor: SIMULATED GPU (sim_runtime), not this machine's hardware\n"
                      : "gpukit doctor\n";
  for (auto const& c : checks) {
    char const* tag = c.status == check_status::ok     ? "[ ok ]"
                      : c.status == check_status::warn ? "[warn]"
                      : c.status == check_status::fail ? "[FAIL]"
                                                       : "[skip]";
    std::string id  = c.id;
    if (id.size() < 18) id.resize(18, ' ');
    out += std::string{tag} + " " + id + " " + c.title + ": " + c.detail + "\n";
    if (!c.fix.empty()) out += "       fix: " + c.fix + "\n";
  }
  auto const v = verdict();
  out += std::string{"verdict: "} +
         (v == check_status::fail   ? "FAIL"
          : v == check_status::warn ? "ok, with warnings"
                                    : "ok") +
         " (exit " + std::to_string(exit_code()) + ")\n";
  return out;
}

inline std::string doctor_report::to_json() const
{
  std::string out = "{\"simulated\":" + std::string{simulated ? "true" : "false"} +
                    ",\"driver_version\":" + std::to_string(driver_version) +
                    ",\"runtime_version\":" + std::to_string(runtime_version) +
                    ",\"verdict\":" + detail::json_string(to_string(verdict())) +
                    ",\"exit_code\":" + std::to_string(exit_code()) + ",\"checks\":[";
  bool first = true;
  for (auto const& c : checks) {
    if (!first) out += ',';
    first = false;
    out += "{\"id\":" + detail::json_string(c.id) + ",\"title\":" + detail::json_string(c.title) +
           ",\"status\":" + detail::json_string(to_string(c.status)) +
           ",\"detail\":" + detail::json_string(c.detail) +
           ",\"fix\":" + detail::json_string(c.fix) +
           ",\"exit_code\":" + std::to_string(c.exit_code) + "}";
  }
  return out + "]}";
}

namespace detail {

inline doctor_check make_check(std::string id, std::string title, check_status s,
                               std::string detail, std::string fix = {}, int code = 0)
{
  return doctor_check{std::move(id), std::move(title), s, std::move(detail), std::move(fix), code};
}

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

/// The [pcie.<d>] check of device `d` with PCI address `pci` (domain:bus:device.0).
inline doctor_check pcie_check(std::string const& sd, std::string const& pci,
                               std::string const& root)
{
  pcie_link const l    = read_pcie_link(root + "/" + pci);
  std::string const id = "pcie." + sd, title = "PCIe link";
  if (!l.known) {
    return make_check(
      id, title, check_status::skip,
      "unknown: cannot read " + l.unreadable + " (no sysfs here, or not a PCIe device)");
  }
  auto spell = [](double gts, int width) {
    char buf[64];
    int const gen = pcie_generation(gts);
    std::snprintf(buf, sizeof buf, "Gen%d x%d (%.1f GT/s)", gen, width, gts);
    return std::string{buf};
  };
  std::string const now = spell(l.current_gts, l.current_width);
  std::string const top = spell(l.max_gts, l.max_width);
  int const gen_now = pcie_generation(l.current_gts), gen_top = pcie_generation(l.max_gts);
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
  if (gen_now < gen_top) {
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

/// How a binary built for `archs` (CMAKE_CUDA_ARCHITECTURES) runs on compute capability
/// major.minor: 2 native code (SASS), 1 only by JIT-compiling PTX, 0 not at all, -1 unknown.
/// `how` names the entry that fits.
inline int arch_fit(std::string const& archs, int major, int minor, std::string& how)
{
  int const cc    = major * 10 + minor;
  int best        = 0;
  std::size_t pos = 0;
  while (pos <= archs.size()) {
    std::size_t end = archs.find_first_of(";, ", pos);
    if (end == std::string::npos) end = archs.size();
    std::string entry = archs.substr(pos, end - pos);
    pos               = end + 1;
    if (entry.empty()) continue;
    if (entry == "all" || entry == "all-major" || entry == "native") {
      how = entry;
      return -1;
    }
    bool real = true, virt = true;
    if (entry.size() > 5 && entry.compare(entry.size() - 5, 5, "-real") == 0) {
      virt = false;
      entry.resize(entry.size() - 5);
    } else if (entry.size() > 8 && entry.compare(entry.size() - 8, 8, "-virtual") == 0) {
      real = false;
      entry.resize(entry.size() - 8);
    }
    bool specific = false;  // "90a": arch-specific features, runs on exactly that capability
    bool family   = false;  // "100f": family-specific, runs on the same major, minor >=
    if (!entry.empty() && (entry.back() == 'a' || entry.back() == 'f')) {
      specific = entry.back() == 'a';
      family   = entry.back() == 'f';
      entry.pop_back();
    }
    if (entry.empty() || entry.find_first_not_of("0123456789") != std::string::npos) continue;
    int const a = std::stoi(entry);
    if (real) {
      bool const fits = specific ? a == cc : (a / 10 == major && a % 10 <= minor);
      if (fits && best < 2) {
        best = 2;
        how  = "sm_" + std::to_string(a) + (specific ? "a" : family ? "f" : "");
      }
    }
    if (virt && best < 1) {
      bool const fits = specific ? a == cc
                        : family ? (a / 10 == major && a % 10 <= minor)
                                 : a <= cc;
      if (fits) {
        best = 1;
        how  = "compute_" + std::to_string(a);
      }
    }
  }
  return best;
}

template <class Runtime>
doctor_check device_count_failure(cudaError_t e, int driver, int runtime, char const* visible)
{
  std::string const name =
    std::string{Runtime::error_name(e)} + " (" + Runtime::error_string(e) + ")";
  std::string const need = std::string{"R"} + minimum_driver_branch(runtime) + " or newer";
  switch (e) {
    case cudaErrorInsufficientDriver:
      if (driver == 0) {
        return make_check("devices", "GPU devices", check_status::fail,
                          name + ": no NVIDIA driver is installed (the driver reports CUDA 0)",
                          "install the NVIDIA driver (" + need + " for CUDA " +
                            cuda_version_string(runtime) +
                            "); in a container, run it with the NVIDIA Container Toolkit "
                            "(docker run --gpus all) so that the host's driver is mounted",
                          doctor_exit::no_driver);
      }
      return make_check("devices", "GPU devices", check_status::fail,
                        name + ": the driver supports CUDA " + cuda_version_string(driver) +
                          ", this program needs CUDA " + cuda_version_string(runtime),
                        "upgrade the NVIDIA driver to " + need +
                          ", or (data-center GPUs) install the CUDA forward-compatibility package "
                          "cuda-compat-" +
                          std::to_string(runtime / 1000) + "-" +
                          std::to_string((runtime % 1000) / 10) +
                          " and put its lib directory first on LD_LIBRARY_PATH",
                        doctor_exit::driver_too_old);
    case cudaErrorNoDevice:
      if (visible != nullptr) {
        return make_check(
          "devices", "GPU devices", check_status::fail,
          name + ": CUDA_VISIBLE_DEVICES=\"" + visible + "\" leaves no device visible",
          "unset CUDA_VISIBLE_DEVICES, or list ordinals or UUIDs that exist "
          "(nvidia-smi -L)",
          doctor_exit::no_device);
      }
      return make_check("devices", "GPU devices", check_status::fail,
                        name + ": the driver is loaded but sees no GPU",
                        "check nvidia-smi; in a container pass the GPUs (docker run --gpus all); "
                        "on a VM check the GPU passthrough",
                        doctor_exit::no_device);
    case cudaErrorStubLibrary:
      return make_check("devices", "GPU devices", check_status::fail,
                        name + ": the toolkit's libcuda.so stub was loaded instead of the driver",
                        "remove the CUDA toolkit's lib64/stubs directory from LD_LIBRARY_PATH "
                        "(it exists for linking only)",
                        doctor_exit::driver_error);
    case cudaErrorSystemDriverMismatch:
      return make_check("devices", "GPU devices", check_status::fail,
                        name +
                          ": the kernel module and the user-space driver have different "
                          "versions (the driver was upgraded without a reboot)",
                        "reboot, or unload and reload the nvidia kernel modules",
                        doctor_exit::driver_error);
    case cudaErrorCompatNotSupportedOnDevice:
      return make_check(
        "devices", "GPU devices", check_status::fail,
        name + ": the forward-compatibility package does not support this GPU",
        "remove the cuda-compat directory from LD_LIBRARY_PATH and upgrade the driver "
        "to " +
          need,
        doctor_exit::driver_too_old);
    case cudaErrorDevicesUnavailable:
      return make_check(
        "devices", "GPU devices", check_status::fail,
        name + ": every device is busy or in exclusive-process mode",
        "see which processes hold the GPUs (nvidia-smi); set the compute mode back with "
        "nvidia-smi -c DEFAULT",
        doctor_exit::driver_error);
    case cudaErrorSystemNotReady:
      return make_check(
        "devices", "GPU devices", check_status::fail,
        name +
          ": the system is not ready (NVSwitch systems: the fabric manager is "
          "not running)",
        "systemctl start nvidia-fabricmanager (its version must match the driver's)",
        doctor_exit::driver_error);
    default:
      return make_check("devices", "GPU devices", check_status::fail, name,
                        "run nvidia-smi and read dmesg for NVRM or Xid messages",
                        doctor_exit::driver_error);
  }
}

inline bool env_set(doctor_options const& o, char const* name, std::string& value)
{
  char const* v = o.getenv ? o.getenv(name) : nullptr;
  if (v == nullptr) return false;
  value = v;
  return true;
}

}  // namespace detail

template <class Runtime>
doctor_report run_doctor(Runtime& rt, doctor_options const& o)
{
  using detail::make_check;
  doctor_report r;
  r.simulated  = Runtime::is_simulated;
  auto& checks = r.checks;
  auto errname = [](cudaError_t e) {
    return std::string{Runtime::error_name(e)} + " (" + Runtime::error_string(e) + ")";
  };
  std::string visible;
  bool const has_visible = detail::env_set(o, "CUDA_VISIBLE_DEVICES", visible);

  // ---- driver and runtime versions --------------------------------------------------------------
  int driver = 0, runtime = 0;
  cudaError_t const de = rt.driver_version(driver);
  (void)rt.runtime_version(runtime);
  r.driver_version       = driver;
  r.runtime_version      = runtime;
  std::string const need = std::string{"R"} + minimum_driver_branch(runtime) + " or newer";
  if (de != cudaSuccess) {
    checks.push_back(make_check("driver", "NVIDIA driver", check_status::fail,
                                "cannot read the driver version: " + errname(de),
                                "run nvidia-smi; reinstall the NVIDIA driver (" + need + ")",
                                doctor_exit::driver_error));
  } else if (driver == 0) {
    checks.push_back(make_check(
      "driver", "NVIDIA driver", check_status::fail,
      "no NVIDIA driver is installed (libcuda.so.1 was not found: the driver's CUDA version reads "
      "0); this program was built with CUDA runtime " +
        cuda_version_string(runtime),
      "install the NVIDIA driver (" + need + " for CUDA " + cuda_version_string(runtime) +
        "); in a container, run it with the NVIDIA Container Toolkit (docker run --gpus all)",
      doctor_exit::no_driver));
  } else if (driver / 1000 < runtime / 1000) {
    checks.push_back(make_check(
      "driver", "NVIDIA driver", check_status::fail,
      "the driver supports CUDA " + cuda_version_string(driver) +
        ", this program was built with CUDA " + cuda_version_string(runtime) +
        ": \"CUDA driver version is insufficient for CUDA runtime version\"",
      "upgrade the NVIDIA driver to " + need + ", or (data-center GPUs) install cuda-compat-" +
        std::to_string(runtime / 1000) + "-" + std::to_string((runtime % 1000) / 10) +
        " and put its lib directory first on LD_LIBRARY_PATH, or build with CUDA " +
        cuda_version_string(driver) + " or older",
      doctor_exit::driver_too_old));
  } else if (driver < runtime) {
    checks.push_back(make_check(
      "driver", "NVIDIA driver", check_status::warn,
      "the driver supports CUDA " + cuda_version_string(driver) + ", older than the runtime's " +
        cuda_version_string(runtime) +
        ": minor-version compatibility runs it, but PTX built by the newer toolkit cannot be JIT "
        "compiled and newer APIs return cudaErrorCallRequiresNewerDriver",
      "upgrade the driver to one that supports CUDA " + cuda_version_string(runtime)));
  } else {
    checks.push_back(make_check("driver", "NVIDIA driver", check_status::ok,
                                std::string{Runtime::is_simulated ? "simulated driver" : "driver"} +
                                  " supports CUDA " + cuda_version_string(driver) +
                                  "; runtime CUDA " + cuda_version_string(runtime)));
  }

  // ---- devices ----------------------------------------------------------------------------------
  int count            = 0;
  cudaError_t const ce = rt.device_count(count);
  if (ce != cudaSuccess) {
    checks.push_back(detail::device_count_failure<Runtime>(
      ce, driver, runtime, has_visible ? visible.c_str() : nullptr));
  } else if (count == 0) {
    checks.push_back(detail::device_count_failure<Runtime>(
      cudaErrorNoDevice, driver, runtime, has_visible ? visible.c_str() : nullptr));
  } else {
    checks.push_back(
      make_check("devices", "GPU devices", check_status::ok,
                 std::to_string(count) + (count == 1 ? " device" : " devices") +
                   (has_visible ? " (CUDA_VISIBLE_DEVICES=\"" + visible + "\")" : "")));
  }
  bool const have_devices = ce == cudaSuccess && count > 0;

  int original       = 0;
  bool const restore = have_devices && rt.get_device(original) == cudaSuccess;
  bool usable        = false;                              // some device could be made current
  std::vector<std::pair<int, std::string>> pci_addresses;  // device, domain:bus:device.0
  for (int d = 0; have_devices && d < count; ++d) {
    std::string const sd = std::to_string(d);
    device_properties p;
    cudaError_t const pe = rt.get_device_properties(p, d);
    if (pe != cudaSuccess) {
      checks.push_back(make_check("device." + sd, "device " + sd, check_status::fail,
                                  "cannot read its properties: " + errname(pe),
                                  "run nvidia-smi -q -i " + sd + "; reset the GPU or reboot",
                                  doctor_exit::device_unusable));
      continue;
    }
    char pci[32];
    std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", p.pci_domain_id, p.pci_bus_id,
                  p.pci_device_id);
    pci_addresses.emplace_back(d, pci);
    checks.push_back(make_check(
      "device." + sd, "device " + sd, check_status::ok,
      p.name + ", compute capability " + std::to_string(p.major) + "." + std::to_string(p.minor) +
        ", " + std::to_string(p.total_memory >> 20) + " MiB, " +
        std::to_string(p.multiprocessor_count) + " SMs, " + std::to_string(p.async_engine_count) +
        " copy engines, PCI " + pci + (p.simulated ? " (simulated)" : "")));

    // Architectures.
    std::string const cc = std::to_string(p.major) + "." + std::to_string(p.minor);
    if (o.built_architectures.empty()) {
      checks.push_back(make_check("arch." + sd, "kernel architectures", check_status::skip,
                                  "not told which architectures the kernels were built for"));
    } else {
      std::string how;
      int const fit          = detail::arch_fit(o.built_architectures, p.major, p.minor, how);
      std::string const want = std::to_string(p.major) + std::to_string(p.minor);
      if (fit == 2) {
        checks.push_back(make_check("arch." + sd, "kernel architectures", check_status::ok,
                                    "built for \"" + o.built_architectures + "\": native code " +
                                      how + " runs on compute capability " + cc));
      } else if (fit == 1) {
        checks.push_back(make_check(
          "arch." + sd, "kernel architectures", check_status::warn,
          "built for \"" + o.built_architectures + "\": no native code for compute capability " +
            cc + "; the driver JIT-compiles " + how +
            " PTX at first launch (slow start, maybe slower kernels)",
          "add " + want + " to CMAKE_CUDA_ARCHITECTURES (-DCMAKE_CUDA_ARCHITECTURES=\"" +
            o.built_architectures + ";" + want + "\")"));
      } else if (fit == 0) {
        checks.push_back(make_check(
          "arch." + sd, "kernel architectures", check_status::fail,
          "built for \"" + o.built_architectures + "\": nothing runs on compute capability " + cc +
            " (kernel launches fail with \"no kernel image is available for execution on the "
            "device\")",
          "rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + want + " (or add " + want + " to the list)",
          doctor_exit::arch_mismatch));
      } else {
        checks.push_back(make_check(
          "arch." + sd, "kernel architectures", check_status::skip,
          "built for \"" + o.built_architectures + "\" (" + how + "): decided at build time"));
      }
    }

    // Memory.
    std::size_t free = 0, total = 0;
    cudaError_t me = rt.set_device(d);
    if (me == cudaSuccess) me = rt.mem_get_info(free, total);
    if (me != cudaSuccess) {
      checks.push_back(make_check("memory." + sd, "device memory", check_status::fail,
                                  "cannot use the device: " + errname(me),
                                  "see which processes hold it (nvidia-smi), its compute mode "
                                  "(nvidia-smi -q -d COMPUTE), and dmesg for Xid errors",
                                  doctor_exit::device_unusable));
    } else {
      usable = true;
      std::string const detail_mem =
        std::to_string(free >> 20) + " MiB free of " + std::to_string(total >> 20) + " MiB";
      if (total > 0 && free < total / 10) {
        checks.push_back(
          make_check("memory." + sd, "device memory", check_status::warn,
                     detail_mem + ": other processes hold most of it",
                     "nvidia-smi --query-compute-apps=pid,used_memory --format=csv"));
      } else {
        checks.push_back(make_check("memory." + sd, "device memory", check_status::ok, detail_mem));
      }
    }

    // Features gpukit's allocator uses.
    std::string missing;
    if (!p.virtual_memory_management) missing += "virtual memory management (cuMem*)";
    if (!p.memory_pools)
      missing += std::string{missing.empty() ? "" : " and "} + "memory pools (cudaMallocAsync)";
    if (missing.empty()) {
      checks.push_back(make_check("features." + sd, "allocator features", check_status::ok,
                                  "virtual memory management and memory pools supported"));
    } else {
      checks.push_back(make_check(
        "features." + sd, "allocator features", check_status::warn, "not supported: " + missing,
        "gpukit's caching allocator falls back to cudaMalloc/cudaFree segments (cudaFree "
        "synchronizes the device); on a VM or MIG slice check that the hypervisor exposes them"));
    }

    // ECC.
    if (p.ecc_enabled) {
      checks.push_back(
        make_check("ecc." + sd, "ECC", check_status::ok, "enabled on device memory"));
    } else {
      checks.push_back(make_check(
        "ecc." + sd, "ECC", check_status::warn,
        "disabled (or not supported by this GPU): bit flips in device memory go unnoticed and "
        "corrupt results silently",
        "data-center GPUs: nvidia-smi -i " + sd +
          " -e 1 as root, then reset the GPU (nvidia-smi "
          "-r -i " +
          sd + ") or reboot; consumer GPUs have no ECC"));
    }
  }

  // ---- pinned memory and a copy round trip (current device: the first usable one) --------------
  if (!usable) {
    checks.push_back(
      make_check("pinned", "pinned host memory", check_status::skip, "no usable device"));
    checks.push_back(make_check("copy", "copy round trip", check_status::skip, "no usable device"));
  } else {
    int first_usable = 0;
    (void)rt.get_device(first_usable);
    for (int d = 0; d < count; ++d) {
      if (rt.set_device(d) == cudaSuccess) {
        std::size_t f = 0, t = 0;
        if (rt.mem_get_info(f, t) == cudaSuccess) {
          first_usable = d;
          break;
        }
      }
    }
    constexpr std::size_t small = 1 << 20;
    void* pinned_in             = nullptr;
    void* pinned_out            = nullptr;
    cudaError_t pe              = rt.host_alloc(&pinned_in, small, host_alloc_flags::none);
    if (pe == cudaSuccess) pe = rt.host_alloc(&pinned_out, small, host_alloc_flags::none);
    if (pe != cudaSuccess) {
      checks.push_back(make_check("pinned", "pinned host memory", check_status::fail,
                                  "cudaHostAlloc of 1 MiB failed: " + errname(pe),
                                  "raise the locked-memory limit (ulimit -l unlimited; in Docker "
                                  "--ulimit memlock=-1), or free host memory",
                                  doctor_exit::device_unusable));
    } else {
      checks.push_back(make_check("pinned", "pinned host memory", check_status::ok,
                                  "cudaHostAlloc of 1 MiB works"));
    }
    typename Runtime::stream_type s{};
    void* dev = nullptr;
    std::string failed;
    if (pe == cudaSuccess) {
      auto* in = static_cast<unsigned char*>(pinned_in);
      for (std::size_t i = 0; i < small; ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
      std::memset(pinned_out, 0, small);
      cudaError_t e = rt.stream_create(s);
      if (e != cudaSuccess) failed = "stream_create: " + errname(e);
      if (failed.empty() && (e = rt.malloc(&dev, small)) != cudaSuccess)
        failed = "malloc: " + errname(e);
      if (failed.empty() && (e = rt.memcpy_async(dev, pinned_in, small, memcpy_kind::host_to_device,
                                                 s)) != cudaSuccess) {
        failed = "copy to the device: " + errname(e);
      }
      if (failed.empty() && (e = rt.memcpy_async(pinned_out, dev, small,
                                                 memcpy_kind::device_to_host, s)) != cudaSuccess) {
        failed = "copy from the device: " + errname(e);
      }
      if (failed.empty() && (e = rt.stream_synchronize(s)) != cudaSuccess)
        failed = "synchronize: " + errname(e);
      if (failed.empty() && std::memcmp(pinned_in, pinned_out, small) != 0) {
        failed = "the bytes that came back differ from those sent";
      }
      if (!failed.empty()) {
        checks.push_back(
          make_check("copy", "copy round trip", check_status::fail,
                     "1 MiB host -> device " + std::to_string(first_usable) + " -> host: " + failed,
                     "look for ECC errors and retired pages (nvidia-smi -q -d "
                     "ECC,PAGE_RETIREMENT) and Xid messages in dmesg; reset the GPU "
                     "(nvidia-smi -r) or reboot",
                     doctor_exit::device_unusable));
      }
    } else {
      failed = "no pinned memory";
      checks.push_back(
        make_check("copy", "copy round trip", check_status::skip, "no pinned memory"));
    }

    // Bandwidth probe: pinned vs pageable host to device.
    if (failed.empty()) {
      std::string detail_copy =
        "1 MiB host -> device " + std::to_string(first_usable) + " -> host intact";
      check_status st = check_status::ok;
      std::string fix;
      if (o.probe_bytes > 0) {
        void* big_dev    = nullptr;
        void* big_pinned = nullptr;
        std::vector<unsigned char> pageable;
        auto gbps = [&](void const* src) {
          double best = 0.0;
          for (int rep = 0; rep < 3; ++rep) {
            auto const t0 = std::chrono::steady_clock::now();
            if (rt.memcpy_async(big_dev, src, o.probe_bytes, memcpy_kind::host_to_device, s) !=
                  cudaSuccess ||
                rt.stream_synchronize(s) != cudaSuccess) {
              return -1.0;
            }
            double const sec =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (sec > 0) best = std::max(best, static_cast<double>(o.probe_bytes) / sec / 1e9);
          }
          return best;
        };
        if (rt.malloc(&big_dev, o.probe_bytes) == cudaSuccess &&
            rt.host_alloc(&big_pinned, o.probe_bytes, host_alloc_flags::none) == cudaSuccess) {
          std::memset(big_pinned, 1, o.probe_bytes);
          pageable.assign(o.probe_bytes, 1);
          double const pinned_bw   = gbps(big_pinned);
          double const pageable_bw = gbps(pageable.data());
          char buf[160];
          std::snprintf(buf, sizeof buf,
                        "; host -> device, %zu MiB: pinned %.1f GB/s, pageable %.1f GB/s",
                        o.probe_bytes >> 20, pinned_bw, pageable_bw);
          detail_copy += buf;
          if (!Runtime::is_simulated && pinned_bw >= 0 && pinned_bw < 5.0) {
            st = check_status::warn;
            fix =
              "the host link is slow: check its width and generation (nvidia-smi -q -d PCIE); a "
              "GPU in a narrow or downgraded slot copies at a fraction of its speed";
          }
        } else {
          detail_copy += "; bandwidth probe skipped (no room for " +
                         std::to_string(o.probe_bytes >> 20) + " MiB)";
        }
        if (big_dev != nullptr) (void)rt.free(big_dev);
        if (big_pinned != nullptr) (void)rt.host_free(big_pinned);
      }
      checks.push_back(make_check("copy", "copy round trip", st, detail_copy, fix));
    }
    if (dev != nullptr) (void)rt.free(dev);
    if (s != typename Runtime::stream_type{}) (void)rt.stream_destroy(s);
    if (pinned_in != nullptr) (void)rt.host_free(pinned_in);
    if (pinned_out != nullptr) (void)rt.host_free(pinned_out);
  }
  if (restore) (void)rt.set_device(original);

  // ---- PCIe links (after the copies: an idle link may have lowered its speed) ------------------
  for (auto const& [d, pci] : pci_addresses) {
    if (Runtime::is_simulated) {
      checks.push_back(make_check("pcie." + std::to_string(d), "PCIe link", check_status::skip,
                                  "simulated GPU: no PCIe link"));
    } else {
      checks.push_back(detail::pcie_check(std::to_string(d), pci, o.pci_sysfs_root));
    }
  }

  // ---- device files -----------------------------------------------------------------------------
  if (Runtime::is_simulated) {
    checks.push_back(make_check("device_files", "device files", check_status::skip,
                                "simulated GPU: no device files"));
  } else {
    std::vector<std::string> files{o.device_files_root + "/nvidiactl",
                                   o.device_files_root + "/nvidia-uvm"};
    for (int d = 0; d < std::max(count, 1); ++d)
      files.push_back(o.device_files_root + "/nvidia" + std::to_string(d));
    std::string absent, denied;
    for (auto const& f : files) {
      if (::access(f.c_str(), F_OK) != 0) {
        absent += (absent.empty() ? "" : ", ") + f;
      } else if (::access(f.c_str(), R_OK | W_OK) != 0) {
        denied += (denied.empty() ? "" : ", ") + f;
      }
    }
    if (!denied.empty()) {
      checks.push_back(
        make_check("device_files", "device files", check_status::fail,
                   "not readable and writable by this user: " + denied,
                   "add the user to the group that owns them (often video), or in a "
                   "container let the runtime pass the devices (docker run --gpus all)",
                   doctor_exit::driver_error));
    } else if (!absent.empty()) {
      bool const device_ok = have_devices && usable;
      checks.push_back(make_check(
        "device_files", "device files", device_ok ? check_status::ok : check_status::warn,
        "missing: " + absent,
        device_ok ? std::string{}
                  : std::string{"load the kernel modules (sudo modprobe nvidia nvidia-uvm, or "
                                "nvidia-modprobe -u -c=0); in a container pass the devices (docker "
                                "run --gpus all)"}));
    } else {
      checks.push_back(
        make_check("device_files", "device files", check_status::ok,
                   "present and accessible: " + std::to_string(files.size()) + " files"));
    }
  }

  // ---- NVTX -------------------------------------------------------------------------------------
  std::string tool;
  if (!detail::env_set(o, "NVTX_INJECTION64_PATH", tool) || tool.empty()) {
    checks.push_back(
      make_check("nvtx", "NVTX tool", check_status::ok,
                 "no tool attached: NVTX ranges cost about 2 ns and record nothing"));
  } else if (::access(tool.c_str(), R_OK) != 0) {
    checks.push_back(
      make_check("nvtx", "NVTX tool", check_status::warn,
                 "NVTX_INJECTION64_PATH=" + tool +
                   " does not exist: NVTX cannot load it, "
                   "ranges are recorded by nothing",
                 "point NVTX_INJECTION64_PATH at an existing injection library, or unset it"));
  } else {
    checks.push_back(make_check("nvtx", "NVTX tool", check_status::ok,
                                "tool attached: NVTX_INJECTION64_PATH=" + tool));
  }

  // ---- environment ------------------------------------------------------------------------------
  std::string v;
  if (has_visible) {
    checks.push_back(make_check("env.CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                                visible.empty() ? check_status::warn : check_status::ok,
                                visible.empty() ? "set but empty: hides every GPU"
                                                : "\"" + visible +
                                                    "\": only these devices are visible, "
                                                    "renumbered from 0",
                                visible.empty() ? "unset it, or list the devices to use" : ""));
  }
  if (detail::env_set(o, "CUDA_LAUNCH_BLOCKING", v)) {
    bool const on = v == "1";
    checks.push_back(make_check("env.CUDA_LAUNCH_BLOCKING", "CUDA_LAUNCH_BLOCKING",
                                on ? check_status::warn : check_status::ok,
                                on ? "1: every kernel launch waits for the kernel to finish (for "
                                     "debugging; much slower, and stream overlap is lost)"
                                   : "\"" + v + "\": launches stay asynchronous",
                                on ? "unset CUDA_LAUNCH_BLOCKING outside debugging sessions" : ""));
  }
  if (detail::env_set(o, "PYTORCH_CUDA_ALLOC_CONF", v)) {
    checks.push_back(make_check("env.PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                                check_status::ok,
                                "\"" + v +
                                  "\": configures PyTorch's allocator only; gpukit's takes "
                                  "gpukit::caching_allocator_options"));
  }
  if (detail::env_set(o, "CUDA_DEVICE_ORDER", v)) {
    checks.push_back(
      make_check("env.CUDA_DEVICE_ORDER", "CUDA_DEVICE_ORDER", check_status::ok,
                 "\"" + v + "\"" + (v == "PCI_BUS_ID" ? ": ordinals match nvidia-smi" : "")));
  } else if (have_devices && count > 1 && !Runtime::is_simulated) {
    checks.push_back(
      make_check("env.CUDA_DEVICE_ORDER", "CUDA_DEVICE_ORDER", check_status::warn,
                 "unset: CUDA numbers devices fastest first, which may differ from "
                 "nvidia-smi's order",
                 "export CUDA_DEVICE_ORDER=PCI_BUS_ID so that ordinals match nvidia-smi"));
  }
  if (detail::env_set(o, "CUDA_MODULE_LOADING", v)) {
    bool const eager = v == "EAGER";
    checks.push_back(make_check("env.CUDA_MODULE_LOADING", "CUDA_MODULE_LOADING",
                                eager ? check_status::warn : check_status::ok,
                                "\"" + v + "\"" +
                                  (eager ? ": every kernel is loaded at start (slower "
                                           "start, more device memory)"
                                         : ""),
                                eager ? "unset it (LAZY is the default)" : ""));
  }
  if (detail::env_set(o, "CUDA_CACHE_DISABLE", v) && v == "1") {
    checks.push_back(make_check("env.CUDA_CACHE_DISABLE", "CUDA_CACHE_DISABLE", check_status::warn,
                                "1: PTX is JIT-compiled again on every run",
                                "unset CUDA_CACHE_DISABLE"));
  }
  if (detail::env_set(o, "LD_LIBRARY_PATH", v) && v.find("stubs") != std::string::npos) {
    checks.push_back(
      make_check("env.LD_LIBRARY_PATH", "LD_LIBRARY_PATH", check_status::warn,
                 "contains a stubs directory: a libcuda.so stub there hides the driver "
                 "(cudaErrorStubLibrary)",
                 "remove the CUDA toolkit's lib64/stubs from LD_LIBRARY_PATH"));
  }
  if (Runtime::is_simulated) {
    std::string devs, cap;
    bool const a = detail::env_set(o, "GPUKIT_SIM_DEVICES", devs);
    bool const b = detail::env_set(o, "GPUKIT_SIM_CAPACITY", cap);
    if (a || b) {
      checks.push_back(make_check("env.GPUKIT_SIM", "simulated GPU configuration", check_status::ok,
                                  "GPUKIT_SIM_DEVICES=" + (a ? devs : std::string{"(unset)"}) +
                                    ", GPUKIT_SIM_CAPACITY=" + (b ? cap : std::string{"(unset)"})));
    }
  }
  return r;
}

}  // namespace gpukit
