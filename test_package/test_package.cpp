// SPDX-License-Identifier: Apache-2.0
// The Conan package's test: gpukit's headers from the package, the caching allocator over the
// simulated GPU (no GPU needed), and the version the recipe says.
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>
#include <gpukit/version.hpp>

#include <cstdio>
#include <cstring>

int main()
{
  if (std::strcmp(gpukit::version_string, GPUKIT_EXPECTED_VERSION_STRING) != 0) {
    std::printf("gpukit headers say %s, the package %s\n", gpukit::version_string,
                GPUKIT_EXPECTED_VERSION_STRING);
    return 1;
  }
  gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
  gpukit::basic_caching_allocator<gpukit::sim_runtime> alloc{sim, 0};
  std::size_t const bytes = std::size_t{8} << 20;
  void* p                 = alloc.allocate_async(bytes, {});
  alloc.deallocate_async(p, bytes, {});
  void* q = alloc.allocate_async(bytes, {});  // the cached block again
  alloc.deallocate_async(q, bytes, {});
  if (p != q) {
    std::printf("the caching allocator did not reuse its block\n");
    return 1;
  }
  std::printf("gpukit %s from the Conan package: ok\n", gpukit::version_string);
  return 0;
}
