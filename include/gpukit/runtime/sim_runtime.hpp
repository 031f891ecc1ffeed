// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/sim_runtime.hpp: a simulated GPU in host memory, a Runtime for every gpukit
// component (see gpukit/runtime/runtime.hpp for the contract).
//
// Quick start:
//
//   #include <gpukit/runtime/sim_runtime.hpp>
//
//   #include <vector>
//
//   void run()
//   {
//     // Two simulated GPUs of 8 GiB each:
//     gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(2, std::size_t{8} << 30)};
//     gpukit::sim_runtime::stream_type s{};
//     GPUKIT_CUDA_TRY(sim.stream_create(s));     // a worker thread, tasks run in FIFO order
//     void* d = nullptr;
//     GPUKIT_CUDA_TRY(sim.malloc(&d, 1 << 20));  // lazily backed: no RAM until touched
//     std::vector<char> h(1 << 20, 'x');
//     auto const h2d = gpukit::memcpy_kind::host_to_device;
//     GPUKIT_CUDA_TRY(sim.memcpy_async(d, h.data(), h.size(), h2d, s));  // returns at once
//     GPUKIT_CUDA_TRY(sim.stream_synchronize(s));  // blocks until the copy has run
//
//     // What a real GPU cannot do on demand:
//     sim.inject_fault(gpukit::sim_op::malloc, 1, sim.out_of_memory);  // the next malloc fails
//     GPUKIT_CUDA_TRY(sim.set_capacity(0, std::size_t{1} << 30));  // shrink device 0 to 1 GiB
//     GPUKIT_CUDA_TRY(sim.stall(s));    // s runs nothing (its events stay pending)
//     GPUKIT_CUDA_TRY(sim.release(s));  // ... until released
//     (void)sim.calls(gpukit::sim_op::malloc);    // calls made, failed ones included
//     (void)sim.synchronizations();               // calls that blocked the host
//     (void)sim.last_misuse();                    // "free(0x7f..): double free ..."
//   }
//
// ## What is simulated, and how it differs from CUDA
//
// - Devices: `sim_config` lists each device's capacity in bytes. Device memory is host memory
//   reserved with `mmap(MAP_NORESERVE)`, one mapping per allocation: it costs RAM only where
//   touched, so an 80 GiB device replaying a 29 GiB trace runs on a 24 GiB machine.
//   `malloc` charges exactly the bytes requested (no rounding); `mem_get_info` reports
//   capacity - used, never below zero, where used counts live allocations and live physical
//   handles. `driver_version` and `runtime_version` report 13000 (CUDA 13.0): simulated values.
// - Streams: each stream, and each device's null stream (a value-initialized `stream_type`,
//   started on first use), is a worker thread running its tasks in FIFO order. The null stream is
//   an ordinary stream here: it does not synchronize with other streams as CUDA's legacy default
//   stream does. `stream_type` and `event_type` are opaque ids that are never reused: a destroyed
//   handle reports cudaErrorInvalidResourceHandle forever after. An event record is a marker task
//   on its stream; on a stream that has run everything and is not stalled it completes at once.
// - Copies, memsets and host functions run on the stream's worker as `std::memmove`/`std::memset`
//   /`fn(user)`. Pointers are checked when the work is enqueued (CUDA would fault later, or never):
//   a bad pointer, a range past an allocation's end or into unmapped virtual memory is rejected
//   with cudaErrorInvalidValue and a misuse message. There are no kernels.
// - `free` blocks until the allocation's device has run the work submitted before it (as cudaFree
//   does), and `host_free` until every device has; both count as synchronizations. While a stream
//   they wait for is stalled, they block until another thread calls `release` (prefer
//   free_async in tests that stall streams).
// - Virtual memory: `vm_reserve` is a PROT_NONE reservation, `vm_create` a memfd counted against
//   capacity, `vm_map` maps it (inaccessible until `vm_set_access`, as in CUDA). `vm_set_access`
//   and `vm_unmap` take ranges made of whole mappings.
// - Errors: the simulated GPU reports CUDA's codes (error_type is cudaError_t; the named codes,
//   capture modes and error names are CUDA's, from detail::cuda_error_vocabulary). Errors are
//   never sticky, and the CUDA runtime's last-error slot is never touched, by the simulated GPU
//   nor by GPUKIT_CUDA_TRY when it throws for it.
//
// Every member may be called from any thread at once. Members return error_type and throw only
// std::bad_alloc / std::system_error when the host itself runs out of memory or threads, except
// the configuration functions that document gpukit::logic_error.
#pragma once

