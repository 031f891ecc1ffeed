// SPDX-License-Identifier: Apache-2.0
// gpukit::run_doctor on the simulated GPU: each diagnosis, produced by injected faults, a wrapper
// that reports another driver version, or an injected environment.
#include <gpukit/doctor/doctor.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

namespace {

using gpukit::check_status;
using gpukit::doctor_exit;
using gpukit::sim_op;
using gpukit::sim_runtime;

gpukit::sim_config one_device()
{
  return gpukit::sim_config{}.with_devices(1, std::size_t{8} << 30);
}

// A sim_runtime that reports another driver version (0: no driver), and may claim to be real
// hardware so that the device-file check runs.
template <bool Simulated>
class driver_override : public gpukit::detail::cuda_error_vocabulary {
 public:
  using stream_type                  = sim_runtime::stream_type;
  using event_type                   = sim_runtime::event_type;
  static constexpr bool is_simulated = Simulated;

  /// runtime 0: the simulated runtime's version.
  driver_override(sim_runtime& sim, int driver, int runtime = 0)
      : sim_{sim}, driver_{driver}, runtime_{runtime}
  {}
  static char const* error_name(cudaError_t e) noexcept { return sim_runtime::error_name(e); }
  static char const* error_string(cudaError_t e) noexcept { return sim_runtime::error_string(e); }
  cudaError_t driver_version(int& v)
  {
    v = driver_;
    return cudaSuccess;
  }
  cudaError_t runtime_version(int& v)
  {
    if (runtime_ == 0) return sim_.runtime_version(v);
    v = runtime_;
    return cudaSuccess;
  }
  cudaError_t device_count(int& n) { return sim_.device_count(n); }
  cudaError_t get_device(int& d) { return sim_.get_device(d); }
  cudaError_t set_device(int d) { return sim_.set_device(d); }
  cudaError_t get_device_properties(gpukit::device_properties& p, int d)
  {
    return sim_.get_device_properties(p, d);
  }
  cudaError_t mem_get_info(std::size_t& f, std::size_t& t) { return sim_.mem_get_info(f, t); }
  cudaError_t malloc(void** p, std::size_t b) { return sim_.malloc(p, b); }
  cudaError_t free(void* p) { return sim_.free(p); }
  cudaError_t host_alloc(void** p, std::size_t b, unsigned f) { return sim_.host_alloc(p, b, f); }
  cudaError_t host_free(void* p) { return sim_.host_free(p); }
  cudaError_t stream_create(stream_type& s) { return sim_.stream_create(s); }
  cudaError_t stream_destroy(stream_type s) { return sim_.stream_destroy(s); }
  cudaError_t stream_synchronize(stream_type s) { return sim_.stream_synchronize(s); }
  cudaError_t memcpy_async(void* d, void const* s, std::size_t b, gpukit::memcpy_kind k,
                           stream_type st)
  {
    return sim_.memcpy_async(d, s, b, k, st);
  }

 private:
  sim_runtime& sim_;
  int driver_;
  int runtime_;
};

struct fake_env {
  std::map<std::string, std::string> vars;
  gpukit::doctor_options options(std::string archs = "90")
  {
    gpukit::doctor_options o;
    o.built_architectures = std::move(archs);
    o.probe_bytes         = std::size_t{4} << 20;
    o.getenv              = [this](char const* n) -> char const* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
    return o;
  }
};

check_status status(gpukit::doctor_report const& r, char const* id)
{
  auto const* c = r.find(id);
  REQUIRE_MESSAGE(c != nullptr, id);
  return c->status;
}

bool contains(std::string const& s, char const* what) { return s.find(what) != std::string::npos; }

// The doctor where the runtime cannot count devices for want of a driver: none at all (`driver`
// 0), or one of an older CUDA version than the runtime's.
gpukit::doctor_report run_with_insufficient_driver(int driver)
{
  sim_runtime sim{one_device()};
  sim.inject_fault(sim_op::device_count, 1, cudaErrorInsufficientDriver);
  driver_override<true> rt{sim, driver};
  fake_env env;
  return gpukit::run_doctor(rt, env.options());
}

}  // namespace

