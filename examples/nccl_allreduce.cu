// SPDX-License-Identifier: Apache-2.0
// nccl_allreduce: an NCCL all-reduce (sum) over buffers from gpukit's caching allocator, one
// process per GPU, as DistributedDataParallel runs; the sums are checked, and the bus bandwidth is
// measured against the same all-reduce over cudaMalloc buffers in the same run.
//
//   build/h200/bin/examples/nccl_allreduce                  # every GPU, 1 MiB .. 1 GiB
//   build/h200/bin/examples/nccl_allreduce --quick          # 1 MiB .. 16 MiB, few iterations
//   options: --gpus N  --min-mib M  --max-mib M  --iters I  --reps R
//            --source automatic|synchronous|growable   (gpukit's segment source)
//            --id-from parent|rank0   (who calls ncclGetUniqueId; default: the parent, before it
//                                      forks, so that it never initializes CUDA itself)
//
// The launcher needs no MPI: the parent process counts the GPUs in a child of its own (the parent
// never initializes CUDA, which does not survive fork), creates the ncclUniqueId, forks one
// process per GPU and waits for them. Each rank makes its GPU current, builds a caching allocator
// for it, takes its send and receive buffers from gpukit (and a second pair from cudaMalloc),
// joins the communicator (ncclCommInitRank) and, for each size, fills its send buffer with
// (rank + 1) * (i % 7 + 1), runs ncclAllReduce (float, sum), checks on the GPU that every element
// is n(n+1)/2 * (i % 7 + 1), and times `iters` all-reduces with CUDA events (median of `reps`
// alternating runs of gpukit and cudaMalloc buffers). Bus bandwidth is nccl-tests':
// bytes / time * 2(n-1)/n. Rank 0 prints one line per size:
//
//   size_bytes=1048576 gpukit_us=... gpukit_busbw_GBps=... cudamalloc_us=...
//   cudamalloc_busbw_GBps=... ratio=... sums=ok
//
// and finally "nccl_allreduce: N ranks, all sums right" (exit 0) or what failed (exit 1).
// Fewer than 2 GPUs: it says so and exits 77 (CTest: skipped).
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                              \
  do {                                                                                \
    cudaError_t const e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "nccl_allreduce rank %d: %s: %s (%s:%d)\n", g_rank, #call, \
                   cudaGetErrorString(e_), __FILE__, __LINE__);                       \
      std::_Exit(1);                                                                  \
    }                                                                                 \
  } while (0)

#define CHECK_NCCL(call)                                                              \
  do {                                                                                \
    ncclResult_t const r_ = (call);                                                   \
    if (r_ != ncclSuccess) {                                                          \
      std::fprintf(stderr, "nccl_allreduce rank %d: %s: %s (%s:%d)\n", g_rank, #call, \
                   ncclGetErrorString(r_), __FILE__, __LINE__);                       \
      std::_Exit(1);                                                                  \
    }                                                                                 \
  } while (0)

int g_rank = -1;

struct options {
  int gpus{0};  // 0: every GPU
  std::size_t min_bytes{std::size_t{1} << 20};
  std::size_t max_bytes{std::size_t{1} << 30};
  int iters{20};
  int reps{3};
  gpukit::segment_source source{gpukit::segment_source::automatic};
  char const* source_name{"automatic"};
  bool id_from_parent{true};
};

