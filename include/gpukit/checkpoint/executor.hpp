// gpukit/checkpoint/executor.hpp: runs a chain of stages under a checkpoint schedule, with every
// activation, tape and gradient taken from a caching allocator on one stream.
//
// Quick start:
//
//   #include <gpukit/checkpoint/executor.hpp>
//
//   struct my_stages {   // any type with these members (i = 1..L)
//     std::size_t output_bytes(std::size_t i);   // bytes of x_i (and of δ_i)
//     std::size_t tape_bytes(std::size_t i);     // bytes Fe<i> keeps for B<i>, beside x_{i-1}
//     // x_i = F_i(x_{i-1}); when c.recording, also fill `tape`. Enqueue the work on `s`.
//     void forward(std::size_t i, void const* x_in, void* x_out, void* tape,
//                  gpukit::checkpoint_context const& c, cudaStream_t s);
//     // δ_{i-1} from δ_i (grad_out is null for i = L: the loss stage starts the backward;
//     // grad_in is null for i = 1); accumulate parameter gradients here.
//     void backward(std::size_t i, void const* x_in, void const* tape, void const* grad_out,
//                   void* grad_in, gpukit::checkpoint_context const& c, cudaStream_t s);
//   };
//
//   gpukit::caching_allocator& alloc = gpukit::default_caching_allocator(0);
//   my_stages stages{...};
//   auto chain = gpukit::checkpoint_chain_of(stages, L, times);         // sizes in bytes
//   auto plan  = gpukit::plan_optimal(chain, budget_bytes);
//   gpukit::checkpoint_executor exec{alloc};
//   exec.run_async(plan.schedule, stages, x0, stream);   // peak requested bytes <= plan.peak
//
// The executor allocates each object when the operation that creates it is enqueued and frees it
// (stream-ordered, on the same stream) right after the operation of its last use, exactly as the
// simulator counts memory: the allocator's requested-bytes peak over a step equals the plan's peak
// when sizes are bytes (x_0 belongs to the caller and is not counted). `checkpoint_context` tells a
// stage whether this forward is a recomputation (so running statistics update once) and gives it a
// seed that is the same every time stage i runs within a step (so dropout replays exactly).
#pragma once

#include <gpukit/checkpoint/chain.hpp>
#include <gpukit/checkpoint/schedule.hpp>
#include <gpukit/error.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpukit {

/// What a stage's forward or backward is told about the call.
struct checkpoint_context {
  std::size_t stage{1};       ///< i
  bool recording{false};      ///< Fe<i>: fill the tape
  bool recomputing{false};    ///< stage i's forward already ran in this step: skip side effects
  std::uint64_t rng_seed{0};  ///< the same on every run of stage i in one step
  std::uint64_t step{0};      ///< the step counter given to run_async
};

/// What one run_async did.
struct checkpoint_run_stats {
  std::size_t forwards{0};
  std::size_t recomputations{0};  ///< forwards beyond one per stage
  std::size_t backwards{0};
  std::size_t allocations{0};      ///< allocate_async calls (objects of size 0 take none)
  std::int64_t predicted_peak{0};  ///< the simulator's peak for the schedule, in bytes
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

/// Runs schedules over a basic_caching_allocator<Runtime>. Not thread-safe (one step at a time
/// per executor); the allocator itself may be shared.
template <class Runtime>
class basic_checkpoint_executor final {
 public:
  using stream_type    = typename Runtime::stream_type;
  using allocator_type = basic_caching_allocator<Runtime>;

  /// An executor drawing every buffer from `allocator` (held by reference).
  explicit basic_checkpoint_executor(allocator_type& allocator) : allocator_{allocator} {}
  basic_checkpoint_executor(basic_checkpoint_executor const&)            = delete;
  basic_checkpoint_executor& operator=(basic_checkpoint_executor const&) = delete;
  basic_checkpoint_executor(basic_checkpoint_executor&&)                 = delete;
  basic_checkpoint_executor& operator=(basic_checkpoint_executor&&)      = delete;
  ~basic_checkpoint_executor()                                           = default;

