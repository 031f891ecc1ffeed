// SPDX-License-Identifier: Apache-2.0
// gpukit/runtime/contract.hpp: the Runtime contract, declared once.
//
// Quick start:
//
//   #include <gpukit/runtime/contract.hpp>
//
//   #include <cstdio>
//
//   template <class Runtime>
//   class my_pool {
//     static_assert(gpukit::runtime_has_core_v<Runtime>, "my_pool needs the core calls");
//   };
//
//   // Every operation, as data (name, parameters, one line of documentation):
//   void print_contract()
//   {
//   #define PRINT(name, params, doc) std::puts(#name " " #params ": " doc);
//     GPUKIT_RUNTIME_OPS(PRINT)
//   #undef PRINT
//   }
//
// The lists below are the single source of the contract. Each entry is
// `X(name, (parameters), "one-line doc")`; the parameter list is written as a declaration (default
// arguments included) in terms of the runtime's own types `stream_type`, `event_type`,
// `physical_handle` and `ipc_mem_handle`. From them come the trait checks of this header
// (`runtime_has_core_v` and the others), the simulated GPU's operation enum `sim_op` with its names
// (call counters and fault-injection keys), the conformance checks that hold for every operation,
// and the table of docs/runtime_contract.md (rendered by a test that fails when the committed copy
// is stale). Adding an operation means adding one entry here, then implementing it in each runtime.
//
// The operations fall into four capabilities; a component states the ones it uses:
//
//   core     devices, device and pinned host memory, streams, events, copies, host functions
//   vm       virtual memory: reserve addresses, create physical memory, map it, grant access
//   ipc      memory shared with other processes: CUDA IPC handles, shareable physical memory
//   capture  graph-capture awareness: is a stream capturing, the thread's capture mode
//
// Every operation returns the runtime's `error_type`: `success`, or the error, already cleared from
// any last-error slot the platform keeps (so the next call does not see it). Unless its doc says
// otherwise an operation acts on the calling thread's current device, does not block, and may be
// called from any thread.
#pragma once

#include <gpukit/runtime/runtime_types.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

// clang-format off

// ---- core: devices ----------------------------------------------------------------------------
#define GPUKIT_RUNTIME_DEVICE_OPS(X)                                                              \
  X(device_count, (int& n), "n = number of devices")                                              \
  X(get_device, (int& d), "d = the calling thread's current device")                              \
  X(set_device, (int d), "makes d the calling thread's current device")                           \
  X(get_device_properties, (device_properties& p, int d), "fills p for device d")                 \
  X(mem_get_info, (std::size_t& free, std::size_t& total), "free and total bytes of the current device") \
  X(driver_version, (int& v), "driver version (13000 = 13.0); 0 and success without a driver")   \
  X(runtime_version, (int& v), "runtime version the program was built with (13000 = 13.0)")      \
  X(device_synchronize, (), "blocks until the current device is idle")                            \
  X(device_can_access_peer, (int& can, int device, int peer), "can = 1 when device can map peer's memory (0 for itself)") \
  X(device_enable_peer_access, (int peer), "the current device may access peer's memory; peer_access_already_enabled when it may")

// ---- core: device memory ----------------------------------------------------------------------
#define GPUKIT_RUNTIME_MEMORY_OPS(X)                                                              \
  X(malloc, (void** p, std::size_t bytes), "synchronous allocation on the current device")        \
  X(free, (void* p), "frees malloc/malloc_async memory; may synchronize the device")              \
  X(malloc_async, (void** p, std::size_t bytes, stream_type s), "stream-ordered allocation on s") \
  X(free_async, (void* p, stream_type s), "stream-ordered free on s")

// ---- core: pinned host memory -----------------------------------------------------------------
#define GPUKIT_RUNTIME_HOST_OPS(X)                                                                \
  X(host_alloc, (void** p, std::size_t bytes, unsigned flags), "page-locked host memory; flags: host_alloc_flags") \
  X(host_free, (void* p), "frees host_alloc memory; may synchronize every device")                \
  X(host_register, (void* p, std::size_t bytes, unsigned flags), "page-locks a host range; flags: host_register_flags") \
  X(host_unregister, (void* p), "undoes host_register")