[[noreturn]] void usage(char const* why)
{
  std::fprintf(stderr,
               "nccl_allreduce: %s\nusage: nccl_allreduce [--quick] [--gpus N] [--min-mib M] "
               "[--max-mib M] [--iters I] [--reps R] [--source automatic|synchronous|growable] "
               "[--id-from parent|rank0]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv)
{
  options o;
  auto number = [&](int& i) {
    if (i + 1 >= argc) { usage((std::string{argv[i]} + " needs a value").c_str()); }
    char* end    = nullptr;
    long const v = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || v <= 0) {
      usage((std::string{argv[i - 1]} + ": not a positive number: " + argv[i]).c_str());
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--quick") {
      o.max_bytes = std::size_t{16} << 20;
      o.iters     = 5;
      o.reps      = 1;
    } else if (a == "--gpus") {
      o.gpus = static_cast<int>(number(i));
    } else if (a == "--min-mib") {
      o.min_bytes = static_cast<std::size_t>(number(i)) << 20;
    } else if (a == "--max-mib") {
      o.max_bytes = static_cast<std::size_t>(number(i)) << 20;
    } else if (a == "--iters") {
      o.iters = static_cast<int>(number(i));
    } else if (a == "--reps") {
      o.reps = static_cast<int>(number(i));
    } else if (a == "--source" && i + 1 < argc) {
      std::string const s = argv[++i];
      o.source_name       = argv[i];
      if (s == "automatic") {
        o.source = gpukit::segment_source::automatic;
      } else if (s == "synchronous") {
        o.source = gpukit::segment_source::synchronous;
      } else if (s == "growable") {
        o.source = gpukit::segment_source::growable;
      } else {
        usage(("unknown --source " + s).c_str());
      }
    } else if (a == "--id-from" && i + 1 < argc) {
      std::string const s = argv[++i];
      if (s != "parent" && s != "rank0") { usage(("unknown --id-from " + s).c_str()); }
      o.id_from_parent = s == "parent";
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  if (o.min_bytes > o.max_bytes) { usage("--min-mib is larger than --max-mib"); }
  return o;
}

__global__ void fill(float* x, std::size_t n, int rank)
{
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
  }
}

__global__ void count_wrong(float const* x, std::size_t n, int ranks, unsigned long long* wrong)
{
  unsigned long long mine = 0;
  float const total       = static_cast<float>(ranks * (ranks + 1) / 2);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (x[i] != total * static_cast<float>(i % 7 + 1)) { ++mine; }
  }
  if (mine != 0) { atomicAdd(wrong, mine); }
}

/// Counts the GPUs in a child process, so that this one never initializes CUDA (a process that
/// has cannot fork ranks that use it).
int count_gpus()
{
  pid_t const pid = ::fork();
  if (pid < 0) { return 0; }
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { n = 0; }
    std::_Exit(std::min(n, 100));
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) { return 0; }
  return WEXITSTATUS(status);
}

struct buffers {
  float* send;
  float* recv;
};

/// Median of `reps` timings of `iters` all-reduces of `count` floats (microseconds per call).
float time_allreduce(buffers b, std::size_t count, ncclComm_t comm, cudaStream_t s, int iters,
                     cudaEvent_t start, cudaEvent_t stop)
{
  CHECK_NCCL(ncclAllReduce(b.send, b.recv, count, ncclFloat, ncclSum, comm, s));  // warm-up
  CHECK_CUDA(cudaEventRecord(start, s));
  for (int i = 0; i < iters; ++i) {
    CHECK_NCCL(ncclAllReduce(b.send, b.recv, count, ncclFloat, ncclSum, comm, s));
  }
  CHECK_CUDA(cudaEventRecord(stop, s));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  return ms * 1000.0f / static_cast<float>(iters);
}

