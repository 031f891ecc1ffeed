// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/executor.hpp: runs a chain of stages under a checkpoint schedule, with every
// activation, tape and gradient taken from a caching allocator on one stream.
//
// Quick start:
//
//   #include <gpukit/checkpoint/executor.hpp>
//   #include <gpukit/checkpoint/planners.hpp>
//
//   #include <cstddef>
//   #include <cstdint>
//   #include <utility>
//   #include <vector>
//
//   struct my_stages {  // any type with these members (i = 1..L)
//     std::size_t width;
//     // the bytes of x_i (and of δ_i), and what Fe<i> keeps for B<i> beside x_{i-1}
//     std::size_t output_bytes(std::size_t) const { return width * sizeof(float); }
//     std::size_t tape_bytes(std::size_t) const { return 2 * width * sizeof(float); }
//     // x_i = F_i(x_{i-1}); when c.recording, also fill `tape`. Enqueue the work on `s`.
//     void forward(std::size_t i, void const* x_in, void* x_out, void* tape,
//                  gpukit::checkpoint_context const& c, cudaStream_t s);
//     // δ_{i-1} from δ_i (grad_out is null for i = L: the loss stage starts the backward;
//     // grad_in is null for i = 1); accumulate parameter gradients here.
//     void backward(std::size_t i, void const* x_in, void const* tape, void const* grad_out,
//                   void* grad_in, gpukit::checkpoint_context const& c, cudaStream_t s);
//   };
//
//   // times[i - 1]: {forward, backward} time of stage i, e.g. measured (profile_chain.hpp)
//   void step(my_stages& stages, std::size_t L, void const* x0, std::int64_t budget_bytes,
//             std::vector<std::pair<std::int64_t, std::int64_t>> const& times, cudaStream_t stream)
//   {
//     gpukit::caching_allocator& alloc = gpukit::default_caching_allocator(0);
//     gpukit::checkpoint_chain chain = gpukit::checkpoint_chain_of(stages, L, times);  // bytes
//     gpukit::checkpoint_plan plan   = gpukit::plan_best(chain, budget_bytes);
//     gpukit::checkpoint_executor exec{alloc};
//     exec.run_async(plan.schedule, stages, L, x0, stream);  // peak requested bytes <= plan.peak
//   }
//
// The executor allocates each object when the operation that creates it is enqueued and frees it
// (stream-ordered, on the same stream) right after the operation of its last use, exactly as the
// simulator counts memory: the allocator's requested-bytes peak over a step equals the plan's peak
// when sizes are bytes (x_0 belongs to the caller and is not counted). `checkpoint_context` tells a
// stage whether this forward is a recomputation (so running statistics update once) and gives it a
// seed that is the same every time stage i runs within a step (so dropout replays exactly).
//
// ## RNG state, and side effects that must happen once
//
// A stage that draws from a stateful generator (a Philox offset that advances, say) instead of
// `c.rng_seed` may give its Stages type two members; the executor then calls them:
//
//     State rng_capture(std::size_t i, cudaStream_t s);            // any copyable State
//     void  rng_restore(std::size_t i, State const& state, cudaStream_t s);
//
// rng_capture(i) before the first forward of stage i in a step (the state is kept for the step);
// before each recomputation of stage i: now = rng_capture(i), rng_restore(i, kept), the forward,
// then rng_restore(i, now), so that the recomputation draws what the first forward drew and the
// generator continues as if it had not run (PyTorch's checkpoint forks its RNG state the same
// way). `c.is_recomputing()`, or `gpukit::is_recomputing()` anywhere on the calling thread during
// a stage's forward call, says whether this forward is a recomputation: update running statistics
// only when it is not.
//
// ## Offloading kept activations
//
//   gpukit::pinned_pool pool{rt};
//   gpukit::transfer_pipeline pipe{rt, pool};
//   gpukit::checkpoint_offload_options offload;
//   offload.min_bytes = 1 << 20;                     // small activations stay on the device
//   exec.enable_offload(pipe, offload);
//   exec.run_async(plan.schedule, stages, L, x0, stream);
//
// An activation x_j that stays on the device, unused, across at least prefetch_distance + 1
// operations of the schedule is copied to a pinned buffer of the pool (device to host, on the
// executor's offload stream, after an event on `stream`) and its device buffer freed (its memory
// is reused only once that copy has completed: record_stream); prefetch_distance operations
// before its next use, a device buffer is allocated on `stream` and the copy back (on the
// executor's prefetch stream, after an event on `stream` and one on the offload stream) overlaps
// with those operations; the use waits for it with an event. Every hand-off is an event: nothing
// synchronizes the host or the device. The allocator's requested bytes stay at or below the
// plan's peak (an offloaded x_j is counted by the plan while it is on the host); tapes, gradients
// and x_0 stay on the device. Copies go through the transfer pipeline's direct (pinned) path,
// counted in its statistics.
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/detail/spare_events.hpp>
#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>
#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/profile/detail/slow_path_range.hpp>
#include <gpukit/runtime/detail/compiled_runtimes.hpp>
#include <gpukit/runtime/runtime.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpukit {

