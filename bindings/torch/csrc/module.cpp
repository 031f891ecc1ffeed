// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/csrc/module.cpp: gpukit_torch._C, the Python side of the native backend.
#include "cuda_allocator.h"

#include <gpukit/memory/testing.hpp>
#include <gpukit_torch/alloc_conf.hpp>

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

namespace gpukit_torch {
void bind_planner(pybind11::module_& m);  // planner.cpp
}

namespace {

std::shared_ptr<gpukit_torch::cuda_allocator>& installed()
{
  static auto* a = new std::shared_ptr<gpukit_torch::cuda_allocator>{};  // never destroyed
  return *a;
}

std::string& installed_conf()
{
  static auto* s = new std::string{};
  return *s;
}

// The entries of the installed settings that PyTorch's pinned-memory allocator applies.
std::string& host_settings()
{
  static auto* s = new std::string{};
  return *s;
}

// Makes gpukit PyTorch's CUDA allocator. `conf`: settings over the backend's defaults,
// PYTORCH_CUDA_ALLOC_CONF (or its aliases) and GPUKIT_ALLOC_CONF (gpukit_torch/alloc_conf.hpp;
// later ones win). Returns the settings in effect, every one of them (gpukit_torch::to_alloc_conf);
// a refused or bad key raises ValueError.
std::string install(std::string const& conf)
{
  if (installed()) {
    TORCH_CHECK(gpukit_torch::cuda_allocator::current() != nullptr,
                "gpukit: installed, but PyTorch's allocator has been changed since");
    return installed_conf();
  }
  gpukit_torch::backend_conf settings;
  std::string effective;  // every setting, as a string that parses back to them
  try {
    settings  = gpukit_torch::parse_backend_conf(conf, gpukit_torch::backend_conf_from_env());
    effective = gpukit_torch::to_alloc_conf(settings);
  } catch (gpukit::logic_error const& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  auto a = std::make_shared<gpukit_torch::cuda_allocator>(settings, effective);
  // The layout of the handles torch.multiprocessing sends is this PyTorch's.
  a->layer().set_torch_version(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR);
  // Refuses (c10::Error) once PyTorch's own allocator has served CUDA memory.
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
  installed()      = a;
  installed_conf() = effective;
  host_settings()  = settings.host_settings;
  return effective;
}

bool is_installed() { return installed() && gpukit_torch::cuda_allocator::current() != nullptr; }

gpukit_torch::cuda_allocator& current()
{
  TORCH_CHECK(is_installed(), "gpukit: not installed (call gpukit_torch.install() first)");
  return *installed();
}

// gpukit's own statistics of a device, with names of its own (stats.hpp's vocabulary).
pybind11::dict gpukit_stats(int device)
{
  auto const s = current().layer().allocator(device).stats();
  pybind11::dict d;
  auto pair = [&](char const* name, gpukit::stat_pair const& p) {
    d[(std::string{name} + "_current").c_str()] = p.current;
    d[(std::string{name} + "_peak").c_str()]    = p.peak;
  };
  pair("allocated_bytes", s.allocated_bytes);
  pair("requested_bytes", s.requested_bytes);
  pair("reserved_bytes", s.reserved_bytes);
  pair("active_bytes", s.active_bytes);
  pair("allocation_count", s.allocation_count);
  pair("segment_count", s.segment_count);
  d["num_allocs"]              = s.num_allocs;
  d["num_frees"]               = s.num_frees;
  d["num_cache_hits"]          = s.num_cache_hits;
  d["num_device_allocs"]       = s.num_device_allocs;
  d["num_device_frees"]        = s.num_device_frees;
  d["num_alloc_retries"]       = s.num_alloc_retries;
  d["num_ooms"]                = s.num_ooms;
  d["num_cross_stream_events"] = s.num_cross_stream_events;
  d["synchronizing_frees"]     = s.synchronizing_frees;
  return d;
}

// GPUKIT_TORCH_CRASH_TRACE=1: a crash (SIGSEGV, SIGBUS, SIGABRT) prints the native stack to
// stderr before the process dies, for reports from machines without a debugger.
void print_native_stack(int sig)
{
  void* frames[64];
  int const n      = ::backtrace(frames, 64);
  char const msg[] = "gpukit: fatal signal; native stack:\n";
  (void)!::write(2, msg, sizeof msg - 1);
  ::backtrace_symbols_fd(frames, n, 2);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_trace()
{
  char const* v = std::getenv("GPUKIT_TORCH_CRASH_TRACE");
  if (v == nullptr || *v == '\0' || *v == '0') { return; }
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT}) { std::signal(sig, &print_native_stack); }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
  m.doc() = "gpukit's caching allocator as PyTorch's CUDA allocator (a c10 CUDAAllocator)";
  install_crash_trace();
  m.def("install", &install, pybind11::arg("conf") = std::string{},
        "Make gpukit PyTorch's CUDA allocator (before CUDA memory is first allocated). conf: "
        "settings (gpukit's or PyTorch's keys) over PYTORCH_CUDA_ALLOC_CONF's and "
        "GPUKIT_ALLOC_CONF's. Returns every setting in effect, as a string that install() and "
        "check_conf() read back to the same settings.");
  m.def("is_installed", &is_installed, "Whether gpukit is PyTorch's CUDA allocator now");
  m.def(
    "default_conf", [] { return std::string{gpukit_torch::backend_default_conf}; },
    "The settings the backend starts from");
  m.def(
    "host_settings", [] { return host_settings(); },
    "The installed settings' entries for PyTorch's pinned-memory allocator ('' when none)");
  m.def(
    "parse_conf",
    [](std::string const& conf) {
      try {
        auto const c = gpukit_torch::parse_backend_conf(
          conf, gpukit_torch::parse_backend_conf(gpukit_torch::backend_default_conf));
        return std::string{gpukit::to_string(c.options.source)};
      } catch (gpukit::logic_error const& e) {
        TORCH_CHECK_VALUE(false, e.what());
      }
    },
    "Checks settings over the backend's defaults (ValueError naming a refused or bad key or "
    "value); returns the segment source they select");
  m.def(
    "sharing_refusal",
    [] {
      pybind11::gil_scoped_release unlocked;  // the first call forks a probe and waits for it
      return current().layer().sharing_refusal();
    },
    "Why CUDA tensors of growable memory cannot be shared with other processes here ('' when "
    "they can): pidfd_getfd refused, probed once per process");
  m.def("gpukit_stats", &gpukit_stats, pybind11::arg("device") = 0,
        "gpukit's own statistics of a device");
  m.def(
    "check_invariants",
    [](int device) {
      return gpukit::memory::testing::check_invariants(current().layer().allocator(device));
    },
    pybind11::arg("device") = 0, "The allocator's invariants ('' when they hold)");
  gpukit_torch::bind_planner(m);  // plan, simulate_schedule, simulate_ops (gpukit_torch.checkpoint)
}
