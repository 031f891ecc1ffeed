// SPDX-License-Identifier: Apache-2.0
// gpukit/transfer/transfer_pipeline.hpp: stream-ordered host<->device copies of pinned or
// pageable host memory at the speed of the link.
//
// Quick start:
//
//   #include <gpukit/transfer/transfer_pipeline.hpp>
//
//   #include <exception>
//   #include <vector>
//
//   void run(float* dev, std::vector<float> const& batch, std::vector<float> const& next,
//            cudaStream_t stream)
//   {
//     gpukit::pinned_pool pool{gpukit::cuda_runtime::instance()};
//     gpukit::transfer_pipeline pipe{gpukit::cuda_runtime::instance(), pool};  // 4 MiB chunks
//     pipe.prewarm();  // pin the staging rings now, not mid-loop
//
//     std::size_t const bytes = batch.size() * sizeof(float);  // ordinary (pageable) memory
//     pipe.copy_to_device_async(dev, batch.data(), bytes, stream);  // staged by host threads
//     // kernel<<<grid, block, 0, stream>>>(dev);  // ordered after the copy by an event
//     std::vector<float> out(batch.size());
//     pipe.copy_to_host_async(out.data(), dev, bytes, stream);  // out is complete on return
//
//     pipe.submit_to_device(dev, next.data(), bytes, gpukit::host_memory::detect, stream,
//                           [](std::exception_ptr) { /* staged: next may be reused */ });
//   }
//
// ## Why, and how
//
// `cudaMemcpyAsync` from pageable memory runs at 7.8 GB/s on the H200 host where the link does
// 55 GB/s from pinned memory: the driver stages through a small pinned buffer with one thread.
// The pipeline stages pageable data through a ring of pinned chunks (from a basic_pinned_pool),
// filled by several host threads (a small thread pool the pipeline owns, plus the calling thread)
// while the copy engine copies the chunks already filled. Each direction has its own copy stream
// and ring, so a host-to-device and a device-to-host transfer run at once on the two copy engines.
//
// - Stream order: a transfer starts after the work submitted to `stream` before the call (an
//   event recorded on `stream`, waited on by the copy stream) and work submitted to `stream` after
//   the call starts after the transfer (an event recorded on the copy stream, waited on by
//   `stream`). Never a device-wide synchronization.
// - A staging chunk is refilled only once the copy from it has completed: the staging thread waits
//   on that chunk's event (event_synchronize), never inside a host function on a stream.
// - Pinned host memory (memory of the pool, or marked host_memory::pinned) bypasses staging: one
//   memcpy_async on `stream`.
// - Several GPUs: a pipeline serves one device (`transfer_options::device`): its copy streams,
//   events and staging threads belong to that device, and every call acts on it whatever device
//   the calling thread has current (the null stream is that device's). Use one pipeline per
//   device; they may share one pinned pool (its memory is pinned for every device).
// - Between devices, `copy_peer_async` copies device memory of one GPU to another in `stream`
//   order (cudaMemcpyPeerAsync), after enabling peer access from the pipeline's device once
//   (over NVLink or PCIe, no host staging) where the devices allow it.
//
// - submit_to_device / submit_to_host return before staging: the staging threads stage the data,
//   and the thread that finishes the transfer hands it to `stream` and calls a completion. So one
//   thread can keep several transfers queued (the prefetcher keeps the next batch staging while
//   the current one's last chunks are copied), and no staging thread idles at a transfer's end.
//   The staging threads claim chunks of the oldest transfer of each direction first, alternating
//   between the directions: transfers of one direction complete in the order they were started.
//
// Every member is thread-safe; transfers from several threads share the staging threads.
#pragma once

#include <gpukit/detail/thread_annotations.hpp>
#include <gpukit/error.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/detail/compiled_runtimes.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace gpukit {

/// What kind of host memory a transfer reads or writes.
enum class host_memory {
  detect,    ///< pinned when the pipeline's pinned pool owns it, else pageable
  pageable,  ///< staged through pinned chunks
  pinned,    ///< page-locked (pool, cudaHostAlloc or cudaHostRegister): copied directly
};

