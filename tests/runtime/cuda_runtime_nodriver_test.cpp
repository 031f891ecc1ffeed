// SPDX-License-Identifier: Apache-2.0
// cuda_runtime on a machine without a driver or a GPU (CI, this project's build machines): every
// call fails with a named error and nothing crashes. On a GPU machine the same calls work; the
// test then checks that each either works or fails cleanly.
#include <gpukit/runtime/cuda_runtime.hpp>

#include <doctest/doctest.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace {

gpukit::cuda_runtime& rt() { return gpukit::cuda_runtime::instance(); }

/// True when the machine has a usable GPU (the first call also initializes the CUDA runtime).
bool has_gpu()
{
  int n = 0;
  return rt().device_count(n) == cudaSuccess && n > 0;
}

/// A CUDA error with a real name ("cudaError...", known to cudaGetErrorName) and a description.
bool named_error(cudaError_t e)
{
  std::string const name = gpukit::cuda_runtime::error_name(e);
  std::string const text = gpukit::cuda_runtime::error_string(e);
  return e != cudaSuccess && name.rfind("cudaError", 0) == 0 && !text.empty() &&
         text.find("unrecognized") == std::string::npos;
}

/// Without a GPU: a named error. With one: success or a named error.
void check_clean(cudaError_t e, char const* call, bool gpu)
{
  INFO((std::string{call} + " returned " + gpukit::cuda_runtime::error_name(e)));
  if (gpu) {
    CHECK((e == cudaSuccess || named_error(e)));
  } else {
    CHECK(named_error(e));
  }
}

#define GPUKIT_CHECK_CLEAN(call, gpu) check_clean((call), #call, (gpu))

}  // namespace