  /// Enqueues one training step of the L `stages` on `stream` under `schedule`: the stages' forward
  /// and backward are called in the schedule's order, on this thread, and must enqueue their work
  /// on `stream`. Every buffer is freed, stream-ordered, by the time this returns. Does not
  /// synchronize.
  /// @param L         the number of stages
  /// @param x0        the input, owned by the caller (not counted)
  /// @param step      passed to the stages in checkpoint_context::step and mixed into the seeds
  /// @throws gpukit::logic_error naming the operation when the schedule is invalid for L stages
  ///         (checked before anything is enqueued); what the allocator or a stage throws (buffers
  ///         allocated so far are then freed on `stream`)
  template <class Stages>
  checkpoint_run_stats run_async(checkpoint_schedule const& schedule, Stages& stages, std::size_t L,
                                 void const* x0, stream_type stream, std::uint64_t step = 0)
  {
    GPUKIT_EXPECTS(L >= 1, "checkpoint_executor: a chain needs at least one stage");
    // Sizes, validated by the simulator (zero times): also the prediction.
    std::vector<checkpoint_stage> v(L);
    for (std::size_t i = 1; i <= L; ++i) {
      v[i - 1].output_size = static_cast<std::int64_t>(stages.output_bytes(i));
      v[i - 1].tape_size   = static_cast<std::int64_t>(stages.tape_bytes(i));
    }
    checkpoint_chain const chain{std::move(v)};
    auto const sim           = simulate_checkpoint_schedule(chain, schedule);
    auto const release_after = last_uses(schedule, L);

    checkpoint_run_stats stats;
    stats.predicted_peak = sim.peak;
    buffers b{allocator_, stream, L};
    std::vector<char> ran(L + 1, 0);
    for (std::size_t k = 0; k < schedule.size(); ++k) {
      auto const op       = schedule[k];
      std::size_t const i = op.stage;
      checkpoint_context c;
      c.stage          = i;
      c.step           = step;
      c.rng_seed       = mix(step, i);
      void const* x_in = i == 1 ? x0 : b.x[i - 1].ptr;
      if (op.kind == checkpoint_op_kind::backward) {
        std::size_t const grad_bytes = i > 1 ? chain[i - 1].output_size : 0;
        void* grad_in                = b.take(b.grad_next, grad_bytes, stats);
        stages.backward(i, x_in, b.tape[i].ptr, b.grad.ptr, grad_in, c, stream);
        b.release(b.tape[i]);
        b.release(b.grad);
        std::swap(b.grad, b.grad_next);
        ++stats.backwards;
      } else {
        c.recording   = op.kind == checkpoint_op_kind::forward_record;
        c.recomputing = ran[i] != 0;
        ran[i]        = 1;
        b.release(b.x[i]);  // a previous instance, replaced (its last use has passed)
        void* out  = b.take(b.x[i], static_cast<std::size_t>(chain[i].output_size), stats);
        void* tape = nullptr;
        if (c.recording) {
          b.release(b.tape[i]);
          tape = b.take(b.tape[i], static_cast<std::size_t>(chain[i].tape_size), stats);
        }
        stages.forward(i, x_in, out, tape, c, stream);
        stats.forwards++;
        if (c.recomputing) stats.recomputations++;
      }
      for (auto const& obj : release_after[k])
        b.release(obj.tape ? b.tape[obj.index] : b.x[obj.index]);
    }
    return stats;
  }

  [[nodiscard]] allocator_type& allocator() const noexcept { return allocator_; }

 private:
  struct object {
    bool tape{false};
    std::size_t index{0};
  };
  struct buffer {
    void* ptr{nullptr};
    std::size_t bytes{0};
  };
  // Owns the live buffers of one run; frees what is left (stream-ordered) on every exit.
  struct buffers {
    allocator_type& alloc;
    stream_type stream;
    std::vector<buffer> x, tape;
    buffer grad, grad_next;
    buffers(allocator_type& a, stream_type s, std::size_t L)
        : alloc{a}, stream{s}, x(L + 1), tape(L + 1)
    {}
    ~buffers()
    {
      for (auto& v : x) release(v);
      for (auto& v : tape) release(v);
      release(grad);
      release(grad_next);
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
};

/// The executor over the CUDA runtime.
using checkpoint_executor = basic_checkpoint_executor<cuda_runtime>;

}  // namespace gpukit
