// SPDX-License-Identifier: Apache-2.0
// gpukit/doctor/detail/copy_checks.hpp: the [pinned] and [copy] checks: pinned host memory, a
// round trip host -> device -> host, and the host-to-device bandwidth from pinned and pageable
// memory. Not public API.
#pragma once

#include <gpukit/doctor/detail/report.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gpukit::detail {

/// The buffers and stream of the copy checks, released (in the order they were made, last first)
/// when it goes out of scope or release() is called.
template <class Runtime>
class copy_buffers {
 public:
  static constexpr std::size_t bytes = std::size_t{1} << 20;  ///< of each buffer

  explicit copy_buffers(Runtime& rt) noexcept : rt_{rt} {}
  ~copy_buffers() { release(); }
  copy_buffers(copy_buffers const&)            = delete;
  copy_buffers& operator=(copy_buffers const&) = delete;
  copy_buffers(copy_buffers&&)                 = delete;
  copy_buffers& operator=(copy_buffers&&)      = delete;

  void release() noexcept
  {
    if (device != nullptr) (void)rt_.free(device);
    if (stream != typename Runtime::stream_type{}) (void)rt_.stream_destroy(stream);
    if (host_in != nullptr) (void)rt_.host_free(host_in);
    if (host_out != nullptr) (void)rt_.host_free(host_out);
    device = host_in = host_out = nullptr;
    stream                      = typename Runtime::stream_type{};
  }

  void* host_in{nullptr};   ///< pinned, what is sent
  void* host_out{nullptr};  ///< pinned, what comes back
  void* device{nullptr};
  typename Runtime::stream_type stream{};

 private:
  Runtime& rt_;
};

/// [pinned]: allocates the pinned buffers of `b` on `device` (the first usable one; -1: none).
template <class Runtime>
doctor_check check_pinned(Runtime& rt, int device, copy_buffers<Runtime>& b)
{
  std::string const id = "pinned", title = "pinned host memory";
  if (device < 0) return make_check(id, title, check_status::skip, "no usable device");
  (void)rt.set_device(device);
  typename Runtime::error_type e = rt.host_alloc(&b.host_in, b.bytes, host_alloc_flags::none);
  if (e == Runtime::success) e = rt.host_alloc(&b.host_out, b.bytes, host_alloc_flags::none);
  if (e != Runtime::success) {
    return make_check(id, title, check_status::fail,
                      "cudaHostAlloc of 1 MiB failed: " + error_text<Runtime>(e),
                      "raise the locked-memory limit (ulimit -l unlimited; in Docker --ulimit "
                      "memlock=-1), or free host memory",
                      doctor_exit::device_unusable);
  }
  return make_check(id, title, check_status::ok, "cudaHostAlloc of 1 MiB works");
}

/// Sends a pattern host -> device -> host through `b`: empty when the same bytes came back, else
/// the step that failed.
template <class Runtime>
std::string copy_round_trip(Runtime& rt, copy_buffers<Runtime>& b)
{
  auto* in = static_cast<unsigned char*>(b.host_in);
  for (std::size_t i = 0; i < b.bytes; ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
  std::memset(b.host_out, 0, b.bytes);
  typename Runtime::error_type e{};
  if ((e = rt.stream_create(b.stream)) != Runtime::success) {
    return "stream_create: " + error_text<Runtime>(e);
  }
  if ((e = rt.malloc(&b.device, b.bytes)) != Runtime::success) {
    return "malloc: " + error_text<Runtime>(e);
  }
  if ((e = rt.memcpy_async(b.device, b.host_in, b.bytes, memcpy_kind::host_to_device, b.stream)) !=
      Runtime::success) {
    return "copy to the device: " + error_text<Runtime>(e);
  }
  if ((e = rt.memcpy_async(b.host_out, b.device, b.bytes, memcpy_kind::device_to_host, b.stream)) !=
      Runtime::success) {
    return "copy from the device: " + error_text<Runtime>(e);
  }
  if ((e = rt.stream_synchronize(b.stream)) != Runtime::success) {
    return "synchronize: " + error_text<Runtime>(e);
  }
  if (std::memcmp(b.host_in, b.host_out, b.bytes) != 0) {
    return "the bytes that came back differ from those sent";
  }
  return {};
}

/// The best of three host-to-device copies of `bytes` from `src` in GB/s; -1 when a copy fails.
template <class Runtime>
double host_to_device_gbps(Runtime& rt, void* dst, void const* src, std::size_t bytes,
                           typename Runtime::stream_type s)
{
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    auto const t0 = std::chrono::steady_clock::now();
    if (rt.memcpy_async(dst, src, bytes, memcpy_kind::host_to_device, s) != Runtime::success ||
        rt.stream_synchronize(s) != Runtime::success) {
      return -1.0;
    }
    double const sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sec > 0) best = std::max(best, static_cast<double>(bytes) / sec / 1e9);
  }
  return best;
}