/// What a stage's forward or backward is told about the call.
struct checkpoint_context {
  std::size_t stage{1};       ///< i
  bool recording{false};      ///< `Fe<i>`: fill the tape
  bool recomputing{false};    ///< stage i's forward already ran in this step: skip side effects
  std::uint64_t rng_seed{0};  ///< the same on every run of stage i in one step
  std::uint64_t step{0};      ///< the step counter given to run_async

  /// This forward is a recomputation (stage i's forward already ran in this step): skip side
  /// effects such as running statistics.
  [[nodiscard]] bool is_recomputing() const noexcept { return recomputing; }
};

namespace detail {
inline bool& ckpt_recomputing_flag() noexcept
{
  thread_local bool flag = false;
  return flag;
}
}  // namespace detail

/// True on the calling thread while a checkpoint executor is inside a stage's forward call that
/// recomputes that stage (for code deep inside a stage that has no checkpoint_context at hand).
[[nodiscard]] inline bool is_recomputing() noexcept { return detail::ckpt_recomputing_flag(); }

/// Settings of an executor's activation offloading (see the top of this header).
struct checkpoint_offload_options {
  /// Activations smaller than this stay on the device (the copies' fixed costs outweigh them).
  std::size_t min_bytes{0};
  /// Operations of the schedule between the start of the copy back and the use (at least 1): the
  /// copy overlaps with their work. An activation is offloaded across a stretch of at least
  /// prefetch_distance + 1 operations that do not use it.
  std::size_t prefetch_distance{1};
};

/// What one run_async did.
struct checkpoint_run_stats {
  std::size_t forwards{0};
  std::size_t recomputations{0};  ///< forwards beyond one per stage
  std::size_t backwards{0};
  std::size_t allocations{0};      ///< allocate_async calls (objects of size 0 take none)
  std::int64_t predicted_peak{0};  ///< the simulator's peak for the schedule, in bytes
  std::size_t offloads{0};         ///< device-to-host copies of kept activations
  std::size_t offloaded_bytes{0};  ///< bytes they copied (as many come back)
  std::size_t rng_captures{0};     ///< rng_capture calls (0 when Stages has no RNG hooks)
};

/// A chain whose sizes are the stages' byte sizes, with the given times (`times[i-1]` = {f_i,
/// b_i}).
/// @throws gpukit::logic_error when times.size() != L, and as checkpoint_chain's constructor
template <class Stages>
[[nodiscard]] checkpoint_chain checkpoint_chain_of(
  Stages& stages, std::size_t L, std::vector<std::pair<std::int64_t, std::int64_t>> const& times)
{
  GPUKIT_EXPECTS(times.size() == L, "checkpoint_chain_of: " + std::to_string(times.size()) +
                                      " times for " + std::to_string(L) + " stages");
  std::vector<checkpoint_stage> v;
  for (std::size_t i = 1; i <= L; ++i) {
    v.push_back({times[i - 1].first, times[i - 1].second,
                 static_cast<std::int64_t>(stages.output_bytes(i)),
                 static_cast<std::int64_t>(stages.tape_bytes(i))});
  }
  return checkpoint_chain{std::move(v)};
}

