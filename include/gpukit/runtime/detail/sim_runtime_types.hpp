// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/detail/sim_runtime_types.hpp: the state behind gpukit::sim_runtime (streams,
// captures, events, devices, memory records). Not public API: names and layout change freely.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpukit::detail {

// Opaque handle types: a sim_runtime stream_type/event_type is a pointer to one of these, whose
// value is an id from sim_next_id(). They are never defined and never dereferenced.
struct sim_stream_handle;
struct sim_event_handle;

/// Process-wide id source for streams, events, physical handles and runtime instances: ids are
/// never reused, so a destroyed handle can never alias a live one, even across runtimes.
inline std::uint64_t sim_next_id() noexcept
{
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

/// The calling thread's current device for the runtime instance `serial` (0 until set).
inline int& sim_thread_device(std::uint64_t serial)
{
  thread_local std::uint64_t last_serial = 0;
  thread_local int* last_slot            = nullptr;
  if (last_serial == serial && last_slot != nullptr) { return *last_slot; }
  // Node-based map: references to elements stay valid when it grows.
  thread_local std::unordered_map<std::uint64_t, int> slots;
  int& slot   = slots[serial];
  last_serial = serial;
  last_slot   = &slot;
  return slot;
}

/// "0x1f2e..." for messages.
inline std::string sim_hex(std::uintptr_t v)
{
  char buf[2 + 2 * sizeof(std::uintptr_t) + 1];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
inline std::string sim_hex(void const* p) { return sim_hex(reinterpret_cast<std::uintptr_t>(p)); }

/// What an event record captured: completes when the stream reaches the record.
/// Shared by the event (until re-recorded or destroyed) and by every stream waiting on it.
struct sim_capture {
  explicit sim_capture(bool with_timing) : timing{with_timing} {}

  /// Runs on the stream's worker when it reaches the record.
  void complete()
  {
    {
      std::lock_guard<std::mutex> lock{mutex};
      if (timing) { when = std::chrono::steady_clock::now(); }
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }

  [[nodiscard]] bool is_done() const noexcept { return done.load(std::memory_order_acquire); }

  /// Blocks until complete() has run.
  void wait()
  {
    if (is_done()) { return; }
    std::unique_lock<std::mutex> lock{mutex};
    cv.wait(lock, [this] { return done.load(std::memory_order_acquire); });
  }

  bool const timing;
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point when{};  ///< written before `done`, read after it
};

/// A simulated stream: a worker thread running tasks in FIFO order.
struct sim_stream {
  using task = std::function<void()>;

  sim_stream(std::uint64_t stream_id, int stream_device) : id{stream_id}, device{stream_device} {}
  ~sim_stream()
  {
    set_stalled(false);
    stop();
    join();
  }
  sim_stream(sim_stream const&)            = delete;
  sim_stream& operator=(sim_stream const&) = delete;
  sim_stream(sim_stream&&)                 = delete;
  sim_stream& operator=(sim_stream&&)      = delete;

  /// Starts the worker (may throw std::system_error).
  void start()
  {
    worker = std::thread{[this] { run(); }};
  }

  /// Appends a task; false when the worker has already exited (the stream was destroyed and
  /// drained), in which case the task will never run.
  [[nodiscard]] bool enqueue(task t)
  {
    {
      std::lock_guard<std::mutex> lock{mutex};
      if (exiting) { return false; }
      queue.push_back(std::move(t));
      submitted.fetch_add(1, std::memory_order_release);
    }
    work_cv.notify_one();
    return true;
  }

  /// True when every task submitted so far has run (a cheap atomic check).
  [[nodiscard]] bool idle() const noexcept
  {
    auto const done = completed.load(std::memory_order_acquire);
    return done == submitted.load(std::memory_order_acquire);
  }

  /// True when the stream has run every task submitted so far and is not stalled: a capture
  /// taken now is already complete (what a GPU that idles reports almost at once).
  [[nodiscard]] bool caught_up()
  {
    std::lock_guard<std::mutex> lock{mutex};
    return !stalled &&
           completed.load(std::memory_order_relaxed) == submitted.load(std::memory_order_relaxed);
  }

  /// Number of tasks submitted so far: wait_for(mark()) waits for them.
  [[nodiscard]] std::uint64_t mark() const noexcept
  {
    return submitted.load(std::memory_order_acquire);
  }

  /// Blocks until the first `target` tasks have run.
  void wait_for(std::uint64_t target)
  {
    if (completed.load(std::memory_order_acquire) >= target) { return; }
    std::unique_lock<std::mutex> lock{mutex};
    done_cv.wait(lock, [&] { return completed.load(std::memory_order_acquire) >= target; });
  }

  void set_stalled(bool on)
  {
    {
      std::lock_guard<std::mutex> lock{mutex};
      stalled = on;
    }
    work_cv.notify_one();
  }

  /// Asks the worker to exit once the queue is empty (and the stream is not stalled).
  void stop()
  {
    {
      std::lock_guard<std::mutex> lock{mutex};
      stopping = true;
    }
    work_cv.notify_one();
  }

  /// True once the worker has returned (join() is then immediate).
  [[nodiscard]] bool exited() const noexcept { return finished.load(std::memory_order_acquire); }

  void join()
  {
    if (worker.joinable()) { worker.join(); }
  }

  std::uint64_t const id;  ///< 0 for a device's null stream
  int const device;

 private:
  void run()
  {
    for (;;) {
      task t;
      {
        std::unique_lock<std::mutex> lock{mutex};
        work_cv.wait(
          lock, [this] { return (!stalled && !queue.empty()) || (stopping && queue.empty()); });
        if (queue.empty()) {
          exiting = true;
          break;
        }
        t = std::move(queue.front());
        queue.pop_front();
      }
      t();
      t = nullptr;  // release what the task captured before it counts as completed
      {
        std::lock_guard<std::mutex> lock{mutex};
        completed.fetch_add(1, std::memory_order_release);
      }
      done_cv.notify_all();
    }
    finished.store(true, std::memory_order_release);
  }

  std::mutex mutex;
  std::condition_variable work_cv;          ///< the worker waits here for tasks
  std::condition_variable done_cv;          ///< synchronizing threads wait here for completions
  std::deque<task> queue;                   // guarded by mutex
  bool stalled{false};                      // guarded by mutex
  bool stopping{false};                     // guarded by mutex
  bool exiting{false};                      // guarded by mutex
  std::atomic<std::uint64_t> submitted{0};  ///< written under mutex, read anywhere
  std::atomic<std::uint64_t> completed{0};  ///< written under mutex, read anywhere
  std::atomic<bool> finished{false};
  std::thread worker;
};

/// A simulated event: the latest capture (null until first recorded).
struct sim_event {
  sim_event(std::uint64_t event_id, bool with_timing, int event_device)
      : id{event_id}, timing{with_timing}, device{event_device}
  {}

  [[nodiscard]] std::shared_ptr<sim_capture> current() const
  {
    std::lock_guard<std::mutex> lock{mutex};
    return capture;
  }
  /// True when never recorded or the latest capture has completed.
  [[nodiscard]] bool completed() const
  {
    std::lock_guard<std::mutex> lock{mutex};
    return !capture || capture->is_done();
  }
  void set(std::shared_ptr<sim_capture> c)
  {
    std::lock_guard<std::mutex> lock{mutex};
    capture = std::move(c);
  }

  std::uint64_t const id;
  bool const timing;
  int const device;  ///< the device current when it was created

 private:
  mutable std::mutex mutex;
  std::shared_ptr<sim_capture> capture;  // guarded by mutex
};

/// What one stream of a graph capture has waited for: (member stream id, its captured operations)
/// pairs, at most one per stream.
using sim_capture_reach = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

/// Raises `into`'s entries to those of `from` (a wait on an event joins what it had reached).
inline void sim_merge_reach(sim_capture_reach& into, sim_capture_reach const& from)
{
  for (auto const& entry : from) {
    std::uint64_t const stream = entry.first;  // a structured binding: not capturable in C++17
    std::uint64_t const work   = entry.second;
    auto it =
      std::find_if(into.begin(), into.end(), [&](auto const& e) { return e.first == stream; });
    if (it == into.end()) {
      into.emplace_back(stream, work);
    } else if (it->second < work) {
      it->second = work;
    }
  }
}

/// The work of `stream` that `reach` has waited for (0 when none).
inline std::uint64_t sim_reached(sim_capture_reach const& reach, std::uint64_t stream)
{
  for (auto const& [s, work] : reach) {
    if (s == stream) { return work; }
  }
  return 0;
}

/// One simulated graph capture, from begin_capture to end_capture: its mode, the thread that began
/// it, and the streams taking part, the one that began it (the origin) first. A stream joins when
/// it waits on an event recorded on a member; it is joined back when the origin has waited (maybe
/// through other members) for all the work captured on it.
struct sim_graph_capture {
  struct member {
    std::uint64_t stream{0};
    std::uint64_t work{0};    ///< operations captured on this stream so far
    sim_capture_reach reach;  ///< the other members' work it has waited for
  };
  std::uint64_t id{0};
  int mode{0};
  std::thread::id thread;
  bool invalidated{false};
  char const* invalidated_by{""};  ///< the first call that invalidated it
  std::vector<member> members;     ///< members.front() is the origin

  void invalidate(char const* call) noexcept
  {
    if (!invalidated) { invalidated_by = call; }
    invalidated = true;
  }

  [[nodiscard]] member* find(std::uint64_t stream)
  {
    for (auto& m : members) {
      if (m.stream == stream) { return &m; }
    }
    return nullptr;
  }
};

/// An event last recorded on a capturing stream: the capture, and what a wait on it waits for
/// (the recording stream's work so far and what that stream had reached).
struct sim_captured_event {
  std::uint64_t capture{0};
  sim_capture_reach reach;
};

/// One simulated device: capacity and use (lock-free), and its lazily started null stream.
struct sim_device {
  explicit sim_device(std::size_t capacity_bytes) : capacity{capacity_bytes} {}

  /// Adds `bytes` to `used` unless that would pass the capacity.
  [[nodiscard]] bool try_charge(std::size_t bytes) noexcept
  {
    auto cur = used.load(std::memory_order_relaxed);
    for (;;) {
      auto const cap = capacity.load(std::memory_order_relaxed);
      if (bytes > cap || cur > cap - bytes) { return false; }
      if (used.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed)) { return true; }
    }
  }
  void uncharge(std::size_t bytes) noexcept { used.fetch_sub(bytes, std::memory_order_relaxed); }

  [[nodiscard]] std::size_t free_bytes() const noexcept
  {
    auto const cap = capacity.load(std::memory_order_relaxed);
    auto const u   = used.load(std::memory_order_relaxed);
    return u >= cap ? 0 : cap - u;
  }

  std::atomic<std::size_t> capacity;
  std::atomic<std::size_t> used{0};
  std::once_flag null_once;
  std::atomic<bool> null_started{false};
  std::shared_ptr<sim_stream> null_stream;  ///< written once, before null_started
};

/// A device allocation (malloc / malloc_async), keyed by its base address.
struct sim_allocation {
  std::size_t bytes{0};         ///< requested: counted against capacity, the valid copy range
  std::size_t mapped_bytes{0};  ///< rounded up to the page size: what mmap reserved
  int device{0};
  bool pending_free{false};  ///< free_async enqueued; no longer usable
  bool async{false};         ///< from malloc_async: not exportable with ipc_get_mem_handle
  int ipc_fd{-1};            ///< after ipc_get_mem_handle: the memfd now backing the memory
  bool imported{false};      ///< mapped by ipc_open_mem_handle (not counted against capacity)
  std::size_t ipc_refs{0};   ///< imported: opens not yet closed
  std::string ipc_key;       ///< imported: "<pid>:<fd>" of the exporter's memfd
};

/// A virtual address range from vm_reserve, keyed by its base.
struct sim_reservation {
  std::size_t bytes{0};
};

/// A physical handle mapped into a reservation, keyed by its virtual address.
struct sim_mapping {
  std::size_t bytes{0};
  std::uint64_t handle{0};
  int device{0};                 ///< the device of the physical memory
  std::uint64_t access_mask{0};  ///< devices given read-write access by vm_set_access
};

/// Physical memory from vm_create: a memfd.
struct sim_physical {
  int fd{-1};
  std::size_t bytes{0};
  int device{0};
  bool released{false};  ///< vm_release called; freed when map_count drops to 0
  std::size_t map_count{0};
  bool shareable{false};  ///< created shareable (vm_export_shareable allowed) or imported
  bool imported{false};   ///< from vm_import_shareable: another handle's memory, not charged
};

/// The memfd names that carry a simulated device's memory across processes.
inline constexpr char const* sim_physical_name = "gpukit-sim-physical-d";
inline constexpr char const* sim_ipc_name      = "gpukit-sim-ipc-d";
/// The first bytes of a simulated ipc_mem_handle.
inline constexpr char sim_ipc_magic[8] = {'g', 'k', 's', 'i', 'm', 'i', 'p', 'c'};

/// What a simulated ipc_mem_handle holds (in its 64 bytes).
struct sim_ipc_payload {
  char magic[8];
  std::int64_t pid;            ///< the exporting process
  std::int64_t fd;             ///< the memfd in the exporting process
  std::uint64_t bytes;         ///< the allocation's size
  std::uint64_t mapped_bytes;  ///< its mapping's size
  std::int64_t device;
};
static_assert(sizeof(sim_ipc_payload) <= 64, "a simulated IPC handle fits cudaIpcMemHandle_t");

}  // namespace gpukit::detail
