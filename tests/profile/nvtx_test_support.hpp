// SPDX-License-Identifier: Apache-2.0
// tests/profile/nvtx_test_support.hpp: attach the test NVTX tool to this process and read what it
// recorded. Include in one translation unit per test binary.
//
//   static bool const attached = gpukit_test::attach_nvtx_tool();  // before any NVTX call
//   ...
//   auto recs = gpukit_test::nvtx_records();   // everything NVTX passed to the tool so far
//
// The tool is found at the path CMake compiled in (GPUKIT_NVTX_INJECTION_LIB), else next to the
// test binary (the h200 build carries bin/tests/ to another machine).
#pragma once

#include "nvtx_injection.h"

#include "support/files.hpp"

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpukit_test {

/// The injection library's path: the one CMake built, or the one beside this executable.
inline std::string nvtx_tool_path()
{
#ifdef GPUKIT_NVTX_INJECTION_LIB
  return gpukit::test::built_file(GPUKIT_NVTX_INJECTION_LIB);
#else
  return gpukit::test::beside_executable("libgpukit_nvtx_injection.so");
#endif
}

/// The address the tool records for `p`.
inline std::uintptr_t addr(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// Sets NVTX_INJECTION64_PATH to the test tool. Call before the process's first NVTX call (a
/// namespace-scope initializer does). Returns whether the tool was found.
inline bool attach_nvtx_tool()
{
  std::string const path = nvtx_tool_path();
  if (::access(path.c_str(), R_OK) != 0) return false;
  ::setenv("NVTX_INJECTION64_PATH", path.c_str(), 1);
  return true;
}

/// The tool's handle when NVTX has loaded it, else nullptr.
inline void* nvtx_tool_handle()
{
  return ::dlopen(nvtx_tool_path().c_str(), RTLD_NOW | RTLD_NOLOAD);
}

/// Every record so far (empty when the tool is not loaded).
inline std::vector<gpukit_nvtx_record> nvtx_records()
{
  std::vector<gpukit_nvtx_record> out;
  void* h = nvtx_tool_handle();
  if (h == nullptr) return out;
  auto count          = reinterpret_cast<gpukit_nvtx_count_fn>(::dlsym(h, "gpukit_nvtx_count"));
  auto get            = reinterpret_cast<gpukit_nvtx_get_fn>(::dlsym(h, "gpukit_nvtx_get"));
  std::size_t const n = count();
  out.resize(n);
  std::size_t got = 0;
  for (; got < n && get(got, &out[got]) != 0; ++got) {}
  out.resize(got);
  ::dlclose(h);
  return out;
}

/// Forgets every record (for a test that wants only its own).
inline void clear_nvtx_records()
{
  void* h = nvtx_tool_handle();
  if (h == nullptr) return;
  reinterpret_cast<gpukit_nvtx_clear_fn>(::dlsym(h, "gpukit_nvtx_clear"))();
  ::dlclose(h);
}

/// Checks that region record `r` is `bytes` at `p` in heap `heap`.
inline void check_region(gpukit_nvtx_record const& r, void const* p, std::size_t bytes,
                         std::uint64_t heap)
{
  CHECK(r.address == addr(p));
  CHECK(r.size == bytes);
  CHECK(r.heap == heap);
}

/// Records of one kind, in order.
inline std::vector<gpukit_nvtx_record> nvtx_records_of(int kind)
{
  std::vector<gpukit_nvtx_record> out;
  for (auto const& r : nvtx_records()) {
    if (r.kind == kind) out.push_back(r);
  }
  return out;
}

}  // namespace gpukit_test