namespace detail {

// Stages with rng_capture / rng_restore (see the top of this header), and their State type.
template <class Stages, class Stream, class = void>
struct ckpt_rng_hooks : std::false_type {
  using state_type = char;
};
template <class Stages, class Stream>
struct ckpt_rng_hooks<
  Stages, Stream,
  std::void_t<decltype(std::declval<Stages&>().rng_capture(std::size_t{}, std::declval<Stream>())),
              decltype(std::declval<Stages&>().rng_restore(
                std::size_t{},
                std::declval<decltype(std::declval<Stages&>().rng_capture(
                  std::size_t{}, std::declval<Stream>())) const&>(),
                std::declval<Stream>()))>> : std::true_type {
  using state_type = std::decay_t<decltype(std::declval<Stages&>().rng_capture(
    std::size_t{}, std::declval<Stream>()))>;
};

// Sets the thread's is_recomputing() flag for one forward call.
class ckpt_recomputing_scope {
 public:
  explicit ckpt_recomputing_scope(bool on) noexcept : previous_{ckpt_recomputing_flag()}
  {
    ckpt_recomputing_flag() = on;
  }
  ~ckpt_recomputing_scope() { ckpt_recomputing_flag() = previous_; }
  ckpt_recomputing_scope(ckpt_recomputing_scope const&)            = delete;
  ckpt_recomputing_scope& operator=(ckpt_recomputing_scope const&) = delete;

 private:
  bool previous_;
};

}  // namespace detail

/// Runs schedules over a basic_caching_allocator<Runtime>. Not thread-safe (one step at a time
/// per executor); the allocator itself may be shared.
template <class Runtime>
class basic_checkpoint_executor final {
 public:
  /// The stream a step runs on (offload and prefetch streams are the executor's own).
  using stream_type    = typename Runtime::stream_type;
  using event_type     = typename Runtime::event_type;
  using allocator_type = basic_caching_allocator<Runtime>;
  using pipeline_type  = basic_transfer_pipeline<Runtime>;

  /// An executor drawing every buffer from `allocator` (held by reference).
  explicit basic_checkpoint_executor(allocator_type& allocator) : allocator_{allocator} {}
  // Neither copyable nor movable (deleted copies leave no implicit moves).
  basic_checkpoint_executor(basic_checkpoint_executor const&)            = delete;
  basic_checkpoint_executor& operator=(basic_checkpoint_executor const&) = delete;
  /// Destroys the offload streams (after the allocator forgets them: that waits for their work)
  /// and the executor's events. Never throws.
  ~basic_checkpoint_executor() { destroy_streams(); }

  /// Offloads kept activations through `pipeline` (its pinned pool holds them) from the next
  /// run_async on; see the top of this header. Creates the executor's offload and prefetch
  /// streams on the allocator's device the first time. `pipeline` must outlive the executor or
  /// the next disable_offload.
  /// @throws gpukit::logic_error when options.prefetch_distance is 0
  /// @throws gpukit::cuda_error when a stream cannot be created
  void enable_offload(pipeline_type& pipeline, checkpoint_offload_options options = {})
  {
    GPUKIT_EXPECTS(options.prefetch_distance >= 1,
                   "checkpoint_executor: prefetch_distance = 0; the copy back needs at least one "
                   "operation to overlap with");
    if (!streams_created_) {
      auto& rt = allocator_.runtime();
      device_guard<Runtime> guard{rt, allocator_.device()};
      GPUKIT_CUDA_TRY(rt.stream_create(offload_stream_));
      typename Runtime::error_type const e = rt.stream_create(prefetch_stream_);
      if (e != Runtime::success) {
        (void)rt.stream_destroy(offload_stream_);
        GPUKIT_CUDA_TRY(e, "stream_create(prefetch stream)");
      }
      streams_created_ = true;
    }
    pipeline_        = &pipeline;
    offload_options_ = options;
  }
  /// Keeps every activation on the device from the next run_async on.
  void disable_offload() noexcept { pipeline_ = nullptr; }
  /// Whether run_async offloads.
  [[nodiscard]] bool offloading() const noexcept { return pipeline_ != nullptr; }
  /// The streams the offload copies run on (device to host, host to device); null handles
  /// before enable_offload. For profiling.
  [[nodiscard]] stream_type offload_stream() const noexcept { return offload_stream_; }
  [[nodiscard]] stream_type prefetch_stream() const noexcept { return prefetch_stream_; }

