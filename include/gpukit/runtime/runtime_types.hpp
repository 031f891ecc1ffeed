// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/runtime_types.hpp: the vocabulary types of the Runtime contract, owned by gpukit
// (no platform header needed): copy directions, pinned-memory flags, host functions, device
// properties.
//
// Quick start:
//
//   #include <gpukit/runtime/runtime_types.hpp>
//
//   auto const kind      = gpukit::memcpy_kind::host_to_device;
//   unsigned const flags = gpukit::host_alloc_flags::portable | gpukit::host_alloc_flags::mapped;
//
// Each runtime maps these to its platform's values (cuda_runtime: cudaMemcpyKind, cudaHostAlloc*).
#pragma once

#include <cstddef>
#include <string>

namespace gpukit {

/// Direction of a copy.
enum class memcpy_kind : int {
  host_to_host     = 0,
  host_to_device   = 1,
  device_to_host   = 2,
  device_to_device = 3,
  infer            = 4,  ///< inferred from the pointers (unified addressing)
};

/// Flags of `host_alloc` (a bit set; the values are CUDA's, which cuda_runtime checks).
struct host_alloc_flags {
  static constexpr unsigned none           = 0x0;
  static constexpr unsigned portable       = 0x1;  ///< pinned for every device
  static constexpr unsigned mapped         = 0x2;  ///< device-addressable
  static constexpr unsigned write_combined = 0x4;  ///< fast H2D, slow host reads
};

/// Flags of `host_register` (a bit set; the values are CUDA's, which cuda_runtime checks).
struct host_register_flags {
  static constexpr unsigned none      = 0x0;
  static constexpr unsigned portable  = 0x1;
  static constexpr unsigned mapped    = 0x2;
  static constexpr unsigned read_only = 0x8;
};

/// A host function enqueued on a stream (same signature as `cudaHostFn_t`).
using host_fn = void (*)(void*);

/// What gpukit needs to know about a device.
struct device_properties {
  std::string name;
  int ordinal{0};
  int major{0};  ///< compute capability
  int minor{0};
  std::size_t total_memory{0};
  int multiprocessor_count{0};
  int async_engine_count{0};  ///< copy engines: 2 or more copy both directions at once
  int pci_domain_id{0};       ///< PCI address domain:bus:device.0 (sysfs names the device so)
  int pci_bus_id{0};
  int pci_device_id{0};
  bool ecc_enabled{false};  ///< ECC on device memory is on (false also when the GPU lacks it)
  bool unified_addressing{false};
  bool virtual_memory_management{false};  ///< cuMem* virtual memory is supported
  bool memory_pools{false};               ///< stream-ordered allocation is supported
  bool simulated{false};
};

}  // namespace gpukit