#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/runtime/detail/cuda_errors.hpp>
#include <gpukit/runtime/detail/sim_runtime_types.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpukit {

/// The runtime calls of sim_runtime, for call counters and fault injection: one per operation of
/// the Runtime contract (GPUKIT_RUNTIME_OPS), in the contract's order.
enum class sim_op : int {
#define GPUKIT_DETAIL_SIM_OP(name, params, doc) name,
  GPUKIT_RUNTIME_OPS(GPUKIT_DETAIL_SIM_OP)
#undef GPUKIT_DETAIL_SIM_OP
    count_  ///< number of ops; not an op
};

/// The op's name as spelled in sim_runtime ("malloc", "stream_query", ...); "unknown" for
/// count_ or an out-of-range value. Never throws.
[[nodiscard]] char const* to_string(sim_op op) noexcept;

/// How a sim_runtime is built: devices and their capacities, virtual-memory granularity, name.
/// Plain fields, plus chainable `with_*` setters:
///
///   gpukit::sim_config{}.with_devices(4, std::size_t{80} << 30).with_vm_granularity(2 << 20)
struct sim_config {
  /// One entry per device: its capacity (total memory) in bytes. Default: one 80 GiB device.
  std::vector<std::size_t> device_capacities{std::size_t{80} << 30};
  /// Minimum virtual-memory mapping granularity (vm_granularity); a multiple of the host page size.
  std::size_t vm_granularity{std::size_t{2} << 20};
  /// device_properties::name of every device.
  std::string device_name{"gpukit simulated GPU"};
  /// When true, every misuse message is also written to stderr as it is recorded.
  bool log_misuse{false};
  /// device_properties::ecc_enabled of every device (data-center GPUs ship with ECC on).
  bool ecc_enabled{true};
  /// Whether every device can access every other device's memory (device_can_access_peer), as
  /// GPUs joined by NVLink can; false: none can, and peer copies are staged through the host.
  bool peer_access{true};
  /// device_properties::virtual_memory_management of every device; false: the vm_* operations
  /// fail with cudaErrorNotSupported, as cuMem* calls do on a device (or under a driver, such as
  /// some virtualized GPUs) without virtual memory management.
  bool virtual_memory{true};

  /// `count` devices of `capacity_bytes` each (replaces device_capacities).
  /// Throws gpukit::logic_error when count < 1 or count > 64. Returns *this.
  sim_config& with_devices(int count, std::size_t capacity_bytes) &;
  sim_config&& with_devices(int count, std::size_t capacity_bytes) &&;
  /// Sets vm_granularity. Returns *this (validated by sim_runtime's constructor).
  sim_config& with_vm_granularity(std::size_t bytes) &;
  sim_config&& with_vm_granularity(std::size_t bytes) &&;
  /// Sets device_name. Returns *this.
  sim_config& with_device_name(std::string name) &;
  sim_config&& with_device_name(std::string name) &&;
  /// Sets log_misuse. Returns *this.
  sim_config& with_misuse_log(bool on) &;
  sim_config&& with_misuse_log(bool on) &&;
  /// Sets ecc_enabled. Returns *this.
  sim_config& with_ecc(bool on) &;
  sim_config&& with_ecc(bool on) &&;
  /// Sets peer_access. Returns *this.
  sim_config& with_peer_access(bool on) &;
  sim_config&& with_peer_access(bool on) &&;
  /// Sets virtual_memory. Returns *this.
  sim_config& with_virtual_memory(bool on) &;
  sim_config&& with_virtual_memory(bool on) &&;

  /// The configuration of sim_runtime::instance(): GPUKIT_SIM_DEVICES devices (default 1) of
  /// GPUKIT_SIM_CAPACITY bytes each (default 80 GiB; a K, M, G or T suffix multiplies by 2^10,
  /// 2^20, 2^30, 2^40). Throws gpukit::logic_error naming the variable when a value does not parse.
  [[nodiscard]] static sim_config from_env();
};

/// A simulated GPU: satisfies the whole Runtime contract (gpukit/runtime/contract.hpp), plus
/// controls for tests (capacity, fault injection, stalls) and observations (call counters, misuse
/// messages). Non-copyable, non-movable. Thread-safe.
class sim_runtime final : public detail::cuda_error_vocabulary {
 public:
  /// Opaque stream handle (an id, never dereferenced); value-initialized = the current device's
  /// null stream.
  using stream_type = detail::sim_stream_handle*;
  /// Opaque event handle (an id, never dereferenced).
  using event_type = detail::sim_event_handle*;
  /// Physical memory for virtual-memory mapping: an id into the runtime's table (0 = none).
  using physical_handle = std::uint64_t;
  /// An interprocess memory handle: CUDA's 64 bytes, holding the simulated exporter's memfd.
  using ipc_mem_handle = cudaIpcMemHandle_t;