// ---- core: streams ----------------------------------------------------------------------------
#define GPUKIT_RUNTIME_STREAM_OPS(X)                                                              \
  X(stream_create, (stream_type& s), "a stream of the current device, non-blocking w.r.t. the null stream") \
  X(stream_destroy, (stream_type s), "returns at once; queued work still runs")                   \
  X(stream_synchronize, (stream_type s), "blocks until s is idle")                                \
  X(stream_query, (stream_type s), "success when s is idle, else not_ready")                      \
  X(stream_wait_event, (stream_type s, event_type e), "later work on s waits for e's capture (any device)") \
  X(stream_get_device, (stream_type s, int& device), "the device s belongs to (null stream: the current device)")

// ---- core: events -----------------------------------------------------------------------------
#define GPUKIT_RUNTIME_EVENT_OPS(X)                                                               \
  X(event_create, (event_type& e, bool timing = false), "an event of the current device; timing ones cost more") \
  X(event_destroy, (event_type e), "returns at once, even with a pending capture")                \
  X(event_record, (event_type e, stream_type s), "captures the work queued on s so far (s of e's device)") \
  X(event_query, (event_type e), "success when the capture completed or e was never recorded, else not_ready") \
  X(event_synchronize, (event_type e), "blocks until e's capture completes")                      \
  X(event_elapsed_time, (float& ms, event_type start, event_type stop), "milliseconds between two completed timing events")

// ---- core: copies and work on streams (stream-ordered) ----------------------------------------
#define GPUKIT_RUNTIME_COPY_OPS(X)                                                                \
  X(memcpy_async, (void* dst, void const* src, std::size_t bytes, memcpy_kind kind, stream_type s), "copies bytes in stream order (pageable host memory may block)") \
  X(memcpy_peer_async, (void* dst, int dst_device, void const* src, int src_device, std::size_t bytes, stream_type s), "copies between two devices' memory in stream order") \
  X(memset_async, (void* dst, int value, std::size_t bytes, stream_type s), "sets bytes of device memory in stream order") \
  X(launch_host_func, (stream_type s, host_fn fn, void* user), "runs fn(user) in stream order; fn must not call the runtime")

// ---- vm: virtual memory -----------------------------------------------------------------------
#define GPUKIT_RUNTIME_VM_OPS(X)                                                                  \
  X(vm_granularity, (std::size_t& g, int device), "minimum mapping granularity of device")        \
  X(vm_reserve, (void** va, std::size_t bytes, std::size_t alignment), "reserves addresses, no memory; alignment 0: the granularity") \
  X(vm_free, (void* va, std::size_t bytes), "frees a whole unmapped reservation")                 \
  X(vm_create, (physical_handle& h, std::size_t bytes, int device, bool shareable = false), "physical memory (granularity multiple); shareable: exportable as a file descriptor") \
  X(vm_release, (physical_handle h), "releases h; its memory is freed once also unmapped")        \
  X(vm_map, (void* va, std::size_t bytes, physical_handle h), "maps the whole of h at va (inaccessible until vm_set_access)") \
  X(vm_unmap, (void* va, std::size_t bytes), "unmaps whole mappings")                             \
  X(vm_set_access, (void* va, std::size_t bytes, int device), "read-write access for device to whole adjacent mappings")

// ---- ipc: memory shared with other processes --------------------------------------------------
#define GPUKIT_RUNTIME_IPC_OPS(X)                                                                 \
  X(vm_export_shareable, (int& fd, physical_handle h), "a new POSIX file descriptor for h (created shareable); the caller closes it") \
  X(vm_import_shareable, (physical_handle& h, int fd), "a handle to the memory fd names; fd stays the caller's") \
  X(ipc_get_mem_handle, (ipc_mem_handle& h, void* p), "a handle naming the malloc allocation holding p (not malloc_async memory)") \
  X(ipc_open_mem_handle, (void** p, ipc_mem_handle h), "in another process: p = the allocation's base, mapped for the current device") \
  X(ipc_close_mem_handle, (void* p), "unmaps what ipc_open_mem_handle returned")

// ---- capture: graph-capture awareness ---------------------------------------------------------
#define GPUKIT_RUNTIME_CAPTURE_OPS(X)                                                             \
  X(stream_is_capturing, (stream_type s, bool& capturing), "whether s is being captured into a graph (legal while capturing)") \
  X(stream_capture_id, (stream_type s, unsigned long long& id), "the capture s takes part in, origin or joined (0: none); legal while capturing") \
  X(exchange_capture_mode, (int& mode), "swaps the thread's capture mode (capture_mode_global, _thread_local, _relaxed)")

