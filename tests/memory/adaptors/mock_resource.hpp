// SPDX-License-Identifier: Apache-2.0
// tests/memory/adaptors/mock_resource.hpp: an upstream that fails on demand (RMM's mock_resource
// plays this role): host memory behind gpukit's stream-ordered interface, counting its calls,
// throwing `std::bad_alloc` (or a given error) from the next allocations and a logic_error from
// the next frees when told to. No device, no runtime, no CCCL property: the least an upstream
// can be.
#pragma once

#include <gpukit/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace gpukit::test {

struct mock_resource {
  int allocations{0};    ///< calls of allocate_async that succeeded
  int deallocations{0};  ///< calls of deallocate_async that succeeded
  int fail_allocs{0};    ///< the next this many allocations throw std::bad_alloc
  int fail_frees{0};     ///< the next this many frees throw gpukit::logic_error

  [[nodiscard]] void* allocate_async(std::size_t bytes, cudaStream_t)
  {
    if (fail_allocs > 0) {
      --fail_allocs;
      throw std::bad_alloc{};
    }
    ++allocations;
    return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  }
  void deallocate_async(void* p, std::size_t, cudaStream_t)
  {
    if (fail_frees > 0) {
      --fail_frees;
      throw logic_error{"gpukit: mock_resource: refused a free"};
    }
    ++deallocations;
    std::free(p);
  }
  friend bool operator==(mock_resource const& a, mock_resource const& b) noexcept
  {
    return &a == &b;
  }
  friend bool operator!=(mock_resource const& a, mock_resource const& b) noexcept
  {
    return &a != &b;
  }
};

}  // namespace gpukit::test