  static constexpr bool is_simulated = true;

  /// Builds the simulated devices. Starts no thread (null streams start on first use).
  /// Throws gpukit::logic_error when the config has no device, more than 64, or a granularity
  /// that is 0 or not a multiple of the host page size.
  explicit sim_runtime(sim_config config = sim_config{});
  /// Releases every stall, lets every stream (destroyed ones included) run its queued work, joins
  /// the workers, then frees every allocation, reservation, physical handle and pinned buffer.
  /// Blocks until queued work has run.
  ~sim_runtime();
  sim_runtime(sim_runtime const&)            = delete;
  sim_runtime& operator=(sim_runtime const&) = delete;
  sim_runtime(sim_runtime&&)                 = delete;
  sim_runtime& operator=(sim_runtime&&)      = delete;

  /// The process-wide default simulated GPU, built on first call from sim_config::from_env()
  /// (throws gpukit::logic_error then if the environment does not parse). Thread-safe.
  [[nodiscard]] static sim_runtime& instance();

  // ---- The Runtime contract's operations ---------------------------------------------------
  // One member per entry of GPUKIT_RUNTIME_OPS (gpukit/runtime/contract.hpp), declared from that
  // list: `[[nodiscard]] error_type NAME(PARAMETERS)`. What each does in sim_runtime:
  //
  // Devices:
  //   device_count: n = number of simulated devices. Returns cudaSuccess.
  //   get_device: d = the calling thread's current device for this runtime (0 until set_device).
  //   set_device: Makes `d` the calling thread's current device. cudaErrorInvalidDevice when out
  //     of range.
  //   get_device_properties: Fills `p` for device `d`: the configured name, compute capability
  //     9.0, total_memory = the current capacity, 132 multiprocessors, 2 copy engines, unified
  //     addressing, memory pools supported, virtual memory as configured
  //     (sim_config::virtual_memory), ECC as configured (sim_config::ecc_enabled),
  //     PCI 0000:<d>:00.0, simulated = true. cudaErrorInvalidDevice
  //     when `d` is out of range.
  //   mem_get_info: Current device: total = capacity, free = capacity - used (0 when used exceeds
  //     a shrunk capacity).
  //   driver_version: v = 13000 (CUDA 13.0): a simulated value; there is no driver.
  //   runtime_version: v = 13000 (CUDA 13.0): a simulated value.
  //   device_synchronize: Blocks until every stream of the current device (destroyed ones still
  //     draining, and the null stream) has run the work submitted before the call. Counts as a
  //     synchronization.
  //   device_can_access_peer: can = 1 when sim_config::peer_access and device != peer, else 0.
  //     cudaErrorInvalidDevice for a bad ordinal.
  //   device_enable_peer_access: Records that the current device may access `peer`'s memory.
  //     cudaErrorInvalidDevice for a bad ordinal or the current device itself;
  //     cudaErrorPeerAccessUnsupported without sim_config::peer_access;
  //     cudaErrorPeerAccessAlreadyEnabled when already enabled.
  // Device memory:
  //   malloc: Allocates `bytes` on the current device: *p = page-aligned memory. bytes == 0: *p =
  //     nullptr, cudaSuccess (as cudaMalloc). cudaErrorMemoryAllocation when capacity - used <
  //     bytes; cudaErrorInvalidValue when p is null. Does not block.
  //   free: Frees memory from malloc/malloc_async. Blocks until the allocation's device has run
  //     the work submitted before the call (cudaFree synchronizes), then returns the bytes to
  //     capacity; counts as a synchronization. p == nullptr: cudaSuccess. Unknown pointer,
  //     interior pointer or double free: cudaErrorInvalidValue and a misuse message.
  //   malloc_async: Stream-ordered allocation on `s`'s device: counted against capacity at once,
  //     usable at once. Errors as malloc, plus cudaErrorInvalidResourceHandle for a dead stream.
  //     Does not block.
  //   free_async: Stream-ordered free: `p` is unusable at once; its bytes return to capacity when
  //     `s` reaches the free. p == nullptr: cudaSuccess. Errors as free (plus a dead stream).
  //     Does not block.
  // Pinned host memory (never counted against device capacity):
  //   host_alloc: *p = `bytes` of page-aligned host memory. flags: host_alloc_flags (others:
  //     cudaErrorInvalidValue). bytes == 0: *p = nullptr. cudaErrorMemoryAllocation when the host
  //     refuses. Does not block.
  //   host_free: Frees memory from host_alloc. Blocks until every device has run the work
  //     submitted before the call (cudaFreeHost synchronizes); counts as a synchronization. p ==
  //     nullptr: cudaSuccess. Unknown pointer or double free: cudaErrorInvalidValue and a misuse
  //     message.
  //   host_register: Records [p, p+bytes) as registered (pinned).
  //     cudaErrorHostMemoryAlreadyRegistered when it overlaps a registered range or host_alloc
  //     memory; cudaErrorInvalidValue for a null p, zero bytes, unknown flags or device memory.
  //     Does not block.
  //   host_unregister: Forgets the range registered at `p` (its start).
  //     cudaErrorHostMemoryNotRegistered otherwise.
  // Virtual memory (without sim_config::virtual_memory, vm_granularity, vm_reserve and vm_create
  // return cudaErrorNotSupported and record a misuse message; nothing can be mapped then):
  //   vm_granularity: g = the configured granularity (sim_config::vm_granularity).
  //     cudaErrorInvalidDevice.
  //   vm_reserve: Reserves `bytes` of address space (no memory), aligned to max(alignment,
  //     granularity). bytes must be a non-zero multiple of the granularity and alignment 0 or a
  //     power of two, else cudaErrorInvalidValue. cudaErrorMemoryAllocation when the host has no
  //     address space left.
  //   vm_free: Returns a whole reservation (va = its start, bytes = its size).
  //     cudaErrorInvalidValue when the range is unknown or still holds mappings.
  //   vm_create: Creates `bytes` of physical memory on `device` (a non-zero multiple of the
  //     granularity, else cudaErrorInvalidValue), counted against its capacity:
  //     cudaErrorMemoryAllocation when it does not fit. cudaErrorInvalidDevice for a bad device.
  //     The memory is a memfd; `shareable` allows vm_export_shareable (as
  //     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR does on CUDA).
  //   vm_export_shareable: fd = a new descriptor of `h`'s memfd (close-on-exec; the caller closes
  //     it). It can cross to another process (SCM_RIGHTS, or fork) whose simulated GPU imports
  //     it: both then share the bytes. cudaErrorInvalidValue for an unknown handle or one not
  //     created shareable.
  //   vm_import_shareable: h = a new handle to the memory `fd` names (a descriptor from
  //     vm_export_shareable of any simulated GPU, in any process): same size and device, not
  //     counted against capacity (the exporter's device holds it). `fd` stays the caller's.
  //     cudaErrorInvalidValue for a descriptor that is not simulated device memory;
  //     cudaErrorInvalidDevice when its device does not exist here.
  //   vm_release: Releases `h`: its memory returns to capacity once it is also unmapped
  //     everywhere. Unknown or already released handle: cudaErrorInvalidValue.
  //   vm_map: Maps all of `h` at `va` (bytes must equal its size): va granularity-aligned, inside
  //     one reservation, overlapping no mapping; else cudaErrorInvalidValue. Inaccessible until
  //     vm_set_access.
  //   vm_unmap: Unmaps [va, va+bytes), which must consist of whole adjacent mappings, else
  //     cudaErrorInvalidValue. The range stays reserved.
  //   vm_set_access: Makes [va, va+bytes) (whole adjacent mappings, else cudaErrorInvalidValue)
  //     readable and writable, by host code and by copies; `device` is recorded as having access.
  // Interprocess memory:
  //   ipc_get_mem_handle: h = a handle naming the allocation (from malloc) that holds `p`. The
  //     first export of an allocation moves its bytes into a memfd mapped at the same address
  //     (waiting first for the work queued on every device: do not let work on it run meanwhile).
  //     The handle holds this process's id and the memfd's number. cudaErrorInvalidValue for
  //     memory from malloc_async (as CUDA refuses the default pool's memory), memory opened from
  //     a handle, a pointer in no allocation, or one freed with free_async.
  //   ipc_open_mem_handle: In another process (a fork, or any process of the same user): *p = the
  //     base of a mapping of the allocation `h` names (through /proc/<pid>/fd/<fd>), device
  //     memory of the handle's device for copies, not counted against capacity. Opening the same
  //     handle again returns the same pointer (reference counted, as CUDA does).
  //     cudaErrorInvalidValue for a handle that is not a simulated one or whose memory cannot be
  //     opened (the exporter exited or freed it); cudaErrorInvalidResourceHandle in the exporting
  //     process itself (CUDA opens handles only in other processes); cudaErrorInvalidDevice when
  //     its device does not exist here.
  //   ipc_close_mem_handle: Drops one open of `p` (from ipc_open_mem_handle); the last one waits
  //     for the work queued on its device, then unmaps it. cudaErrorInvalidValue for any other
  //     pointer.
  // Streams:
  //   stream_create: Creates a stream (and its worker thread) on the current device.
  //   stream_destroy: Destroys `s` and returns at once; work already queued still runs. The null
  //     stream cannot be destroyed; a dead handle gives cudaErrorInvalidResourceHandle (also for
  //     every later use).
  //   stream_synchronize: Blocks until `s` has run the work submitted before the call. Counts as
  //     a synchronization.
  //   stream_query: cudaSuccess when `s` has run all submitted work, else cudaErrorNotReady. An
  //     atomic check. On a capturing stream: see begin_capture (also for stream_synchronize,
  //     stream_get_device, event_query and event_synchronize).
  //   stream_wait_event: Work submitted to `s` after this call waits for `e`'s capture as of this
  //     call (no-op when `e` was never recorded or has completed). Does not block the host. When
  //     `e` was recorded in a graph capture under way, `s` joins that capture instead;
  //     cudaErrorStreamCaptureIsolation when `s` takes part in another capture,
  //     cudaErrorCapturedEvent when that capture has ended.
  //   stream_get_device: device = the device `s` was created on (the current device for the null
  //     stream). cudaErrorInvalidResourceHandle for a dead stream.
  // Events:
  //   event_create: Creates an event of the current device; only `timing` events can be given to
  //     event_elapsed_time.
  //   event_destroy: Destroys `e`; streams waiting on its capture still wait for it. Dead handle:
  //     cudaErrorInvalidResourceHandle.
  //   event_record: Captures the work submitted to `s` so far (replacing the previous capture);
  //     the capture completes, with a steady_clock timestamp for timing events, when `s` reaches
  //     it: at once when `s` has run everything submitted and is not stalled.
  //     cudaErrorInvalidResourceHandle (and a misuse message) when `s` belongs to another device
  //     than `e`, as on CUDA.
  //   event_query: cudaSuccess when the capture has completed or `e` was never recorded, else
  //     cudaErrorNotReady.
  //   event_synchronize: Blocks until the capture completes. Counts as a synchronization.
  //   event_elapsed_time: ms = milliseconds between the completions of `start`'s and `stop`'s
  //     captures. cudaErrorInvalidResourceHandle when either is not a timing event, was never
  //     recorded, or the two belong to different devices; cudaErrorNotReady when either capture
  //     has not completed.
  // Work on streams (enqueued, never blocking the host):
  //   memcpy_async: Copies `bytes` from src to dst on `s`. The kind is checked against the
  //     pointers: a device side must lie in one allocation or in accessible mapped virtual memory
  //     (any device), a host side outside all device memory; `infer` classifies each side. bytes
  //     == 0: no-op cudaSuccess. cudaErrorInvalidValue (and a misuse message) for null or
  //     misplaced pointers and ranges past an allocation's end; cudaErrorInvalidMemcpyDirection
  //     for an unknown kind.
  //   memcpy_peer_async: Copies between device memory of `src_device` and of `dst_device` (each
  //     side checked to be on that device). cudaErrorInvalidDevice for a bad ordinal; otherwise
  //     as memcpy_async. A copy between two devices neither of which has peer access to the other
  //     is counted in staged_peer_copies() (CUDA stages it through host memory).
  //   memset_async: Sets `bytes` of device memory at dst to (unsigned char)value on `s`. Checks
  //     as memcpy_async.
  //   launch_host_func: Runs fn(user) on `s`'s worker in stream order; fn must not call the
  //     runtime. Null fn: cudaErrorInvalidValue.
  //   stream_is_capturing: Whether `s` is being captured, as the stream that began the capture or
  //     one joined to it (see begin_capture). cudaErrorInvalidResourceHandle for a dead stream.
  //   stream_capture_id: id = the capture `s` takes part in (see begin_capture), 0 when none.
  //     cudaErrorInvalidResourceHandle for a dead stream.
  //   exchange_capture_mode: Swaps the calling thread's capture mode (cudaStreamCaptureMode
  //     values) with `mode`.
  GPUKIT_RUNTIME_OPS(GPUKIT_RUNTIME_DECLARE_OPERATION)

