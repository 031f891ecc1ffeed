// SPDX-License-Identifier: Apache-2.0
// gpukit/memory/current_resource.hpp: one replaceable allocator per device, used by default by
// gpukit's RAII types (device_buffer, device_uvector, device_scalar).
//
// Quick start:
//
//   #include <gpukit/memory/current_resource.hpp>
//
//   void run(cudaStream_t stream)
//   {
//     gpukit::caching_allocator& mr = gpukit::get_current_device_resource();  // current device's
//     void* p = mr.allocate_async(1 << 20, stream);
//     mr.deallocate_async(p, 1 << 20, stream);
//
//     // Replace it for device 0 with an allocator of your own, then put the old one back:
//     gpukit::caching_allocator mine{gpukit::cuda_runtime::instance(), 0, {}};
//     gpukit::caching_allocator* previous = gpukit::set_current_device_resource(0, &mine);
//     // ... every RAII type built without an allocator now allocates from `mine` ...
//     gpukit::set_current_device_resource(0, previous);
//
//     // Or have gpukit build (and own) one with options:
//     gpukit::caching_allocator_options o;
//     o.limit_fraction = 0.5;
//     gpukit::reset_current_device_resource(0, o);
//   }
//
// Until it is replaced, the current resource of a device is `default_caching_allocator(device)`.
// There is one current resource per device and Runtime in the whole process (shared by the shared
// libraries that include gpukit, as the default allocator is).
//
// ## Lifetime rules
//
// - RAII objects keep a reference to the allocator they allocated from, never to "the current
//   resource": replacing it moves no existing buffer, and a buffer frees its memory to the
//   allocator that gave it.
// - An allocator passed to set_current_device_resource stays the caller's: it must outlive its
//   time as current resource, every object that allocated from it while it was, and every
//   gpukit owning stream (cuda_stream) of its device that was created before it was replaced
//   (those forget their stream in the current resource when they are destroyed).
// - An allocator built by reset_current_device_resource is owned by gpukit and never destroyed
//   (buffers may still hold its memory); when it is replaced, its free cached memory is given back
//   to the device (release()).
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

namespace gpukit {

namespace detail {

/// The current resource of one device: null until replaced (then the default allocator serves).
template <class Runtime>
struct current_resource_slot {
  std::atomic<basic_caching_allocator<Runtime>*> current{nullptr};
  std::mutex mutex;  // guards owned and serializes replacements
  std::vector<std::unique_ptr<basic_caching_allocator<Runtime>>> owned;
};

/// The process-wide slot of `device` (-1: the calling thread's current device). Never destroyed.
/// @throws gpukit::logic_error for a device out of range; gpukit::cuda_error if the current device
///         cannot be read
template <class Runtime>
current_resource_slot<Runtime>& current_resource_slot_of(int& device);

}  // namespace detail

/// The allocator RAII types use on `device` (default: the calling thread's current device of
/// `Runtime::instance()`): the one last set by set_current_device_resource or
/// reset_current_device_resource, else `default_caching_allocator<Runtime>(device)`.
/// Thread-safe; an atomic load once the device's slot exists. Does not synchronize.
/// @throws gpukit::logic_error for a device out of range; gpukit::cuda_error if the current device
///         cannot be read or the default allocator cannot be built
template <class Runtime = cuda_runtime>
[[nodiscard]] basic_caching_allocator<Runtime>& get_current_device_resource(int device = -1);

/// Makes `resource` the current resource of `device` (nullptr: the default allocator again) and
/// returns the previous one (the default allocator's address when none was set), so that
/// `set_current_device_resource(d, previous)` restores it. `resource` stays the caller's: see the
/// lifetime rules at the top of this header. Thread-safe; does not synchronize.
/// @throws gpukit::logic_error when `resource` serves another device than `device`, or for a device
///         out of range
template <class Runtime>
basic_caching_allocator<Runtime>* set_current_device_resource(
  int device, basic_caching_allocator<Runtime>* resource);

/// Builds a caching allocator over `Runtime::instance()` for `device` with `options`, owned by
/// gpukit (never destroyed), and makes it the current resource of `device`. An allocator that an
/// earlier call built and that this one replaces gives its free cached memory back (release(),
/// which synchronizes only with `segment_source::synchronous`). Returns the new allocator.
/// Thread-safe.
/// @throws gpukit::logic_error for a device out of range; gpukit::cuda_error if the allocator
///         cannot read the device's properties
template <class Runtime = cuda_runtime>
basic_caching_allocator<Runtime>& reset_current_device_resource(
  int device, caching_allocator_options const& options = {});

}  // namespace gpukit

#include <gpukit/memory/detail/current_resource_impl.hpp>
