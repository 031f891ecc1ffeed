// SPDX-License-Identifier: Apache-2.0
// tests/support/transfer_fixture.hpp: what a transfer test builds its pipeline on, over any
// Runtime: a pinned pool and a stream.
//
//   gpukit::test::transfer_fixture<Runtime> f{rt};
//   gpukit::basic_transfer_pipeline<Runtime> pipe{rt, f.pool, gpukit::test::chunked(64 * kib, 2)};
//   pipe.copy_to_device_async(dev.p, src.data(), bytes, f.s);
//
// On the simulated GPU, as a doctest fixture that owns the GPU too (`sim`, `pool`, `s`):
//
//   TEST_CASE_FIXTURE(gpukit::test::sim_transfer_fixture, "transfer: ...")
//   {
//     sim_pipeline pipe{sim, pool, gpukit::test::chunked(64 * kib, 1, 2)};
//     ...
//   }
#pragma once

#include "support/holders.hpp"
#include "support/pattern.hpp"
#include "support/sim_gpu.hpp"

#include <gpukit/host/pinned_pool.hpp>
#include <gpukit/transfer/transfer_pipeline.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpukit::test {

/// Pipeline options: chunks of `chunk_bytes`, `staging_threads` threads of its own and a ring of
/// `ring_chunks` staging chunks per direction (0: the pipeline's default).
inline transfer_options chunked(std::size_t chunk_bytes, int staging_threads,
                                std::size_t ring_chunks = 0)
{
  transfer_options o;
  o.chunk_bytes     = chunk_bytes;
  o.staging_threads = staging_threads;
  o.ring_chunks     = ring_chunks;
  return o;
}

/// A pinned pool and a stream on `rt`.
template <class Runtime>
struct transfer_fixture {
  Runtime& rt;
  basic_pinned_pool<Runtime> pool;
  stream_holder<Runtime> s;

  explicit transfer_fixture(Runtime& r, pinned_pool_options const& options = {})
      : rt{r}, pool{r, options}, s{r}
  {}
};

/// The bytes of one transfer: `bytes` of device memory, a host source holding pattern `seed` and
/// a zeroed host destination of the same size.
template <class Runtime>
struct transfer_bytes {
  std::size_t bytes;
  std::uint32_t seed;
  device_buffer<Runtime> dev;
  std::vector<unsigned char> src, dst;

  transfer_bytes(Runtime& rt, std::size_t n, std::uint32_t pattern)
      : bytes{n}, seed{pattern}, dev{rt, n}, src(pattern_bytes(n, pattern)), dst(n, 0)
  {}

  /// Whether the destination holds the source's pattern, every byte of it.
  [[nodiscard]] bool arrived() const { return first_mismatch(dst.data(), bytes, seed) == bytes; }
};

/// Per device 0 .. devices-1: a pipeline of that device sharing `pool`, a stream and a device
/// buffer of `bytes` of that device. Everything is released at scope exit: buffers, then
/// pipelines, then streams.
template <class Runtime>
class per_device_transfers {
 public:
  per_device_transfers(Runtime& rt, basic_pinned_pool<Runtime>& pool, int devices,
                       std::size_t bytes, transfer_options options = {})
  {
    for (int d = 0; d < devices; ++d) {
      options.device = d;
      streams_.push_back(std::make_unique<stream_holder<Runtime>>(rt, d));
      pipes_.push_back(std::make_unique<basic_transfer_pipeline<Runtime>>(rt, pool, options));
      buffers_.push_back(std::make_unique<device_buffer<Runtime>>(rt, bytes, d));
    }
  }

  [[nodiscard]] basic_transfer_pipeline<Runtime>& pipe(int d) { return *pipes_.at(index(d)); }
  [[nodiscard]] typename Runtime::stream_type stream(int d) const
  {
    return streams_.at(index(d))->s;
  }
  [[nodiscard]] void* buffer(int d) const { return buffers_.at(index(d))->p; }

 private:
  static std::size_t index(int d) { return static_cast<std::size_t>(d); }

  std::vector<std::unique_ptr<stream_holder<Runtime>>> streams_;
  std::vector<std::unique_ptr<basic_transfer_pipeline<Runtime>>> pipes_;
  std::vector<std::unique_ptr<device_buffer<Runtime>>> buffers_;
};

/// transfer_fixture on a simulated GPU of one 1 GiB device that it owns (`sim`).
struct sim_transfer_fixture : sim_gpu, transfer_fixture<sim_runtime> {
  sim_transfer_fixture() : transfer_fixture<sim_runtime>{sim} {}
};

}  // namespace gpukit::test