/// What the bandwidth probe found: text for the [copy] check's detail, and whether the host link
/// is too slow for a real GPU.
struct bandwidth_found {
  std::string detail;
  bool slow{false};
};

/// Pinned and pageable host-to-device bandwidth with buffers of `bytes` (0: no probe).
template <class Runtime>
bandwidth_found probe_bandwidth(Runtime& rt, std::size_t bytes, typename Runtime::stream_type s)
{
  bandwidth_found found;
  if (bytes == 0) return found;
  void* device = nullptr;
  void* pinned = nullptr;
  if (rt.malloc(&device, bytes) == Runtime::success &&
      rt.host_alloc(&pinned, bytes, host_alloc_flags::none) == Runtime::success) {
    std::memset(pinned, 1, bytes);
    std::vector<unsigned char> const pageable(bytes, 1);
    double const pinned_bw   = host_to_device_gbps(rt, device, pinned, bytes, s);
    double const pageable_bw = host_to_device_gbps(rt, device, pageable.data(), bytes, s);
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "; host -> device, %zu MiB: pinned %.1f GB/s, pageable %.1f GB/s", bytes >> 20,
                  pinned_bw, pageable_bw);
    found.detail = buf;
    found.slow   = !Runtime::is_simulated && pinned_bw >= 0 && pinned_bw < 5.0;
  } else {
    found.detail =
      "; bandwidth probe skipped (no room for " + std::to_string(bytes >> 20) + " MiB)";
  }
  if (device != nullptr) (void)rt.free(device);
  if (pinned != nullptr) (void)rt.host_free(pinned);
  return found;
}

/// [copy]: a round trip through the pinned buffers of `b` on `device` (-1: no usable device), then
/// the bandwidth probe.
template <class Runtime>
doctor_check check_copy(Runtime& rt, doctor_options const& o, int device, copy_buffers<Runtime>& b)
{
  std::string const id = "copy", title = "copy round trip";
  if (device < 0) return make_check(id, title, check_status::skip, "no usable device");
  if (b.host_in == nullptr || b.host_out == nullptr) {
    return make_check(id, title, check_status::skip, "no pinned memory");
  }
  std::string const trip   = "1 MiB host -> device " + std::to_string(device) + " -> host";
  std::string const failed = copy_round_trip(rt, b);
  if (!failed.empty()) {
    return make_check(id, title, check_status::fail, trip + ": " + failed,
                      "look for ECC errors and retired pages (nvidia-smi -q -d "
                      "ECC,PAGE_RETIREMENT) and Xid messages in dmesg; reset the GPU "
                      "(nvidia-smi -r) or reboot",
                      doctor_exit::device_unusable);
  }
  bandwidth_found const bw = probe_bandwidth(rt, o.probe_bytes, b.stream);
  if (bw.slow) {
    return make_check(id, title, check_status::warn, trip + " intact" + bw.detail,
                      "the host link is slow: check its width and generation (nvidia-smi -q -d "
                      "PCIE); a GPU in a narrow or downgraded slot copies at a fraction of its "
                      "speed");
  }
  return make_check(id, title, check_status::ok, trip + " intact" + bw.detail);
}

}  // namespace gpukit::detail
