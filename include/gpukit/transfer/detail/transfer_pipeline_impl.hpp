// SPDX-License-Identifier: Apache-2.0
// gpukit/transfer/detail/transfer_pipeline_impl.hpp: the bodies of gpukit::basic_transfer_pipeline.
// Not public API.
//
// A transfer is a job of chunks. The calling thread publishes it (when it has more than one chunk)
// to the staging threads, then claims chunks itself; every thread claims chunks of the published
// jobs round robin, so that a host-to-device and a device-to-host transfer progress together.
// Chunks are claimed by offset: chunk_bytes each, shrinking toward min_piece_bytes as the job
// ends (guided scheduling), so that no thread is left copying one last full chunk alone.
// Staging a chunk takes a slot (a pinned chunk and its event) from the direction's ring:
//   host to device: wait for the slot's last copy (event), memcpy into it, memcpy_async from it,
//                   record the slot's event, put the slot back;
//   device to host: memcpy_async into it, record its event, wait for it, memcpy out, put it back.
// The caller waits until every claimed chunk is done, then hands the copy stream's progress to the
// consumer stream with an event. A submitted job (submit_to_*) lives on the heap and the caller
// does not wait or claim: the staging thread whose chunk completes it hands it off and calls its
// completion.
#pragma once

#include <gpukit/error_macros.hpp>
#include <gpukit/transfer/detail/nontemporal_copy.hpp>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace gpukit {

template <class Runtime>
struct basic_transfer_pipeline<Runtime>::slot {
  void* buf{nullptr};
  event_type ev{};
  bool recorded{false};  ///< ev captures the last copy from or to buf
};

template <class Runtime>
struct basic_transfer_pipeline<Runtime>::ring {
  detail::annotated_mutex mutex;
  std::condition_variable cv;
  std::vector<std::unique_ptr<slot>> slots GPUKIT_GUARDED_BY(mutex);  ///< every slot held
  /// Oldest first: its copy is the likeliest done.
  std::deque<slot*> free GPUKIT_GUARDED_BY(mutex);
  std::size_t creating GPUKIT_GUARDED_BY(mutex){0};  ///< slots being pinned outside the lock
  std::size_t capacity{0};                           ///< set by the constructor, read-only after
};

template <class Runtime>
struct basic_transfer_pipeline<Runtime>::job {
  job(int d, char* dev, char* h, std::size_t n) noexcept : dir{d}, device{dev}, host{h}, bytes{n} {}

  int dir{0};
  char* device{nullptr};
  char* host{nullptr};
  std::size_t bytes{0};
  // read and written holding the pipeline's jobs_mutex_ (by members that require it: a nested
  // struct cannot name it in GPUKIT_GUARDED_BY)
  std::size_t next{0};  ///< bytes claimed so far (the next chunk's offset)
  std::size_t inflight{0};
  bool failed{false};
  std::exception_ptr error;
  // submitted jobs only
  stream_type stream{};
  completion done;
};

namespace detail {

/// `o` checked, with its zeros (staging_threads, ring_chunks, min_piece_bytes) replaced by their
/// defaults and its sizes rounded up (chunks to 4 KiB, pieces to 64 KiB).
/// @throws gpukit::logic_error for a chunk_bytes of 0, negative staging_threads or an unknown copy
inline transfer_options resolve_transfer_options(transfer_options o)
{
  GPUKIT_EXPECTS(o.chunk_bytes != 0, "transfer_pipeline: chunk_bytes is 0");
  GPUKIT_EXPECTS(o.staging_threads >= 0,
                 "transfer_pipeline: staging_threads is " + std::to_string(o.staging_threads));
  if (o.staging_threads == 0) {
    int const hw      = static_cast<int>(std::thread::hardware_concurrency());
    o.staging_threads = std::max(1, std::min(12, hw));
  }
  GPUKIT_EXPECTS(
    o.copy == staging_copy::memcpy || o.copy == staging_copy::nontemporal,
    "transfer_pipeline: unknown staging_copy " + std::to_string(static_cast<int>(o.copy)));
  o.chunk_bytes = (o.chunk_bytes + 4095) & ~std::size_t{4095};
  o.min_piece_bytes =
    o.min_piece_bytes == 0
      ? o.chunk_bytes
      : std::min((o.min_piece_bytes + 65535) & ~std::size_t{65535}, o.chunk_bytes);
  if (o.ring_chunks == 0) { o.ring_chunks = static_cast<std::size_t>(o.staging_threads) + 2; }
  return o;
}

}  // namespace detail