  // ---- Simulation controls (not runtime calls: neither counted nor injectable) -----------------

  /// Sets device `device`'s capacity to `bytes` at once; may go below what is in use (then free
  /// memory reads 0 and allocations fail until enough is freed). cudaErrorInvalidDevice.
  [[nodiscard]] cudaError_t set_capacity(int device, std::size_t bytes);
  /// Device `device`'s capacity in bytes (0 for a bad ordinal).
  [[nodiscard]] std::size_t capacity(int device) const noexcept;
  /// Bytes in use on `device`: live allocations (including free_async not yet reached) and live
  /// physical handles (0 for a bad ordinal).
  [[nodiscard]] std::size_t used_bytes(int device) const noexcept;
  /// True when [p, p + bytes) lies inside one range from host_alloc or host_register that is
  /// pinned for `device`: allocated or registered with the portable flag, or while `device` was
  /// current (CUDA pins memory without the portable flag for that device's context only; other
  /// devices copy it as pageable memory). Copies themselves work either way here.
  [[nodiscard]] bool host_pinned_for(void const* p, std::size_t bytes, int device) const;
  /// True when device_enable_peer_access(peer) succeeded with `device` current.
  [[nodiscard]] bool peer_access_enabled(int device, int peer) const noexcept;
  /// memcpy_peer_async calls between two devices without peer access either way.
  [[nodiscard]] std::uint64_t staged_peer_copies() const noexcept;
  /// True when `p` lies in mapped virtual memory that vm_set_access made accessible to `device`
  /// (the mapping's own device or a peer); false for any other address or device.
  [[nodiscard]] bool vm_accessible(void const* p, int device) const;

