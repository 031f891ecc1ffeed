// SPDX-License-Identifier: Apache-2.0
// gpukit/checkpoint/detail/profile_chain_impl.hpp: the bodies of
// gpukit/checkpoint/profile_chain.hpp.
#pragma once

#include <gpukit/error.hpp>
#include <gpukit/error_macros.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace gpukit {

inline checkpoint_chain chain_profile::chain() const
{
  std::vector<checkpoint_stage> v;
  v.reserve(stages.size());
  double const ms_per_unit = static_cast<double>(time_unit_ns) / 1e6;
  auto units = [&](double ms) { return std::max<std::int64_t>(1, std::llround(ms / ms_per_unit)); };
  for (auto const& s : stages) {
    v.push_back({units(s.forward_ms), units(s.backward_ms), s.output_bytes, s.tape_bytes});
  }
  return checkpoint_chain{std::move(v)};
}

inline std::int64_t chain_profile::transient_bytes() const noexcept
{
  std::int64_t most = 0;
  for (auto const& s : stages) most = std::max({most, s.forward_transient, s.backward_transient});
  return most;
}

namespace detail {

inline double ckpt_median(std::vector<double> v)
{
  if (v.empty()) return 0.0;
  auto const mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// One profile_chain call: the allocator, the stream, two timing events, the buffers it holds.
template <class Runtime>
class ckpt_profiler final {
 public:
  using stream_type = typename Runtime::stream_type;
  using event_type  = typename Runtime::event_type;

  ckpt_profiler(basic_caching_allocator<Runtime>& allocator, stream_type stream)
      : alloc_{allocator}, rt_{allocator.runtime()}, stream_{stream}
  {
    device_guard<Runtime> guard{rt_, alloc_.device()};
    GPUKIT_CUDA_TRY(rt_.event_create(start_, true), "event_create(timing) for profile_chain");
    typename Runtime::error_type const e = rt_.event_create(stop_, true);
    if (e != Runtime::success) {
      (void)rt_.event_destroy(start_);
      GPUKIT_CUDA_TRY(e, "event_create(timing) for profile_chain");
    }
  }
  ~ckpt_profiler()
  {
    (void)rt_.stream_synchronize(stream_);  // the stages' work may still use the buffers
    for (auto& b : held_) release(b);
    (void)rt_.event_destroy(start_);
    (void)rt_.event_destroy(stop_);
  }
  ckpt_profiler(ckpt_profiler const&)            = delete;
  ckpt_profiler& operator=(ckpt_profiler const&) = delete;

  struct buffer {
    void* ptr{nullptr};
    std::size_t bytes{0};
  };

  // A buffer from the allocator (null for 0 bytes), freed by release() or the destructor.
  buffer take(std::size_t bytes, bool zero = false)
  {
    buffer b;
    if (bytes == 0) return b;
    b.ptr     = alloc_.allocate_async(bytes, stream_);
    b.bytes   = bytes;
    auto slot = std::find_if(held_.begin(), held_.end(), [](buffer const& h) { return !h.ptr; });
    if (slot != held_.end()) {
      *slot = b;
    } else {
      held_.push_back(b);
    }
    if (zero) GPUKIT_CUDA_TRY(rt_.memset_async(b.ptr, 0, bytes, stream_));
    return b;
  }
  void release(buffer& b) noexcept
  {
    buffer const freed = std::exchange(b, buffer{});
    if (freed.ptr == nullptr) return;
    for (auto& h : held_) {
      if (h.ptr == freed.ptr) h = buffer{};
    }
    try {
      alloc_.deallocate_async(freed.ptr, freed.bytes, stream_);
    } catch (...) {  // cannot happen for a pointer this profiler allocated
    }
  }

  void sync() { GPUKIT_CUDA_TRY(rt_.stream_synchronize(stream_)); }
  [[nodiscard]] std::int64_t held() const { return alloc_.stats().requested_bytes.current; }
  [[nodiscard]] std::int64_t peak() const { return alloc_.stats().requested_bytes.peak; }
  void reset_peak() { alloc_.reset_peak(); }

  // Milliseconds `work` takes on the stream, between two timing events (synchronizes).
  template <class Work>
  double time(Work&& work)
  {
    GPUKIT_CUDA_TRY(rt_.event_record(start_, stream_));
    work();
    GPUKIT_CUDA_TRY(rt_.event_record(stop_, stream_));
    GPUKIT_CUDA_TRY(rt_.event_synchronize(stop_));
    float ms = 0.0f;
    GPUKIT_CUDA_TRY(rt_.event_elapsed_time(ms, start_, stop_));
    return static_cast<double>(ms);
  }

  [[nodiscard]] stream_type stream() const noexcept { return stream_; }

 private:
  basic_caching_allocator<Runtime>& alloc_;
  Runtime& rt_;
  stream_type stream_;
  event_type start_{}, stop_{};
  std::vector<buffer> held_;
};

// The calls profile_chain makes of a stage, each with the context the executor would give.
template <class Runtime, class Stages>
struct ckpt_stage_calls {
  using buffer = typename ckpt_profiler<Runtime>::buffer;
  ckpt_profiler<Runtime>& p;
  Stages& stages;
  std::size_t i;
  void const* x_in;

  checkpoint_context context(bool recording) const
  {
    checkpoint_context c;
    c.stage       = i;
    c.recording   = recording;
    c.recomputing = true;
    return c;
  }
  void forward(buffer const& out, buffer const& tape, bool recording)
  {
    ckpt_recomputing_scope scope{true};
    stages.forward(i, x_in, out.ptr, recording ? tape.ptr : nullptr, context(recording),
                   p.stream());
  }
  void backward(buffer const& tape, buffer const& grad_out, buffer const& grad_in)
  {
    ckpt_recomputing_scope scope{true};
    stages.backward(i, x_in, tape.ptr, grad_out.ptr, grad_in.ptr, context(false), p.stream());
  }
};

// Stage i: sizes from the allocator, then the timed runs. Returns x_i (held by the profiler).
template <class Runtime, class Stages>
typename ckpt_profiler<Runtime>::buffer ckpt_profile_stage(ckpt_profiler<Runtime>& p,
                                                           Stages& stages, std::size_t i,
                                                           std::size_t L, void const* x_in,
                                                           chain_profile_options const& o,
                                                           stage_measurement& m)
{
  ckpt_stage_calls<Runtime, Stages> call{p, stages, i, x_in};
  std::size_t const out_bytes  = stages.output_bytes(i);
  std::size_t const tape_bytes = stages.tape_bytes(i);
  // Gradients first: the executor holds δ_i before B<i> and creates δ_{i-1} in it.
  auto grad_out = p.take(i < L ? out_bytes : 0, true);
  auto grad_in  = p.take(i > 1 ? stages.output_bytes(i - 1) : 0, true);
  p.sync();

  // a_i: what a forward without recording leaves held. Its output is x_i for stage i + 1.
  std::int64_t const before = p.held();
  auto x                    = p.take(out_bytes);
  call.forward(x, {}, false);
  p.sync();
  m.output_bytes = p.held() - before;

  // t_i and the transients: a recording forward, then its backward.
  std::int64_t const base = p.held();
  p.reset_peak();
  auto out  = p.take(out_bytes);
  auto tape = p.take(tape_bytes);
  call.forward(out, tape, true);
  p.sync();
  std::int64_t const recorded = p.held() - base;
  m.tape_bytes                = std::max<std::int64_t>(0, recorded - m.output_bytes);
  m.forward_transient         = std::max<std::int64_t>(0, p.peak() - base - recorded);
  std::int64_t const start    = p.held();
  p.reset_peak();
  call.backward(tape, grad_out, grad_in);
  p.sync();
  m.backward_transient = std::max<std::int64_t>(0, p.peak() - start);
  p.release(tape);

  // Times: forward without and with recording, then the backward (which may consume the tape).
  for (std::size_t rep = 0; rep < o.warmup + o.repetitions; ++rep) {
    tape            = p.take(tape_bytes);
    double const fn = p.time([&] { call.forward(out, {}, false); });
    double const fe = p.time([&] { call.forward(out, tape, true); });
    double const b  = p.time([&] { call.backward(tape, grad_out, grad_in); });
    p.release(tape);
    if (rep < o.warmup) continue;
    m.forward_samples.push_back(fn);
    m.forward_samples.push_back(fe);
    m.backward_samples.push_back(b);
  }
  m.forward_ms  = ckpt_median(m.forward_samples);
  m.backward_ms = ckpt_median(m.backward_samples);
  p.release(out);
  p.release(grad_out);
  p.release(grad_in);
  return x;
}

}  // namespace detail

template <class Runtime, class Stages>
chain_profile profile_chain(basic_caching_allocator<Runtime>& allocator, Stages& stages,
                            std::size_t L, void const* x0, typename Runtime::stream_type stream,
                            chain_profile_options const& options)
{
  GPUKIT_EXPECTS(L >= 1, "profile_chain: a chain needs at least one stage");
  GPUKIT_EXPECTS(options.repetitions >= 1, "profile_chain: repetitions = 0; at least 1 is needed");
  GPUKIT_EXPECTS(options.time_unit_ns >= 1,
                 "profile_chain: time_unit_ns = " + std::to_string(options.time_unit_ns) +
                   "; it must be at least 1");
  chain_profile result;
  result.time_unit_ns = options.time_unit_ns;
  result.stages.resize(L);
  detail::ckpt_profiler<Runtime> p{allocator, stream};
  typename detail::ckpt_profiler<Runtime>::buffer x_prev;
  for (std::size_t i = 1; i <= L; ++i) {
    void const* x_in = i == 1 ? x0 : x_prev.ptr;
    auto x = detail::ckpt_profile_stage(p, stages, i, L, x_in, options, result.stages[i - 1]);
    p.sync();  // stage i's work on x_{i-1} is done
    p.release(x_prev);
    x_prev = x;
  }
  p.sync();
  p.release(x_prev);
  return result;
}

}  // namespace gpukit
