// SPDX-License-Identifier: Apache-2.0
// checkpoint_mlp_stages.cuh: the MLP chain of checkpoint_mlp.cu as the checkpoint executor's Stages
// (deterministic kernels, dropout from the executor's per-stage seed, running statistics updated
// once per step), shared with the tests and benchmarks that run the same stages.
//
//   checkpoint_mlp::mlp net{layers, batch, width};        // parameters, gradients, statistics
//   checkpoint_mlp::mlp_stages stages{net, std::vector<int>(layers + 1, 0)};
//   exec.run_async(plan.schedule, stages, layers, x0, stream);
//
// Stage i is a linear layer with tanh and dropout (p = 1/8, its mask drawn from the executor's
// per-stage seed): x_i = tanh(W_i x_{i-1} + b_i) * mask_i. Widths alternate W, 4W, W, 4W, ...
// The tape of a recording forward is the pre-activation z_i. The loss is 0.5 |x_L|^2.
#pragma once

#include <gpukit/checkpoint/executor.hpp>
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace checkpoint_mlp {

#define CHECK_CUDA(call)                                                                      \
  do {                                                                                        \
    cudaError_t const e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "checkpoint_mlp: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), \
                   __FILE__, __LINE__);                                                       \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr int tile = 16;

// C[M x N] (+)= op(A) * op(B), row-major. op(A) is M x K: A is M x K, or K x M when TA. op(B) is
// K x N: B is K x N, or N x K when TB. One thread per element of C, the K sum in order: the same
// bits on every run.
template <bool TA, bool TB, bool Accumulate>
__global__ void gemm(float const* __restrict__ A, float const* __restrict__ B,
                     float* __restrict__ C, int M, int N, int K)
{
  __shared__ float as[tile][tile + 1];
  __shared__ float bs[tile][tile + 1];
  int const ty = threadIdx.y, tx = threadIdx.x;
  int const row0 = blockIdx.y * tile, col0 = blockIdx.x * tile;
  int const row = row0 + ty, col = col0 + tx;
  float acc = 0.0f;
  // as[m][k] = opA(row0 + m, k0 + k), bs[k][n] = opB(k0 + k, col0 + n). Transposed operands are
  // loaded with the thread indices swapped, so that neighbouring threads read neighbouring words.
  for (int k0 = 0; k0 < K; k0 += tile) {
    if (TA) {  // A is K x M
      int const k = k0 + ty, m = row0 + tx;
      as[tx][ty] = (k < K && m < M) ? A[static_cast<std::size_t>(k) * M + m] : 0.0f;
    } else {  // A is M x K
      int const k = k0 + tx;
      as[ty][tx]  = (row < M && k < K) ? A[static_cast<std::size_t>(row) * K + k] : 0.0f;
    }
    if (TB) {  // B is N x K
      int const k = k0 + tx, n = col0 + ty;
      bs[tx][ty] = (k < K && n < N) ? B[static_cast<std::size_t>(n) * K + k] : 0.0f;
    } else {  // B is K x N
      int const k = k0 + ty;
      bs[ty][tx]  = (k < K && col < N) ? B[static_cast<std::size_t>(k) * N + col] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < tile; ++k) acc = fmaf(as[threadIdx.y][k], bs[k][threadIdx.x], acc);
    __syncthreads();
  }
  if (row < M && col < N) {
    float& c = C[static_cast<std::size_t>(row) * N + col];
    c        = Accumulate ? c + acc : acc;
  }
}

template <bool TA, bool TB, bool Accumulate>
void launch_gemm(float const* A, float const* B, float* C, int M, int N, int K, cudaStream_t s)
{
  dim3 const block(tile, tile);
  dim3 const grid((N + tile - 1) / tile, (M + tile - 1) / tile);
  gemm<TA, TB, Accumulate><<<grid, block, 0, s>>>(A, B, C, M, N, K);
}

__device__ __forceinline__ float dropout_scale(std::uint64_t seed, std::size_t j)
{
  std::uint64_t z = seed + j * 0x9E3779B97F4A7C15ull;
  z               = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z               = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (z & 7) == 0 ? 0.0f : 8.0f / 7.0f;  // drop 1 in 8, scale the rest
}

// z += bias (per column); x = tanh(z) * mask; the tape keeps z when recording.
__global__ void bias_act(float* z, float const* bias, float* x, float* tape, int rows, int cols,
                         std::uint64_t seed)
{
  std::size_t const j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (j >= static_cast<std::size_t>(rows) * cols) return;
  float const v = z[j] + bias[j % cols];
  if (tape != nullptr) tape[j] = v;
  x[j] = tanhf(v) * dropout_scale(seed, j);
}

// dz = g * mask * (1 - tanh(z)^2), where g = grad_out, or x_L = tanh(z) * mask for the loss
// 0.5 |x_L|^2 (grad_out null). Written over the tape (z is not needed after).
__global__ void act_backward(float* tape, float const* grad_out, int rows, int cols,
                             std::uint64_t seed)
{
  std::size_t const j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (j >= static_cast<std::size_t>(rows) * cols) return;
  float const t = tanhf(tape[j]);
  float const m = dropout_scale(seed, j);
  float const g = grad_out != nullptr ? grad_out[j] : t * m;
  tape[j]       = g * m * (1.0f - t * t);
}

// db[c] += sum over rows of dz[r][c], rows in order.
__global__ void column_sum(float const* dz, float* db, int rows, int cols)
{
  int const c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += dz[static_cast<std::size_t>(r) * cols + c];
  db[c] += s;
}

// running[c] = 0.9 running[c] + 0.1 mean over rows of x[r][c]: a side effect that must happen
// once per step (BatchNorm's running statistics).
__global__ void running_mean(float const* x, float* running, int rows, int cols)
{
  int const c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += x[static_cast<std::size_t>(r) * cols + c];
  running[c] = 0.9f * running[c] + 0.1f * (s / static_cast<float>(rows));
}

int blocks_for(std::size_t n) { return static_cast<int>((n + 255) / 256); }

// The chain's parameters, gradients and running statistics (plain cudaMalloc: not activations).
struct mlp {
  int batch{0};
  std::vector<int> width;  // width[0] = input, width[i] = stage i's output
  std::vector<float*> w, b, dw, db, running;
  std::size_t parameters{0};

  int layers() const { return static_cast<int>(width.size()) - 1; }
  std::size_t out_bytes(std::size_t i) const
  {
    return static_cast<std::size_t>(batch) * width[i] * sizeof(float);
  }

  mlp(int layers, int batch_size, int narrow)
  {
    batch = batch_size;
    width.push_back(narrow);
    for (int i = 1; i <= layers; ++i) width.push_back(i % 2 == 1 ? 4 * narrow : narrow);
    w.assign(layers + 1, nullptr), b = dw = db = running = w;
    for (int i = 1; i <= layers; ++i) {
      std::size_t const n = static_cast<std::size_t>(width[i]) * width[i - 1];
      std::vector<float> host(n);
      std::uint64_t z = 12345 + i;
      float const s   = 1.0f / std::sqrt(static_cast<float>(width[i - 1]));
      for (auto& v : host) {  // xorshift: fixed weights, uniform in [-s, s]
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        v = s * (static_cast<float>(z % 20001) / 10000.0f - 1.0f);
      }
      CHECK_CUDA(cudaMalloc(&w[i], n * sizeof(float)));
      CHECK_CUDA(cudaMemcpy(w[i], host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMalloc(&dw[i], n * sizeof(float)));
      for (float** p : {&b[i], &db[i], &running[i]}) {
        CHECK_CUDA(cudaMalloc(p, width[i] * sizeof(float)));
        CHECK_CUDA(cudaMemset(*p, 0, width[i] * sizeof(float)));
      }
      parameters += n + width[i];
    }
  }
  ~mlp()
  {
    for (auto* v : {&w, &b, &dw, &db, &running})
      for (float* p : *v) cudaFree(p);
  }
  mlp(mlp const&)            = delete;
  mlp& operator=(mlp const&) = delete;

  void zero_grads(cudaStream_t s)
  {
    for (int i = 1; i <= layers(); ++i) {
      CHECK_CUDA(cudaMemsetAsync(
        dw[i], 0, sizeof(float) * static_cast<std::size_t>(width[i]) * width[i - 1], s));
      CHECK_CUDA(cudaMemsetAsync(db[i], 0, sizeof(float) * width[i], s));
    }
  }
  void reset_running(cudaStream_t s)
  {
    for (int i = 1; i <= layers(); ++i)
      CHECK_CUDA(cudaMemsetAsync(running[i], 0, sizeof(float) * width[i], s));
  }
  // Every gradient and running statistic, copied to the host (synchronizes).
  std::vector<float> snapshot()
  {
    std::vector<float> out;
    for (int i = 1; i <= layers(); ++i) {
      std::size_t const n  = static_cast<std::size_t>(width[i]) * width[i - 1];
      std::size_t const at = out.size();
      out.resize(at + n + 2 * width[i]);
      CHECK_CUDA(cudaMemcpy(out.data() + at, dw[i], n * sizeof(float), cudaMemcpyDeviceToHost));
      CHECK_CUDA(
        cudaMemcpy(out.data() + at + n, db[i], width[i] * sizeof(float), cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(out.data() + at + n + width[i], running[i], width[i] * sizeof(float),
                            cudaMemcpyDeviceToHost));
    }
    return out;
  }
};

// The executor's view of the MLP: forward and backward enqueue kernels on the stream.
struct mlp_stages {
  mlp& net;
  std::vector<int> first_forwards;  // forwards that were not recomputations, per stage

  std::size_t output_bytes(std::size_t i) { return net.out_bytes(i); }
  std::size_t tape_bytes(std::size_t i) { return net.out_bytes(i); }  // z_i

  void forward(std::size_t i, void const* x_in, void* x_out, void* tape,
               gpukit::checkpoint_context const& c, cudaStream_t s)
  {
    int const rows = net.batch, in = net.width[i - 1], out = net.width[i];
    auto* x = static_cast<float*>(x_out);
    // z into x_out, then x = tanh(z + b) * mask in place (z kept in the tape when recording).
    launch_gemm<false, true, false>(static_cast<float const*>(x_in), net.w[i], x, rows, out, in, s);
    bias_act<<<blocks_for(static_cast<std::size_t>(rows) * out), 256, 0, s>>>(
      x, net.b[i], x, static_cast<float*>(tape), rows, out, c.rng_seed);
    if (!c.is_recomputing()) {  // side effects once per step
      running_mean<<<blocks_for(out), 256, 0, s>>>(x, net.running[i], rows, out);
      ++first_forwards[i];
    }
  }

  void backward(std::size_t i, void const* x_in, void const* tape, void const* grad_out,
                void* grad_in, gpukit::checkpoint_context const& c, cudaStream_t s)
  {
    int const rows = net.batch, in = net.width[i - 1], out = net.width[i];
    // The tape (z) becomes dz: the executor frees it right after this backward.
    auto* dz = static_cast<float*>(const_cast<void*>(tape));
    act_backward<<<blocks_for(static_cast<std::size_t>(rows) * out), 256, 0, s>>>(
      dz, static_cast<float const*>(grad_out), rows, out, c.rng_seed);
    launch_gemm<true, false, true>(dz, static_cast<float const*>(x_in), net.dw[i], out, in, rows,
                                   s);                                     // dW += dz^T x
    column_sum<<<blocks_for(out), 256, 0, s>>>(dz, net.db[i], rows, out);  // db += sum dz
    if (grad_in != nullptr) {
      launch_gemm<false, false, false>(dz, net.w[i], static_cast<float*>(grad_in), rows, in, out,
                                       s);  // dx = dz W
    }
  }
};

// The allocator's settings for exact statistics: every block through the pool, none through a
// per-thread cache.
inline gpukit::caching_allocator_options exact_statistics()
{
  gpukit::caching_allocator_options options;
  options.thread_cache_max_block_bytes = 0;
  return options;
}

// Everything a run of the MLP on device 0 needs: an allocator with exact statistics, a stream,
// the net and its stages, an input of zeros (not from the allocator: the caller's x_0).
struct gpu_run {
  gpukit::caching_allocator alloc;
  cudaStream_t stream{nullptr};
  mlp net;
  mlp_stages stages;
  float* x0{nullptr};

  gpu_run(int layers, int batch, int width)
      : alloc{gpukit::cuda_runtime::instance(), 0, exact_statistics()}, net{layers, batch, width},
        stages{net, std::vector<int>(static_cast<std::size_t>(layers) + 1, 0)}
  {
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&x0, net.out_bytes(0)));
    CHECK_CUDA(cudaMemset(x0, 0, net.out_bytes(0)));
  }
  ~gpu_run()
  {
    (void)cudaStreamSynchronize(stream);
    alloc.forget_stream(stream);
    (void)cudaStreamDestroy(stream);
    (void)cudaFree(x0);
  }
  gpu_run(gpu_run const&)            = delete;
  gpu_run& operator=(gpu_run const&) = delete;
  [[nodiscard]] std::size_t layers() const { return static_cast<std::size_t>(net.layers()); }
};

// One plan's step on the GPU: the allocator's peak requested bytes beyond what it held before
// (one step), and the median time of `reps` steps after a warm-up step (CUDA events).
struct step_measurement {
  std::int64_t peak_bytes{0};
  double step_ms{0.0};
};

inline step_measurement measure_steps(gpukit::checkpoint_executor& exec,
                                      gpukit::checkpoint_schedule const& schedule,
                                      mlp_stages& stages, void const* x0, cudaStream_t stream,
                                      int reps)
{
  auto& alloc         = exec.allocator();
  std::size_t const L = static_cast<std::size_t>(stages.net.layers());
  step_measurement m;
  CHECK_CUDA(cudaStreamSynchronize(stream));
  alloc.reset_peak();
  std::int64_t const base = alloc.stats().requested_bytes.current;
  (void)exec.run_async(schedule, stages, L, x0, stream, 1);  // also the warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  m.peak_bytes = alloc.stats().requested_bytes.peak - base;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int rep = 0; rep < reps; ++rep) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    (void)exec.run_async(schedule, stages, L, x0, stream, 1);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  m.step_ms = ms.empty() ? 0.0 : ms[ms.size() / 2];
  return m;
}

}  // namespace checkpoint_mlp