  /// Enqueues one training step of the L `stages` on `stream` under `schedule`: the stages' forward
  /// and backward are called in the schedule's order, on this thread, and must enqueue their work
  /// on `stream`. Every buffer is freed, stream-ordered, by the time this returns. Does not
  /// synchronize.
  /// @param schedule  the operations to run (a plan's schedule)
  /// @param stages    the stages' sizes, forwards and backwards
  /// @param L         the number of stages
  /// @param x0        the input, owned by the caller (not counted)
  /// @param stream    the stream every operation is enqueued on
  /// @param step      passed to the stages in checkpoint_context::step and mixed into the seeds
  /// @throws gpukit::logic_error naming the operation when the schedule is invalid for L stages
  ///         (checked before anything is enqueued); what the allocator, the pinned pool, the
  ///         pipeline or a stage throws (buffers allocated so far are then freed on `stream`,
  ///         pinned ones returned after the copies that use them)
  template <class Stages>
  checkpoint_run_stats run_async(checkpoint_schedule const& schedule, Stages& stages, std::size_t L,
                                 void const* x0, stream_type stream, std::uint64_t step = 0)
  {
    using state_type = typename detail::ckpt_rng_hooks<Stages, stream_type>::state_type;
    GPUKIT_EXPECTS(L >= 1, "checkpoint_executor: a chain needs at least one stage");
    for (std::size_t k = 0; k < schedule.size(); ++k) {
      GPUKIT_EXPECTS(
        !is_copy(schedule[k].kind),
        "checkpoint_executor: operation " + std::to_string(k) + " (" + to_string(schedule[k]) +
          ") is a planned offload/prefetch copy, which this executor does not run; "
          "plan without offload (plan_best) and use enable_offload for its own copies");
    }
    // Sizes, validated by the simulator (zero times): also the prediction.
    checkpoint_chain const chain =
      checkpoint_chain_of(stages, L, std::vector<std::pair<std::int64_t, std::int64_t>>(L));
    auto const sim           = simulate_checkpoint_schedule(chain, schedule);
    auto const release_after = last_uses(schedule, L);
    offload_plan const moves =
      pipeline_ != nullptr ? plan_offload(schedule, chain, offload_options_) : offload_plan{};

    checkpoint_run_stats stats;
    stats.predicted_peak = sim.peak;
    buffers b{*this, stream, L};
    std::vector<char> ran(L + 1, 0);
    std::vector<std::optional<state_type>> rng(L + 1);  // kept at each stage's first forward
    for (std::size_t k = 0; k < schedule.size(); ++k) {
      auto const op       = schedule[k];
      std::size_t const i = op.stage;
      if (!moves.empty()) {
        for (std::size_t j : moves.prefetch[k]) prefetch(b, j, stats);
        for (std::size_t j : moves.wait[k]) wait_prefetched(b, j);
      }
      checkpoint_context c;
      c.stage    = i;
      c.step     = step;
      c.rng_seed = mix(step, i);
      GPUKIT_EXPECTS(i == 1 || b.x[i - 1].ptr != nullptr || chain[i - 1].output_size == 0,
                     "checkpoint_executor: internal error: x_" + std::to_string(i - 1) +
                       " is not on the device at operation " + std::to_string(k));
      void const* x_in = i == 1 ? x0 : b.x[i - 1].ptr;
      if (op.kind == checkpoint_op_kind::backward) {
        run_backward(stages, chain, b, c, x_in, stats);
      } else {
        c.recording   = op.kind == checkpoint_op_kind::forward_record;
        c.recomputing = ran[i] != 0;
        ran[i]        = 1;
        run_forward(stages, chain, b, c, x_in, rng[i], stats);
      }
      for (auto const& obj : release_after[k])
        b.release(obj.tape ? b.tape[obj.index] : b.x[obj.index]);
      if (!moves.empty()) {
        for (std::size_t j : moves.offload[k]) offload(b, j, stats);
      }
    }
    return stats;
  }

  [[nodiscard]] allocator_type& allocator() const noexcept { return allocator_; }

 private:
  static_assert(runtime_has_core_v<Runtime>,
                "basic_checkpoint_executor needs a Runtime with the core operations "
                "(gpukit/runtime/contract.hpp)");

  struct object {
    bool tape{false};
    std::size_t index{0};
  };
  struct buffer {
    void* ptr{nullptr};
    std::size_t bytes{0};
  };
  // An offloaded activation: its pinned copy, and the events that order the copies.
  struct host_copy {
    void* ptr{nullptr};  ///< from the pipeline's pinned pool
    std::size_t bytes{0};
    bool copied_back{false};  ///< the copy back is enqueued (the pinned buffer is returned)
    event_type stored{};      ///< recorded on the offload stream after the copy out
    event_type ready{};       ///< recorded on the prefetch stream after the copy back
    bool has_stored{false}, has_ready{false};
  };
  // Per operation: activations to copy back before it, to wait for before it, to copy out after.
  struct offload_plan {
    std::vector<std::vector<std::size_t>> prefetch, wait, offload;
    [[nodiscard]] bool empty() const noexcept { return offload.empty(); }
  };

