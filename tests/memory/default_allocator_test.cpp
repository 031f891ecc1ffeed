// SPDX-License-Identifier: Apache-2.0
// The process-wide default allocator is one per device and process, also across shared libraries
// that each include gpukit (hidden visibility, loaded with RTLD_LOCAL).
#include "support/files.hpp"

#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <string>
#include <thread>
#include <vector>

using gpukit::test::built_file;

TEST_SUITE("caching_allocator")
{
  TEST_CASE("default_caching_allocator: one per device and process across shared libraries")
  {
    auto& mine = gpukit::default_caching_allocator<gpukit::sim_runtime>(0);
    CHECK(&mine == &gpukit::default_caching_allocator<gpukit::sim_runtime>());  // current device 0
    CHECK(mine.device() == 0);
    for (char const* path : {GPUKIT_TEST_LIB_A, GPUKIT_TEST_LIB_B}) {
      void* lib = dlopen(built_file(path).c_str(), RTLD_NOW | RTLD_LOCAL);
      REQUIRE_MESSAGE(lib != nullptr, dlerror());
      auto* get = reinterpret_cast<void* (*)()>(dlsym(lib, "gpukit_test_default_allocator"));
      REQUIRE(reinterpret_cast<void*>(get) != nullptr);
      CHECK(get() == static_cast<void*>(&mine));
    }
    // Concurrent first use from many threads still yields one instance (device 0 already exists;
    // the registry's lock and atomic publication are what this exercises under TSan).
    std::vector<std::thread> threads;
    std::vector<void*> seen(8);
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        seen[static_cast<std::size_t>(i)] =
          &gpukit::default_caching_allocator<gpukit::sim_runtime>(0);
      });
    }
    for (auto& t : threads) { t.join(); }
    for (void* p : seen) { CHECK(p == static_cast<void*>(&mine)); }
    CHECK_THROWS_AS(gpukit::default_caching_allocator<gpukit::sim_runtime>(64),
                    gpukit::logic_error);
  }
}