// ---- the capabilities -------------------------------------------------------------------------
#define GPUKIT_RUNTIME_CORE_OPS(X)                                                                \
  GPUKIT_RUNTIME_DEVICE_OPS(X) GPUKIT_RUNTIME_MEMORY_OPS(X) GPUKIT_RUNTIME_HOST_OPS(X)             \
  GPUKIT_RUNTIME_STREAM_OPS(X) GPUKIT_RUNTIME_EVENT_OPS(X) GPUKIT_RUNTIME_COPY_OPS(X)

/// Every operation, capability by capability: X(name, (parameters), "doc").
#define GPUKIT_RUNTIME_OPS(X)                                                                     \
  GPUKIT_RUNTIME_CORE_OPS(X) GPUKIT_RUNTIME_VM_OPS(X) GPUKIT_RUNTIME_IPC_OPS(X)                   \
  GPUKIT_RUNTIME_CAPTURE_OPS(X)

/// The sections of the contract, for documentation: X(capability, section title, list macro).
#define GPUKIT_RUNTIME_SECTIONS(X)                                                                \
  X(core, "devices", GPUKIT_RUNTIME_DEVICE_OPS)                                                   \
  X(core, "device memory", GPUKIT_RUNTIME_MEMORY_OPS)                                             \
  X(core, "pinned host memory", GPUKIT_RUNTIME_HOST_OPS)                                          \
  X(core, "streams", GPUKIT_RUNTIME_STREAM_OPS)                                                   \
  X(core, "events", GPUKIT_RUNTIME_EVENT_OPS)                                                     \
  X(core, "copies and work on streams", GPUKIT_RUNTIME_COPY_OPS)                                  \
  X(vm, "virtual memory", GPUKIT_RUNTIME_VM_OPS)                                                  \
  X(ipc, "interprocess memory", GPUKIT_RUNTIME_IPC_OPS)                                           \
  X(capture, "graph capture", GPUKIT_RUNTIME_CAPTURE_OPS)

/// The named error codes every runtime declares as `static constexpr error_type NAME`:
/// X(name, "meaning"). Components compare results with these, never with a platform's values.
#define GPUKIT_RUNTIME_ERRORS(X)                                                                  \
  X(success, "the call succeeded")                                                                \
  X(not_ready, "a query's answer: work is still pending (not an error)")                          \
  X(out_of_memory, "the device (or host, for pinned memory) has no room")                         \
  X(invalid_value, "a bad argument: pointer, size, flags or range")                               \
  X(invalid_device, "a device ordinal out of range")                                              \
  X(invalid_resource_handle, "a dead or foreign stream or event handle")                          \
  X(invalid_memcpy_direction, "an unknown memcpy_kind")                                           \
  X(not_supported, "the device or platform lacks the feature")                                    \
  X(no_device, "no device is present")                                                            \
  X(insufficient_driver, "the driver is missing or older than the runtime")                       \
  X(peer_access_already_enabled, "device_enable_peer_access: already enabled (not an error to callers)") \
  X(peer_access_unsupported, "the two devices cannot access each other's memory")                 \
  X(host_memory_already_registered, "host_register: the range is already page-locked")            \
  X(host_memory_not_registered, "host_unregister: the range was not registered")                  \
  X(stream_capture_unsupported, "the call is not allowed while a stream is captured")             \
  X(stream_capture_invalidated, "the capture was invalidated by a call it does not allow")        \
  X(stream_capture_unmatched, "end of a capture on a stream that did not begin it")               \
  X(stream_capture_unjoined, "a stream forked into the capture was never joined back")            \
  X(stream_capture_isolation, "a dependency between two captures, or a capture and outside work") \
  X(captured_event, "a query or wait of an event last recorded during a capture")                 \
  X(launch_failure, "earlier asynchronous work failed")                                           \
  X(stub_library, "the program loaded the driver's stub library, not a driver")                   \
  X(system_not_ready, "the system is not ready (e.g. fabric manager not running)")                \
  X(system_driver_mismatch, "the kernel driver and user-mode driver versions differ")             \
  X(devices_unavailable, "every device is busy or unavailable (exclusive or prohibited mode)")    \
  X(compat_not_supported_on_device, "forward compatibility is not supported on this device")      \
  X(call_requires_newer_driver, "the call needs a newer driver")                                  \
  X(unknown, "an error the runtime cannot name more precisely")

/// The capture modes of exchange_capture_mode, as `static constexpr int NAME`: X(name, "meaning").
#define GPUKIT_RUNTIME_CAPTURE_MODES(X)                                                           \
  X(capture_mode_global, "calls unsafe during any capture fail (the default)")                    \
  X(capture_mode_thread_local, "calls unsafe during this thread's captures fail")                 \
  X(capture_mode_relaxed, "no call is refused because of a capture")