  /// Fails the `nth` call (1-based, counted from now) of `op` with `error`, before the call has any
  /// effect (outputs untouched). Several injections may be pending, for the same op too; when more
  /// than one falls on the same call, the earliest injected gives the error and all are used up.
  /// Throws gpukit::logic_error when nth == 0, op is count_ or error is cudaSuccess.
  void inject_fault(sim_op op, std::uint64_t nth, cudaError_t error);
  /// Drops every pending injection.
  void clear_faults();
  /// Number of injections not yet triggered.
  [[nodiscard]] std::size_t pending_faults() const;

  /// Holds `s`'s worker before its next task (a task already running finishes) until release(s):
  /// its queued work, and the captures of events recorded on it, stay pending. Null = the current
  /// device's null stream. cudaErrorInvalidResourceHandle for a dead stream. Does not block.
  [[nodiscard]] cudaError_t stall(stream_type s);
  /// Lets a stalled stream run again. cudaErrorInvalidResourceHandle for a dead stream.
  [[nodiscard]] cudaError_t release(stream_type s);

  /// Simulates CUDA graph capture on `s` as cudaStreamBeginCapture does, with CUDA's rules:
  /// - Work enqueued on a capturing stream is recorded, not run (here: dropped). A stream joins
  ///   the capture when it waits (stream_wait_event) on an event recorded on a capturing stream;
  ///   it is then capturing too (stream_is_capturing, the same stream_capture_id).
  /// - On any capturing stream, stream_get_device, stream_query and stream_synchronize fail with
  ///   cudaErrorStreamCaptureUnsupported and invalidate the capture, in every mode (as CUDA's
  ///   cudaStreamGetDevice, cudaStreamQuery, cudaStreamGetFlags and cudaStreamGetId do).
  ///   event_query and event_synchronize of an event last recorded in a capture fail with
  ///   cudaErrorCapturedEvent (invalidating the capture while it is under way).
  /// - Unsafe calls (malloc, free, host_alloc, host_free, event and stream queries and
  ///   synchronizations, device_synchronize) fail with cudaErrorStreamCaptureUnsupported, and
  ///   invalidate the capture, when made from a thread whose capture mode (exchange_capture_mode)
  ///   is not relaxed, and either that thread began a capture that is not in relaxed `mode`, or
  ///   it is in global capture mode and another thread's capture is in global `mode`. So: global
  ///   refuses them on every such thread, thread-local only on the capturing thread, relaxed none.
  /// - Once a capture is invalidated, work enqueued on its streams, events recorded on them and
  ///   waits that would join it return cudaErrorStreamCaptureInvalidated until end_capture.
  /// - malloc_async on a capturing stream is refused as a misuse (on CUDA it would silently
  ///   become a graph allocation node).
  /// Every refusal records a misuse message naming the call and the capture.
  /// @param s the stream that begins (and must end) the capture
  /// @param mode capture_mode_global (default), capture_mode_thread_local or capture_mode_relaxed
  /// cudaErrorInvalidResourceHandle for a dead stream; cudaErrorInvalidValue when `s` is already
  /// capturing (begun or joined) or for an unknown mode. Does not block.
  [[nodiscard]] cudaError_t begin_capture(stream_type s, int mode = capture_mode_global);
  /// Ends the capture begun on `s`; every stream of it stops capturing. Returns
  /// cudaErrorStreamCaptureInvalidated when a call invalidated it, else
  /// cudaErrorStreamCaptureUnjoined when a joined stream has captured work that `s` never waited
  /// for (the capture ends in both cases, as on CUDA). cudaErrorStreamCaptureUnmatched (and the
  /// capture is invalidated) when `s` joined the capture but did not begin it;
  /// cudaErrorInvalidValue when `s` is not capturing.
  [[nodiscard]] cudaError_t end_capture(stream_type s);

