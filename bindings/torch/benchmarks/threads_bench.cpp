// SPDX-License-Identifier: Apache-2.0
// Threads allocating on their own streams through PyTorch's C++ allocator API
// (c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete), for threads_bench.py.
//
// Whatever allocator the process has installed answers: PyTorch's own, or gpukit's native
// backend once gpukit_torch.install() has run. The library is loaded with ctypes into a Python
// process that has imported torch and initialised CUDA; it calls no CUDA runtime function itself
// (streams come from PyTorch's stream pool), so it needs c10's headers and libraries only:
//
//   T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
//   g++ -O2 -std=c++17 -shared -fPIC threads_bench.cpp -isystem $T/include
//       -isystem $CUDA_HOME/include -L$T/lib -lc10 -lc10_cuda -Wl,-rpath,$T/lib -o threads_bench.so
//
// (one command line; threads_bench.py builds it so, with the installed torch's
// _GLIBCXX_USE_CXX11_ABI).
//
// One run: `threads` threads, each with a stream of its own from PyTorch's pool, keep a ring of
// `live` blocks; an operation frees the ring's oldest block and allocates the next size of
// `sizes` in its place (each thread starts at a different offset of the list). After a warm-up
// of `warmup_ops` operations per thread (the caches fill), every thread waits at a barrier, the
// clock starts, and all run until `seconds` have passed; the result is the number of allocations
// made in that time and the time taken (barrier release to the last thread's join).

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace alloc  = c10::cuda::CUDACachingAllocator;
using clock_type = std::chrono::steady_clock;

struct shared_state {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::string error;  // the first failure of any thread

  void fail(const std::string& what)
  {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (error.empty()) error = what;
    stop.store(true);
    go.store(true);
  }
};

void thread_body(shared_state& state, int index, int device, int live, const std::size_t* sizes,
                 int n_sizes, long warmup_ops, std::uint64_t& count)
{
  std::vector<void*> ring(static_cast<std::size_t>(live), nullptr);
  std::size_t next = static_cast<std::size_t>(index) * 7919u;  // a different start per thread
  std::size_t slot = 0;
  bool counted     = false;
  try {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    const cudaStream_t stream =
      c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device)).stream();
    auto op = [&] {
      if (ring[slot] != nullptr) alloc::raw_delete(ring[slot]);
      ring[slot] = nullptr;
      ring[slot] = alloc::raw_alloc_with_stream(sizes[next % n_sizes], stream);
      ++next;
      slot = slot + 1 == ring.size() ? 0 : slot + 1;
    };
    for (long i = 0; i < warmup_ops && !state.stop.load(std::memory_order_relaxed); ++i) op();
    state.ready.fetch_add(1);
    counted = true;
    while (!state.go.load(std::memory_order_acquire)) std::this_thread::yield();
    std::uint64_t n = 0;
    while (!state.stop.load(std::memory_order_relaxed)) {
      op();
      ++n;
    }
    count = n;
  } catch (const std::exception& e) {
    state.fail("thread " + std::to_string(index) + ": " + e.what());
  } catch (...) {
    state.fail("thread " + std::to_string(index) + ": unknown exception");
  }
  if (!counted) state.ready.fetch_add(1);
  for (void*& p : ring) {
    if (p == nullptr) continue;
    try {
      alloc::raw_delete(p);
    } catch (...) {
      // Reported through the first failure already, if that was the cause.
    }
    p = nullptr;
  }
}

void copy_message(const std::string& text, char* out, int capacity)
{
  if (out == nullptr || capacity <= 0) return;
  const std::size_t n = std::min(text.size(), static_cast<std::size_t>(capacity - 1));
  std::copy_n(text.data(), n, out);
  out[n] = '\0';
}

}  // namespace

extern "C" {

// Runs one timed batch. Writes to results: [0] allocations in the timed part, [1] its seconds,
// [2] the fewest allocations of one thread, [3] the most. Returns 0, or -1 with a message in
// error (capacity bytes, NUL-terminated) when an allocation failed or an argument is bad.
__attribute__((visibility("default"))) int gpukit_threads_bench(int threads, int device, int live,
                                                                const std::size_t* sizes,
                                                                int n_sizes, long warmup_ops,
                                                                double seconds, double* results,
                                                                char* error, int capacity)
{
  if (threads < 1 || live < 1 || sizes == nullptr || n_sizes < 1 || seconds <= 0 ||
      results == nullptr || warmup_ops < 0) {
    copy_message(
      "gpukit_threads_bench: need threads >= 1, live >= 1, sizes, seconds > 0, "
      "warmup_ops >= 0 (threads " +
        std::to_string(threads) + ", live " + std::to_string(live) + ", sizes " +
        std::to_string(n_sizes) + ")",
      error, capacity);
    return -1;
  }
  shared_state state;
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(threads), 0);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  try {
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back(thread_body, std::ref(state), t, device, live, sizes, n_sizes, warmup_ops,
                        std::ref(counts[static_cast<std::size_t>(t)]));
    }
  } catch (const std::exception& e) {
    state.fail(std::string("starting threads: ") + e.what());
  }
  while (state.ready.load() < static_cast<int>(pool.size()) && !state.stop.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  const auto t0 = clock_type::now();
  state.go.store(true, std::memory_order_release);
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (clock_type::now() < until && !state.stop.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  state.stop.store(true);
  for (auto& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (!state.error.empty()) {
    copy_message(state.error, error, capacity);
    return -1;
  }
  std::uint64_t total = 0;
  std::uint64_t lo    = UINT64_MAX;
  std::uint64_t hi    = 0;
  for (std::uint64_t c : counts) {
    total += c;
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  results[0] = static_cast<double>(total);
  results[1] = elapsed;
  results[2] = static_cast<double>(lo);
  results[3] = static_cast<double>(hi);
  return 0;
}

}  // extern "C"