TEST_SUITE("runtime")
{
  // First, before anything else has touched CUDA: the driver entry points are looked up from many
  // threads at once, and all see the same outcome.
  TEST_CASE("cuda_runtime without a driver: vm entry points resolve once from any thread")
  {
    constexpr int threads = 8;
    std::vector<cudaError_t> results(threads, cudaErrorUnknown);
    std::vector<std::size_t> granularities(threads, 1);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        results[static_cast<std::size_t>(t)] =
          rt().vm_granularity(granularities[static_cast<std::size_t>(t)], 0);
      });
    }
    for (auto& th : pool) { th.join(); }
    for (int t = 1; t < threads; ++t) {
      CHECK(results[static_cast<std::size_t>(t)] == results[0]);
      CHECK(granularities[static_cast<std::size_t>(t)] == granularities[0]);
    }
    auto const& api = gpukit::detail::driver_api();
    CHECK(&api == &gpukit::detail::driver_api());
    if (api.status == cudaSuccess) {
      CHECK(api.missing == nullptr);
      CHECK((api.mem_map != nullptr));
    } else {
      // The lookup failed: a named error, the symbol it stopped at, and no pointer to call.
      CHECK(named_error(api.status));
      REQUIRE(api.missing != nullptr);
      MESSAGE((std::string{"driver API unavailable: "} +
               gpukit::cuda_runtime::error_name(api.status) + " looking up " + api.missing));
      CHECK((api.mem_create == nullptr));
      CHECK((api.mem_map == nullptr));
      CHECK(results[0] == api.status);  // vm_* report the lookup's error
      CHECK(granularities[0] == 0);
    }
  }

  TEST_CASE("cuda_runtime without a driver: every call fails cleanly")
  {
    bool const gpu = has_gpu();
    MESSAGE(std::string{gpu ? "a GPU is present: checking calls work or fail cleanly"
                            : "no GPU: checking every call fails with a named error"});
    auto& r = rt();

    int n = -1;
    GPUKIT_CHECK_CLEAN(r.device_count(n), gpu);
    CHECK(n >= 0);
    if (!gpu) { CHECK(n == 0); }
    int d = -1;
    GPUKIT_CHECK_CLEAN(r.get_device(d), gpu);
    GPUKIT_CHECK_CLEAN(r.set_device(0), gpu);
    gpukit::device_properties p{};
    GPUKIT_CHECK_CLEAN(r.get_device_properties(p, 0), gpu);
    std::size_t free_bytes = 0;
    std::size_t total      = 0;
    GPUKIT_CHECK_CLEAN(r.mem_get_info(free_bytes, total), gpu);
    GPUKIT_CHECK_CLEAN(r.device_synchronize(), gpu);

    // Versions work everywhere: the runtime's is built in; the driver's is 0 without a driver.
    int v = -1;
    CHECK(r.runtime_version(v) == cudaSuccess);
    CHECK(v == CUDART_VERSION);
    v = -1;
    CHECK(r.driver_version(v) == cudaSuccess);
    if (gpu) {
      CHECK(v > 0);
    } else {
      CHECK(v >= 0);
    }

    void* dev = nullptr;
    GPUKIT_CHECK_CLEAN(r.malloc(&dev, 1 << 20), gpu);
    GPUKIT_CHECK_CLEAN(r.free(dev), gpu);

    cudaStream_t s{};
    GPUKIT_CHECK_CLEAN(r.stream_create(s), gpu);
    cudaEvent_t e{};
    GPUKIT_CHECK_CLEAN(r.event_create(e, true), gpu);

    void* async_block = nullptr;
    GPUKIT_CHECK_CLEAN(r.malloc_async(&async_block, 1 << 20, s), gpu);
    void* pinned = nullptr;
    GPUKIT_CHECK_CLEAN(r.host_alloc(&pinned, 1 << 20, gpukit::host_alloc_flags::none), gpu);
    std::vector<unsigned char> pageable(1 << 20, 0x11);
    GPUKIT_CHECK_CLEAN(r.host_register(pageable.data(), pageable.size(), 0), gpu);
    GPUKIT_CHECK_CLEAN(
      r.memcpy_async(pageable.data() + 8, pageable.data(), 8, gpukit::memcpy_kind::host_to_host, s),
      gpu);
    if (gpu) {
      GPUKIT_CHECK_CLEAN(r.memset_async(async_block, 0, 1 << 20, s), gpu);
      GPUKIT_CHECK_CLEAN(
        r.memcpy_async(pinned, async_block, 1 << 20, gpukit::memcpy_kind::device_to_host, s), gpu);
      GPUKIT_CHECK_CLEAN(
        r.memcpy_peer_async(async_block, 0, static_cast<char*>(async_block) + 16, 0, 16, s), gpu);
    } else {
      // Nothing was allocated; the calls still only report errors.
      GPUKIT_CHECK_CLEAN(r.memset_async(pageable.data(), 0, 16, s), gpu);
      GPUKIT_CHECK_CLEAN(r.memcpy_peer_async(pageable.data(), 0, pageable.data() + 16, 0, 16, s),
                         gpu);
    }
    GPUKIT_CHECK_CLEAN(r.launch_host_func(
                         s, [](void*) {}, nullptr),
                       gpu);
    GPUKIT_CHECK_CLEAN(r.event_record(e, s), gpu);
    GPUKIT_CHECK_CLEAN(r.stream_wait_event(s, e), gpu);
    GPUKIT_CHECK_CLEAN(r.event_synchronize(e), gpu);
    float ms = -1.0f;
    GPUKIT_CHECK_CLEAN(r.event_elapsed_time(ms, e, e), gpu);
    GPUKIT_CHECK_CLEAN(r.free_async(async_block, s), gpu);
    GPUKIT_CHECK_CLEAN(r.stream_synchronize(s), gpu);
    GPUKIT_CHECK_CLEAN(r.stream_query(s), gpu);
    GPUKIT_CHECK_CLEAN(r.event_query(e), gpu);
    GPUKIT_CHECK_CLEAN(r.host_unregister(pageable.data()), gpu);
    GPUKIT_CHECK_CLEAN(r.host_free(pinned), gpu);
    if (gpu) {  // handles from failed creations are not handles: only destroy real ones
      GPUKIT_CHECK_CLEAN(r.event_destroy(e), gpu);
      GPUKIT_CHECK_CLEAN(r.stream_destroy(s), gpu);
    }

    // Virtual memory goes through the driver API: the same sequence, errors at each step when the
    // entry points or the device are missing.
    std::size_t g = 0;
    GPUKIT_CHECK_CLEAN(r.vm_granularity(g, 0), gpu);
    std::size_t const bytes = g == 0 ? std::size_t{2} << 20 : g;
    void* va                = nullptr;
    GPUKIT_CHECK_CLEAN(r.vm_reserve(&va, bytes, 0), gpu);
    gpukit::cuda_runtime::physical_handle h{};
    GPUKIT_CHECK_CLEAN(r.vm_create(h, bytes, 0), gpu);
    if (gpu && va != nullptr && h != 0) {
      GPUKIT_CHECK_CLEAN(r.vm_map(va, bytes, h), gpu);
      GPUKIT_CHECK_CLEAN(r.vm_set_access(va, bytes, 0), gpu);
      GPUKIT_CHECK_CLEAN(r.vm_unmap(va, bytes), gpu);
    } else if (!gpu) {
      CHECK(va == nullptr);
      CHECK(h == 0);
      GPUKIT_CHECK_CLEAN(r.vm_map(va, bytes, h), gpu);
      GPUKIT_CHECK_CLEAN(r.vm_set_access(va, bytes, 0), gpu);
      GPUKIT_CHECK_CLEAN(r.vm_unmap(va, bytes), gpu);
    }
    if (!gpu || h != 0) { GPUKIT_CHECK_CLEAN(r.vm_release(h), gpu); }
    if (!gpu || va != nullptr) { GPUKIT_CHECK_CLEAN(r.vm_free(va, bytes), gpu); }
    if (!gpu) { CHECK(gpukit::detail::driver_api().status != cudaSuccess); }

    // Error names work without a driver.
    CHECK(std::string{gpukit::cuda_runtime::error_name(cudaErrorMemoryAllocation)} ==
          "cudaErrorMemoryAllocation");
    CHECK(std::string{gpukit::cuda_runtime::error_name(cudaErrorInsufficientDriver)} ==
          "cudaErrorInsufficientDriver");
  }

  TEST_CASE("cuda_runtime: gpukit's copy directions map to CUDA's")
  {
    using gpukit::memcpy_kind;
    using gpukit::detail::to_cuda_memcpy_kind;
    CHECK(to_cuda_memcpy_kind(memcpy_kind::host_to_host) == cudaMemcpyHostToHost);
    CHECK(to_cuda_memcpy_kind(memcpy_kind::host_to_device) == cudaMemcpyHostToDevice);
    CHECK(to_cuda_memcpy_kind(memcpy_kind::device_to_host) == cudaMemcpyDeviceToHost);
    CHECK(to_cuda_memcpy_kind(memcpy_kind::device_to_device) == cudaMemcpyDeviceToDevice);
    CHECK(to_cuda_memcpy_kind(memcpy_kind::infer) == cudaMemcpyDefault);
    // An unknown direction stays unknown, so CUDA reports cudaErrorInvalidMemcpyDirection.
    auto const bad = to_cuda_memcpy_kind(static_cast<memcpy_kind>(42));
    CHECK(bad != cudaMemcpyHostToHost);
    CHECK(bad != cudaMemcpyDefault);
  }

  TEST_CASE("cuda_runtime: its named error codes are CUDA's")
  {
    using rt = gpukit::cuda_runtime;
    static_assert(rt::success == cudaSuccess && rt::not_ready == cudaErrorNotReady);
    static_assert(rt::out_of_memory == cudaErrorMemoryAllocation);
    static_assert(rt::invalid_resource_handle == cudaErrorInvalidResourceHandle);
    static_assert(rt::capture_mode_relaxed == cudaStreamCaptureModeRelaxed);
    CHECK(std::string{rt::error_name(rt::out_of_memory)} == "cudaErrorMemoryAllocation");
    CHECK(std::string{gpukit::error_traits<cudaError_t>::name(rt::no_device)} ==
          "cudaErrorNoDevice");
  }

  TEST_CASE("cuda_runtime: driver errors map to their runtime names")
  {
    using gpukit::detail::to_cuda_error;
    static_assert(to_cuda_error(CUDA_SUCCESS) == cudaSuccess);
    CHECK(to_cuda_error(CUDA_ERROR_OUT_OF_MEMORY) == cudaErrorMemoryAllocation);
    CHECK(to_cuda_error(CUDA_ERROR_INVALID_VALUE) == cudaErrorInvalidValue);
    CHECK(to_cuda_error(CUDA_ERROR_NOT_SUPPORTED) == cudaErrorNotSupported);
    CHECK(to_cuda_error(CUDA_ERROR_INVALID_HANDLE) == cudaErrorInvalidResourceHandle);
    CHECK(to_cuda_error(CUDA_ERROR_NOT_INITIALIZED) == cudaErrorInitializationError);
    CHECK(to_cuda_error(CUDA_ERROR_INVALID_DEVICE) == cudaErrorInvalidDevice);
    CHECK(to_cuda_error(CUDA_ERROR_INVALID_CONTEXT) == cudaErrorDeviceUninitialized);
    CHECK(to_cuda_error(CUDA_ERROR_NO_DEVICE) == cudaErrorNoDevice);
    CHECK(to_cuda_error(CUDA_ERROR_NOT_PERMITTED) == cudaErrorNotPermitted);
    CHECK(to_cuda_error(CUDA_ERROR_ALREADY_MAPPED) == cudaErrorAlreadyMapped);
    CHECK(to_cuda_error(CUDA_ERROR_NOT_MAPPED) == cudaErrorNotMapped);
    CHECK(to_cuda_error(CUDA_ERROR_DEINITIALIZED) == cudaErrorCudartUnloading);
    CHECK(to_cuda_error(CUDA_ERROR_UNKNOWN) == cudaErrorUnknown);
    CHECK(to_cuda_error(static_cast<CUresult>(123456)) == cudaErrorUnknown);
    // Every mapped code has a real runtime name.
    for (CUresult r : {CUDA_ERROR_INVALID_VALUE,
                       CUDA_ERROR_OUT_OF_MEMORY,
                       CUDA_ERROR_NOT_INITIALIZED,
                       CUDA_ERROR_DEINITIALIZED,
                       CUDA_ERROR_STUB_LIBRARY,
                       CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
                       CUDA_ERROR_DEVICE_UNAVAILABLE,
                       CUDA_ERROR_NO_DEVICE,
                       CUDA_ERROR_INVALID_DEVICE,
                       CUDA_ERROR_INVALID_CONTEXT,
                       CUDA_ERROR_CONTEXT_IS_DESTROYED,
                       CUDA_ERROR_ALREADY_MAPPED,
                       CUDA_ERROR_NOT_MAPPED,
                       CUDA_ERROR_INVALID_HANDLE,
                       CUDA_ERROR_ILLEGAL_STATE,
                       CUDA_ERROR_NOT_FOUND,
                       CUDA_ERROR_NOT_READY,
                       CUDA_ERROR_ILLEGAL_ADDRESS,
                       CUDA_ERROR_LAUNCH_FAILED,
                       CUDA_ERROR_ECC_UNCORRECTABLE,
                       CUDA_ERROR_NOT_PERMITTED,
                       CUDA_ERROR_NOT_SUPPORTED,
                       CUDA_ERROR_SYSTEM_NOT_READY,
                       CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
                       CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
                       CUDA_ERROR_OPERATING_SYSTEM,
                       CUDA_ERROR_TIMEOUT}) {
      CAPTURE(static_cast<int>(r));
      cudaError_t const e = to_cuda_error(r);
      CHECK(e != cudaErrorUnknown);
      CHECK(named_error(e));
    }
  }
}