  /// Calls of `op` made since construction or reset_counters(), failed ones included (relaxed
  /// atomic counters: exact once the calling threads are joined or synchronized).
  [[nodiscard]] std::uint64_t calls(sim_op op) const noexcept;
  /// Sum of calls() over every op.
  [[nodiscard]] std::uint64_t total_calls() const noexcept;
  /// Calls that block the host: stream_synchronize, event_synchronize, device_synchronize, free
  /// and host_free (failed ones included).
  [[nodiscard]] std::uint64_t synchronizations() const noexcept;
  /// Zeroes calls(), total_calls() and synchronizations() (not misuse_count()).
  void reset_counters() noexcept;

  /// The latest misuse message (any thread), e.g. "free(0x7f..): double free ...": every error
  /// returned for a misuse (bad pointer, dead handle, bad size, bad device, ...) records one;
  /// out-of-memory, cudaErrorNotReady and injected faults do not. Empty when none.
  [[nodiscard]] std::string last_misuse() const;
  /// Number of misuse messages recorded since construction.
  [[nodiscard]] std::uint64_t misuse_count() const noexcept;

 private:
  struct pending_fault {
    sim_op op;
    std::uint64_t remaining;
    cudaError_t error;
  };
  // Where a pointer range lies.
  struct placement {
    enum class where { host, device, invalid } kind{where::host};
    int device{-1};
    std::string why;  ///< for invalid
  };

