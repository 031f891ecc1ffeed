// SPDX-License-Identifier: Apache-2.0
// tests/support/holders.hpp: RAII holders of a stream, device memory and pinned host memory, over
// any Runtime. They free what they hold also when an assertion fails mid-test; their destructors
// ignore errors (a test that cares checks the runtime's calls itself).
//
//   gpukit::test::stream_holder<Runtime> s{rt};            // a stream of the current device
//   gpukit::test::device_buffer<Runtime> dev{rt, bytes};   // rt.malloc'ed, freed at scope exit
//   rt.memcpy_async(dev.p, host, bytes, gpukit::memcpy_kind::host_to_device, s);
//
// A stream_holder converts to its stream, so it passes wherever a stream_type does.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cstddef>
#include <optional>

namespace gpukit::test {

/// A stream created on `device` (default: the current device), destroyed at scope exit.
template <class Runtime>
struct stream_holder {
  using stream_type = typename Runtime::stream_type;

  Runtime& rt;
  stream_type s{};

  explicit stream_holder(Runtime& r, int device = -1) : rt{r}
  {
    std::optional<device_guard<Runtime>> on;
    if (device >= 0) { on.emplace(rt, device); }
    GPUKIT_CUDA_TRY(rt.stream_create(s));
  }
  ~stream_holder() { (void)rt.stream_destroy(s); }
  stream_holder(stream_holder const&)            = delete;
  stream_holder& operator=(stream_holder const&) = delete;
  stream_holder(stream_holder&&)                 = delete;
  stream_holder& operator=(stream_holder&&)      = delete;

  operator stream_type() const noexcept { return s; }  // NOLINT: passes as the stream it holds
};

/// `bytes` of device memory (Runtime::malloc) on `device` (default: the current device).
template <class Runtime>
struct device_buffer {
  Runtime& rt;
  void* p{nullptr};
  int device;

  device_buffer(Runtime& r, std::size_t bytes, int on_device = -1) : rt{r}, device{on_device}
  {
    std::optional<device_guard<Runtime>> on;
    if (device >= 0) { on.emplace(rt, device); }
    GPUKIT_CUDA_TRY(rt.malloc(&p, bytes));
  }
  ~device_buffer()
  {
    std::optional<device_guard<Runtime>> on;
    if (device >= 0) { on.emplace(rt, device); }
    (void)rt.free(p);
  }
  device_buffer(device_buffer const&)            = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  device_buffer(device_buffer&&)                 = delete;
  device_buffer& operator=(device_buffer&&)      = delete;
};

/// `bytes` of pinned host memory (Runtime::host_alloc with `flags`), freed at scope exit.
template <class Runtime>
struct pinned_host_memory {
  Runtime& rt;
  void* p{nullptr};

  pinned_host_memory(Runtime& r, std::size_t bytes, unsigned flags = 0) : rt{r}
  {
    GPUKIT_CUDA_TRY(rt.host_alloc(&p, bytes, flags));
  }
  ~pinned_host_memory() { (void)rt.host_free(p); }
  pinned_host_memory(pinned_host_memory const&)            = delete;
  pinned_host_memory& operator=(pinned_host_memory const&) = delete;
  pinned_host_memory(pinned_host_memory&&)                 = delete;
  pinned_host_memory& operator=(pinned_host_memory&&)      = delete;
};

}  // namespace gpukit::test
