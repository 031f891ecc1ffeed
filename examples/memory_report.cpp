// SPDX-License-Identifier: Apache-2.0
// memory_report: record what the caching allocator does over a few training-like steps whose
// shapes vary, then write what it saw: a JSON snapshot, a trace replay_trace can replay, a
// PyTorch memory snapshot (python -m torch.cuda._memory_viz trace_plot memory.pickle -o t.html)
// and a self-contained HTML report.
//
//   memory_report [--sim] [--out DIR]     (the GPU when there is one, else the simulated GPU)
#include <gpukit/memory/caching_allocator.hpp>
#include <gpukit/memory/memory_history.hpp>
#include <gpukit/runtime/cuda_runtime.hpp>
#include <gpukit/runtime/sim_runtime.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Writes `text` to `path`, or throws naming the file.
void write_file(std::string const& path, std::string const& text)
{
  std::ofstream f{path, std::ios::binary};
  f << text;
  f.close();
  if (!f) { throw std::runtime_error{"cannot write " + path}; }
}

template <class Runtime>
int run(Runtime& rt, std::string const& out, char const* where)
{
  gpukit::basic_caching_allocator<Runtime> alloc{rt, 0};
  typename Runtime::stream_type compute{}, copy{};
  GPUKIT_CUDA_TRY(rt.stream_create(compute));
  GPUKIT_CUDA_TRY(rt.stream_create(copy));
  alloc.start_recording();
  std::mt19937 rng{7};
  constexpr std::size_t MiB = std::size_t{1} << 20;
  for (int step = 0; step < 6; ++step) {
    std::size_t const seq = 64 + rng() % 960;  // the sequence length varies every step
    void* batch           = alloc.allocate_async(seq * 4096, copy);
    alloc.record_stream(batch, compute);
    std::vector<std::pair<void*, std::size_t>> activations;
    for (int layer = 0; layer < 12; ++layer) {  // forward: activations pile up
      std::size_t const bytes = seq * (layer % 3 == 0 ? 3 * MiB / 64 : MiB / 32);
      activations.emplace_back(alloc.allocate_async(bytes, compute), bytes);
    }
    while (!activations.empty()) {  // backward: they go, in reverse
      void* grad = alloc.allocate_async(activations.back().second, compute);
      alloc.deallocate_async(grad, activations.back().second, compute);
      alloc.deallocate_async(activations.back().first, activations.back().second, compute);
      activations.pop_back();
    }
    alloc.deallocate_async(batch, seq * 4096, copy);
  }
  alloc.stop_recording();
  GPUKIT_CUDA_TRY(rt.stream_synchronize(compute));
  GPUKIT_CUDA_TRY(rt.stream_synchronize(copy));
  gpukit::memory_snapshot const snap = alloc.snapshot();
  write_file(out + "/memory.json", gpukit::to_json(snap));
  write_file(out + "/memory.trace", gpukit::to_trace(snap));
  write_file(out + "/memory.pickle", gpukit::to_pytorch_pickle(snap));
  write_file(out + "/memory.html", gpukit::to_html(snap));
  auto const st = alloc.stats();
  std::printf(
    "memory_report on %s: %zu events, %zu segments, peak allocated %.1f MiB, peak reserved %.1f "
    "MiB\n",
    where, snap.events.size(), snap.segments.size(), st.allocated_bytes.peak / 1048576.0,
    st.reserved_bytes.peak / 1048576.0);
  std::printf("wrote %s/memory.{json,trace,pickle,html}\n", out.c_str());
  alloc.forget_stream(compute);
  alloc.forget_stream(copy);
  GPUKIT_CUDA_TRY(rt.stream_destroy(compute));
  GPUKIT_CUDA_TRY(rt.stream_destroy(copy));
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  bool sim        = false;
  std::string out = ".";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sim") == 0) {
      sim = true;
    } else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: memory_report [--sim] [--out DIR]\n");
      return 2;
    }
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(out, ec)) {
    std::fprintf(stderr, "memory_report: --out %s: not a directory\n", out.c_str());
    return 2;
  }
  try {
    int n = 0;
    if (!sim && gpukit::cuda_runtime::instance().device_count(n) == cudaSuccess && n > 0) {
      return run(gpukit::cuda_runtime::instance(), out, "the GPU");
    }
    gpukit::sim_runtime rt{gpukit::sim_config{}.with_devices(1, std::size_t{16} << 30)};
    return run(rt, out, "the simulated GPU");
  } catch (std::exception const& e) {
    std::fprintf(stderr, "memory_report: %s\n", e.what());
    return 1;
  }
}