/// Fills, all-reduces once and counts wrong sums of `count` floats (on every rank).
unsigned long long check_sums(buffers b, std::size_t count, ncclComm_t comm, cudaStream_t s,
                              int rank, int ranks, unsigned long long* wrong_d)
{
  fill<<<1024, 256, 0, s>>>(b.send, count, rank);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemsetAsync(b.recv, 0xff, count * sizeof(float), s));  // NaN until reduced
  CHECK_NCCL(ncclAllReduce(b.send, b.recv, count, ncclFloat, ncclSum, comm, s));
  CHECK_CUDA(cudaMemsetAsync(wrong_d, 0, sizeof(unsigned long long), s));
  count_wrong<<<1024, 256, 0, s>>>(b.recv, count, ranks, wrong_d);
  CHECK_CUDA(cudaGetLastError());
  unsigned long long wrong = 0;
  CHECK_CUDA(cudaMemcpyAsync(&wrong, wrong_d, sizeof wrong, cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  return wrong;
}

int run_rank(int rank, int ranks, ncclUniqueId id, options const& o)
{
  g_rank = rank;
  CHECK_CUDA(cudaSetDevice(rank));
  auto& rt = gpukit::cuda_runtime::instance();
  gpukit::caching_allocator_options ao;
  ao.source = o.source;
  gpukit::caching_allocator alloc{rt, rank, ao};
  cudaStream_t s{};
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::size_t const max_count = o.max_bytes / sizeof(float);
  buffers gk{static_cast<float*>(alloc.allocate_async(o.max_bytes, s)),
             static_cast<float*>(alloc.allocate_async(o.max_bytes, s))};
  buffers cm{};
  CHECK_CUDA(cudaMalloc(&cm.send, o.max_bytes));
  CHECK_CUDA(cudaMalloc(&cm.recv, o.max_bytes));
  unsigned long long* wrong_d = nullptr;
  CHECK_CUDA(cudaMalloc(&wrong_d, sizeof(unsigned long long)));
  cudaEvent_t start{}, stop{};
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaStreamSynchronize(s));

  ncclComm_t comm{};
  CHECK_NCCL(ncclCommInitRank(&comm, ranks, id, rank));
  if (rank == 0) {
    cudaDeviceProp p{};
    CHECK_CUDA(cudaGetDeviceProperties(&p, 0));
    int nccl = 0;
    CHECK_NCCL(ncclGetVersion(&nccl));
    std::printf(
      "nccl_allreduce: %d ranks (%s), NCCL %d, gpukit segment source %s, %d iterations "
      "x %d reps per size\n",
      ranks, p.name, nccl, o.source_name, o.iters, o.reps);
    std::fflush(stdout);
  }
  double const bus_factor      = 2.0 * (ranks - 1) / ranks;
  unsigned long long all_wrong = 0;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes && bytes / sizeof(float) <= max_count;
       bytes *= 2) {
    std::size_t const count  = bytes / sizeof(float);
    unsigned long long wrong = check_sums(gk, count, comm, s, rank, ranks, wrong_d) +
                               check_sums(cm, count, comm, s, rank, ranks, wrong_d);
    std::vector<float> t_gk, t_cm;
    for (int r = 0; r < o.reps; ++r) {  // alternating, so that drift hits both alike
      t_gk.push_back(time_allreduce(gk, count, comm, s, o.iters, start, stop));
      t_cm.push_back(time_allreduce(cm, count, comm, s, o.iters, start, stop));
    }
    std::sort(t_gk.begin(), t_gk.end());
    std::sort(t_cm.begin(), t_cm.end());
    float const us_gk = t_gk[t_gk.size() / 2];
    float const us_cm = t_cm[t_cm.size() / 2];
    // Every rank's wrong count, summed on every rank (so rank 0 reports them all).
    CHECK_CUDA(cudaMemcpyAsync(wrong_d, &wrong, sizeof wrong, cudaMemcpyHostToDevice, s));
    CHECK_NCCL(ncclAllReduce(wrong_d, wrong_d, 1, ncclUint64, ncclSum, comm, s));
    CHECK_CUDA(cudaMemcpyAsync(&wrong, wrong_d, sizeof wrong, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    all_wrong += wrong;
    if (rank == 0) {
      double const bw_gk = static_cast<double>(bytes) / (us_gk * 1e-6) / 1e9 * bus_factor;
      double const bw_cm = static_cast<double>(bytes) / (us_cm * 1e-6) / 1e9 * bus_factor;
      std::printf(
        "size_bytes=%zu gpukit_us=%.1f gpukit_busbw_GBps=%.2f cudamalloc_us=%.1f "
        "cudamalloc_busbw_GBps=%.2f ratio=%.3f sums=%s\n",
        bytes, us_gk, bw_gk, us_cm, bw_cm, bw_gk / bw_cm,
        wrong == 0 ? "ok" : (std::to_string(wrong) + "_wrong").c_str());
      std::fflush(stdout);
    }
  }
  CHECK_NCCL(ncclCommFinalize(comm));
  CHECK_NCCL(ncclCommDestroy(comm));
  alloc.deallocate_async(gk.send, o.max_bytes, s);
  alloc.deallocate_async(gk.recv, o.max_bytes, s);
  alloc.forget_stream(s);
  CHECK_CUDA(cudaFree(cm.send));
  CHECK_CUDA(cudaFree(cm.recv));
  CHECK_CUDA(cudaFree(wrong_d));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  if (rank == 0) {
    auto const st = alloc.stats();
    std::printf("rank 0 gpukit allocator: reserved peak %lld bytes, %llu device allocations\n",
                static_cast<long long>(st.reserved_bytes.peak),
                static_cast<unsigned long long>(st.num_device_allocs));
  }
  alloc.release();
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  return all_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  options const o = parse(argc, argv);
  int const found = count_gpus();
  int const ranks = o.gpus == 0 ? found : o.gpus;
  if (found < 2 || ranks < 2) {
    std::printf("nccl_allreduce: needs at least 2 GPUs, found %d: skipped\n", found);
    return 77;
  }
  if (ranks > found) {
    std::fprintf(stderr, "nccl_allreduce: --gpus %d, but only %d GPUs are present\n", ranks, found);
    return 2;
  }
  std::fflush(stdout);

  // The unique id: made here before forking (NCCL's bootstrap root thread then runs in this
  // process, which outlives the ranks), or by rank 0, which hands it to the others through a pipe.
  ncclUniqueId id{};
  int id_pipe[2]{-1, -1};
  if (o.id_from_parent) {
    CHECK_NCCL(ncclGetUniqueId(&id));
  } else if (::pipe(id_pipe) != 0) {
    std::perror("nccl_allreduce: pipe");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t const pid = ::fork();
    if (pid < 0) {
      std::perror("nccl_allreduce: fork");
      return 1;
    }
    if (pid == 0) {
      if (!o.id_from_parent) {
        if (r == 0) {
          g_rank = 0;
          CHECK_NCCL(ncclGetUniqueId(&id));
          for (int k = 1; k < ranks; ++k) {  // one whole id per write (atomic below PIPE_BUF)
            if (::write(id_pipe[1], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
              std::_Exit(1);
            }
          }
        } else if (::read(id_pipe[0], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
          std::_Exit(1);
        }
      }
      int code = 1;
      try {
        code = run_rank(r, ranks, id, o);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "nccl_allreduce rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::_Exit(code);
    }
    pids.push_back(pid);
  }
  // A rank that fails leaves the others blocked in a collective: stop them too.
  int failed = 0;
  for (std::size_t left = pids.size(); left != 0; --left) {
    int status      = 0;
    pid_t const pid = ::waitpid(-1, &status, 0);
    if (pid < 0) { break; }
    auto const r = std::find(pids.begin(), pids.end(), pid) - pids.begin();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (failed++ == 0) {
        for (pid_t other : pids) {
          if (other != pid) { ::kill(other, SIGTERM); }
        }
      }
      std::fprintf(stderr, "nccl_allreduce: rank %d failed (status %d)\n", static_cast<int>(r),
                   status);
    }
  }
  if (failed != 0) {
    std::printf("nccl_allreduce: %d of %d ranks failed or found wrong sums\n", failed, ranks);
    return 1;
  }
  std::printf("nccl_allreduce: %d ranks, all sums right\n", ranks);
  return 0;
}