// clang-format on

/// Declares one operation as a member of a runtime class, `[[nodiscard]]` and returning its
/// `error_type`: `GPUKIT_RUNTIME_OPS(GPUKIT_RUNTIME_DECLARE_OPERATION)` inside the class declares
/// the whole contract (a runtime offering fewer capabilities expands only their lists).
#define GPUKIT_RUNTIME_DECLARE_OPERATION(name, params, doc) [[nodiscard]] error_type name params;

namespace gpukit {

namespace detail {

/// Stands for a handle type a runtime does not declare, so that the checks of a capability it
/// lacks fail quietly instead of failing to compile.
struct runtime_absent_type {};

/// The member types a runtime declares: X(name). `runtime_NAME_of<R>::type` is R::NAME, or
/// runtime_absent_type when R lacks it.
#define GPUKIT_DETAIL_RUNTIME_MEMBER_TYPES(X) \
  X(stream_type) X(event_type) X(error_type) X(physical_handle) X(ipc_mem_handle)

#define GPUKIT_DETAIL_RUNTIME_TYPE_OF(name)                      \
  template <class R, class = void>                               \
  struct runtime_##name##_of {                                   \
    using type = runtime_absent_type;                            \
  };                                                             \
  template <class R>                                             \
  struct runtime_##name##_of<R, std::void_t<typename R::name>> { \
    using type = typename R::name;                               \
  };
GPUKIT_DETAIL_RUNTIME_MEMBER_TYPES(GPUKIT_DETAIL_RUNTIME_TYPE_OF)
#undef GPUKIT_DETAIL_RUNTIME_TYPE_OF
#undef GPUKIT_DETAIL_RUNTIME_MEMBER_TYPES

/// One undefined static member function per operation, declared with the contract's parameter
/// list in terms of the runtime's handle types; `decltype(&signatures::name)` is `void (*)(A...)`.
template <class stream_type, class event_type, class physical_handle, class ipc_mem_handle>
struct runtime_signatures {
#define GPUKIT_DETAIL_RUNTIME_SIGNATURE(name, params, doc) static void name params;
  GPUKIT_RUNTIME_OPS(GPUKIT_DETAIL_RUNTIME_SIGNATURE)
#undef GPUKIT_DETAIL_RUNTIME_SIGNATURE
};

template <class R>
using runtime_signatures_of = runtime_signatures<
  typename runtime_stream_type_of<R>::type, typename runtime_event_type_of<R>::type,
  typename runtime_physical_handle_of<R>::type, typename runtime_ipc_mem_handle_of<R>::type>;

// One detector per operation: `runtime_op_NAME<R, void (*)(A...)>` is true when
// `r.NAME(A...)` compiles and returns R::error_type.
#define GPUKIT_DETAIL_RUNTIME_DETECTOR(name, params, doc)                                        \
  template <class R, class F, class = void>                                                      \
  struct runtime_op_##name : std::false_type {};                                                 \
  template <class R, class... A>                                                                 \
  struct runtime_op_##name<R, void (*)(A...),                                                    \
                           std::void_t<decltype(std::declval<R&>().name(std::declval<A>()...))>> \
      : std::is_same<decltype(std::declval<R&>().name(std::declval<A>()...)),                    \
                     typename runtime_error_type_of<R>::type> {};
GPUKIT_RUNTIME_OPS(GPUKIT_DETAIL_RUNTIME_DETECTOR)
#undef GPUKIT_DETAIL_RUNTIME_DETECTOR

// One detector per named error code and capture mode.
#define GPUKIT_DETAIL_RUNTIME_CONSTANT_DETECTOR(name, doc)             \
  template <class R, class T, class = void>                            \
  struct runtime_constant_##name : std::false_type {};                 \
  template <class R, class T>                                          \
  struct runtime_constant_##name<R, T, std::void_t<decltype(R::name)>> \
      : std::is_convertible<decltype(R::name), T> {};
GPUKIT_RUNTIME_ERRORS(GPUKIT_DETAIL_RUNTIME_CONSTANT_DETECTOR)
GPUKIT_RUNTIME_CAPTURE_MODES(GPUKIT_DETAIL_RUNTIME_CONSTANT_DETECTOR)
#undef GPUKIT_DETAIL_RUNTIME_CONSTANT_DETECTOR

#define GPUKIT_DETAIL_RUNTIME_AND_OP(name, params, doc) \
  &&runtime_op_##name<R, decltype(&runtime_signatures_of<R>::name)>::value