/// How staging threads copy between user memory and staging chunks.
enum class staging_copy {
  memcpy,  ///< std::memcpy (glibc switches to non-temporal stores above a cache-size threshold)
  nontemporal,  ///< streaming (non-temporal) stores on x86-64: the destination's cache lines are
                ///< not read first, a third less memory traffic; std::memcpy elsewhere
};

/// Settings of a transfer pipeline. The defaults follow the H200 host: host memcpy peaks at about
/// 12 threads of 16 vCPUs, and a staging sweep there (512 MiB pageable host to device; the runs
/// are under benchmarks/results/) put 4 MiB fixed chunks first: 48.3-49.3 GB/s at 8-12 threads,
/// against 36-41 GB/s with 16 MiB chunks.
/// benchmarks/transfer/transfer_bench takes every knob on its command line (--help).
struct transfer_options {
  /// Bytes of one staging chunk (rounded up to 4 KiB): the most one thread copies at once.
  std::size_t chunk_bytes{std::size_t{4} << 20};
  /// Host threads copying to and from staging chunks, the calling thread included (the pipeline
  /// starts staging_threads - 1 of its own). 0: min(12, hardware threads).
  int staging_threads{0};
  /// Chunks in each direction's ring; 0: staging_threads + 2.
  std::size_t ring_chunks{0};
  /// Guided scheduling: a thread claims min(chunk_bytes, what is left / staging_threads), but at
  /// least this much (rounded up to 64 KiB), so that pieces shrink as a transfer ends and the
  /// threads finish together; it pays with large chunks (a last 16 MiB chunk alone takes about
  /// 4 ms of one thread on the H200 host). 0 (the default: with 4 MiB chunks the tail is short
  /// and fixed chunks measured 1-2% faster), or chunk_bytes or more: fixed chunks.
  std::size_t min_piece_bytes{0};
  /// How staging threads copy (see staging_copy).
  staging_copy copy{staging_copy::memcpy};
  /// The device whose copy streams the pipeline creates.
  int device{0};
};

/// Counters of a transfer pipeline (relaxed: exact once transfers have returned).
struct transfer_stats {
  std::uint64_t transfers{0};       ///< copy_* calls and submit_* transfers that succeeded
  std::uint64_t h2d_bytes{0};       ///< bytes copied host to device
  std::uint64_t d2h_bytes{0};       ///< bytes copied device to host
  std::uint64_t staged_bytes{0};    ///< bytes that went through staging chunks
  std::uint64_t direct_bytes{0};    ///< bytes copied from or to pinned memory directly
  std::uint64_t chunks{0};          ///< staging chunks (pieces) copied
  std::uint64_t chunk_waits{0};     ///< chunk refills that found the previous copy still pending
  std::uint64_t staging_chunks{0};  ///< staging chunks held from the pinned pool (both rings)
  std::uint64_t peer_bytes{0};      ///< bytes copied between two devices (copy_peer_async)
  std::uint64_t peer_copies{0};     ///< copy_peer_async calls between two devices
};

/// A transfer pipeline over a Runtime (see the top of this header). Not copyable or movable.
template <class Runtime>
class basic_transfer_pipeline final {
 public:
  using runtime_type = Runtime;
  /// Transfers are ordered after, and before, the work of the caller's stream of this type.
  using stream_type = typename Runtime::stream_type;
  using event_type  = typename Runtime::event_type;  ///< the hand-offs between streams

  /// Creates the two copy streams on options.device and starts staging_threads - 1 threads.
  /// Pins nothing yet (see prewarm). `pool` may be destroyed first, whatever the declaration
  /// order: its destructor first waits for the transfers under way (submitted ones until their
  /// completion has returned) and for the copies from the staging chunks (it synchronizes the two
  /// copy streams), then frees the chunks; the pipeline's destructor returns nothing, and
  /// transfers and prewarm throw gpukit::logic_error from then on.
  /// @throws gpukit::logic_error when chunk_bytes is 0 or staging_threads is negative
  /// @throws gpukit::cuda_error when a stream cannot be created
  basic_transfer_pipeline(Runtime& runtime, basic_pinned_pool<Runtime>& pool,
                          transfer_options options = {});
  /// Stops the staging threads, returns the staging chunks to the pool (each after its last copy,
  /// with an event: no wait; nothing when the pool is gone) and destroys the copy streams. Never
  /// throws.
  ~basic_transfer_pipeline();
  // Neither copyable nor movable (deleted copies leave no implicit moves).
  basic_transfer_pipeline(basic_transfer_pipeline const&)            = delete;
  basic_transfer_pipeline& operator=(basic_transfer_pipeline const&) = delete;