  // Owns the live buffers of one run; frees what is left (stream-ordered) on every exit.
  struct buffers {
    basic_checkpoint_executor& exec;
    allocator_type& alloc;
    stream_type stream;
    std::vector<buffer> x, tape;
    std::vector<host_copy> host;
    buffer grad, grad_next;
    buffers(basic_checkpoint_executor& e, stream_type s, std::size_t L)
        : exec{e}, alloc{e.allocator_}, stream{s}, x(L + 1), tape(L + 1), host(L + 1)
    {}
    ~buffers()
    {
      for (auto& v : x) release(v);
      for (auto& v : tape) release(v);
      release(grad);
      release(grad_next);
      for (auto& h : host) exec.drop_host_copy(h);
    }
    buffers(buffers const&)            = delete;
    buffers& operator=(buffers const&) = delete;
    void* take(buffer& slot, std::size_t bytes, checkpoint_run_stats& stats)
    {
      release(slot);
      if (bytes == 0) return nullptr;
      slot.ptr   = alloc.allocate_async(bytes, stream);
      slot.bytes = bytes;
      ++stats.allocations;
      return slot.ptr;
    }
    void release(buffer& slot) noexcept
    {
      if (slot.ptr != nullptr) {
        try {
          alloc.deallocate_async(slot.ptr, slot.bytes, stream);
        } catch (...) {  // cannot happen for a pointer this run allocated
        }
      }
      slot = buffer{};
    }
  };

  // B<i>: δ_{i-1} from δ_i, then the tape and δ_i are freed.
  template <class Stages>
  static void run_backward(Stages& stages, checkpoint_chain const& chain, buffers& b,
                           checkpoint_context const& c, void const* x_in,
                           checkpoint_run_stats& stats)
  {
    std::size_t const i          = c.stage;
    std::size_t const grad_bytes = i > 1 ? static_cast<std::size_t>(chain[i - 1].output_size) : 0;
    void* grad_in                = b.take(b.grad_next, grad_bytes, stats);
    stages.backward(i, x_in, b.tape[i].ptr, b.grad.ptr, grad_in, c, b.stream);
    b.release(b.tape[i]);
    b.release(b.grad);
    std::swap(b.grad, b.grad_next);
    ++stats.backwards;
  }

  // F<i> or Fe<i>: a new x_i (and tape, when recording), then the stage's forward.
  template <class Stages, class State>
  static void run_forward(Stages& stages, checkpoint_chain const& chain, buffers& b,
                          checkpoint_context const& c, void const* x_in,
                          std::optional<State>& kept_rng, checkpoint_run_stats& stats)
  {
    std::size_t const i = c.stage;
    GPUKIT_DETAIL_SLOW_PATH_RANGEF(categories::checkpoint, "%s block %zu",
                                   c.recomputing ? "recompute" : "forward", i);
    b.release(b.x[i]);  // a previous instance, replaced (its last use has passed)
    void* out  = b.take(b.x[i], static_cast<std::size_t>(chain[i].output_size), stats);
    void* tape = nullptr;
    if (c.recording) {
      b.release(b.tape[i]);
      tape = b.take(b.tape[i], static_cast<std::size_t>(chain[i].tape_size), stats);
    }
    call_forward(stages, c, x_in, out, tape, b.stream, kept_rng, stats);
    ++stats.forwards;
    if (c.recomputing) ++stats.recomputations;
  }