#define GPUKIT_DETAIL_RUNTIME_AND_ERROR(name, doc) \
  &&runtime_constant_##name<R, typename runtime_error_type_of<R>::type>::value
#define GPUKIT_DETAIL_RUNTIME_AND_MODE(name, doc) &&runtime_constant_##name<R, int>::value

/// What every runtime declares besides its operations: the handle and error types, the named
/// error codes, error_name/error_string, is_simulated and instance().
template <class R, class = void>
struct runtime_vocabulary : std::false_type {};
template <class R>
struct runtime_vocabulary<
  R, std::void_t<typename R::stream_type, typename R::event_type, typename R::error_type,
                 decltype(R::is_simulated), decltype(R::instance()),
                 decltype(R::error_name(std::declval<typename R::error_type>())),
                 decltype(R::error_string(std::declval<typename R::error_type>()))>>
    : std::bool_constant<
        std::is_convertible_v<decltype(R::error_name(std::declval<typename R::error_type>())),
                              char const*> &&
        std::is_convertible_v<decltype(R::error_string(std::declval<typename R::error_type>())),
                              char const*>
          GPUKIT_RUNTIME_ERRORS(GPUKIT_DETAIL_RUNTIME_AND_ERROR)> {};

template <class R>
struct runtime_core_ops
    : std::bool_constant<true GPUKIT_RUNTIME_CORE_OPS(GPUKIT_DETAIL_RUNTIME_AND_OP)> {};
template <class R>
struct runtime_vm_ops
    : std::bool_constant<
        !std::is_same_v<typename runtime_physical_handle_of<R>::type, runtime_absent_type>
          GPUKIT_RUNTIME_VM_OPS(GPUKIT_DETAIL_RUNTIME_AND_OP)> {};
template <class R>
struct runtime_ipc_ops
    : std::bool_constant<
        !std::is_same_v<typename runtime_physical_handle_of<R>::type, runtime_absent_type> &&
        !std::is_same_v<typename runtime_ipc_mem_handle_of<R>::type, runtime_absent_type>
          GPUKIT_RUNTIME_IPC_OPS(GPUKIT_DETAIL_RUNTIME_AND_OP)> {};
template <class R>
struct runtime_capture_ops
    : std::bool_constant<true GPUKIT_RUNTIME_CAPTURE_OPS(GPUKIT_DETAIL_RUNTIME_AND_OP)
                           GPUKIT_RUNTIME_CAPTURE_MODES(GPUKIT_DETAIL_RUNTIME_AND_MODE)> {};

#undef GPUKIT_DETAIL_RUNTIME_AND_OP
#undef GPUKIT_DETAIL_RUNTIME_AND_ERROR
#undef GPUKIT_DETAIL_RUNTIME_AND_MODE

}  // namespace detail

/// True when R declares the runtime vocabulary (stream_type, event_type, error_type, the named
/// error codes, error_name, error_string, is_simulated, instance()) and every core operation.
template <class R>
inline constexpr bool runtime_has_core_v =
  std::conjunction_v<detail::runtime_vocabulary<R>, detail::runtime_core_ops<R>>;

/// True when R has the core and declares physical_handle and every virtual-memory operation.
template <class R>
inline constexpr bool runtime_has_vm_v =
  runtime_has_core_v<R>&& std::conjunction_v<detail::runtime_vm_ops<R>>;

/// True when R has the core and declares physical_handle, ipc_mem_handle and every IPC operation.
template <class R>
inline constexpr bool runtime_has_ipc_v =
  runtime_has_core_v<R>&& std::conjunction_v<detail::runtime_ipc_ops<R>>;

/// True when R has the core, the capture modes and every graph-capture operation.
template <class R>
inline constexpr bool runtime_has_capture_v =
  runtime_has_core_v<R>&& std::conjunction_v<detail::runtime_capture_ops<R>>;

/// True when R has every capability: the whole contract.
template <class R>
inline constexpr bool is_runtime_v =
  runtime_has_core_v<R>&& runtime_has_vm_v<R>&& runtime_has_ipc_v<R>&& runtime_has_capture_v<R>;

/// Number of operations in the contract.
inline constexpr std::size_t runtime_op_count = 0
#define GPUKIT_DETAIL_RUNTIME_COUNT(name, params, doc) +1
  GPUKIT_RUNTIME_OPS(GPUKIT_DETAIL_RUNTIME_COUNT)
#undef GPUKIT_DETAIL_RUNTIME_COUNT
  ;

}  // namespace gpukit
