// SPDX-License-Identifier: Apache-2.0
// The Runtime conformance suite on the real GPU, plus what only cuda_runtime promises (the exact
// CUDA calls and flags behind each member). Needs a GPU: without one the binary exits 77 (skipped).
#include "runtime/conformance.hpp"

#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>

// On CUDA the suite also checks that no failed call leaves its error in the last-error slot.
namespace gpukit::test {
template <>
struct conformance_traits<cuda_runtime> {
  static cudaError_t pending_error() { return ::cudaPeekAtLastError(); }
};
}  // namespace gpukit::test

namespace {

using gpukit::test::kib;
using gpukit::test::mib;

gpukit::cuda_runtime& rt() { return gpukit::cuda_runtime::instance(); }

void record_thread(void* p) { *static_cast<std::thread::id*>(p) = std::this_thread::get_id(); }

}  // namespace

TEST_SUITE("gpu")
{
  GPUKIT_RUNTIME_CONFORMANCE_CASES(gpukit::cuda_runtime::instance(), "cuda_runtime")

  TEST_CASE("cuda_runtime: one stateless instance")
  {
    CHECK(&gpukit::cuda_runtime::instance() == &gpukit::cuda_runtime::instance());
    CHECK(std::is_empty_v<gpukit::cuda_runtime>);
    CHECK_FALSE(gpukit::cuda_runtime::is_simulated);
  }

  TEST_CASE("cuda_runtime: the driver entry points resolve")
  {
    auto const& api = gpukit::detail::driver_api();
    CHECK(api.status == cudaSuccess);
    CHECK(api.missing == nullptr);
    CHECK((api.mem_create != nullptr));
    CHECK((api.mem_set_access != nullptr));
    int v = 0;
    REQUIRE(rt().driver_version(v) == cudaSuccess);
    CHECK(v >= static_cast<int>(gpukit::detail::driver_abi_version));
  }

  TEST_CASE("cuda_runtime: properties match the CUDA attributes")
  {
    REQUIRE(rt().set_device(0) == cudaSuccess);
    gpukit::device_properties p{};
    REQUIRE(rt().get_device_properties(p, 0) == cudaSuccess);
    auto attr = [](cudaDeviceAttr a) {
      int v = -1;
      REQUIRE(cudaDeviceGetAttribute(&v, a, 0) == cudaSuccess);
      return v;
    };
    CHECK(p.major == attr(cudaDevAttrComputeCapabilityMajor));
    CHECK(p.minor == attr(cudaDevAttrComputeCapabilityMinor));
    CHECK(p.multiprocessor_count == attr(cudaDevAttrMultiProcessorCount));
    CHECK(p.async_engine_count == attr(cudaDevAttrAsyncEngineCount));
    CHECK(p.pci_bus_id == attr(cudaDevAttrPciBusId));
    CHECK(p.pci_device_id == attr(cudaDevAttrPciDeviceId));
    CHECK(p.unified_addressing == (attr(cudaDevAttrUnifiedAddressing) != 0));
    CHECK(p.memory_pools == (attr(cudaDevAttrMemoryPoolsSupported) != 0));
    std::size_t free_bytes = 0;
    std::size_t total      = 0;
    REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
    CHECK(p.total_memory == total);
    CHECK_FALSE(p.simulated);
    MESSAGE("device 0: ", p.name, ", sm_", p.major, p.minor, ", ", p.total_memory >> 20, " MiB, ",
            p.async_engine_count, " copy engines, vmm ", p.virtual_memory_management);
  }

  TEST_CASE("cuda_runtime: streams are non-blocking and events time only when asked")
  {
    REQUIRE(rt().set_device(0) == cudaSuccess);
    cudaStream_t s{};
    REQUIRE(rt().stream_create(s) == cudaSuccess);
    unsigned flags = 0;
    CHECK(cudaStreamGetFlags(s, &flags) == cudaSuccess);
    CHECK(flags == cudaStreamNonBlocking);

    // Host functions run on a CUDA thread, not the caller's.
    std::thread::id ran_on{};
    REQUIRE(rt().launch_host_func(s, &record_thread, &ran_on) == cudaSuccess);
    REQUIRE(rt().stream_synchronize(s) == cudaSuccess);
    CHECK((ran_on != std::thread::id{}));
    CHECK((ran_on != std::this_thread::get_id()));
    CHECK(rt().stream_destroy(s) == cudaSuccess);

    cudaEvent_t plain{};
    cudaEvent_t timed{};
    REQUIRE(rt().event_create(plain) == cudaSuccess);
    REQUIRE(rt().event_create(timed, true) == cudaSuccess);
    REQUIRE(cudaEventRecord(plain, nullptr) == cudaSuccess);
    REQUIRE(cudaEventRecord(timed, nullptr) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(timed) == cudaSuccess);
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, timed, timed) == cudaSuccess);
    CHECK(cudaEventElapsedTime(&ms, plain, plain) == cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    CHECK(rt().event_destroy(plain) == cudaSuccess);
    CHECK(rt().event_destroy(timed) == cudaSuccess);
  }

  TEST_CASE("cuda_runtime: host flags are passed through")
  {
    REQUIRE(rt().set_device(0) == cudaSuccess);
    void* p             = nullptr;
    unsigned const want = gpukit::host_alloc_flags::mapped | gpukit::host_alloc_flags::portable;
    REQUIRE(rt().host_alloc(&p, 64 * kib, want) == cudaSuccess);
    unsigned got = 0;
    CHECK(cudaHostGetFlags(&got, p) == cudaSuccess);
    CHECK((got & want) == want);
    void* device_view = nullptr;
    CHECK(cudaHostGetDevicePointer(&device_view, p, 0) == cudaSuccess);
    CHECK(device_view != nullptr);
    CHECK(rt().host_free(p) == cudaSuccess);

    gpukit::test::pageable_buffer host{64 * kib};
    REQUIRE(rt().host_register(host.get(), host.size(), gpukit::host_register_flags::mapped) ==
            cudaSuccess);
    device_view = nullptr;
    CHECK(cudaHostGetDevicePointer(&device_view, host.get(), 0) == cudaSuccess);
    CHECK(device_view != nullptr);
    CHECK(rt().host_unregister(host.get()) == cudaSuccess);
  }

  TEST_CASE("cuda_runtime: failed calls leave no error behind")
  {
    REQUIRE(rt().set_device(0) == cudaSuccess);
    (void)cudaGetLastError();
    std::size_t free_bytes = 0;
    std::size_t total      = 0;
    REQUIRE(rt().mem_get_info(free_bytes, total) == cudaSuccess);
    void* p = nullptr;
    CHECK(rt().malloc(&p, total + (std::size_t{1} << 30)) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    int on_stack = 0;
    CHECK(rt().free(&on_stack) != cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(rt().set_device(1 << 20) == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaSuccess);
  }

  TEST_CASE("cuda_runtime: virtual memory is CUDA device memory")
  {
    REQUIRE(rt().set_device(0) == cudaSuccess);
    gpukit::device_properties p{};
    REQUIRE(rt().get_device_properties(p, 0) == cudaSuccess);
    REQUIRE(p.virtual_memory_management);

    std::size_t g = 0;
    REQUIRE(rt().vm_granularity(g, 0) == cudaSuccess);
    MESSAGE("minimum granularity: ", g, " bytes");

    // Driver errors come back under their runtime names.
    void* va = nullptr;
    CHECK(rt().vm_reserve(&va, 2 * g, 3 * g) == cudaErrorInvalidValue);  // not a power of two
    CHECK(va == nullptr);
    std::size_t bad = 0;
    CHECK(rt().vm_granularity(bad, 1 << 20) == cudaErrorInvalidDevice);  // the driver would answer
    CHECK(cudaGetLastError() == cudaSuccess);

    REQUIRE(rt().vm_reserve(&va, 2 * g, 0) == cudaSuccess);
    gpukit::cuda_runtime::physical_handle h{};
    REQUIRE(rt().vm_create(h, 2 * g, 0) == cudaSuccess);
    REQUIRE(rt().vm_map(va, 2 * g, h) == cudaSuccess);
    REQUIRE(rt().vm_set_access(va, 2 * g, 0) == cudaSuccess);

    cudaPointerAttributes attr{};
    CHECK(cudaPointerGetAttributes(&attr, va) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice);
    CHECK(attr.device == 0);

    // From another thread, which has not touched CUDA yet: the context is bound for it.
    cudaError_t from_thread = cudaErrorUnknown;
    std::thread{[&] { from_thread = rt().vm_set_access(va, 2 * g, 0); }}.join();
    CHECK(from_thread == cudaSuccess);

    // Plain synchronous CUDA calls work on it too.
    REQUIRE(cudaMemset(va, 0x3c, 2 * g) == cudaSuccess);
    unsigned char probe[16] = {};
    REQUIRE(cudaMemcpy(probe, static_cast<unsigned char*>(va) + g - 8, 16,
                       cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(gpukit::test::value_mismatch(probe, 16, 0x3c) == 16);

    CHECK(rt().vm_unmap(va, 2 * g) == cudaSuccess);
    CHECK(rt().vm_release(h) == cudaSuccess);
    CHECK(rt().vm_free(va, 2 * g) == cudaSuccess);
  }

  TEST_CASE("GPUKIT_CUDA_TRY on a simulated failure leaves CUDA's last-error slot alone")
  {
    (void)::cudaGetLastError();
    REQUIRE(::cudaSetDevice(1 << 20) == cudaErrorInvalidDevice);  // a non-sticky error, left
    REQUIRE(::cudaPeekAtLastError() == cudaErrorInvalidDevice);
    gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{1} << 30)};
    void* p = nullptr;
    CHECK_THROWS_AS(GPUKIT_CUDA_TRY(sim.malloc(&p, std::size_t{2} << 30)), gpukit::cuda_error);
    CHECK(::cudaPeekAtLastError() == cudaErrorInvalidDevice);  // still the real runtime's own
    (void)::cudaGetLastError();
  }
}