  cudaError_t enter(sim_op op) noexcept;
  cudaError_t take_fault(sim_op op) noexcept;
  cudaError_t misuse(cudaError_t error, std::string message);
  [[nodiscard]] int current_device() const;
  [[nodiscard]] bool valid_device(int d) const noexcept;
  cudaError_t bad_device(char const* call, int d);
  cudaError_t no_virtual_memory(char const* op);
  std::shared_ptr<detail::sim_stream> null_stream(int device);
  std::shared_ptr<detail::sim_stream> find_stream(stream_type s, char const* call,
                                                  cudaError_t& err);
  std::shared_ptr<detail::sim_event> find_event(event_type e, char const* call, cudaError_t& err);
  cudaError_t enqueue(detail::sim_stream& s, std::function<void()> task, char const* call);
  void reap_streams();
  void wait_device(int device);
  void wait_all_devices();
  cudaError_t allocate(void** p, std::size_t bytes, int device, bool async);
  std::string describe_unknown(std::uintptr_t a) const;  // mem_mutex_ held
  // The allocation `p` names, for `call` (free, free_async); refused (the error returned) when it
  // is unknown, already being freed, or imported. mem_mutex_ held.
  cudaError_t find_freeable(char const* call, void* p, detail::sim_allocation*& found);
  void remember_freed(std::uintptr_t base);     // for "double free" messages; mem_mutex_ held
  void forget_allocation(std::uintptr_t base);  // erases and remembers it; mem_mutex_ held
  // Unmaps a forgotten allocation and gives its bytes back to its device; mem_mutex_ not held.
  void unmap_allocation(std::uintptr_t base, detail::sim_allocation const& a);
  placement place(void const* p, std::size_t bytes) const;  // mem_mutex_ held
  // place()'s cases: [.., end) starting in the allocation at `base`, or in a reservation (it ends
  // there too), from `a`; mem_mutex_ held.
  static placement place_in_allocation(std::uintptr_t base, detail::sim_allocation const& al,
                                       std::uintptr_t end, std::size_t bytes);
  placement place_in_mappings(std::uintptr_t a, std::uintptr_t end) const;
  cudaError_t check_side(char const* call, std::string const& args, char const* side, void const* p,
                         std::size_t bytes, bool want_device, int want_device_id);
  // Finds the whole adjacent mappings making up [va, va+bytes); mem_mutex_ held.
  bool whole_mappings(std::uintptr_t va, std::size_t bytes, std::string& why) const;
  void release_physical(std::uint64_t id);  // mem_mutex_ held; map_count == 0 and released