  // The stage's forward call, with is_recomputing() set for it, and with Stages' RNG hooks (see
  // the top of this header): the first forward keeps the generator's state; a recomputation
  // forks, drawing what the first forward drew, then continuing where the generator was.
  template <class Stages, class State>
  static void call_forward(Stages& stages, checkpoint_context const& c, void const* x_in, void* out,
                           void* tape, stream_type stream,
                           [[maybe_unused]] std::optional<State>& kept_rng,
                           [[maybe_unused]] checkpoint_run_stats& stats)
  {
    std::size_t const i = c.stage;
    if constexpr (!detail::ckpt_rng_hooks<Stages, stream_type>::value) {
      detail::ckpt_recomputing_scope scope{c.recomputing};
      stages.forward(i, x_in, out, tape, c, stream);
    } else if (!c.recomputing) {
      kept_rng = stages.rng_capture(i, stream);
      ++stats.rng_captures;
      detail::ckpt_recomputing_scope scope{false};
      stages.forward(i, x_in, out, tape, c, stream);
    } else {
      detail::ckpt_recomputing_scope scope{true};
      auto const now = stages.rng_capture(i, stream);
      ++stats.rng_captures;
      stages.rng_restore(i, *kept_rng, stream);
      stages.forward(i, x_in, out, tape, c, stream);
      stages.rng_restore(i, now, stream);
    }
  }

  // x_j stays on the device across a stretch of operations that do not use it: from each of its
  // events (its creation, each use) to the next, when at least prefetch_distance + 1 operations
  // lie between them, it is copied out after the first and back prefetch_distance operations
  // before the second.
  static offload_plan plan_offload(checkpoint_schedule const& s, checkpoint_chain const& chain,
                                   checkpoint_offload_options const& o)
  {
    std::size_t const L = chain.size();
    offload_plan p;
    p.prefetch.resize(s.size());
    p.wait.resize(s.size());
    p.offload.resize(s.size());
    constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::vector<std::size_t> last_event(L + 1, none);  // of the live instance of x_j
    auto eligible = [&](std::size_t j) {
      auto const bytes = static_cast<std::size_t>(chain[j].output_size);
      return bytes > 0 && bytes >= o.min_bytes;
    };
    for (std::size_t k = 0; k < s.size(); ++k) {
      std::size_t const i = s[k].stage;
      if (i > 1 && last_event[i - 1] != none) {  // a use of x_{i-1}
        std::size_t const j = i - 1, from = last_event[j];
        if (eligible(j) && k >= from + o.prefetch_distance + 2) {
          p.offload[from].push_back(j);
          p.prefetch[k - o.prefetch_distance].push_back(j);
          p.wait[k].push_back(j);
        }
        last_event[j] = k;
      }
      if (s[k].kind != checkpoint_op_kind::backward) last_event[i] = k;  // a new instance of x_i
    }
    return p;
  }

  event_type take_event()
  {
    return detail::take_spare_event(allocator_.runtime(), spare_events_, false);
  }
  void give_event(event_type e) noexcept { spare_events_.push_back(e); }

  // `to` waits for the work submitted to `from` so far.
  void hand_off(stream_type from, stream_type to)
  {
    event_type e                         = take_event();
    auto& rt                             = allocator_.runtime();
    typename Runtime::error_type const r = rt.event_record(e, from);
    typename Runtime::error_type const w = r == Runtime::success ? rt.stream_wait_event(to, e) : r;
    give_event(e);  // re-recording it later does not change the wait enqueued now
    GPUKIT_CUDA_TRY(w, "event_record + stream_wait_event (hand-off between streams)");
  }

  // After the operation that last touched x_j: copy it out on the offload stream, free its device
  // buffer (reused only once the copy has run).
  void offload(buffers& b, std::size_t j, checkpoint_run_stats& stats)
  {
    buffer& d    = b.x[j];
    host_copy& h = b.host[j];
    drop_host_copy(h);  // a previous copy of an earlier instance (already copied back)
    h.ptr   = pipeline_->pool().allocate(d.bytes);
    h.bytes = d.bytes;
    hand_off(b.stream, offload_stream_);
    pipeline_->copy_to_host_async(h.ptr, d.ptr, d.bytes, host_memory::pinned, offload_stream_);
    h.stored = take_event();
    GPUKIT_CUDA_TRY(allocator_.runtime().event_record(h.stored, offload_stream_));
    h.has_stored = true;
    allocator_.record_stream(d.ptr, offload_stream_);
    b.release(d);
    ++stats.offloads;
    stats.offloaded_bytes += h.bytes;
  }