template <class Runtime>
basic_transfer_pipeline<Runtime>::basic_transfer_pipeline(Runtime& runtime,
                                                          basic_pinned_pool<Runtime>& pool,
                                                          transfer_options options)
    : runtime_{runtime}, pool_{pool}, pool_life_{pool.lifetime()}, options_{options}
{
  options_ = detail::resolve_transfer_options(options_);
  for (auto& r : rings_) {
    r           = std::make_unique<ring>();
    r->capacity = options_.ring_chunks;
  }
  GPUKIT_CUDA_TRY(runtime_.device_count(device_count_));
  peer_asked_.assign(static_cast<std::size_t>(device_count_), 0);
  create_copy_streams();
  try {
    for (int i = 1; i < options_.staging_threads; ++i) {
      workers_.emplace_back([this] { worker_loop(); });
    }
    // Should the pool go first, the transfers under way must end, and the copies from its chunks
    // be over, before it frees them; later transfers are refused. The callback runs under the
    // pool's lifetime lock, while the copy streams still exist (the destructor takes it back
    // before destroying them).
    (void)pool_life_.on_expire(this, [this] { drain_for_pool(); });
  } catch (...) {
    {
      detail::pool_lock lock{jobs_mutex_};
      stopping_ = true;
    }
    jobs_cv_.notify_all();
    for (auto& t : workers_) { t.join(); }
    (void)runtime_.stream_destroy(streams_[0]);
    (void)runtime_.stream_destroy(streams_[1]);
    throw;
  }
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::create_copy_streams()
{
  device_guard<Runtime> guard{runtime_, options_.device};
  GPUKIT_CUDA_TRY(runtime_.stream_create(streams_[0]));
  typename Runtime::error_type const e = runtime_.stream_create(streams_[1]);
  if (e != Runtime::success) {
    (void)runtime_.stream_destroy(streams_[0]);
    GPUKIT_CUDA_TRY(e, "stream_create(device-to-host copy stream)");
  }
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::drain_for_pool()
{
  {
    detail::pool_lock lock{jobs_mutex_};
    pool_gone_ = true;
    while (in_flight_ != 0 || submitted_ != 0) { detail::wait(done_cv_, jobs_mutex_); }
  }
  for (stream_type s : streams_) {
    typename Runtime::error_type const e = runtime_.stream_synchronize(s);
    if (e != Runtime::success) {
      std::fprintf(stderr,
                   "gpukit: transfer_pipeline: waiting for the copies of a pool being "
                   "destroyed: %s\n",
                   Runtime::error_string(e));
    }
  }
}

template <class Runtime>
basic_transfer_pipeline<Runtime>::~basic_transfer_pipeline()
{
  lifetime_.expire();  // first: a prefetcher using this pipeline stops submitting
  {
    detail::pool_lock lock{jobs_mutex_};
    while (submitted_ != 0) { detail::wait(done_cv_, jobs_mutex_); }  // their completions returned
    stopping_ = true;
  }
  jobs_cv_.notify_all();
  for (auto& t : workers_) { t.join(); }
  // The chunks go back while the pool lives (its destructor waits meanwhile); when it is gone, it
  // freed them after the copies from them (see the constructor's on_expire).
  try {
    (void)pool_life_.with_alive([this] {
      for (int dir = 0; dir < 2; ++dir) {
        ring& r = *rings_[dir];
        detail::pool_lock lock{r.mutex};  // uncontended: the staging threads have ended
        for (auto& s : r.slots) {
          try {
            if (s->recorded) {
              pool_.deallocate_async(s->buf, streams_[dir]);  // reused after its last copy
            } else {
              pool_.deallocate(s->buf);
            }
          } catch (...) {
            assert(false && "transfer_pipeline: returning a staging chunk failed");
          }
        }
      }
    });
  } catch (std::exception const& e) {  // the lock: the chunks stay the pool's, freed with it
    std::fprintf(stderr, "gpukit: transfer_pipeline: returning the staging chunks: %s\n", e.what());
  }
  pool_life_.forget_on_expire(this);
  for (int dir = 0; dir < 2; ++dir) {
    for (auto& s : rings_[dir]->slots) {
      GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_destroy(s->ev));
    }
  }
  for (auto e : spare_events_) { GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.event_destroy(e)); }
  GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.stream_destroy(streams_[0]));
  GPUKIT_ASSERT_CUDA_SUCCESS(runtime_.stream_destroy(streams_[1]));
}