  /// Copies `bytes` from host `src` to device `dst`, in `stream` order (see the top of this
  /// header). Pinned `src`: enqueues one copy on `stream` and returns at once. Pageable `src`:
  /// returns once every chunk has been staged and its copy enqueued (src may then be reused);
  /// the calling thread helps staging and may wait for the pipeline's own chunk copies to finish
  /// (never for the device, never for other streams).
  /// @param dst device memory of at least `bytes`
  /// @param src host memory
  /// @param bytes how many bytes to copy
  /// @param src_kind what src is (host_memory::detect asks the pinned pool)
  /// @param stream the consumer: its earlier work precedes the copy, its later work follows it
  /// @throws gpukit::logic_error for null pointers, zero bytes, a range that wraps around the
  ///         address space, overlapping src and dst, or a stream of another device than the
  ///         pipeline's (nothing is copied)
  /// @throws gpukit::cuda_error when a runtime call fails (copies enqueued before it still run
  ///         before `stream`'s later work; the staging chunks stay in the ring: nothing leaks)
  /// @throws gpukit::bad_alloc / gpukit::cuda_error when a staging chunk cannot be pinned
  void copy_to_device_async(void* dst, void const* src, std::size_t bytes, host_memory src_kind,
                            stream_type stream);
  /// As above with host_memory::detect.
  void copy_to_device_async(void* dst, void const* src, std::size_t bytes, stream_type stream)
  {
    copy_to_device_async(dst, src, bytes, host_memory::detect, stream);
  }

  /// Copies `bytes` from device `src` to host `dst`, in `stream` order. Pinned `dst`: enqueues one
  /// copy on `stream` and returns at once (dst is complete when `stream` reaches it). Pageable
  /// `dst`: returns when dst is complete, as cudaMemcpyAsync to pageable memory does: it waits
  /// for `stream`'s earlier work and the pipeline's own copies, never for the device.
  /// Parameters and errors as copy_to_device_async.
  void copy_to_host_async(void* dst, void const* src, std::size_t bytes, host_memory dst_kind,
                          stream_type stream);
  /// As above with host_memory::detect.
  void copy_to_host_async(void* dst, void const* src, std::size_t bytes, stream_type stream)
  {
    copy_to_host_async(dst, src, bytes, host_memory::detect, stream);
  }

  /// What a submitted transfer calls once it is over: with nullptr when `stream` has been made to
  /// wait for the copy (host to device: the source may be reused; device to host: the
  /// destination is complete), else with the error (what was enqueued before it still precedes
  /// `stream`'s later work). Runs on a staging thread, or on the calling thread (see
  /// submit_to_device); must not throw or destroy the pipeline.
  using completion = std::function<void(std::exception_ptr)>;

  /// copy_to_device_async without waiting for the staging: returns once the transfer is queued,
  /// and `done` runs exactly once, when it is over (see completion). The source must stay valid
  /// and unchanged until then. Pinned `src` (one memcpy_async on `stream`), or a pipeline without
  /// staging threads of its own (staging_threads 1), copies before returning and calls `done` on
  /// the calling thread. The destructor waits for submitted transfers.
  /// @throws as copy_to_device_async for bad input, a stream of another device, or when the copy
  ///         cannot be started; then `done` is not called. Failures while staging go to `done`.
  void submit_to_device(void* dst, void const* src, std::size_t bytes, host_memory src_kind,
                        stream_type stream, completion done);
  /// copy_to_host_async without waiting: as submit_to_device; `dst` is complete when `done` runs
  /// with nullptr (pinned `dst`: when `stream` reaches the copy).
  void submit_to_host(void* dst, void const* src, std::size_t bytes, host_memory dst_kind,
                      stream_type stream, completion done);

