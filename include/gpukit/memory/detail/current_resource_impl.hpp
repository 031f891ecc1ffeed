// SPDX-License-Identifier: Apache-2.0
// Bodies of gpukit/memory/current_resource.hpp. Not public API.
#pragma once

#include <gpukit/error_macros.hpp>

namespace gpukit {

namespace detail {

template <class Runtime>
current_resource_slot<Runtime>& current_resource_slot_of(int& device)
{
  constexpr int max_devices = 64;  // as default_caching_allocator
  static std::atomic<current_resource_slot<Runtime>*> cache[max_devices]{};  // this copy's view
  if (device < 0) { GPUKIT_CUDA_TRY(Runtime::instance().get_device(device)); }
  GPUKIT_EXPECTS(device < max_devices,
                 "current device resource: device " + std::to_string(device) + " is out of range");
  if (auto* s = cache[device].load(std::memory_order_acquire)) { return *s; }
  // The registry of default allocators keeps one object per key and device for the whole process.
  std::string const key = std::string{"gpukit-0.1-current-resource:"} + typeid(Runtime).name();
  auto* s               = static_cast<current_resource_slot<Runtime>*>(default_allocator_registry(
                  key.c_str(), device, [](int) -> void* { return new current_resource_slot<Runtime>{}; }));
  cache[device].store(s, std::memory_order_release);
  return *s;
}

}  // namespace detail

template <class Runtime>
basic_caching_allocator<Runtime>& get_current_device_resource(int device)
{
  auto& slot = detail::current_resource_slot_of<Runtime>(device);
  if (auto* a = slot.current.load(std::memory_order_acquire)) { return *a; }
  return default_caching_allocator<Runtime>(device);
}

template <class Runtime>
basic_caching_allocator<Runtime>* set_current_device_resource(
  int device, basic_caching_allocator<Runtime>* resource)
{
  GPUKIT_EXPECTS(device >= 0, "set_current_device_resource: device " + std::to_string(device) +
                                " is not a device ordinal");
  GPUKIT_EXPECTS(resource == nullptr || resource->device() == device,
                 "set_current_device_resource: the allocator serves device " +
                   std::to_string(resource == nullptr ? -1 : resource->device()) + ", not device " +
                   std::to_string(device));
  auto& slot = detail::current_resource_slot_of<Runtime>(device);
  std::lock_guard<std::mutex> lock{slot.mutex};
  auto* previous = slot.current.exchange(resource, std::memory_order_acq_rel);
  return previous != nullptr ? previous : &default_caching_allocator<Runtime>(device);
}

template <class Runtime>
basic_caching_allocator<Runtime>& reset_current_device_resource(
  int device, caching_allocator_options const& options)
{
  GPUKIT_EXPECTS(device >= 0, "reset_current_device_resource: device " + std::to_string(device) +
                                " is not a device ordinal");
  auto& slot = detail::current_resource_slot_of<Runtime>(device);
  auto made =
    std::make_unique<basic_caching_allocator<Runtime>>(Runtime::instance(), device, options);
  basic_caching_allocator<Runtime>* const fresh = made.get();
  basic_caching_allocator<Runtime>* previous    = nullptr;
  {
    std::lock_guard<std::mutex> lock{slot.mutex};
    slot.owned.push_back(std::move(made));
    previous            = slot.current.exchange(fresh, std::memory_order_acq_rel);
    bool owned_previous = false;
    for (auto const& o : slot.owned) { owned_previous = owned_previous || o.get() == previous; }
    if (!owned_previous) { previous = nullptr; }  // the caller's, or the default: left alone
  }
  if (previous != nullptr) { (void)previous->release(); }
  return *fresh;
}

}  // namespace gpukit