  // prefetch_distance operations before the use of x_j: a device buffer on `stream`, the copy
  // back on the prefetch stream once both the buffer (stream order) and the copy out are ready.
  void prefetch(buffers& b, std::size_t j, checkpoint_run_stats& stats)
  {
    host_copy& h = b.host[j];
    void* d      = b.take(b.x[j], h.bytes, stats);
    hand_off(b.stream, prefetch_stream_);
    GPUKIT_CUDA_TRY(allocator_.runtime().stream_wait_event(prefetch_stream_, h.stored));
    pipeline_->copy_to_device_async(d, h.ptr, h.bytes, host_memory::pinned, prefetch_stream_);
    h.ready = take_event();
    GPUKIT_CUDA_TRY(allocator_.runtime().event_record(h.ready, prefetch_stream_));
    h.has_ready   = true;
    h.copied_back = true;
    // The pinned buffer goes back to the pool, reusable once the copy back has run.
    void* const p = std::exchange(h.ptr, nullptr);
    pipeline_->pool().deallocate_async(p, prefetch_stream_);
  }

  void wait_prefetched(buffers& b, std::size_t j)
  {
    host_copy& h = b.host[j];
    GPUKIT_CUDA_TRY(allocator_.runtime().stream_wait_event(b.stream, h.ready));
    drop_host_copy(h);
  }

  // Returns a host copy's events, and its pinned buffer (after the copies that may use it).
  void drop_host_copy(host_copy& h) noexcept
  {
    if (h.ptr != nullptr && pipeline_ != nullptr) {
      try {
        pipeline_->pool().record_stream(h.ptr, offload_stream_);
        pipeline_->pool().deallocate_async(h.ptr, prefetch_stream_);
      } catch (...) {  // an event that cannot be recorded: the buffer stays handed out
      }
    }
    if (h.has_stored) give_event(h.stored);
    if (h.has_ready) give_event(h.ready);
    h = host_copy{};
  }

  void destroy_streams() noexcept
  {
    auto& rt = allocator_.runtime();
    if (streams_created_) {
      for (stream_type s : {offload_stream_, prefetch_stream_}) {
        try {
          allocator_.forget_stream(s);
        } catch (...) {}
        (void)rt.stream_synchronize(s);
        (void)rt.stream_destroy(s);
      }
      streams_created_ = false;
    }
    for (event_type e : spare_events_) (void)rt.event_destroy(e);
    spare_events_.clear();
  }

  static std::uint64_t mix(std::uint64_t step, std::size_t stage) noexcept
  {
    std::uint64_t z = step * 0x9E3779B97F4A7C15ull + stage + 0x632BE59BD9B4E019ull;
    z               = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z               = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // For each operation, the objects whose last use it is (or that it created and nothing uses).
  // Tapes are released by their backward and x_i replaced by a recomputation explicitly.
  static std::vector<std::vector<object>> last_uses(checkpoint_schedule const& s, std::size_t L)
  {
    constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::vector<std::size_t> x_last(L + 1, none), tape_last(L + 1, none);
    std::vector<std::vector<object>> out(s.size());
    auto flush_x = [&](std::size_t j) {
      if (x_last[j] != none) out[x_last[j]].push_back({false, j});
      x_last[j] = none;
    };
    auto flush_tape = [&](std::size_t j) {
      if (tape_last[j] != none) out[tape_last[j]].push_back({true, j});
      tape_last[j] = none;
    };
    for (std::size_t k = 0; k < s.size(); ++k) {
      std::size_t const i = s[k].stage;
      if (i > 1) x_last[i - 1] = k;
      if (s[k].kind == checkpoint_op_kind::backward) {
        tape_last[i] = none;  // the backward frees it
      } else {
        flush_x(i);
        x_last[i] = k;
        if (s[k].kind == checkpoint_op_kind::forward_record) {
          flush_tape(i);
          tape_last[i] = k;
        }
      }
    }
    for (std::size_t j = 1; j <= L; ++j) flush_x(j), flush_tape(j);
    return out;
  }

  allocator_type& allocator_;
  pipeline_type* pipeline_{nullptr};
  checkpoint_offload_options offload_options_{};
  bool streams_created_{false};
  stream_type offload_stream_{}, prefetch_stream_{};
  std::vector<event_type> spare_events_;
};

/// The executor over the CUDA runtime.
using checkpoint_executor = basic_checkpoint_executor<cuda_runtime>;

}  // namespace gpukit

// Its members but run_async (a template over the caller's stages).
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_checkpoint_executor<gpukit::cuda_runtime>);
GPUKIT_DETAIL_EXTERN_TEMPLATE(class gpukit::basic_checkpoint_executor<gpukit::sim_runtime>);