TEST_SUITE("doctor")
{
  TEST_CASE("a healthy simulated GPU passes every check and says it is simulated")
  {
    sim_runtime sim{one_device()};
    fake_env env;
    auto const r = gpukit::run_doctor(sim, env.options());
    CHECK(r.simulated);
    CHECK(r.exit_code() == doctor_exit::ok);
    CHECK(r.verdict() == check_status::ok);
    for (char const* id : {"driver", "devices", "device.0", "arch.0", "memory.0", "features.0",
                           "ecc.0", "pinned", "copy"}) {
      CHECK(status(r, id) == check_status::ok);
    }
    CHECK(contains(r.find("device.0")->detail, "compute capability 9.0"));
    CHECK(status(r, "pcie.0") == check_status::skip);  // a simulated GPU has no link
    CHECK(contains(r.find("device.0")->detail, "PCI 0000:00:00.0"));
    CHECK(contains(r.find("copy")->detail, "pinned"));
    CHECK(status(r, "device_files") == check_status::skip);
    CHECK(status(r, "nvtx") == check_status::ok);
    auto const text = r.to_text();
    CHECK(contains(text, "SIMULATED GPU"));
    CHECK(contains(text, "verdict: ok (exit 0)"));
    auto const json = r.to_json();
    CHECK(json.rfind("{\"simulated\":true,\"driver_version\":13000,\"runtime_version\":13000,"
                     "\"verdict\":\"ok\",\"exit_code\":0,\"checks\":[{\"id\":\"driver\"",
                     0) == 0);
    CHECK(sim.used_bytes(0) == 0);  // the doctor freed what it allocated
  }

  TEST_CASE("no driver at all: the driver version reads 0 and the doctor says so")
  {
    auto const r = run_with_insufficient_driver(0);
    CHECK(r.exit_code() == doctor_exit::no_driver);
    auto const* d = r.find("driver");
    REQUIRE(d != nullptr);
    CHECK(d->status == check_status::fail);
    CHECK(contains(d->detail, "no NVIDIA driver is installed"));
    CHECK_FALSE(contains(d->detail, "too old"));
    CHECK(contains(d->fix, "R580"));
    CHECK(contains(d->fix, "--gpus all"));
    auto const* dev = r.find("devices");
    CHECK(dev->exit_code == doctor_exit::no_driver);
    CHECK(contains(dev->detail, "cudaErrorInsufficientDriver"));
    CHECK(status(r, "pinned") == check_status::skip);
    CHECK(r.find("device.0") == nullptr);
  }

  TEST_CASE("a driver too old for the runtime: insufficient driver and the upgrade to make")
  {
    auto const r = run_with_insufficient_driver(12040);
    CHECK(r.exit_code() == doctor_exit::driver_too_old);
    auto const* d = r.find("driver");
    CHECK(d->status == check_status::fail);
    CHECK(contains(d->detail, "CUDA driver version is insufficient for CUDA runtime version"));
    CHECK(contains(d->detail, "12.4"));
    CHECK(contains(d->fix, "R580 or newer"));
    CHECK(contains(d->fix, "cuda-compat-13-0"));
    CHECK(r.find("devices")->exit_code == doctor_exit::driver_too_old);
  }

  TEST_CASE("an older driver of the same major version is a warning (minor-version compatibility)")
  {
    sim_runtime sim{one_device()};
    fake_env env;
    driver_override<true> newer{sim, 12040, 12080};
    auto const r = gpukit::run_doctor(newer, env.options());
    CHECK(status(r, "driver") == check_status::warn);
    CHECK(contains(r.find("driver")->detail, "minor-version compatibility"));
    CHECK(contains(r.find("driver")->fix, "12.8"));
    CHECK(r.exit_code() == doctor_exit::ok);
    driver_override<true> same{sim, 13000};
    CHECK(status(gpukit::run_doctor(same, env.options()), "driver") == check_status::ok);
    driver_override<true> older_major{sim, 12090};
    CHECK(status(gpukit::run_doctor(older_major, env.options()), "driver") == check_status::fail);
  }

  TEST_CASE("no device: the fix names CUDA_VISIBLE_DEVICES when it hides them")
  {
    sim_runtime sim{one_device()};
    fake_env env;
    env.vars["CUDA_VISIBLE_DEVICES"] = "7";
    sim.inject_fault(sim_op::device_count, 1, cudaErrorNoDevice);
    auto const r = gpukit::run_doctor(sim, env.options());
    CHECK(r.exit_code() == doctor_exit::no_device);
    CHECK(contains(r.find("devices")->detail, "CUDA_VISIBLE_DEVICES=\"7\""));
    CHECK(contains(r.find("devices")->fix, "nvidia-smi -L"));
    CHECK(status(r, "env.CUDA_VISIBLE_DEVICES") == check_status::ok);

    fake_env plain;
    sim.inject_fault(sim_op::device_count, 1, cudaErrorNoDevice);
    auto const r2 = gpukit::run_doctor(sim, plain.options());
    CHECK(r2.exit_code() == doctor_exit::no_device);
    CHECK(contains(r2.find("devices")->fix, "--gpus all"));
  }

  TEST_CASE("driver and system errors each get their own diagnosis")
  {
    struct expected {
      cudaError_t error;
      char const* fix;
      int code;
    };
    for (auto const& e :
         {expected{cudaErrorStubLibrary, "stubs", doctor_exit::driver_error},
          expected{cudaErrorSystemDriverMismatch, "reboot", doctor_exit::driver_error},
          expected{cudaErrorSystemNotReady, "fabricmanager", doctor_exit::driver_error},
          expected{cudaErrorDevicesUnavailable, "nvidia-smi -c DEFAULT", doctor_exit::driver_error},
          expected{cudaErrorCompatNotSupportedOnDevice, "cuda-compat", doctor_exit::driver_too_old},
          expected{cudaErrorUnknown, "dmesg", doctor_exit::driver_error}}) {
      sim_runtime sim{one_device()};
      sim.inject_fault(sim_op::device_count, 1, e.error);
      fake_env env;
      auto const r = gpukit::run_doctor(sim, env.options());
      INFO(sim_runtime::error_name(e.error));
      CHECK(r.exit_code() == e.code);
      CHECK(contains(r.find("devices")->fix, e.fix));
      CHECK(contains(r.find("devices")->detail, sim_runtime::error_name(e.error)));
    }
  }

  TEST_CASE("kernel architectures: none that runs fails and PTX alone warns (JIT)")
  {
    sim_runtime sim{one_device()};  // compute capability 9.0
    fake_env env;
    struct expected {
      char const* archs;
      check_status status;
    };
    for (auto const& e :
         {expected{"90", check_status::ok}, expected{"80;90-real", check_status::ok},
          expected{"90a-real", check_status::ok}, expected{"80", check_status::warn},
          expected{"75-virtual", check_status::warn}, expected{"80-real", check_status::fail},
          expected{"100", check_status::fail}, expected{"90a-virtual;80-real", check_status::warn},
          expected{"100a;86-real", check_status::fail}, expected{"all", check_status::skip}}) {
      INFO(std::string{e.archs});
      auto const r = gpukit::run_doctor(sim, env.options(e.archs));
      CHECK(status(r, "arch.0") == e.status);
      if (e.status == check_status::fail) {
        CHECK(r.exit_code() == doctor_exit::arch_mismatch);
        CHECK(contains(r.find("arch.0")->fix, "-DCMAKE_CUDA_ARCHITECTURES=90"));
        CHECK(contains(r.find("arch.0")->detail, "no kernel image is available"));
      }
    }
    auto const none = gpukit::run_doctor(sim, env.options(""));
    CHECK(status(none, "arch.0") == check_status::skip);
  }

  TEST_CASE("architecture lists: entries that are not architectures are named, never thrown")
  {
    for (char const* good : {"", "90", "80;90-real", "90a-real", "100f-virtual", "all", "all-major",
                             "native", "10", "999", "52, 90;;"}) {
      INFO(std::string{good});
      CHECK(gpukit::architectures_error(good).empty());
    }
    struct bad_list {
      char const* list;
      char const* entry;
    };
    for (auto const& b :
         {bad_list{"2147483648", "2147483648"}, bad_list{"90;2147483648", "2147483648"},
          bad_list{"99999999999999999999", "99999999999999999999"}, bad_list{"9", "9"},
          bad_list{"1000", "1000"}, bad_list{"90;sm_90", "sm_90"}, bad_list{"-real", "-real"},
          bad_list{"90b", "90b"}, bad_list{"a", "a"}}) {
      INFO(std::string{b.list});
      std::string const e = gpukit::architectures_error(b.list);
      CHECK(contains(e, ("\"" + std::string{b.entry} + "\" is not a CUDA architecture").c_str()));
      CHECK(contains(e, "a number from 10 to 999"));
    }
    // run_doctor passes over such entries and checks the others.
    sim_runtime sim{one_device()};  // compute capability 9.0
    fake_env env;
    gpukit::doctor_report r;
    REQUIRE_NOTHROW(r = gpukit::run_doctor(sim, env.options("90;2147483648")));
    CHECK(status(r, "arch.0") == check_status::ok);
    REQUIRE_NOTHROW(r = gpukit::run_doctor(sim, env.options("99999999999999999999")));
    CHECK(status(r, "arch.0") == check_status::fail);
  }

  TEST_CASE("a device that cannot be used: its memory info or pinned memory or copies fail")
  {
    fake_env env;
    {
      sim_runtime sim{one_device()};
      sim.inject_fault(sim_op::mem_get_info, 1, cudaErrorDevicesUnavailable);
      sim.inject_fault(sim_op::mem_get_info, 2, cudaErrorDevicesUnavailable);
      auto const r = gpukit::run_doctor(sim, env.options());
      CHECK(status(r, "memory.0") == check_status::fail);
      CHECK(r.exit_code() == doctor_exit::device_unusable);
      CHECK(status(r, "copy") == check_status::skip);
    }
    {  // the copies run on the first device that passed its memory check, not on one that failed
      sim_runtime sim{gpukit::sim_config{}.with_devices(2, std::size_t{8} << 30)};
      sim.inject_fault(sim_op::mem_get_info, 1, cudaErrorDevicesUnavailable);
      auto const r = gpukit::run_doctor(sim, env.options());
      CHECK(status(r, "memory.0") == check_status::fail);
      CHECK(status(r, "memory.1") == check_status::ok);
      CHECK(status(r, "copy") == check_status::ok);
      CHECK(contains(r.find("copy")->detail, "host -> device 1 -> host intact"));
    }
    {
      sim_runtime sim{one_device()};
      sim.inject_fault(sim_op::host_alloc, 1, cudaErrorMemoryAllocation);
      auto const r = gpukit::run_doctor(sim, env.options());
      CHECK(status(r, "pinned") == check_status::fail);
      CHECK(contains(r.find("pinned")->fix, "memlock"));
      CHECK(r.exit_code() == doctor_exit::device_unusable);
    }
    {
      sim_runtime sim{one_device()};
      sim.inject_fault(sim_op::memcpy_async, 2, cudaErrorIllegalAddress);
      auto const r = gpukit::run_doctor(sim, env.options());
      CHECK(status(r, "copy") == check_status::fail);
      CHECK(contains(r.find("copy")->detail, "copy from the device"));
      CHECK(contains(r.find("copy")->fix, "ECC"));
      CHECK(r.exit_code() == doctor_exit::device_unusable);
      CHECK(sim.used_bytes(0) == 0);
    }
  }

  TEST_CASE("little free memory is a warning naming nvidia-smi")
  {
    sim_runtime sim{one_device()};
    void* hog = nullptr;
    REQUIRE(sim.malloc(&hog, (std::size_t{8} << 30) - (std::size_t{100} << 20)) == cudaSuccess);
    fake_env env;
    auto const r = gpukit::run_doctor(sim, env.options());
    CHECK(status(r, "memory.0") == check_status::warn);
    CHECK(contains(r.find("memory.0")->fix, "--query-compute-apps"));
    CHECK(r.exit_code() == doctor_exit::ok);
    REQUIRE(sim.free(hog) == cudaSuccess);
  }

  TEST_CASE("environment variables that matter are reported with their effect")
  {
    sim_runtime sim{one_device()};
    fake_env env;
    env.vars["CUDA_LAUNCH_BLOCKING"]    = "1";
    env.vars["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True";
    env.vars["CUDA_MODULE_LOADING"]     = "EAGER";
    env.vars["CUDA_CACHE_DISABLE"]      = "1";
    env.vars["LD_LIBRARY_PATH"]         = "/usr/local/cuda/lib64/stubs";
    env.vars["NVTX_INJECTION64_PATH"]   = "/nonexistent/libtool.so";
    env.vars["CUDA_VISIBLE_DEVICES"]    = "";
    auto const r                        = gpukit::run_doctor(sim, env.options());
    for (char const* id :
         {"env.CUDA_LAUNCH_BLOCKING", "env.CUDA_MODULE_LOADING", "env.CUDA_CACHE_DISABLE",
          "env.LD_LIBRARY_PATH", "nvtx", "env.CUDA_VISIBLE_DEVICES"}) {
      CHECK(status(r, id) == check_status::warn);
    }
    CHECK(contains(r.find("env.CUDA_LAUNCH_BLOCKING")->fix, "unset"));
    CHECK(status(r, "env.PYTORCH_CUDA_ALLOC_CONF") == check_status::ok);
    CHECK(r.verdict() == check_status::warn);
    CHECK(r.exit_code() == doctor_exit::ok);
    CHECK(contains(r.to_text(), "verdict: ok, with warnings (exit 0)"));

    fake_env attached;
    attached.vars["NVTX_INJECTION64_PATH"] = "/proc/self/exe";  // any readable file
    CHECK(
      contains(gpukit::run_doctor(sim, attached.options()).find("nvtx")->detail, "tool attached"));
  }

  TEST_CASE("device files: missing ones warn only when the device is unusable and denied ones fail")
  {
    sim_runtime sim{one_device()};
    driver_override<false> rt{sim, 13000};
    char dir_template[] = "/tmp/gpukit_doctor_devXXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    std::string const dir = dir_template;
    fake_env env;
    auto o              = env.options();
    o.device_files_root = dir;
    auto const missing  = gpukit::run_doctor(rt, o);
    CHECK(status(missing, "device_files") == check_status::ok);  // the device works anyway
    CHECK(contains(missing.find("device_files")->detail, "missing"));
    for (char const* f : {"/nvidiactl", "/nvidia-uvm", "/nvidia0"}) std::ofstream{dir + f} << "";
    CHECK(status(gpukit::run_doctor(rt, o), "device_files") == check_status::ok);
    if (::geteuid() != 0) {  // root reads everything
      ::chmod((dir + "/nvidia0").c_str(), 0);
      auto const denied = gpukit::run_doctor(rt, o);
      CHECK(status(denied, "device_files") == check_status::fail);
      CHECK(denied.exit_code() == doctor_exit::driver_error);
    }
    for (char const* f : {"/nvidiactl", "/nvidia-uvm", "/nvidia0"}) ::unlink((dir + f).c_str());
    ::rmdir(dir.c_str());
  }

  TEST_CASE("ECC disabled is a warning with the command that enables it")
  {
    sim_runtime sim{gpukit::sim_config{}.with_devices(2, std::size_t{8} << 30).with_ecc(false)};
    fake_env env;
    auto const r = gpukit::run_doctor(sim, env.options());
    CHECK(status(r, "ecc.0") == check_status::warn);
    CHECK(status(r, "ecc.1") == check_status::warn);
    CHECK(contains(r.find("ecc.1")->detail, "disabled"));
    CHECK(contains(r.find("ecc.1")->fix, "nvidia-smi -i 1 -e 1"));
    CHECK(r.verdict() == check_status::warn);
    CHECK(r.exit_code() == doctor_exit::ok);  // a warning, not a failure
    gpukit::device_properties p;
    GPUKIT_CUDA_TRY(sim.get_device_properties(p, 1));
    CHECK_FALSE(p.ecc_enabled);
    sim_runtime with_ecc{one_device()};
    GPUKIT_CUDA_TRY(with_ecc.get_device_properties(p, 0));
    CHECK(p.ecc_enabled);
  }

  TEST_CASE("PCIe link: at its maximum or narrower or slower and unknown without sysfs")
  {
    sim_runtime sim{one_device()};
    driver_override<false> rt{sim, 13000};  // "real hardware": the link is read
    char dir_template[] = "/tmp/gpukit_doctor_pciXXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    std::string const root = dir_template;
    std::string const dev  = root + "/0000:00:00.0";  // the simulated device 0's address
    fake_env env;
    auto o           = env.options();
    o.pci_sysfs_root = root;
    auto write_link  = [&](char const* cur_speed, char const* cur_width, char const* max_speed,
                          char const* max_width) {
      std::ofstream{dev + "/current_link_speed"} << cur_speed << "\n";
      std::ofstream{dev + "/current_link_width"} << cur_width << "\n";
      std::ofstream{dev + "/max_link_speed"} << max_speed << "\n";
      std::ofstream{dev + "/max_link_width"} << max_width << "\n";
    };

    auto const absent = gpukit::run_doctor(rt, o);  // no directory for the device
    CHECK(status(absent, "pcie.0") == check_status::skip);
    CHECK(contains(absent.find("pcie.0")->detail, "unknown"));
    CHECK(contains(absent.find("pcie.0")->detail, "0000:00:00.0/current_link_speed"));

    REQUIRE(::mkdir(dev.c_str(), 0755) == 0);
    write_link("32.0 GT/s PCIe", "16", "32.0 GT/s PCIe", "16");
    auto const full = gpukit::run_doctor(rt, o);
    CHECK(status(full, "pcie.0") == check_status::ok);
    CHECK(contains(full.find("pcie.0")->detail, "Gen5 x16"));
    CHECK(contains(full.find("pcie.0")->detail, "its maximum"));

    write_link("32.0 GT/s PCIe", "8", "32.0 GT/s PCIe", "16");  // an x8 slot
    auto const narrow = gpukit::run_doctor(rt, o);
    CHECK(status(narrow, "pcie.0") == check_status::warn);
    CHECK(contains(narrow.find("pcie.0")->detail, "Gen5 x8"));
    CHECK(contains(narrow.find("pcie.0")->detail, "narrower than its maximum Gen5 x16"));
    CHECK(contains(narrow.find("pcie.0")->detail, "50%"));
    CHECK(contains(narrow.find("pcie.0")->fix, "x16"));
    CHECK(narrow.exit_code() == doctor_exit::ok);

    write_link("8.0 GT/s PCIe", "16", "16.0 GT/s PCIe", "16");  // a Gen3 riser on a Gen4 GPU
    auto const slow = gpukit::run_doctor(rt, o);
    CHECK(status(slow, "pcie.0") == check_status::warn);
    CHECK(contains(slow.find("pcie.0")->detail, "Gen3 x16"));
    CHECK(contains(slow.find("pcie.0")->detail, "slower than its maximum Gen4 x16"));
    CHECK(contains(slow.find("pcie.0")->fix, "idle"));

    write_link("Unknown", "16", "32.0 GT/s PCIe", "16");  // what sysfs says of a link it lost
    auto const unknown = gpukit::run_doctor(rt, o);
    CHECK(status(unknown, "pcie.0") == check_status::skip);
    CHECK(contains(unknown.find("pcie.0")->detail, "current_link_speed"));

    for (char const* f :
         {"/current_link_speed", "/current_link_width", "/max_link_speed", "/max_link_width"}) {
      ::unlink((dev + f).c_str());
    }
    ::rmdir(dev.c_str());
    ::rmdir(root.c_str());
    CHECK(gpukit::detail::pcie_generation(2.5) == 1);
    CHECK(gpukit::detail::pcie_generation(5.0) == 2);
    CHECK(gpukit::detail::pcie_generation(64.0) == 6);
    CHECK(gpukit::detail::pcie_generation(0.0) == 0);
  }

  TEST_CASE("version helpers")
  {
    CHECK(gpukit::cuda_version_string(13000) == "13.0");
    CHECK(gpukit::cuda_version_string(12040) == "12.4");
    CHECK(std::string{gpukit::minimum_driver_branch(13000)} == "580");
    CHECK(std::string{gpukit::minimum_driver_branch(12080)} == "525");
    CHECK(std::string{gpukit::minimum_driver_branch(9000)}.empty());
  }
}