  std::uint64_t const serial_;
  sim_config const config_;
  std::size_t const page_size_;
  std::vector<std::unique_ptr<detail::sim_device>> devices_;

  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(sim_op::count_)> calls_{};
  std::atomic<std::uint64_t> synchronizations_{0};
  std::array<std::atomic<std::uint64_t>, 64> peer_enabled_{};  ///< per device: peers it may access
  std::atomic<std::uint64_t> staged_peer_copies_{0};

  // The mutexes that are detail::annotated_mutex guard what is GPUKIT_GUARDED_BY them, checked by
  // clang's -Wthread-safety; the others (handles_mutex_, draining_mutex_, mem_mutex_) by the
  // comments.
  mutable detail::annotated_mutex faults_mutex_;
  std::vector<pending_fault> faults_ GPUKIT_GUARDED_BY(faults_mutex_);  // in injection order
  std::atomic<std::size_t> faults_pending_{0};
  // Graph capture (simulated): the captures under way and the events recorded in captures, with
  // their counts for the fast checks. capture_mutex_ nests outside misuse_mutex_ only.
  mutable detail::annotated_mutex capture_mutex_;
  std::vector<detail::sim_graph_capture> captures_ GPUKIT_GUARDED_BY(capture_mutex_);
  std::unordered_map<std::uint64_t, detail::sim_captured_event> captured_events_
    GPUKIT_GUARDED_BY(capture_mutex_);  // by event id
  std::uint64_t next_capture_id_ GPUKIT_GUARDED_BY(capture_mutex_){1};
  std::atomic<int> captures_underway_{0};
  std::atomic<std::size_t> captured_events_count_{0};
  // The first capture a call breaks (id 0: none), for capture_violation's message.
  struct capture_blame {
    std::uint64_t id{0};
    int mode{0};
    bool own{false};  ///< begun by the calling thread
  };
  cudaError_t capture_violation(sim_op op) noexcept;
  // Invalidates each capture that `op`, called from this thread in capture mode `mode`, breaks.
  capture_blame invalidate_captures(sim_op op, int mode) noexcept;
  cudaError_t on_capturing_stream(char const* call, std::uint64_t stream_id);
  cudaError_t on_captured_event(char const* call, std::uint64_t event_id);
  bool capturing(std::uint64_t stream_id) const;
  bool note_captured_work(std::uint64_t stream_id, cudaError_t& err);
  // The capture under way that `stream_id` is part of, or nullptr.
  detail::sim_graph_capture* capture_of(std::uint64_t stream_id) GPUKIT_REQUIRES(capture_mutex_);
  // The capture under way with id `id`, or nullptr.
  detail::sim_graph_capture* capture_by_id(std::uint64_t id) GPUKIT_REQUIRES(capture_mutex_);

  mutable detail::annotated_mutex misuse_mutex_;
  std::string last_misuse_ GPUKIT_GUARDED_BY(misuse_mutex_);
  std::atomic<std::uint64_t> misuse_count_{0};

  mutable std::shared_mutex handles_mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<detail::sim_stream>> streams_;
  std::unordered_map<std::uint64_t, std::shared_ptr<detail::sim_event>> events_;
  std::mutex draining_mutex_;
  std::vector<std::shared_ptr<detail::sim_stream>> draining_;  ///< destroyed, maybe still running

  mutable std::mutex mem_mutex_;
  std::map<std::uintptr_t, detail::sim_allocation> allocations_;
  std::map<std::uintptr_t, std::size_t> host_allocs_;      ///< base -> mapped bytes
  std::map<std::uintptr_t, std::size_t> host_registered_;  ///< base -> bytes
  std::map<std::uintptr_t, std::uint64_t> pinned_for_;     ///< host_alloc/register base -> devices
  std::map<std::uintptr_t, detail::sim_reservation> reservations_;
  std::map<std::uintptr_t, detail::sim_mapping> mappings_;
  std::unordered_map<std::uint64_t, detail::sim_physical> physicals_;
  std::deque<std::uintptr_t> recently_freed_;  ///< bases, for "double free" messages
};

static_assert(is_runtime_v<sim_runtime>);

}  // namespace gpukit

// The bodies: compiled by every includer header-only, once in gpukit::compiled
// (src/sim_runtime.cpp) in compiled mode.
#ifndef GPUKIT_COMPILED_LIBRARY
#include <gpukit/runtime/detail/sim_runtime_impl.hpp>
#endif