  /// Copies `bytes` of device memory from `src` on `src_device` to `dst` on `dst_device`, in
  /// `stream` order (one cudaMemcpyPeerAsync on `stream`; returns at once). The pipeline's device
  /// must be one of the two, and `stream` must belong to it. The first copy to or from each other
  /// device enables peer access from the pipeline's device to it (device_enable_peer_access) when
  /// device_can_access_peer says it can; otherwise CUDA stages the copy through host memory.
  /// src_device == dst_device: an ordinary device-to-device copy.
  /// @throws gpukit::logic_error for null pointers, zero bytes, a device that does not exist,
  ///         neither device being the pipeline's, overlapping ranges on one device, or a stream of
  ///         another device (nothing is copied)
  /// @throws gpukit::cuda_error when the copy cannot be enqueued (e.g. a pointer that is not
  ///         memory of the device given for it)
  void copy_peer_async(void* dst, int dst_device, void const* src, int src_device,
                       std::size_t bytes, stream_type stream);

  /// Pins every staging chunk of both rings now (pool.prewarm): the first transfers then pin
  /// nothing. Blocks while pages are pinned. Throws as basic_pinned_pool::prewarm.
  void prewarm();

  /// The copy streams (host to device, device to host). For tests and profiling: submitting work
  /// to them delays transfers.
  [[nodiscard]] stream_type h2d_stream() const noexcept { return streams_[0]; }
  [[nodiscard]] stream_type d2h_stream() const noexcept { return streams_[1]; }
  /// Counters so far.
  [[nodiscard]] transfer_stats stats() const;
  /// Options in effect (defaults resolved).
  [[nodiscard]] transfer_options const& options() const noexcept { return options_; }
  [[nodiscard]] Runtime& runtime() const noexcept { return runtime_; }
  [[nodiscard]] basic_pinned_pool<Runtime>& pool() const noexcept { return pool_; }
  /// Whether this pipeline still exists, readable after it is gone: a prefetcher keeps it so that
  /// it may be destroyed after the pipeline (gpukit/detail/lifetime.hpp). Not public API.
  [[nodiscard]] detail::lifetime_token lifetime() const noexcept { return lifetime_.token(); }

 private:
  static_assert(runtime_has_core_v<Runtime>,
                "basic_transfer_pipeline needs a Runtime with the core operations "
                "(gpukit/runtime/contract.hpp)");

  struct slot;
  struct ring;
  struct job;

  /// The two copy streams, on the pipeline's device (the constructor's).
  void create_copy_streams();
  /// Run when the pool is being destroyed: refuses later transfers, waits for those under way and
  /// for the copies on both streams (pool_life_'s expiry callback).
  void drain_for_pool();
  void check_copy(char const* call, char const* dst_name, void const* dst, char const* src_name,
                  void const* src, std::size_t bytes, bool may_overlap) const;
  void check_stream(char const* call, stream_type stream);
  /// done == nullptr: copy_to_*_async; else submit_to_* with *done.
  void transfer(int dir, char* device, char* host, std::size_t bytes, host_memory kind,
                stream_type stream, completion* done);
  /// transfer's checks of its arguments (no runtime call), with messages naming `call`.
  void check_transfer(char const* call, int dir, char* device, char* host, std::size_t bytes,
                      completion const* done) const;
  /// One memcpy_async on `stream` (pinned host memory): no staging.
  void copy_direct(int dir, char* device, char* host, std::size_t bytes, stream_type stream);
  /// Hands a submitted transfer to the staging threads; the one finishing it calls `done`.
  void queue_submitted(int dir, char* device, char* host, std::size_t bytes, stream_type stream,
                       completion done);
  /// Makes `waiter`'s later work wait for `producer`'s work so far (a pooled event).
  void order_after(stream_type waiter, stream_type producer);
  // A job's claim state (job::next, inflight, failed, error) is read and written holding
  // jobs_mutex_ too: by claim, finish_chunk and run_job, which the analysis checks hold it.
  void run_job(job& j) GPUKIT_EXCLUDES(jobs_mutex_);
  void worker_loop() GPUKIT_EXCLUDES(jobs_mutex_);
  /// The job whose chunk to claim next (jobs_ not empty).
  job* pick_job() GPUKIT_REQUIRES(jobs_mutex_);
  bool claim(job& j, std::size_t& offset, std::size_t& bytes) GPUKIT_REQUIRES(jobs_mutex_);
  /// True when it completed a submitted job: the caller then calls complete_submitted, unlocked.
  bool finish_chunk(job& j, std::exception_ptr error) GPUKIT_REQUIRES(jobs_mutex_);
  /// Copies the claimed chunk [offset, offset + bytes) of `j` with jobs_mutex_ released (held on
  /// entry and on return), then finish_chunk: true when the job is complete.
  bool copy_claimed(job& j, std::size_t offset, std::size_t bytes) GPUKIT_REQUIRES(jobs_mutex_);
  void complete_submitted(job* j) noexcept GPUKIT_EXCLUDES(jobs_mutex_);
  /// Makes `stream` wait for the copy stream of `dir` (also after `error`: what was enqueued
  /// precedes the stream's later work) and counts the transfer if nothing failed. Returns
  /// `error`, or the hand-off's own.
  std::exception_ptr hand_off(int dir, stream_type stream, std::size_t bytes,
                              std::exception_ptr error) noexcept;
  void count_transfer(int dir, std::size_t bytes) noexcept;
  void do_chunk(job& j, std::size_t offset, std::size_t bytes);
  void copy_host(void* dst, void const* src, std::size_t bytes) const noexcept;
  slot* acquire_slot(ring& r);
  slot* create_slot(ring& r);
  void release_slot(ring& r, slot* s, bool usable);
  event_type take_event() GPUKIT_EXCLUDES(events_mutex_);
  void give_event(event_type e) noexcept GPUKIT_EXCLUDES(events_mutex_);

