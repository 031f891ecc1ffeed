// empty_free's pattern through gpukit_torch's backend on the sim: 1000 log-uniform sizes, each
// freed at once.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <gpukit/gpukit.hpp>
#include <gpukit_torch/backend.hpp>
#include <random>
#include <string>
#include <vector>
int main(int argc, char** argv)
{
#ifdef REAL
  auto& sim = gpukit::cuda_runtime::instance();
  using R   = gpukit::cuda_runtime;
#else
  gpukit::sim_runtime sim{gpukit::sim_config{}.with_devices(1, std::size_t{80} << 30)};
  using R = gpukit::sim_runtime;
#endif
  std::string conf = gpukit_torch::backend_default_conf;
  if (argc > 1 && argv[1][0] != 0 && std::string(argv[1]) != "-")
    conf += std::string(",") + argv[1];
  gpukit_torch::backend<R> b{sim, gpukit_torch::parse_backend_conf(conf)};
  using S = gpukit_torch::backend<R>::stream_type;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(std::log(512.0), std::log(16.0 * 1024 * 1024));
  std::vector<std::size_t> sizes(1000);
  for (auto& s : sizes) s = static_cast<std::size_t>(std::exp(u(rng)));
  int live = argc > 2 ? std::atoi(argv[2]) : 0;
  std::vector<void*> ring(live > 0 ? live : 1, nullptr);
  double best = 1e30;
  for (int round = 0; round < 7; ++round) {
    auto t0       = std::chrono::steady_clock::now();
    std::size_t j = 0;
    for (int k = 0; k < 20; ++k)
      for (auto s : sizes) {
        void* p = b.allocate(0, s, S{});
        if (live <= 0) {
          b.deallocate(p);
          continue;
        }
        if (ring[j]) b.deallocate(ring[j]);
        ring[j] = p;
        j       = (j + 1) % ring.size();
      }
    auto t1 = std::chrono::steady_clock::now();
    best    = std::min(
         best, std::chrono::duration<double, std::nano>(t1 - t0).count() / (20.0 * sizes.size()));
  }
#ifdef REAL
  {
    int dev = 0;
    cudaStreamCaptureStatus cs;
    double t[2] = {1e30, 1e30};
    for (int r = 0; r < 5; ++r) {
      auto a = std::chrono::steady_clock::now();
      for (int i = 0; i < 100000; ++i) cudaGetDevice(&dev);
      auto m = std::chrono::steady_clock::now();
      for (int i = 0; i < 100000; ++i) cudaStreamIsCapturing(nullptr, &cs);
      auto e = std::chrono::steady_clock::now();
      t[0]   = std::min(t[0], std::chrono::duration<double, std::nano>(m - a).count() / 1e5);
      t[1]   = std::min(t[1], std::chrono::duration<double, std::nano>(e - m).count() / 1e5);
    }
    std::printf("cudaGetDevice %.1f ns, cudaStreamIsCapturing %.1f ns\n", t[0], t[1]);
  }
#endif
  auto st = b.stats(0);
  std::printf("device allocs %lld frees %lld syncs %lld; ", (long long)st.num_device_alloc,
              (long long)st.num_device_free, (long long)st.num_sync_all_streams);
  std::printf("best %.1f ns/pair; reserved peak %.1f MB, allocated peak %.1f MB\n", best,
              st.reserved_bytes.peak / 1e6, st.allocated_bytes.peak / 1e6);
}