template <class Runtime>
typename basic_transfer_pipeline<Runtime>::event_type basic_transfer_pipeline<Runtime>::take_event()
{
  {
    detail::pool_lock lock{events_mutex_};
    if (!spare_events_.empty()) {
      event_type e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
  }
  event_type e{};  // on the pipeline's device: transfer(), the only caller, made it current
  GPUKIT_CUDA_TRY(runtime_.event_create(e, false));
  return e;
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::give_event(event_type e) noexcept
{
  detail::pool_lock lock{events_mutex_};
  try {
    spare_events_.push_back(e);
  } catch (...) {
    (void)runtime_.event_destroy(e);
  }
}

template <class Runtime>
typename basic_transfer_pipeline<Runtime>::slot* basic_transfer_pipeline<Runtime>::acquire_slot(
  ring& r)
{
  slot* s   = nullptr;  // a free slot, else one is to be created
  bool done = false;    // s's last copy is over
  {
    detail::pool_lock lock{r.mutex};
    for (;;) {
      bool const can_grow = r.slots.size() + r.creating < r.capacity;
      if (!r.free.empty()) {
        slot* oldest = r.free.front();
        // A new chunk rather than waiting for the oldest one's copy, while the ring may grow.
        done = !oldest->recorded || runtime_.event_query(oldest->ev) != Runtime::not_ready;
        if (done || !can_grow) {
          r.free.pop_front();
          s = oldest;
          break;
        }
      }
      if (can_grow) {
        ++r.creating;
        break;
      }
      detail::wait(r.cv, r.mutex);
    }
  }
  if (s != nullptr) {
    if (!done) { chunk_waits_.fetch_add(1, std::memory_order_relaxed); }
    typename Runtime::error_type const w =
      s->recorded ? runtime_.event_synchronize(s->ev)  // that chunk's copy: never the device
                  : Runtime::success;
    if (w != Runtime::success) {
      {
        detail::pool_lock lock{r.mutex};
        r.free.push_front(s);
      }
      r.cv.notify_one();
      GPUKIT_CUDA_TRY(w, "event_synchronize(staging chunk)");
    }
    return s;
  }
  return create_slot(r);
}

// A new slot for ring `r`, whose `creating` count the caller raised (lowered here either way).
template <class Runtime>
typename basic_transfer_pipeline<Runtime>::slot* basic_transfer_pipeline<Runtime>::create_slot(
  ring& r)
{
  auto fresh = std::make_unique<slot>();
  try {
    fresh->buf = pool_.allocate(options_.chunk_bytes);
    device_guard<Runtime> guard{runtime_, options_.device};  // recorded on the copy streams
    GPUKIT_CUDA_TRY(runtime_.event_create(fresh->ev, false));
  } catch (...) {
    if (fresh->buf != nullptr) { pool_.deallocate(fresh->buf); }
    {
      detail::pool_lock lock{r.mutex};
      --r.creating;
    }
    r.cv.notify_one();
    throw;
  }
  detail::pool_lock lock{r.mutex};
  --r.creating;
  slot* s = fresh.get();
  r.slots.push_back(std::move(fresh));
  return s;
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::release_slot(ring& r, slot* s, bool usable)
{
  if (usable) {
    {
      detail::pool_lock lock{r.mutex};
      r.free.push_back(s);
    }
    r.cv.notify_one();
    return;
  }
  // A copy from or to it was enqueued but no event captures it: hand it back to the pool with the
  // copy stream, which records one, and forget the slot.
  int const dir = (&r == rings_[0].get()) ? 0 : 1;
  std::unique_ptr<slot> owned;
  {
    detail::pool_lock lock{r.mutex};
    auto it = std::find_if(r.slots.begin(), r.slots.end(),
                           [s](std::unique_ptr<slot> const& p) { return p.get() == s; });
    owned   = std::move(*it);
    r.slots.erase(it);
  }
  r.cv.notify_one();
  try {
    pool_.deallocate_async(owned->buf, streams_[dir]);
  } catch (...) {  // the buffer stays handed out: lost to this pool, never reused early
  }
  (void)runtime_.event_destroy(owned->ev);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::copy_host(void* dst, void const* src,
                                                 std::size_t bytes) const noexcept
{
  if (options_.copy == staging_copy::nontemporal) {
    detail::copy_nontemporal(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::do_chunk(job& j, std::size_t off, std::size_t n)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGEF(categories::transfer, "%s chunk %.2f MiB at offset %zu",
                                 j.dir == 0 ? "H2D" : "D2H", detail::mib(n), off);
  ring& r              = *rings_[j.dir];
  stream_type const cs = streams_[j.dir];
  slot* s              = acquire_slot(r);
  bool usable          = true;
  try {
    if (j.dir == 0) {
      copy_host(s->buf, j.host + off, n);
      GPUKIT_CUDA_TRY(
        runtime_.memcpy_async(j.device + off, s->buf, n, memcpy_kind::host_to_device, cs));
      usable = false;
      GPUKIT_CUDA_TRY(runtime_.event_record(s->ev, cs));
      s->recorded = true;
      usable      = true;
    } else {
      GPUKIT_CUDA_TRY(
        runtime_.memcpy_async(s->buf, j.device + off, n, memcpy_kind::device_to_host, cs));
      usable = false;
      GPUKIT_CUDA_TRY(runtime_.event_record(s->ev, cs));
      s->recorded = true;
      usable      = true;
      GPUKIT_CUDA_TRY(runtime_.event_synchronize(s->ev));  // this chunk's copy only
      copy_host(j.host + off, s->buf, n);
    }
  } catch (...) {
    release_slot(r, s, usable);
    throw;
  }
  release_slot(r, s, true);
  chunks_.fetch_add(1, std::memory_order_relaxed);
  staged_bytes_.fetch_add(n, std::memory_order_relaxed);
}

template <class Runtime>
typename basic_transfer_pipeline<Runtime>::job* basic_transfer_pipeline<Runtime>::pick_job()
{
  // The oldest job of one direction, the directions taking turns: a transfer's chunks go before a
  // later one's, and both directions progress.
  int const dir = static_cast<int>(next_job_++ & 1);
  for (job* j : jobs_) {
    if (j->dir == dir) { return j; }
  }
  return jobs_.front();
}

template <class Runtime>
bool basic_transfer_pipeline<Runtime>::claim(job& j, std::size_t& offset, std::size_t& bytes)
{
  if (j.failed || j.next >= j.bytes) { return false; }
  std::size_t const left  = j.bytes - j.next;
  std::size_t const chunk = options_.chunk_bytes;
  std::size_t n           = chunk;
  if (options_.min_piece_bytes < chunk) {  // guided: a thread's share of what is left
    std::size_t const share = left / static_cast<std::size_t>(options_.staging_threads);
    n = std::clamp((share + 65535) & ~std::size_t{65535}, options_.min_piece_bytes, chunk);
    if (left - std::min(n, left) < options_.min_piece_bytes && left <= chunk) { n = left; }
  }
  offset = j.next;
  bytes  = std::min(n, left);
  j.next += bytes;
  ++j.inflight;
  if (j.next == j.bytes) {
    auto it = std::find(jobs_.begin(), jobs_.end(), &j);
    if (it != jobs_.end()) { jobs_.erase(it); }
  }
  return true;
}

template <class Runtime>
bool basic_transfer_pipeline<Runtime>::finish_chunk(job& j, std::exception_ptr error)
{
  --j.inflight;
  if (error && !j.failed) {
    j.failed = true;
    j.error  = std::move(error);  // moved: the staging thread keeps no reference to it
    auto it  = std::find(jobs_.begin(), jobs_.end(), &j);
    if (it != jobs_.end()) { jobs_.erase(it); }
  }
  // Nothing is claimed once every byte is or the job failed: this is the job's last chunk.
  if (j.inflight != 0 || !(j.failed || j.next == j.bytes)) { return false; }
  if (j.done) { return true; }
  done_cv_.notify_all();
  return false;
}

template <class Runtime>
std::exception_ptr basic_transfer_pipeline<Runtime>::hand_off(int dir, stream_type stream,
                                                              std::size_t bytes,
                                                              std::exception_ptr error) noexcept
{
  try {  // also after a failure: what was enqueued must precede the stream's later work
    order_after(stream, streams_[dir]);
  } catch (...) {
    if (!error) { error = std::current_exception(); }
  }
  if (!error) { count_transfer(dir, bytes); }
  return error;
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::count_transfer(int dir, std::size_t bytes) noexcept
{
  (dir == 0 ? h2d_bytes_ : d2h_bytes_).fetch_add(bytes, std::memory_order_relaxed);
  transfers_.fetch_add(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::complete_submitted(job* jp) noexcept
{
  std::unique_ptr<job> j{jp};
  std::exception_ptr error = hand_off(j->dir, j->stream, j->bytes, std::move(j->error));
  completion done          = std::move(j->done);
  j.reset();
  try {
    done(std::move(error));  // the completion owns the error: nothing here refers to it after
  } catch (...) {
    assert(false && "transfer_pipeline: a completion threw");
  }
  detail::pool_lock lock{jobs_mutex_};
  --submitted_;
  done_cv_.notify_all();  // under the lock, like every wake-up of the destructor
}

template <class Runtime>
bool basic_transfer_pipeline<Runtime>::copy_claimed(job& j, std::size_t off, std::size_t n)
{
  std::exception_ptr error;
  {
    detail::pool_lock::unlocked_scope unlocked{jobs_mutex_};
    try {
      do_chunk(j, off, n);
    } catch (...) {
      error = std::current_exception();
    }
  }
  return finish_chunk(j, std::move(error));
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::worker_loop()
{
  // A staging thread works for the pipeline's device only: make it current once, for good.
  typename Runtime::error_type const set = runtime_.set_device(options_.device);
  detail::pool_lock lock{jobs_mutex_};
  if (set != Runtime::success) {  // no chunk is claimed here: the calling threads copy them all
    while (!stopping_) { detail::wait(jobs_cv_, jobs_mutex_); }
    return;
  }
  for (;;) {
    while (!stopping_ && jobs_.empty()) { detail::wait(jobs_cv_, jobs_mutex_); }
    if (stopping_) { return; }
    job& j          = *pick_job();
    std::size_t off = 0, n = 0;
    if (!claim(j, off, n)) { continue; }
    if (copy_claimed(j, off, n)) {
      detail::pool_lock::unlocked_scope unlocked{jobs_mutex_};
      complete_submitted(&j);
    }
  }
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::run_job(job& j)
{
  detail::pool_lock lock{jobs_mutex_};
  if (j.bytes > options_.chunk_bytes && !workers_.empty()) {
    jobs_.push_back(&j);
    jobs_cv_.notify_all();
  }
  std::size_t off = 0, n = 0;
  while (claim(j, off, n)) {
    (void)copy_claimed(j, off, n);  // j is the caller's: never a submitted job
  }
  while (j.inflight != 0 || !(j.failed || j.next == j.bytes)) {
    detail::wait(done_cv_, jobs_mutex_);
  }
  auto it = std::find(jobs_.begin(), jobs_.end(), &j);
  if (it != jobs_.end()) { jobs_.erase(it); }
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::check_copy(char const* call, char const* dst_name,
                                                  void const* dst, char const* src_name,
                                                  void const* src, std::size_t bytes,
                                                  bool may_overlap) const
{
  // Messages are built only when a check fails: nothing here allocates on the good path.
  auto arg = [&] {
    return std::string{" ("} + dst_name + " " + detail::pinned_hex(dst) + ", " + src_name + " " +
           detail::pinned_hex(src) + ", " + std::to_string(bytes) + " bytes)";
  };
  GPUKIT_EXPECTS(bytes != 0, call + std::string{"0 bytes requested"} + arg());
  GPUKIT_EXPECTS(dst != nullptr && src != nullptr, call + std::string{"null pointer"} + arg());
  auto const d = reinterpret_cast<std::uintptr_t>(dst);
  auto const s = reinterpret_cast<std::uintptr_t>(src);
  GPUKIT_EXPECTS(d + bytes > d && s + bytes > s,
                 call + std::to_string(bytes) + " bytes wrap around the address space" + arg());
  GPUKIT_EXPECTS(may_overlap || d + bytes <= s || s + bytes <= d,
                 call + std::string{"source and destination overlap"} + arg());
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::check_stream(char const* call, stream_type stream)
{
  int stream_device = options_.device;
  GPUKIT_CUDA_TRY(runtime_.stream_get_device(stream, stream_device));
  GPUKIT_EXPECTS(stream_device == options_.device,
                 call + std::string{"the stream belongs to device "} +
                   std::to_string(stream_device) + ", this pipeline to device " +
                   std::to_string(options_.device) + " (use one pipeline per device)");
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::order_after(stream_type waiter, stream_type producer)
{
  event_type e                   = take_event();
  typename Runtime::error_type r = runtime_.event_record(e, producer);
  if (r == Runtime::success) { r = runtime_.stream_wait_event(waiter, e); }
  give_event(e);
  GPUKIT_CUDA_TRY(r, "event_record + stream_wait_event (stream order)");
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::check_transfer(char const* call, int dir, char* device,
                                                      char* host, std::size_t bytes,
                                                      completion const* done) const
{
  if (dir == 0) {
    check_copy(call, "device", device, "host", host, bytes, false);
  } else {
    check_copy(call, "host", host, "device", device, bytes, false);
  }
  GPUKIT_EXPECTS(done == nullptr || static_cast<bool>(*done),
                 call + std::string{"the completion is empty"});
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::copy_direct(int dir, char* device, char* host,
                                                   std::size_t bytes, stream_type stream)
{
  GPUKIT_DETAIL_SLOW_PATH_RANGEF(categories::transfer, "%s direct %.2f MiB stream %p",
                                 dir == 0 ? "H2D" : "D2H", detail::mib(bytes),
                                 detail::stream_address(stream));
  if (dir == 0) {
    GPUKIT_CUDA_TRY(
      runtime_.memcpy_async(device, host, bytes, memcpy_kind::host_to_device, stream));
  } else {
    GPUKIT_CUDA_TRY(
      runtime_.memcpy_async(host, device, bytes, memcpy_kind::device_to_host, stream));
  }
  direct_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  count_transfer(dir, bytes);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::queue_submitted(int dir, char* device, char* host,
                                                       std::size_t bytes, stream_type stream,
                                                       completion done)
{
  auto j    = std::make_unique<job>(dir, device, host, bytes);
  j->stream = stream;
  j->done   = std::move(done);
  {
    detail::pool_lock lock{jobs_mutex_};
    jobs_.push_back(j.get());
    ++submitted_;
  }
  jobs_cv_.notify_all();
  (void)j.release();  // complete_submitted deletes it
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::transfer(int dir, char* device, char* host,
                                                std::size_t bytes, host_memory kind,
                                                stream_type stream, completion* done)
{
  char const* call = done == nullptr ? (dir == 0 ? "transfer_pipeline::copy_to_device_async: "
                                                 : "transfer_pipeline::copy_to_host_async: ")
                                     : (dir == 0 ? "transfer_pipeline::submit_to_device: "
                                                 : "transfer_pipeline::submit_to_host: ");
  check_transfer(call, dir, device, host, bytes, done);
  {
    detail::pool_lock lock{jobs_mutex_};
    GPUKIT_EXPECTS(!pool_gone_, std::string{call} + "the pinned pool was destroyed");
    ++in_flight_;
  }
  // Until this call returns (a submitted transfer: until its completion has), a pool being
  // destroyed waits (see the constructor's on_expire callback).
  struct in_flight_guard {
    basic_transfer_pipeline* self;
    ~in_flight_guard()
    {
      detail::pool_lock lock{self->jobs_mutex_};
      --self->in_flight_;
      self->done_cv_.notify_all();
    }
  } const leave{this};
  // The pipeline's device for every call below (the null stream is that device's, and the events
  // are created there), whatever device the calling thread has current.
  device_guard<Runtime> guard{runtime_, options_.device};
  check_stream(call, stream);
  bool const pinned =
    kind == host_memory::pinned || (kind == host_memory::detect && pool_.owns(host, bytes));
  if (pinned) {
    copy_direct(dir, device, host, bytes, stream);
    if (done != nullptr) { (*done)(nullptr); }
    return;
  }
  order_after(streams_[dir], stream);  // the copy stream follows the consumer's earlier work
  // A submitted transfer: the staging threads do it all, and the last one ends it.
  if (done != nullptr && !workers_.empty()) {
    queue_submitted(dir, device, host, bytes, stream, std::move(*done));
    return;
  }
  job j{dir, device, host, bytes};
  run_job(j);
  std::exception_ptr error = hand_off(dir, stream, bytes, std::move(j.error));
  if (done != nullptr) {
    (*done)(std::move(error));  // no staging threads: the calling thread did it all
  } else if (error) {
    std::rethrow_exception(error);
  }
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::copy_to_device_async(void* dst, void const* src,
                                                            std::size_t bytes, host_memory src_kind,
                                                            stream_type stream)
{
  transfer(0, static_cast<char*>(dst), static_cast<char*>(const_cast<void*>(src)), bytes, src_kind,
           stream, nullptr);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::copy_to_host_async(void* dst, void const* src,
                                                          std::size_t bytes, host_memory dst_kind,
                                                          stream_type stream)
{
  transfer(1, static_cast<char*>(const_cast<void*>(src)), static_cast<char*>(dst), bytes, dst_kind,
           stream, nullptr);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::submit_to_device(void* dst, void const* src,
                                                        std::size_t bytes, host_memory src_kind,
                                                        stream_type stream, completion done)
{
  transfer(0, static_cast<char*>(dst), static_cast<char*>(const_cast<void*>(src)), bytes, src_kind,
           stream, &done);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::submit_to_host(void* dst, void const* src, std::size_t bytes,
                                                      host_memory dst_kind, stream_type stream,
                                                      completion done)
{
  transfer(1, static_cast<char*>(const_cast<void*>(src)), static_cast<char*>(dst), bytes, dst_kind,
           stream, &done);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::copy_peer_async(void* dst, int dst_device, void const* src,
                                                       int src_device, std::size_t bytes,
                                                       stream_type stream)
{
  char const* call = "transfer_pipeline::copy_peer_async: ";
  int const count  = device_count_;
  for (int d : {dst_device, src_device}) {
    GPUKIT_EXPECTS(d >= 0 && d < count, std::string{call} + "device " + std::to_string(d) +
                                          " does not exist (" + std::to_string(count) +
                                          " devices)");
  }
  int const self  = options_.device;
  int const other = dst_device == self ? src_device : dst_device;
  GPUKIT_EXPECTS(dst_device == self || src_device == self,
                 std::string{call} + "this pipeline belongs to device " + std::to_string(self) +
                   ", neither the source's (" + std::to_string(src_device) +
                   ") nor the destination's (" + std::to_string(dst_device) + ")");
  // Two devices' memory never overlaps: a device's allocations have their own addresses.
  check_copy(call, "dst", dst, "src", src, bytes, dst_device != src_device);
  device_guard<Runtime> guard{runtime_, self};
  check_stream(call, stream);
  if (other != self) {
    detail::pool_lock lock{events_mutex_};
    char& asked = peer_asked_[static_cast<std::size_t>(other)];
    if (asked == 0) {
      int can = 0;
      GPUKIT_CUDA_TRY(runtime_.device_can_access_peer(can, self, other));
      if (can != 0) {
        typename Runtime::error_type const e = runtime_.device_enable_peer_access(other);
        if (e != Runtime::peer_access_already_enabled) {
          GPUKIT_CUDA_TRY(e, "device_enable_peer_access");
        }
      }
      asked = 1;  // asked once: staged copies when the devices cannot peer
    }
  }
  GPUKIT_CUDA_TRY(runtime_.memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream));
  if (other != self) {
    peer_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    peer_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  transfers_.fetch_add(1, std::memory_order_relaxed);
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::expect_pool(char const* call) const
{
  GPUKIT_EXPECTS(pool_life_.alive(), std::string{call} + "the pinned pool was destroyed");
}

template <class Runtime>
void basic_transfer_pipeline<Runtime>::prewarm()
{
  expect_pool("transfer_pipeline::prewarm: ");
  std::size_t missing = 0;
  for (auto& r : rings_) {
    detail::pool_lock lock{r->mutex};
    missing += r->capacity - std::min(r->capacity, r->slots.size() + r->creating);
  }
  if (missing == 0) { return; }
  pool_.prewarm(options_.chunk_bytes, missing);
  // Take every slot of each ring once (pinned now, from the prewarmed buffers), then put them back.
  for (auto& r : rings_) {
    std::vector<slot*> taken;
    try {
      for (std::size_t i = 0; i < r->capacity; ++i) { taken.push_back(acquire_slot(*r)); }
    } catch (...) {
      for (slot* s : taken) { release_slot(*r, s, true); }
      throw;
    }
    for (slot* s : taken) { release_slot(*r, s, true); }
  }
}

template <class Runtime>
transfer_stats basic_transfer_pipeline<Runtime>::stats() const
{
  transfer_stats s;
  auto ld = [](std::atomic<std::uint64_t> const& a) { return a.load(std::memory_order_relaxed); };
  s.transfers    = ld(transfers_);
  s.h2d_bytes    = ld(h2d_bytes_);
  s.d2h_bytes    = ld(d2h_bytes_);
  s.staged_bytes = ld(staged_bytes_);
  s.direct_bytes = ld(direct_bytes_);
  s.chunks       = ld(chunks_);
  s.chunk_waits  = ld(chunk_waits_);
  s.peer_bytes   = ld(peer_bytes_);
  s.peer_copies  = ld(peer_copies_);
  for (auto const& r : rings_) {
    detail::pool_lock lock{r->mutex};
    s.staging_chunks += r->slots.size();
  }
  return s;
}

}  // namespace gpukit