  /// @throws gpukit::logic_error naming `call` when the pool was destroyed
  void expect_pool(char const* call) const;

  Runtime& runtime_;
  basic_pinned_pool<Runtime>& pool_;
  detail::lifetime_token pool_life_;  // pool_'s: whether it may still be called
  transfer_options options_;
  stream_type streams_[2]{};  ///< [0] host to device, [1] device to host
  std::unique_ptr<ring> rings_[2];

  // Guarded by their mutexes as declared (clang's -Wthread-safety checks it).
  detail::annotated_mutex jobs_mutex_;
  std::condition_variable jobs_cv_;  ///< workers wait here for chunks to claim
  std::condition_variable done_cv_;  ///< callers wait here for their jobs, the destructor for
                                     ///< submitted ones
  /// Jobs with chunks left to claim, oldest first.
  std::vector<job*> jobs_ GPUKIT_GUARDED_BY(jobs_mutex_);
  /// Alternates the direction served first.
  std::size_t next_job_ GPUKIT_GUARDED_BY(jobs_mutex_){0};
  /// Submitted jobs whose completion has not returned.
  std::size_t submitted_ GPUKIT_GUARDED_BY(jobs_mutex_){0};
  /// transfer() calls that have not returned.
  std::size_t in_flight_ GPUKIT_GUARDED_BY(jobs_mutex_){0};
  /// The pool is being destroyed: transfers are refused.
  bool pool_gone_ GPUKIT_GUARDED_BY(jobs_mutex_){false};
  bool stopping_ GPUKIT_GUARDED_BY(jobs_mutex_){false};
  std::vector<std::thread> workers_;  ///< started by the constructor, joined by the destructor

  detail::annotated_mutex events_mutex_;
  std::vector<event_type> spare_events_ GPUKIT_GUARDED_BY(events_mutex_);
  int device_count_{0};  ///< devices on the machine (read once, for copy_peer_async's checks)
  /// Per device: whether peer access from the pipeline's device was asked for (and enabled where
  /// the devices can peer).
  std::vector<char> peer_asked_ GPUKIT_GUARDED_BY(events_mutex_);

  std::atomic<std::uint64_t> transfers_{0}, h2d_bytes_{0}, d2h_bytes_{0}, staged_bytes_{0},
    direct_bytes_{0}, chunks_{0}, chunk_waits_{0}, peer_bytes_{0}, peer_copies_{0};
  // Expired first thing in the destructor: a prefetcher's callback stops its loader first.
  detail::lifetime_registration lifetime_;
};

/// The transfer pipeline over the CUDA runtime.
using transfer_pipeline = basic_transfer_pipeline<cuda_runtime>;

}  // namespace gpukit

#include <gpukit/transfer/detail/transfer_pipeline_impl.hpp>

GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_transfer_pipeline<gpukit::cuda_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_transfer_pipeline<gpukit::sim_runtime>);
